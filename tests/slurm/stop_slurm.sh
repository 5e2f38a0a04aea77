#!/usr/bin/env bash
# Stop what start_slurm.sh started, by pid file only (never pkill/killall: the host may run
# other Slurm or munge daemons). RLCTL_SLURM_BASE as for start_slurm.sh.
set -uo pipefail
base=${RLCTL_SLURM_BASE:-/tmp/rlctl-slurm}
export SLURM_CONF=$base/slurm.conf

stop() { # NAME PIDFILE
  local pid
  [ -s "$2" ] || return 0
  pid=$(cat "$2")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    echo "[stop_slurm] $1 stopped (pid $pid)"
  fi
  rm -f "$2"
}

# jobs first, so their steps end cleanly
if [ -s "$base/run/slurmctld.pid" ] && kill -0 "$(cat "$base/run/slurmctld.pid")" 2>/dev/null; then
  jobs=$(squeue -h -o %i 2>/dev/null || true)
  [ -n "$jobs" ] && scancel $jobs 2>/dev/null
  for _ in $(seq 50); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
fi
for pidfile in "$base"/run/slurmd-*.pid; do [ -e "$pidfile" ] && stop "$(basename "$pidfile" .pid)" "$pidfile"; done
stop slurmctld "$base/run/slurmctld.pid"
# munged only if we started it (same pid as the running one)
if [ -s "$base/run/munged.pid" ] && [ "$(cat "$base/run/munged.pid")" = "$(cat /run/munge/munged.pid 2>/dev/null)" ]; then
  stop munged "$base/run/munged.pid"
fi
rm -f "$base/run/munged.pid"
if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$base/slurm.conf" ]; then
  rm -f /etc/slurm/slurm.conf
fi
exit 0
