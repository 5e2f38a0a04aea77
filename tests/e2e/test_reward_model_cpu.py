"""A GRPO run on CPU scored by a learned reward model (a tiny Qwen2 sequence classifier
built here) on the two Ray workers beside the actor. The rows' data source has no rule
function, so a run that fell back to the rules would fail at start; the logged scores
are the model's (continuous, acc 0), not a rule's. With the rollout on a worker of its
own (one step off, fully asynchronous) the reward model stays on the training worker and
scores a batch while the rollout generates the next (one step off: the scoring of every
step but the last is timed as overlapped). With a pool of its own
(reward_model.enable_resource_pool) it scores on a worker process of its own."""

import json

import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.slow

SOURCE = "prefs/chat"  # no rule function knows it
# one training worker (the actor and the reward model) and one rollout worker
SEPARATE = [
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.placement=separate",
    "actor_rollout_ref.rollout.separate_nnodes=1",
    "actor_rollout_ref.rollout.separate_n_gpus_per_node=1",
]

# one training worker (the actor, rollout colocated) and one reward model worker
OWN_POOL = [
    "trainer.n_gpus_per_node=1",
    "reward_model.enable_resource_pool=true",
    "reward_model.nnodes=1",
    "reward_model.n_gpus_per_node=1",
]


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param([], id="sync"),
        pytest.param(OWN_POOL, id="own_pool"),
        pytest.param([*SEPARATE, "async_training.mode=one_step_off"], id="one_step_off"),
        pytest.param([*SEPARATE, "async_training.mode=fully_async"], id="fully_async"),
    ],
)
def test_grpo_scored_by_the_reward_model(
    mode, tiny_model_dir, synthetic_data, tmp_path, run_engine
):
    from engine.models.tiny import build_tiny_reward_model

    rm_dir = build_tiny_reward_model(tmp_path / "rm", seed=1)
    train, _ = synthetic_data
    table = pq.read_table(train)
    rows = table.to_pylist()[:64]
    for row in rows:
        row["data_source"] = SOURCE
    prefs = tmp_path / "prefs.parquet"
    pq.write_table(type(table).from_pylist(rows), prefs)
    generations = tmp_path / "generations"
    run = run_engine(
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={prefs}",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        f"trainer.rollout_data_dir={generations}",
        "trainer.logger=[]",
        "reward_model.enable=true",
        f"reward_model.model.path={rm_dir}",
        "reward_model.micro_batch_size_per_gpu=3",  # 8 or 16 (own pool: 16) rows a rank
        *mode,
    )
    records = run.records
    assert [r["step"] for r in records] == [1, 2]
    scores = [
        json.loads(line)["score"]
        for step in (1, 2)
        for line in (generations / f"{step}.jsonl").read_text().splitlines()
    ]
    assert len(scores) == 32
    # a random score head's values: spread out, none of them a rule's round number
    assert max(scores) - min(scores) > 0.1
    assert not any(s in (0.0, 0.25, 0.5, 1.0) for s in scores)
    for record in records:
        assert record["critic/acc/mean"] == 0.0  # the model checks no ground truth
        assert record["critic/score/max"] > record["critic/score/min"]
        assert record["timing_s/reward"] > 0
    # one step off, the next batch was generating while this one was scored (none is
    # started after the last step); no other mode overlaps the two this way
    overlapped = [r.get("timing_s/reward_overlapped") for r in records]
    if "async_training.mode=one_step_off" in mode:
        assert overlapped[0] is not None, "step 1's batch was scored before step 2's started"
        assert 0 < overlapped[0] <= records[0]["timing_s/reward"]
        assert overlapped[1] is None
    else:
        assert overlapped == [None, None]
    workers = json.loads((tmp_path / "run" / "workers.json").read_text())
    if mode is OWN_POOL:  # the rm role's one rank, in a process other than the actor's
        assert [w.get("group", "") for w in workers] == ["", "rm"]
        assert workers[0]["pid"] != workers[1]["pid"]
    else:
        assert all(w.get("group", "") != "rm" for w in workers)
