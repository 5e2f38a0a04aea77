"""Peak memory per phase: what a worker records, how the controller combines workers
(the largest on accelerators, the node's sum on CPU, where the workers share its RAM), and
the one warning a phase near its limit gets."""

import torch

from engine.memory_peaks import GIB, PhasePeaks, near_limit, peak_metrics


def test_a_phase_records_the_process_peak_and_take_resets():
    peaks = PhasePeaks("cpu")
    with peaks.phase("actor.update"):
        big = torch.ones(64 * 2**20 // 4)  # 64 MiB held inside the phase
        del big
    report = peaks.take()
    assert report["device"] == "cpu" and report["limit"] > 0
    assert report["peaks"]["actor.update"] >= 64 * 2**20
    assert peaks.take()["peaks"] == {}


def _report(node, device, limit_gib, **peaks_gib):
    peaks = {k.replace("_", "."): int(v * GIB) for k, v in peaks_gib.items()}
    return {"peaks": peaks, "limit": int(limit_gib * GIB), "node": node, "device": device}


def test_accelerator_peaks_are_the_largest_worker():
    reports = [
        _report("a", "cuda", 80, actor_update=50, rollout_generate=70),
        _report("b", "cuda", 80, actor_update=60),
    ]
    m = peak_metrics(reports)
    assert m == {
        "memory/peak_gib/actor.update": 60.0,
        "memory/peak_gib/rollout.generate": 70.0,
        "memory/limit_gib": 80.0,
    }


def test_cpu_peaks_add_up_per_node():
    reports = [
        _report("a", "cpu", 24, actor_update=5),
        _report("a", "cpu", 24, actor_update=6),
        _report("b", "cpu", 24, actor_update=8),
    ]
    assert peak_metrics(reports)["memory/peak_gib/actor.update"] == 11.0


def test_a_phase_near_its_limit_is_told_once():
    told: set[str] = set()
    m = {"memory/peak_gib/actor.update": 75.0, "memory/peak_gib/ref.log_probs": 10.0}
    m["memory/limit_gib"] = 80.0
    (line,) = near_limit(m, told)
    assert line.startswith("memory: actor.update peaked at 75.0 GiB of 80.0 GiB (94%)")
    assert "micro-batch" in line and "rlctl plan" in line
    assert near_limit(m, told) == []
