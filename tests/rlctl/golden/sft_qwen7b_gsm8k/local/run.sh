#!/usr/bin/env bash
# rlctl job golden (sft-qwen7b-gsm8k), rendered by rlctl 0.1.0.
# Every value below came from the recipe and is shell-quoted; secrets are not here:
# they reach the job through its environment only.
set -euo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cd /golden/home/.rlctl/jobs/golden

/opt/venv/bin/python -m engine.data.prepare gsm8k_sft --out /golden/home/.rlctl/jobs/golden/data
exec /opt/venv/bin/python -m engine.sft --config /golden/home/.rlctl/jobs/golden/engine.yaml
