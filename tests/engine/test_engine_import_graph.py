"""The engine's modules import each other without a circle, lazy imports included
(``if TYPE_CHECKING:`` imports never run and are left out: a section's rules name
``EngineConfig`` in their signatures). A circle means two rooms that each need the other,
and an import order that works only by accident (issue 31 removed the last five)."""

import pytest

from tests.import_graph import REPO, circles, import_graph, package_graph, private_imports

PACKAGE = REPO / "engine"


def test_the_engine_has_no_import_circle():
    assert circles(import_graph(PACKAGE, runtime_only=True)) == []


def test_lazy_imports_count_and_type_checking_ones_do_not():
    graph = import_graph(PACKAGE, runtime_only=True)
    assert "engine.workers.actor" in graph["engine.workers.host"]  # inside a function
    assert "engine.config.engine" not in graph["engine.config.actor"]  # TYPE_CHECKING only
    assert "engine.config.engine" in import_graph(PACKAGE)["engine.config.actor"]


# Subpackages that once imported each other both ways, and which way each import goes
# now (issue 31): the config reads the algorithms' names, never their code; the agent
# loops drive the rollout's engines, which know nothing of agents; training hands its
# weights out in the rollout's names, and the HF rollout is given the FSDP gather by its
# factory (engine.workers.rollout_engine) rather than importing it.
LOWER_FIRST = [
    ("engine.config", "engine.algo"),
    ("engine.agents", "engine.rollout"),
    ("engine.train", "engine.rollout"),
    ("engine.workers", "engine.controller"),  # the roles, and their spawning, use Ray's plumbing
    # The tiny models are built for the shipped tasks; the tasks' scorers read the tasks'
    # data; SFT reads prompts with the RL data's loader; the warm starts drive all three.
    # A user's file (a reward function, a tool, a dataset class) loads through
    # engine.user_code, which none of them owns.
    ("engine.rollout", "engine.config"),  # the version table is engine.versions, below both
    ("engine.models", "engine.data"),
    ("engine.models", "engine.types"),  # text's multimodal positions are the batch type's
    # The config validates Megatron's parallel sizes (engine.config.megatron_parallel) and
    # reads the model's Megatron shape (engine.models.megatron_config); training reads both.
    ("engine.train", "engine.config"),
    ("engine.reward", "engine.data"),
    ("engine.sft", "engine.data"),
    ("engine.warmup", "engine.sft"),
    ("engine.warmup", "engine.models"),
]


@pytest.mark.parametrize(("upper", "lower"), LOWER_FIRST)
def test_subpackages_import_one_way(upper, lower):
    packages = package_graph(import_graph(PACKAGE, runtime_only=True))
    assert lower in packages[upper]  # the way it goes
    assert upper not in packages[lower]


def test_package_graph_counts_imports_between_packages_only():
    graph = {"engine.a.x": {"engine.a.y", "engine.b.z"}, "engine.a.y": set(), "engine.b.z": set()}
    assert package_graph(graph) == {"engine.a": {"engine.b"}, "engine.b": set()}


def test_no_two_subpackages_import_each_other():
    packages = package_graph(import_graph(PACKAGE, runtime_only=True))
    both = sorted((a, b) for a in packages for b in packages[a] if a < b and a in packages[b])
    assert both == []


def test_the_loop_is_driven_from_the_run_only():
    """engine.loop (the controller's loop) sits above the workers, rollouts and Ray's
    plumbing; only the run's start and SFT's trainer (its metrics) reach into it."""
    graph = import_graph(PACKAGE, runtime_only=True)
    users = {
        module
        for module, imported in graph.items()
        if not module.startswith("engine.loop")
        and any(name.startswith("engine.loop.") for name in imported)
    }
    assert sorted(users) == ["engine.runtime", "engine.sft.trainer"]
    assert "engine.loop" not in package_graph(graph)["engine.controller"]


def test_no_module_imports_another_modules_private_name():
    """What a module gives others is public; ``_name`` stays in its own module."""
    assert private_imports(PACKAGE) == []
