"""Recipes: loading, extends, every kind of bad field, engine keys, and safe rendering."""

import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml

from rlctl.api import plan_recipe
from rlctl.job.render import render
from rlctl.job.spec import JobPaths, Layout, build_spec
from rlctl.recipe.load import RecipeError, load_recipe, parse_recipe

GOOD = {
    "name": "demo",
    "algorithm": "grpo",
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "data": {"prepare": "gsm8k"},
    "hardware": {"accelerators": "H100:8", "nodes": 1},
}


def problems(**changes) -> str:
    raw = {**GOOD, **changes}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(RecipeError) as info:
        parse_recipe(raw, source="r.yaml")
    return str(info.value)


def test_a_good_recipe_and_its_engine_keys():
    recipe = parse_recipe(GOOD)
    keys = recipe.engine_overrides()
    assert keys["algorithm.adv_estimator"] == "grpo"  # from the preset
    assert keys["actor_rollout_ref.actor.use_kl_loss"] is True
    assert keys["actor_rollout_ref.rollout.name"] == "vllm"
    assert keys["trainer.experiment_name"] == "demo"


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"modle": "x"}, "modle: unknown field; did you mean 'model'?"),
        ({"name": None}, "name: required"),
        ({"model": None}, "model: required"),
        ({"data": None}, "data: required"),
        ({"name": "bad name!"}, "name: 'bad name!' is not a name"),
        ({"algorithm": "grpoo"}, "algorithm: unknown value 'grpoo' (did you mean 'grpo'?)"),
        ({"rollout": "sglng"}, "rollout: unknown value 'sglng' (did you mean 'sglang'?)"),
        ({"hardware": {"accelerators": "H10:8"}}, "Did you mean H100?"),
        ({"hardware": {"accelerators": "H100:0"}}, "hardware.accelerators"),
        ({"hardware": {"accelerators": "A100:8"}}, "A100-80GB"),
        ({"hardware": {"nodes": 0}}, "hardware.nodes: expected a positive integer"),
        ({"hardware": {"gpus": 8}}, "hardware.gpus: unknown field"),
        ({"data": {"prepare": "gsm9k"}}, "data.prepare: unknown preparation 'gsm9k'"),
        ({"data": {"prepare": "gsm8k", "train": "a.parquet"}}, "do not also give train/val"),
        ({"data": {"train": 3}}, "data.train: expected a path or a list of paths"),
        (
            {"env": {"HF_TOKEN": "hf_abc"}},
            "env.HF_TOKEN: looks like a secret; list it under secrets",
        ),
        ({"env": {"1BAD": "x"}}, "env.1BAD: not a valid environment variable name"),
        ({"secrets": ["hf_abcdef123 value"]}, "list names, not values"),
        ({"reward": {"custom": "file.py"}}, "reward.custom: expected {path: file.py"),
        ({"hardware": {"accelerators": "cpu:2"}, "rollout": "vllm"}, "use rollout: hf"),
    ],
)
def test_bad_fields_name_the_path_the_value_and_the_fix(changes, expected):
    assert expected in problems(**changes)


def test_all_problems_at_once():
    message = problems(modle="x", algorithm="nope", rollout="nope")
    assert "3 problems" in message


def test_cpu_recipes_default_to_the_hf_rollout():
    recipe = parse_recipe({**GOOD, "hardware": {"accelerators": "cpu:2"}})
    assert recipe.rollout == "hf" and recipe.hardware.cpu_workers == 2
    assert recipe.engine_overrides()["trainer.device"] == "cpu"


def test_engine_block_nested_or_dotted():
    dotted = parse_recipe({**GOOD, "engine": {"data.train_batch_size": 64}})
    nested = parse_recipe({**GOOD, "engine": {"data": {"train_batch_size": 64}}})
    assert dotted.engine == nested.engine == {"data.train_batch_size": 64}


def test_dapo_overlong_buffer_defaults_to_a_fifth_of_the_budget():
    recipe = parse_recipe(
        {**GOOD, "algorithm": "dapo", "engine": {"data.max_response_length": 1000}}
    )
    assert recipe.engine_overrides()["reward_model.overlong_buffer.len"] == 200
    pinned = parse_recipe(
        {**GOOD, "algorithm": "dapo", "engine": {"reward_model.overlong_buffer.len": 64}}
    )
    assert pinned.engine_overrides()["reward_model.overlong_buffer.len"] == 64


def test_extends_merges_mappings_and_the_child_wins(tmp_path):
    (tmp_path / "base.yaml").write_text(
        yaml.safe_dump(
            {**GOOD, "env": {"A": "1", "B": "2"}, "engine": {"data.train_batch_size": 64}}
        )
    )
    (tmp_path / "child.yaml").write_text(
        "extends: base.yaml\nname: child\nenv: {B: '3'}\nengine: {data.max_response_length: 256}\n"
    )
    recipe = load_recipe(tmp_path / "child.yaml")
    assert recipe.name == "child" and recipe.model == GOOD["model"]
    assert recipe.env == {"A": "1", "B": "3"}
    assert recipe.engine == {"data.train_batch_size": 64, "data.max_response_length": 256}


def test_extends_loops_and_missing_parents(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(RecipeError, match="loop"):
        load_recipe(tmp_path / "a.yaml")
    (tmp_path / "c.yaml").write_text("extends: nowhere.yaml\n")
    with pytest.raises(RecipeError, match=r"nowhere\.yaml' does not exist"):
        load_recipe(tmp_path / "c.yaml")


def test_engine_keys_are_checked_against_the_engine_schema():
    with pytest.raises(RecipeError) as info:  # refused as the recipe is read
        parse_recipe({**GOOD, "engine": {"data.train_batch_sise": 8}})
    assert "engine.data.train_batch_sise" in str(info.value)
    assert "did you mean 'data.train_batch_size'" in str(info.value)
    rules = parse_recipe(
        {
            **GOOD,
            "engine": {
                "data.train_batch_size": 256,
                "actor_rollout_ref.actor.ppo_mini_batch_size": 48,
            },
        }
    )
    with pytest.raises(RecipeError, match=r"must divide data\.train_batch_size 256"):
        # a plan made without the bad key (the planner would refuse it first): the
        # engine's own check still catches what the recipe's keys make
        build_spec(rules, plan_recipe(parse_recipe(GOOD)), JobPaths("/job"))


def test_spec_for_a_prepared_dataset_and_the_tiny_model():
    recipe = parse_recipe(
        {
            **GOOD,
            "model": "rlctl:tiny",
            "data": {"prepare": "synthetic"},
            "hardware": {"accelerators": "cpu:2"},
        }
    )
    spec = build_spec(recipe, plan_recipe(recipe), JobPaths("/jobs/j1"))
    assert spec.layout == Layout(
        nodes=1, devices_per_node=2, accelerator=None, accelerator_named=False, cpus_per_worker=1
    )
    assert spec.setup == (
        ("python", "-m", "engine.models.tiny", "/jobs/j1/model"),
        ("python", "-m", "engine.data.prepare", "synthetic", "--out", "/jobs/j1/data"),
    )
    engine = yaml.safe_load(spec.engine_yaml)
    assert engine["actor_rollout_ref"]["model"]["path"] == "/jobs/j1/model"
    assert engine["data"]["train_files"] == ["/jobs/j1/data/train.parquet"]
    assert engine["trainer"]["default_local_dir"] == "/jobs/j1/run"
    assert spec.engine_command == (
        "python",
        "-m",
        "engine.main",
        "--config",
        "/jobs/j1/engine.yaml",
    )


NASTY = [
    "$(touch {canary})",
    "`touch {canary}`",
    "x; touch {canary}",
    'it\'s "quoted"',
    "two\nlines && touch {canary}",
    "$HOME and ${{HOME}}",
]


@pytest.mark.parametrize("value", NASTY)
def test_rendered_scripts_pass_recipe_values_literally(value, tmp_path):
    """Values from a recipe land on shell lines quoted: run for real, nothing executes."""
    canary = tmp_path / "pwned"
    value = value.format(canary=canary)
    script = render(
        "local_job.sh.j2",
        job_id="j1",
        recipe_name=value,
        version="test",
        env={"RECIPE_VALUE": value},
        root=str(tmp_path),
        setup=[("printf", "%s\\n", value)],
        preflight=("printf", "%s\\n", value),
        engine_command=("bash", "-c", 'printf "%s\\n" "$RECIPE_VALUE"'),
    )
    (tmp_path / "run.sh").write_text(script)
    result = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert not canary.exists()
    # the pre-flight's and a setup step's argv word, and the env value, intact
    assert result.stdout == f"{value}\n{value}\n{value}\n"


def test_bundled_recipes_load():
    names = {load_recipe(p).name for p in Path("recipes").glob("*.yaml")}
    assert {
        "quickstart",
        "grpo-qwen05b-gsm8k",
        "ppo-qwen7b-gsm8k",
        "dapo-qwen32b",
        "grpo-qwen3-8b-mi300x",
        "grpo-qwen7b-ascend",
    } <= names


def test_to_yaml_round_trips_and_holds_no_secret_values(monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "sk-very-secret")
    recipe = load_recipe("recipes/dapo_qwen32b.yaml")
    text = recipe.to_yaml()
    assert "sk-very-secret" not in text and "WANDB_API_KEY" in text
    assert parse_recipe(yaml.safe_load(text), source=recipe.source) == recipe


def test_multiline_yaml_is_read_as_written(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            name: demo
            algorithm: grpo
            model: m
            data: {prepare: gsm8k}
            env:
              GREETING: "hello world"
            """
        )
    )
    assert load_recipe(path).env == {"GREETING": "hello world"}


def test_the_recipe_reference_is_generated_from_the_schema():
    from rlctl.recipe.docs import generate

    assert Path("docs/recipes.md").read_text() == generate(), (
        "docs/recipes.md is stale: run python -m rlctl.recipe.docs > docs/recipes.md"
    )


# ---------------------------------------------------------------------------
# what used to escape as a raw exception, or pass silently (issue 15)


def test_a_file_that_is_not_utf8_names_the_file_the_place_and_the_fix(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\nalgorithm: grpo\n".encode("latin-1"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value) == f"{path}: not UTF-8 text: byte 0xe9 at line 1, column 10"
    assert "UTF-8" in info.value.hint


def test_a_byte_order_mark_is_fine(tmp_path):
    path = tmp_path / "bom.yaml"
    path.write_bytes("\ufeff".encode() + yaml.safe_dump(GOOD).encode())
    assert load_recipe(path).name == "demo"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: a\nmodel: m\nname: b\n",
            "key 'name' appears twice in one mapping, at lines 1 and 3",
        ),
        (
            "name: a\nengine:\n  data.seed: 1\n  data.seed: 2\n",
            "key 'data.seed' appears twice in one mapping, at lines 3 and 4",
        ),
        (
            "name: a\nhardware: {nodes: 1, nodes: 2}\n",
            "key 'nodes' appears twice in one mapping, at line 2, columns 12 and 22",
        ),
    ],
)
def test_duplicate_keys_are_refused_naming_the_key_and_both_lines(tmp_path, text, expected):
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=expected) as info:
        load_recipe(path)
    assert str(path) in str(info.value) and "keep one" in info.value.hint


def test_aliases_and_deep_nesting_are_refused(tmp_path):
    path = tmp_path / "alias.yaml"
    path.write_text("name: &n a\ndescription: *n\n")
    with pytest.raises(RecipeError, match="line 2: alias \\*n"):
        load_recipe(path)
    path.write_text("name: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(RecipeError, match="nested too deeply"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        (
            {"data.train_batch_size": "thirty-two"},
            "engine.data.train_batch_size: expected a whole number, got 'thirty-two';"
            " give a whole number (the default is 1024)",
        ),
        ({"data.shuffle": "maybe"}, "engine.data.shuffle: expected true or false, got 'maybe'"),
        (
            {"trainer.logger": 5},
            "engine.trainer.logger: expected a name or a list of names, got 5",
        ),
        ({"data": 5}, "engine.data: a section of keys, not a value"),
        (
            {"data.seed": 1, "data": {"seed": 2}},
            "engine.data.seed: given twice (dotted and nested), as 1 and 2",
        ),
        ({"trainer.project_name": "${oc.env:HF_TOKEN}"}, "engine.trainer.project_name: '${oc"),
    ],
)
def test_engine_values_of_the_wrong_kind_name_the_key_the_value_and_the_fix(engine, expected):
    assert expected in problems(engine=engine)


def test_a_wrong_engine_type_through_validate_names_the_key(tmp_path):
    """What `rlctl validate` met as `ValueError: invalid literal for int()`."""
    from rlctl import api

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "engine": {"data.train_batch_size": "thirty-two"}}))
    with pytest.raises(RecipeError, match=r"engine\.data\.train_batch_size: expected a whole"):
        api.validate(str(path))


def test_resolvers_never_read_this_machine_into_the_job(monkeypatch):
    """`${oc.env:...}` would be resolved at launch and written into engine.yaml."""
    monkeypatch.setenv("SOME_SECRET", "s3cr3t")
    message = problems(model="${oc.env:SOME_SECRET}", data={"train": ["${oc.env:HOME}/a"]})
    assert "model: '${oc.env:SOME_SECRET}' uses an OmegaConf resolver" in message
    assert "data.train[0]:" in message
    # a plain reference to another key is not a resolver
    keys = parse_recipe({**GOOD, "engine": {"trainer.project_name": "${trainer.experiment_name}"}})
    assert keys.engine["trainer.project_name"] == "${trainer.experiment_name}"


def test_an_interpolation_in_a_recipe_field_is_refused_naming_the_field():
    """Found by the thorough property run: `data.train: ${nope}` passed the loader and
    failed in the engine config as `config: Interpolation key 'nope' not found`."""
    message = problems(data={"train": ["${nope}"]}, checkpoints="${trainer.default_local_dir}")
    assert "data.train[0]: '${nope}' is an OmegaConf interpolation" in message
    assert "checkpoints: '${trainer.default_local_dir}' is an OmegaConf interpolation" in message
    assert "uses an OmegaConf resolver" not in message


@pytest.mark.parametrize(
    ("hardware", "expected"),
    [
        ({"nodes": True}, "hardware.nodes: expected a positive integer or auto, got True"),
        ({"accelerators": "cpu:²"}, "cpu:N takes N >= 1 workers"),
        ({"accelerators": "H100:-8"}, "the count must be at least 1, got -8"),
    ],
)
def test_hardware_values_that_used_to_slip_through(hardware, expected):
    assert expected in problems(hardware=hardware)
