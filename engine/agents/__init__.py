"""Agentic rollouts: multi-turn trajectories with tools, a sandbox for model-written code,
and environments (issue 17)."""
