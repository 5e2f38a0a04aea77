#!/usr/bin/env bash
# A throwaway Slurm cluster on this host for rlctl's tests: slurmctld plus N emulated
# nodes (one `slurmd -N nI` each; Debian's build has multiple-slurmd support), munge,
# no systemd, no cgroups, no slurmdbd (final states go to a jobcomp text file).
# Idempotent: a second run with the same settings only waits for the nodes.
#
#   RLCTL_SLURM_BASE   state, logs and pid files (default /tmp/rlctl-slurm)
#   RLCTL_SLURM_NODES  emulated nodes n1..nN (default 2)
#   RLCTL_SLURM_PORT   slurmctld port (default 6817; slurmd ports are 17001..)
# Writes $BASE/slurm.conf; clients find it through SLURM_CONF (exported by the caller) or
# /etc/slurm/slurm.conf (a symlink made when that file does not exist yet).
# Needs root (packages, munge, daemons). Prints "slurm ready" on success.
set -euo pipefail

base=${RLCTL_SLURM_BASE:-/tmp/rlctl-slurm}
count=${RLCTL_SLURM_NODES:-2}
port=${RLCTL_SLURM_PORT:-6817}
conf=$base/slurm.conf
export SLURM_CONF=$conf
say() { echo "[start_slurm] $*"; }

# 1. packages (apt-get update only when there are no package lists yet)
missing=0
for exe in munged slurmctld slurmd sbatch; do command -v "$exe" >/dev/null || missing=1; done
if [ "$missing" = 1 ]; then
  say "installing munge and slurm"
  export DEBIAN_FRONTEND=noninteractive
  blocker=/usr/sbin/policy-rc.d  # no init scripts starting daemons during the install
  own_blocker=0
  if [ ! -e "$blocker" ]; then printf '#!/bin/sh\nexit 101\n' >"$blocker"; chmod 755 "$blocker"; own_blocker=1; fi
  lists=$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' 2>/dev/null | head -n 1)
  [ -n "$lists" ] || apt-get update -qq
  apt-get install -y -qq --no-install-recommends munge slurmctld slurmd slurm-client >/dev/null
  [ "$own_blocker" = 1 ] && rm -f "$blocker"
fi

# 2. munge (as user munge; refuses root). A killed munged leaves pid/socket files behind.
mkdir -p "$base/run" "$base/log" "$base/state"
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  head -c 1024 /dev/urandom >/etc/munge/munge.key
fi
chown -R munge:munge /etc/munge
chmod 700 /etc/munge
chmod 400 /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge
install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
munge_ok() { local cred; cred=$(munge -n 2>/dev/null) && unmunge <<<"$cred" >/dev/null 2>&1; }
if ! munge_ok; then
  say "starting munged"
  rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 100); do munge_ok && break; sleep 0.1; done
  munge_ok || { echo "munged did not start" >&2; exit 1; }
  cp /run/munge/munged.pid "$base/run/munged.pid"  # ours: stop_slurm.sh may stop it
fi

# 3. configuration
host=$(hostname -s)
cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc reads them
mem=$(($(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) * 8 / 10 / count))
new=$(mktemp)
cat >"$new" <<CONF
# written by rlctl tests/slurm/start_slurm.sh
ClusterName=rlctl
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$base/state/ctld
SlurmdSpoolDir=$base/state/%n
SlurmctldPidFile=$base/run/slurmctld.pid
SlurmdPidFile=$base/run/slurmd-%n.pid
SlurmctldLogFile=$base/log/slurmctld.log
SlurmdLogFile=$base/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmdTimeout=30
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$base/log/jobcomp.txt
NodeName=n[1-$count] NodeHostname=$host NodeAddr=127.0.0.1 Port=[17001-$((17000 + count))] CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
mkdir -p "$base/state/ctld"
changed=0
cmp -s "$new" "$conf" || { mv "$new" "$conf"; chmod 644 "$conf"; changed=1; }
rm -f "$new"
if [ ! -e /etc/slurm/slurm.conf ]; then mkdir -p /etc/slurm; ln -s "$conf" /etc/slurm/slurm.conf; fi

# 4. daemons (restarted by pid file when the configuration changed)
running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if [ "$changed" = 1 ]; then
  for pidfile in "$base"/run/slurmd-*.pid "$base/run/slurmctld.pid"; do
    if running "$pidfile"; then
      pid=$(cat "$pidfile"); kill "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
fi
running "$base/run/slurmctld.pid" || { say "starting slurmctld"; slurmctld -c; }
for _ in $(seq 100); do
  ping=$(scontrol ping 2>/dev/null || true)
  [[ "$ping" == *UP* ]] && break
  sleep 0.2
done
[[ "$ping" == *UP* ]] || { tail -n 20 "$base/log/slurmctld.log" >&2; exit 1; }
since=$(($(date +%s) - 1))
for i in $(seq 1 "$count"); do
  running "$base/run/slurmd-n$i.pid" || { say "starting slurmd n$i"; slurmd -N "n$i"; }
done

# 5. wait until every node is idle and registered after our start (right after a
# restart, the controller reports the saved state first)
for _ in $(seq 300); do
  states=$(sinfo -h -N -o '%T' 2>/dev/null | sort -u | tr '\n' ' ')
  if [ "$states" = "idle " ]; then
    oldest=$(scontrol show node -o | grep -oE 'SlurmdStartTime=[^ ]+' | cut -d= -f2 |
      while read -r t; do date -d "$t" +%s 2>/dev/null || echo 0; done | sort -n | head -n 1)
    [ "${oldest:-0}" -ge "$since" ] || [ "$changed" = 0 ] && { say "slurm ready: $count nodes"; exit 0; }
  fi
  case "$states" in *down* | *drain*) scontrol update nodename="n[1-$count]" state=resume 2>/dev/null || true ;; esac
  sleep 0.2
done
echo "nodes not ready: $states" >&2
tail -n 20 "$base"/log/slurmd-*.log >&2
exit 1
