"""rlctl/hardware.py: the accelerator table, name matching and NAME[:COUNT] specs."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl import hardware
from rlctl.errors import AcceleratorSpecError, RlctlError, UnknownAcceleratorError
from rlctl.hardware import (
    ACCELERATORS,
    Accelerator,
    by_vendor,
    get_accelerator,
    known_names,
    parse_accelerator_spec,
)

REPO = Path(__file__).resolve().parents[2]

# What each vendor's software stack must look like (also checked against engine/device.py).
STACK = {
    "nvidia": dict(
        ray_resource="GPU",
        visible_devices_var="CUDA_VISIBLE_DEVICES",
        collective_backend="nccl",
        torch_backend="nccl",
        torch_device="cuda",
        gres_name="gpu",
    ),
    "amd": dict(
        ray_resource="GPU",
        visible_devices_var="HIP_VISIBLE_DEVICES",
        collective_backend="rccl",
        torch_backend="nccl",
        torch_device="cuda",
        gres_name="gpu",
    ),
    "ascend": dict(
        ray_resource="NPU",
        visible_devices_var="ASCEND_RT_VISIBLE_DEVICES",
        collective_backend="hccl",
        torch_backend="hccl",
        torch_device="npu",
        gres_name="npu",
    ),
}
# engine/device.py's DEVICES key for each vendor.
ENGINE_DEVICE_KEY = {"nvidia": "cuda", "amd": "rocm", "ascend": "npu"}

REQUIRED = {
    "H100",
    "H200",
    "A100-40GB",
    "A100-80GB",
    "L40S",
    "L4",
    "B200",
    "MI300X",
    "Ascend910B",
}

ids = [acc.name for acc in ACCELERATORS]


def test_required_accelerators_are_in_the_table():
    names = set(known_names())
    assert names >= REQUIRED
    assert names & {"MI250", "MI250X"}
    assert known_names() == tuple(acc.name for acc in ACCELERATORS)


@pytest.mark.parametrize("acc", ACCELERATORS, ids=ids)
def test_vendor_stack_is_consistent(acc: Accelerator):
    want = STACK[acc.vendor]
    assert acc.ray_resource == want["ray_resource"]
    assert acc.visible_devices_var == want["visible_devices_var"]
    assert acc.collective_backend == want["collective_backend"]
    assert acc.torch_backend == want["torch_backend"]
    assert acc.torch_device == want["torch_device"]
    assert acc.slurm_gres_name == want["gres_name"]


@pytest.mark.parametrize("acc", ACCELERATORS, ids=ids)
def test_figures_are_plausible(acc: Accelerator):
    # One device: from a 24 GB L4 to a 256 GB MI325X; dense bf16 from ~100 TFLOPS to a
    # few PFLOPS. A sparse figure or a whole-module figure would push these out.
    assert 16 <= acc.memory_gib <= 288
    assert 100 <= acc.bf16_tflops <= 2500
    assert acc.source, "every row names where its figures come from"
    assert acc.interconnect


def test_known_figures():
    # Datasheet values (dense bf16): a regression here is a wrong fact, not a style issue.
    figures = {
        "H100": (80, 989),
        "H200": (141, 989),
        "A100-80GB": (80, 312),
        "A100-40GB": (40, 312),
        "L40S": (48, 362),
        "L4": (24, 121),
        "B200": (180, 2250),
        "MI300X": (192, 1307.4),
    }
    for name, (mem, tflops) in figures.items():
        acc = get_accelerator(name)
        assert (acc.memory_gib, acc.bf16_tflops) == (mem, tflops), name


def test_mi250_rows_describe_one_die():
    # ROCm shows each of the two dies as a device; half of the 128 GB module.
    for name in ("MI250X", "MI250"):
        if name in known_names():
            assert get_accelerator(name).memory_gib == 64


@pytest.mark.parametrize("acc", ACCELERATORS, ids=ids)
def test_backends_are_engine_names(acc: Accelerator):
    config = pytest.importorskip("engine.config")
    assert acc.rollout_backends, "every accelerator says which rollout backends it supports"
    assert acc.train_backends
    assert set(acc.rollout_backends) <= set(config.ROLLOUT_BACKENDS)
    assert set(acc.train_backends) <= set(config.TRAIN_STRATEGIES)
    assert len(set(acc.rollout_backends)) == len(acc.rollout_backends)
    assert len(set(acc.train_backends)) == len(acc.train_backends)
    assert "hf" in acc.rollout_backends  # the reference path runs wherever torch does
    assert set(hardware.ROLLOUT_BACKENDS) == set(config.ROLLOUT_BACKENDS)
    assert set(hardware.TRAIN_BACKENDS) == set(config.TRAIN_STRATEGIES)


def test_rocm_and_ascend_rollout_support_is_explicit():
    mi300x = get_accelerator("MI300X")
    assert mi300x.rollout_backends == ("vllm", "sglang", "hf")
    ascend = get_accelerator("Ascend910B")
    assert "vllm" in ascend.rollout_backends and "hf" in ascend.rollout_backends
    assert "sglang" not in ascend.rollout_backends
    assert "megatron" not in ascend.train_backends  # needs MindSpeed, which the engine lacks
    for acc in by_vendor("amd"):
        assert "vllm" in acc.rollout_backends and "hf" in acc.rollout_backends
    for name in ("MI250X", "MI250"):  # SGLang's ROCm kernels target gfx942 and newer
        if name in known_names():
            assert "sglang" not in get_accelerator(name).rollout_backends


def test_interconnect_flag():
    for name in ("H100", "H200", "B200", "A100-80GB", "MI300X", "Ascend910B"):
        assert get_accelerator(name).nvlink_like, name
    for name in ("L40S", "L4"):
        assert not get_accelerator(name).nvlink_like, name


def test_skypilot_and_slurm_names():
    assert get_accelerator("A100-40GB").skypilot_name == "A100"  # SkyPilot's A100 is 40 GB
    assert get_accelerator("A100-80GB").skypilot_name == "A100-80GB"
    assert get_accelerator("H100").skypilot_name == "H100"
    assert get_accelerator("MI300X").skypilot_name == "MI300X"
    assert get_accelerator("H100").gres(8) == "gpu:h100:8"
    assert get_accelerator("Ascend910B").gres(8) == "npu:ascend910b:8"
    skypilot_names = [acc.skypilot_name for acc in ACCELERATORS]
    assert len(set(skypilot_names)) == len(skypilot_names)
    for acc in ACCELERATORS:
        assert acc.slurm_gres == acc.slurm_gres.lower()
        assert re.fullmatch(r"[a-z0-9_-]+", acc.slurm_gres), acc.slurm_gres


@pytest.mark.parametrize("acc", ACCELERATORS, ids=ids)
def test_env_fragment_is_read_only_strings(acc: Accelerator):
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in acc.env.items())
    with pytest.raises(TypeError):
        acc.env["X"] = "1"  # type: ignore[index]
    # ROCm must never be pinned through ROCR_VISIBLE_DEVICES: Ray refuses it.
    assert "ROCR_VISIBLE_DEVICES" not in acc.env
    assert acc.visible_devices_var not in acc.env  # Ray sets that per worker
    hash(acc)  # frozen rows can key dicts and sets


def test_rows_are_frozen():
    acc = get_accelerator("H100")
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.memory_gib = 1  # type: ignore[misc]


def test_names_and_aliases_are_unique():
    seen: dict[str, str] = {}
    for acc in ACCELERATORS:
        for spelling in (acc.name, *acc.aliases):
            key = hardware._key(spelling)
            assert seen.setdefault(key, acc.name) == acc.name, (
                f"{spelling!r} names {seen[key]} and {acc.name}"
            )
    for spelling in hardware._AMBIGUOUS:
        assert hardware._key(spelling) not in seen


@pytest.mark.parametrize("acc", ACCELERATORS, ids=ids)
def test_every_name_and_alias_resolves(acc: Accelerator):
    for spelling in (acc.name, *acc.aliases):
        for variant in (spelling, spelling.lower(), spelling.upper(), f"  {spelling} "):
            assert get_accelerator(variant) is acc, variant
    if acc.skypilot_name != "A100":  # SkyPilot's bare A100 is ambiguous to people
        assert get_accelerator(acc.skypilot_name) is acc


@pytest.mark.parametrize(
    ("spelling", "name"),
    [
        ("h100", "H100"),
        ("H100-SXM", "H100"),
        ("h100_sxm5", "H100"),
        ("NVIDIA H100 80GB HBM3", "H100"),  # what nvidia-smi prints
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("a100 40gb", "A100-40GB"),
        ("A100-80GB-SXM", "A100-80GB"),
        ("l40s", "L40S"),
        ("mi300x", "MI300X"),
        ("AMD-Instinct-MI300X-OAM", "MI300X"),  # Ray's accelerator type
        ("ascend910b", "Ascend910B"),
        ("910B", "Ascend910B"),
        ("Ascend-910B", "Ascend910B"),
    ],
)
def test_lookup_by_alias_and_case(spelling, name):
    assert get_accelerator(spelling).name == name


def test_unknown_name_suggests_close_matches_and_lists_all():
    with pytest.raises(UnknownAcceleratorError) as info:
        get_accelerator("H10")
    err = info.value
    assert isinstance(err, RlctlError)
    assert err.suggestions[0] == "H100"
    message = str(err)
    assert "'H10'" in message
    assert "Did you mean H100" in message
    for name in known_names():
        assert name in message
    assert err.hint


def test_unknown_name_without_close_match():
    with pytest.raises(UnknownAcceleratorError) as info:
        get_accelerator("TPU-v5p")
    assert info.value.suggestions == ()
    assert "Did you mean" not in str(info.value)
    assert "MI300X" in str(info.value)


@pytest.mark.parametrize(
    ("typo", "expect"), [("L40", "L40S"), ("mi300", "MI300X"), ("B20", "B200"), ("MI32x", "MI325X")]
)
def test_typos_suggest(typo, expect):
    with pytest.raises(UnknownAcceleratorError) as info:
        get_accelerator(typo)
    assert expect in info.value.suggestions


@pytest.mark.parametrize("spelling", ["A100", "a100", "A100-SXM4", "NVIDIA A100"])
def test_bare_a100_is_refused_with_both_sizes(spelling):
    with pytest.raises(UnknownAcceleratorError) as info:
        get_accelerator(spelling)
    assert info.value.suggestions == ("A100-40GB", "A100-80GB")
    assert "ambiguous" in str(info.value)
    assert "A100-40GB" in str(info.value) and "A100-80GB" in str(info.value)
    assert info.value.hint


def test_empty_name():
    with pytest.raises(UnknownAcceleratorError):
        get_accelerator("  ")


@pytest.mark.parametrize(
    ("spec", "name", "count"),
    [
        ("H100:8", "H100", 8),
        ("h100", "H100", 1),
        ("MI300X:8", "MI300X", 8),
        (" a100-80gb : 4 ", "A100-80GB", 4),
        ("H100:3", "H100", 3),  # odd counts are the planner's business
        ("Ascend910B:16", "Ascend910B", 16),
    ],
)
def test_parse_spec(spec, name, count):
    acc, n = parse_accelerator_spec(spec)
    assert (acc.name, n) == (name, count)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("H100:0", "at least 1"),
        ("H100:x", "not a whole number"),
        ("H100:-2", "the count must be at least 1, got -2"),  # a number, not "not a number"
        ("H100:-8", "the count must be at least 1, got -8"),
        ("H100:1.5", "not a whole number"),
        ("H100:", "not a whole number"),
        ("H100:8:2", "more than one ':'"),
        (":8", "no accelerator name"),
        ("", "no accelerator name"),
    ],
)
def test_parse_spec_errors_name_the_spec(spec, fragment):
    with pytest.raises(AcceleratorSpecError) as info:
        parse_accelerator_spec(spec)
    assert repr(spec) in str(info.value)
    assert fragment in str(info.value)
    assert info.value.hint
    assert isinstance(info.value, RlctlError)


def test_parse_spec_unknown_name():
    with pytest.raises(UnknownAcceleratorError, match="H100"):
        parse_accelerator_spec("H10:8")


def test_by_vendor():
    assert {acc.vendor for acc in by_vendor("nvidia")} == {"nvidia"}
    assert [acc.name for acc in by_vendor("NVIDIA")] == [
        acc.name for acc in ACCELERATORS if acc.vendor == "nvidia"
    ]
    assert [acc.name for acc in by_vendor("ascend")] == ["Ascend910B"]
    assert "MI300X" in [acc.name for acc in by_vendor("amd")]
    total = sum(len(by_vendor(v)) for v in hardware.VENDORS)
    assert total == len(ACCELERATORS)
    with pytest.raises(RlctlError, match="nvidia, amd, ascend"):
        by_vendor("intel")


@pytest.mark.parametrize("vendor", sorted(ENGINE_DEVICE_KEY))
def test_matches_engine_device_table(vendor):
    pytest.importorskip("torch")
    from engine.device import DEVICES

    spec = DEVICES[ENGINE_DEVICE_KEY[vendor]]
    for acc in by_vendor(vendor):
        assert acc.torch_device == spec.type
        assert acc.torch_backend == spec.backend
        assert acc.visible_devices_var == spec.visible_devices_var
        assert acc.ray_resource == spec.ray_resource


def test_import_is_light():
    code = (
        "import json, sys, time; t = time.perf_counter(); import rlctl.hardware; "
        "dt = time.perf_counter() - t; "
        "heavy = [m for m in ('torch', 'ray', 'engine', 'numpy', 'yaml') if m in sys.modules]; "
        "print(json.dumps([heavy, dt]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    heavy, seconds = json.loads(out)
    assert heavy == []
    assert seconds < 0.5


def test_docs_table_matches():
    doc = (REPO / "docs" / "hardware.md").read_text()
    for acc in ACCELERATORS:
        row = next((line for line in doc.splitlines() if line.startswith(f"| {acc.name} |")), None)
        assert row is not None, f"docs/hardware.md has no row for {acc.name}"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == acc.vendor
        assert float(cells[2]) == acc.memory_gib
        assert float(cells[3]) == acc.bf16_tflops
        assert cells[5] == ", ".join(acc.rollout_backends)
        assert cells[6] == ", ".join(acc.train_backends)
        assert cells[7] == f"`{acc.skypilot_name}`"
        assert cells[8] == f"`{acc.gres(8)}`"
