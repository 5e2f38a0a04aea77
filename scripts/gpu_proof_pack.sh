#!/usr/bin/env bash
# Make .gpu-proof/: what scripts/gpu_proof.sh installs on a GPU machine whose image has
# torch, transformers, peft and accelerate but not the rest of the engine's dependencies,
# and no network. Run it where pip reaches PyPI; carry .gpu-proof with the call (it is
# about 32 MB: the tool that lends GPU machines here carries 64 MiB).
#   PYVER   the GPU machine's Python (default 3.12)
# Pure-Python wheels of omegaconf, hydra-core and antlr4 (the config loader), jsonschema
# and its parts (Ray's), and Ray itself, without what the engine never imports (Java
# jars, RLlib, Serve, Tune, Train, LLM), as .tar.xz: Ray's wheel alone is 79 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
pyver=${PYVER:-3.12}
tag=cp${pyver/./}
py=python3
[ -x .venv/bin/python ] && py="$PWD/.venv/bin/python"
ray_version=$("$py" -c 'import ray; print(ray.__version__)' 2>/dev/null || echo 2.60.0)
rm -rf .gpu-proof && mkdir -p .gpu-proof/tmp
get() {
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
        --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$1" "${@:2}"
}
get .gpu-proof omegaconf==2.3.1 hydra-core==1.3.2 jsonschema==4.25.1 \
    jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.28.0
# antlr4-python3-runtime 4.9.3 (what omegaconf 2.3 pins) ships as a source archive only
"$py" -m pip wheel -q --no-deps -w .gpu-proof antlr4-python3-runtime==4.9.3
get .gpu-proof/tmp "ray==$ray_version"
(cd .gpu-proof/tmp && "$py" -m zipfile -e ray-*.whl unpacked \
    && rm -rf unpacked/ray/jars unpacked/ray/rllib unpacked/ray/serve unpacked/ray/tune \
        unpacked/ray/train unpacked/ray/llm \
    && chmod +x unpacked/ray/core/src/ray/raylet/raylet unpacked/ray/core/src/ray/gcs/gcs_server \
    && tar -cf - -C unpacked . | xz -T0 -6 > ../ray.tar.xz)
rm -rf .gpu-proof/tmp
du -sh .gpu-proof
