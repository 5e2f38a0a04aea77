"""A multi-turn (tool-using) run through the whole engine on CPU: the tools file is
checked at start, the prompts show the tools, every sample goes through the agent loop
in the rollout workers, and the step's agent metrics are logged.

The tiny model starts from random weights, so it rarely writes a well-formed tool call:
this run proves the plumbing, not that a model learns to use a tool (the synthetic tool
task that shows learning is issue 17's next part)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_a_multi_turn_run_trains_through_the_agent_loop(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, read_metrics
):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - name: calculator\n")
    train, val = synthetic_data
    run_dir = tmp_path / "run"
    overrides = [
        *base_overrides,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "trainer.total_training_steps=2",
        # the tools' system block takes about 250 tokens; tool results count in the response
        "data.max_prompt_length=384",
        "data.max_response_length=96",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
    ]
    repo = str(Path(__file__).parents[2])
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "engine.main", *overrides],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [r for r in read_metrics(run_dir) if "critic/score/mean" in r]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        # every sample went through the agent loop: at least one model turn each, at
        # most the limit; the tokens the model wrote per turn are counted
        assert 1.0 <= r["agent/turns_mean"] <= 3.0
        assert r["agent/turns_max"] <= 3.0
        assert r["agent/response_tokens_per_turn"] > 0
        assert r["agent/tool_timeouts"] == 0.0


def test_bad_tools_stop_the_run_at_start_naming_the_key(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides
):
    """The call format is checked with the config (`--check`, `rlctl validate`); the tools
    file where the job runs, when the engine starts, before any worker."""
    key = "actor_rollout_ref.rollout.multi_turn"
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - name: calculater\n")
    train, _ = synthetic_data
    common = [
        *base_overrides,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        "data.max_prompt_length=384",
        f"{key}.enable=true",
        f"{key}.tool_config_path={tools}",
    ]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "engine.main", *args], capture_output=True,
                              text=True, timeout=300)  # fmt: skip

    checked = run("--check", *common, f"{key}.format=harmony")
    assert checked.returncode == 2
    assert f"{key}.format" in checked.stderr and "hermes" in checked.stderr
    started = run(*common)
    assert started.returncode == 2, started.stderr[-2000:]
    assert f"{key}.tool_config_path" in started.stderr
    assert "calculater" in started.stderr and "calculator" in started.stderr  # value and fix
    assert "Started a local Ray instance" not in started.stderr  # before any worker


TWO_STEPS = """\
class TwoSteps:
    CONFIG_KEYS = ("tokens",)

    def __init__(self, config):
        self.tokens = int(config.get("tokens", 8))

    async def run(self, episode):
        await episode.generate(max_new_tokens=self.tokens)
        episode.add_messages([{"role": "user", "content": "Go on."}])
        await episode.generate(max_new_tokens=self.tokens)
"""


def test_an_agent_loop_of_ones_own_drives_every_sample(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, read_metrics
):
    """A loop declared in an agent loops file, made the default: each sample takes
    exactly its two short turns in the rollout workers (no tools file at all), and a
    default that names no declared loop is refused at start, before any worker."""
    key = "actor_rollout_ref.rollout.multi_turn"
    (tmp_path / "two_steps.py").write_text(TWO_STEPS)
    loops = tmp_path / "loops.yaml"
    loops.write_text(
        "- name: two_steps\n  _target_: two_steps.py:TwoSteps\n  config: {tokens: 6}\n"
    )
    train, _ = synthetic_data
    run_dir = tmp_path / "run"
    overrides = [
        *base_overrides,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.total_training_steps=1",
        "data.max_response_length=64",
        "trainer.val_before_train=false",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        f"{key}.enable=true",
        f"{key}.agent_loop_config_path={loops}",
    ]
    repo = str(Path(__file__).parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (repo, os.environ.get("PYTHONPATH")) if p)}  # fmt: skip

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "engine.main", *args], capture_output=True,
                              text=True, timeout=600, env=env)  # fmt: skip

    typo = run(*overrides, f"{key}.default_agent=two_step")
    assert typo.returncode == 2, typo.stderr[-2000:]
    assert f"{key}.default_agent" in typo.stderr and "two_steps" in typo.stderr
    assert "Started a local Ray instance" not in typo.stderr
    result = run(*overrides, f"{key}.default_agent=two_steps")
    assert result.returncode == 0, result.stderr[-3000:]
    (record,) = [r for r in read_metrics(run_dir) if "critic/score/mean" in r]
    assert record["agent/turns_mean"] == 2.0 and record["agent/turns_max"] == 2.0
    assert record["agent/tool_calls_mean"] == 0.0
    assert record["agent/response_tokens_per_turn"] <= 6.0  # the file's config reached it
