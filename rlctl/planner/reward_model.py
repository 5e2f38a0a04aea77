"""The reward model's memory on each training device (``reward_model.enable``): a full
copy on every rank, never sharded (engine.workers.reward_model, engine.workers.judge).

- discriminative: bf16 weights (the body and a one-output head), and one micro-batch's
  forward, which is small next to them and left out;
- generative on hf: bf16 weights and the KV cache of one ``generate`` call
  (``micro_batch_size_per_gpu`` prompts at the judge's full length);
- generative on vllm: bf16 weights, the KV cache the engine allocates (this rank's judge
  prompts at the judge's full length, in 128-token blocks: what the worker asks vLLM
  for) and the engine's own overhead.

Where it lives: both the discriminative model and an hf judge stay on the device the
whole run, so they are held beside the training state through training and generation.
A vLLM judge with sleep mode (``free_cache_engine``, on GPUs) sleeps at level 1 between
judgings: it is a phase of its own, after generation (the rollout engine asleep), with
the training state left resident beside it.

With a pool of its own (``reward_model.enable_resource_pool``) none of this is on the
training devices: the job asks for the reward model's devices too (reward_pool.py),
and its memory is checked against one of its own devices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlctl.models import ModelShape, UnknownModelError, model_shape
from rlctl.planner.model import GIB, ROLLOUT_MAX_NUM_SEQS, ROLLOUT_OVERHEAD_GIB

KV_BLOCK_TOKENS = 128  # vLLM's paged cache: a sequence's last block is whole
BF16 = 2


@dataclass(frozen=True)
class RewardModelMem:
    style: str  # discriminative | generative
    backend: str  # the rollout engine the judge runs on (hf, vllm)
    shape: ModelShape
    judge_len: int = 0  # the judge's prompt + verdict tokens at most
    micro: int = 1  # reward_model.micro_batch_size_per_gpu
    sleeps: bool = False  # a vLLM judge with sleep mode: a phase of its own

    @property
    def params(self) -> int:
        m = self.shape
        if self.style == "generative":
            return m.num_params
        return m.num_params - m.lm_head_params + m.hidden_size  # the one-label head

    def rows(self, samples: int, devices: int) -> int:
        """The judge prompts one rank decodes at once: its share, up to vLLM's batch cap
        (engine.workers.judge sizes the cache the same way)."""
        return min(ROLLOUT_MAX_NUM_SEQS, -(-samples // devices))

    def kv_bytes(self, samples: int, devices: int) -> float:
        if self.style != "generative":
            return 0.0
        per_token = self.shape.kv_cache_bytes_per_token(BF16)
        if self.backend == "vllm":
            blocks = -(-self.judge_len // KV_BLOCK_TOKENS)
            return self.rows(samples, devices) * blocks * KV_BLOCK_TOKENS * per_token
        return self.micro * self.judge_len * per_token

    def bytes_per_device(self, samples: int, devices: int) -> float:
        """Weights, KV cache and (vLLM) the engine's overhead on one training device."""
        overhead = ROLLOUT_OVERHEAD_GIB * GIB if self.backend == "vllm" else 0.0
        if self.style != "generative":
            overhead = 0.0
        return BF16 * self.params + self.kv_bytes(samples, devices) + overhead

    def describe(self, samples: int, devices: int, own: bool = False) -> str:
        what = f"judge on {self.backend}" if self.style == "generative" else "sequence classifier"
        parts = [f"bf16 weights {BF16 * self.params / GIB:.2f} GiB"]
        if self.style == "generative":
            kv = self.kv_bytes(samples, devices) / GIB
            if self.backend == "vllm":
                parts.append(
                    f"KV cache {kv:.2f} GiB ({self.rows(samples, devices)} prompts of"
                    f" {self.judge_len} tokens per device)"
                )
                parts.append(f"engine overhead {ROLLOUT_OVERHEAD_GIB:g} GiB")
            else:
                parts.append(
                    f"KV cache {kv:.2f} GiB ({self.micro} prompts of {self.judge_len} tokens"
                    " per generate call)"
                )
        where = (
            f"on each of its own {devices} device(s), nothing of training beside it"
            if own
            else "asleep while training and generating (sleep mode), judged after generation"
            " beside the resident training state"
            if self.sleeps
            else "held on every training device through training and generation"
        )
        total = self.bytes_per_device(samples, devices) / GIB
        return (
            f"reward model ({what}: {self.shape.name}, {self.params / 1e9:.2f}B params):"
            f" {' + '.join(parts)} = {total:.2f} GiB, {where}"
        )


def reward_model_of(config: Any) -> tuple[RewardModelMem | None, str | None]:
    """The recipe's reward model for the memory model, or (None, why it is not counted)
    when it has one whose shape cannot be found; (None, None) without one."""
    if config is None or not config.reward_model.enable:
        return None, None
    rm = config.reward_model
    try:
        shape = model_shape(rm.model.path)
    except UnknownModelError as error:
        return None, (
            f"the reward model's memory is not counted: {error} (give a local folder or a"
            " model the planner knows as reward_model.model.path)"
        )
    rollout = config.actor_rollout_ref.rollout
    judge = rm.judge
    return RewardModelMem(
        style=rm.style,
        backend=rollout.name,
        shape=shape,
        judge_len=judge.max_prompt_length + judge.max_new_tokens,
        micro=rm.micro_batch_size_per_gpu,
        sleeps=rm.style == "generative" and rollout.name == "vllm" and rollout.free_cache_engine,
    ), None


def own_pool(config: Any) -> tuple[int, int] | None:
    """(nodes, devices per node) of the reward model's own workers; None when it runs on
    the training devices (or there is none)."""
    if config is None or not config.reward_model.enable:
        return None
    rm = config.reward_model
    return (rm.nnodes, rm.n_gpus_per_node) if rm.enable_resource_pool else None
