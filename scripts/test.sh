#!/usr/bin/env bash
# The test suite, as the README runs it.
#   scripts/test.sh                    # everything (what CI runs), in two parts, below
#   scripts/test.sh --quick            # the quick run: -m "not slow" on two workers
#   scripts/test.sh -m "not vllm"      # extra arguments: one pytest run with them
#   RLCTL_TEST_WORKERS=2 scripts/test.sh tests/rlctl   # ... on two pytest-xdist workers
# With no arguments the suite runs in two parts: the tests not marked slow on two
# pytest-xdist workers (single-threaded tests: two at once use both cores), then the
# slow ones in one process (whole training runs, which keep both cores busy themselves,
# and whose Ray cluster and vLLM engines are kept for the whole part). Each part's exit
# status counts; pytest's 5 ("no tests collected") fails too.
# It runs in .venv (scripts/setup.sh) when there is one, activated or not; otherwise in
# the python on the PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
py=python
if [ -x .venv/bin/python ]; then
    # As activation would: its console scripts (rlctl, ray, sky) first on the PATH too.
    export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"
    py=.venv/bin/python
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Megatron-core installed beside the venv (scripts/setup.sh): spawned workers inherit it.
if [ -d .megatron-core ]; then
    export PYTHONPATH="$PWD/.megatron-core${PYTHONPATH:+:$PYTHONPATH}"
fi

on_workers() {  # N, then pytest's arguments
    local n=$1
    shift
    local parallel=()
    if [ "$n" -gt 1 ]; then
        parallel=(-n "$n" --dist loadscope --no-loadscope-reorder)  # groups: tests/conftest.py
    fi
    "$py" -m pytest -q "${parallel[@]}" "$@"
}

if [ "${1:-}" = "--quick" ]; then
    shift
    exec env RLCTL_TEST_WORKERS="${RLCTL_TEST_WORKERS:-2}" bash "$0" -m "not slow" "$@"
fi
if [ $# -gt 0 ]; then
    on_workers "${RLCTL_TEST_WORKERS:-1}" "$@"
    exit
fi

# The whole suite: each part records its durations, and the two make the run's file.
out=${RLCTL_DURATIONS_OUT:-$PWD/.pytest-durations.json}
status=0
RLCTL_DURATIONS_OUT="$out.quick" on_workers 2 -m "not slow" || status=$?
slow=0
RLCTL_DURATIONS_OUT="$out.slow" on_workers 1 -m slow || slow=$?
[ "$status" -ne 0 ] || status=$slow
"$py" - "$out" "$out.quick" "$out.slow" <<'EOF' || true
import json, os, sys
out, *parts = sys.argv[1:]
runs = [json.load(open(p)) for p in parts if os.path.exists(p)]
if runs:
    merged = dict(runs[-1], args=[a for r in runs for a in r["args"]],
                  exitstatus=max(r["exitstatus"] for r in runs),
                  tests={k: v for r in runs for k, v in r["tests"].items()})
    open(out, "w").write(json.dumps(merged, indent=1) + "\n")
EOF
rm -f "$out.quick" "$out.slow"
exit "$status"
