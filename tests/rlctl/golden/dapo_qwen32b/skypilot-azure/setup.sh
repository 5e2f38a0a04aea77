# rlctl job golden (dapo-qwen32b): SkyPilot setup, on every node.
# Every value from the recipe is shell-quoted (the site's prelude is its own shell);
# secrets are not here: SkyPilot passes them to the job's environment.
set -euo pipefail
mkdir -p /tmp/rlctl/golden
cd /tmp/rlctl/golden
