#!/usr/bin/env bash
# Make this machine a Slurm cluster that SkyPilot 0.14 can launch on, offline:
# SkyPilot's Slurm infra SSHes to a "login node" named in ~/.slurm/config and runs
# everything there with sbatch/srun. Here the login node is this host (a private sshd on
# 127.0.0.1) and the cluster is tests/slurm/start_slurm.sh's (two emulated nodes).
# Used by tests/skypilot/test_sky_slurm_e2e.py; a developer can run it by hand:
#
#   bash tests/skypilot/sky_slurm_setup.sh [SKY_CLUSTER ...]   # idempotent
#   . /tmp/rlctl-sky/env      # in a sub-shell: HOME, API port (then `sky status`, `rlctl ...`)
#   bash tests/skypilot/sky_slurm_teardown.sh
#
# SKY_CLUSTER: SkyPilot cluster names (rlctl's --cluster) to pre-seed uv for (below).
# What it does, each step skipped when already done:
#   1. apt: rsync (SkyPilot syncs files with it), openssh-server/client
#   2. Slurm: tests/slurm/start_slurm.sh (recorded, so teardown stops only what it started);
#      its node names (n1, n2) resolve to 127.0.0.1 through a marked /etc/hosts line
#   3. a python3.10 the login node's sessions find (SkyPilot's runtime venv asks uv for
#      3.10): pyenv's, selected for those sessions only, or a link in /usr/local/bin
#   4. uv from PyPI (pip install --target), for the clusters' runtime (SkyPilot would
#      fetch it from astral.sh, which this machine cannot reach)
#   5. sshd on 127.0.0.1 with its own host and client keys (nothing in ~/.ssh changes);
#      its sessions get SLURM_CONF and the package index's TLS/proxy settings
#   6. a private HOME for SkyPilot's client and API server ($BASE/home): ~/.slurm/config
#      naming the login node, ~/.sky/config.yaml putting SkyPilot's cluster state under
#      $BASE/remote; the API server on its own port, so a developer's own SkyPilot
#      (~/.sky, port 46580) is never touched
#   7. `sky api start`, `sky check slurm`
#   8. with RLCTL_SKY_MANAGED=1, managed jobs offline (tests/skypilot/test_sky_managed_e2e.py):
#      the jobs controller in the API server (SkyPilot 0.14's consolidation mode), and
#      the public addresses its monitor probes before each status check (8.8.8.8 and
#      1.1.1.1 over HTTPS, backend_utils.check_network_connection) answered on this
#      host: both on the loopback device, a small HTTPS server with a certificate of a
#      CA made here, which only the API server trusts (its SSL_CERT_FILE and
#      REQUESTS_CA_BUNDLE: the system's bundle plus that CA). Without them the monitor
#      waits forever ("Network is not available"). The teardown removes all three.
# SkyPilot's provisioning writes into root's home here (its ~/.bashrc line, a key in
# ~/.ssh/authorized_keys, ~/.sky_ssh_rc): recorded first, put back by the teardown.
# Needs root. Prints "sky slurm ready: ..." on success.
#
#   RLCTL_SKY_BASE      state, keys, logs (default /tmp/rlctl-sky)
#   RLCTL_SKY_SLURM     the Slurm cluster's name in ~/.slurm/config (default rlctl-local)
#   RLCTL_SKY_API_PORT  the SkyPilot API server's port (default 46590)
#   RLCTL_PYTHON        the Python with SkyPilot (default: the repo's .venv)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
base=${RLCTL_SKY_BASE:-/tmp/rlctl-sky}
name=${RLCTL_SKY_SLURM:-rlctl-local}
api_port=${RLCTL_SKY_API_PORT:-46590}
python=${RLCTL_PYTHON:-$repo/.venv/bin/python}
say() { echo "[sky_slurm_setup] $*"; }
die() { echo "[sky_slurm_setup] error: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (packages, sshd, slurmd)"
[ -x "$python" ] || die "no Python at $python (set RLCTL_PYTHON)"
"$python" -c 'import sky' 2>/dev/null || die "$python has no SkyPilot: pip install 'rlctl[skypilot]'"
sky_bin=$(dirname "$python")/sky
mkdir -p "$base"
chmod 700 "$base"

# 1. packages
need=()
command -v rsync >/dev/null || need+=(rsync)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh >/dev/null || need+=(openssh-client)
if [ "${#need[@]}" -gt 0 ]; then
  say "installing ${need[*]}"
  command -v apt-get >/dev/null || die "no apt-get to install ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  lists=$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' 2>/dev/null | head -n 1)
  [ -n "$lists" ] || apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# 2. Slurm (the cluster SkyPilot allocates from)
slurm_base=${RLCTL_SLURM_BASE:-/tmp/rlctl-slurm}
ctld_pid=$slurm_base/run/slurmctld.pid
# Left alone when it runs: start_slurm.sh waits for idle nodes, and a SkyPilot cluster
# from an earlier run may hold an allocation.
if ! { [ -s "$ctld_pid" ] && kill -0 "$(cat "$ctld_pid")" 2>/dev/null; }; then
  touch "$base/started-slurm"  # teardown stops Slurm only if this script started it
  RLCTL_SLURM_BASE=$slurm_base bash "$repo/tests/slurm/start_slurm.sh"
fi
slurm_conf=$slurm_base/slurm.conf

# SkyPilot resolves each Slurm node's name (SKYPILOT_NODE_IPS): the emulated nodes
# n1..nN are this host. One marked line in /etc/hosts, removed by the teardown.
unresolved=()
for node in $(SLURM_CONF=$slurm_base/slurm.conf sinfo -h -N -o '%N' | sort -u); do
  getent hosts "$node" >/dev/null || unresolved+=("$node")
done
if [ "${#unresolved[@]}" -gt 0 ]; then
  echo "127.0.0.1 ${unresolved[*]}  # rlctl-sky-slurm" >>/etc/hosts
  say "/etc/hosts: ${unresolved[*]} -> 127.0.0.1"
fi

# 3. python3.10 for SkyPilot's runtime venv (`uv venv --python 3.10`; uv would download
# one otherwise). Under pyenv the first python3.10 on PATH is a shim that fails unless a
# 3.10 is selected: the login node's sessions select one beside the current version.
py_env=()
pyenv_root=${PYENV_ROOT:-/root/.pyenv}
if [ -x "$pyenv_root/bin/pyenv" ]; then
  v310=$(find "$pyenv_root/versions" -maxdepth 1 -name '3.10*' -printf '%f\n' 2>/dev/null | sort -V | tail -n 1)
  current=$(PYENV_ROOT=$pyenv_root "$pyenv_root/bin/pyenv" version-name 2>/dev/null || echo system)
  [ -n "$v310" ] && py_env+=("PYENV_VERSION=$current:$v310")
elif ! python3.10 -c '' 2>/dev/null; then
  found=$(find /usr/bin /opt -maxdepth 4 -name python3.10 -type f 2>/dev/null | head -n 1)
  [ -n "$found" ] || die "no python3.10: install one, or put it on PATH"
  ln -sfn "$found" /usr/local/bin/python3.10
  say "linked /usr/local/bin/python3.10 -> $found"
fi

# 4. uv (SkyPilot runs $HOME/.local/bin/uv, HOME being the cluster's directory: seeded
# below for each cluster named on the command line)
uv=$base/uv/bin/uv
if [ ! -x "$uv" ]; then
  say "installing uv from PyPI"
  "$python" -m pip install -q --target "$base/uv" uv
fi
"$uv" --version >/dev/null

# 5. the login node: sshd on 127.0.0.1
ssh_dir=$base/ssh
mkdir -p "$ssh_dir"
chmod 700 "$ssh_dir"
for key in host_key client_key; do
  [ -s "$ssh_dir/$key" ] || ssh-keygen -q -t ed25519 -N "" -C "rlctl-sky-$key" -f "$ssh_dir/$key"
done
cp "$ssh_dir/client_key.pub" "$ssh_dir/authorized_keys"
chmod 600 "$ssh_dir/authorized_keys"
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
sshd_running() { [ -s "$ssh_dir/sshd.pid" ] && kill -0 "$(cat "$ssh_dir/sshd.pid")" 2>/dev/null; }
[ -s "$ssh_dir/port" ] || free_port >"$ssh_dir/port"
ssh_port=$(cat "$ssh_dir/port")
# The sessions' environment: the cluster's slurm.conf, and what the package index needs
# (uv installs SkyPilot's runtime on the nodes; Slurm passes this environment on to them).
setenv=("SLURM_CONF=$slurm_conf" "UV_NATIVE_TLS=true" ${py_env[@]+"${py_env[@]}"})
for var in SSL_CERT_FILE SSL_CERT_DIR REQUESTS_CA_BUNDLE PIP_INDEX_URL PIP_EXTRA_INDEX_URL \
  UV_INDEX_URL UV_DEFAULT_INDEX UV_EXTRA_INDEX_URL HTTP_PROXY HTTPS_PROXY NO_PROXY \
  http_proxy https_proxy no_proxy; do
  [ -n "${!var:-}" ] && setenv+=("$var=${!var}")
done
new=$(mktemp)
{
  echo "# written by rlctl tests/skypilot/sky_slurm_setup.sh"
  echo "Port $ssh_port"
  echo "ListenAddress 127.0.0.1"
  echo "HostKey $ssh_dir/host_key"
  echo "PidFile $ssh_dir/sshd.pid"
  echo "UsePAM no"
  echo "PermitRootLogin prohibit-password"
  echo "PasswordAuthentication no"
  echo "KbdInteractiveAuthentication no"
  echo "PubkeyAuthentication yes"
  echo "AuthorizedKeysFile $ssh_dir/authorized_keys"
  echo "StrictModes no"
  echo "MaxSessions 100"
  echo "MaxStartups 100:30:200"
  printf 'SetEnv'; printf ' "%s"' "${setenv[@]}"; echo  # one line: sshd keeps the first SetEnv only
  echo "LogLevel VERBOSE"
} >"$new"
if ! cmp -s "$new" "$ssh_dir/sshd_config"; then
  mv "$new" "$ssh_dir/sshd_config"
  if sshd_running; then  # its open sessions too: SkyPilot reuses them (ControlMaster)
    pid=$(cat "$ssh_dir/sshd.pid")
    tree() { local c; for c in $(ps -o pid= --ppid "$1"); do echo "$c"; tree "$c"; done; }
    pids=$(tree "$pid")
    kill "$pid" $pids 2>/dev/null || true
    sleep 0.5
  fi
else
  rm -f "$new"
fi
mkdir -p /run/sshd  # sshd's privilege-separation directory
/usr/sbin/sshd -t -f "$ssh_dir/sshd_config"
if ! sshd_running; then
  say "starting sshd on 127.0.0.1:$ssh_port"
  /usr/sbin/sshd -f "$ssh_dir/sshd_config" -E "$ssh_dir/sshd.log"
fi

# SkyPilot writes into the login user's home (root's: this host) when it provisions:
# recorded now, put back by the teardown.
"$python" "$here/login_home.py" snapshot "$(getent passwd root | cut -d: -f6)" "$base"

# 6. SkyPilot's private HOME: the login node, and where its cluster state goes
home=$base/home
mkdir -p "$home/.slurm" "$home/.sky" "$base/remote"
cat >"$home/.slurm/config" <<EOF
# written by rlctl tests/skypilot/sky_slurm_setup.sh: this host's Slurm, over SSH
Host $name
  HostName 127.0.0.1
  Port $ssh_port
  User root
  IdentityFile $ssh_dir/client_key
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile $ssh_dir/known_hosts
EOF
cat >"$home/.sky/config.yaml" <<EOF
# written by rlctl tests/skypilot/sky_slurm_setup.sh
slurm:
  cluster_configs:
    $name:
      workdir: $base/remote
EOF
managed=${RLCTL_SKY_MANAGED:-0}
if [ "$managed" = 1 ]; then
  printf 'jobs:\n  controller:\n    consolidation_mode: true\n' >>"$home/.sky/config.yaml"
fi
ssh_cmd=(ssh -F "$home/.slurm/config" -o BatchMode=yes "$name")
for _ in $(seq 50); do
  out=$("${ssh_cmd[@]}" 'echo "$SLURM_CONF"' 2>/dev/null) && break
  sleep 0.2
done
[ "${out:-}" = "$slurm_conf" ] || die "ssh to the login node failed: $(tail -n 5 "$ssh_dir/sshd.log")"
"${ssh_cmd[@]}" 'python3.10 -c "import sys; assert sys.version_info[:2] == (3, 10)"' ||
  die "the login node's sessions find no working python3.10 (SkyPilot's runtime needs one)"
cat >"$base/env" <<EOF
# SkyPilot as the tests see it (a private HOME and API server): source in a sub-shell
export HOME=$home
export SKYPILOT_API_SERVER_LOCAL_PORT=$api_port
export SKYPILOT_DISABLE_USAGE_COLLECTION=1
export PATH=$(dirname "$python"):\$PATH
EOF
export HOME=$home SKYPILOT_API_SERVER_LOCAL_PORT=$api_port SKYPILOT_DISABLE_USAGE_COLLECTION=1

# uv for each SkyPilot cluster named: $WORKDIR/.sky_clusters/<name on cloud>/.local/bin
for cluster in "$@"; do
  on_cloud=$("$python" -c '
import sys
from sky.clouds import Slurm
from sky.utils.common_utils import make_cluster_name_on_cloud
print(make_cluster_name_on_cloud(sys.argv[1], Slurm._max_cluster_name_length()))' "$cluster")
  dest=$base/remote/.sky_clusters/$on_cloud/.local/bin
  mkdir -p "$dest"
  cp "$uv" "$dest/uv"
  # SkyPilot's node-local runtime (/tmp/<name on cloud>): `sky down` can leave its venv
  grep -qxF "/tmp/$on_cloud" "$base/runtime-dirs" 2>/dev/null || echo "/tmp/$on_cloud" >>"$base/runtime-dirs"
  say "uv seeded for cluster $cluster ($on_cloud)"
done

# 8. managed jobs offline: the probed addresses answered here (see the top, step 8)
api_env=()
if [ "$managed" = 1 ]; then
  probe=$base/probe
  mkdir -p "$probe"
  if [ ! -s "$probe/bundle.pem" ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 7 -subj "/CN=rlctl test probe CA" \
      -keyout "$probe/ca.key" -out "$probe/ca.pem" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=rlctl test probe" \
      -keyout "$probe/leaf.key" -out "$probe/leaf.csr" 2>/dev/null
    printf 'subjectAltName=IP:8.8.8.8,IP:1.1.1.1\nbasicConstraints=CA:FALSE\n' >"$probe/ext.cnf"
    openssl x509 -req -in "$probe/leaf.csr" -CA "$probe/ca.pem" -CAkey "$probe/ca.key" \
      -CAcreateserial -days 7 -out "$probe/leaf.pem" -extfile "$probe/ext.cnf" 2>/dev/null
    cat "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$probe/ca.pem" >"$probe/bundle.pem"
  fi
  for ip in 8.8.8.8 1.1.1.1; do
    if ! ip -4 addr show dev lo | grep -q " $ip/32 "; then
      ip addr add "$ip/32" dev lo || die "cannot add $ip to lo (needs CAP_NET_ADMIN)"
      echo "$ip" >>"$probe/addresses"
    fi
  done
  if ! { [ -s "$probe/server.pid" ] && kill -0 "$(cat "$probe/server.pid")" 2>/dev/null; }; then
    "$python" "$here/probe_server.py" "$probe/leaf.pem" "$probe/leaf.key" >"$probe/server.log" 2>&1 &
    echo $! >"$probe/server.pid"
  fi
  api_env=("SSL_CERT_FILE=$probe/bundle.pem" "REQUESTS_CA_BUNDLE=$probe/bundle.pem")
fi

# 7. the API server and SkyPilot's check of the Slurm cluster; started again when it
# runs in the other mode (managed jobs or not) than asked
api_up() { "$python" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "http://127.0.0.1:$api_port/api/health" 2>/dev/null; }
api_mode=$(cat "$base/api-mode" 2>/dev/null || echo 0)
if api_up && [ "$api_mode" != "$managed" ]; then
  say "stopping the SkyPilot API server (started with managed jobs: $api_mode)"
  "$sky_bin" api stop >>"$base/api-start.log" 2>&1 || true
fi
if ! api_up; then
  say "starting the SkyPilot API server on 127.0.0.1:$api_port (managed jobs: $managed)"
  env ${api_env[@]+"${api_env[@]}"} "$sky_bin" api start >"$base/api-start.log" 2>&1 ||
    die "sky api start failed: $(tail -n 20 "$base/api-start.log")"
  echo "$managed" >"$base/api-mode"
fi
check=$("$sky_bin" check slurm 2>&1 || true)
echo "$check" >"$base/check.log"
case "$check" in
  *"Slurm: enabled"*) ;;
  *) die "sky check slurm did not enable Slurm: $check" ;;
esac
say "sky slurm ready: infra slurm/$name, login node root@127.0.0.1:$ssh_port, env $base/env"
