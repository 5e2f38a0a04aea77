"""The shipped tool task (engine.data.secret), learned on CPU through the whole engine:
the tiny model, warm-started to call the tool one time in five, is trained with GRPO and
multi-turn rollouts; it comes to call the tool and answer with what it said, on the HF
rollout and on a real vLLM. Two broken variants fail the same margin: a tool that answers
wrong (the answer needs the tool's result), and a mask that lets the losses train on the
tool's tokens (the model is pushed to write text it never sampled, and falls apart).

Measured on the 2-core machine (docs/agents.md has the figures): the score of a step goes
from about 0.3 to 0.6 or more in 16 steps; with the wrong tool it stays near chance; with
the mask dropped it falls to 0 within 7 steps."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

STEPS = 16
BROKEN = 10  # the broken variants: by then the healthy run has risen (and the mask-less fallen)
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


def train(
    secret_task, run_dir, base_overrides, read_metrics, *extra, tools=None, main=None, steps=STEPS
):
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
        f"trainer.total_training_steps={steps}",
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
        [sys.executable, *(main or ["-m", "engine.main"]), *overrides],
        capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    records = [r for r in read_metrics(run_dir) if "critic/score/mean" in r]
    assert [r["step"] for r in records] == list(range(1, steps + 1))
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
    records = train(
        secret_task, tmp_path / "run", base_overrides, read_metrics, tools=tools, steps=BROKEN
    )
    _, score_after = ends(records, "critic/score/mean")
    _, calls_after = ends(records, "agent/tool_call_rate")
    assert score_after < 0.25, score_after
    assert calls_after < 0.45, calls_after


# engine.main with the multi-turn mask dropped where the trainer builds its batch (the
# driver): every response token, the tool's included, counts in the losses.
MASK_DROPPED = """\
import runpy
import sys

import engine.trainer


def generate(self, *args, _original=engine.trainer.Trainer.generate, **kwargs):
    rollout = _original(self, *args, **kwargs)
    rollout.response_masks = None
    return rollout


engine.trainer.Trainer.generate = generate
if __name__ == "__main__":  # the reward workers spawn and import this file again
    sys.argv = ["engine.main", *sys.argv[1:]]
    runpy.run_module("engine.main", run_name="__main__")
"""


def test_training_on_the_tools_tokens_breaks_it(
    secret_task, tmp_path, base_overrides, read_metrics
):
    """The mask is what makes it work: with the tool's tokens in the losses the model is
    trained to write the tool's random answers itself, and the score falls instead of
    rising."""
    script = tmp_path / "mask_dropped.py"
    script.write_text(MASK_DROPPED)
    main = [str(script)]
    records = train(
        secret_task, tmp_path / "run", base_overrides, read_metrics, main=main, steps=BROKEN
    )
    score_before, score_after = ends(records, "critic/score/mean")
    assert score_after < 0.25, score_after
    assert score_after < score_before, (score_before, score_after)


REWARD_FROM_ANSWERS = """\
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    scores = extra_info["turn_scores"]  # the interaction's score of each answer, in order
    return {"score": float(len(scores)), "acc": float(bool(scores) and scores[-1] == 1.0)}
"""


def test_an_interaction_sends_wrong_answers_back_and_its_scores_reach_the_reward(
    secret_task, tmp_path, base_overrides, read_metrics
):
    """The built-in retry interaction checks each answer (the secret task's scorer) and
    sends a wrong one back; the reward function reads its scores (extra_info.turn_scores):
    here the reward is the number of answers scored.

    Only the first half of each batch has the interaction, and the data is not shuffled:
    the first worker's trajectories take up to 3 turns, the second's at most 2. The HF
    rollout on FSDP once hung there (a rank waiting in a collective for a turn its peer
    never took)."""
    import pyarrow.parquet as pq

    from engine.data.secret import DATA_SOURCE

    _, paths = secret_task
    rows = pq.read_table(paths["train"]).to_pylist()
    for i, row in enumerate(rows):
        if i % 16 < 8:  # the first worker's half of each batch of 16 prompts
            secret = row["reward_model"]["ground_truth"]
            row["extra_info"]["interaction_kwargs"] = {"name": "retry", "ground_truth": secret}
    train_file = tmp_path / "train.parquet"
    pq.write_table(pq.read_table(paths["train"]).from_pylist(rows), train_file)
    env = tmp_path / "env.yaml"
    env.write_text(
        f"interaction:\n  - name: retry\n    class_name: retry\n"
        f"    config: {{data_source: {DATA_SOURCE}}}\n"
    )
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD_FROM_ANSWERS)
    key = "actor_rollout_ref.rollout.multi_turn"
    records = train(
        secret_task,
        tmp_path / "run",
        base_overrides,
        read_metrics,
        f"data.train_files={train_file}",
        f"custom_reward_function.path={reward}",
        f"{key}.interaction_config_path={env}",
        f"{key}.max_assistant_turns=3",
        "data.shuffle=false",
        steps=2,
    )
    for r in records:
        # the warm model guesses 4 times in 5: most first answers are wrong, sent back
        assert r["agent/feedback_turns_mean"] > 0.1, r["agent/feedback_turns_mean"]
        assert r["agent/turns_max"] == 3.0
        # half the trajectories' answers were scored, at most one per turn
        assert 0.4 <= r["critic/score/mean"] <= r["agent/turns_mean"] <= 3.0


LOGGED_TOOL = """\
import os

from engine.data.secret import tool_answer


def secret(*, value):
    with open({log!r}, "a") as f:
        f.write(f"{{os.getpid()}}\\n")
    return tool_answer(str(value))
"""


@pytest.mark.vllm
def test_multi_turn_on_a_tensor_parallel_vllm_runs_each_call_once(
    secret_task, tmp_path, base_overrides, read_metrics, vllm_tp_alone
):
    """vLLM at TP 2 over the two CPU workers, one engine run SPMD: the group's first
    member runs every trajectory's loop and tools, the other steps the engine with it
    (no hang: their schedules stay the same); each call runs once, in one process, and
    the model copies the tool's answer as it does at TP 1."""
    _, paths = secret_task
    folder = tmp_path / "logged"
    folder.mkdir()
    log = tmp_path / "calls.log"
    (folder / "secret_tool.py").write_text(LOGGED_TOOL.format(log=str(log)))
    tools = folder / "tools.yaml"
    tools.write_text(paths["tools"].read_text())
    records = train(
        secret_task,
        tmp_path / "run",
        base_overrides,
        read_metrics,
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "data.val_files=[]",  # only the training steps' calls, which the metrics count
        tools=tools,
        steps=2,
    )
    calls = log.read_text().split()
    trajectories = 16 * 8  # data.train_batch_size × rollout.n
    counted = sum(round(r["agent/tool_calls_mean"] * trajectories) for r in records)
    assert len(calls) == counted > 0
    assert len(set(calls)) == 1  # the leader's process: not once per member
    score = sum(r["critic/score/mean"] for r in records) / len(records)
    assert score > 0.15, score  # chance is 0.1: the tool's answer reached the model
