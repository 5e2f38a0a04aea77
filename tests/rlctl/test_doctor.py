"""``rlctl doctor``: each pre-flight check catches what it is for, in seconds, exit 2, the
message naming the check and the fix; and the node's checks (``python -m engine.doctor``)
catch a node short of devices, one that cannot reach the others, and a full disk."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlctl.doctor import doctor, image_finding

RECIPE = """\
name: dr
algorithm: grpo
model: Qwen/Qwen2.5-0.5B-Instruct
data: {{prepare: gsm8k}}
hardware: {{accelerators: "H100:1"}}
rollout: vllm
{extra}"""


@pytest.fixture
def recipe_at(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / ".rlctl"))

    def make(extra: str = "") -> str:
        path = tmp_path / "dr.yaml"
        path.write_text(RECIPE.format(extra=extra))
        return str(path)

    return make


def _failed(findings) -> dict[str, str]:
    return {f.check: f.message for f in findings if not f.ok}


def test_an_image_whose_vllm_is_outside_the_range(recipe_at):
    findings = doctor(recipe_at("image: vllm/vllm-openai:v0.20.0\n"), "slurm")
    failed = _failed(findings)
    assert set(failed) == {"image"}
    assert "vllm 0.20.0, outside the supported range >=0.27,<0.34" in failed["image"]
    assert "leave `image:` out" in failed["image"]
    # the plan's default image, and one whose tag names no release, pass
    assert image_finding("vllm/vllm-openai:v0.33.0", "vllm").ok
    assert image_finding("registry.example.com/team/engine:latest", "vllm").ok


def test_a_missing_secret(recipe_at, monkeypatch):
    monkeypatch.delenv("RLCTL_DOCTOR_TOKEN", raising=False)
    failed = _failed(doctor(recipe_at("secrets: [RLCTL_DOCTOR_TOKEN]\n"), "slurm"))
    assert set(failed) == {"secrets"}
    assert "not set: RLCTL_DOCTOR_TOKEN: export them" in failed["secrets"]
    monkeypatch.setenv("RLCTL_DOCTOR_TOKEN", "x")
    assert _failed(doctor(recipe_at("secrets: [RLCTL_DOCTOR_TOKEN]\n"), "slurm")) == {}


def test_an_unwritable_bucket(recipe_at, monkeypatch, tmp_path):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIATESTINGKEYID0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    failed = _failed(doctor(recipe_at("checkpoints: s3://no-such-bucket/run\n"), "slurm"))
    assert set(failed) == {"bucket"}
    assert failed["bucket"].startswith("cannot write and read s3://no-such-bucket/run")
    ok = doctor(recipe_at(f"checkpoints: file://{tmp_path / 'ckpt'}\n"), "slurm")
    assert next(f for f in ok if f.check == "bucket").ok
    assert not any((tmp_path / "ckpt").iterdir())  # the probe cleaned up after itself


def test_a_bad_recipe_is_a_failed_check_with_its_fix(recipe_at):
    (finding,) = doctor(recipe_at("engine:\n  data.train_batch_size: 0\n"), "slurm")
    assert finding.check == "recipe" and not finding.ok
    assert "train_batch_size" in finding.message


def test_the_cli_exits_2_and_names_the_failure(recipe_at, monkeypatch):
    monkeypatch.delenv("RLCTL_DOCTOR_TOKEN", raising=False)
    path = recipe_at("secrets: [RLCTL_DOCTOR_TOKEN]\n")
    done = subprocess.run(
        [sys.executable, "-m", "rlctl.cli", "doctor", path, "--backend", "slurm"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "FAILED secrets: not set: RLCTL_DOCTOR_TOKEN" in done.stderr
    assert "ok     recipe: dr plans onto" in done.stdout


def test_the_local_node_checks_run_here():
    findings = doctor("quickstart", "local")
    assert all(f.ok for f in findings), findings
    assert [f.check for f in findings] == ["recipe", "secrets", "node"]


def _node(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine.doctor", "--node=n1", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_node_short_of_devices():
    done = _node("--devices=cuda:8")
    assert done.returncode == 2
    assert "FAILED n1: devices: 0 cuda device(s) visible, the plan needs 8" in done.stderr
    assert "--gres" in done.stderr


def test_a_full_disk(tmp_path):
    done = _node(f"--disk={tmp_path}:1000000")
    assert done.returncode == 2
    assert "FAILED n1: disk:" in done.stderr and "need about 1000000.0 GiB" in done.stderr
    assert _node(f"--disk={tmp_path}:0.001").returncode == 0


def test_a_node_that_cannot_reach_the_others():
    # rank 1 of 2, and rank 0 (this machine's port 9: nothing listens) never answers
    done = _node("--rendezvous=127.0.0.1:9", "--rank=1", "--world=2", "--timeout=2")
    assert done.returncode == 2
    assert "FAILED n1: network: rank 1 of 2 could not all-reduce" in done.stderr
    assert "GLOO_SOCKET_IFNAME" in done.stderr


def test_nodes_that_reach_each_other_pass(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    both = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "engine.doctor",
                f"--rendezvous=127.0.0.1:{port}",
                f"--rank={rank}",
                "--world=2",
                "--timeout=60",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    for p in both:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "every check passed" in out
