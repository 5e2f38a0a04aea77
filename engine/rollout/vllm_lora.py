"""vLLM serving a LoRA actor's adapter itself (``rollout.lora_as_adapter``).

The engine is built with ``enable_lora``; the frozen base weights are pushed once (the
first sync), and after each actor update only the adapter: its tensors are written in
peft's layout (``adapter_config.json``, ``adapter_model.safetensors``) to a folder of this
process, and every generation passes a ``LoRARequest`` naming it, with a new id per
weight version so that vLLM never serves a cached older adapter. (vLLM's documented API:
``LLM(enable_lora=True, max_lora_rank=...)``, ``LLM.generate(..., lora_request=...)``.)
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

# vLLM's allowed max_lora_rank values (its LoRAConfig.max_lora_rank)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_args(rank: int) -> dict[str, Any]:
    """vLLM's engine arguments for one adapter of ``rank`` (<= 512, the config's rule)."""
    return {
        "enable_lora": True,
        "max_lora_rank": next(r for r in VLLM_LORA_RANKS if r >= rank),
        "max_loras": 1,
    }


class AdapterFolder:
    """The current weight version's adapter on local disk, for vLLM to load."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="rlctl-lora-"))
        self.current: Path | None = None

    def write(
        self, version: int, peft_config: Any, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> Any:
        """Write version ``version``'s adapter; the ``LoRARequest`` that serves it."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        folder = self.root / f"v{version}"
        folder.mkdir()
        peft_config.save_pretrained(str(folder))
        save_file(
            {name: t.detach().contiguous().cpu() for name, t in tensors},
            str(folder / "adapter_model.safetensors"),
        )
        if self.current is not None:
            shutil.rmtree(self.current, ignore_errors=True)
        self.current = folder
        return LoRARequest(
            lora_name=f"actor-v{version}", lora_int_id=version, lora_path=str(folder)
        )

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
