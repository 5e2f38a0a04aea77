"""The GPU proof's results as text (``benchmarks/gpu_proof.py`` writes it beside its JSON):
the machine on the first line, then one table of phases per case and the plan-vs-measured
ratios."""

from __future__ import annotations

from typing import Any


def _f(x: Any, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _ratio(measured: float | None, planned: float | None) -> str:
    if measured is None or not planned:
        return "n/a"
    return f"{measured / planned:.2f}"


def render_report(results: dict[str, Any]) -> str:
    info = results["machine"]
    shape = results["shape"]
    lines = [
        f"{info.get('device')}, torch {info.get('torch')} (CUDA {info.get('cuda', '-')}),"
        f" transformers {info.get('transformers')}, peft {info.get('peft')}, python"
        f" {info.get('python')}, {info.get('cpus')} CPUs; {info.get('date')}",
        f"planner accelerator {results['accelerator']} (dense bf16 peak"
        f" {results['bf16_peak_tflops']:g} TFLOP/s); {shape['prompts']} prompts ×"
        f" {shape['n']} samples, {shape['prompt_len']} + {shape['response_len']} tokens each;"
        f" world size 1, FSDP2, HF rollout; {'DRY MODE (CPU, small shapes)' if results['dry'] else 'bf16 compute'}",
        "",
        "case           phase      seconds   tokens/s   TFLOP/s   MFU    peak alloc  reserved"
        "  planner  alloc/planner",
    ]
    ratios: list[str] = []
    for case in results["cases"]:
        name = f"{case['model']}/{case['variant']}"
        if "error" in case:
            last = case["error"].strip().splitlines()[-1]
            lines.append(f"{name:14} FAILED: {last}")
            continue
        for phase, m in case["phases"].items():
            plan = m.get("plan_gib")
            lines.append(
                f"{name:14} {phase:9} {m['seconds']:8.2f} {m['tokens_per_s']:10.0f}"
                f" {_f(m.get('tflops'), '9.1f') if 'tflops' in m else ' ' * 9}"
                f" {_f(m.get('mfu'), '6.3f') if 'mfu' in m else ' ' * 6}"
                f" {_f(m['peak_allocated_gib'], '9.2f')} GiB {_f(m['peak_reserved_gib'], '7.2f')}"
                f" {_f(plan, '8.2f') if plan is not None else '       -'}"
                f"  {_ratio(m['peak_allocated_gib'], plan) if plan is not None else '-'}"
            )
            if plan is not None and m["peak_allocated_gib"] is not None:
                ratios.append(
                    f"{name} {phase}: measured/planned {_ratio(m['peak_allocated_gib'], plan)}"
                )
        extra = [f"start {case['start_s']:.1f} s", f"trainable {case['trainable_params']:,}"]
        if "logp_max_abs_diff_vs_first" in case:
            extra.append(
                f"π_old vs the first case's max|Δ| {case['logp_max_abs_diff_vs_first']:.3g}"
            )
        update = case["phases"].get("update", {})
        if update:
            extra.append(f"weights changed {update['weights_changed']}")
            extra.append(f"grad norms {', '.join(_f(g, '.3g') for g in update['grad_norm'])}")
        lines.append(f"{'':14} " + "; ".join(extra))
    if ratios:
        lines += ["", "plan vs measured (peak allocated / the planner's estimate):", *ratios]
    engine = results.get("engine")
    if engine:
        lines += ["", "whole engine (python -m engine.main, GRPO, the first model):"]
        if "skipped" in engine:
            lines.append(f"  skipped: {engine['skipped']}")
        else:
            state = "ok" if engine["returncode"] == 0 else f"FAILED (exit {engine['returncode']})"
            kind = "--check" if engine["check_only"] else "run"
            lines.append(f"  {kind} {state} in {engine['wall_s']:.0f} s")
            for step in engine.get("steps", []):
                lines.append("  " + ", ".join(f"{k} {_f(v, '.4g')}" for k, v in step.items()
                                              if v is not None))  # fmt: skip
            if engine["returncode"] != 0:
                lines += ["  " + line for line in engine["stderr_tail"].splitlines()[-15:]]
    if results["skipped"]:
        lines += ["", f"skipped (time budget): {', '.join(results['skipped'])}"]
    lines.append(f"\nwall {results.get('wall_s', 0):.0f} s")
    return "\n".join(lines) + "\n"
