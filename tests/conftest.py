import os

import pytest

# No model hub here or in CI: a hub name must fail at once, not after retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# SkyPilot reports usage to a public host by default: tests reach no network.
os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 model and its tokenizer, built once per test session."""
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)
