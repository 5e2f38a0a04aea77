"""The shipped tool task (engine.data.secret), learned on CPU through the whole engine:
the tiny model, warm-started to call the tool one time in five, is trained with GRPO and
multi-turn rollouts; it comes to call the tool and answer with what it said, on the HF
rollout and on a real vLLM. The same run with a tool that answers wrong learns nothing:
the answer needs the tool's result.

Measured on the 2-core machine (docs/agents.md has the figures): the score of a step goes
from about 0.3 to 0.6 or more in 16 steps; with the wrong tool it stays near chance."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPS = 16
EDGE = 3  # steps averaged at each end
WRONG_TOOL = """\
from engine.data.secret import tool_answer


def secret(*, value):
    return tool_answer(str((int(value) + 1) % 10))  # a neighbour of the secret
"""


@pytest.fixture(scope="module")
def secret_task(tmp_path_factory):
    from engine.data.secret import write_secret_task
    from engine.data.secret_warmup import warm_start
    from engine.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("secret")
    build_tiny_model(root / "base")
    warm_start(root / "base", root / "warm")
    return root / "warm", write_secret_task(root / "data", n_train=512, n_val=32)


def train(secret_task, run_dir, base_overrides, read_metrics, *extra, tools=None):
    model, paths = secret_task
    overrides = [
        *base_overrides,
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        "algorithm.adv_estimator=grpo",
        "data.max_prompt_length=192",  # the tools block is most of the prompt
        "data.max_response_length=96",  # the call, the tool's answer and the reply
        "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.optim.lr=2e-4",  # the model is warm: no random start
        f"trainer.total_training_steps={STEPS}",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools or paths['tools']}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        *extra,
    ]
    repo = str(Path(__file__).parents[2])
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "engine.main", *overrides],
        capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [r for r in read_metrics(run_dir) if "critic/score/mean" in r]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    return records


def ends(records, key):
    """The mean of ``key`` over the first and the last EDGE steps."""
    first, last = records[:EDGE], records[-EDGE:]
    return (sum(r[key] for r in first) / EDGE, sum(r[key] for r in last) / EDGE)


def assert_learned(records):
    score_before, score_after = ends(records, "critic/score/mean")
    calls_before, calls_after = ends(records, "agent/tool_call_rate")
    # the warm start calls the tool in about a fifth of its answers and copies its result
    assert calls_before < 0.45, calls_before
    # RL makes the tool the habit, and the reward follows
    assert calls_after >= calls_before + 0.2, (calls_before, calls_after)
    assert score_after >= score_before + 0.2, (score_before, score_after)
    assert score_after >= 0.5, score_after


@pytest.mark.parametrize(
    "rollout",
    [
        pytest.param([], id="hf"),
        pytest.param(
            [
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
            ],
            marks=pytest.mark.vllm,
            id="vllm",
        ),
    ],
)
def test_the_model_learns_to_call_the_tool(
    rollout, secret_task, tmp_path, base_overrides, read_metrics
):
    assert_learned(train(secret_task, tmp_path / "run", base_overrides, read_metrics, *rollout))


def test_a_tool_that_answers_wrong_teaches_nothing(
    secret_task, tmp_path, base_overrides, read_metrics
):
    """The answer needs the tool's result: with a wrong one, calling the tool never
    pays, and the score stays near chance (1 in 10) instead of rising."""
    _, paths = secret_task
    folder = tmp_path / "wrong"
    folder.mkdir()
    (folder / "secret_tool.py").write_text(WRONG_TOOL)
    tools = folder / "tools.yaml"
    tools.write_text(paths["tools"].read_text())
    records = train(secret_task, tmp_path / "run", base_overrides, read_metrics, tools=tools)
    _, score_after = ends(records, "critic/score/mean")
    _, calls_after = ends(records, "agent/tool_call_rate")
    assert score_after < 0.25, score_after
    assert calls_after < 0.45, calls_after
