"""The local backend: run the job on this machine, detached from the CLI.

The job runs as ``bash run.sh`` in a new session (so it survives the terminal and
the CLI), with its output in ``job.log`` and its exit code written to ``exit_code``
when it ends. ``run.sh`` runs the engine under its supervisor (``engine.supervisor``),
which starts it again after a failure worth retrying, at most ``trainer.max_restarts``
times, each attempt recorded in ``restarts.json``. The engine starts its own local Ray
cluster inside that session. ``stop`` sends SIGTERM to the supervisor (it passes it on:
the engine finishes its step, saves, exits; no restart follows), waits, then SIGKILLs
whatever is left of the session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from rlctl import __version__
from rlctl.backends.base import Observed
from rlctl.home import job_dir
from rlctl.job.prepared import Prepared, Rendered
from rlctl.job.render import render
from rlctl.job.spec import JobPaths, JobSpec
from rlctl.store.jobs import Job, JobState

LOG = "job.log"
EXIT_CODE = "exit_code"
PREEMPTED = 75  # the engine's "stopped on SIGTERM, requeue me"
# Runs the script; when it ends, ends whatever of the job is left in its session, then
# records its exit code, whatever it was. A driver killed outright (OOM, kill -9) leaves
# Ray's dashboard and runtime-env agents behind (they ignore SIGTERM once their raylet is
# gone): SIGTERM, then SIGKILL after 3 s, and the exit code only once they are gone
# (at most 5 s more). The session's processes are found in /proc
# (field 6 of /proc/PID/stat, after the parenthesised name). The paths are argv words
# ($1, $2), never part of the command string.
_RUNNER = r"""
bash "$1"; code=$?
left() {
  local f line pid
  for f in /proc/[0-9]*/stat; do
    read -r line 2>/dev/null <"$f" || continue
    read -r -a fields <<<"${line##*) }"
    pid=${f#/proc/}; pid=${pid%/stat}
    [ "${fields[3]}" = "$$" ] && [ "$pid" != "$$" ] && [ "$pid" != "$BASHPID" ] &&
      [ "${fields[0]}" != Z ] && echo "$pid"
  done
}
pids=$(left)
if [ -n "$pids" ]; then
  kill -TERM $pids 2>/dev/null
  for _ in 1 2 3 4 5 6; do pids=$(left); [ -z "$pids" ] && break; sleep 0.5; done
  if [ -n "$pids" ]; then
    kill -KILL $pids 2>/dev/null
    # the exit code says the job is over: written once its processes are gone
    for _ in $(seq 50); do [ -z "$(left)" ] && break; sleep 0.1; done
  fi
fi
echo "$code" > "$2"; exit "$code"
"""


class LocalBackend:
    name = "local"

    def paths(self, job_id: str, checkpoints: str | None = None) -> JobPaths:
        # submit creates the directory
        return JobPaths(root=str(job_dir(job_id, create=False)), checkpoints=checkpoints)

    def render(self, job_id: str, spec: JobSpec) -> Rendered:
        script = render(
            "local_job.sh.j2",
            job_id=job_id,
            recipe_name=spec.recipe.name,
            version=__version__,
            env=spec.env,
            root=spec.paths.root,
            # the job runs with the same Python as this rlctl (where the engine is installed)
            setup=[spec.with_python(step, sys.executable) for step in spec.setup],
            preflight=spec.with_python(spec.preflight, sys.executable),
            engine_command=spec.with_python(spec.supervised_command(), sys.executable),
        )
        return Rendered(
            files={"run.sh": script, "engine.yaml": spec.engine_yaml, **spec.file_texts},
            # the software: this machine's, as it is
            software=(f"software: this Python ({sys.executable}), rlctl {__version__}; no image",),
        )

    def submit(self, job: Job, prepared: Prepared, secrets: Mapping[str, str]) -> dict:
        root = Path(prepared.spec.paths.root)
        root.mkdir(parents=True, exist_ok=True)
        for name, content in prepared.files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)  # shipped tools/
            (root / name).write_text(content)
        log = (root / LOG).open("ab")
        env = {**os.environ, **secrets}
        proc = subprocess.Popen(
            ["bash", "-c", _RUNNER, "rlctl-job", str(root / "run.sh"), str(root / EXIT_CODE)],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the CLI; one session to signal on stop
        )
        log.close()
        return {"pid": proc.pid, "sid": proc.pid, "root": str(root), "log": str(root / LOG)}

    def status(self, job: Job) -> Observed:
        root = Path(job.handle["root"])
        exit_file = root / EXIT_CODE
        if exit_file.exists():
            text = exit_file.read_text().strip()
            code = int(text) if text.lstrip("-").isdigit() else None
            if code == 0:
                return Observed(JobState.SUCCEEDED, "exit code 0", 0)
            if code == PREEMPTED:
                return Observed(JobState.FAILED, "stopped on SIGTERM (exit code 75)", code)
            from engine.schema import exit_words

            why = f"exit code {code}, {exit_words(code)}"
            return Observed(JobState.FAILED, f"{why}: {_last_error(root / LOG)}", code)
        if _session_pids(job.handle["sid"]):
            return Observed(JobState.RUNNING)
        return Observed(JobState.FAILED, "the job's processes ended without an exit code")

    def logs(self, job: Job, follow: bool) -> Iterator[str]:
        path = Path(job.handle.get("log") or Path(job.handle["root"]) / LOG)
        yield from follow_file(path, follow, lambda: self.status(job).state.terminal)

    def stop(self, job: Job, grace_s: float) -> None:
        sid = job.handle["sid"]
        # SIGTERM to the runner's child only, the engine's supervisor: it passes it on to
        # the engine's driver, which finishes its step, saves and exits; no restart
        # follows. Its Ray workers must not get it, or the step fails.
        for pid in _session_pids(sid, parent=sid):
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while _session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal_session(sid, signal.SIGKILL)


def follow_file(path: Path, follow: bool, finished) -> Iterator[str]:
    """Lines of ``path``; with ``follow``, keep reading until ``finished()``."""
    while not path.exists():
        if not follow or finished():
            return
        time.sleep(0.2)
    with path.open("r", errors="replace") as f:
        pending = ""
        while True:
            chunk = f.readline()
            if chunk:
                pending += chunk
                if pending.endswith("\n"):
                    yield pending.rstrip("\n")
                    pending = ""
                continue
            if not follow or finished():
                rest = f.read()
                if pending or rest:
                    yield from (pending + rest).splitlines()
                return
            time.sleep(0.25)


def _last_error(log: Path, lines: int = 5) -> str:
    """The tail of the log: what a person needs to see why it failed."""
    if not log.exists():
        return "no log"
    tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " | ".join(tail[-lines:]) if tail else "empty log"


def _session_pids(sid: int, parent: int | None = None) -> list[int]:
    """Every live process of the job's session (the engine's Ray processes included:
    some of them put themselves in process groups of their own); with ``parent``,
    only its children."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) "
        state, ppid, session = fields[0], int(fields[1]), int(fields[3])
        if session == sid and state != "Z" and (parent is None or ppid == parent):
            pids.append(int(entry.name))
    return pids


def _signal_session(sid: int, sig: signal.Signals) -> None:
    for pid in _session_pids(sid):
        _kill(pid, sig)


def _kill(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.kill(pid, sig)
