"""The controller's one weights version: a rollout of its own is pushed each version once,
before it generates, and again after a resume; a colocated one is never pushed (it syncs
from the actor beside it)."""

import pytest

from engine.controller.worker_group import WorkerGroup
from engine.errors import EngineError
from engine.loop.weights_version import WeightsVersion
from engine.rollout.bridge import Pushed


class CountingWorkers:
    def __init__(self) -> None:
        self.pushes = 0

    def push_weights(self) -> Pushed:
        self.pushes += 1
        return Pushed(tensors=2, bytes=8)


def test_a_separate_rollout_is_pushed_each_version_once():
    weights, workers = WeightsVersion(separate=True), CountingWorkers()
    weights.push(workers)
    weights.push(workers)  # the same version: nothing to send
    assert workers.pushes == 1 and weights.served == 0
    weights.updated()
    assert weights.served == 0  # the rollout still holds the version before
    weights.push(workers)
    assert workers.pushes == 2 and weights.served == 1
    assert weights.take_sent() == Pushed(tensors=4, bytes=16)
    assert weights.take_sent() == Pushed()  # counted once, per step's metrics


def test_a_resume_pushes_the_saved_version_again():
    weights, workers = WeightsVersion(separate=True), CountingWorkers()
    weights.push(workers)
    weights.restore(5)  # the checkpoint's count: staleness counts on from it
    assert weights.version == 5
    weights.push(workers)
    assert workers.pushes == 2 and weights.served == 5


def test_a_colocated_rollout_is_never_pushed_and_serves_the_current_version():
    weights, workers = WeightsVersion(separate=False), CountingWorkers()
    weights.updated()
    weights.push(workers)
    assert workers.pushes == 0 and weights.served == 1


def test_one_group_refuses_a_push_with_the_setting_to_change():
    group = WorkerGroup.__new__(WorkerGroup)  # no processes: the refusal alone
    with pytest.raises(EngineError, match=r"rollout\.placement=separate"):
        group.push_weights()
    assert group.group_of("rollout") is group
