"""Our rollout settings in each inference engine's terms, and their outputs back in ours.

Pure functions (no vLLM or SGLang import), so that every translation is tested on
any machine. The backends (engine.rollout.vllm, engine.rollout.sglang) call them, both
built from one ``EngineSettings`` and both explaining a KV cache that does not fit
through ``explain_kv_cache_errors``.

Semantics kept identical to the HF backend, so the algorithms see the same batch
whichever backend generated it:

- one request row per sample: ``GenerationRequest`` is already expanded (the n copies
  are adjacent), so each engine request asks for exactly one completion;
- greedy when ``do_sample`` is false (temperature 0, no top-p/top-k);
- ``top_k = -1`` means off; each engine has its own spelling of off;
- generation stops at any EOS id (the tokenizer's and the generation config's), and the
  response keeps the first EOS and nothing after it (``trim_response``); ``finished``
  is true exactly when the response ends with EOS;
- log-probs, when asked, are those of the sampled tokens, cut like the tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.config import RolloutConfig
from engine.config.rollout import RESERVED_ENGINE_ARGS
from engine.errors import EngineError
from engine.rollout.weights import DEFAULT_BUCKET_BYTES
from engine.types import SamplingParams

BACKENDS = ("vllm", "sglang")
# Tokens SGLang's context must hold beyond prompt + response (see engine_args_for).
SGLANG_CONTEXT_ROOM = 2


def sampling_params_for(
    params: SamplingParams,
    backend: str,
    *,
    eos_token_ids: set[int],
    logprobs: bool = False,
    seed: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.SamplingParams(**kw)`` or SGLang's ``sampling_params``
    dict, for one completion per request row."""
    if params.do_sample:
        temperature, top_p, top_k = params.temperature, params.top_p, params.top_k
    else:
        temperature, top_p, top_k = 0.0, 1.0, -1
    stop_ids = [] if params.ignore_eos else sorted(eos_token_ids)
    if backend == "vllm":
        kw: dict[str, Any] = {
            "n": 1,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k if top_k > 0 else 0,  # vLLM: 0 (or -1) considers all tokens
            "max_tokens": params.max_new_tokens,
            "ignore_eos": params.ignore_eos,
            "stop_token_ids": stop_ids,
            "detokenize": False,  # token ids in and out; text is never needed
            "skip_special_tokens": False,
        }
        if logprobs:
            kw["logprobs"] = 0  # the sampled token's log-prob only
        if seed is not None:
            kw["seed"] = seed
        return kw
    if backend == "sglang":
        kw = {
            "n": 1,
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k if top_k > 0 else -1,  # SGLang: -1 is off (0 is refused)
            "max_new_tokens": params.max_new_tokens,
            "ignore_eos": params.ignore_eos,
            "stop_token_ids": stop_ids,
            "skip_special_tokens": False,
            "no_stop_trim": True,  # keep the stop token in the output ids
        }
        if seed is not None:
            # Honoured only by an engine started with enable_deterministic_inference
            # (sampling/sampling_batch_info.py); otherwise SGLang ignores it.
            kw["sampling_seed"] = seed
        return kw
    raise ValueError(f"unknown rollout backend {backend!r}; valid: {', '.join(BACKENDS)}")


def engine_args_for(
    cfg: RolloutConfig,
    model_path: str,
    tp: int,
    *,
    backend: str,
    max_model_len: int,
    seed: int = 0,
    trust_remote_code: bool = False,
    load_format: str = "auto",
    dtype: str | None = None,
    kv_cache_bytes: int | None = None,
    hf_overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``vllm.LLM(**kw)`` or ``sglang.Engine(**kw)`` built inside a
    colocated worker (one engine per tensor-parallel group, within a node).

    ``load_format="dummy"`` skips reading the checkpoint: the weights then come from
    the actor's first ``sync_weights``, before any generation. ``dtype``: the engine's
    (None: ``cfg.dtype``). ``kv_cache_bytes``: an explicit KV cache size (vLLM on CPU,
    where ``gpu_memory_utilization`` would be a fraction of the host's RAM per engine).
    ``hf_overrides``: fields of the model's config the training side overrides too
    (``model.override_config``; engine.models.hf_config): vLLM's ``hf_overrides``,
    SGLang's ``json_model_override_args`` (a JSON string).
    """
    if tp < 1:
        raise EngineError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size must be >= 1, got {tp}"
        )
    if not 0.0 < cfg.gpu_memory_utilization <= 1.0:
        raise EngineError(
            "actor_rollout_ref.rollout.gpu_memory_utilization must be in (0, 1],"
            f" got {cfg.gpu_memory_utilization}"
        )
    common = _Common(
        model_path, tp, max_model_len, seed, trust_remote_code, load_format, dtype or cfg.dtype
    )
    if backend == "vllm":
        args = _vllm_args(cfg, common, kv_cache_bytes, hf_overrides)
    elif backend == "sglang":
        args = _sglang_args(cfg, common, hf_overrides)
    else:
        raise ValueError(f"unknown rollout backend {backend!r}; valid: {', '.join(BACKENDS)}")
    return _with_engine_kwargs(args, cfg, backend)


@dataclass(frozen=True)
class _Common:
    """What every backend's arguments are made from, beside the rollout config."""

    model_path: str
    tp: int
    max_model_len: int
    seed: int
    trust_remote_code: bool
    load_format: str
    dtype: str


def _vllm_args(
    cfg: RolloutConfig,
    c: _Common,
    kv_cache_bytes: int | None,
    hf_overrides: Mapping[str, Any] | None,
) -> dict[str, Any]:
    args = {
        "model": c.model_path,
        "tokenizer": c.model_path,
        "tensor_parallel_size": c.tp,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "enforce_eager": cfg.enforce_eager,
        "dtype": c.dtype,
        "max_model_len": c.max_model_len,
        # vLLM V1 always chunks prefill; the budget must still hold one full sequence
        # for models whose prefill cannot be chunked.
        "max_num_batched_tokens": max(cfg.max_num_batched_tokens, c.max_model_len),
        "max_num_seqs": cfg.max_num_seqs,
        "enable_chunked_prefill": cfg.enable_chunked_prefill,
        "disable_log_stats": cfg.disable_log_stats,
        "scheduling_policy": cfg.scheduling_policy,
        "seed": c.seed,
        "enable_sleep_mode": cfg.free_cache_engine,
        # Colocated SPMD: the engine runs inside this (already distributed) process
        # and its tensor-parallel peers, not in processes of its own.
        "distributed_executor_backend": "external_launcher",
        "enable_prefix_caching": cfg.enable_prefix_caching,
        # Ray pins one device per worker, so TP peers cannot map each other's memory
        # (custom all-reduce needs CUDA IPC between visible devices): use NCCL.
        "disable_custom_all_reduce": True,
        "trust_remote_code": c.trust_remote_code,
        "load_format": c.load_format,
        "skip_tokenizer_init": False,
        # Log-probs of the distribution the token was drawn from: after temperature
        # (as the training side computes them) and after top-k/top-p (which training
        # does not apply: with those on, the gap is real, and TIS corrects for it).
        # V1's default is the raw log-probs, before temperature.
        "logprobs_mode": cfg.logprobs_mode,
    }
    if cfg.expert_parallel_size > 1:
        args["enable_expert_parallel"] = True
    if cfg.enable_rollout_routing_replay:  # each token's experts, for routing replay R3
        args["enable_return_routed_experts"] = True
    if cfg.cudagraph_capture_sizes:
        args["compilation_config"] = {"cudagraph_capture_sizes": cfg.cudagraph_capture_sizes}
    if kv_cache_bytes is not None:
        args["kv_cache_memory_bytes"] = kv_cache_bytes
    if hf_overrides:
        args["hf_overrides"] = dict(hf_overrides)
    return args


def _sglang_args(
    cfg: RolloutConfig, c: _Common, hf_overrides: Mapping[str, Any] | None
) -> dict[str, Any]:
    args = {
        "model_path": c.model_path,
        "tp_size": c.tp,
        "mem_fraction_static": cfg.gpu_memory_utilization,
        "disable_cuda_graph": cfg.enforce_eager,
        "dtype": c.dtype,
        # SGLang caps a request's new tokens at context_length - 2 - prompt length
        # (max_req_len = context_length - 1, less one more): two tokens of room let
        # a full-length prompt get a full-length response, as on the other backends.
        "context_length": c.max_model_len + SGLANG_CONTEXT_ROOM,
        "max_prefill_tokens": max(cfg.max_num_batched_tokens, c.max_model_len),
        "random_seed": c.seed,
        "enable_memory_saver": cfg.free_cache_engine,
        "skip_tokenizer_init": True,  # token ids in and out
        "trust_remote_code": c.trust_remote_code,
        "load_format": c.load_format,
        "log_level": "error",
        # -1 turns SGLang's chunked prefill off
        "chunked_prefill_size": (cfg.max_num_batched_tokens if cfg.enable_chunked_prefill else -1),
        "disable_radix_cache": not cfg.enable_prefix_caching,
        "max_running_requests": cfg.max_num_seqs,
    }
    if hf_overrides:
        args["json_model_override_args"] = json.dumps(dict(hf_overrides))
    return args


def _with_engine_kwargs(args: dict[str, Any], cfg: RolloutConfig, backend: str) -> dict[str, Any]:
    """``args`` with the user's ``rollout.engine_kwargs.<backend>`` over them (as verl
    passes them); a nested mapping (vLLM's compilation_config) is merged, not replaced."""
    extra = dict(cfg.engine_kwargs.get(backend) or {})
    reserved = [k for k in extra if k in RESERVED_ENGINE_ARGS.get(backend, ())]
    if reserved:
        raise EngineError(
            f"actor_rollout_ref.rollout.engine_kwargs.{backend}.{reserved[0]}: the engine sets"
            " it itself (the colocated engine's model, tensor parallelism and weight loading);"
            " remove it from engine_kwargs"
        )
    out = dict(args)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = {**out[key], **value}
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class EngineSettings:
    """What a colocated engine (vLLM or SGLang) is built from besides the rollout config:
    the model and the run's choices, decided once by the rollout role
    (engine.workers.rollout) whichever backend it builds."""

    model_path: str
    eos_token_ids: frozenset[int]
    max_model_len: int
    seed: int = 0
    trust_remote_code: bool = False
    load_format: str = "auto"
    local_world_size: int | None = None  # devices per node; None: TP is not checked against it
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    dtype: str | None = None  # the engine's; None: the rollout config's
    kv_cache_bytes: int | None = None  # an explicit KV cache size (CPU); None: the engine's
    # the model's override_config fields (engine.models.hf_config.config_overrides)
    hf_overrides: Mapping[str, Any] = field(default_factory=dict)
    # data.mm_processor_kwargs: a vision-language model's image processor settings, the
    # same as the driver's processor takes (engine.rollout.vllm_images)
    mm_processor_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.eos_token_ids:
            raise ValueError("no EOS token ids: responses would never end")

    def engine_args(self, cfg: RolloutConfig, backend: str) -> dict[str, Any]:
        """``engine_args_for`` with these settings, one engine per TP group of ``cfg``."""
        return engine_args_for(
            cfg,
            self.model_path,
            cfg.tensor_model_parallel_size,
            backend=backend,
            max_model_len=self.max_model_len,
            seed=self.seed,
            trust_remote_code=self.trust_remote_code,
            load_format=self.load_format,
            dtype=self.dtype,
            kv_cache_bytes=self.kv_cache_bytes,
            hf_overrides=self.hf_overrides,
        )


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(hf_config: Any, dtype: str) -> int:
    """Bytes of KV cache one token takes in every layer: keys and values of each KV head
    (2 x layers x KV heads x head dim x dtype size), or, for multi-latent attention
    (DeepSeek's ``kv_lora_rank``), the latent and the rotary key that vLLM caches instead
    (layers x (kv_lora_rank + qk_rope_head_dim) x dtype size)."""
    text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
    size = DTYPE_BYTES[dtype]
    layers = text.num_hidden_layers
    latent = getattr(text, "kv_lora_rank", None)
    if latent:
        return layers * (latent + text.qk_rope_head_dim) * size
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * size


# vLLM's paged cache hands out blocks of tokens; a sequence's last block is whole.
KV_BLOCK_TOKENS = 128


def kv_cache_bytes_for(hf_config: Any, dtype: str, max_model_len: int, rows: int) -> int:
    """A KV cache that holds ``rows`` sequences of ``max_model_len`` tokens at once: what
    one engine generates per call, so that no sequence waits for another's blocks."""
    blocks = -(-max_model_len // KV_BLOCK_TOKENS)
    return max(1, rows) * blocks * KV_BLOCK_TOKENS * kv_bytes_per_token(hf_config, dtype)


# Fragments of the engines' messages when the KV cache (or the weights) do not fit.
_KV_CACHE_MESSAGES = (
    "kv cache",
    "cache blocks",
    "mem-fraction-static",
    "mem_fraction_static",
    "not enough memory",
    "out of memory",
)

KV_CACHE_HINT = (
    "the {backend} rollout engine could not fit its KV cache ({detail}). Give it more memory"
    " or need less: raise actor_rollout_ref.rollout.gpu_memory_utilization (now {util}),"
    " lower actor_rollout_ref.rollout.max_num_batched_tokens (now {batched}) or"
    " data.max_response_length (the model length is {max_model_len} tokens), or raise"
    " actor_rollout_ref.rollout.tensor_model_parallel_size (now {tp}) to split the weights"
    " over more devices"
)


def is_kv_cache_error(error: BaseException) -> bool:
    text = str(error).lower()
    return any(fragment in text for fragment in _KV_CACHE_MESSAGES)


def kv_cache_error(
    backend: str, error: BaseException, cfg: RolloutConfig, tp: int, max_model_len: int
) -> EngineError:
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return EngineError(
        KV_CACHE_HINT.format(
            backend=backend,
            detail=detail,
            util=cfg.gpu_memory_utilization,
            batched=cfg.max_num_batched_tokens,
            max_model_len=max_model_len,
            tp=tp,
        )
    )


@contextmanager
def explain_kv_cache_errors(backend: str, cfg: RolloutConfig, max_model_len: int) -> Iterator[None]:
    """Around an engine's constructor: a KV cache that does not fit comes out in the
    engine's own words (its flags, not our keys), so it is raised again as an
    ``EngineError`` naming the settings to change. Any other error passes unchanged."""
    try:
        yield
    except (ValueError, RuntimeError) as error:
        if is_kv_cache_error(error):
            raise kv_cache_error(
                backend, error, cfg, cfg.tensor_model_parallel_size, max_model_len
            ) from error
        raise
