"""``actor_rollout_ref.rollout``: the engine that generates responses (``engine.rollout``),
its sampling (``val_kwargs`` for validation), its memory, and the actor's log-prob pass
over its samples; with the rules on them, including that the rollout's tensor-parallel
size divides the devices it shares with the actor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.config.fields import choice, positive, setting
from engine.config.multi_turn import MultiTurnConfig
from engine.config.train import dtype_problems

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

ROLLOUT_BACKENDS = ("hf", "vllm", "sglang")
PLACEMENTS = ("colocate", "separate")

_TOP_P = (
    "Nucleus sampling: sample from the most likely tokens that make up top_p of the mass; 1: off."
)
_TOP_K = "Sample from the k most likely tokens only; -1: off."


@dataclass
class SamplingConfig:
    """Validation-time sampling (verl's ``rollout.val_kwargs``): greedy by default."""

    n: int = setting(1, "Samples per validation prompt.")
    temperature: float = setting(0.0, "Sampling temperature (with `do_sample`).")
    top_p: float = setting(1.0, _TOP_P)
    top_k: int = setting(-1, _TOP_K)
    do_sample: bool = setting(False, "Sample (true) or decode greedily (false).")


@dataclass
class RolloutConfig:
    """The rollout: which engine generates, where, how it samples and how much memory it
    takes; ``vllm``/``sglang`` keys do nothing for ``hf``."""

    name: str = setting("hf", "Rollout engine: hf (transformers' generate), vllm or sglang.")
    placement: str = setting(
        "colocate",
        "colocate (on the actor's devices, in its processes) or separate (workers of its own,"
        " weights pushed over a bridge; docs/async.md).",
    )
    separate_nnodes: int = setting(0, "placement=separate: nodes of the rollout's own pool.")
    separate_n_gpus_per_node: int = setting(
        0, "placement=separate: devices per node of the rollout's own pool."
    )
    n: int = setting(1, "Samples generated per prompt (the group of group estimators).")
    temperature: float = setting(
        1.0, "Sampling temperature; the log-prob passes divide the logits by it too."
    )
    top_p: float = setting(1.0, _TOP_P)
    top_k: int = setting(-1, _TOP_K)
    do_sample: bool = setting(True, "Sample (true) or decode greedily (false).")
    ignore_eos: bool = setting(
        False, "Generate past the end-of-sequence token, up to `data.max_response_length`."
    )
    dtype: str = setting(
        "bfloat16",
        "dtype of the engine's weights: float32, bfloat16, float16 (float32 where the device"
        " has no bf16).",
    )
    gpu_memory_utilization: float = setting(
        0.5, "vllm/sglang: fraction of device memory the engine may take, in (0, 1]."
    )
    tensor_model_parallel_size: int = setting(
        1, "vllm/sglang: devices each engine spans (tensor parallel)."
    )
    max_num_batched_tokens: int = setting(
        8192,
        "vllm/sglang: most tokens scheduled in one step (SGLang's chunked-prefill size);"
        " at least the model length.",
    )
    enforce_eager: bool = setting(False, "vllm/sglang: run without CUDA graphs.")
    free_cache_engine: bool = setting(
        True,
        "vllm/sglang: release the engine's memory while the actor trains (vLLM's sleep mode,"
        " SGLang's memory saver).",
    )
    log_prob_micro_batch_size_per_gpu: int = setting(
        8, "Samples per forward on one device in the actor's log-prob and critic's value passes."
    )
    log_prob_use_dynamic_bsz: bool | None = setting(
        None, "Pack the actor's log-prob micro-batches by tokens; null: the actor's setting."
    )
    log_prob_max_token_len_per_gpu: int | None = setting(
        None, "Tokens per packed log-prob micro-batch; null: the actor's budget."
    )
    micro_batch_size: int | None = setting(
        None, "hf: sequences per generate call; null: all at once."
    )
    calculate_log_probs: bool = setting(
        False,
        "Return the engine's own log-probs of the sampled tokens (mismatch metrics,"
        " `algorithm.rollout_correction`).",
    )
    update_weights_bucket_megabytes: int = setting(
        512, "vllm/sglang: size of the buckets the actor's weights are sent in, in MiB."
    )
    lora_as_adapter: bool = setting(
        False,
        "vllm or sglang with a LoRA actor (model.lora_rank > 0): serve the adapter itself"
        " (the engine's LoRA support; the base weights pushed once, then each weight"
        " version's adapter) instead of merged weights. SGLang's path is written against"
        " its API (read from its main branch, late 2026) and not run in CI.",
    )
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)


def rules(cfg: EngineConfig) -> list[str]:
    rollout = cfg.actor_rollout_ref.rollout
    key = "actor_rollout_ref.rollout"
    p = choice(rollout.name, ROLLOUT_BACKENDS, f"{key}.name", "rollout backend")
    p += choice(rollout.placement, PLACEMENTS, f"{key}.placement", "placement")
    p += dtype_problems([(f"{key}.dtype", rollout.dtype)])
    p += positive(
        [
            (f"{key}.n", rollout.n),
            (f"{key}.tensor_model_parallel_size", rollout.tensor_model_parallel_size),
            (f"{key}.log_prob_micro_batch_size_per_gpu", rollout.log_prob_micro_batch_size_per_gpu),
            (f"{key}.val_kwargs.n", rollout.val_kwargs.n),
            (f"{key}.update_weights_bucket_megabytes", rollout.update_weights_bucket_megabytes),
        ]
    )
    for section, s in ((key, rollout), (f"{key}.val_kwargs", rollout.val_kwargs)):
        if s.do_sample and s.temperature <= 0:
            p.append(
                f"{section}.temperature must be > 0 when do_sample is true (got {s.temperature});"
                " for greedy decoding set do_sample=false"
            )
        if not 0.0 < s.top_p <= 1.0:
            p.append(f"{section}.top_p must be in (0, 1], got {s.top_p}")
        if s.top_k == 0 or s.top_k < -1:
            p.append(f"{section}.top_k must be -1 (off) or a positive integer, got {s.top_k}")
    if not 0.0 < rollout.gpu_memory_utilization <= 1.0:
        p.append(
            f"{key}.gpu_memory_utilization must be in (0, 1], got {rollout.gpu_memory_utilization}"
        )
    tp = rollout.tensor_model_parallel_size
    if tp >= 1 and rollout.placement == "colocate" and cfg.world_size % tp:
        p.append(
            f"{key}.tensor_model_parallel_size {tp} must divide the"
            f" {cfg.world_size} devices the rollout shares with the actor"
        )
    if rollout.placement == "separate" and (
        rollout.separate_nnodes < 1 or rollout.separate_n_gpus_per_node < 1
    ):
        p.append(
            f"{key}.placement=separate needs the rollout pool's size:"
            " set rollout.separate_nnodes and rollout.separate_n_gpus_per_node"
        )
    elif rollout.placement == "separate":
        pool = rollout.separate_nnodes * rollout.separate_n_gpus_per_node
        if tp >= 1 and (pool % tp or rollout.separate_n_gpus_per_node % tp):
            p.append(
                f"{key}.tensor_model_parallel_size {tp} must divide the rollout's own"
                f" {rollout.separate_n_gpus_per_node} devices per node"
                f" ({key}.separate_n_gpus_per_node): an engine stays within a node"
            )
        samples = cfg.data.train_batch_size * rollout.n
        if samples % pool:
            p.append(
                f"data.train_batch_size {cfg.data.train_batch_size} × {key}.n {rollout.n} ="
                f" {samples} samples do not split evenly over the rollout's {pool} devices"
                f" ({key}.separate_nnodes × separate_n_gpus_per_node): change one of them"
            )
    return p
