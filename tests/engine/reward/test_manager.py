import logging
import time

import pytest

from engine.config import CustomRewardFunctionConfig, OverlongBufferConfig, RewardModelConfig
from engine.reward import RewardError, RewardManager, ScoreRequest, overlong_penalty

CUSTOM = """
import os
import time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "hang":
        while True:
            time.sleep(1)
    if solution_str == "raise":
        raise ValueError("bad sample")
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "dict":
        return {"score": 0.5, "acc": 1.0, "format": 1, "pred": "not a number"}
    return float(solution_str == str(ground_truth))
"""


@pytest.fixture
def custom_cfg(tmp_path):
    path = tmp_path / "reward_fn.py"
    path.write_text(CUSTOM)
    return CustomRewardFunctionConfig(path=str(path))


def req(response, truth="a", source="anything", length=1):
    return ScoreRequest(source, response, truth, {"index": 0}, length)


def test_builtin_scorers_in_parallel_keep_order():
    cfg = RewardModelConfig(num_workers=2, timeout_s=10.0)
    requests = [req(f"#### {i}", str(i if i % 3 else -1), "openai/gsm8k") for i in range(200)]
    requests += [req("\\boxed{\\frac12}", "0.5", "math"), req("#### 1", "1", "gsm8k")]
    with RewardManager(cfg, CustomRewardFunctionConfig(), 16) as manager:
        results = manager.score(requests)
        assert [r.score for r in results[:200]] == [0.0 if i % 3 == 0 else 1.0 for i in range(200)]
        assert [r.score for r in results[200:]] == [1.0, 1.0]
        assert all(r.error is None for r in results)
        assert results[0].extras == {"format": 1.0}
        assert "overlong_penalty" not in results[0].extras  # buffer disabled
        assert manager.score([]) == []


def test_workers_started_ahead_score_as_those_started_by_the_first_batch():
    cfg = RewardModelConfig(num_workers=2, timeout_s=10.0)
    requests = [req(f"#### {i}", str(i % 4), "openai/gsm8k") for i in range(40)]
    with RewardManager(cfg, CustomRewardFunctionConfig(), 16) as lazy:
        expected = lazy.score(requests)
    with RewardManager(cfg, CustomRewardFunctionConfig(), 16) as ahead:
        ahead.start()
        started = [w.process.pid for w in ahead._workers]
        assert len(started) == 2
        assert ahead.score(requests) == expected
        assert [w.process.pid for w in ahead._workers] == started  # no more were started


def test_hanging_function_times_out_and_later_batches_work(custom_cfg):
    cfg = RewardModelConfig(num_workers=2, timeout_s=1.0)
    with RewardManager(cfg, custom_cfg, 16) as manager:
        assert [r.score for r in manager.score([req("a"), req("b")])] == [1.0, 0.0]  # warm
        batch = [req("a"), req("hang"), req("a"), req("b"), req("hang"), req("a")]
        start = time.monotonic()
        results = manager.score(batch)
        elapsed = time.monotonic() - start
        assert elapsed < cfg.timeout_s + 3.0
        assert [r.score for r in results] == [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
        assert [r.error for r in results] == [None, "timeout", None, None, "timeout", None]
        again = manager.score([req("a")] * 20)
        assert [r.score for r in again] == [1.0] * 20


def test_raising_and_dying_scorers_score_zero(custom_cfg, caplog):
    cfg = RewardModelConfig(num_workers=1, timeout_s=5.0)
    with RewardManager(cfg, custom_cfg, 16) as manager, caplog.at_level(logging.WARNING):
        results = manager.score([req("raise"), req("a"), req("exit"), req("a"), req("dict")])
        assert [r.score for r in results] == [0.0, 1.0, 0.0, 1.0, 0.5]
        assert results[0].error == "ValueError: bad sample"
        assert "exit code 3" in results[2].error
        assert results[4].acc == 1.0
        assert results[4].extras == {"format": 1.0}  # non-numeric extras dropped
        assert "failed on 2 of 5 samples" in caplog.text
        assert manager.score([req("a")])[0].score == 1.0


def test_unknown_data_source_fails_before_scoring():
    with (
        RewardManager(
            RewardModelConfig(num_workers=1), CustomRewardFunctionConfig(), 16
        ) as manager,
        pytest.raises(RewardError, match=r"custom_reward_function\.path"),
    ):
        manager.score([req("x", source="my/unknown")])


def test_custom_function_overrides_registry(custom_cfg):
    with RewardManager(RewardModelConfig(num_workers=1), custom_cfg, 16) as manager:
        # "openai/gsm8k" would score "#### 1" against "1" as 1.0; the custom function decides.
        assert manager.score([req("#### 1", "1", "openai/gsm8k")])[0].score == 0.0


def test_bad_custom_function_fails_at_construction(tmp_path):
    bad = CustomRewardFunctionConfig(path=str(tmp_path / "missing.py"))
    with pytest.raises(RewardError, match="is not a file"):
        RewardManager(RewardModelConfig(), bad, 16)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_workers": 0}, "num_workers"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"reward_manager": "prime"}, "reward_manager"),
        ({"overlong_buffer": OverlongBufferConfig(enable=True, len=0)}, "overlong_buffer.len"),
        ({"overlong_buffer": OverlongBufferConfig(enable=True, len=32)}, "overlong_buffer.len"),
    ],
)
def test_config_errors(change, message):
    with pytest.raises(RewardError, match=message):
        RewardManager(RewardModelConfig(**change), CustomRewardFunctionConfig(), 16)


@pytest.mark.parametrize(
    ("length", "penalty"),
    [(0, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (15, -0.75), (16, -1.0), (17, -1.0), (99, -1.0)],
)
def test_overlong_penalty_values(length, penalty):
    # L_max = 16, L_cache = 4: free up to 12 tokens, then linear down to -1 at 16.
    assert overlong_penalty(length, 16, 4, 1.0) == pytest.approx(penalty)
    assert overlong_penalty(length, 16, 4, 0.5) == pytest.approx(penalty / 2)


def test_manager_adds_overlong_penalty_whatever_its_name(custom_cfg):
    buffer = OverlongBufferConfig(enable=True, len=4, penalty_factor=1.0)
    for name in ("dapo", "naive"):
        cfg = RewardModelConfig(num_workers=1, reward_manager=name, overlong_buffer=buffer)
        with RewardManager(cfg, custom_cfg, 16) as manager:
            results = manager.score([req("a", length=12), req("a", length=14), req("b", length=16)])
        assert [r.score for r in results] == pytest.approx([1.0, 0.5, -1.0])
        assert [r.acc for r in results] == [1.0, 1.0, 0.0]
        assert [r.extras["overlong_penalty"] for r in results] == pytest.approx([0.0, -0.5, -1.0])
