#!/usr/bin/env bash
# The GPU proof (docs/performance.md#the-gpu-proof): the engine's worker code on one GPU
# (FSDP2 over NCCL, bf16, the HF rollout, the fused head, packed sequences, LoRA) measured
# beside the planner's estimates, then a few GRPO steps of the whole engine; one results
# file. At most 10 minutes on one H100 or H200.
#   scripts/gpu_proof.sh            # on the GPU machine -> benchmarks/results/gpu_proof-DATE.txt
#   scripts/gpu_proof.sh --dry      # on CPU: small shapes, the same code paths (the suite runs it)
#   GPU_PROOF_OUT=DIR scripts/gpu_proof.sh    # the results file goes to DIR instead
# Extra arguments go to benchmarks/gpu_proof.py. What the GPU machine's image lacks
# (omegaconf, Ray) travels in .gpu-proof/, which scripts/gpu_proof_pack.sh makes where pip
# can reach PyPI; where they are missing it is installed into a temporary folder, nothing
# else is touched.
set -euo pipefail
cd "$(dirname "$0")/.."
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
py=${GPU_PROOF_PYTHON:-$py}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
site=/tmp/rlctl-gpu-proof/site
# only where this Python lacks the engine's own dependencies (the GPU machine's image)
if [ -d .gpu-proof ] && ! "$py" -c "import omegaconf, ray" 2>/dev/null; then
    mkdir -p "$site"
    if compgen -G ".gpu-proof/*.whl" >/dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" \
            .gpu-proof/*.whl
    fi
    if [ -f .gpu-proof/ray.tar.xz ] && [ ! -d "$site/ray" ]; then
        tar -xJf .gpu-proof/ray.tar.xz -C "$site"
    fi
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$site/bin:$PATH"
fi
dry=""
for arg in "$@"; do [ "$arg" = --dry ] && dry=1; done
out_dir=${GPU_PROOF_OUT:-benchmarks/results}
name="gpu_proof-$(date +%F)${dry:+-dry}.txt"
# the whole run stays inside 10 minutes: the cases stop starting at --budget-s (360 s), the
# engine run has 240 s of its own
exec timeout 590 "$py" benchmarks/gpu_proof.py --out "$out_dir/$name" "$@"
