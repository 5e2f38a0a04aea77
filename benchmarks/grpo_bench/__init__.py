"""The parts of benchmarks/grpo_vs_trl.py: one GRPO configuration (``config``), the
systems that run it (``engine_run``, ``trl_run``, ``floor``), what the rest of the
machine did meanwhile (``contention``), and the report (``report``)."""
