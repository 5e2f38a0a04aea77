# rlctl job golden (quickstart): SkyPilot setup, on every node.
# Every value from the recipe is shell-quoted (the site's prelude is its own shell);
# secrets are not here: SkyPilot passes them to the job's environment.
set -euo pipefail
mkdir -p /tmp/rlctl/golden
cd /tmp/rlctl/golden
python -m engine.models.tiny /tmp/rlctl/golden/model
python -m engine.data.prepare synthetic --out /tmp/rlctl/golden/data
