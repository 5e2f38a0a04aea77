"""The rollout role: generates responses with the configured backend.

``hf`` with an FSDP actor generates with the actor's own weights. ``vllm`` and
``sglang`` hold their own copy, in the same worker processes as the actor (colocated):
before each generation the worker checks the actor's ``weights_version`` and, when the
actor has changed since the last push (an update, a checkpoint load, or the start: the
engine is built with dummy weights), pushes the new weights bucket by bucket. All ranks
update in lockstep, so they all push in the same call, as the gathers require.

With a Megatron actor (``actor.strategy=megatron``) the weights live in Megatron's
layout, which ``generate`` cannot run: ``hf`` then holds a plain Hugging Face model of
its own (built from the model path, in the rollout dtype) and is synced like vLLM and
SGLang. Either training engine hands out full HF-named tensors (``hf_named_tensors``:
FSDP's shards gathered, or Megatron's TP slices merged), one at a time.

With ``rollout.placement=separate`` the rollout has workers of its own and no actor
beside it: its engine (any of the three) holds its own copy, and the controller pushes
the actor's weights to it over a bridge (``receive_weights``; engine.controller.groups)
before a generation needs them. With ``rollout.lora_as_adapter`` (vLLM or SGLang serving a LoRA
actor's adapter) both placements load the base weights once and serve each version's
adapter: colocated from the actor beside it (``_sync_adapter``), separate from the
parts each push names (``receive_weights``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.rollout.base import RolloutEngine
from engine.rollout.stream import StreamDone, StreamItem, advance
from engine.rollout.weights import ENGINE_NAME_MAPS, as_engine_names
from engine.types import GenerationOutput, GenerationRequest, SamplingParams
from engine.workers.rollout_engine import WeightSource, rollout_dtype, rollout_engine, weight_source


@dataclass(frozen=True)
class Holding:
    """What the rollout's engine holds, and how it gets it: the worker's one state."""

    source: WeightSource
    adapter: bool = False  # rollout.lora_as_adapter: base weights once, then each adapter
    base_loaded: bool = False  # (adapter) the frozen base weights are in the engine
    version: int | None = None  # the weights version it holds; None: none yet


def rollout_role(
    cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
) -> RolloutWorker:
    """The rollout role of a host: its engine built (engine.workers.rollout_engine), and
    with it where its weights come from."""
    actor = colocated.get("actor")  # None: separate, the controller pushes the weights
    source = weight_source(cfg, actor is not None)
    agent = _tool_agent(cfg, tokenizer)  # None: single-turn rollouts only
    megatron = cfg.actor_rollout_ref.actor.strategy == "megatron"
    borrowed = actor.module if actor is not None and not megatron else None
    engine = rollout_engine(cfg, device, tokenizer, borrowed, source is WeightSource.BRIDGE)
    rollout = cfg.actor_rollout_ref.rollout
    adapter = rollout.lora_as_adapter and rollout.name != "hf"
    return RolloutWorker(cfg, device, engine, Holding(source, adapter), actor, agent)


class RolloutWorker:
    def __init__(
        self,
        cfg: EngineConfig,
        device: DeviceSpec,
        engine: RolloutEngine,
        holding: Holding,
        actor: Any | None,
        agent: Any | None,
    ) -> None:
        self.cfg = cfg.actor_rollout_ref.rollout
        self.model_cfg = cfg.actor_rollout_ref.model
        self.rollout_dtype = rollout_dtype(cfg, device)
        self.device = device
        self.engine: Any = engine
        self.holding = holding
        self.actor = actor  # the actor beside it (colocated), else None
        self.agent = agent  # the multi-turn runner; None: single-turn only
        self._bridge: Any = None
        self._stream: Any = None  # the fully asynchronous mode's samples (stream_advance)
        self._stream_mine: set[int] = set()  # the ones the controller gave this rank
        self._stream_tokens = cfg.async_training.stream_chunk_tokens

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        holding = self.holding
        if holding.source is WeightSource.BRIDGE and holding.version is None:
            raise EngineError("the rollout was asked to generate before any weights reached it")
        if self._stream is not None and self._stream.in_flight:
            # vLLM would finish the stream's requests with these, and sleep drops their cache
            raise EngineError("the rollout was asked to generate with stream samples in flight")
        if (
            holding.source is WeightSource.ACTOR_BESIDE
            and holding.version != self.actor.weights_version
        ):
            self.sync_weights()
        self.engine.wake()
        try:
            names = request.agent_names
            if self.agent is None or not names:
                return self.engine.generate(request)
            layout = getattr(self.engine, "layout", None)
            if layout is not None and layout.tp > 1:  # the group's leader runs the loops
                from engine.agents.tp_group import run_in_group

                return run_in_group(self.agent, self.engine, request, self.cfg.calculate_log_probs)
            if set(names) == {"single_turn"}:
                return self.engine.generate(request)
            from engine.agents.loop import as_generation_output

            trajectories = self.agent.run(
                self.engine, request.prompt_ids, request.sampling, names, request.extra_info
            )
            return as_generation_output(trajectories, logprobs=self.cfg.calculate_log_probs)
        finally:
            self.engine.sleep()

    def stream_advance(
        self, items: list[StreamItem], sampling: SamplingParams, version: int
    ) -> list[StreamDone]:
        """Add ``items`` to the samples in flight and advance them all by about
        ``async_training.stream_chunk_tokens`` tokens; the samples that finished, each
        token tagged with ``version``, the weights it was made with (engine.loop.rollouter)."""
        if self.holding.version is None:
            raise EngineError("the rollout was asked to generate before any weights reached it")
        if self._stream is None:
            self._stream = self._open_stream()
        self.engine.wake()
        layout = getattr(self.engine, "layout", None)
        if layout is None:  # HF: one step is a chunk of tokens
            return advance(self._stream, items, sampling, version, steps=1)
        from engine.rollout.tp import gather_group_rows, group_seed
        from engine.rollout.vllm import seeded

        # A TP group's members add every member's samples and step alike (SPMD); each
        # returns its own
        group = self.engine.group
        everyone, _ = gather_group_rows(items, layout, group)
        self._stream_mine.update(item.uid for item in items)
        with seeded(group_seed(layout, group)):
            done = advance(self._stream, everyone, sampling, version, self._stream_tokens)
        mine = [d for d in done if d.uid in self._stream_mine]
        self._stream_mine.difference_update(d.uid for d in mine)
        return mine

    def stream_drop(self) -> None:
        """Forget the samples in flight (the run is over)."""
        if self._stream is not None:
            self._stream.drop()
            self._stream_mine.clear()

    def _open_stream(self) -> Any:
        if self.cfg.name == "hf":
            from engine.rollout.hf_stream import HFSampleStream

            return HFSampleStream(self.engine, self._stream_tokens)
        if self.cfg.name == "vllm":
            return self.engine.sample_stream()
        raise EngineError(f"the {self.cfg.name} rollout does not stream samples")

    def close(self) -> None:
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()

    def sync_weights(self) -> None:
        """Push the actor's current weights into the engine, in the rollout dtype, as
        the engine names them (Hugging Face names, unfused)."""
        names = ENGINE_NAME_MAPS[self.cfg.name]
        if self.holding.adapter:
            self._sync_adapter(names)
            return
        pairs = self.actor.engine.hf_named_tensors(self.rollout_dtype)  # FSDP or Megatron
        self.engine.sync_weights(as_engine_names(pairs, names))
        self._holds(version=self.actor.weights_version)

    def _sync_adapter(self, names: Any) -> None:
        """The frozen base weights once, then the adapter of this weight version (ids
        from 1: vLLM's LoRA ids must be positive)."""
        engine = self.actor.engine
        if not self.holding.base_loaded:
            self.engine.sync_weights(
                as_engine_names(engine.base_named_tensors(self.rollout_dtype), names)
            )
            self._holds(base_loaded=True)
        version = self.actor.weights_version
        peft_config = engine.peft_model.peft_config["default"]
        tensors = engine.adapter_named_tensors(self.rollout_dtype)
        self.engine.set_adapter(version + 1, peft_config, tensors)
        self._holds(version=version)

    def receive_weights(self, address: Any) -> None:
        """The actor's weights from the bridge, loaded into the engine as they come
        (placement=separate; engine.controller.groups.SeparateGroups.push_weights): full
        weights, or the base weights (the first push) and the adapter (every push) for a
        vLLM that serves it, each part named by the sender (engine.rollout.bridge)."""
        import torch.distributed as dist

        from engine.rollout.bridge import WeightBridge, WeightPart

        if self._bridge is None:  # the rollout's ranks are 1.. (the actor's sender is 0)
            self._bridge = WeightBridge(address, 1 + dist.get_rank(), self.device.torch_device())
        names = ENGINE_NAME_MAPS[self.cfg.name]
        version = (self.holding.version or 0) + 1  # vLLM's LoRA ids: positive, new each time
        adapter = self.holding.adapter
        takes = (WeightPart.BASE, WeightPart.ADAPTER) if adapter else (WeightPart.FULL,)
        for part, tensors in self._bridge.receive_push():
            if part not in takes:  # the two sides disagree on lora_as_adapter: a bug
                raise EngineError(
                    f"the rollout (lora_as_adapter={adapter}) was pushed {part.value} weights"
                )
            if part is WeightPart.ADAPTER:
                self._set_pushed_adapter(version, list(tensors))
            else:
                self.engine.sync_weights(as_engine_names(tensors, names))
                self._holds(base_loaded=True)
        self._holds(version=version)

    def _holds(self, **changes: Any) -> None:
        self.holding = dataclasses.replace(self.holding, **changes)

    def _set_pushed_adapter(self, version: int, tensors: list[Any]) -> None:
        """Serve a pushed adapter; its peft config is the actor's (``lora_config``), its
        target modules those the tensors name (``all-linear`` resolved as peft did)."""
        from engine.train.lora import lora_config

        if not self.holding.base_loaded:
            raise EngineError("the rollout was pushed an adapter before the base weights")
        targets = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name, _ in tensors})
        self.engine.set_adapter(version, lora_config(self.model_cfg, targets), tensors)


def _tool_agent(cfg: EngineConfig, tokenizer: Any) -> Any:
    """The multi-turn agent runner (engine.agents) when ``rollout.multi_turn`` is on: its
    tools, interactions and agent loops are built here, in the worker that runs them."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return None
    from engine.agents.chat import ChatFormat
    from engine.agents.interactions import load_interactions
    from engine.agents.loop import AgentRunner
    from engine.agents.loops import load_agent_loops
    from engine.agents.tools import build_tools, get_tool_call_parser, load_tool_specs, tool_schemas
    from engine.agents.trajectory import AgentLimits

    specs = load_tool_specs(mt.tool_config_path) if mt.tool_config_path else []
    return AgentRunner(
        ChatFormat(tokenizer, tool_schemas(specs), cfg.data.apply_chat_template_kwargs),
        get_tool_call_parser(mt.format, mt.max_parallel_calls),
        build_tools(specs),
        AgentLimits(
            max_turns=mt.max_assistant_turns,
            max_response_tokens=cfg.data.max_response_length,
            max_tool_response_chars=mt.max_tool_response_length,
            tool_timeout_s=mt.tool_timeout_s,
            max_user_turns=mt.max_user_turns,
        ),
        load_interactions(mt.interaction_config_path) if mt.interaction_config_path else {},
        load_agent_loops(mt.agent_loop_config_path) if mt.agent_loop_config_path else {},
    )
