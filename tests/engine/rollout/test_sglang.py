"""The SGLang backend against SGLang 0.5.21+'s Engine API (read from 0.5.23's source):
the weight-update session, ``(success, message)`` answers, a failed sync marking the
engine unusable on every member of its TP group, memory tags per version, aborts, the
log-prob switch it refuses. SGLang cannot run on a CPU (its kernels are CUDA-only), so
these run against a stand-in with the real Engine's surface and answers."""

from __future__ import annotations

import sys
import types
from typing import ClassVar

import pytest
import torch

from engine.config import RolloutConfig
from engine.errors import EngineError
from engine.rollout.translate import EngineSettings, engine_args_for
from engine.types import GenerationRequest, SamplingParams

EOS = {2, 5}


def _settings():
    return EngineSettings("/m", eos_token_ids=frozenset({2}), max_model_len=64)


class FakeSGLang023Engine:
    """sglang.Engine as of 0.5.21+: weight pushes answer (success, message) and are
    refused outside a begin/end_weight_update session (scheduler weight_updater.py)."""

    instances: ClassVar[list[FakeSGLang023Engine]] = []
    fail_on_push: ClassVar[int | None] = None  # refuse the n-th push (0-based)

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple] = []
        self.session = False
        self.pushes = 0
        FakeSGLang023Engine.instances.append(self)

    def generate(self, input_ids, sampling_params, return_logprob=False):
        self.calls.append(("generate", len(input_ids), return_logprob))
        return [
            {
                "output_ids": [row[-1], 9, 9],
                "meta_info": {
                    "output_token_logprobs": [
                        (-1.0, row[-1], None),
                        (-0.5, 9, None),
                        (-0.5, 9, None),
                    ],
                    "finish_reason": {"type": "length", "length": 3},
                },
            }
            for row in input_ids
        ]

    def begin_weight_update(self, selector="all"):
        self.calls.append(("begin",))
        if self.session:
            return False, "a weight-update session is already open"
        self.session = True
        return True, "Success"

    def end_weight_update(self):
        self.calls.append(("end",))
        if not self.session:
            return False, "no weight-update session is open"
        self.session = False
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append(("update", [n for n, _ in named_tensors], flush_cache))
        if not self.session:
            return False, "update_weights_from_tensor must run between begin and end"
        index, self.pushes = self.pushes, self.pushes + 1
        if index == FakeSGLang023Engine.fail_on_push:
            return False, "Failed to update parameter online: shape mismatch"
        return True, "Success"

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release", tuple(tags)))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume", tuple(tags)))

    def shutdown(self):
        self.calls.append(("shutdown",))


@pytest.fixture
def fake_sglang_023(monkeypatch):
    module = types.ModuleType("sglang")
    module.Engine = FakeSGLang023Engine
    monkeypatch.setitem(sys.modules, "sglang", module)
    import engine.rollout.sglang as backend

    monkeypatch.setattr(backend, "check_version", lambda name: "0.5.23")
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)
    FakeSGLang023Engine.instances.clear()
    FakeSGLang023Engine.fail_on_push = None
    return backend


def test_sglang_023_weight_session_and_memory_tags(fake_sglang_023):
    """0.5.21+: the pushes sit in one weight-update session, after the weights' memory
    is back; the CUDA graphs are released with the rest and come back on wake."""
    cfg = RolloutConfig(name="sglang", calculate_log_probs=True)
    rollout = fake_sglang_023.SGLangRollout(cfg, _settings())
    engine = FakeSGLang023Engine.instances[0]
    assert engine.calls == [("release", ("kv_cache", "weights", "cuda_graph"))]
    rollout.bucket_bytes = 800
    rollout.sync_weights([(f"w{i}", torch.zeros(100)) for i in range(3)])
    assert engine.calls[1:] == [
        ("resume", ("weights",)),
        ("begin",),
        ("update", ["w0", "w1"], False),
        ("update", ["w2"], True),
        ("end",),
    ]
    rollout.wake()
    assert engine.calls[-1] == ("resume", ("cuda_graph", "kv_cache"))
    out = rollout.generate(GenerationRequest([[4, 2]], SamplingParams(max_new_tokens=3)))
    assert out.response_ids == [[2]] and out.finished == [True] and out.logprobs == [[-1.0]]
    rollout.close()
    assert engine.calls[-1] == ("shutdown",)


def test_sglang_eager_engine_has_no_cuda_graphs_to_release(fake_sglang_023):
    fake_sglang_023.SGLangRollout(RolloutConfig(name="sglang", enforce_eager=True), _settings())
    assert FakeSGLang023Engine.instances[0].calls == [("release", ("kv_cache", "weights"))]


def test_sglang_memory_tags_follow_the_version():
    from engine.rollout.sglang import memory_tags

    cfg = RolloutConfig(name="sglang")
    assert memory_tags("0.5.20", cfg) == ("kv_cache", "weights")
    assert memory_tags("0.5.21", cfg) == ("kv_cache", "weights", "cuda_graph")
    assert memory_tags("0.5.23", RolloutConfig(enforce_eager=True)) == ("kv_cache", "weights")


def test_sglang_failed_push_marks_the_engine_unusable(fake_sglang_023):
    """A refused push (SGLang answers (False, message), it does not raise) leaves the
    model half-updated: sync_weights raises, the rest of the gather is still drained
    (it is collective), nothing more is pushed, and every later call refuses."""
    rollout = fake_sglang_023.SGLangRollout(RolloutConfig(name="sglang"), _settings())
    engine = FakeSGLang023Engine.instances[0]
    FakeSGLang023Engine.fail_on_push = 1
    rollout.bucket_bytes = 400
    drained: list[str] = []

    def tensors():
        for i in range(4):
            drained.append(f"w{i}")
            yield f"w{i}", torch.zeros(100)

    with pytest.raises(EngineError, match="half-updated") as caught:
        rollout.sync_weights(tensors())
    message = str(caught.value)
    assert "shape mismatch" in message and "after 1 tensors" in message
    assert "last checkpoint" in message and "trainer.resume_mode" in message
    assert drained == ["w0", "w1", "w2", "w3"]
    assert [c for c in engine.calls if c[0] == "update"] == [
        ("update", ["w0"], False),
        ("update", ["w1"], False),
    ]
    rollout.wake()
    for call in (
        lambda: rollout.generate(GenerationRequest([[4]], SamplingParams(max_new_tokens=3))),
        lambda: rollout.sync_weights([("w0", torch.zeros(1))]),
    ):
        with pytest.raises(EngineError, match="half-updated"):
            call()
    assert not any(c[0] == "generate" for c in engine.calls)


def test_sglang_gather_failure_marks_the_engine_unusable(fake_sglang_023):
    rollout = fake_sglang_023.SGLangRollout(RolloutConfig(name="sglang"), _settings())

    def broken():
        yield "w0", torch.zeros(1)
        raise RuntimeError("all_gather timed out")

    with pytest.raises(EngineError, match="half-updated") as caught:
        rollout.sync_weights(broken())
    assert isinstance(caught.value.__cause__, RuntimeError)
    with pytest.raises(EngineError, match="all_gather timed out"):
        rollout.generate(GenerationRequest([[4]], SamplingParams(max_new_tokens=3)))


def test_sglang_aborted_request_is_an_error():
    from engine.rollout.sglang import parse_output

    out = {
        "output_ids": [11],
        "meta_info": {"finish_reason": {"type": "abort", "message": "Aborted"}},
    }
    with pytest.raises(EngineError, match="aborted a request: Aborted"):
        parse_output(out, EOS, False, False)


@pytest.mark.parametrize("value,refused", [("1", True), ("true", True), ("0", False), ("", False)])
def test_sglang_raw_logprob_switch_is_refused(value, refused):
    from engine.rollout.sglang import check_logprob_source

    env = {"SGLANG_RETURN_ORIGINAL_LOGPROB": value}
    check_logprob_source(RolloutConfig(calculate_log_probs=False), env)  # not used: fine
    if refused:
        with pytest.raises(EngineError, match=r"log_softmax\(logits / temperature\)"):
            check_logprob_source(RolloutConfig(calculate_log_probs=True), env)
    else:
        check_logprob_source(RolloutConfig(calculate_log_probs=True), env)


def _sglang_tp_failure_on_rank(rank: int, port: int, out_dir: str) -> None:
    """Two ranks, one TP group: the owner's engine refuses a push; both members end up
    unusable."""
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.pop("SGLANG_RETURN_ORIGINAL_LOGPROB", None)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        module = types.ModuleType("sglang")
        module.Engine = FakeSGLang023Engine
        sys.modules["sglang"] = module
        import engine.rollout.sglang as backend

        backend.check_version = lambda name: "0.5.23"
        torch.cuda.device_count = lambda: 2
        FakeSGLang023Engine.fail_on_push = 0
        cfg = RolloutConfig(name="sglang", tensor_model_parallel_size=2)
        rollout = backend.SGLangRollout(cfg, _settings())
        result = {"owner": rollout.owner}
        try:
            rollout.sync_weights([("w0", torch.zeros(4))])
        except EngineError as error:
            result["sync"] = str(error)
        try:
            rollout.generate(GenerationRequest([[rank]], SamplingParams(max_new_tokens=2)))
        except EngineError as error:
            result["generate"] = str(error)
        torch.save(result, f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_sglang_tp_group_shares_the_owners_failure(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_sglang_tp_failure_on_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    assert [r["owner"] for r in results] == [True, False]
    for r in results:
        assert "half-updated" in r["sync"] and "shape mismatch" in r["sync"]
        assert "half-updated" in r["generate"]


def test_sglang_tp_member_learns_the_owners_generate_failure(fake_sglang_023, monkeypatch):
    """The owner's generate failure travels to the members (one broadcast, stood in)."""
    rollout = fake_sglang_023.SGLangRollout(RolloutConfig(name="sglang"), _settings())
    rollout.engine = None  # a member: not the owner
    monkeypatch.setattr(rollout, "_from_owner", lambda value: (None, "RuntimeError: CUDA error"))
    with pytest.raises(EngineError, match=r"on rank 0\) failed to generate: RuntimeError: CUDA"):
        rollout.generate(GenerationRequest([[4]], SamplingParams(max_new_tokens=3)))


def test_sglang_context_leaves_room_for_a_full_response():
    kw = engine_args_for(RolloutConfig(name="sglang"), "/m", 1, backend="sglang", max_model_len=96)
    assert kw["context_length"] == 98
