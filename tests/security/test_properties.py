"""Property-based tests over what a person can write: any YAML value in any recipe field
and engine key, any size to the planner, payload text in every value that reaches a job's
scripts. Nothing may escape as a raw Python exception; every refusal is an ``RlctlError``
that names the field; every rendered shell line passes user values literally (the scripts
are run, in a scratch directory, and must create nothing and echo the values back).

Every run (CI's too) tries a few hundred examples in all, derandomized: the same examples
each run, so CI is reproducible. ``RLCTL_PROPERTIES_THOROUGH=1`` adds the thorough profile
(five times as many; 3.5 minutes of CI's 2 cores, so it is for hunting, not every run),
and ``RLCTL_PROPERTIES_RANDOM=1`` makes it random, to find new failures (each one found
becomes a named regression test beside the code it fixes)."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import config_keys
from rlctl import api
from rlctl.errors import RlctlError
from rlctl.recipe.load import FIELD_DOCS, load_recipe

REPO = Path(__file__).resolve().parents[2]
# (examples per property in the quick run, in the thorough one)
QUICK, THOROUGH = {"loader": 120, "pipeline": 60, "planner": 80, "shell": 12, "model": 40}, 5


def check(prop, strategy, examples: int, quick: bool) -> None:
    """Run ``prop`` over ``strategy``: derandomized unless the thorough profile is asked to
    be random (see the module's docstring)."""
    settings(
        max_examples=examples,
        deadline=None,
        derandomize=quick or not os.environ.get("RLCTL_PROPERTIES_RANDOM"),
        database=None,  # no .hypothesis/ folder in the tree
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )(given(strategy)(prop))()


def profiles(name: str):
    """The two profiles of one property, as parametrize values."""
    return pytest.mark.parametrize(
        ("examples", "quick"),
        [
            pytest.param(QUICK[name], True, id="quick"),
            pytest.param(
                QUICK[name] * THOROUGH,
                False,
                id="thorough",
                marks=[
                    pytest.mark.slow,
                    pytest.mark.skipif(
                        not os.environ.get("RLCTL_PROPERTIES_THOROUGH"),
                        reason="the thorough profile: RLCTL_PROPERTIES_THOROUGH=1 runs it",
                    ),
                ],
            ),
        ],
    )


@pytest.fixture(autouse=True)
def _private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


# ---------------------------------------------------------------------------
# values


PAYLOADS = (
    "$(touch PWNED)", "`touch PWNED`", "; touch PWNED", "&& touch PWNED #", "| touch PWNED",
    "'", '"', "\\", "\n", "line\ntouch PWNED", "--help", "-rf", "${oc.env:HOME}", "${nope}",
    "$HOME", "*", "~", "", " ", "é", "\u202e", "\t", "a'b\"c", "%s%n", "../../etc/passwd",
    "RLCTL_ENGINE_YAML_END",
)  # fmt: skip
TEXT = st.text(st.characters(blacklist_categories=("Cs",), max_codepoint=0x2FFF), max_size=24)
# NUL among them: no environment can hold it, the loader must refuse it
STRINGS = st.one_of(st.sampled_from(PAYLOADS), TEXT, st.sampled_from(PAYLOADS).flatmap(
    lambda p: TEXT.map(lambda t: t + p + t)
))  # fmt: skip
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-(10**40), 10**40),
    st.floats(allow_nan=True, allow_infinity=True), STRINGS,
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STRINGS, inner, max_size=3),
    max_leaves=6,
)

CPU_BASE = {
    "name": "prop",
    "algorithm": "grpo",
    "model": "rlctl:tiny",
    "data": {"prepare": "synthetic"},
    "hardware": {"accelerators": "cpu:2"},
    "rollout": "hf",
    "engine": {
        "data.train_batch_size": 8,
        "actor_rollout_ref.rollout.n": 4,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
    },
}
GPU_BASE = {
    "name": "prop-gpu",
    "algorithm": "dapo",
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "data": {"train": ["/data/train.parquet"]},
    "hardware": {"accelerators": "H100:8", "nodes": 1},
    "secrets": ["HF_TOKEN"],
}
RECIPE_FIELDS = (
    *FIELD_DOCS, "data.prepare", "data.train", "data.val", "reward.custom",
    "reward.custom.path", "reward.custom.name", "hardware.accelerators", "hardware.nodes",
    "env.SOME_SETTING",
)  # fmt: skip
FIELDS = st.sampled_from(RECIPE_FIELDS) | st.sampled_from(config_keys()).map(
    lambda k: f"engine.{k}"
)


def typed(kind) -> st.SearchStrategy:
    """Values of a schema type, edges included: what passes the loader and meets the rest."""
    import types
    import typing

    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        return st.one_of(*(st.none() if a is type(None) else typed(a) for a in args))
    if typing.get_origin(kind) is list:
        return st.lists(typed(args[0]) if args else SCALARS, max_size=3)
    return {
        bool: st.booleans(),
        int: st.integers(-2, 300) | st.integers(-(10**12), 10**12),
        float: st.floats(-2, 2) | st.floats(allow_nan=True, allow_infinity=True),
        str: STRINGS,
    }.get(kind, SCALARS)


def typed_engine_value() -> st.SearchStrategy:
    from engine.config import schema_leaf

    return st.sampled_from(config_keys()).flatmap(
        lambda k: st.tuples(st.just(f"engine.{k}"), typed(schema_leaf(k)[0]))
    )


def with_value(base: dict, field: str, value) -> dict:
    """``base`` with ``field`` (a dotted path; engine keys stay one dotted key) set."""
    raw = json.loads(json.dumps(base))
    if field.startswith("engine."):
        raw.setdefault("engine", {})[field.removeprefix("engine.")] = value
        return raw
    *parents, leaf = field.split(".")
    node = raw
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value
    return raw


# Recipe fields the planner and the engine speak of by the engine keys they become (the
# batch rules are worded as the engine words them).
ALIASES = {"hardware.nodes": "trainer.nnodes", "hardware.accelerators": "trainer.n_gpus_per_node"}


def names_field(field: str, error: RlctlError) -> bool:
    """The refusal names the field: the recipe path, the engine key, or (for an engine
    key) its last two parts or a distinctive last part, as the planner's reasons write
    them ("pinned gpu_memory_utilization 1.0 asks for ...")."""
    text = f"{error} {error.hint or ''}"
    if field in ALIASES and ALIASES[field] in text:
        return True
    key = field.removeprefix("engine.")
    top, leaf = field.split(".")[0], key.split(".")[-1]
    names = (field, key, ".".join(key.split(".")[-2:]), f"{top}:", f"{top}.")
    return any(name in text for name in names) or (len(leaf) >= 10 and leaf in text)


def write(raw: dict, directory: Path) -> Path | None:
    path = directory / "r.yaml"
    try:
        path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    except (yaml.YAMLError, UnicodeEncodeError):
        return None
    return path


# ---------------------------------------------------------------------------
# the recipe loader and everything after it


@profiles("loader")
def test_any_value_in_any_field_loads_or_is_refused_naming_the_field(examples, quick):
    def prop(base, field, value):
        with tempfile.TemporaryDirectory() as scratch:
            path = write(with_value(base, field, value), Path(scratch))
            if path is None:
                return
            try:
                load_recipe(path)
            except RlctlError as exc:
                assert names_field(field, exc), (field, value, str(exc))

    check(
        lambda args: prop(*args),
        st.tuples(st.sampled_from([CPU_BASE, GPU_BASE]), FIELDS, VALUES),
        examples,
        quick,
    )


@profiles("pipeline")
def test_a_loaded_recipe_plans_and_renders_for_every_backend_or_is_refused(examples, quick):
    """Past the loader: the plan, the engine config and each backend's render."""
    from rlctl.backends.skypilot import SkyPilotBackend
    from rlctl.backends.slurm import SlurmBackend, SlurmProfile

    def prop(args):
        base, field, value, backend = args
        with tempfile.TemporaryDirectory() as scratch:
            path = write(with_value(base, field, value), Path(scratch))
            if path is None:
                return
            try:
                recipe = load_recipe(path)
            except RlctlError:
                return  # the loader's property
            options = {
                "local": {},
                "slurm": {"profile": SlurmProfile(job_root=f"{scratch}/jobs")},
                "skypilot": {"cloud": "k8s"} if recipe.hardware.is_cpu else {},
            }[backend]
            try:
                prepared = api.prepare(recipe, backend, job_id="job-1", **options)
            except RlctlError as exc:
                assert names_field(field, exc), (field, value, str(exc))
                return
            assert prepared.files

    assert SkyPilotBackend and SlurmBackend  # imported here: the backends load lazily
    backends = st.sampled_from(["local", "slurm", "skypilot"])
    bases = st.sampled_from([CPU_BASE, GPU_BASE])
    values = st.tuples(FIELDS, VALUES) | typed_engine_value()  # half past the loader
    check(
        prop,
        st.tuples(bases, values, backends).map(lambda t: (t[0], *t[1], t[2])),
        examples,
        quick,
    )


# ---------------------------------------------------------------------------
# the planner, directly


@profiles("planner")
def test_the_planner_answers_any_sizes_with_a_plan_or_a_reason(examples, quick):
    import dataclasses

    from rlctl.planner.plan import PlanRequest, make_plan

    # plausible requests (powers of two divide each other: plans happen), then one field
    # of some of them set to anything
    usual = st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096])
    requests = st.builds(
        PlanRequest,
        model=st.sampled_from(["rlctl:tiny", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B"]),
        accelerator=st.sampled_from([None, "H100", "MI300X", "Ascend910B", "L4"]),
        num_devices=st.none() | usual,
        max_devices_per_node=st.sampled_from([1, 2, 4, 8]),
        algorithm_needs_critic=st.booleans(),
        rollout_backend=st.sampled_from(["vllm", "sglang", "hf"]),
        train_backend=st.sampled_from(["fsdp", "fsdp2", "megatron"]),
        train_batch_size=usual,
        rollout_n=st.sampled_from([1, 2, 4, 8, 16]),
        max_prompt_length=st.sampled_from([64, 512, 2048, 32768]),
        max_response_length=st.sampled_from([8, 512, 4096, 131072]),
        ppo_mini_batch_size=st.none() | usual,
        micro_batch_size_per_device=st.none() | usual,
    )
    ints = st.integers(-3, 300) | st.integers(-(10**30), 10**30)
    odd = {  # any value of the field's own type (a Python caller's types are checked)
        "int": ints, "int | None": st.none() | ints, "bool": st.booleans(),
        "str": STRINGS | st.sampled_from(["vllm", "megatron", "H100"]),
        "str | None": st.none() | STRINGS, "float": st.floats(allow_nan=True),
    }  # fmt: skip
    fields = [(f.name, odd[f.type]) for f in dataclasses.fields(PlanRequest) if f.type in odd]
    pinned = st.sampled_from([
        "trainer.nnodes", "trainer.n_gpus_per_node", "data.train_batch_size",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
        "actor_rollout_ref.actor.megatron.context_parallel_size",
        "actor_rollout_ref.actor.use_dynamic_bsz", "critic.enable",
    ])  # fmt: skip
    changed = st.one_of(
        st.sampled_from(fields).flatmap(lambda f: f[1].map(lambda v: {f[0]: v})),
        st.tuples(pinned, usual | ints | SCALARS).map(lambda t: _pinned({t[0]: t[1]})),
    )
    requests = st.tuples(requests, st.none() | changed).map(
        lambda t: dataclasses.replace(t[0], **(t[1] or {}))
    )

    def prop(request):
        try:
            plan = make_plan(request)
        except RlctlError as exc:
            assert str(exc).strip()
            return
        assert plan.engine_overrides()

    check(prop, requests, examples, quick)


def _pinned(keys: dict) -> dict | None:
    """A request's config and pinned keys for engine keys a recipe pins; None where the
    engine's schema refuses a value (the recipe loader's property, not the planner's)."""
    from engine.schema import ConfigError, load_config
    from rlctl.job.spec import nest

    try:
        return {"config": load_config(base=nest(keys), check=False), "pinned": frozenset(keys)}
    except ConfigError:
        return None


@profiles("model")
def test_a_models_config_json_with_any_values_sizes_or_is_refused(examples, quick):
    """A local model folder's config.json is user input too."""
    from rlctl.models import model_shape

    fields = st.fixed_dictionaries(
        {},
        optional={
            k: SCALARS
            for k in (
                "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                "num_key_value_heads", "intermediate_size", "tie_word_embeddings",
                "head_dim", "num_experts", "model_type",
            )
        },
    )  # fmt: skip

    def prop(config):
        with tempfile.TemporaryDirectory() as scratch:
            try:
                text = json.dumps(config, allow_nan=True)
            except ValueError:
                return
            (Path(scratch) / "config.json").write_text(text)
            try:
                model_shape(scratch)
            except RlctlError as exc:
                assert "config" in str(exc) or scratch in str(exc), str(exc)

    check(prop, fields.map(lambda extra: {**TINY_CONFIG, **extra}), examples, quick)


# ---------------------------------------------------------------------------
# rendered shell lines, run


TINY_CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "vocab_size": 128,
}


def run(script: str, cwd: Path, args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["bash", "-c", script, "rendered", *args],
        cwd=cwd, capture_output=True, timeout=30,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd), "RAY_AUTH_TOKEN": "t"},
    )  # fmt: skip
    # decoded here, not with text=True: universal newlines would turn a value's \r into \n
    done.stdout, done.stderr = done.stdout.decode(), done.stderr.decode(errors="replace")
    return done


def echoed(names: list[str]) -> str:
    return "".join(f'printf "%s\\0" "${{{n}}}"\n' for n in names)


@profiles("shell")
def test_rendered_scripts_pass_payloads_literally(examples, quick):
    from rlctl.backends.local import LocalBackend
    from rlctl.backends.skypilot import SkyPilotBackend, SkyPilotOptions
    from rlctl.backends.slurm import SlurmBackend, SlurmProfile
    from rlctl.job.spec import build_spec
    from rlctl.recipe.load import parse_recipe

    env_values = st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), STRINGS,
                                 min_size=1, max_size=3)  # fmt: skip

    def prop(args):
        env, text = args
        env = {k: v for k, v in env.items() if k not in ("PATH", "HOME")}
        with tempfile.TemporaryDirectory() as scratch_dir:
            scratch = Path(scratch_dir)
            # no setup steps (a model folder, data files): the scripts run whole
            (scratch / "model").mkdir()
            (scratch / "model" / "config.json").write_text(json.dumps(TINY_CONFIG))
            raw = with_value(with_value(CPU_BASE, "description", text), "env", env)
            raw = with_value(raw, "engine.trainer.project_name", text)
            raw |= {"model": str(scratch / "model"), "data": {"train": [f"{scratch}/t.parquet"]}}
            # no pre-flight (the real doctor, transformers' import each example): none of
            # these values reaches its words; test_recipe.py runs its line with payloads
            raw["preflight"] = False
            try:
                recipe = parse_recipe(raw)
            except RlctlError:
                return  # the loader refused (e.g. a secret-looking name); its own property
            names = sorted(recipe.env)
            expected = "".join(f"{recipe.env[n]}\0" for n in names)
            plan = api.plan_recipe(recipe)

            # local: the whole run.sh, its setup steps and `exec` caught by functions
            local = LocalBackend()
            spec = build_spec(
                recipe, plan, type(local.paths("j"))(str(scratch / "job"), recipe.checkpoints)
            )
            (scratch / "job").mkdir()
            script = local.render("j", spec).files["run.sh"]
            (scratch / "run.sh").write_text(script)
            assert not spec.setup
            stub = "exec() { :; " + echoed(names).replace("\n", "; ") + "}\n"
            done = run(stub + '. "$1"', scratch, (str(scratch / "run.sh"),))
            assert done.returncode == 0, done.stderr
            assert done.stdout == expected

            # slurm: the allocation's header, up to the Ray library
            slurm = SlurmBackend(SlurmProfile(job_root=str(scratch / "sl")))
            spec = build_spec(recipe, plan, slurm.paths("j", recipe.checkpoints))
            files = slurm.render("j", spec).files
            header = files["job.sbatch"].split('. "$RLCTL_ROOT/ray_cluster.sh"')[0]
            done = run(header + echoed(names), scratch)
            assert done.returncode == 0, done.stderr
            assert done.stdout == expected
            assert yaml.safe_load(files["engine.yaml"])["trainer"]["project_name"] == text

            # skypilot: setup.sh whole; run.sh's header and its engine config heredoc
            sky = SkyPilotBackend(SkyPilotOptions(cloud="k8s", remote_root=str(scratch / "sk")))
            spec = build_spec(recipe, plan, sky.paths("j", recipe.checkpoints))
            try:
                files = sky.render("j", spec).files
            except RlctlError as exc:  # a line that would end the heredoc
                assert "RLCTL_ENGINE_YAML_END" in str(exc)
                return
            # the install line (the job's Python from the wheel) holds no recipe value:
            # stubbed, as the local script's exec is
            assert run("env() { :; }\n" + files["setup.sh"], scratch).returncode == 0
            body = files["run.sh"]
            header = body.split("# ---- the Ray bootstrap library")[0]
            done = run(header + echoed(names), scratch)
            assert done.returncode == 0, done.stderr
            assert done.stdout == expected
            start = body.index(f"cat > {spec.paths.engine_config}")
            heredoc = body[
                start : body.index("\n", body.index("\nRLCTL_ENGINE_YAML_END", start) + 1)
            ]
            assert run(heredoc, scratch).returncode == 0
            written = yaml.safe_load(Path(spec.paths.engine_config).read_text())
            assert written["trainer"]["project_name"] == text
            assert not [p for p in scratch.rglob("PWNED*")]

    check(prop, st.tuples(env_values, STRINGS), examples, quick)
