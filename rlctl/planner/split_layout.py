"""A split of the job's devices between training and a rollout on devices of its own
(``rollout.placement=separate``): the two groups, the nodes they take together
(``job_nodes``), how the plan records and names them; ``split.py`` searches
and explains."""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.planner.fit import CandidateLayout, Fit, count_noun
from rlctl.planner.model import RolloutSplit, job_nodes


@dataclass(frozen=True)
class Split:
    train: CandidateLayout
    rollout: CandidateLayout
    node_size: int  # devices a node has

    @property
    def shares_nodes(self) -> bool:
        """Both groups' devices per node fit one node: they share nodes."""
        return self.train.per_node + self.rollout.per_node <= self.node_size

    def job(self) -> CandidateLayout:
        nodes, per_node = job_nodes(
            self.train.nodes,
            self.train.per_node,
            self.rollout.nodes,
            self.rollout.per_node,
            self.node_size,
        )
        return CandidateLayout(nodes, per_node)

    @property
    def label(self) -> str:
        """Devices training + generating: per node when the groups share nodes."""
        if not self.shares_nodes:
            return f"{group_label(self.train)} + {group_label(self.rollout)}"
        each = f"{self.train.per_node} + {self.rollout.per_node}"
        return each if self.train.nodes == 1 else f"{each} on each of {self.train.nodes} nodes"

    def describe(self) -> str:
        return f"training {group_label(self.train)} + rollout {group_label(self.rollout)}"

    def in_plan(
        self, mode: str, generate_s: float | None = None, train_s: float | None = None
    ) -> RolloutSplit:
        """The split as the plan records it (with the estimates it was chosen by)."""
        return RolloutSplit(
            mode=mode,
            train_nodes=self.train.nodes,
            train_devices_per_node=self.train.per_node,
            rollout_nodes=self.rollout.nodes,
            rollout_devices_per_node=self.rollout.per_node,
            node_size=self.node_size,
            generate_seconds=generate_s,
            train_seconds=train_s,
        )


def group_label(lay: CandidateLayout) -> str:
    return f"{count_noun(lay.nodes, 'node')} × {lay.per_node}"


@dataclass(frozen=True)
class SplitFit:
    split: Split
    fit: Fit  # fit.layout is the training group; fit.rollout is on the rollout group
    generate_s: float
    train_s: float
    step_s: float
