"""The planner with the rollout on devices of its own (rollout.placement=separate,
async_training.mode=one_step_off): the split chosen and explained on hand-computed cases,
a pinned split honoured, infeasible pins refused naming the key and the fix, and the
nodes the job asks for (the plan's, and the launcher's request)."""

from __future__ import annotations

import json

import pytest

from engine.config import load_config
from rlctl import api
from rlctl.job.spec import nest
from rlctl.planner.model import job_nodes
from rlctl.planner.plan import InfeasiblePlanError, Plan, PlanRequest, RolloutSplit, make_plan

ARR = "actor_rollout_ref"
ONE_STEP_OFF = {"async_training.mode": "one_step_off"}


def split_keys(train: tuple[int, int], rollout: tuple[int, int]) -> dict:
    return {
        "trainer.nnodes": train[0],
        "trainer.n_gpus_per_node": train[1],
        f"{ARR}.rollout.separate_nnodes": rollout[0],
        f"{ARR}.rollout.separate_n_gpus_per_node": rollout[1],
    }


def request(model: str, accelerator: str | None, devices: int | None, keys: dict, **kw):
    """A PlanRequest as a recipe with these engine keys makes it (typed config, pinned)."""
    config = load_config(base=nest(keys), check=False)
    return PlanRequest(model, accelerator, devices, config=config, pinned=frozenset(keys), **kw)


# GRPO on Qwen2.5-7B-Instruct, GSM8K lengths, with the KL loss's reference policy.
GRPO_7B = dict(
    train_batch_size=1024,
    rollout_n=6,
    max_prompt_length=512,
    max_response_length=1024,
    ppo_mini_batch_size=256,
    algorithm_needs_reference=True,
)
# The planner's FLOPs model, by hand: 1024 × 6 samples × 1536 tokens = 9 437 184 tokens
# × 7 615 616 512 parameters; at 40 % of the H100's 989 TFLOPS (395.6 TFLOP/s):
TOKENS_PARAMS = 1024 * 6 * 1536 * 7_615_616_512
RATE = 989e12 * 0.4
GEN_1 = TOKENS_PARAMS * 2 * 2.0 / RATE  # generate: 2 FLOPs × GENERATION_TIME_FACTOR 2
TRAIN_1 = TOKENS_PARAMS * 12 / RATE  # old log-probs 2 + update 8 (+ recompute) + reference 2


def lines_with(plan: Plan, start: str) -> list[str]:
    return [line for line in plan.reasoning if line.startswith(start)]


def engine_config(plan: Plan, **extra):
    values = {
        f"{ARR}.model.path": "some/model",
        "data.train_files": "train.parquet",
        "algorithm.adv_estimator": "grpo",
        f"{ARR}.actor.use_kl_loss": plan.use_reference,
        **plan.engine_overrides(),
        **extra,
    }
    return load_config([f"{k}={json.dumps(v) if isinstance(v, bool) else v}"
                        for k, v in values.items()])  # fmt: skip


# ---------------------------------------------------------------------------
# the split chosen and explained


def test_one_step_off_on_8_h100_splits_6_train_2_generate():
    # GEN_1 = 726.7 s and TRAIN_1 = 3 × GEN_1 = 2180.1 s on one device. On 8 devices of
    # one node, the candidates t train + r generate (t + r = 8), step = max(GEN_1 / r,
    # TRAIN_1 / t):
    #   7 + 1: 256 × 6 = 1536 samples a mini-batch do not split over 7 devices
    #   6 + 2: max(GEN_1 / 2, 3 GEN_1 / 6) = GEN_1 / 2 = 363.3 s   (exactly balanced)
    #   5 + 3: 1536 / 5 no
    #   4 + 4: max(GEN_1 / 4, 3 GEN_1 / 4) = 0.75 GEN_1 = 545.0 s
    #   3 + 5: the batch's 6144 samples do not split over 5 generating devices
    #   2 + 6: actor + reference sharded over 2 devices: weights (4 + 4) B / 2 = 4 B/param,
    #          gradients 2 B, Adam 4 B: 10 B × 7.6 B = 71.0 GiB, + the optimizer step's
    #          temporaries 8 B / 2 = 4 B/param (measured) = 28.4 GiB: 99.3 GiB > the 72.6
    #          GiB budget (its forward, + 6.2 GiB gathered + 3.2 GiB of activations, is less)
    #   1 + 7: more still
    assert pytest.approx(726.7, abs=0.05) == GEN_1 and pytest.approx(3 * GEN_1) == TRAIN_1
    plan = make_plan(request("Qwen/Qwen2.5-7B-Instruct", "H100", 8, ONE_STEP_OFF, **GRPO_7B))
    assert plan.split == RolloutSplit(
        mode="one_step_off",
        train_nodes=1,
        train_devices_per_node=6,
        rollout_nodes=1,
        rollout_devices_per_node=2,
        node_size=8,
        generate_seconds=round(GEN_1 / 2, 1),
        train_seconds=round(TRAIN_1 / 6, 1),
    )
    assert plan.estimated_step_seconds == round(GEN_1 / 2, 1)
    # 6 + 2 ≤ 8 devices per node: both groups on the one node the job asks for
    assert (plan.nodes, plan.devices_per_node) == (1, 8)
    # the rollout's devices hold no training state: the whole budget is its pool,
    # ⌊72.6 / 80⌋ to 0.05 = 0.90 (the cap), 72 GiB
    assert plan.rollout_memory_fraction == 0.9
    assert plan.memory.rollout_resident_gib == 0.0
    assert plan.memory.rollout_pool_gib == pytest.approx(72.0)
    assert plan.memory.fits()
    # training over 6 devices: 256 × 6 / 6 = 256 samples per device a mini-batch
    assert "→ 256 per device" in lines_with(plan, "batch:")[0]
    (split,) = lines_with(plan, "split:")
    assert split.startswith("split: 6 train + 2 generate on 8 × H100 on 1 node — the split with")
    assert "max(generate 6 min on 2, train 6 min on 6) = 6 min" in split
    assert "4 + 4: max(3 min, 9 min) = 9 min" in split
    assert "7 + 1: training: the pinned ppo_mini_batch_size 256 × rollout.n 6" in split
    assert "3 + 5: rollout: the 6144 samples of a batch" in split
    assert "2 + 6: training: training one 1536-token sample needs 99.3 GiB" in split
    assert "; the optimizer step 28.4 GiB more) > budget 72.6 GiB" in split
    (nodes,) = lines_with(plan, "nodes:")
    assert "6 + 2 ≤ 8 devices per node, so the groups share nodes" in nodes
    assert lines_with(plan, "placement: the rollout on devices of its own")
    assert lines_with(plan, "weights: the actor's first rank sends the bf16 weights")
    assert lines_with(plan, "rollout (vllm, on its own 2 devices): no training state")
    overrides = plan.engine_overrides()
    assert {k: overrides[k] for k in split_keys((0, 0), (0, 0))} == split_keys((1, 6), (1, 2))
    assert overrides[f"{ARR}.rollout.placement"] == "separate"
    assert overrides["async_training.mode"] == "one_step_off"
    cfg = engine_config(plan)  # the engine's own rules accept it
    assert cfg.world_size == 6
    assert (plan.nodes, plan.devices_per_node) == job_nodes(1, 6, 1, 2, 8)
    data = json.loads(json.dumps(plan.to_json()))
    assert Plan.from_json(data) == plan
    assert data["split"]["rollout_devices_per_node"] == 2


def test_auto_sizing_takes_the_smallest_node_share_that_fits():
    # Auto: the floor is (GEN_1 + TRAIN_1) / 30 min = 2906.8 / 1800 → 2 devices. 1 + 1
    # cannot train 7B on one device; on 4: 2 + 2 needs 79.6 GiB per device (as above), and
    # 3 + 1 fits, max(GEN_1 / 1, 3 GEN_1 / 3) = GEN_1 = 726.7 s: balanced.
    plan = make_plan(request("Qwen/Qwen2.5-7B-Instruct", "H100", None, ONE_STEP_OFF, **GRPO_7B))
    sp = plan.split
    assert (sp.train_devices, sp.rollout_devices) == (3, 1)
    assert (plan.nodes, plan.devices_per_node) == (1, 4)
    assert sp.generate_seconds == sp.train_seconds == round(GEN_1, 1)
    assert "a step under 30 min needs ≥ 2 devices in all" in lines_with(plan, "step-time")[0]


def test_sync_with_separate_placement_adds_the_two_phases():
    # placement=separate, mode sync: a step is generation + training, one after the
    # other. 6 + 2: GEN_1 / 2 + 3 GEN_1 / 6 = GEN_1; 4 + 4: GEN_1 / 4 + 3 GEN_1 / 4 =
    # GEN_1: a tie, and the fewer rollout devices win.
    keys = {f"{ARR}.rollout.placement": "separate"}
    plan = make_plan(request("Qwen/Qwen2.5-7B-Instruct", "H100", 8, keys, **GRPO_7B))
    assert plan.split.mode == "sync"
    assert (plan.split.train_devices, plan.split.rollout_devices) == (6, 2)
    assert plan.estimated_step_seconds == pytest.approx(GEN_1, abs=0.1)
    (split,) = lines_with(plan, "split:")
    assert "sum(generate 6 min on 2, train 6 min on 6) = 12 min" in split
    assert "4 + 4: sum(3 min, 9 min) = 12 min (a tie: the fewer rollout devices win)" in split
    assert engine_config(plan).async_training.mode == "sync"


def test_two_nodes_whole_nodes_each_when_the_batch_allows_no_share():
    # DAPO-like: 512 × 16, mini 32: a mini-batch of 512 samples splits over 16, 8, 4, 2
    # training devices only. On 2 nodes of 8: 7 + 1 .. 5 + 3 on each node leave 14, 12,
    # 10 training devices (no); 4 + 4 on each node and 1 node + 1 node both give 8 + 8,
    # max(G / 8, T / 8): a tie, and the training group on fewer nodes (one whole node)
    # wins. 8 + 8 > 8 devices per node: each group its own node, 1 + 1 = 2 nodes.
    req = request(
        "Qwen/Qwen2.5-7B", "H100", 16, ONE_STEP_OFF, train_batch_size=512, rollout_n=16,
        max_prompt_length=2048, max_response_length=4096, ppo_mini_batch_size=32,
    )  # fmt: skip
    plan = make_plan(req)
    assert plan.split.to_json() | {"generate_seconds": 0, "train_seconds": 0} == {
        "mode": "one_step_off", "train_nodes": 1, "train_devices_per_node": 8,
        "rollout_nodes": 1, "rollout_devices_per_node": 8, "node_size": 8,
        "generate_seconds": 0, "train_seconds": 0,
    }  # fmt: skip
    assert (plan.nodes, plan.devices_per_node) == (2, 8)
    (split,) = lines_with(plan, "split:")
    assert "4 + 4 on each of 2 nodes: max(" in split
    assert "(a tie: the training group on fewer nodes wins)" in split
    (nodes,) = lines_with(plan, "nodes:")
    assert "8 + 8 > 8 devices per node, so each group takes nodes of its own: 1 + 1 = 2" in nodes


# ---------------------------------------------------------------------------
# pinned splits


def test_a_pinned_split_is_honoured():
    # 4 + 4, pinned: max(GEN_1 / 4, TRAIN_1 / 4) = 3 GEN_1 / 4 = 545.0 s, training-bound
    keys = {**ONE_STEP_OFF, **split_keys((1, 4), (1, 4))}
    plan = make_plan(request("Qwen/Qwen2.5-7B-Instruct", "H100", 8, keys, **GRPO_7B))
    assert (plan.split.train_devices, plan.split.rollout_devices) == (4, 4)
    assert plan.estimated_step_seconds == round(0.75 * GEN_1, 1)
    (split,) = lines_with(plan, "split:")
    assert "4 train + 4 generate on 8 × H100 on 1 node — pinned by the recipe" in split
    assert engine_config(plan).world_size == 4


def test_a_pinned_rollout_size_leaves_the_rest_to_training():
    # only the rollout's devices per node pinned (8) on 2 nodes: the candidates that keep
    # it are 1 node + 1 node only
    keys = {**ONE_STEP_OFF, f"{ARR}.rollout.separate_n_gpus_per_node": 8}
    plan = make_plan(request("Qwen/Qwen2.5-7B-Instruct", "H100", 16, keys, **GRPO_7B))
    assert (plan.split.train_nodes, plan.split.train_devices_per_node) == (1, 8)
    assert (plan.nodes, plan.devices_per_node) == (2, 8)
    assert (
        "keeps the pinned actor_rollout_ref.rollout.separate_n_gpus_per_node 8"
        in (lines_with(plan, "split:")[0])
    )


def test_a_pinned_split_larger_than_the_hardware_is_refused_with_the_fix():
    # 6 + 4 > 8 devices per node: the groups cannot share the node, so they need 2 nodes
    keys = {**ONE_STEP_OFF, **split_keys((1, 6), (1, 4))}
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(request("Qwen/Qwen2.5-7B-Instruct", "H100", 8, keys, **GRPO_7B))
    message, hint = str(info.value), info.value.hint
    assert "actor_rollout_ref.rollout.separate_n_gpus_per_node" in message
    assert "needs 2 nodes (6 + 4 > 8 devices per node" in message
    assert "the recipe's hardware is 8 × H100 on 1 node" in message
    assert hint.startswith(
        "set actor_rollout_ref.rollout.separate_n_gpus_per_node 2 (6 + 2 = 8: the groups"
        " then share each node)"
    )
    assert "hardware.nodes: 2" in hint


def test_a_pinned_split_whose_rollout_holds_no_replica_is_refused():
    # Qwen2.5-32B on 7 + 1: one rollout device at TP 1 holds bf16 weights 2 × 32.76 B =
    # 61.0 GiB + 2 GiB overhead + KV for 16 sequences of 3072 tokens at 256 KiB a token
    # (2 × 64 layers × 8 KV heads × 128 × 2 B) = 12 GiB: 75 GiB > the 72 GiB pool.
    keys = {**ONE_STEP_OFF, **split_keys((1, 7), (1, 1))}
    req = request(
        "Qwen/Qwen2.5-32B", "H100", 8, keys, train_batch_size=128, rollout_n=7,
        max_prompt_length=1024, max_response_length=2048,
    )  # fmt: skip
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(req)
    message = str(info.value)
    assert "does not fit on the pinned split, training 1 node × 7 + rollout 1 node × 1" in message
    assert "rollout: bf16 weights (61.0 GiB) and KV for 16 sequences of 3072 tokens" in message
    assert info.value.hint.startswith(
        "unpin trainer.nnodes, trainer.n_gpus_per_node, actor_rollout_ref.rollout."
        "separate_nnodes, actor_rollout_ref.rollout.separate_n_gpus_per_node and let the"
        " planner split (fits as training 1 node × 4 + rollout 1 node × 4)"
    )


def test_a_pinned_split_that_breaks_the_batch_rule_is_refused():
    # 1024 × 8: every mini-batch is a power of two of samples, never a multiple of 6
    keys = {**ONE_STEP_OFF, **split_keys((1, 6), (1, 2))}
    req = request("Qwen/Qwen2.5-7B-Instruct", "H100", 8, keys, **(GRPO_7B | {"rollout_n": 8}))
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(req)
    assert "the pinned ppo_mini_batch_size 256 × rollout.n 8 = 2048 samples do not split" in str(
        info.value
    )
    assert "(fits as training 1 node × 4 + rollout 1 node × 4)" in info.value.hint


@pytest.mark.parametrize(
    ("keys", "match"),
    [
        (
            {**ONE_STEP_OFF, f"{ARR}.rollout.placement": "colocate"},
            "needs the rollout on devices of its own, but the recipe pins"
            " actor_rollout_ref.rollout.placement=colocate",
        ),
        ({"async_training.mode": "two_steps_off"}, "async_training.mode: unknown mode"),
        (
            {**ONE_STEP_OFF, f"{ARR}.rollout.separate_nnodes": 0},
            "actor_rollout_ref.rollout.separate_nnodes must be a positive integer",
        ),
        (
            {**ONE_STEP_OFF, f"{ARR}.rollout.separate_n_gpus_per_node": 9},
            "no split of 8 × H100 on 1 node .* keeps the pinned"
            " actor_rollout_ref.rollout.separate_n_gpus_per_node 9",
        ),
        (
            {**ONE_STEP_OFF, **split_keys((1, 6), (1, 12))},
            "actor_rollout_ref.rollout.separate_n_gpus_per_node 12 is more than the 8 devices",
        ),
    ],
)
def test_contradictory_pins_are_refused_naming_the_key(keys, match):
    with pytest.raises(InfeasiblePlanError, match=match):
        make_plan(request("Qwen/Qwen2.5-7B-Instruct", "H100", 8, keys, **GRPO_7B))


def test_one_device_cannot_be_split():
    with pytest.raises(InfeasiblePlanError, match="1 × H100 on 1 node cannot be split") as info:
        make_plan(request("Qwen/Qwen2.5-0.5B-Instruct", "H100", 1, ONE_STEP_OFF))
    assert "at least 2 devices" in info.value.hint


# ---------------------------------------------------------------------------
# nodes


@pytest.mark.parametrize(
    ("train", "rollout", "job"),
    [
        ((1, 6), (1, 2), (1, 8)),  # 6 + 2 ≤ 8: one node shared
        ((2, 6), (2, 2), (2, 8)),  # shared on both nodes: max(2, 2)
        ((2, 6), (1, 2), (2, 8)),  # max(2, 1); the second node's rollout slots idle
        ((1, 4), (1, 2), (1, 6)),  # 4 + 2 ≤ 8: one node, 6 of its devices
        ((1, 8), (1, 8), (2, 8)),  # 8 + 8 > 8: nodes of their own, 1 + 1
        ((2, 8), (1, 4), (3, 8)),  # 8 + 4 > 8: 2 + 1 nodes, 8 per node asked
    ],
)
def test_job_nodes_count_both_groups(train, rollout, job):
    assert job_nodes(*train, *rollout, 8) == job


RECIPE = """\
name: async-split
algorithm: grpo
model: Qwen/Qwen2.5-7B-Instruct
data: {{prepare: gsm8k}}
hardware: {{accelerators: "H100:8", nodes: {nodes}}}
engine:
  async_training.mode: one_step_off
  data.train_batch_size: 512
  data.max_prompt_length: 2048
  data.max_response_length: 4096
  actor_rollout_ref.rollout.n: 16
  actor_rollout_ref.actor.ppo_mini_batch_size: 32
{extra}"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / ".rlctl"))
    return tmp_path


@pytest.mark.parametrize(
    ("nodes", "extra", "want"),
    [
        (2, "", (2, 8, (1, 8), (1, 8))),  # whole nodes each: 1 + 1 = 2 nodes × 8
        (1, "", (1, 8, (1, 4), (1, 4))),  # 4 + 4 share the one node
        # pinned 2 nodes × 4 each, sharing both nodes: max(2, 2) = 2 nodes × 8
        (2, "".join(f"  {k}: {v}\n" for k, v in split_keys((2, 4), (2, 4)).items()),
         (2, 8, (2, 4), (2, 4))),
    ],
)  # fmt: skip
def test_the_launchers_request_counts_both_groups(home, nodes, extra, want):
    recipe_file = home / "async.yaml"
    recipe_file.write_text(RECIPE.format(nodes=nodes, extra=extra))
    recipe = api.load_recipe(recipe_file)
    job_nodes_, per_node, train, rollout = want
    slurm = api.prepare(recipe, "slurm", job_id="split")
    assert (slurm.spec.layout.nodes, slurm.spec.layout.devices_per_node) == (job_nodes_, per_node)
    assert (slurm.plan.nodes, slurm.plan.devices_per_node) == (job_nodes_, per_node)
    sbatch = slurm.files["job.sbatch"]
    assert f"#SBATCH --nodes={job_nodes_}\n" in sbatch
    assert f"#SBATCH --gres=gpu:h100:{per_node}\n" in sbatch
    engine_yaml = slurm.files["engine.yaml"]
    assert (
        f"nnodes: {train[0]}\n" in engine_yaml and f"n_gpus_per_node: {train[1]}\n" in engine_yaml
    )
    assert f"separate_nnodes: {rollout[0]}\n" in engine_yaml
    assert f"separate_n_gpus_per_node: {rollout[1]}\n" in engine_yaml
    sky = api.prepare(recipe, "skypilot", job_id="split", cloud="gcp")
    task = sky.files["task.yaml"]
    assert f"num_nodes: {job_nodes_}\n" in task and f"accelerators: H100:{per_node}" in task


# ---------------------------------------------------------------------------
# colocated plans and the CPU quickstart


def test_colocated_plans_have_no_split():
    plan = make_plan(PlanRequest("Qwen/Qwen2.5-7B-Instruct", "H100", 8, **GRPO_7B))
    assert plan.split is None and "split" not in plan.to_json()
    assert f"{ARR}.rollout.placement" not in plan.engine_overrides()
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_cpu_one_step_off_gives_the_rollout_one_worker():
    # cpu:2 on one node: 1 trains, 1 generates (the fewest for the rollout); one node
    plan = make_plan(
        request("rlctl:tiny", None, 2, ONE_STEP_OFF, max_devices_per_node=2,
                train_batch_size=8, rollout_n=2, rollout_backend="hf")
    )  # fmt: skip
    assert (plan.nodes, plan.devices_per_node) == (1, 2)
    assert (plan.split.train_devices, plan.split.rollout_devices) == (1, 1)
    cfg = engine_config(plan, **{f"{ARR}.model.path": "some/model"})
    assert cfg.world_size == 1 and cfg.actor_rollout_ref.rollout.separate_n_gpus_per_node == 1
    assert lines_with(plan, "split: 1 train + 1 generate (1 + 1) — the fewest for the rollout")


def test_fully_async_is_split_and_explained_as_an_overlap():
    """fully_async overlaps like one step off: the same split, its own explanation, and
    its mode written for the engine (whose rules accept the plan)."""
    mode = {"async_training.mode": "fully_async"}
    plan = make_plan(request("Qwen/Qwen2.5-7B-Instruct", "H100", 8, mode, **GRPO_7B))
    assert (plan.split.mode, plan.split.train_devices_per_node) == ("fully_async", 6)
    assert plan.estimated_step_seconds == round(GEN_1 / 2, 1)  # max, not the sum
    (placement,) = lines_with(plan, "placement: the rollout on devices of its own")
    assert "the rollout generates without stopping while the actor trains" in placement
    assert plan.engine_overrides()["async_training.mode"] == "fully_async"
    assert engine_config(plan).async_training.mode == "fully_async"
