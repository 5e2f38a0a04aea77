"""The job's Python on a node: the shipped rlctl wheel over the image's own packages.

Run on every node before Ray starts, with the image's Python, straight from the wheel
(a pure-Python wheel is importable as a zip; this module uses the standard library only):

    PYTHONPATH=/job/rlctl-X-py3-none-any.whl python3 -m rlctl.node.jobenv /job/env /job/rlctl-X.whl \\
        --extras engine,megatron

It makes ``/job/env``, a virtual environment whose own site-packages hold the wheel (so
the job runs exactly the rlctl it was launched from, whatever rlctl the image or the
site has) and which sees the image's packages behind it (torch, vLLM, Ray: a ``.pth``
file adds the base Python's site directories after its own). The extras' requirements
that the image already satisfies are left alone; pip installs only what is missing, into
the job's environment, never into the image's. ``env/bin/ray`` starts Ray with this
Python, so Ray's workers import the same rlctl as the driver.

An environment made from the same wheel is kept (a requeued or recovered job on the
same node starts at once); a different wheel rebuilds it. Nodes that share the job's
directory (a shared file system; the "nodes" of one host in the tests) make it one at a
time under a lock beside it, and the later ones keep what the first made.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Iterator
from pathlib import Path

MARKER = ".rlctl-wheel-sha256"
_BASE_PTH = "_rlctl_base.pth"


def env_python(env: Path) -> Path:
    return env / "bin" / "python"


def base_site_dirs() -> list[str]:
    """The site directories of the Python running this (the image's), in its order."""
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def child_env(wheel: Path) -> dict[str, str]:
    """This process's environment without the wheel on PYTHONPATH (it is there only to
    run this module): the environment's Python must import the installed copy."""
    env = dict(os.environ)
    kept = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p) != wheel]
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        env.pop("PYTHONPATH", None)
    return env


@contextlib.contextmanager
def locked(env: Path) -> Iterator[None]:
    """Held while ``env`` is made or checked: an exclusive lock on a file beside it
    (released by the kernel if this process dies)."""
    env.parent.mkdir(parents=True, exist_ok=True)
    with open(env.parent / f".{env.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def make_env(env: Path, wheel: Path, extras: list[str], pip_args: list[str]) -> bool:
    """Make (or keep) the job's environment; True when it was (re)built."""
    with locked(env):
        return _make_env(env, wheel, extras, pip_args)


def _make_env(env: Path, wheel: Path, extras: list[str], pip_args: list[str]) -> bool:
    run_env = child_env(wheel)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    marker = env / MARKER
    if marker.is_file() and marker.read_text().strip() == digest and env_python(env).exists():
        return False
    if env.exists():
        shutil.rmtree(env)
    venv.EnvBuilder(system_site_packages=False, with_pip=False, symlinks=True).create(env)
    python = str(env_python(env))
    own_site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True, env=run_env,
    ).stdout.strip()  # fmt: skip
    # After the environment's own site-packages: the image's (and their .pth files).
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in base_site_dirs())
    Path(own_site, _BASE_PTH).write_text(lines)
    pip = [
        python,
        "-m",
        "pip",
        "-q",
        "--disable-pip-version-check",
        "install",
        "--no-input",
        *pip_args,
    ]
    wanted = f"{wheel}[{','.join(extras)}]" if extras else str(wheel)
    # The extras' requirements the image lacks (satisfied ones are left alone), then
    # the wheel itself into the environment, even where the image has an rlctl of the
    # same version number.
    subprocess.run([*pip, wanted], check=True, env=run_env)
    subprocess.run([*pip, "--no-deps", "--force-reinstall", str(wheel)], check=True, env=run_env)
    ray = env / "bin" / "ray"
    ray.write_text(
        f"#!{python}\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n"
    )
    ray.chmod(0o755)
    marker.write_text(digest + "\n")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlctl.node.jobenv", description=__doc__)
    parser.add_argument("env", type=Path, help="the environment's directory")
    parser.add_argument("wheel", type=Path, help="the rlctl wheel shipped with the job")
    parser.add_argument("--extras", default="", help="rlctl extras, comma-separated")
    parser.add_argument("--pip-arg", action="append", default=[], help="one more pip option")
    args = parser.parse_args(argv)
    if not args.wheel.is_file():
        print(f"rlctl: the job's wheel {args.wheel} is missing", file=sys.stderr)
        return 2
    extras = [e for e in args.extras.split(",") if e]
    try:
        built = make_env(args.env.resolve(), args.wheel.resolve(), extras, args.pip_arg)
    except subprocess.CalledProcessError as exc:
        print(f"rlctl: installing the job's Python failed: {exc}", file=sys.stderr)
        return 1
    check = subprocess.run(
        [str(env_python(args.env)), "-c", "import rlctl, engine; print(rlctl.__version__, engine.__file__)"],
        capture_output=True, text=True, env=child_env(args.wheel.resolve()), cwd=args.env,
    )  # fmt: skip
    if check.returncode != 0:
        print(f"rlctl: the job's Python cannot import rlctl:\n{check.stderr}", file=sys.stderr)
        return 1
    version, where = check.stdout.split()
    state = "installed" if built else "kept"
    print(
        f"rlctl: job environment {state}: rlctl {version} from {where}"
        f" over {sys.executable} (Python {sysconfig.get_python_version()})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
