"""`rlctl launch --backend slurm --ssh root@rlctl-login` against a real OpenSSH server.

A real ``sshd`` (its own host key and config in a tmp dir, on 127.0.0.1 and a free port)
stands in for a cluster's login node; the local Slurm of conftest.py is its cluster. The
real ``ssh`` client reaches it through a Host alias in a tmp ssh config: the ``ssh`` on the
CLI's PATH is a two-line wrapper adding ``-F <that config>`` (OpenSSH reads ``~/.ssh``
from the passwd entry, not ``$HOME``, so the user's own ssh setup stays untouched).
The job's files are staged, submitted, observed, streamed and its secret passed over SSH.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlctl.backends.slurm import SlurmBackend, SlurmProfile
from rlctl.errors import RlctlError
from tests.slurm.test_slurm_e2e import CLI, REPO, handle, recipe, write_profile

pytestmark = [pytest.mark.slow, pytest.mark.cluster]

SSHD = "/usr/sbin/sshd"
ALIAS = "rlctl-login"
SECRET_NAME = "RLCTL_TEST_TOKEN"
# shell and sbatch metacharacters: passed literally, never executed or split
SECRET_VALUE = "s3cr3t-$(touch /tmp/rlctl-pwned) `id` ; 'q' \"d\" \\ %b=x"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_sshd() -> None:
    if Path(SSHD).exists():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("no sshd, and no root apt-get to install openssh-server")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run(
        ["apt-get", "install", "-y", "-q", "openssh-server", "openssh-client"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0 or not Path(SSHD).exists():
        pytest.skip(f"could not install openssh-server: {(done.stdout + done.stderr)[-1500:]}")


@pytest.fixture(scope="module")
def login_node(tmp_path_factory, slurm_cluster):
    """A real sshd on 127.0.0.1 (the login node) and a client config naming it ``rlctl-login``.
    Yields the directory holding the ``ssh`` wrapper to put first on PATH."""
    _ensure_sshd()
    d = tmp_path_factory.mktemp("sshd")
    d.chmod(0o700)
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)],
                       check=True)  # fmt: skip
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    (d / "authorized_keys").chmod(0o600)
    port = _free_port()
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    (d / "sshd_config").write_text(
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        f"HostKey {d / 'host_key'}\n"
        f"PidFile {d / 'sshd.pid'}\n"
        "UsePAM no\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "PubkeyAuthentication yes\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\n"
        "StrictModes no\n"
        # a login node whose shells find the cluster's slurm.conf
        f"SetEnv SLURM_CONF={slurm_cluster.conf}\n"
        "LogLevel VERBOSE\n"
    )
    server = subprocess.Popen(
        [SSHD, "-f", str(d / "sshd_config"), "-D", "-E", str(d / "sshd.log")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    (d / "ssh_config").write_text(
        f"Host {ALIAS}\n"
        "  HostName 127.0.0.1\n"
        f"  Port {port}\n"
        f"  IdentityFile {d / 'client_key'}\n"
        "  IdentitiesOnly yes\n"
        "  StrictHostKeyChecking no\n"
        f"  UserKnownHostsFile {d / 'known_hosts'}\n"
        "  LogLevel ERROR\n"
        # a login node that is down: nothing listens on its port
        "Host rlctl-down\n"
        "  HostName 127.0.0.1\n"
        f"  Port {_free_port()}\n"
        f"  UserKnownHostsFile {d / 'known_hosts'}\n"
    )
    bin_dir = d / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "ssh"
    real_ssh = shutil.which("ssh") or "/usr/bin/ssh"
    wrapper.write_text(f'#!/bin/sh\nexec {real_ssh} -F {d / "ssh_config"} "$@"\n')
    wrapper.chmod(0o755)
    try:
        deadline = time.monotonic() + 30
        while True:
            probe = subprocess.run(
                [str(wrapper), "-o", "BatchMode=yes", f"root@{ALIAS}", "printenv SLURM_CONF"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            if probe.returncode == 0:
                assert probe.stdout.strip() == str(slurm_cluster.conf), probe.stdout
                break
            assert server.poll() is None, (d / "sshd.log").read_text()[-2000:]
            assert time.monotonic() < deadline, probe.stderr + (d / "sshd.log").read_text()
            time.sleep(0.5)
        yield bin_dir
        # every step above went through this server: it logged the client key's logins
        assert "Accepted publickey for root" in (d / "sshd.log").read_text()
    finally:
        server.send_signal(signal.SIGTERM)  # by pid: the sshd this fixture started
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def test_launch_over_ssh(tmp_path, login_node, wait_state, follow_logs):
    home = tmp_path / "home"
    jobs = tmp_path / "jobs"
    write_profile(home, jobs)
    # the user's shell: no SLURM_CONF (only the login node knows the cluster), the ssh
    # wrapper first on PATH, the secret in the environment
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update(
        RLCTL_HOME=str(home),
        PYTHONPATH=str(REPO),
        PATH=f"{login_node}:{env.get('PATH', '')}",
        **{SECRET_NAME: SECRET_VALUE},
    )

    def rlctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True,
                              text=True, timeout=timeout, env=env, cwd=tmp_path)  # fmt: skip

    rlctl.home = home
    path = recipe(tmp_path, "slurmssh", steps=2)
    path.write_text(path.read_text() + f"secrets: [{SECRET_NAME}]\n")
    # every node's job script records a digest of the secret it sees (never the value)
    prelude = [
        "export PATH=" + shlex.quote(str(Path(sys.executable).parent)) + ":$PATH",
        f'printf %s "${SECRET_NAME}" | sha256sum >"$RLCTL_ROOT/secret.sha256"',
    ]
    write_profile(home, jobs, prelude=json.dumps(prelude))
    Path("/tmp/rlctl-pwned").unlink(missing_ok=True)

    started = time.monotonic()
    launched = rlctl("launch", str(path), "--backend", "slurm", "--ssh", f"root@{ALIAS}")
    assert launched.returncode == 0, launched.stderr
    job_id = launched.stdout.split()[1]
    submitted = time.monotonic() - started
    h = handle(rlctl, job_id)
    assert h["ssh"] == f"root@{ALIAS}"
    root = Path(h["root"])
    assert root.parent == jobs
    # staged over SSH: the rendered files, on the "cluster" filesystem
    for name in ("job.sbatch", "ray_cluster.sh", "engine.yaml"):
        assert (root / name).is_file(), name

    # follow from the start: it streams over SSH and ends by itself when the job ends
    with follow_logs(job_id, env, tmp_path) as follow:
        done = wait_state(rlctl, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"})
        ended = time.monotonic()
        followed, follow_err = follow.communicate(timeout=90)
    logs = rlctl("logs", job_id)
    assert logs.returncode == 0, logs.stderr
    assert done["state"] == "SUCCEEDED", (done, logs.stdout[-3000:])
    assert done["exit_code"] == 0
    print(
        f"ssh job: submitted in {submitted:.1f} s, SUCCEEDED after"
        f" {ended - started:.0f} s; logs -f ended {time.monotonic() - ended:.1f} s later"
    )
    assert "rlctl: ray cluster ready: 2 nodes" in logs.stdout
    assert "step 2/2 | score" in logs.stdout
    assert follow.returncode == 0, follow_err
    assert "step 2/2 | score" in followed
    assert "rlctl: engine exited with code 0" in followed

    # the secret reached the job (every node saw the same value) ...
    digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()
    assert (root / "secret.sha256").read_text().split()[0] == digest
    # ... and is in no staged file, nor in the job's record; nothing in it was executed
    for f in root.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            assert SECRET_VALUE.encode() not in data, f
            assert b"s3cr3t" not in data, f
    assert "s3cr3t" not in repr(handle(rlctl, job_id))
    assert not Path("/tmp/rlctl-pwned").exists()


def test_unreachable_login_node_is_an_error_not_a_failed_job(login_node, monkeypatch, tmp_path):
    """ssh's own failure (exit 255) says nothing about the job: status raises, and the job
    is not recorded FAILED (it was, as "Slurm no longer knows job ...")."""
    monkeypatch.setenv("PATH", f"{login_node}:{os.environ['PATH']}")
    job = SimpleNamespace(
        handle={"slurm_job_id": "1", "root": str(tmp_path), "log": str(tmp_path / "job.log"),
                "ssh": "root@rlctl-down"}
    )  # fmt: skip
    backend = SlurmBackend(SlurmProfile(job_root=str(tmp_path)))
    with pytest.raises(RlctlError, match=r"ssh to root@rlctl-down failed: .*refused"):
        backend.status(job)
    with pytest.raises(RlctlError, match="ssh to root@rlctl-down failed"):
        list(backend.logs(job, follow=False))
