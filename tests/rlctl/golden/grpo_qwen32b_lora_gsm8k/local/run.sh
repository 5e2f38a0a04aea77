#!/usr/bin/env bash
# rlctl job golden (grpo-qwen32b-lora-gsm8k), rendered by rlctl 0.1.0.
# Every value below came from the recipe and is shell-quoted; secrets are not here:
# they reach the job through its environment only.
set -euo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cd /golden/home/.rlctl/jobs/golden

# pre-flight (rlctl/job/preflight.py): this machine's checks before anything of the job starts;
# a failure ends the job with exit 2 (a configuration error: never restarted)
if ! /opt/venv/bin/python -m engine.doctor --devices=cuda:4 --rollout=vllm --disk=/golden/home/.rlctl/jobs/golden/run:732.33 --model=Qwen/Qwen2.5-32B-Instruct; then
  echo "rlctl: pre-flight failed: the lines above name the check and the fix; nothing of the job started (preflight: false in the recipe skips it)" >&2
  exit 2
fi
/opt/venv/bin/python -m engine.data.prepare gsm8k --out /golden/home/.rlctl/jobs/golden/data
# the engine (python -m engine.main, the arguments after --) under its supervisor: started
# again after a failure worth retrying (preempted, hung, a worker died), at most
# trainer.max_restarts times; restarts.json records each attempt (engine/supervisor.py)
exec /opt/venv/bin/python -m engine.supervisor --max-restarts 3 --record /golden/home/.rlctl/jobs/golden/restarts.json -- --config /golden/home/.rlctl/jobs/golden/engine.yaml
