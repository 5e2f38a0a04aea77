#!/usr/bin/env python3
"""How many of verl's example launch scripts the engine accepts unchanged (issues 29, 33).

    scripts/verl_examples_check.py VERL_REPO_DIR [--rev REV] [--show N] [--json FILE]
    scripts/verl_examples_check.py VERL_REPO_DIR --trainer sft

Finds every shell script under ``examples/`` that runs ``python -m
verl.trainer.main_ppo``, builds the argument list the script would pass (its own
defaults for every variable, no arguments of its own, continuation lines, arrays and
``case`` branches as bash evaluates them), runs ``python -m engine.main --check`` with
exactly those arguments, and reports the scripts accepted, refused (with their first
problems) and crashed, and the distinct unknown keys with how many scripts use each.

``--trainer sft``: the scripts that run verl's SFT trainer (``verl.trainer.sft_trainer``,
launched by ``torchrun``), checked with ``python -m engine.sft --check``. A script whose
usage asks for ``<nproc_per_node> <save_path>`` is given ``8`` and a folder. verl's SFT
takes its world from torchrun's ``--nnodes`` and ``--nproc_per_node``, this engine from
``trainer.nnodes`` and ``trainer.n_gpus_per_node``: the check adds those two keys with
torchrun's values (where they are numbers and the script did not set the keys itself),
as a user moving the script over writes them, and says so for each script.

VERL_REPO_DIR is a checkout (its ``examples/`` is read) or a git directory (a bare
mirror: ``REV``'s tree is extracted, HEAD by default).

    scripts/verl_examples_check.py VERL_REPO_DIR --run grpo_trainer/run_qwen3_8b_fsdp.sh \
        --env VERL_USE_UV=0 [--steps 2] [--keep DIR]

runs one script's arguments for real on this machine's CPU: the engine trains with
them all, but for what a CPU run must replace (``RUN_ON_CPU``: a tiny model from
``engine.models.tiny``, synthetic data from ``engine.data.synthetic``, two CPU workers,
small batches and lengths, a few steps, the console logger) and prints what it replaced.

How the arguments are captured: bash itself runs each script, so that every expansion is
the script's own, but in a sandbox where nothing else runs. ``python``, ``python3`` and
``uv`` are shell functions: the call that names ``-m verl.trainer.main_ppo`` writes its
arguments to a file and ends the script; any other Python call (a probe such as ``python3
-c 'import torch_npu'``) fails, as on a machine without that library. ``PATH`` holds only
text tools (date, dirname, awk, ...); any other command is not found and does nothing
(bash's ``command_not_found_handle``), and ``mkdir``, ``tee`` and ``ulimit`` are no-ops.
The environment is empty but for ``HOME`` (a temporary folder) and ``PATH``, so each
script uses its own defaults; it runs in a temporary copy of the tree.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Trainer:
    """One of verl's trainers: its module, and this engine's command for it."""

    module: str
    engine: str

    def called_by(self, text: str) -> bool:
        return re.search(rf"{re.escape(self.module)}\b", text) is not None


TRAINERS = {
    "ppo": Trainer("verl.trainer.main_ppo", "engine.main"),
    "sft": Trainer("verl.trainer.sft_trainer", "engine.sft"),
}
MODULE = TRAINERS["ppo"].module
# What a script that wants positional arguments (verl's SFT scripts) is given.
USAGE = re.compile(r"Usage: .*<nproc_per_node> <save_path>")
POSITIONAL = ("8", "{home}/checkpoints")
# Tools a script may use to build its arguments; anything else is "not found".
TEXT_TOOLS = [
    "awk",
    "basename",
    "cat",
    "cut",
    "date",
    "dirname",
    "echo",
    "env",
    "expr",
    "grep",
    "head",
    "printf",
    "pwd",
    "readlink",
    "realpath",
    "sed",
    "seq",
    "sort",
    "tail",
    "tr",
    "true",
    "false",
    "uname",
    "wc",
]
# Variables a few scripts read without a default of their own (``set -u`` stops them, or
# ``${X:?}``): set, for that script only, to the value the other scripts default to, or
# to a path under the temporary HOME.
NEEDED_ENV = {
    "INFER_BACKEND": "vllm",
    "HDFS_ROOT": "{home}/hdfs",
    "DATA_ROOT": "{home}/data",
    "RAY_DATA_HOME": "{home}/verl",
    "MODEL_PATH": "{home}/models/model",
    "LORA_ADAPTER_PATH": "{home}/lora_adapter",
    "ckpts_home": "{home}/checkpoints",
}
UNSET = re.compile(r"line \d+: ([A-Za-z_][A-Za-z_0-9]*): ")
SCRIPT_TIMEOUT_S = 30
CHECK_TIMEOUT_S = 120

# The module is found as ``-m MODULE`` or as a launcher's argument (``-m verl_mlite.launch
# MODULE``); what comes before it (torchrun's flags) is written too, before __ARGS__.
SHIMS = r"""
__capture() {
    local arg
    for arg in "$@"; do
        if [ "$arg" = "__MODULE__" ]; then
            shift_to_module "$@"
            return 0
        fi
    done
    # Any other Python: a probe for a library this sandbox does not have.
    for arg in "$@"; do [ "$arg" = "-c" ] && return 1; done
    return 0
}
shift_to_module() {
    local before=()
    while [ "$#" -gt 0 ]; do
        if [ "$1" = "__MODULE__" ]; then shift; break; fi
        before+=("$1")
        shift
    done
    [ -s "$VX_CAPTURE" ] || printf '%s\0' "__CALL__" "${before[@]}" "__ARGS__" "$@" > "$VX_CAPTURE"
    exit 0
}
python() { __capture "$@"; }
python3() { __capture "$@"; }
uv() { __capture "$@"; }
torchrun() { __capture "$@"; }
mkdir() { :; }
tee() { cat > /dev/null; }
ulimit() { :; }
command_not_found_handle() { echo "verl_examples_check: skipped command: $*" >&2; return 0; }
"""


@dataclass
class Result:
    script: str
    status: str  # accepted | refused | crashed | not-captured
    args: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    detail: str = ""
    env: dict[str, str] = field(default_factory=dict)  # NEEDED_ENV values it was given
    added: list[str] = field(default_factory=list)  # keys the check added (torchrun's world)
    positional: list[str] = field(default_factory=list)  # the script's "$@", its usage's


@dataclass
class Captured:
    """A script's call of verl's trainer: its arguments, what came before the module (a
    launcher's flags: torchrun's), the NEEDED_ENV values and positional arguments it got."""

    args: list[str]
    launcher: list[str]
    env: dict[str, str]
    positional: tuple[str, ...] = ()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("verl_repo_dir", type=Path)
    parser.add_argument("--rev", default="HEAD", help="for a git directory: the revision")
    parser.add_argument("--show", type=int, default=3, help="problems shown per script")
    parser.add_argument("--json", type=Path, help="write every result to this file")
    parser.add_argument("--only", help="check only scripts whose path contains this")
    parser.add_argument(
        "--trainer", choices=TRAINERS, default="ppo",
        help="whose scripts: verl's PPO trainer (main_ppo) or its SFT trainer (sft_trainer)",
    )  # fmt: skip
    parser.add_argument("--run", metavar="SCRIPT", help="train with this script's arguments on CPU")
    parser.add_argument("--steps", type=int, default=2, help="--run: training steps")
    parser.add_argument("--keep", type=Path, help="--run: the folder for the model, data, run")
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE",
        help="a variable the scripts see (their own knobs, e.g. VERL_USE_UV=0)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    given_env = dict(item.split("=", 1) for item in args.env)
    trainer = TRAINERS[args.trainer]
    if args.run:
        if args.trainer != "ppo":
            print("--run trains with main_ppo scripts only", file=sys.stderr)
            return 2
        return run_on_cpu(args.verl_repo_dir, args.rev, args.run, given_env, args.steps, args.keep)

    with tempfile.TemporaryDirectory(prefix="verl_examples_") as tmp:
        root = _tree(args.verl_repo_dir, args.rev, Path(tmp) / "verl")
        scripts = sorted(
            p
            for p in (root / "examples").rglob("*.sh")
            if trainer.called_by(p.read_text(errors="replace"))
        )
        if args.only:
            scripts = [p for p in scripts if args.only in str(p)]
        sandbox = _sandbox(Path(tmp), trainer)
        results = []
        for script in scripts:
            name = str(script.relative_to(root))
            captured = capture(script, root, sandbox, given_env)
            if isinstance(captured, str):
                results.append(Result(name, "not-captured", detail=captured))
                continue
            added = world_from_launcher(captured) if trainer.module != MODULE else []
            result = check(name, [*captured.args, *added], root, trainer)
            result.env, result.added = captured.env, added
            result.positional = list(captured.positional)
            results.append(result)
    report(results, args.show, trainer)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in results], indent=1))
    return 0


def _tree(source: Path, rev: str, dest: Path) -> Path:
    """A copy of the repository's examples (and configs) to run the scripts in."""
    if (source / "examples").is_dir():
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        return dest
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", f"--git-dir={source}", "archive", rev, "examples", "verl/trainer/config"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _sandbox(tmp: Path, trainer: Trainer = TRAINERS["ppo"]) -> dict[str, Path]:
    bin_dir, home = tmp / "bin", tmp / "home"
    bin_dir.mkdir()
    home.mkdir()
    for tool in TEXT_TOOLS:
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    shims = tmp / "shims.sh"
    shims.write_text(SHIMS.replace("__MODULE__", trainer.module))
    return {"bin": bin_dir, "home": home, "shims": shims}


def capture(
    script: Path, root: Path, sandbox: dict[str, Path], given: dict[str, str] | None = None
) -> Captured | str:
    """The arguments the script passes to verl's trainer module (and the variables of
    ``NEEDED_ENV`` it needed, the positional arguments its usage asked for), or why
    there are none."""
    home = str(sandbox["home"])
    extra: dict[str, str] = dict(given or {})
    positional: tuple[str, ...] = ()
    while True:
        result = _run_script(script, root, sandbox, extra, positional)
        if isinstance(result, Captured):
            result.env, result.positional = extra, positional
            return result
        if isinstance(result, str):
            return result
        output, why = result
        unset = UNSET.findall(output)
        name = unset[-1] if unset else None
        if name in NEEDED_ENV and name not in extra:
            extra[name] = NEEDED_ENV[name].format(home=home)
            continue
        if not positional and USAGE.search(output):
            positional = tuple(a.format(home=home) for a in POSITIONAL)
            continue
        return why


def _run_script(
    script: Path,
    root: Path,
    sandbox: dict[str, Path],
    extra: dict[str, str],
    positional: tuple[str, ...] = (),
) -> Captured | str | tuple[str, str]:
    out = sandbox["home"].parent / "capture.bin"
    out.unlink(missing_ok=True)
    bash = shutil.which("bash") or "/bin/bash"
    env = {"HOME": str(sandbox["home"]), "PATH": str(sandbox["bin"]), "VX_CAPTURE": str(out)}
    env.update(extra)
    # The script is sourced by a bash that defined the shims first, with ``positional``
    # as its "$@" (none, unless its usage asked for them).
    runner = f'. "{sandbox["shims"]}"; . "$0" "$@"'
    try:
        proc = subprocess.run(
            [bash, "--noprofile", "--norc", "-c", runner, str(script), *positional],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=SCRIPT_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return f"the script ran past {SCRIPT_TIMEOUT_S} s without calling verl's trainer"
    if not out.exists() or not out.stat().st_size:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        why = f"verl's trainer was never called (exit {proc.returncode}): {tail}"
        return proc.stdout + proc.stderr, why
    call = out.read_bytes().decode().split("\0")[:-1]
    assert call[0] == "__CALL__", call[:1]
    split = call.index("__ARGS__")
    return Captured(call[split + 1 :], call[1:split], {})


def world_from_launcher(captured: Captured) -> list[str]:
    """``trainer.nnodes`` and ``trainer.n_gpus_per_node`` from torchrun's ``--nnodes``
    and ``--nproc_per_node`` (either spelling), where they are whole numbers and the
    script's arguments do not set the keys themselves."""
    flags: dict[str, str] = {}
    words = iter(captured.launcher)
    for word in words:
        name, eq, value = word.partition("=")
        if name in ("--nnodes", "--nproc_per_node", "--nproc-per-node"):
            flags[name.replace("-", "_").lstrip("_")] = value if eq else next(words, "")
    given = {a.split("=", 1)[0].lstrip("+~") for a in captured.args}
    out = []
    for flag, key in (("nnodes", "trainer.nnodes"), ("nproc_per_node", "trainer.n_gpus_per_node")):
        value = flags.get(flag, "")
        if value.isdigit() and key not in given:
            out.append(f"{key}={value}")
    return out


def check(name: str, args: list[str], root: Path, trainer: Trainer = TRAINERS["ppo"]) -> Result:
    """``python -m engine.main --check`` (or the trainer's command) with the script's
    arguments, from verl's root."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
    env.pop("ENGINE_DEBUG", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", trainer.engine, "--check", *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return Result(name, "crashed", args, detail=f"--check ran past {CHECK_TIMEOUT_S} s")
    if proc.returncode == 0:
        return Result(name, "accepted", args, detail=proc.stderr.strip())
    if proc.returncode == 2 and "Traceback" not in proc.stderr:
        return Result(name, "refused", args, problems=_problems(proc.stderr))
    tail = "\n".join(proc.stderr.strip().splitlines()[-3:])
    return Result(name, "crashed", args, detail=f"exit {proc.returncode}: {tail}")


def _problems(stderr: str) -> list[str]:
    lines = [line.strip() for line in stderr.strip().splitlines()]
    listed = [line[2:] for line in lines if line.startswith("- ")]
    if listed:
        return listed
    return [line.removeprefix("error: ").removeprefix("invalid engine config: ") for line in lines]


UNKNOWN = re.compile(r"unknown key '([^']+)'")


def report(results: list[Result], show: int, trainer: Trainer = TRAINERS["ppo"]) -> None:
    by_status = collections.Counter(r.status for r in results)
    total = len(results)
    accepted = by_status["accepted"]
    print(f"verl example scripts calling {trainer.module}: {total}")
    print(
        f"  accepted {accepted} ({100 * accepted / max(total, 1):.0f}%), refused"
        f" {by_status['refused']}, crashed {by_status['crashed']}, not captured"
        f" {by_status['not-captured']}"
    )
    for r in results:
        if r.status == "refused":
            print(f"\nREFUSED  {r.script}")
            for problem in r.problems[:show]:
                print(f"    {problem}")
            if len(r.problems) > show:
                print(f"    ... and {len(r.problems) - show} more")
        elif r.status != "accepted":
            print(f"\n{r.status.upper()}  {r.script}\n    {r.detail}")
    given = [r for r in results if r.positional]
    if given:
        print("\nscripts given the positional arguments their usage asks for:")
        for r in given:
            print(f"  {r.script}: {' '.join(r.positional)}")
    added = [r for r in results if r.added]
    if added:
        print("\nkeys added from torchrun's flags (verl's world is torchrun's, here these keys'):")
        for r in added:
            print(f"  {r.script}: {' '.join(r.added)}")
    needed = [r for r in results if r.env]
    if needed:
        print("\nscripts that read a variable they give no default (set for them alone):")
        for r in needed:
            print(f"  {r.script}: {', '.join(sorted(r.env))}")
    unknown = collections.Counter(
        key for r in results for key in {m for p in r.problems for m in UNKNOWN.findall(p)}
    )
    if unknown:
        print(f"\ndistinct unknown keys: {len(unknown)} (scripts using each)")
        for key, count in unknown.most_common():
            print(f"  {count:3d}  {key}")
    print(f"\nSUMMARY accepted={accepted}/{total} crashed={by_status['crashed']}")


# --run: what a CPU run replaces in a script's arguments (a key the script does not set is
# added): the model and data, the devices, the sizes a CPU trains in minutes, the loggers.
RUN_ON_CPU = {
    "trainer.device": "cpu",
    "trainer.nnodes": "1",
    "trainer.n_gpus_per_node": "2",
    "data.train_batch_size": "8",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "4",
    "data.max_prompt_length": "64",
    "data.max_response_length": "16",
    "trainer.logger": "[console]",
    "reward_model.num_workers": "1",
}


def run_on_cpu(
    source: Path, rev: str, wanted: str, env: dict[str, str], steps: int, keep: Path | None
) -> int:
    """Train with one script's arguments on this CPU (``RUN_ON_CPU``)."""
    with tempfile.TemporaryDirectory(prefix="verl_run_") as tmp:
        work = keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        root = _tree(source, rev, work / "verl") if not (work / "verl").exists() else work / "verl"
        scripts = [p for p in (root / "examples").rglob("*.sh") if wanted in str(p)]
        if len(scripts) != 1:
            print(f"--run {wanted}: {len(scripts)} scripts match; name one", file=sys.stderr)
            return 2
        sandbox = _sandbox(Path(tempfile.mkdtemp(prefix="sandbox", dir=work)))
        captured = capture(scripts[0], root, sandbox, env)
        if isinstance(captured, str):
            print(captured, file=sys.stderr)
            return 2
        args = captured.args
        model, (train, val) = _tiny_model_and_data(work)
        replace = {
            **RUN_ON_CPU,
            "actor_rollout_ref.model.path": str(model),
            "data.train_files": str(train),
            "data.val_files": str(val),
            "trainer.total_training_steps": str(steps),
            "trainer.default_local_dir": str(work / "run"),
        }
        kept, replaced = [], []
        for arg in args:
            key = arg.split("=", 1)[0].lstrip("+~")
            if key in replace:
                replaced.append(f"{arg}  ->  {key}={replace.pop(key)}")
            else:
                kept.append(arg)
        added = [f"{key}={value}" for key, value in replace.items()]
        final = kept + [r.split("  ->  ")[1] for r in replaced] + added
        print(f"{scripts[0].relative_to(root)}: {len(args)} arguments, {len(kept)} kept as is")
        print("replaced for a CPU run:\n  " + "\n  ".join(replaced))
        print("added:\n  " + "\n  ".join(added))
        cmd = [sys.executable, "-m", "engine.main", *final]
        print("running: python -m engine.main " + " ".join(final), flush=True)
        env_vars = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1")
        return subprocess.run(cmd, cwd=work, env=env_vars).returncode


def _tiny_model_and_data(work: Path) -> tuple[Path, tuple[Path, Path]]:
    sys.path.insert(0, str(REPO))
    from engine.data.synthetic import write_synthetic_dataset
    from engine.models.tiny import build_tiny_model

    model = work / "tiny_model"
    if not (model / "config.json").exists():
        build_tiny_model(model)
    return model, write_synthetic_dataset(work / "data", n_train=64, n_val=8)


if __name__ == "__main__":
    sys.exit(main())
