"""rlctl's Python API; the CLI is a thin layer over it.

from rlctl import api
job = api.launch("recipes/quickstart.yaml")
api.status(job.id).state
for line in api.logs(job.id, follow=True): print(line)
api.stop(job.id)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlctl.backends import get_backend
from rlctl.backends.base import Backend
from rlctl.bundled import bundled_dir
from rlctl.errors import RlctlError
from rlctl.job.prepared import Prepared
from rlctl.job.spec import build_spec
from rlctl.recipe.load import Recipe, load_recipe
from rlctl.store.jobs import SUBMISSION_INCOMPLETE, Job, JobState, JobStore
from rlctl.store.progress import Progress, read_progress

if TYPE_CHECKING:
    from engine.schema import EngineConfig
    from rlctl.planner.model import Plan, PlanRequest
    from rlctl.planner.sft import SFTRequest

BUNDLED_RECIPES = bundled_dir("recipes")
# A PENDING job with no handle this old was never submitted (the CLI died mid-launch).
STALE_SUBMISSION_S = 600.0


def find_recipe(ref: str) -> Path:
    """A recipe path, or the name of a bundled recipe (``quickstart``)."""
    path = Path(ref).expanduser()
    if path.is_file():
        return path
    # a bundled recipe by its file's name or by the name it lists under (`rlctl recipes`:
    # dapo-qwen32b for dapo_qwen32b.yaml)
    stem = ref.removesuffix(".yaml")
    for name in (stem, stem.replace("-", "_")):
        bundled = BUNDLED_RECIPES / f"{name}.yaml"
        if bundled.is_file():
            return bundled
    names = ", ".join(sorted(p.stem for p in BUNDLED_RECIPES.glob("*.yaml")))
    raise RlctlError(f"no recipe at {ref!r}", hint=f"give a recipe file, or a bundled one: {names}")


def bundled_recipes() -> list[Recipe]:
    return [load_recipe(p) for p in sorted(BUNDLED_RECIPES.glob("*.yaml"))]


def validate(ref: str) -> Recipe:
    """Load and check a recipe, including its engine config (no side effects)."""
    recipe = load_recipe(find_recipe(ref))
    prepare(recipe, backend="local", job_id="job-id")
    return recipe


def plan_recipe(recipe: Recipe) -> Plan:
    if recipe.is_sft:
        from rlctl.planner.sft import plan_sft

        return plan_sft(sft_request(recipe))
    from rlctl.planner.plan import make_plan

    return make_plan(plan_request(recipe))


def sft_request(recipe: Recipe) -> SFTRequest:
    """What the SFT planner needs (rlctl/planner/sft.py): the model, the hardware, the
    typed SFT config of the recipe's keys and the keys it pinned."""
    from engine.schema import SFT, ConfigError, load
    from rlctl.job.spec import nest
    from rlctl.planner.sft import SFTRequest
    from rlctl.recipe.load import RecipeError

    try:
        cfg = load(base=nest(recipe.engine_overrides()), check=False, schema=SFT).config
    except ConfigError as exc:
        problems = [p.replace("base config: ", "engine.", 1) for p in exc.problems]
        raise RecipeError(f"recipe {recipe.source}: " + "; ".join(problems)) from None
    accelerator, per_node, _ = recipe.hardware.target()
    return SFTRequest(
        model=recipe.model,
        accelerator=accelerator,
        devices_per_node=per_node,
        nodes=recipe.hardware.nodes,
        config=cfg,
        pinned=frozenset(recipe.engine),
    )


def plan_request(recipe: Recipe) -> PlanRequest:
    """What the planner needs to know about a recipe: the model, the hardware, and the
    engine's typed config the recipe makes with the keys the person pinned in it."""
    from engine.schema import estimator_needs
    from rlctl.planner.plan import PlanRequest

    cfg = _typed_engine_config(recipe)
    accelerator, per_node, devices = recipe.hardware.target()
    actor = cfg.actor_rollout_ref.actor
    return PlanRequest(
        model=recipe.model,
        accelerator=accelerator,
        num_devices=devices,
        max_devices_per_node=per_node,
        algorithm_needs_critic=estimator_needs(cfg.algorithm.adv_estimator).values
        if cfg.critic.enable is None
        else cfg.critic.enable,
        algorithm_needs_reference=actor.use_kl_loss or cfg.algorithm.use_kl_in_reward,
        rollout_backend=recipe.rollout,
        train_backend=recipe.trainer,
        train_batch_size=cfg.data.train_batch_size,
        rollout_n=cfg.actor_rollout_ref.rollout.n,
        max_prompt_length=cfg.data.max_prompt_length,
        max_response_length=cfg.data.max_response_length,
        config=cfg,
        pinned=frozenset(recipe.engine),
    )


def _typed_engine_config(recipe: Recipe) -> EngineConfig:
    """The engine config the recipe's keys make, typed by the engine's schema (no
    cross-field rules yet: the plan fills in sizes first). The recipe parser checked
    every key, so a problem here is reported the same way, naming the key."""
    from engine.schema import ConfigError, load_config
    from rlctl.job.spec import nest
    from rlctl.recipe.load import RecipeError

    try:
        return load_config(base=nest(recipe.engine_overrides()), check=False)
    except ConfigError as exc:
        problems = [p.replace("base config: ", "engine.", 1) for p in exc.problems]
        raise RecipeError(f"recipe {recipe.source}: " + "; ".join(problems)) from None


def prepare(recipe: Recipe, backend: str, job_id: str, **backend_options: Any) -> Prepared:
    """The recipe planned, resolved and rendered for ``backend`` as job ``job_id``."""
    return prepare_for(recipe, get_backend(backend, **backend_options), job_id)


def prepare_for(recipe: Recipe, impl: Backend, job_id: str) -> Prepared:
    plan = plan_recipe(recipe)
    spec = build_spec(recipe, plan, impl.paths(job_id, recipe.checkpoints))
    return Prepared(job_id, recipe, plan, spec, impl.render(job_id, spec))


def launch(
    ref: str, backend: str = "local", store: JobStore | None = None, **backend_options: Any
) -> Job:
    """Validate, plan, record, submit. Bad input fails before anything is recorded; the
    job is made once, under the id it is recorded with (drawn first, recorded last)."""
    store = store or JobStore()
    path = find_recipe(ref)
    recipe = load_recipe(path)
    impl = get_backend(backend, **backend_options)
    secrets = _secret_values(recipe)
    # every check before any record: the recipe, the plan, the backend's own (e.g. an
    # enabled cloud)
    prepared = prepare_for(recipe, impl, store.new_id(recipe.name))
    if hasattr(impl, "preflight"):
        impl.preflight()

    job = store.create(
        name=recipe.name,
        recipe_path=str(path),
        recipe_yaml=recipe.to_yaml(),
        plan_json=json.dumps(prepared.plan.to_json()),
        backend=backend,
        job_id=prepared.job_id,
    )
    try:
        handle = impl.submit(job, prepared, secrets)
    except BaseException as exc:
        store.transition(job.id, JobState.FAILED, reason=f"submission failed: {exc}")
        raise
    store.set_handle(job.id, handle)
    return store.transition(job.id, JobState.RUNNING)


def _secret_values(recipe: Recipe) -> dict[str, str]:
    missing = [name for name in recipe.secrets if name not in os.environ]
    if missing:
        raise RlctlError(
            f"recipe {recipe.name}: secrets not set in your environment: {', '.join(missing)}",
            hint="export them before launching (their values are passed to the job, never stored)",
        )
    return {name: os.environ[name] for name in recipe.secrets}


def refresh(job: Job, store: JobStore) -> Job:
    """The job with its state brought up to date from its backend."""
    if job.state.terminal:
        return job
    if not job.handle:
        stale = store.stale_pending(STALE_SUBMISSION_S)
        if any(j.id == job.id for j in stale):
            return store.transition(job.id, JobState.FAILED, reason=SUBMISSION_INCOMPLETE)
        return job
    seen = get_backend(job.backend).status(job)
    return store.transition(job.id, seen.state, reason=seen.reason, exit_code=seen.exit_code)


def status(ref: str | None = None, store: JobStore | None = None) -> list[Job]:
    store = store or JobStore()
    jobs = [store.get(ref)] if ref else store.list()
    return [refresh(job, store) for job in jobs]


def progress(job: Job) -> Progress:
    """Where the job's run is, from its files where this machine can read them; never
    raises (a ``note`` says what could not be read)."""
    return read_progress(job)


def list_jobs(store: JobStore | None = None, limit: int | None = None) -> list[Job]:
    store = store or JobStore()
    return store.list(limit=limit)


def logs(ref: str, follow: bool = False, store: JobStore | None = None) -> Iterator[str]:
    store = store or JobStore()
    job = store.get(ref)
    if not job.handle:
        raise RlctlError(f"job {job.id} has no logs: it was never submitted ({job.state})")
    yield from get_backend(job.backend).logs(job, follow)


def memory_lines(ref: str, store: JobStore | None = None) -> list[str]:
    """Each role's peak memory against the plan and the limit, as ``rlctl status`` shows
    it (rlctl/store/memory_report.py); [] when the run logged none or its files are elsewhere
    (nothing is read from a bucket for it)."""
    memory = read_progress((store or JobStore()).get(ref), bucket=False).memory
    return memory.lines() if memory else []


def stop(ref: str, grace_s: float = 60.0, store: JobStore | None = None) -> Job:
    """Graceful first (the engine saves and exits), forceful after ``grace_s``."""
    store = store or JobStore()
    job = refresh(store.get(ref), store)
    if job.state.terminal:
        return job
    # Recorded first: the job's own exit (code 75 after SIGTERM) must not read as a failure.
    job = store.transition(job.id, JobState.CANCELLED, reason="stopped by the user")
    if job.handle:
        get_backend(job.backend).stop(job, grace_s)
    return job
