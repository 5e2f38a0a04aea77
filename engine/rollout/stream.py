"""Samples generated as a stream (``async_training.mode=fully_async``; docs/async.md).

The controller's rollouter (``engine.loop.rollouter``) keeps each rollout engine busy with a
stream of prompts: it adds new ones and advances the engine a few steps at a time
(``RolloutWorker.stream_advance``), and takes back the samples that finished. Between
two calls the engine is idle with its requests held, which is when new weights may
arrive: with partial rollouts a request then continues under the new weights, and every
token is tagged with the weights version that produced it.

Two engines stream: vLLM's (``engine.rollout.vllm_stream.VLLMSampleStream``, one engine
step per ``step``) and the HF rollout's (``engine.rollout.hf_stream.HFSampleStream``,
``chunk_tokens`` tokens per ``step``, the rows in flight as one batch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from engine.types import SamplingParams


@dataclass(frozen=True)
class StreamItem:
    """One sample to generate: the controller's id for it and its prompt."""

    uid: int
    prompt_ids: list[int]


@dataclass
class StreamDone:
    """A finished sample: its tokens (cut after the end token), their sampling
    log-probs when asked, whether it ended with the end token, and the weights
    versions that produced its tokens as runs ``[(version, tokens), ...]`` in order."""

    uid: int
    response_ids: list[int]
    finished: bool
    logprobs: list[float] | None
    versions: list[tuple[int, int]] = field(default_factory=list)

    @property
    def first_version(self) -> int:
        return self.versions[0][0] if self.versions else -1

    @property
    def last_version(self) -> int:
        return self.versions[-1][0] if self.versions else -1


def add_run(runs: list[tuple[int, int]], version: int, count: int) -> None:
    """Append ``count`` tokens made by ``version`` to a run-length list of versions."""
    if count <= 0:
        return
    if runs and runs[-1][0] == version:
        runs[-1] = (version, runs[-1][1] + count)
    else:
        runs.append((version, count))


def cut_runs(runs: list[tuple[int, int]], keep: int) -> list[tuple[int, int]]:
    """The runs of the first ``keep`` tokens (a response cut after its end token)."""
    out: list[tuple[int, int]] = []
    for version, count in runs:
        if keep <= 0:
            break
        out.append((version, min(count, keep)))
        keep -= count
    return out


class SampleStream(Protocol):
    def add(self, items: list[StreamItem], sampling: SamplingParams) -> None: ...

    def step(self, version: int) -> list[StreamDone]:
        """Advance every sample in flight; the ones that finished. Tokens made in this
        step are tagged ``version``."""
        ...

    @property
    def in_flight(self) -> int: ...

    def drop(self) -> None:
        """Forget every sample in flight (the run ends; a checkpoint's prompts are
        generated again after a resume)."""
        ...


def advance(
    stream: SampleStream,
    items: list[StreamItem],
    sampling: SamplingParams,
    version: int,
    steps: int,
) -> list[StreamDone]:
    """Add ``items`` and take up to ``steps`` steps (fewer once nothing is in flight)."""
    if items:
        stream.add(items, sampling)
    done: list[StreamDone] = []
    for _ in range(steps):
        if not stream.in_flight:
            break
        done += stream.step(version)
    return done
