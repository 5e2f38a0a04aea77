# rlctl job golden (grpo-qwen05b-reward-model), rendered by rlctl 0.1.0.
# SkyPilot's run section, on every node: start a Ray cluster of the job's own (port
# 6379; SkyPilot's Ray has 6380), wait until every node and device joined,
# run the engine on rank 0, stop Ray. Every value from the recipe is shell-quoted (the
# site's prelude is its own shell); secrets are not here: SkyPilot passes them to the
# job's environment.
set -euo pipefail
unset RAY_ADDRESS  # never join SkyPilot's own Ray by accident
# Ray's token authentication: every node gets the same per-launch token (a SkyPilot
# secret; with `sky launch` directly: --secret RAY_AUTH_TOKEN=$(openssl rand -hex 16)).
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-token}
if [ "$RAY_AUTH_MODE" = token ] && [ -z "${RAY_AUTH_TOKEN:-}" ]; then
  echo "rlctl: RAY_AUTH_TOKEN is not set: pass it as a secret (the same on every node)" >&2
  exit 2
fi
export NCCL_DEBUG=WARN
# the names of the job's secrets (SkyPilot puts their values in the environment)
export RLCTL_SECRET_NAMES=''
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /tmp/rlctl/golden
cd /tmp/rlctl/golden
# Ray from the job's Python (setup made it): its workers import the job's rlctl
export RLCTL_RAY=/tmp/rlctl/golden/env/bin/ray

# ---- the Ray bootstrap library (templates/ray/ray_cluster.sh), inlined ----------
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

# ---- end of the library ----------------------------------------------------------

rank=${SKYPILOT_NODE_RANK:?SkyPilot sets SKYPILOT_NODE_RANK}
num_nodes=${SKYPILOT_NUM_NODES:?SkyPilot sets SKYPILOT_NUM_NODES}
head_ip=$(printf '%s\n' "${SKYPILOT_NODE_IPS:?SkyPilot sets SKYPILOT_NODE_IPS}" | head -n 1)
devices=${SKYPILOT_NUM_GPUS_PER_NODE:-0}
port=6379
resource=GPU
# Not plain nproc: it honours OMP_NUM_THREADS, which SkyPilot sets to 1 for the task
# (Ray would then offer one CPU and a CPU job wait forever for its workers).
cpus=${RLCTL_NUM_CPUS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
temp_dir=${RLCTL_RAY_TEMP_DIR:-/tmp/rlctl-ray-golden}
if [ "$num_nodes" != 1 ] || { [ -n "$resource" ] && [ "$devices" != 1 ]; }; then
  echo "rlctl: SkyPilot gave $num_nodes nodes x $devices devices; the plan needs 1 x 1" >&2
  exit 2
fi
# pre-flight (rlctl/job/preflight.py): this node's checks, and an all-reduce over the nodes,
# before Ray starts; a failure ends the job with exit 2, which a managed job never
# retries (max_restarts_on_errors: 0; only the supervisor's 75 is recovered)
network=()
[ "$num_nodes" -gt 1 ] && network=(--rendezvous="$head_ip:29511")
if ! /tmp/rlctl/golden/env/bin/python -m engine.doctor --devices=cuda:1 --rollout=vllm --disk=/tmp/rlctl/golden/run:11.04 --model=Qwen/Qwen2.5-0.5B-Instruct --node="$(hostname)" --rank="$rank" --world="$num_nodes" "${network[@]}"; then
  echo "rlctl: pre-flight failed: the lines above name the node, the check and the fix; nothing else started (preflight: false in the recipe skips it)" >&2
  exit 2
fi
trap rlctl_ray_stop EXIT

# Succeeds while a TCP connection to HOST:PORT can be made (bash's /dev/tcp, no tools).
_rlctl_port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

if [ "$rank" = 0 ]; then
  rlctl_ray_head "$port" "$cpus" "$devices" "$resource" "$temp_dir"
  export RAY_ADDRESS="$head_ip:$port"
  rlctl_ray_wait "$num_nodes" 1 900 "$RAY_ADDRESS"
  cat > /tmp/rlctl/golden/engine.yaml <<'RLCTL_ENGINE_YAML_END'
data:
  train_files:
  - /tmp/rlctl/golden/data/train.parquet
  val_files:
  - /tmp/rlctl/golden/data/val.parquet
  prompt_key: prompt
  max_prompt_length: 512
  max_response_length: 512
  train_batch_size: 128
  val_batch_size: null
  truncation: error
  filter_overlong_prompts: false
  shuffle: true
  seed: 1
  train_max_samples: -1
  val_max_samples: -1
  apply_chat_template_kwargs: {}
  image_key: images
  mm_processor_kwargs: {}
  custom_cls:
    path: null
    name: null
actor_rollout_ref:
  model:
    path: Qwen/Qwen2.5-0.5B-Instruct
    tokenizer_path: null
    trust_remote_code: false
    enable_gradient_checkpointing: true
    use_remove_padding: false
    use_fused_kernels: false
    fused_kernel_options:
      impl_backend: torch
      chunk_size: 512
    dtype: bfloat16
    lora_rank: 0
    lora_alpha: 16.0
    target_modules: all-linear
    override_config: {}
    exclude_modules: null
    lora_adapter_path: null
  actor:
    strategy: fsdp2
    ppo_mini_batch_size: 32
    ppo_micro_batch_size_per_gpu: 16
    use_dynamic_bsz: false
    ppo_max_token_len_per_gpu: 16384
    ppo_epochs: 1
    recompute_old_log_prob: false
    grad_clip: 1.0
    clip_ratio: 0.2
    clip_ratio_low: null
    clip_ratio_high: null
    clip_ratio_c: 3.0
    tau_pos: 1.0
    tau_neg: 1.05
    loss_agg_mode: token-mean
    loss_scale_factor: null
    entropy_coeff: 0.0
    use_kl_loss: true
    kl_loss_coef: 0.001
    kl_loss_type: low_var_kl
    policy_loss:
      loss_mode: vanilla
      clip_cov_ratio: 0.0002
      clip_cov_lb: 1.0
      clip_cov_ub: 5.0
      kl_cov_ratio: 0.0002
      ppo_kl_coef: 1.0
    optim:
      lr: 1.0e-06
      betas:
      - 0.9
      - 0.999
      weight_decay: 0.01
      eps: 1.0e-08
      lr_warmup_steps: -1
      lr_warmup_steps_ratio: 0.0
      lr_scheduler_type: constant
      min_lr_ratio: 0.0
      init_lr_ratio: 0.0
      num_cycles: 0.5
      total_training_steps: -1
      optimizer: AdamW
      min_lr: 0.0
    ulysses_sequence_parallel_size: 1
    fsdp_config:
      param_offload: false
      optimizer_offload: false
      reshard_after_forward: true
      offload_policy: false
      mixed_precision:
        param_dtype: bfloat16
        reduce_dtype: float32
    megatron:
      tensor_model_parallel_size: 1
      pipeline_model_parallel_size: 1
      context_parallel_size: 1
      expert_model_parallel_size: 1
      sequence_parallel: true
      use_distributed_optimizer: true
      expert_tensor_parallel_size: null
    use_torch_compile: false
    entropy_from_logits_with_chunking: false
    entropy_from_logits_chunk_size: 2048
    entropy_checkpointing: false
    router_replay:
      mode: disabled
  rollout:
    name: vllm
    placement: colocate
    separate_nnodes: 0
    separate_n_gpus_per_node: 0
    'n': 8
    temperature: 1.0
    top_p: 1.0
    top_k: -1
    do_sample: true
    ignore_eos: false
    dtype: bfloat16
    gpu_memory_utilization: 0.8
    tensor_model_parallel_size: 1
    max_num_batched_tokens: 8192
    enforce_eager: false
    free_cache_engine: true
    log_prob_micro_batch_size_per_gpu: 32
    log_prob_use_dynamic_bsz: null
    log_prob_max_token_len_per_gpu: null
    micro_batch_size: null
    calculate_log_probs: false
    update_weights_bucket_megabytes: 512
    lora_as_adapter: false
    val_kwargs:
      'n': 1
      temperature: 0.0
      top_p: 1.0
      top_k: -1
      do_sample: false
    multi_turn:
      enable: false
      tool_config_path: null
      interaction_config_path: null
      agent_loop_config_path: null
      format: hermes
      max_assistant_turns: 4
      max_user_turns: null
      max_parallel_calls: 8
      max_tool_response_length: 2000
      tool_timeout_s: 30.0
      default_agent: tool_agent
      tool_response_truncate_side: right
    max_model_len: null
    max_num_seqs: 256
    enable_chunked_prefill: true
    enable_prefix_caching: true
    disable_log_stats: true
    scheduling_policy: fcfs
    logprobs_mode: processed_logprobs
    cudagraph_capture_sizes: null
    expert_parallel_size: 1
    engine_kwargs:
      vllm: {}
      sglang: {}
      trtllm: {}
    enable_rollout_routing_replay: false
  ref:
    strategy: null
    log_prob_micro_batch_size_per_gpu: 32
    log_prob_use_dynamic_bsz: null
    log_prob_max_token_len_per_gpu: null
    ulysses_sequence_parallel_size: null
    fsdp_config:
      param_offload: false
      optimizer_offload: false
      reshard_after_forward: true
      offload_policy: false
      mixed_precision:
        param_dtype: bfloat16
        reduce_dtype: float32
    megatron:
      tensor_model_parallel_size: null
      pipeline_model_parallel_size: null
      context_parallel_size: null
      expert_model_parallel_size: null
      sequence_parallel: null
      use_distributed_optimizer: true
      expert_tensor_parallel_size: null
    use_torch_compile: false
critic:
  enable: null
  strategy: fsdp2
  model:
    path: ''
    tokenizer_path: null
    trust_remote_code: false
    enable_gradient_checkpointing: true
    use_remove_padding: false
    use_fused_kernels: false
    fused_kernel_options:
      impl_backend: torch
      chunk_size: 512
    dtype: bfloat16
    lora_rank: 0
    lora_alpha: 16.0
    target_modules: all-linear
    override_config: {}
    exclude_modules: null
    lora_adapter_path: null
  optim:
    lr: 1.0e-05
    betas:
    - 0.9
    - 0.999
    weight_decay: 0.01
    eps: 1.0e-08
    lr_warmup_steps: -1
    lr_warmup_steps_ratio: 0.0
    lr_scheduler_type: constant
    min_lr_ratio: 0.0
    init_lr_ratio: 0.0
    num_cycles: 0.5
    total_training_steps: -1
    optimizer: AdamW
    min_lr: 0.0
  ppo_mini_batch_size: null
  ppo_micro_batch_size_per_gpu: 4
  use_dynamic_bsz: null
  ppo_max_token_len_per_gpu: null
  ppo_epochs: null
  cliprange_value: 0.5
  loss_agg_mode: token-mean
  grad_clip: 1.0
  ulysses_sequence_parallel_size: 1
  fsdp_config:
    param_offload: false
    optimizer_offload: false
    reshard_after_forward: true
    offload_policy: false
    mixed_precision:
      param_dtype: bfloat16
      reduce_dtype: float32
  megatron:
    tensor_model_parallel_size: 1
    pipeline_model_parallel_size: 1
    context_parallel_size: 1
    expert_model_parallel_size: 1
    sequence_parallel: true
    use_distributed_optimizer: true
    expert_tensor_parallel_size: null
reward_model:
  enable: true
  enable_resource_pool: false
  n_gpus_per_node: 0
  nnodes: 0
  style: discriminative
  model:
    path: Skywork/Skywork-Reward-V2-Qwen3-0.6B
    input_tokenizer: Qwen/Qwen2.5-0.5B-Instruct
    trust_remote_code: false
  judge:
    prompt_template: null
    prompt_template_path: null
    apply_chat_template: true
    verdict: score
    pattern: null
    score_range:
    - 0.0
    - 10.0
    unparsed_score: 0.0
    max_prompt_length: 2048
    max_new_tokens: 512
    temperature: 0.0
    top_p: 1.0
  micro_batch_size_per_gpu: 16
  data_sources: null
  reward_manager: naive
  num_workers: 4
  timeout_s: 10.0
  overlong_buffer:
    enable: false
    len: 0
    penalty_factor: 1.0
  reward_kwargs:
    max_resp_len: null
    overlong_buffer_cfg:
      log: false
custom_reward_function:
  path: null
  name: compute_score
algorithm:
  adv_estimator: grpo
  gamma: 1.0
  lam: 1.0
  norm_adv_by_std_in_grpo: true
  use_kl_in_reward: false
  kl_penalty: kl
  kl_ctrl:
    type: fixed
    kl_coef: 0.001
    horizon: 10000
    target_kl: 0.1
  filter_groups:
    enable: false
    metric: acc
    max_num_gen_batches: 10
  gdpo_reward_keys: null
  gdpo_reward_weights: null
  rollout_correction:
    rollout_is: null
    rollout_is_threshold: 2.0
    rollout_is_batch_normalize: false
    rollout_rs: null
    rollout_rs_threshold: null
    bypass_mode: false
    loss_type: ppo_clip
trainer:
  project_name: rlctl
  experiment_name: grpo-qwen05b-reward-model
  nnodes: 1
  n_gpus_per_node: 1
  device: cuda
  cpus_per_worker: 1
  total_epochs: 5
  total_training_steps: null
  critic_warmup: 0
  save_freq: 50
  test_freq: 10
  val_before_train: true
  resume_mode: auto
  resume_from_path: null
  rollout_data_dir: null
  logger:
  - console
  default_local_dir: /tmp/rlctl/golden/run
  run_dir: null
  max_actor_ckpt_to_keep: null
  preemption_save_steps: 1
  max_consecutive_skipped_updates: 5
  hang_timeout_factor: 5.0
  hang_timeout_floor_s: 3600.0
  max_restarts: 3
  export_hf_dir: null
  seed: 1
  balance_batch: false
  log_val_generations: 0
  validation_data_dir: null
  val_only: false
async_training:
  mode: sync
  staleness_threshold: 0.1
  trigger_parameter_sync_step: 1
  partial_rollout: true
  require_batches: null
  stream_chunk_tokens: 16
ray_kwargs:
  ray_init:
    num_cpus: null
    runtime_env:
      py_executable: null
model_engine: null
RLCTL_ENGINE_YAML_END
  code=0
  /tmp/rlctl/golden/env/bin/python -m engine.supervisor --max-restarts 3 --record /tmp/rlctl/golden/restarts.json --hand-back 75 -- --config /tmp/rlctl/golden/engine.yaml || code=$?
  echo "rlctl: the engine exited with code $code"
  rlctl_ray_stop  # the workers see the head go and stop theirs
  exit "$code"
fi

# A worker: wait for the head's port, join, then stay until the head is gone.
deadline=$((SECONDS + 900))
until _rlctl_port_open "$head_ip" "$port"; do
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "rlctl: the Ray head at $head_ip:$port did not come up in 900 s" >&2
    exit 1
  fi
  sleep 2
done
rlctl_ray_worker "$head_ip" "$port" "$cpus" "$devices" "$resource" "$temp_dir"
while kill -0 "$RLCTL_RAY_PID" 2>/dev/null && _rlctl_port_open "$head_ip" "$port"; do
  sleep 5
done
if _rlctl_port_open "$head_ip" "$port"; then
  # The head decides for the job: its engine sees this node gone (or its watchdog
  # the hang), and the supervisor hands the restart to SkyPilot, which starts Ray again
  # on every node. A non-zero exit here would fail the managed job first.
  echo "rlctl: this node's Ray stopped while the head is still up: the head decides" >&2
  while _rlctl_port_open "$head_ip" "$port"; do
    sleep 5
  done
  exit 0
fi
echo "rlctl: the head at $head_ip:$port is gone: stopping this node's Ray"
