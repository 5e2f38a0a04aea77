"""Undo what SkyPilot's Slurm infra writes into the login user's home, when the "login
node" is this machine (sky_slurm_setup.sh / sky_slurm_teardown.sh).

SkyPilot's Slurm provisioning adds, on the login node, for the SSH user: a line sourcing
``~/.sky_ssh_rc`` at the end of ``~/.bashrc``, that file, its public key in
``~/.ssh/authorized_keys`` and a host key ``~/.ssh/skypilot_host_key``. On a real cluster
that is the user's cluster account; here it is root's own home, so the setup records
those files first (``snapshot``) and the teardown puts them back (``restore``).

    python login_home.py snapshot|restore HOME_DIR STATE_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

FILES = (".bashrc", ".ssh/authorized_keys", ".sky_ssh_rc", ".ssh/skypilot_host_key",
         ".ssh/skypilot_host_key.pub")  # fmt: skip
MANIFEST = "login-home.json"


def snapshot(home: Path, state: Path) -> None:
    """Record the files as they are now; a later snapshot keeps the first (clean) one."""
    manifest = state / MANIFEST
    if manifest.exists():
        return
    record = {
        "ssh_dir": (home / ".ssh").is_dir(),
        "files": {
            name: (home / name).read_text() if (home / name).is_file() else None for name in FILES
        },
    }
    state.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps(record))
    manifest.chmod(0o600)


def restore(home: Path, state: Path) -> None:
    """Put back what SkyPilot changed since the snapshot: its ``.bashrc`` line (other new
    lines stay), the keys added to ``authorized_keys``, the files it created."""
    manifest = state / MANIFEST
    if not manifest.exists():
        return
    record = json.loads(manifest.read_text())
    before: dict[str, str | None] = record["files"]
    rc_line = "source ~/.sky_ssh_rc"
    bashrc = home / ".bashrc"
    if bashrc.is_file() and rc_line not in (before[".bashrc"] or "").splitlines():
        out: list[str] = []
        for line in bashrc.read_text().splitlines(keepends=True):
            if line.strip() == rc_line:
                if out and not out[-1].strip():  # SkyPilot writes a blank line first
                    out.pop()
                continue
            out.append(line)
        bashrc.write_text("".join(out))
    keys = home / ".ssh/authorized_keys"
    if keys.is_file():
        kept = set((before[".ssh/authorized_keys"] or "").splitlines())
        lines = [line for line in keys.read_text().splitlines() if line in kept]
        if lines or before[".ssh/authorized_keys"] is not None:
            keys.write_text("".join(f"{line}\n" for line in lines))
        else:
            keys.unlink()
    for name in (".sky_ssh_rc", ".ssh/skypilot_host_key", ".ssh/skypilot_host_key.pub"):
        if before[name] is None:
            (home / name).unlink(missing_ok=True)
    ssh_dir = home / ".ssh"
    if not record["ssh_dir"] and ssh_dir.is_dir() and not any(ssh_dir.iterdir()):
        ssh_dir.rmdir()
    manifest.unlink()


if __name__ == "__main__":
    action, home_dir, state_dir = sys.argv[1:4]
    {"snapshot": snapshot, "restore": restore}[action](Path(home_dir), Path(state_dir))
