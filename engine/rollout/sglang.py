"""Rollout with SGLang, colocated with the FSDP actor.

One ``sglang.Engine`` per tensor-parallel group, owned by the group's first worker
(SGLang starts its own scheduler process per TP rank, on the devices from
``base_gpu_id``: with TP > 1 that worker must see the group's devices). Every member
gathers the group's prompts (engine.rollout.tp), the owner generates, and each member
keeps its rows; an engine failure on the owner is sent to the members, so that none
waits for rows that never come.

Weights: every member takes part in the bucketed gather (it is a collective over the
FSDP shards); the owner pushes each bucket with ``Engine.update_weights_from_tensor``
(HF names; the model's ``load_weights`` fuses and shards; the Engine serializes the
tensors once per TP rank itself), flushing the radix cache after the last one. From
SGLang 0.5.21 those pushes must sit inside a weight-update session
(``begin_weight_update`` / ``end_weight_update``; outside one the scheduler refuses
them). SGLang answers every push with ``(success, message)`` instead of raising, so
each answer is checked. A push that fails, part-way through a sync, leaves the model
half-updated: the engine is then marked unusable on every member, and every later
``generate`` or ``sync_weights`` says so. After a failure the owner pushes nothing
more but still drains the gather, so that the other ranks' collectives complete.

Memory: ``enable_memory_saver`` and ``release_memory_occupation`` /
``resume_memory_occupation`` with the tags ``kv_cache`` and ``weights``, and
``cuda_graph`` from SGLang 0.5.21 (where the captured graphs' memory is backed up to
the host while released; before, releasing it would lose what the graphs replay).
Weights come back first, before a sync (the sync overwrites them); the rest on wake.

Log-probs: SGLang returns, for sampled requests, ``log(softmax(logits / temperature))``
of each output token, before top-k/top-p (``layers/sampler.py``), which is what the
training side computes; greedy requests get the raw ``log_softmax(logits)``. The
environment variable ``SGLANG_RETURN_ORIGINAL_LOGPROB`` switches the former to raw
log-probs as well, so it is refused when log-probs are asked for.

LoRA: with ``rollout.lora_as_adapter`` the engine serves the actor's adapter itself
(engine.rollout.sglang_lora), the base weights pushed once.

Written against SGLang's Engine API as of 0.5.23 (read from its source, for the versions
in engine.versions); imported only here. Not run in this repository's CI (no
GPU): see docs/backends.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from engine.config import RolloutConfig
from engine.errors import EngineError
from engine.rollout.base import finish_row
from engine.rollout.tp import gather_group_rows, new_tp_group, tp_layout
from engine.rollout.translate import (
    EngineSettings,
    explain_kv_cache_errors,
    sampling_params_for,
)
from engine.rollout.weights import bucketize
from engine.types import GenerationOutput, GenerationRequest, SamplingParams
from engine.versions import check_version, version_tuple

# The first SGLang whose captured CUDA graphs survive release_memory_occupation
# (their memory pool is backed up to the host) and that needs a weight-update session.
CUDA_GRAPH_RELEASE_SINCE = (0, 5, 21)
ORIGINAL_LOGPROB_ENV = "SGLANG_RETURN_ORIGINAL_LOGPROB"


def parse_output(
    output: dict[str, Any], eos_token_ids: set[int], ignore_eos: bool, want_logprobs: bool
) -> tuple[list[int], list[float] | None, bool]:
    """One SGLang result dict (``output_ids``; ``meta_info.output_token_logprobs`` as
    ``(logprob, token_id, text)`` triples) in our terms. A request the engine aborted
    (``finish_reason.type == "abort"``) is an error, not a short response."""
    meta = output.get("meta_info") or {}
    reason = meta.get("finish_reason")
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise EngineError(
            f"the SGLang rollout engine aborted a request: {reason.get('message') or 'no reason'}"
        )
    ids = list(output["output_ids"])
    lps = None
    if want_logprobs:
        lps = [float(t[0]) for t in meta["output_token_logprobs"]]
    return finish_row(ids, lps, eos_token_ids, ignore_eos)


def memory_tags(version: str, cfg: RolloutConfig) -> tuple[str, ...]:
    """What ``sleep`` releases: the KV cache and the weights, and the CUDA graphs where
    this SGLang keeps them across a release (and the engine captured any)."""
    tags = ("kv_cache", "weights")
    if version_tuple(version) >= CUDA_GRAPH_RELEASE_SINCE and not cfg.enforce_eager:
        tags += ("cuda_graph",)
    return tags


def check_logprob_source(cfg: RolloutConfig, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse the SGLang switch that returns log-probs before temperature when the
    trainer is to use the engine's log-probs (it computes them after temperature)."""
    value = environ.get(ORIGINAL_LOGPROB_ENV, "").strip().lower()
    if cfg.calculate_log_probs and value in ("1", "true", "yes", "y"):
        raise EngineError(
            f"{ORIGINAL_LOGPROB_ENV}={environ[ORIGINAL_LOGPROB_ENV]} makes SGLang return"
            " log-probs of the logits before temperature, while training compares them"
            " with log_softmax(logits / temperature): unset it, or set"
            " actor_rollout_ref.rollout.calculate_log_probs=false"
        )


def check_result(what: str, result: Any) -> None:
    """SGLang's weight calls answer ``(success, message)`` rather than raise."""
    if isinstance(result, tuple) and len(result) >= 2 and not result[0]:
        raise RuntimeError(f"{what} refused: {result[1]}")


class _OwnerPush:
    """The owner's side of one weight sync: resume the weights' memory, open SGLang's
    weight-update session where it has one, push each bucket, close the session. The
    first failure is recorded, not raised, and every later step is skipped: the caller
    keeps draining the (collective) gather and decides once it is done."""

    def __init__(self, engine: Any, *, resume_weights: bool) -> None:
        self.engine = engine
        self.session = callable(getattr(engine, "begin_weight_update", None))
        self.loaded = 0
        self.failure: str | None = None
        if resume_weights:
            self._call(
                "resume_memory_occupation", engine.resume_memory_occupation, tags=["weights"]
            )
        if self.session:
            self._call("begin_weight_update", engine.begin_weight_update)

    def load(self, bucket: list[tuple[str, torch.Tensor]], *, last: bool) -> None:
        self._call(
            "update_weights_from_tensor",
            self.engine.update_weights_from_tensor,
            named_tensors=bucket,
            flush_cache=last,  # the radix cache holds the old weights' keys/values
        )
        if self.failure is None:
            self.loaded += len(bucket)

    def finish(self) -> None:
        if self.session:
            self._call("end_weight_update", self.engine.end_weight_update)

    def _call(self, what: str, method: Callable[..., Any], **kwargs: Any) -> None:
        if self.failure is not None:
            return
        try:
            check_result(what, method(**kwargs))
        except Exception as error:
            self.failure = (
                f"{what} failed after {self.loaded} tensors were loaded"
                f" ({type(error).__name__}: {error})"
            )


class SGLangRollout:
    def __init__(
        self,
        cfg: RolloutConfig,
        settings: EngineSettings,
        *,
        local_rank: int = 0,
        lora_rank: int = 0,
        lora_targets: str | list[str] = "all-linear",
    ) -> None:
        """``lora_rank`` > 0: the engine serves a LoRA adapter of that rank on
        ``lora_targets`` (``set_adapter``; engine.rollout.sglang_lora)."""
        version = check_version("sglang")
        check_logprob_source(cfg)
        self.cfg = cfg
        self.eos_token_ids = set(settings.eos_token_ids)
        self.bucket_bytes = settings.bucket_bytes
        self.layout = tp_layout(cfg.tensor_model_parallel_size, settings.local_world_size)
        self.group = new_tp_group(self.layout)
        self.tags = memory_tags(version, cfg)
        self.engine: Any = None
        self._adapters: Any = None  # the owner's AdapterSwap, with lora_rank > 0
        if self.layout.tp_rank == 0:
            import sglang

            tp = cfg.tensor_model_parallel_size
            visible = torch.cuda.device_count()
            if tp > 1 and visible < local_rank + tp:
                raise EngineError(
                    f"the SGLang rollout with tensor_model_parallel_size={tp} starts its TP"
                    f" processes from the group's first worker, which sees {visible}"
                    " device(s): it must see the whole node (do not pin one device per"
                    " worker), or use actor_rollout_ref.rollout.name=vllm, or"
                    " tensor_model_parallel_size=1"
                )

            args = settings.engine_args(cfg, "sglang")
            # Ray pins one device per worker; a TP group's owner starts at its own.
            args["base_gpu_id"] = local_rank if tp > 1 else 0
            if lora_rank > 0:
                from engine.rollout.sglang_lora import lora_engine_args

                args.update(lora_engine_args(lora_rank, lora_targets))
            with explain_kv_cache_errors("sglang", cfg, settings.max_model_len):
                self.engine = sglang.Engine(**args)
            if lora_rank > 0:
                from engine.rollout.sglang_lora import AdapterSwap

                self._adapters = AdapterSwap(self.engine)
        self._broken: str | None = None  # why the engine's weights cannot be trusted
        self._asleep: set[str] = set()
        self.sleep()  # the actor trains first; the engine wakes to generate

    @property
    def owner(self) -> bool:
        return self.engine is not None

    # -- generation ---------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        self._check_usable()
        rows, mine = gather_group_rows(request.prompt_ids, self.layout, self.group)
        want_logprobs = self.cfg.calculate_log_probs
        parsed: list[tuple[list[int], list[float] | None, bool]] | None = None
        failure: str | None = None
        if self.owner:
            try:
                parsed = self._generate_rows(rows, request.sampling, want_logprobs)
            except Exception as error:
                # The members wait for the rows: tell them, then fail here as raised.
                self._from_owner((None, f"{type(error).__name__}: {error}"))
                raise
        parsed, failure = self._from_owner((parsed, failure))
        if failure is not None:
            raise EngineError(
                "the SGLang rollout engine of this rank's tensor-parallel group (on rank"
                f" {self.layout.group_ranks[0]}) failed to generate: {failure}"
            )
        assert parsed is not None
        mine_rows = parsed[mine]
        return GenerationOutput(
            response_ids=[tokens for tokens, _, _ in mine_rows],
            finished=[done for _, _, done in mine_rows],
            logprobs=[lps or [] for _, lps, _ in mine_rows] if want_logprobs else None,
        )

    def _generate_rows(
        self, rows: list[list[int]], sampling: SamplingParams, want_logprobs: bool
    ) -> list[tuple[list[int], list[float] | None, bool]]:
        if not rows:
            return []
        params = sampling_params_for(sampling, "sglang", eos_token_ids=self.eos_token_ids)
        # A list of token-id lists is a batch: one result dict per row, in order.
        lora = self._adapters.generate_kwargs(len(rows)) if self._adapters else {}
        outputs = self.engine.generate(
            input_ids=rows, sampling_params=params, return_logprob=want_logprobs, **lora
        )
        return [
            parse_output(o, self.eos_token_ids, sampling.ignore_eos, want_logprobs) for o in outputs
        ]

    # -- weights and memory ---------------------------------------------------------

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Every member drains the iterator (the FSDP gathers are collective); the owner
        pushes each bucket in one weight-update session, flushing the radix cache after
        the last one. Any failure marks the engine unusable on every member of the
        group: its layers then hold a mix of old and new weights."""
        self._check_usable()
        push = (
            _OwnerPush(self.engine, resume_weights="weights" in self._asleep)
            if self.owner
            else None
        )
        try:
            pending: list[tuple[str, torch.Tensor]] | None = None
            for bucket in bucketize(named_tensors, self.bucket_bytes):
                if pending is not None and push is not None:
                    push.load(pending, last=False)
                pending = bucket
            if push is not None:
                if pending is not None:
                    push.load(pending, last=True)
                push.finish()
        except Exception as error:  # the gather itself failed
            self._broken = f"a weight sync failed part-way ({type(error).__name__}: {error})"
            raise EngineError(self._unusable_message()) from error
        self._asleep.discard("weights")
        failure = self._from_owner(push.failure if push is not None else None)
        if failure is not None:
            self._broken = f"a weight sync failed: {failure}"
            raise EngineError(self._unusable_message())

    def set_adapter(
        self, version: int, peft_config: Any, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Serve this weight version's LoRA adapter from now on (its base weights were
        pushed with ``sync_weights``). Every member drains ``tensors`` (a gather may be
        collective); the owner loads them. A refused load leaves the previous adapter
        served: every member of the group raises rather than sample from it."""
        self._check_usable()
        tensors = iter(tensors)
        failure: str | None = None
        try:
            if self.owner:
                self._adapters.load(version, peft_config, tensors)
        except Exception as error:
            failure = f"{type(error).__name__}: {error}"
        finally:
            for _ in tensors:
                pass
        failure = self._from_owner(failure)
        if failure is not None:
            raise EngineError(
                f"the SGLang rollout engine did not take the LoRA adapter of weight version"
                f" {version} ({failure}); it would sample from the previous one. The run stops"
                " here; resume it from its last checkpoint (trainer.resume_mode=auto)"
            )

    def sleep(self) -> None:
        if not self.cfg.free_cache_engine or self._asleep:
            return
        if self.owner:
            self.engine.release_memory_occupation(tags=list(self.tags))
        self._asleep = set(self.tags)

    def wake(self) -> None:
        if not self._asleep:
            return
        if self.owner:
            self.engine.resume_memory_occupation(tags=sorted(self._asleep))
        self._asleep = set()

    def close(self) -> None:
        """Stop SGLang's scheduler processes (the worker group closes its workers before
        it ends them)."""
        if self.owner:
            self.engine.shutdown()
        if self._adapters is not None:
            self._adapters.close()

    # -- the group ------------------------------------------------------------------

    def _from_owner(self, value: Any) -> Any:
        """The owner's ``value`` on every member of its TP group (itself included)."""
        if self.layout.tp == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self.layout.group_ranks[0], group=self.group)
        return box[0]

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise EngineError(self._unusable_message())

    def _unusable_message(self) -> str:
        return (
            f"the SGLang rollout engine is unusable: {self._broken}, so its weights are"
            " half-updated (a mix of old and new) and it will not generate from them. The"
            " run stops here; resume it from its last checkpoint (trainer.resume_mode=auto)"
        )
