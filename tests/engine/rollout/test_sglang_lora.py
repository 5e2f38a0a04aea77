"""SGLang serving a LoRA actor's adapter (``rollout.lora_as_adapter``), against the
Engine API read from SGLang's source (main at commit 001067f, late 2026): the
engine's LoRA arguments, the adapter folder it loads (peft's layout), and on each weight
version: load the new adapter under its own name, serve it, unload the old one. SGLang
cannot run on a CPU, so these run against a stand-in with the real Engine's surface
(``load_lora_adapter``/``unload_lora_adapter`` answering a ``LoRAUpdateOutput``,
``generate(..., lora_path=...)``)."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from engine.config import RolloutConfig
from engine.errors import EngineError
from engine.rollout.translate import EngineSettings
from engine.types import GenerationRequest, SamplingParams


@dataclass
class LoRAUpdateOutput:  # sglang.srt.managers.io_struct's answer to adapter calls
    success: bool
    error_message: str | None = None


class FakeLoRAEngine:
    """sglang.Engine's LoRA surface: adapters by name, a refused load answered, not
    raised; generate names one adapter per row."""

    instances: ClassVar[list[FakeLoRAEngine]] = []
    refuse_load: ClassVar[bool] = False

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple] = []
        self.loaded: dict[str, Path] = {}
        FakeLoRAEngine.instances.append(self)

    def load_lora_adapter(self, lora_name, lora_path, pinned=False):
        files = sorted(p.name for p in Path(lora_path).iterdir())
        self.calls.append(("load", lora_name, files))
        if FakeLoRAEngine.refuse_load:
            return LoRAUpdateOutput(False, "LoRA rank 64 exceeds max_lora_rank 16")
        self.loaded[lora_name] = Path(lora_path)
        return LoRAUpdateOutput(True)

    def unload_lora_adapter(self, lora_name):
        self.calls.append(("unload", lora_name))
        return LoRAUpdateOutput(self.loaded.pop(lora_name, None) is not None)

    def flush_cache(self):
        self.calls.append(("flush",))

    def generate(self, input_ids, sampling_params, return_logprob=False, lora_path=None):
        self.calls.append(("generate", lora_path))
        assert lora_path is None or all(name in self.loaded for name in lora_path)
        return [
            {"output_ids": [7, 7], "meta_info": {"finish_reason": {"type": "length"}}}
            for _ in input_ids
        ]

    def release_memory_occupation(self, tags=None):
        pass

    def resume_memory_occupation(self, tags=None):
        pass

    def shutdown(self):
        pass


@pytest.fixture
def fake_sglang(monkeypatch):
    module = types.ModuleType("sglang")
    module.Engine = FakeLoRAEngine
    monkeypatch.setitem(sys.modules, "sglang", module)
    import engine.rollout.sglang as backend

    monkeypatch.setattr(backend, "check_version", lambda name: "0.5.23")
    FakeLoRAEngine.instances.clear()
    FakeLoRAEngine.refuse_load = False
    return backend


def _rollout(backend, **lora):
    settings = EngineSettings("/m", eos_token_ids=frozenset({2}), max_model_len=64)
    rollout = backend.SGLangRollout(RolloutConfig(name="sglang"), settings, **lora)
    return rollout, FakeLoRAEngine.instances[-1]


def _generate(rollout):
    rollout.generate(GenerationRequest([[1, 3], [1, 4]], SamplingParams(max_new_tokens=2)))


@pytest.fixture(scope="module")
def adapted(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
    )
    with torch.no_grad():  # B starts at zero: a random one makes the adapter count
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    return model


def _adapter(model):
    from peft import get_peft_model_state_dict

    return model.peft_config["default"], list(get_peft_model_state_dict(model).items())


def test_engine_args_enable_lora_with_rank_and_modules(fake_sglang):
    """Started without adapters, SGLang must be told the rank and the modules; peft's
    all-linear is SGLang's all. Without lora_as_adapter, no LoRA arguments at all."""
    _, engine = _rollout(fake_sglang, lora_rank=16, lora_targets="all-linear")
    assert {k: engine.kwargs[k] for k in engine.kwargs if "lora" in k} == {
        "enable_lora": True,
        "max_lora_rank": 16,
        "lora_target_modules": ["all"],
        "max_loras_per_batch": 2,
    }
    _, engine = _rollout(fake_sglang, lora_rank=8, lora_targets=["q_proj", "v_proj"])
    assert engine.kwargs["lora_target_modules"] == ["q_proj", "v_proj"]
    _, engine = _rollout(fake_sglang)
    assert not any("lora" in k for k in engine.kwargs)


def test_each_version_is_loaded_served_then_the_old_one_unloaded(fake_sglang, adapted):
    """Version 1 loaded and served; version 2 loaded under its own name before version
    1 is unloaded, the radix cache flushed, and every later generation names it."""
    rollout, engine = _rollout(fake_sglang, lora_rank=8)
    peft_config, tensors = _adapter(adapted)
    rollout.set_adapter(1, peft_config, iter(tensors))
    _generate(rollout)
    rollout.set_adapter(2, peft_config, iter(tensors))
    _generate(rollout)
    files = ["adapter_config.json", "adapter_model.safetensors"]
    assert engine.calls == [
        ("load", "actor-v1", files),
        ("flush",),
        ("generate", ["actor-v1", "actor-v1"]),
        ("load", "actor-v2", files),
        ("unload", "actor-v1"),
        ("flush",),
        ("generate", ["actor-v2", "actor-v2"]),
    ]
    assert list(engine.loaded) == ["actor-v2"]
    folder = engine.loaded["actor-v2"]
    assert folder.exists() and not (folder.parent / "v1").exists()  # the old one removed
    rollout.close()
    assert not folder.exists()


def test_the_folder_sglang_loads_is_the_adapter_for_peft(fake_sglang, adapted, tiny_model_dir):
    """What SGLang is pointed at is peft's own layout: peft loads it beside the base
    model and it computes what the actor's adapted model does."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    rollout, engine = _rollout(fake_sglang, lora_rank=8)
    rollout.set_adapter(3, *_adapter(adapted))
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), engine.loaded["actor-v3"]
    )
    ids = torch.tensor([[5, 17, 33, 90, 11]])
    with torch.no_grad():
        with loaded.disable_adapter():
            base = loaded(input_ids=ids).logits
        want = adapted(input_ids=ids).logits
        torch.testing.assert_close(loaded(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(base, want, atol=1e-2)  # the adapter is not a no-op
    rollout.close()


def test_a_refused_load_stops_the_run_and_drains_the_tensors(fake_sglang, adapted):
    """SGLang answers a refused load (success=False), it does not raise: the rollout
    raises instead of sampling from the previous adapter, after draining the tensors
    (the actor's gather of them is collective)."""
    rollout, engine = _rollout(fake_sglang, lora_rank=8)
    peft_config, tensors = _adapter(adapted)
    rollout.set_adapter(1, peft_config, iter(tensors))
    FakeLoRAEngine.refuse_load = True
    remaining = iter(tensors)
    with pytest.raises(EngineError, match="weight version 2") as caught:
        rollout.set_adapter(2, peft_config, remaining)
    assert "exceeds max_lora_rank 16" in str(caught.value)
    assert next(remaining, None) is None
    assert ("unload", "actor-v1") not in engine.calls  # the old one still loaded
