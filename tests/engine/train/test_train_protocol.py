"""Both training backends are ``TrainEngine``s: every method the workers call exists on
each, with the protocol's parameters (a backend that lost or renamed one fails here, not
in a worker on a GPU)."""

import inspect

import pytest

from engine.train.protocol import TrainEngine


def _members() -> dict[str, object]:
    """Methods and properties; attributes (annotations) map to None."""
    members: dict[str, object] = dict.fromkeys(TrainEngine.__annotations__)
    members |= {
        name: value
        for name, value in vars(TrainEngine).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }
    return members


def _sets_in_init(backend: type, name: str) -> bool:
    return any(
        f"self.{name} =" in inspect.getsource(klass.__init__)
        for klass in backend.__mro__
        if "__init__" in vars(klass) and klass is not object
    )


def _backends():
    from engine.train.fsdp import FSDPEngine

    yield FSDPEngine
    try:
        from engine.train.megatron import MegatronEngine
    except ImportError:  # megatron-core is an extra (scripts/test.sh puts it on the path)
        return
    yield MegatronEngine


@pytest.mark.parametrize("backend", list(_backends()), ids=lambda b: b.__name__)
def test_the_backend_has_every_member_with_its_parameters(backend):
    for name, member in _members().items():
        present = hasattr(backend, name) or (member is None and _sets_in_init(backend, name))
        assert present, f"{backend.__name__} lacks {name}"
        if member is None or isinstance(member, property):
            continue
        ours = inspect.signature(getattr(backend, name)).parameters
        wanted = inspect.signature(member).parameters
        assert list(ours)[: len(wanted)] == list(wanted), (backend.__name__, name)


def test_the_protocol_names_what_the_workers_call():
    assert {"response_logprobs", "response_logprobs_at", "forward_backward"} <= set(_members())
    assert {"optimizer_step", "save", "load", "module", "dp_size"} <= set(_members())
