"""Rollout backends behind one interface: hf (now), vllm and sglang (see base.py)."""
