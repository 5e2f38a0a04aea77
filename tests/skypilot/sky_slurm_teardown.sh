#!/usr/bin/env bash
# Undo tests/skypilot/sky_slurm_setup.sh, by pid file and by its own markers only:
#   1. SkyPilot clusters of the private HOME (`sky down -a`), then its API server; the
#      node-local runtime dirs of the clusters it seeded
#   2. the sshd it started, with its sessions
#   3. Slurm, if the setup started it (tests/slurm/stop_slurm.sh)
#   4. its /etc/hosts line; what SkyPilot wrote into root's home (login_home.py)
# and the managed-jobs probe stand-in (its server, its loopback addresses).
# Keeps $RLCTL_SKY_BASE's keys and uv, and SkyPilot's uv cache /tmp/uv_cache_0 (the
# next run reuses them): remove those to start cold.
# Same variables as the setup. Safe to run twice.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
base=${RLCTL_SKY_BASE:-/tmp/rlctl-sky}
api_port=${RLCTL_SKY_API_PORT:-46590}
python=${RLCTL_PYTHON:-$repo/.venv/bin/python}
slurm_base=${RLCTL_SLURM_BASE:-/tmp/rlctl-slurm}
say() { echo "[sky_slurm_teardown] $*"; }

# 1. clusters, then the API server (only if ours answers on its port)
if [ -d "$base/home" ] &&
  "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" \
    "http://127.0.0.1:$api_port/api/health" 2>/dev/null; then
  (
    export HOME=$base/home SKYPILOT_API_SERVER_LOCAL_PORT=$api_port SKYPILOT_DISABLE_USAGE_COLLECTION=1
    sky_bin=$(dirname "$python")/sky
    timeout 300 "$sky_bin" down -a -y 2>&1 | tail -n 3
    timeout 120 "$sky_bin" api stop 2>&1 | tail -n 1
  )
fi

# SkyPilot's node-local runtime dirs of the clusters the setup seeded (a venv each)
if [ -s "$base/runtime-dirs" ]; then
  while read -r dir; do
    case "$dir" in /tmp/?*) rm -rf -- "$dir" ;; esac
  done <"$base/runtime-dirs"
  rm -f "$base/runtime-dirs"
fi

rm -f "$base/api-mode"

# the managed-jobs probe stand-in (the setup's step 8): its server, its loopback addresses
probe=$base/probe
if [ -s "$probe/server.pid" ] && kill -0 "$(cat "$probe/server.pid")" 2>/dev/null; then
  kill "$(cat "$probe/server.pid")"
  say "probe server stopped"
fi
rm -f "$probe/server.pid"
if [ -s "$probe/addresses" ]; then
  while read -r ip; do ip addr del "$ip/32" dev lo 2>/dev/null; done <"$probe/addresses"
  rm -f "$probe/addresses"
fi

# 2. sshd and its sessions
pidfile=$base/ssh/sshd.pid
if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
  pid=$(cat "$pidfile")
  tree() { local c; for c in $(ps -o pid= --ppid "$1"); do echo "$c"; tree "$c"; done; }
  pids=$(tree "$pid")
  kill "$pid" $pids 2>/dev/null
  say "sshd stopped (pid $pid)"
fi
rm -f "$pidfile"

# 3. Slurm, if ours
if [ -e "$base/started-slurm" ]; then
  RLCTL_SLURM_BASE=$slurm_base bash "$repo/tests/slurm/stop_slurm.sh"
  rm -f "$base/started-slurm"
fi

# 4. /etc/hosts and the login user's home
if grep -q '# rlctl-sky-slurm$' /etc/hosts 2>/dev/null; then
  # in place (not sed -i's rename): /etc/hosts may be a bind mount
  kept=$(grep -v '# rlctl-sky-slurm$' /etc/hosts)
  printf '%s\n' "$kept" >/etc/hosts
fi
"$python" "$here/login_home.py" restore "$(getent passwd root | cut -d: -f6)" "$base"
say "done"
