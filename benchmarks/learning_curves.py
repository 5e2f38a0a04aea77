"""The learning curves the docs quote, each step's figures printed: the CPU quickstart
(docs/quickstart.md) and the tool task (docs/agents.md), with the tool task's two broken
variants beside it: a tool that answers a neighbouring digit, and the multi-turn mask
dropped (the tool's tokens in the losses).

    .venv/bin/python benchmarks/learning_curves.py                     # all four runs
    .venv/bin/python benchmarks/learning_curves.py --only quickstart   # one of them

Each run is ``python -m engine.main`` in a process of its own (the quickstart through
``scripts/quickstart.sh`` itself), with the overrides the docs give; the tool task's runs
start from the same warm-started tiny model. The machine's own noise changes the seconds
and not the scores: the runs are seeded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = ("quickstart", "tool", "tool-wrong-answer", "tool-mask-dropped")

# The tool task as docs/agents.md runs it (its command, at its 20 steps).
TOOL_STEPS = 20
BROKEN_STEPS = 10
WRONG_TOOL = """\
from engine.data.secret import tool_answer


def secret(*, value):
    return tool_answer(str((int(value) + 1) % 10))  # a neighbour of the secret
"""
# engine.main with the multi-turn mask dropped where the trainer builds its batch: every
# response token, the tool's included, counts in the losses.
MASK_DROPPED = """\
import runpy
import sys

import engine.loop.generate


def generate(self, *args, _original=engine.loop.generate.Generator.generate, **kwargs):
    rollout = _original(self, *args, **kwargs)
    rollout.response_masks = None
    return rollout


engine.loop.generate.Generator.generate = generate
if __name__ == "__main__":  # the reward workers spawn and import this file again
    sys.argv = ["engine.main", *sys.argv[1:]]
    runpy.run_module("engine.main", run_name="__main__")
"""


def tool_overrides(model: Path, data: Path, tools: Path, run: Path, steps: int) -> list[str]:
    return [
        "algorithm.adv_estimator=grpo",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=2",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'val.parquet'}",
        "data.max_prompt_length=192",
        "data.max_response_length=96",
        "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.optim.lr=2e-4",
        "reward_model.num_workers=1",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={run}",
    ]


def run(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:3])} ... failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "critic/score/mean" in r]


def validation(run_dir: Path) -> str:
    """Each validation's mean score by the step it followed (0: before training)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    scores = {r.get("step", 0): r["val/score/mean"] for r in map(json.loads, lines)
              if "val/score/mean" in r}  # fmt: skip
    return ", ".join(f"{step}: {score:.2f}" for step, score in sorted(scores.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", choices=RUNS, action="append", help="these runs (default: all)")
    p.add_argument("--workdir", default=None, help="keep models, data and runs here")
    p.add_argument("--out", default=None, help="also write the printed report here")
    args = p.parse_args()
    chosen = args.only or list(RUNS)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="curves"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    py = sys.executable
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    lines = [
        f"learning curves, {time.strftime('%Y-%m-%d')}, commit {commit}, python"
        f" {platform.python_version()}, {os.cpu_count()} CPUs ({platform.processor() or '?'})"
    ]
    curves: dict[str, tuple[list[dict], float]] = {}
    validations: dict[str, str] = {}
    if "quickstart" in chosen:
        out = work / "quickstart"
        env_q = {**env, "QUICKSTART_DIR": str(out), "PATH": f"{Path(py).parent}:{env['PATH']}"}
        wall = run(["bash", "scripts/quickstart.sh", "trainer.logger=[console]"], env_q)
        curves["quickstart"] = (records(out / "run"), wall)
        validations["quickstart"] = validation(out / "run")
    tool_runs = [r for r in chosen if r.startswith("tool")]
    if tool_runs:
        base, warm, data = work / "tool/base", work / "tool/warm", work / "tool/data"
        if not (warm / "config.json").exists():
            run([py, "-m", "engine.models.tiny", str(base)], env)
            run([py, "-m", "engine.data.prepare", "secret", "--out", str(data)], env)
            run([py, "-m", "engine.warmup.secret", "--model", str(base), "--out",
                 str(warm)], env)  # fmt: skip
        for name in tool_runs:
            run_dir, tools, main_args = work / name, data / "tools.yaml", ["-m", "engine.main"]
            steps = TOOL_STEPS if name == "tool" else BROKEN_STEPS
            if name == "tool-wrong-answer":
                folder = work / "wrong-tool"
                folder.mkdir(exist_ok=True)
                (folder / "secret_tool.py").write_text(WRONG_TOOL)
                tools = folder / "tools.yaml"
                tools.write_text((data / "tools.yaml").read_text())
            if name == "tool-mask-dropped":
                script = work / "mask_dropped.py"
                script.write_text(MASK_DROPPED)
                main_args = [str(script)]
            cmd = [py, *main_args, *tool_overrides(warm, data, tools, run_dir, steps)]
            wall = run(cmd, env)
            curves[name] = (records(run_dir), wall)
    for name, (recs, wall) in curves.items():
        lines += ["", f"{name}: {len(recs)} steps, {wall:.0f} s from the command to its end"]
        if validations.get(name):
            lines.append(f"validation score by step: {validations[name]}")
        lines.append("step  score   tool-call rate   step s")
        for r in recs:
            calls = r.get("agent/tool_call_rate")
            rate = f"{calls:14.2f}" if calls is not None else f"{'-':>14}"
            lines.append(
                f"{r['step']:4d}  {r['critic/score/mean']:5.2f}  {rate}   "
                f"{r.get('timing_s/step', float('nan')):6.2f}"
            )
    report = "\n".join(lines)
    print(report)
    if args.out:
        Path(args.out).write_text(report + "\n")


if __name__ == "__main__":
    main()
