"""The bundled RL engine: a Ray single-controller trainer (HybridFlow design)."""
