"""Batches of prompts, shuffled per epoch, resumable to the exact batch.

Epoch ``e`` visits the dataset in a permutation drawn from ``(seed, e)`` alone, so any
epoch can be rebuilt without replaying the ones before it. The loader's state is the
epoch and the number of batches of it already handed out; a loader restored from
:meth:`PromptLoader.state_dict` yields exactly the batches the original would have
yielded next.

``for batch in loader`` runs through the rest of the current epoch; the next ``for``
starts the following epoch::

    for epoch in range(loader.epoch, total_epochs):
        for batch in loader:
            step(batch)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from engine.data.dataset import DataError, PromptSample


class PromptLoader:
    def __init__(
        self,
        dataset: Sequence[PromptSample],
        batch_size: int,
        *,
        shuffle: bool,
        seed: int,
        drop_last: bool = True,
    ) -> None:
        n = len(dataset)
        if batch_size <= 0:
            raise DataError(f"batch size must be positive, got {batch_size}")
        if batch_size > n:
            raise DataError(
                f"batch size {batch_size} is larger than the dataset ({n} prompts); lower "
                "data.train_batch_size (or data.val_batch_size) or add data"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.epoch = 0
        self.batches_done = 0  # batches of the current epoch already yielded

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The dataset indices of ``epoch``, in the order they are visited."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def __iter__(self) -> Iterator[list[PromptSample]]:
        if self.batches_done >= len(self):
            self._next_epoch()
        order = self.order(self.epoch)
        while self.batches_done < len(self):
            start = self.batches_done * self.batch_size
            indices = order[start : start + self.batch_size]
            self.batches_done += 1
            yield [self.dataset[int(i)] for i in indices]
        self._next_epoch()

    def _next_epoch(self) -> None:
        self.epoch += 1
        self.batches_done = 0

    def state_dict(self) -> dict[str, Any]:
        epoch, done = self.epoch, self.batches_done
        if done >= len(self):  # the epoch is over: resume at the start of the next one
            epoch, done = epoch + 1, 0
        return {
            "epoch": epoch,
            "batches_done": done,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "num_samples": len(self.dataset),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = self.state_dict()
        # Any of these changing would make the resumed batches differ from the saved run's.
        changed = [
            f"{key} {state[key]} -> {mine[key]}"
            for key in ("seed", "shuffle", "batch_size", "drop_last", "num_samples")
            if state[key] != mine[key]
        ]
        if changed:
            raise DataError(
                "cannot resume the data loader exactly: " + ", ".join(changed) + " since the "
                "checkpoint was saved; restore the saved data settings and files, or start "
                "a new run"
            )
        if not 0 <= state["batches_done"] <= len(self):
            raise DataError(
                f"data loader state has batches_done={state['batches_done']}, outside "
                f"0..{len(self)}"
            )
        self.epoch = int(state["epoch"])
        self.batches_done = int(state["batches_done"])


class PromptStream:
    """The training prompts, batch after batch without end: a new epoch starts when one
    runs out. What the trainer and its overlap mode draw from; ``loader`` is its state."""

    def __init__(self, loader: PromptLoader) -> None:
        self.loader = loader
        self._batches = iter(loader)

    def next(self) -> list[PromptSample]:
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = iter(self.loader)
            return next(self._batches)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's loader state."""
        self.loader.load_state_dict(state)
        self._batches = iter(self.loader)
