"""megatron-core, imported lazily (with the CPU shims and the Transformer Engine
stand-in the engine needs), and its parallel state."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from engine.config.megatron_parallel import MegatronParallel
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.train import megatron_context

# ---------------------------------------------------------------------------
# megatron-core, imported lazily


def require_megatron_core() -> str:
    """Check that a supported megatron-core is importable; returns its version."""
    from engine.versions import BackendVersionError, check_version

    version = check_version("megatron")  # a clear error naming the extra when missing
    try:
        import megatron.core  # noqa: F401
    except ImportError as exc:
        raise BackendVersionError(
            f"megatron-core {version} is installed but does not import ({exc}); reinstall it:"
            " pip install 'rlctl[megatron]'"
        ) from exc
    return version


def _install_cpu_shims() -> None:
    """Two CUDA assumptions of Megatron-core that the CPU path reaches; applied only when
    the engine runs on the CPU device (a GPU run never gets here):

    - ``torch.cuda.current_device()`` as the device for new tensors: RoPE frequencies,
      the DDP gradient buffers and the global attention buffer. On CPU it names the CPU.
    - the CUDA RNG tracker's ``fork()`` around dropout: there is no CUDA RNG; the CPU
      generator is used as is.
    """
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    if not getattr(torch.cuda, "_rlctl_cpu_shim", False):
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
        torch.cuda._rlctl_cpu_shim = True  # type: ignore[attr-defined]
    get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    # Rotary embedding under context parallelism: Megatron picks this rank's positions
    # with a pinned CUDA index tensor; the same zigzag pick on the CPU.
    from megatron.core.models.common.embeddings import rotary_pos_embedding

    def pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group: Any):
        cp, rank = dist.get_world_size(cp_group), dist.get_rank(cp_group)
        index = megatron_context.zigzag_index(pos_emb.shape[seq_dim], cp, rank)
        return pos_emb.index_select(seq_dim, index)

    rotary_pos_embedding.get_pos_emb_on_this_cp_rank = pos_emb_on_this_cp_rank


def _without_transformer_engine() -> None:
    """Megatron-core 0.14's MoE router tests ``te_general_gemm is not None`` but binds
    the name only when Transformer Engine imports; without it (the local spec this engine
    uses) the router raises NameError. Bind it to None: the router's torch path."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def init_parallel_state(parallel: MegatronParallel, device: DeviceSpec, seed: int) -> None:
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if not dist.is_initialized():
        raise EngineError("the Megatron engine needs torch.distributed initialised first")
    if ps.model_parallel_is_initialized():
        have = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_context_parallel_world_size(),
            ps.get_expert_model_parallel_world_size(),
            ps.get_expert_tensor_parallel_world_size(),
        )
        want = parallel.grid
        if have != want:
            raise EngineError(
                "Megatron roles in one process must share parallel sizes: (tp, pp, cp, ep, etp)"
                f" {want}"
                f" requested, {have} already in use; give every colocated role's megatron"
                " section the same sizes"
            )
        return
    ps.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        context_parallel_size=parallel.context_parallel_size,
        expert_model_parallel_size=parallel.expert_model_parallel_size,
        # The experts' grid (ETP × EP × expert-DP per stage) is laid out apart from the
        # dense one; TP ranks stay consecutive in both.
        expert_tensor_parallel_size=parallel.etp,
    )
    _without_transformer_engine()
    if device.type == "cpu":
        _install_cpu_shims()
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(seed)
