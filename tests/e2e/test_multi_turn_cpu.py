"""A multi-turn (tool-using) run through the whole engine on CPU: the tools file is
checked at start, the prompts show the tools, every sample goes through the agent loop
in the rollout workers, and the step's agent metrics are logged.

The tiny model starts from random weights, so it rarely writes a well-formed tool call:
this run proves the plumbing, not that a model learns to use a tool (the synthetic tool
task that shows learning: tests/e2e/test_tool_task_cpu.py). The runs go in this process
(tests/e2e/conftest.py), the engine's command too, but for ``--check``."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_a_multi_turn_run_trains_through_the_agent_loop(
    tiny_model_dir, synthetic_data, tmp_path, run_engine
):
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - name: calculator\n")
    train, val = synthetic_data
    run = run_engine(
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
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.logger=[console]",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
    )
    records = run.steps
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        # every sample went through the agent loop: at least one model turn each, at
        # most the limit; the tokens the model wrote per turn are counted
        assert 1.0 <= r["agent/turns_mean"] <= 3.0
        assert r["agent/turns_max"] <= 3.0
        assert r["agent/response_tokens_per_turn"] > 0
        assert r["agent/tool_timeouts"] == 0.0


def test_bad_tools_stop_the_run_at_start_naming_the_key(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, engine_main, kept_workers, capsys
):
    """The call format is checked with the config (`--check`, `rlctl validate`: the
    command, torch-free, as a process of its own); the tools file where the job runs,
    when the engine starts, before any worker (the command, in this process)."""
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

    checked = subprocess.run([sys.executable, "-m", "engine.main", "--check", *common,
                              f"{key}.format=harmony"], capture_output=True, text=True,
                             timeout=300)  # fmt: skip
    assert checked.returncode == 2
    assert f"{key}.format" in checked.stderr and "hermes" in checked.stderr
    starts = kept_workers.starts
    assert engine_main(*common) == 2
    err = capsys.readouterr().err
    assert f"{key}.tool_config_path" in err
    assert "calculater" in err and "calculator" in err  # value and fix
    assert kept_workers.starts == starts  # before any worker


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
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, engine_main, kept_workers, capsys,
    read_metrics,
):  # fmt: skip
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
    starts = kept_workers.starts
    assert engine_main(*overrides, f"{key}.default_agent=two_step") == 2
    err = capsys.readouterr().err
    assert f"{key}.default_agent" in err and "two_steps" in err
    assert kept_workers.starts == starts  # before any worker
    assert engine_main(*overrides, f"{key}.default_agent=two_steps") == 0
    (record,) = [r for r in read_metrics(run_dir) if "critic/score/mean" in r]
    assert record["agent/turns_mean"] == 2.0 and record["agent/turns_max"] == 2.0
    assert record["agent/tool_calls_mean"] == 0.0
    assert record["agent/response_tokens_per_turn"] <= 6.0  # the file's config reached it
