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

from typing import Any

from engine.config import EngineConfig
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.models.hf_config import config_overrides, load_hf_config
from engine.rollout.hf import eos_ids
from engine.rollout.stream import StreamDone, StreamItem, advance
from engine.rollout.translate import EngineSettings
from engine.rollout.weights import ENGINE_NAME_MAPS, as_engine_names
from engine.train.fsdp import DTYPES, load_hf_model
from engine.types import GenerationOutput, GenerationRequest, SamplingParams


class RolloutWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        rollout_cfg = cfg.actor_rollout_ref.rollout
        self.cfg = rollout_cfg
        self.device = device
        self.model_cfg = cfg.actor_rollout_ref.model
        # Separate (placement=separate): no actor here; the controller pushes its weights
        # over a bridge (receive_weights) before a generation needs them.
        self.actor = colocated.get("actor")
        self.adapter_mode = False  # rollout.lora_as_adapter: the engine serves the adapter
        self.base_synced = False
        self.separate = self.actor is None
        self._bridge: Any = None
        # A Megatron actor's weights cannot generate, and a separate rollout has none
        # here: the engine then holds a copy of its own, synced from the actor.
        self.own_copy = cfg.actor_rollout_ref.actor.strategy == "megatron" or self.separate
        self.synced_version: int | None = None  # the actor's weights the engine holds
        self.agent = _tool_agent(cfg, tokenizer)  # None: single-turn rollouts only
        self._stream: Any = None  # the fully asynchronous mode's samples (stream_advance)
        self._stream_mine: set[int] = set()  # the ones the controller gave this rank
        self._stream_tokens = cfg.async_training.stream_chunk_tokens
        model = cfg.actor_rollout_ref.model
        if rollout_cfg.name == "hf":
            from engine.rollout.hf import HFRollout

            # Its own plain HF copy (see own_copy), synced from the actor.
            module = self._own_hf_model(model) if self.own_copy else self.actor.module
            self.engine: Any = HFRollout(
                module,
                tokenizer,
                device.torch_device(),
                micro_batch_size=rollout_cfg.micro_batch_size,
                logprobs=rollout_cfg.calculate_log_probs,
                routing=rollout_cfg.enable_rollout_routing_replay,
            )
            self.owns_weights = self.own_copy
            return
        generation_config = _generation_config(model) if self.own_copy else self.actor.module
        settings = engine_settings(
            cfg, device, eos_ids(tokenizer, generation_config), self.separate
        )
        # A LoRA actor's adapter served by the engine itself (else: merged weights).
        self.adapter_mode = rollout_cfg.lora_as_adapter
        lora_rank = model.lora_rank if self.adapter_mode else 0
        if rollout_cfg.name == "vllm":
            from engine.rollout.vllm import VLLMRollout

            self.engine = VLLMRollout(rollout_cfg, settings, lora_rank=lora_rank)
        elif rollout_cfg.name == "sglang":
            from engine.rollout.sglang import SGLangRollout

            local_rank = device.torch_device().index or 0
            self.engine = SGLangRollout(
                rollout_cfg,
                settings,
                local_rank=local_rank,
                lora_rank=lora_rank,
                lora_targets=model.target_modules,
            )
        else:
            raise EngineError(f"unknown actor_rollout_ref.rollout.name {rollout_cfg.name!r}")
        self.owns_weights = True

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        if self.separate and self.synced_version is None:
            raise EngineError("the rollout was asked to generate before any weights reached it")
        if self._stream is not None and self._stream.in_flight:
            # vLLM would finish the stream's requests with these, and sleep drops their cache
            raise EngineError("the rollout was asked to generate with stream samples in flight")
        if (
            not self.separate
            and self.owns_weights
            and self.synced_version != self.actor.weights_version
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
        token tagged with ``version``, the weights it was made with (engine.rollouter)."""
        if self.synced_version is None:
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
        if self.adapter_mode:
            self._sync_adapter(names)
            return
        pairs = self.actor.engine.hf_named_tensors(self.rollout_dtype)  # FSDP or Megatron
        self.engine.sync_weights(as_engine_names(pairs, names))
        self.synced_version = self.actor.weights_version

    def _sync_adapter(self, names: Any) -> None:
        """The frozen base weights once, then the adapter of this weight version (ids
        from 1: vLLM's LoRA ids must be positive)."""
        engine = self.actor.engine
        if not self.base_synced:
            self.engine.sync_weights(
                as_engine_names(engine.base_named_tensors(self.rollout_dtype), names)
            )
            self.base_synced = True
        version = self.actor.weights_version
        peft_config = engine.peft_model.peft_config["default"]
        tensors = engine.adapter_named_tensors(self.rollout_dtype)
        self.engine.set_adapter(version + 1, peft_config, tensors)
        self.synced_version = version

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
        version = (self.synced_version or 0) + 1  # vLLM's LoRA ids: positive, new each time
        takes = (WeightPart.BASE, WeightPart.ADAPTER) if self.adapter_mode else (WeightPart.FULL,)
        for part, tensors in self._bridge.receive_push():
            if part not in takes:  # the two sides disagree on lora_as_adapter: a bug
                raise EngineError(
                    f"the rollout (lora_as_adapter={self.adapter_mode}) was pushed"
                    f" {part.value} weights"
                )
            if part is WeightPart.ADAPTER:
                self._set_pushed_adapter(version, list(tensors))
            else:
                self.engine.sync_weights(as_engine_names(tensors, names))
                self.base_synced = True
        self.synced_version = version

    def _set_pushed_adapter(self, version: int, tensors: list[Any]) -> None:
        """Serve a pushed adapter; its peft config is the actor's (``lora_config``), its
        target modules those the tensors name (``all-linear`` resolved as peft did)."""
        from engine.train.lora import lora_config

        if not self.base_synced:
            raise EngineError("the rollout was pushed an adapter before the base weights")
        targets = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name, _ in tensors})
        self.engine.set_adapter(version, lora_config(self.model_cfg, targets), tensors)

    @property
    def rollout_dtype(self) -> Any:
        return DTYPES[self.cfg.dtype] if self.device.supports_bf16 else None

    def _own_hf_model(self, model_cfg: Any) -> Any:
        """The HF rollout's own model for a Megatron actor, on the device in the rollout
        dtype; its weights come from the actor at the first generation."""
        module = load_hf_model(model_cfg)
        module.requires_grad_(False)
        return module.to(device=self.device.torch_device(), dtype=self.rollout_dtype)


def engine_settings(
    cfg: EngineConfig, device: DeviceSpec, eos_token_ids: Any, separate: bool
) -> EngineSettings:
    """What the vLLM or SGLang engine of this rollout is built from."""
    rollout_cfg = cfg.actor_rollout_ref.rollout
    model = cfg.actor_rollout_ref.model
    # The engine holds what the actor pushes: the rollout dtype on accelerators,
    # float32 on CPU (where the actor trains in float32, see DeviceSpec.supports_bf16).
    engine_dtype = rollout_cfg.dtype if device.supports_bf16 else "float32"
    # the context: rollout.max_model_len (verl's key), or a prompt and its response
    max_model_len = (
        rollout_cfg.max_model_len or cfg.data.max_prompt_length + cfg.data.max_response_length
    )
    return EngineSettings(
        model_path=model.path,
        eos_token_ids=frozenset(eos_token_ids),
        max_model_len=max_model_len,
        seed=cfg.trainer.seed,
        trust_remote_code=model.trust_remote_code,
        # The first generation pushes the actor's weights: no second read from disk.
        load_format="dummy",
        local_world_size=(
            rollout_cfg.separate_n_gpus_per_node if separate else cfg.trainer.n_gpus_per_node
        ),
        bucket_bytes=rollout_cfg.update_weights_bucket_megabytes * 2**20,
        dtype=engine_dtype,
        kv_cache_bytes=(
            _cpu_kv_cache_bytes(cfg, engine_dtype, max_model_len) if device.type == "cpu" else None
        ),
        # the model the actor trains: its override_config (the HF rollout runs or loads
        # the actor's model, which has it already)
        hf_overrides=config_overrides(model),
        mm_processor_kwargs=dict(cfg.data.mm_processor_kwargs),
    )


def _cpu_kv_cache_bytes(cfg: EngineConfig, dtype: str, max_model_len: int) -> int:
    """On CPU vLLM sizes its KV cache as a fraction of the host's RAM per engine (two
    workers at the default 0.5 would ask for all of it): size it for what one engine
    generates per training step instead, every sequence at full length."""
    from engine.rollout.translate import kv_cache_bytes_for

    rollout = cfg.actor_rollout_ref.rollout
    hf_config = load_hf_config(cfg.actor_rollout_ref.model)
    devices = (
        rollout.separate_nnodes * rollout.separate_n_gpus_per_node
        if rollout.placement == "separate"
        else cfg.world_size
    )
    engines = max(1, devices // rollout.tensor_model_parallel_size)
    prompts = cfg.data.train_batch_size
    if cfg.async_training.mode == "fully_async":  # up to the admission cap in flight
        from engine.config.async_training import admission_cap

        prompts = admission_cap(cfg)
    rows = -(-prompts * rollout.n // engines)
    return kv_cache_bytes_for(hf_config, dtype, max_model_len, rows)


def _generation_config(model_cfg: Any) -> Any:
    """An object with the model's ``generation_config`` (its EOS ids), read from the
    model folder: a Megatron actor has no HF module to ask."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(
            model_cfg.path, trust_remote_code=model_cfg.trust_remote_code
        )
    except OSError:  # no generation_config.json: the tokenizer's EOS alone
        config = None
    return SimpleNamespace(generation_config=config)


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
