"""``actor_rollout_ref.rollout``: the engine that generates responses (``engine.rollout``),
its sampling (``val_kwargs`` for validation), its memory, and the actor's log-prob pass
over its samples; with the rules on them, including that the rollout's tensor-parallel
size divides the devices it shares with the actor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.config import verl_trees
from engine.config.fields import choice, inert, mapping, positive, setting, tree
from engine.config.multi_turn import MultiTurnConfig
from engine.config.train import dtype_problems

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

ROLLOUT_BACKENDS = ("hf", "vllm", "sglang")
PLACEMENTS = ("colocate", "separate")
# vLLM's logprobs_mode values (log-probs of the distribution sampled from, or before
# temperature and top-k/top-p, and the logits themselves).
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits")
SCHEDULING_POLICIES = ("fcfs", "priority")
_ENGINE_ONLY = "vllm/sglang only"
# Engine arguments the colocated integration sets itself (engine.rollout.translate):
# rollout.engine_kwargs may not change them.
RESERVED_ENGINE_ARGS = {
    "vllm": (
        "model",
        "tokenizer",
        "tensor_parallel_size",
        "distributed_executor_backend",
        "load_format",
        "skip_tokenizer_init",
    ),
    "sglang": ("model_path", "tp_size", "skip_tokenizer_init", "load_format"),
}

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
        " `algorithm.rollout_correction`). True when unset in the asynchronous modes"
        " (async_training.mode), which need it.",
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
    # verl's other rollout keys (docs/verl-compat.md).
    max_model_len: int | None = setting(
        None,
        f"The engine's context length in tokens ({_ENGINE_ONLY}); null:"
        " data.max_prompt_length + data.max_response_length, which it must hold.",
    )
    max_num_seqs: int = setting(
        256, f"Sequences the engine schedules at once ({_ENGINE_ONLY}; vLLM's max_num_seqs)."
    )
    enable_chunked_prefill: bool = setting(
        True, f"Split long prompts' prefill into chunks ({_ENGINE_ONLY})."
    )
    enable_prefix_caching: bool = setting(
        True, f"Reuse the KV cache of shared prompt prefixes ({_ENGINE_ONLY})."
    )
    disable_log_stats: bool = setting(True, "vLLM: leave out its periodic statistics log.")
    scheduling_policy: str = setting("fcfs", "vLLM's scheduler: fcfs or priority.")
    logprobs_mode: str = setting(
        "processed_logprobs",
        "vLLM's log-probs with calculate_log_probs: processed_logprobs (of the distribution"
        " sampled from: after temperature and top-k/top-p, what training compares) or"
        " raw_logprobs, processed_logits, raw_logits.",
    )
    cudagraph_capture_sizes: list[int] | None = setting(
        None, "vLLM: the batch sizes its CUDA graphs are captured for; null: vLLM's."
    )
    expert_parallel_size: int = setting(
        1,
        "vLLM: > 1 spreads a mixture-of-experts model's experts over the engine's devices"
        " (enable_expert_parallel) instead of splitting each expert.",
    )
    engine_kwargs: dict[str, Any] = mapping(
        "Further keyword arguments of the engine, per backend: engine_kwargs.vllm.* are"
        " passed to vllm.LLM, engine_kwargs.sglang.* to sglang.Engine (they win over the"
        " engine's own choices), engine_kwargs.trtllm.* is refused (no TensorRT-LLM here).",
        factory=lambda: {"vllm": {}, "sglang": {}, "trtllm": {}},
    )
    prompt_length: int | None = inert(
        None,
        "verl's copy of data.max_prompt_length for the rollout; when set it must equal it"
        " (the rollout's prompts are the data's).",
    )
    response_length: int | None = inert(
        None,
        "verl's copy of data.max_response_length for the rollout; when set it must equal it.",
    )
    mode: str = inert(
        "async",
        "verl's choice between its sync and async rollout servers; changes nothing here:"
        " the controller drives generation one way.",
    )
    nnodes: int = inert(
        0,
        "verl's nodes of a rollout with its own devices; changes nothing here: that is"
        " placement=separate with separate_nnodes.",
    )
    n_gpus_per_node: int | None = inert(
        None,
        "verl's devices per node of such a rollout; changes nothing here: that is"
        " placement=separate with separate_n_gpus_per_node.",
    )
    data_parallel_size: int = inert(
        1,
        "verl's engine replicas within one server; changes nothing here: every"
        " tensor-parallel group of devices runs an engine of its own.",
    )
    pipeline_model_parallel_size: int = inert(
        1, "verl's pipeline stages of the engine; changes nothing here (tensor parallel only)."
    )
    seed: int = inert(42, "verl's rollout seed; changes nothing here (trainer.seed seeds it).")
    full_determinism: bool = inert(
        False, "verl's deterministic inference switch; changes nothing here (not enforced)."
    )
    load_format: str = inert(
        "dummy",
        "How verl's engine reads the checkpoint at start; changes nothing here: the weights"
        " always come from the actor before the first generation.",
    )
    layered_summon: bool = inert(
        False, "verl gathers FSDP weights layer by layer for the push; changes nothing here."
    )
    multi_stage_wake_up: bool = inert(
        False, "verl wakes the engine's weights and KV cache in two steps; changes nothing here."
    )
    skip_tokenizer_init: bool = inert(
        True, "verl's engine tokenizer switch; changes nothing here (token ids in and out)."
    )
    over_sample_rate: float = inert(
        0.0,
        "verl generates more samples and drops the slowest; not in this engine (> 0 is refused).",
    )
    moe_load_balance_metrics_interval: int = inert(
        0, "verl's MoE load-balance metrics period; changes nothing here."
    )
    log_prob_micro_batch_size: int | None = inert(
        None,
        "verl's deprecated micro-batch over all devices; refused when set: give"
        " log_prob_micro_batch_size_per_gpu.",
    )
    moe_tensor_parallel_size: int = inert(
        1, "verl's expert tensor parallelism of TensorRT-LLM; > 1 is refused (no TensorRT-LLM)."
    )
    enable_rollout_routing_replay: bool = setting(
        False,
        "Record each token's MoE routing (its experts in every layer) while generating, for"
        " the actor to replay (actor.router_replay.mode=R3; vLLM or hf rollout).",
    )
    quantization: str | None = inert(
        None,
        "verl's quantized generation (fp8); not in this engine (refused when set): pass an"
        " engine option through engine_kwargs if the backend takes it.",
    )
    quantization_config_file: str | None = inert(
        None, "verl's quantization config file; not in this engine (refused when set)."
    )
    checkpoint_engine: dict[str, Any] = tree(
        verl_trees.CHECKPOINT_ENGINE,
        "verl's weight transport to the engine (its update_weights_bucket_megabytes is read"
        " as this section's); the rest changes nothing here: weights go in buckets through"
        " the engine's own loader (a custom_backend_module is refused).",
    )
    agent: dict[str, Any] = tree(
        verl_trees.AGENT,
        "verl's agent loop workers (its agent_loop_config_path and default_agent_loop are"
        " read as multi_turn's); num_workers changes nothing here (the loops run in the"
        " rollout workers); a custom_async_server is refused.",
    )
    trace: dict[str, Any] = tree(
        verl_trees.TRACE, "verl's rollout tracing (mlflow, weave); changes nothing here."
    )
    prometheus: dict[str, Any] = tree(
        verl_trees.PROMETHEUS, "verl's Prometheus metrics server; changes nothing here."
    )
    profiler: dict[str, Any] = tree(
        verl_trees.PROFILER, "verl's profiler of the rollout; changes nothing here."
    )
    qat: dict[str, Any] = tree(
        verl_trees.QAT, "verl's quantization-aware training's rollout side; not in this engine."
    )
    disaggregation: dict[str, Any] = tree(
        verl_trees.DISAGGREGATION,
        "verl's prefill/decode disaggregated serving; not in this engine (enabled is refused).",
    )


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
    for backend, reserved in RESERVED_ENGINE_ARGS.items():
        for name in rollout.engine_kwargs.get(backend) or {}:
            if name in reserved:
                p.append(
                    f"{key}.engine_kwargs.{backend}.{name}: the engine sets it itself (the"
                    " colocated engine's model, tensor parallelism and weight loading);"
                    " remove it from engine_kwargs"
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
