"""Rollout with Hugging Face ``generate`` on the actor's own (FSDP) weights, or on a
plain HF model of its own, synced from a Megatron actor (``sync_weights``).

Slow next to vLLM/SGLang, but exact, dependency-free and runs anywhere torch
does: the CPU quickstart, tests, and small models. Generation gathers the full
parameters once (``gather``: the actor's ``engine.train.fsdp.full_parameters``, given by
the rollout's factory), so ranks may stop at different lengths.

A vision-language model generates with its prompts' images (``GenerationRequest.images``):
their pixels and grids, and which tokens are images (the model computes its multimodal
rotary positions from them, as the training forward's ``engine.models.mrope`` does). It
never samples an image or video pad token: the forward would count one as an image's.

It runs on a *twin*: the same model class built on the meta device, whose
parameters are bound to the gathered tensors of the FSDP module (no copy). The
wrapped module would run FSDP's pre- and post-forward hooks on every unit at every
decoding step, for nothing once the weights are gathered (13-24% of generation
time on the CPU benchmark, docs/performance.md).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers import LogitsProcessorList, SuppressTokensLogitsProcessor

from engine.rollout.base import finish_row
from engine.rollout.weights import checkpoint_slots
from engine.types import (
    GenerationOutput,
    GenerationRequest,
    ImageInputs,
    SamplingParams,
    pixel_inputs,
)


def eos_ids(tokenizer: Any, model: nn.Module) -> set[int]:
    """Every id that ends a response: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for value in (tokenizer.eos_token_id, gen_eos):
        if isinstance(value, int):
            ids.add(value)
        elif value:
            ids.update(value)
    return ids


def meta_twin(module: nn.Module) -> nn.Module | None:
    """The FSDP2 module's own model class, built on the meta device (no memory), to be
    bound to its gathered parameters; None when ``module`` is not FSDP-wrapped."""
    if not isinstance(module, FSDPModule):
        return None
    # fully_shard swaps the class for FSDP<Class>(FSDPModule, Class): find Class.
    cls = next(
        c
        for c in type(module).__mro__
        if issubclass(c, nn.Module) and not issubclass(c, FSDPModule)
    )
    with torch.device("meta"):
        twin = cls(module.config)
        # A LoRA actor (engine.train.lora): the twin gets the same adapter layers, so that
        # it binds A and B too and generates with W + scaling·B·A.
        for adapter, peft_config in (getattr(module, "peft_config", None) or {}).items():
            from peft import inject_adapter_in_model

            inject_adapter_in_model(peft_config, twin, adapter_name=adapter)
    twin.generation_config = copy.deepcopy(module.generation_config)
    twin.eval()
    return twin


def bind_gathered(twin: nn.Module, module: nn.Module) -> nn.Module:
    """Point the twin's parameters and buffers at ``module``'s, which must be gathered
    (inside ``full_parameters``): tied weights stay tied, nothing is copied."""
    for name, param in module.named_parameters(remove_duplicate=False):
        owner, leaf = _owner(twin, name)
        owner._parameters[leaf] = param
    for name, buffer in module.named_buffers(remove_duplicate=False):
        owner, leaf = _owner(twin, name)
        owner._buffers[leaf] = buffer
    return twin


def _owner(root: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, leaf = name.rpartition(".")
    return (root.get_submodule(path) if path else root), leaf


class SampledLogprobs:
    """The last logits processor of ``generate``: the log-probability each drawn token
    had in the distribution it was drawn from (after temperature, top-k, top-p). A step's
    scores are kept until the next call, whose ``input_ids`` end with the token drawn
    from them; ``finish`` takes the last step's from the output. One [B, V] at a time."""

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []
        self._pending: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self._take(input_ids[:, -1:])
        self._pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _take(self, drawn: torch.Tensor) -> None:
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, drawn).squeeze(1))
            self._pending = None

    def finish(self, sequences: torch.Tensor) -> torch.Tensor:
        """[B, new tokens] once ``generate`` has returned ``sequences``."""
        self._take(sequences[:, -1:])
        return (
            torch.stack(self.steps, dim=1)
            if self.steps
            else sequences.new_zeros((len(sequences), 0), dtype=torch.float32)
        )


def sampling_processors(sampling: SamplingParams) -> list[Any]:
    """transformers' own warpers for ``sampling``, in its order (temperature, top-k,
    top-p), for a chain that ends with ``SampledLogprobs``: passed to ``generate`` as
    its processors, with its own sampling settings cleared, they run before the
    recorder (``generate`` puts the ones it builds itself after any it is given)."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    if not sampling.do_sample:
        return []
    warpers: list[Any] = []
    if sampling.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k > 0:
        warpers.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        warpers.append(TopPLogitsWarper(sampling.top_p))
    return warpers


def routing_table(tap: Any, rows: int) -> torch.Tensor:
    """(rows, T, L, K) int16 routing of a generation's recording, column t the token
    at column t of its sequences: the prefill's forward routed the left-padded prompts,
    each decoding step the token it was fed (the last token drawn was never fed). -1 in
    layers without experts."""
    calls = {
        layer: torch.cat([c.view(rows, -1, c.shape[-1]) for c in chunks], dim=1)
        for layer, chunks in tap.recorded.items()
    }
    first = next(iter(calls.values()))
    out = torch.full((rows, first.shape[1], tap.num_layers, first.shape[-1]), -1, dtype=torch.int16)
    for layer, indices in calls.items():
        out[:, :, layer] = indices.to(torch.int16)
    return out


class HFRollout:
    def __init__(
        self,
        module: nn.Module,
        tokenizer: Any,
        device: torch.device,
        micro_batch_size: int | None = None,
        logprobs: bool = False,
        routing: bool = False,
        gather: Callable[[nn.Module], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        """``logprobs``: also return each response token's log-probability under the
        distribution it was sampled from (``rollout.calculate_log_probs``). ``routing``:
        record each token's MoE experts (``rollout.enable_rollout_routing_replay``).
        ``gather``: how a sharded (FSDP) module's full parameters are held for a
        generation; None for a plain model."""
        self.module = module
        self.gather = gather
        self.device = device
        self.micro_batch_size = micro_batch_size
        self.logprobs = logprobs
        self.routing = routing
        self.eos_token_ids = eos_ids(tokenizer, module)
        if not self.eos_token_ids:
            raise ValueError("the tokenizer defines no EOS token; responses would never end")
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else min(self.eos_token_ids)
        self.twin = meta_twin(module)
        self._held = False  # inside session(): the weights are gathered already
        config = getattr(module, "config", None)
        self.image_token_id: int | None = getattr(config, "image_token_id", None)
        # a vision-language model's pad tokens, never sampled
        self.suppressed = [
            i
            for i in (self.image_token_id, getattr(config, "video_token_id", None))
            if i is not None
        ]

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        """Keep the weights gathered across several ``generate`` calls (a multi-turn
        rollout): each call then runs no collective, so the ranks may make different
        numbers of calls (one rank's trajectories take more turns than another's)."""
        if self._held:
            yield
            return
        with self.gather(self.module) if self.gather else contextlib.nullcontext():
            self._held = True
            try:
                yield
            finally:
                self._held = False

    @torch.no_grad()
    def generate(self, request: GenerationRequest) -> GenerationOutput:
        responses: list[list[int]] = []
        finished: list[bool] = []
        logprobs: list[list[float]] = []
        routed: list[torch.Tensor] = []
        was_training = self.module.training
        self.module.eval()
        try:
            with self.session():
                model = self.model_for_generation()
                prompts = request.prompt_ids
                step = self.micro_batch_size or max(1, len(prompts))
                for start in range(0, len(prompts), step):
                    chunk = prompts[start : start + step]
                    images = (
                        None if request.images is None else request.images[start : start + step]
                    )
                    with self._routing_recorded(model) as tap:
                        rows, row_logprobs = self._generate_chunk(
                            model, chunk, request.sampling, images
                        )
                    table = None if tap is None else routing_table(tap, len(chunk)).cpu()
                    width = max(len(p) for p in chunk)
                    for i, (row, lps) in enumerate(zip(rows, row_logprobs, strict=True)):
                        tokens, lps, done = finish_row(
                            row, lps, self.eos_token_ids, request.sampling.ignore_eos
                        )
                        responses.append(tokens)
                        finished.append(done)
                        logprobs.append(lps or [])
                        if table is not None:  # its prompt and response tokens
                            first = width - len(chunk[i])
                            routed.append(table[i, first : width + len(tokens)])
        finally:
            self.module.train(was_training)
        return GenerationOutput(
            response_ids=responses,
            finished=finished,
            logprobs=logprobs if self.logprobs else None,
            routed_experts=routed if self.routing else None,
        )

    def _routing_recorded(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Record the routing of ``model``'s forwards for the duration (when asked)."""
        if not self.routing:
            return contextlib.nullcontext()
        from engine.models.router_tap import recording

        return recording(model)

    def model_for_generation(self) -> nn.Module:
        """The module to call ``generate`` on; inside ``full_parameters``."""
        return self.module if self.twin is None else bind_gathered(self.twin, self.module)

    def _generate_chunk(
        self,
        model: nn.Module,
        prompts: list[list[int]],
        sampling: SamplingParams,
        images: list[ImageInputs | None] | None = None,
    ) -> tuple[list[list[int]], list[list[float] | None]]:
        """Token rows and, with ``self.logprobs``, their sampling log-probs."""
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            attention[i, width - len(prompt) :] = 1
        recorder = SampledLogprobs() if self.logprobs else None
        processors = sampling_processors(sampling) + ([recorder] if recorder else [])
        if self.suppressed:  # first: the recorder sees the distribution sampled from
            processors.insert(0, SuppressTokensLogitsProcessor(self.suppressed, self.device))
        out = model.generate(
            **self._image_inputs(input_ids, images),
            input_ids=input_ids.to(self.device),
            attention_mask=attention.to(self.device),
            max_new_tokens=sampling.max_new_tokens,
            do_sample=sampling.do_sample,
            pad_token_id=self.pad_token_id,
            eos_token_id=None if sampling.ignore_eos else sorted(self.eos_token_ids),
            use_cache=True,
            # Our warpers (above), not the model's own sampling defaults: None clears them.
            temperature=None,
            top_p=None,
            top_k=None,
            logits_processor=LogitsProcessorList(processors),
        )
        rows = out[:, width:].tolist()
        if recorder is None:
            return rows, [None] * len(rows)
        return rows, recorder.finish(out).tolist()

    def _image_inputs(
        self, input_ids: torch.Tensor, images: list[ImageInputs | None] | None
    ) -> dict[str, torch.Tensor]:
        """``generate``'s image arguments for these rows (none without images): the
        pixels and grids in row order, and which tokens are images (1) or text (0)."""
        if images is None or all(row is None for row in images):
            return {}
        inputs = {k: v.to(self.device) for k, v in pixel_inputs(images).items()}
        mm_types = (input_ids == self.image_token_id).int()
        return inputs | {"mm_token_type_ids": mm_types.to(self.device)}

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy full tensors, under Hugging Face checkpoint names, into the module this
        rollout owns (a Megatron actor's; an FSDP actor's module is generated with
        directly and never pushed). A fused experts parameter (transformers 5's
        ``mlp.experts.gate_up_proj`` [E, 2I, H]) is written slice by slice from the
        per-expert tensors (``mlp.experts.{j}.gate_proj.weight``, ...). Every parameter,
        and every slice of one, must arrive: a tied ``lm_head`` is the embedding's tensor."""
        slots = checkpoint_slots(self.module)
        missing = set(slots)
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in slots:
                    raise KeyError(f"the rollout model has no parameter {name!r} to sync")
                slots[name][1].copy_(tensor)
                missing.discard(name)
        if missing:
            stale = sorted({slots[name][0] for name in missing})
            unsent = "" if set(stale) == missing else f" (not sent: {sorted(missing)[:5]})"
            raise KeyError(f"weight sync left rollout parameters stale: {stale[:5]}{unsent}")

    def sleep(self) -> None:
        """Nothing to free: HF generate keeps no cache between calls."""

    def wake(self) -> None:
        """Nothing to restore."""
