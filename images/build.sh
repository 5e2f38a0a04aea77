#!/usr/bin/env bash
# Build (and optionally push) the rlctl engine images, tagged rlctl/engine:<version>-<flavor>,
# the names rlctl/hardware.py puts in plans by default.
#
#   images/build.sh                 # build every image
#   images/build.sh cuda rocm       # only these flavors
#   PUSH=1 REGISTRY=ghcr.io/me images/build.sh   # build, tag for REGISTRY and push
#
# Run from anywhere; the build context is the repository root.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$ROOT/rlctl/__init__.py")"
REPO="rlctl/engine"

# flavor  Dockerfile   (tests/images/test_dockerfiles.py reads this table)
IMAGES=(
  "cuda images/Dockerfile.nvidia"
  "cuda-sglang images/Dockerfile.nvidia-sglang"
  "rocm images/Dockerfile.rocm"
  "ascend images/Dockerfile.ascend"
)

wanted=("$@")
for entry in "${IMAGES[@]}"; do
  read -r flavor dockerfile <<<"$entry"
  if ((${#wanted[@]})) && [[ ! " ${wanted[*]} " =~ " ${flavor} " ]]; then
    continue
  fi
  tag="${REPO}:${VERSION}-${flavor}"
  echo "==> ${tag} (${dockerfile})"
  docker build -f "$ROOT/$dockerfile" --build-arg "RLCTL_VERSION=${VERSION}" -t "$tag" "$ROOT"
  if [[ "${PUSH:-0}" == "1" ]]; then
    remote="${REGISTRY:+${REGISTRY}/}${tag}"
    [[ "$remote" != "$tag" ]] && docker tag "$tag" "$remote"
    docker push "$remote"
  fi
done
