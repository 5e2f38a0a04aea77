"""Rollout with vLLM, colocated with the FSDP actor (verl's hybrid engine).

The engine lives in the actor's worker processes: ``LLM(distributed_executor_backend=
"external_launcher")`` runs it SPMD over the ``tensor_model_parallel_size`` consecutive
workers of a node (engine.rollout.tp), each data-parallel group with its own engine.
Between generations it sleeps (``enable_sleep_mode``; ``llm.sleep(level)`` frees the KV
cache and offloads or drops its weights), and after each actor update the new weights
come in bucket by bucket (engine.rollout.weights) through the model's own
``load_weights``, called in the worker through ``LLM.collective_rpc``.

Written against vLLM's documented Python API for the versions in
engine.rollout.versions (``LLM``, ``SamplingParams``, ``TokensPrompt``, ``sleep`` /
``wake_up(tags)``, ``collective_rpc``, ``reset_prefix_cache``); vLLM is imported only
here, when the backend is built. Not run in this repository's CI (no GPU): see
docs/backends.md.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Iterable
from typing import Any

import torch

from engine.config import RolloutConfig
from engine.rollout.tp import gather_group_rows, new_tp_group, tp_layout
from engine.rollout.translate import (
    EngineSettings,
    explain_kv_cache_errors,
    finish_row,
    sampling_params_for,
)
from engine.rollout.versions import check_version
from engine.rollout.weights import bucketize
from engine.types import GenerationOutput, GenerationRequest


def _load_bucket(worker: Any, bucket: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside vLLM's worker (``collective_rpc`` passes it as the first argument):
    the model's ``load_weights`` maps HF names, fuses qkv/gate_up and shards for TP."""
    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights=bucket)
    return len(bucket)


def check_platform(vllm_version: str, cfg: RolloutConfig, *, hip: bool | None = None) -> None:
    """What differs by vendor: Ascend needs the vllm-ascend plugin (checked like vLLM).
    On ROCm, vLLM's sleep mode unmapped memory without returning it to the device until
    vllm-project/vllm#37533 (2026, after the supported range): the actor may not get
    the memory back, so say so at start."""
    if importlib.util.find_spec("torch_npu") is not None:
        check_version("vllm-ascend")
    hip = getattr(torch.version, "hip", None) is not None if hip is None else hip
    if hip and cfg.free_cache_engine:
        warnings.warn(
            f"vLLM {vllm_version} on ROCm: sleep mode may not return the KV cache's memory to"
            " the device (vllm-project/vllm#37533). If the actor runs out of memory while"
            " training, lower actor_rollout_ref.rollout.gpu_memory_utilization so that the"
            " engine and the actor fit together",
            stacklevel=2,
        )


class VLLMRollout:
    def __init__(
        self, cfg: RolloutConfig, settings: EngineSettings, *, sleep_level: int = 1
    ) -> None:
        """``sleep_level`` 1 keeps a CPU copy of the weights while asleep; 2 drops them
        (less host memory) and so needs ``sync_weights`` before every ``wake``."""
        check_platform(check_version("vllm"), cfg)
        from vllm import LLM

        self.cfg = cfg
        self.eos_token_ids = set(settings.eos_token_ids)
        self.bucket_bytes = settings.bucket_bytes
        self.sleep_level = sleep_level
        self.layout = tp_layout(cfg.tensor_model_parallel_size, settings.local_world_size)
        self.group = new_tp_group(self.layout)
        args = settings.engine_args(cfg, "vllm")
        with explain_kv_cache_errors("vllm", cfg, settings.max_model_len):
            self.llm = LLM(**args)
        self._asleep: set[str] = set()  # of {"weights", "kv_cache"}
        self.sleep()  # the actor trains first; the engine wakes to generate

    # -- generation ---------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rows, mine = gather_group_rows(request.prompt_ids, self.layout, self.group)
        want_logprobs = self.cfg.calculate_log_probs
        params = SamplingParams(
            **sampling_params_for(
                request.sampling,
                "vllm",
                eos_token_ids=self.eos_token_ids,
                logprobs=want_logprobs,
            )
        )
        outputs = (
            self.llm.generate(
                [TokensPrompt(prompt_token_ids=row) for row in rows], params, use_tqdm=False
            )
            if rows
            else []
        )
        responses, finished, logprobs = [], [], []
        for output in outputs[mine]:
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            lps = (
                [step[token].logprob for token, step in zip(ids, completion.logprobs, strict=True)]
                if want_logprobs
                else None
            )
            tokens, lps, done = finish_row(
                ids, lps, self.eos_token_ids, request.sampling.ignore_eos
            )
            responses.append(tokens)
            finished.append(done)
            logprobs.append(lps or [])
        return GenerationOutput(
            response_ids=responses,
            finished=finished,
            logprobs=logprobs if want_logprobs else None,
        )

    # -- weights and memory ---------------------------------------------------------

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights bucket by bucket (HF names, see engine.rollout.weights). The KV
        cache stays asleep: weights first, then the cache on ``wake`` (a lower peak)."""
        if "weights" in self._asleep:
            self.llm.wake_up(tags=["weights"])
            self._asleep.discard("weights")
        for bucket in bucketize(named_tensors, self.bucket_bytes):
            self.llm.collective_rpc(_load_bucket, args=(bucket,))
        self.llm.reset_prefix_cache()  # cached prefixes hold the old weights' keys/values

    def sleep(self) -> None:
        if not self.cfg.free_cache_engine or self._asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self._asleep = {"weights", "kv_cache"}

    def wake(self) -> None:
        if not self._asleep:
            return
        tags = sorted(self._asleep)
        self.llm.wake_up(tags=tags)
        self._asleep = set()
