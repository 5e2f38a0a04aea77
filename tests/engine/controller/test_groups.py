"""SeparateGroups' routing: each role to its own group, the rest to the training group;
shutdown of every group (no Ray: the groups are stand-ins)."""

from engine.controller.groups import SeparateGroups


class FakeGroup:
    def __init__(self, label: str, log: list[str]) -> None:
        self.label, self.world_size, self.log = label, 1, log

    def call_split(self, role, method, batch, *args, gather=None):
        return (self.label, role, method)

    def call_all(self, role, method, *args, **kwargs):
        return [(self.label, role, method)]

    def shutdown(self, grace_s: float = 10.0) -> None:
        self.log.append(self.label)


def test_each_role_goes_to_its_group_and_shutdown_ends_every_group():
    log: list[str] = []
    train, rollout, rm = (FakeGroup(n, log) for n in ("", "rollout", "rm"))
    groups = SeparateGroups(train, {"rollout": rollout, "rm": rm})
    assert groups.call_split("rm", "scores", [1]) == ("rm", "rm", "scores")
    assert groups.call_all("rollout", "x") == [("rollout", "rollout", "x")]
    for role in ("actor", "ref", "critic"):
        assert groups.group_of(role) is train
    assert groups.groups == [train, rollout, rm] and groups.rollout is rollout
    groups.shutdown()
    assert log == ["rm", "rollout", ""]  # the training group last


def test_the_reward_models_group_alone_leaves_the_rollout_colocated():
    train, rm = FakeGroup("", []), FakeGroup("rm", [])
    groups = SeparateGroups(train, {"rm": rm})
    assert groups.rollout is None
    assert groups.group_of("rollout") is train and groups.group_of("rm") is rm
