# shellcheck shell=bash
# rlctl's Ray bootstrap library: sourced (not run) by the Slurm and SkyPilot job scripts.
#
#   . ray_cluster.sh
#   rlctl_ray_head   PORT NUM_CPUS NUM_DEVICES RESOURCE_NAME TEMP_DIR
#   rlctl_ray_worker HEAD_IP PORT NUM_CPUS NUM_DEVICES RESOURCE_NAME TEMP_DIR
#   rlctl_ray_wait   NODES DEVICES TIMEOUT_S ADDRESS
#   rlctl_ray_stop
#
# RESOURCE_NAME is the Ray resource that counts the devices: GPU (NVIDIA, AMD), NPU
# (Ascend, a custom resource) or CPU / empty for a CPU-only cluster (no device resource).
#
# The API is stable: both backends depend on it. Rules it follows (each one a bug seen in
# hand-written Ray-on-Slurm scripts):
# - `ray start ... --block` runs in the foreground of a background job of this shell, so
#   the daemons belong to the job (Slurm's step, SkyPilot's task) and die with it; the pid
#   is recorded, and `rlctl_ray_stop` stops that pid only. Never `ray stop`: it kills
#   every Ray of the user on the host, other jobs' included.
# - CPUs and devices are passed explicitly: Ray's own detection sees the whole host, not
#   the allocation.
# - An explicit port per job, and a short temp dir (Unix socket paths are limited to
#   107 bytes).
# - No fixed sleeps: `rlctl_ray_wait` polls the cluster until the nodes and devices it
#   expects have joined, and says which ones did when it gives up.
#
# Authentication: Ray >= 2.5x refuses connections without the cluster's token once one
# exists (~/.ray/auth_token on a shared home makes the head enable it). `rlctl_ray_auth`
# makes it explicit and per job: RAY_AUTH_MODE=token with a fresh RAY_AUTH_TOKEN unless the
# caller set them. Call it once before starting the head and pass the same two variables
# to every worker (srun does; SkyPilot: set them as task envs); set RAY_AUTH_MODE=disabled
# to opt out. Older Ray ignores both variables.
#
# Environment knobs: RLCTL_RAY (the ray executable, default `ray`), RLCTL_RAY_POLL_S
# (seconds between polls, default 2), RLCTL_RAY_EXTRA_ARGS (extra words for every
# `ray start`, split on spaces; for site-specific ports or --node-ip-address).

RLCTL_RAY_PID=""

# Words for `ray start` that declare this node's resources.
_rlctl_ray_resource_args() { # NUM_CPUS NUM_DEVICES RESOURCE_NAME
  local cpus=$1 devices=$2 resource=${3:-}
  _rlctl_ray_args=(--num-cpus="$cpus")
  case "$resource" in
    GPU) _rlctl_ray_args+=(--num-gpus="$devices") ;;
    "" | CPU | cpu) _rlctl_ray_args+=(--num-gpus=0) ;;
    *)
      if [[ ! "$resource" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
        echo "rlctl_ray: bad resource name: $resource" >&2
        return 2
      fi
      _rlctl_ray_args+=(--num-gpus=0 --resources="{\"$resource\": $devices}")
      ;;
  esac
  if [ -n "${RLCTL_RAY_EXTRA_ARGS:-}" ]; then
    local extra
    read -r -a extra <<<"$RLCTL_RAY_EXTRA_ARGS"
    _rlctl_ray_args+=("${extra[@]}")
  fi
}

# Per-job token authentication (see the header); exports RAY_AUTH_MODE/RAY_AUTH_TOKEN.
rlctl_ray_auth() {
  export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
  if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ]; then
    RAY_AUTH_TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    export RAY_AUTH_TOKEN
  fi
}

_rlctl_ray_log() { printf '[rlctl ray %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# Start the head node in the background (blocking `ray start`), record its pid.
rlctl_ray_head() { # PORT NUM_CPUS NUM_DEVICES RESOURCE_NAME TEMP_DIR
  local port=$1 cpus=$2 devices=$3 resource=$4 temp=$5
  _rlctl_ray_resource_args "$cpus" "$devices" "$resource" || return
  rlctl_ray_auth
  mkdir -p "$temp"
  _rlctl_ray_log "head: port $port, $cpus CPUs, $devices ${resource:-CPU} devices, temp dir $temp"
  "${RLCTL_RAY:-ray}" start --head --block --port="$port" --include-dashboard=false \
    --disable-usage-stats --temp-dir="$temp" "${_rlctl_ray_args[@]}" &
  RLCTL_RAY_PID=$!
}

# Start a worker node that joins HEAD_IP:PORT, in the background; record its pid.
rlctl_ray_worker() { # HEAD_IP PORT NUM_CPUS NUM_DEVICES RESOURCE_NAME TEMP_DIR
  local head=$1 port=$2 cpus=$3 devices=$4 resource=$5 temp=$6
  _rlctl_ray_resource_args "$cpus" "$devices" "$resource" || return
  if [ "${RAY_AUTH_MODE:-}" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ]; then
    _rlctl_ray_log "worker: RAY_AUTH_MODE=token but no RAY_AUTH_TOKEN: pass the head's token"
    return 2
  fi
  mkdir -p "$temp"
  _rlctl_ray_log "worker on $(hostname): joining $head:$port, $cpus CPUs, $devices ${resource:-CPU} devices"
  "${RLCTL_RAY:-ray}" start --address="$head:$port" --block --disable-usage-stats \
    --temp-dir="$temp" "${_rlctl_ray_args[@]}" &
  RLCTL_RAY_PID=$!
}

# Poll until NODES nodes and DEVICES devices (GPU/NPU; CPUs when DEVICES counts a CPU
# cluster, i.e. when no GPU/NPU resource exists) have joined the cluster at ADDRESS.
# Prints the node count when ready ("rlctl: ray cluster ready: N nodes, ..."); on
# timeout prints what joined and returns 1.
rlctl_ray_wait() { # NODES DEVICES TIMEOUT_S ADDRESS
  local want_nodes=$1 want_devices=$2 timeout=$3 address=$4
  local deadline=$((SECONDS + timeout)) out="" nodes=0 gpus=0 npus=0 cpus=0 have=0
  while :; do
    if [ -n "$RLCTL_RAY_PID" ] && ! kill -0 "$RLCTL_RAY_PID" 2>/dev/null; then
      _rlctl_ray_log "the Ray head (pid $RLCTL_RAY_PID) exited before the cluster formed"
      return 1
    fi
    out=$("${RLCTL_RAY:-ray}" status --address="$address" 2>&1) || out=""
    # "Active:" lists one " 1 node_<id>" line per live node; "Usage:" has "0.0/2.0 GPU".
    nodes=$(awk '/^Active:/{a=1; next} /^[A-Z]/{a=0} a && /node_/{n++} END{print n+0}' <<<"$out")
    gpus=$(awk '$2=="GPU"{split($1,f,"/"); v=f[2]} END{print int(v+0)}' <<<"$out")
    npus=$(awk '$2=="NPU"{split($1,f,"/"); v=f[2]} END{print int(v+0)}' <<<"$out")
    cpus=$(awk '$2=="CPU"{split($1,f,"/"); v=f[2]} END{print int(v+0)}' <<<"$out")
    have=$((gpus + npus))
    [ "$have" = 0 ] && have=$cpus
    if [ "$nodes" -ge "$want_nodes" ] && [ "$have" -ge "$want_devices" ]; then
      echo "rlctl: ray cluster ready: $nodes nodes, $gpus GPU, $npus NPU, $cpus CPU"
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      _rlctl_ray_log "timed out after ${timeout}s: $nodes of $want_nodes nodes and $have of" \
        "$want_devices devices joined"
      printf '%s\n' "${out:-(ray status printed nothing: is the head up at $address?)}" >&2
      return 1
    fi
    sleep "${RLCTL_RAY_POLL_S:-2}"
  done
}

# Stop the Ray node this shell started (by its recorded pid; never `ray stop`).
# SIGTERM lets the blocking `ray start` take its raylet and GCS down with it.
rlctl_ray_stop() {
  local pid=$RLCTL_RAY_PID
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    local i
    for i in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      _rlctl_ray_log "ray (pid $pid) ignored SIGTERM for 10 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  wait "$pid" 2>/dev/null || true
  RLCTL_RAY_PID=""
}
