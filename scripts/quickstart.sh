#!/usr/bin/env bash
# The CPU quickstart: GRPO on the shipped synthetic task with a tiny model built here
# (no downloads), two FSDP workers on a local Ray cluster. A few minutes on 2 cores;
# watch critic/score/mean rise. Extra arguments are engine overrides, e.g.
#   scripts/quickstart.sh trainer.total_training_steps=60
set -euo pipefail
cd "$(dirname "$0")/.."
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
out=${QUICKSTART_DIR:-runs/quickstart}
[ -f "$out/model/config.json" ] || python -m engine.models.tiny "$out/model"
[ -f "$out/data/train.parquet" ] || python -m engine.data.prepare synthetic --out "$out/data"
exec python -m engine.main \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path="$out/model" \
    data.train_files="$out/data/train.parquet" \
    data.val_files="$out/data/val.parquet" \
    data.max_prompt_length=64 \
    data.max_response_length=8 \
    data.train_batch_size=32 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64 \
    actor_rollout_ref.actor.optim.lr=2e-3 \
    reward_model.num_workers=1 \
    trainer.device=cpu \
    trainer.n_gpus_per_node=2 \
    trainer.total_training_steps=50 \
    trainer.test_freq=10 \
    trainer.default_local_dir="$out/run" \
    "$@"
