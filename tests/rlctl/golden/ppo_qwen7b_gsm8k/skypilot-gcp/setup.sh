# rlctl job golden (ppo-qwen7b-gsm8k): SkyPilot setup, on every node.
# Every value from the recipe is shell-quoted (the site's prelude is its own shell);
# secrets are not here: SkyPilot passes them to the job's environment.
set -euo pipefail
mkdir -p /tmp/rlctl/golden
cd /tmp/rlctl/golden
# the job's Python: the rlctl wheel shipped with the job over the image's packages, and
# what the image lacks of rlctl's requirements (rlctl/node/jobenv.py)
env PYTHONPATH=/tmp/rlctl/golden/rlctl-0.1.0-py3-none-any.whl python3 -m rlctl.node.jobenv /tmp/rlctl/golden/env /tmp/rlctl/golden/rlctl-0.1.0-py3-none-any.whl --extras engine
/tmp/rlctl/golden/env/bin/python -m engine.data.prepare gsm8k --out /tmp/rlctl/golden/data
