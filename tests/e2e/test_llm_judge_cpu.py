"""A GRPO run on CPU scored by an LLM judge (reward_model.style=generative) beside the
rule functions: half the rows' data source is the judge's and has no rule function (a
run that fell back to the rules would fail at start), the other half keeps the synthetic
task's rule. The judge is a tiny causal LM built here that answers every prompt with
"Score: 7" under greedy decoding, so every judged sample must score exactly 0.7, a value
the synthetic rule never gives; the rule's rows must keep the rule's scores. The controller loads the judge's tokenizer
once."""

import json

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

JUDGED = "prefs/judged"  # no rule function knows it

# one worker: its two vLLM engines (the rollout's and the judge's) start in one process,
# which is what a colocated judge does; a second worker would only double the start-up
VLLM = pytest.param(
    ["actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=1"],
    marks=pytest.mark.vllm,
    id="vllm",
)


# the rollout on a worker of its own, the judge beside the actor on the other
ONE_STEP_OFF = [
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.placement=separate",
    "actor_rollout_ref.rollout.separate_nnodes=1",
    "actor_rollout_ref.rollout.separate_n_gpus_per_node=1",
    "async_training.mode=one_step_off",
]


@pytest.mark.parametrize(
    "backend", [pytest.param([], id="hf"), pytest.param(ONE_STEP_OFF, id="hf_one_step_off"), VLLM]
)
def test_grpo_scored_by_the_judge_and_the_rule(
    backend, tiny_model_dir, synthetic_data, tmp_path, run_engine, monkeypatch
):
    from transformers import AutoTokenizer

    from engine.models.tiny import build_tiny_judge
    from engine.reward.synthetic import compute_score

    judge_dir = build_tiny_judge(tmp_path / "judge", verdict="Score: 7")
    train, _ = synthetic_data
    table = pq.read_table(train)
    rows = table.to_pylist()[:32]
    for i, row in enumerate(rows):
        if i % 2 == 0:
            row["data_source"] = JUDGED
    mixed = tmp_path / "mixed.parquet"
    pq.write_table(type(table).from_pylist(rows), mixed)
    generations = tmp_path / "generations"
    overrides = [
        *backend,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={mixed}",
        "data.shuffle=false",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        f"trainer.rollout_data_dir={generations}",
        "trainer.logger=[]",
        "reward_model.enable=true",
        "reward_model.style=generative",
        f"reward_model.model.path={judge_dir}",
        f"reward_model.data_sources=[{JUDGED}]",
        "reward_model.micro_batch_size_per_gpu=3",
        "reward_model.judge.max_prompt_length=256",
        "reward_model.judge.max_new_tokens=16",
    ]
    # the controller loads the judge's tokenizer once: the start's check of its chat
    # template hands it to the scoring (the workers load their own)
    loads = []
    load = AutoTokenizer.from_pretrained
    monkeypatch.setattr(
        AutoTokenizer,
        "from_pretrained",
        lambda path, *a, **kw: loads.append(str(path)) or load(path, *a, **kw),
    )
    records = run_engine(*overrides).records
    assert loads.count(str(judge_dir)) == 1
    assert [r["step"] for r in records] == [1, 2]
    samples = [
        json.loads(line)
        for step in (1, 2)
        for line in (generations / f"{step}.jsonl").read_text().splitlines()
    ]
    assert len(samples) == 32
    judged = [s for s in samples if s["index"] % 2 == 0]
    ruled = [s for s in samples if s["index"] % 2 == 1]
    assert judged and ruled
    assert all(s["score"] == pytest.approx(0.7) for s in judged)
    for s in ruled:  # the rule's own score of the response, never the judge's
        expected = compute_score(s["output"], s["gts"], {})
        expected = expected["score"] if isinstance(expected, dict) else expected
        assert s["score"] == pytest.approx(expected)
        assert s["score"] != pytest.approx(0.7)
    for record in records:
        assert record["reward_model/judge_unparsed"] == 0.0
        assert record["reward_model/judge_overlong"] == 0.0
        assert record["reward_model/judge_truncated"] == 0.0
        # "Score: 7" and EOS: the verdict's tokens, the same every time
        assert record["reward_model/judge_response_length/mean"] == pytest.approx(7.0)
