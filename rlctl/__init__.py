"""rlctl: launch RL post-training of LLMs locally, on Slurm, or on any cloud through SkyPilot."""

__version__ = "0.1.0"
