"""The engine's modules import each other without a circle, lazy imports included
(``if TYPE_CHECKING:`` imports never run and are left out: a section's rules name
``EngineConfig`` in their signatures). A circle means two rooms that each need the other,
and an import order that works only by accident (issue 31 removed the last five)."""

from tests.import_graph import REPO, circles, import_graph

PACKAGE = REPO / "engine"


def test_the_engine_has_no_import_circle():
    assert circles(import_graph(PACKAGE, runtime_only=True)) == []


def test_lazy_imports_count_and_type_checking_ones_do_not():
    graph = import_graph(PACKAGE, runtime_only=True)
    assert "engine.workers.actor" in graph["engine.workers.host"]  # inside a function
    assert "engine.config.engine" not in graph["engine.config.actor"]  # TYPE_CHECKING only
    assert "engine.config.engine" in import_graph(PACKAGE)["engine.config.actor"]
