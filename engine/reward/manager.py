"""Score a batch of responses in worker processes, with a timeout per sample.

``RewardManager.score`` sends the batch in chunks to ``reward_model.num_workers``
processes (started once, reused across batches) and collects one result per sample. A
sample whose scorer runs longer than ``reward_model.timeout_s`` scores 0 with error
``"timeout"``: its worker is killed and replaced and the rest of its chunk goes back to
the queue, so a hanging reward function can never hang training. A scorer that raises
scores 0 with the exception text as the error. There is no in-process shortcut: every
sample runs under the timeout.

Workers start with ``forkserver`` (``spawn`` where it does not exist), never ``fork``:
the trainer runs beside Ray and torch threads.

DAPO's overlong penalty (``reward_model.overlong_buffer``) is added to the score of every
sample (failed ones included) whenever ``overlong_buffer.enable`` is true, whatever
``reward_model.reward_manager`` is named; ``"dapo"`` is kept as a name for verl recipes.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import time
from collections import deque
from collections.abc import Iterable
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from engine.config import REWARD_MANAGERS, CustomRewardFunctionConfig, RewardModelConfig
from engine.reward import registry
from engine.reward.custom import load_custom_function
from engine.reward.types import RewardError, ScoreRequest, ScoreResult, to_result

logger = logging.getLogger(__name__)

TIMEOUT_ERROR = "timeout"
_STARTUP_TIMEOUT_S = 120.0  # a worker that is not ready by then is a setup error
_CHUNKS_PER_WORKER = 4  # per batch: small enough to balance, large enough to be cheap
_MAX_CHUNK = 64


def overlong_penalty(
    response_length: int, max_response_length: int, buffer_len: int, penalty_factor: float
) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025), a value ≤ 0.

    0 up to ``max_response_length - buffer_len`` tokens, then falling linearly to
    ``-penalty_factor`` at ``max_response_length``, and ``-penalty_factor`` beyond it.
    """
    expected = max_response_length - buffer_len
    if response_length <= expected:
        return 0.0
    if response_length > max_response_length:
        return -penalty_factor
    return (expected - response_length) / buffer_len * penalty_factor


class RewardManager:
    """Rule-based rewards for a batch: ``score(requests) -> results``, in order."""

    def __init__(
        self,
        reward_cfg: RewardModelConfig,
        custom_cfg: CustomRewardFunctionConfig,
        max_response_length: int,
    ) -> None:
        _check_config(reward_cfg, max_response_length)
        self.reward_cfg = reward_cfg
        self.max_response_length = max_response_length
        self._custom: tuple[str, str] | None = None
        if custom_cfg.path:
            path = str(Path(custom_cfg.path).expanduser().resolve())
            load_custom_function(path, custom_cfg.name)  # fail here, not in a worker
            self._custom = (path, custom_cfg.name)
        self._ctx = _mp_context()
        self._workers: list[_Worker] = []

    # -- public API ------------------------------------------------------------

    def check_data_sources(self, data_sources: Iterable[str]) -> None:
        """Raise ``RewardError`` for a data source nothing can score."""
        if self._custom is None:
            for source in sorted(set(data_sources)):
                registry.get_scorer(source)

    def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        if not requests:
            return []
        self.check_data_sources(r.data_source for r in requests)
        try:
            results = self._score_in_workers(requests)
        except BaseException:
            self.close()  # workers may hold half a batch; the next call starts fresh ones
            raise
        _log_errors(requests, results)
        self.add_overlong_penalty(requests, results)
        return results

    def add_overlong_penalty(
        self, requests: list[ScoreRequest], results: list[ScoreResult]
    ) -> None:
        """DAPO's penalty added to each result (also a reward model's), when enabled."""
        buffer = self.reward_cfg.overlong_buffer
        if buffer.enable:
            for request, result in zip(requests, results, strict=True):
                penalty = overlong_penalty(
                    request.response_length,
                    self.max_response_length,
                    buffer.len,
                    buffer.penalty_factor,
                )
                result.score += penalty
                result.extras["overlong_penalty"] = penalty

    def start(self) -> None:
        """Start the worker processes now instead of at the first batch: the engine does
        while its Ray workers start, so that its first scoring need not wait for a fork
        server and its imports. Scores are the same either way."""
        while len(self._workers) < self.reward_cfg.num_workers:
            self._workers.append(self._start_worker())

    def close(self) -> None:
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def __enter__(self) -> RewardManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the worker pool ---------------------------------------------------------

    def _start_worker(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe()
        process = self._ctx.Process(
            target=_worker_main,
            args=(child_conn, self._custom),
            name="reward-worker",
            daemon=True,
        )
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def _replace(self, worker: _Worker) -> None:
        worker.kill()
        self._workers[self._workers.index(worker)] = self._start_worker()

    def _score_in_workers(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        n = len(requests)
        self.start()
        chunk_size = min(
            _MAX_CHUNK, max(1, math.ceil(n / (len(self._workers) * _CHUNKS_PER_WORKER)))
        )
        pending = deque(list(range(i, min(i + chunk_size, n))) for i in range(0, n, chunk_size))
        results: list[ScoreResult | None] = [None] * n
        remaining = n
        timeout_s = self.reward_cfg.timeout_s

        while remaining:
            now = time.monotonic()
            for worker in self._workers:
                if worker.ready and not worker.chunk and pending:
                    chunk = pending.popleft()
                    worker.send([(i, _payload(requests[i])) for i in chunk], chunk, now)

            deadlines = [w.deadline(timeout_s) for w in self._workers]
            wait_s = max(0.0, min(deadlines) - time.monotonic())
            by_conn = {id(w.conn): w for w in self._workers}
            for conn in wait(list(w.conn for w in self._workers), timeout=wait_s):
                remaining -= self._drain(by_conn[id(conn)], results, pending)

            now = time.monotonic()
            for worker in list(self._workers):
                if not worker.ready and now - worker.started_at > _STARTUP_TIMEOUT_S:
                    raise RewardError(
                        f"a reward worker did not start within {_STARTUP_TIMEOUT_S:.0f} s"
                    )
                if worker.chunk and now > worker.deadline(timeout_s):
                    index = worker.chunk.popleft()
                    results[index] = ScoreResult(0.0, 0.0, {}, TIMEOUT_ERROR)
                    remaining -= 1
                    if worker.chunk:
                        pending.appendleft(list(worker.chunk))
                    self._replace(worker)
        return [r for r in results if r is not None]

    def _drain(
        self, worker: _Worker, results: list[ScoreResult | None], pending: deque[list[int]]
    ) -> int:
        """Read what ``worker`` sent; return how many samples it finished."""
        finished = 0
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                kind = message[0]
                if kind == "ready":
                    worker.ready = True
                elif kind == "result":
                    _, index, result = message
                    expected = worker.chunk.popleft()
                    assert index == expected, (index, expected)
                    results[index] = result
                    worker.progress_at = time.monotonic()
                    finished += 1
                elif kind == "failed":
                    raise RewardError(f"a reward worker failed to start: {message[1]}")
        except (EOFError, OSError):
            worker.process.join(timeout=1)
            code = worker.process.exitcode
            if not worker.ready:
                raise RewardError(
                    f"a reward worker exited while starting (exit code {code}); its "
                    "traceback, if any, is in the log above"
                ) from None
            if worker.chunk:
                index = worker.chunk.popleft()
                results[index] = ScoreResult(
                    0.0, 0.0, {}, f"the reward worker died (exit code {code})"
                )
                finished += 1
                if worker.chunk:
                    pending.appendleft(list(worker.chunk))
            self._replace(worker)
        return finished


class _Worker:
    def __init__(self, process: Any, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.started_at = time.monotonic()
        self.ready = False
        self.chunk: deque[int] = deque()  # samples sent and not yet answered, in order
        self.progress_at = self.started_at  # when the sample now running started

    def send(self, items: list[tuple[int, tuple]], chunk: list[int], now: float) -> None:
        self.chunk = deque(chunk)
        self.progress_at = now
        self.conn.send(items)

    def deadline(self, timeout_s: float) -> float:
        if not self.ready:
            return self.started_at + _STARTUP_TIMEOUT_S
        if not self.chunk:
            return math.inf
        return self.progress_at + timeout_s

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        if self.chunk:  # busy (a batch was interrupted): no point waiting for it
            self.kill()
            return
        with contextlib.suppress(OSError, ValueError):  # already closed or dead
            self.conn.send(None)
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()


def _payload(request: ScoreRequest) -> tuple[str, str, Any, Any]:
    return (request.data_source, request.response, request.ground_truth, request.extra_info)


def _worker_main(conn: Connection, custom: tuple[str, str] | None) -> None:
    """A worker process: score what arrives, one result message per sample."""
    try:
        function = load_custom_function(*custom) if custom is not None else None
    except Exception as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    while True:
        try:
            items = conn.recv()
        except EOFError:
            return
        if items is None:
            return
        for index, (data_source, response, ground_truth, extra_info) in items:
            try:
                if function is not None:
                    value = function(data_source, response, ground_truth, extra_info)
                else:
                    scorer = registry.get_scorer(data_source)
                    value = scorer(response, ground_truth, extra_info)
                result = to_result(value)
            except Exception as exc:
                result = ScoreResult(0.0, 0.0, {}, f"{type(exc).__name__}: {exc}")
            conn.send(("result", index, result))


def _mp_context() -> multiprocessing.context.BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        # Imported once in the fork server, so every worker (and replacement) starts warm.
        ctx.set_forkserver_preload(["engine.reward.manager", "math_verify"])
        return ctx
    return multiprocessing.get_context("spawn")


def _check_config(cfg: RewardModelConfig, max_response_length: int) -> None:
    problems = []
    if cfg.reward_manager not in REWARD_MANAGERS:
        problems.append(
            f"reward_model.reward_manager {cfg.reward_manager!r} is unknown; use one of "
            f"{', '.join(REWARD_MANAGERS)}"
        )
    if cfg.num_workers < 1:
        problems.append(f"reward_model.num_workers must be at least 1, not {cfg.num_workers}")
    if not cfg.timeout_s > 0:
        problems.append(f"reward_model.timeout_s must be positive, not {cfg.timeout_s}")
    buffer = cfg.overlong_buffer
    if buffer.enable and not 0 < buffer.len <= max_response_length:
        problems.append(
            f"reward_model.overlong_buffer.len {buffer.len} must be in "
            f"(0, data.max_response_length={max_response_length}]"
        )
    if problems:
        raise RewardError("; ".join(problems))


def _log_errors(requests: list[ScoreRequest], results: list[ScoreResult]) -> None:
    failed = [(req, res) for req, res in zip(requests, results, strict=True) if res.error]
    if failed:
        request, result = failed[0]
        logger.warning(
            "reward function failed on %d of %d samples (scored 0); first: data_source %r: %s",
            len(failed),
            len(requests),
            request.data_source,
            result.error,
        )
