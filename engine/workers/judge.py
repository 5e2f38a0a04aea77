"""The generative reward model's role (``rm`` with ``reward_model.style=generative``): an
LLM judge on the training workers (or on its own, ``reward_model.enable_resource_pool``),
served by a second instance of the rollout's engine (``actor_rollout_ref.rollout.name``)
that loads the judge's own weights from ``reward_model.model.path`` and only generates:
it never receives the policy's weight syncs.

Each rank holds a full copy (no tensor parallelism; a judge small enough to sit beside
the actor on one device, like the discriminative reward model) and generates its share
of the judge prompts, which the controller builds and tokenizes (engine.reward.judge).

- ``hf``: transformers' ``generate`` on a plain HF model in eval mode, in the rollout's
  dtype, ``reward_model.micro_batch_size_per_gpu`` prompts at a time.
- ``vllm``: a second ``LLM`` in the process (external_launcher, like the rollout's),
  with its KV cache sized for this rank's prompts at the judge's full length
  (``judge_kv_cache_bytes``: the same sizing the planner counts). With sleep mode (CUDA,
  ROCm) it sleeps at level 1 (weights kept on the host: nothing would restore them)
  between judgings, so the actor trains with the device's memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from engine.config import EngineConfig
from engine.config.reward import causal_lm_config_problems
from engine.device import DeviceSpec
from engine.errors import ConfigError, EngineError
from engine.rollout.hf import eos_ids
from engine.types import GenerationOutput, GenerationRequest


def judge_max_model_len(cfg: EngineConfig) -> int:
    judge = cfg.reward_model.judge
    return judge.max_prompt_length + judge.max_new_tokens


# vLLM's default max_num_seqs: more sequences than this never decode at once, so a KV
# cache for more would sit idle (rlctl's planner counts the same).
JUDGE_MAX_CONCURRENT = 256


def judge_rows_per_rank(cfg: EngineConfig) -> int:
    """The judge prompts one rank decodes at once at most: its share of a step's samples
    (validation's chunk when that is larger), up to vLLM's batch cap."""
    rollout = cfg.actor_rollout_ref.rollout
    train = cfg.data.train_batch_size * rollout.n
    val = (cfg.data.val_batch_size or 0) * rollout.val_kwargs.n
    return min(JUDGE_MAX_CONCURRENT, -(-max(train, val) // cfg.rm_world_size))


def load_judge(path: str, trust_remote_code: bool, dtype: torch.dtype) -> Any:
    """The judge at ``path`` in eval mode; a ConfigError naming the key when it is not a
    causal LM."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    problems = causal_lm_config_problems(path, config.to_dict())
    if problems:
        raise ConfigError(problems)
    model = AutoModelForCausalLM.from_pretrained(
        path, trust_remote_code=trust_remote_code, dtype=dtype
    )
    model.requires_grad_(False)
    return model.eval()


class JudgeWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        from transformers import AutoTokenizer

        rm = cfg.reward_model
        rollout = cfg.actor_rollout_ref.rollout
        # the judge's own tokenizer: its EOS ids end a verdict (the policy's may differ)
        judge_tokenizer = AutoTokenizer.from_pretrained(
            rm.model.path, trust_remote_code=rm.model.trust_remote_code
        )
        dtype_name = rollout.dtype if device.supports_bf16 else "float32"
        if rollout.name == "hf":
            from engine.rollout.hf import HFRollout
            from engine.train.fsdp import DTYPES

            model = load_judge(rm.model.path, rm.model.trust_remote_code, DTYPES[dtype_name])
            self.engine: Any = HFRollout(
                model.to(device.torch_device()),
                judge_tokenizer,
                device.torch_device(),
                micro_batch_size=rm.micro_batch_size_per_gpu,
            )
        elif rollout.name == "vllm":
            self.engine = _vllm_judge(cfg, device, judge_tokenizer, dtype_name)
        else:  # refused by the config's rules (engine.config.judge)
            raise EngineError(f"the judge cannot run on the {rollout.name} rollout engine")

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        self.engine.wake()
        try:
            return self.engine.generate(request)
        finally:
            self.engine.sleep()

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()


def _vllm_judge(cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, dtype: str) -> Any:
    from transformers import AutoConfig

    from engine.rollout.translate import EngineSettings, kv_cache_bytes_for
    from engine.rollout.vllm import VLLMRollout
    from engine.workers.rollout_engine import generation_config

    rm = cfg.reward_model
    rollout = cfg.actor_rollout_ref.rollout
    hf_config = AutoConfig.from_pretrained(
        rm.model.path, trust_remote_code=rm.model.trust_remote_code
    )
    problems = causal_lm_config_problems(rm.model.path, hf_config.to_dict())
    if problems:
        raise ConfigError(problems)
    max_model_len = judge_max_model_len(cfg)
    settings = EngineSettings(
        model_path=rm.model.path,
        eos_token_ids=frozenset(eos_ids(tokenizer, generation_config(rm.model))),
        max_model_len=max_model_len,
        seed=cfg.trainer.seed,
        trust_remote_code=rm.model.trust_remote_code,
        load_format="auto",  # its own weights, read once: nothing is ever pushed to it
        local_world_size=cfg.rm_devices_per_node,
        dtype=dtype,
        # Sized for this rank's prompts at full length, on every platform: a fraction of
        # the device (gpu_memory_utilization) would be the rollout engine's to take.
        kv_cache_bytes=kv_cache_bytes_for(
            hf_config, dtype, max_model_len, judge_rows_per_rank(cfg)
        ),
    )
    judge_rollout = dataclasses.replace(
        rollout,
        tensor_model_parallel_size=1,
        calculate_log_probs=False,
        lora_as_adapter=False,
        gpu_memory_utilization=_startup_fraction(device, rollout.gpu_memory_utilization),
    )
    return VLLMRollout(judge_rollout, settings)


def _startup_fraction(device: DeviceSpec, configured: float) -> float:
    """vLLM on a GPU refuses to start unless the device has ``gpu_memory_utilization`` of
    its memory free; with the KV cache sized explicitly that is all the fraction does.
    The actor's state and the sleeping rollout engine hold part of the device, so the
    judge asks for most of what is free now (on CPU the fraction is not read)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return configured
    free, total = torch.cuda.mem_get_info()
    return max(0.01, round(0.9 * free / total, 4))
