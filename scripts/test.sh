#!/usr/bin/env bash
# The test suite, as the README runs it. Extra arguments go to pytest:
#   scripts/test.sh -m "not slow"     # the quick run
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Megatron-core installed beside the venv (scripts/setup.sh): spawned workers inherit it.
if [ -d .megatron-core ]; then
    export PYTHONPATH="$PWD/.megatron-core${PYTHONPATH:+:$PYTHONPATH}"
fi
exec python -m pytest -q "$@"
