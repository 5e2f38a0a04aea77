"""The calls VLLMRollout.set_adapter makes on vLLM's engine (the real engine serving an
adapter, across a swap: test_vllm_engine.py, on the CPU build): the weights woken first
where the engine sleeps (the adapter is written into the LoRA layers' buffers at once),
each version loaded in place under the one id, the requests in flight preempted."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")


class FakeLLM:
    def __init__(self):
        self.calls: list[tuple] = []
        self.llm_engine = self

    def wake_up(self, tags):
        self.calls.append(("wake_up", tuple(tags)))

    def add_lora(self, request):
        self.calls.append(("add_lora", request.lora_int_id, request.load_inplace))
        return True

    def reset_prefix_cache(self, reset_running_requests=False):
        self.calls.append(("reset_prefix_cache", reset_running_requests))


def test_set_adapter_wakes_the_weights_and_replaces_the_adapter_in_place(tmp_path):
    from peft import LoraConfig

    from engine.rollout.lora_adapter import AdapterFolder
    from engine.rollout.vllm import VLLMRollout
    from engine.rollout.vllm_lora import ADAPTER_ID

    rollout = object.__new__(VLLMRollout)  # no engine: only the calls are checked
    rollout.llm = FakeLLM()
    rollout._broken = None
    rollout._asleep = {"weights", "kv_cache"}
    rollout._adapters = AdapterFolder()
    config = LoraConfig(r=8, target_modules=["q_proj"])
    tensors = [("base_model.model.q_proj.lora_A.weight", torch.zeros(8, 4))]
    rollout.set_adapter(1, config, tensors)
    first = rollout._lora
    rollout.set_adapter(2, config, tensors)
    assert rollout.llm.calls == [
        ("wake_up", ("weights",)),
        ("add_lora", ADAPTER_ID, True),
        ("reset_prefix_cache", True),
        ("add_lora", ADAPTER_ID, True),
        ("reset_prefix_cache", True),
    ]
    assert rollout._asleep == {"kv_cache"}
    # Every request names the one id, and does not reload the adapter at each step.
    assert (first.lora_int_id, rollout._lora.lora_int_id) == (ADAPTER_ID, ADAPTER_ID)
    assert not rollout._lora.load_inplace
    assert first.lora_path != rollout._lora.lora_path  # prefixes cached per version
    rollout._adapters.close()
