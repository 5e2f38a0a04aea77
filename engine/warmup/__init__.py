"""Warm starts for the shipped tasks: short supervised runs that teach a tiny model a
task's format before RL (``python -m engine.warmup.secret``, ``engine.warmup.shapes``).
Above ``engine.data``, ``engine.models`` and ``engine.sft``, which they drive."""
