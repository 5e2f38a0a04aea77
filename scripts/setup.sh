#!/usr/bin/env bash
# Set up a virtual environment with the launcher, the engine (CPU torch) and the dev tools.
#   TORCH_SPEC="torch==2.13.0" by default; set it to your accelerator's build on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
python -m pip install --quiet -e ".[engine,dev]"
# Megatron-core beside the venv, without its dependencies: its metadata pins numpy<2,
# which the rest of the environment needs; what the engine uses runs on numpy 2.
# scripts/test.sh puts .megatron-core on PYTHONPATH when it exists.
python -m pip install --quiet --no-deps --target .megatron-core "megatron-core==0.14.0"
echo "ready: . .venv/bin/activate"
