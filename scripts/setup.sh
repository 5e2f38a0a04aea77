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
echo "ready: . .venv/bin/activate"
