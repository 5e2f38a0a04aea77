"""verl's entropy and compile keys (engine.train.logit_options): chunked and
checkpointed entropy give the same values and gradients as the plain computation, the
checkpointed one recomputes instead of keeping its graph, and torch.compile is used when
asked."""

import pytest
import torch

from engine.algo import entropy as logits_math
from engine.config import load_config
from engine.train import logit_options
from engine.train.logit_options import PLAIN, LogitOptions

REQUIRED = ["actor_rollout_ref.model.path=/models/tiny", "data.train_files=train.parquet"]


def logits(seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    return (torch.randn(3, 7, 13) * 4).requires_grad_()


@pytest.mark.parametrize(
    "options",
    [
        LogitOptions(entropy_chunk_size=2),
        LogitOptions(entropy_checkpointing=True),
        LogitOptions(entropy_chunk_size=3, entropy_checkpointing=True),
    ],
    ids=["chunked", "checkpointed", "both"],
)
def test_the_same_entropy_and_gradients(options):
    z_plain, z = logits(), logits()
    plain = PLAIN.entropy(z_plain)
    got = options.entropy(z)
    torch.testing.assert_close(got, plain)
    weights = torch.randn_like(plain)
    (plain * weights).sum().backward()
    (got * weights).sum().backward()
    torch.testing.assert_close(z.grad, z_plain.grad)


def test_checkpointing_recomputes_in_the_backward_pass(monkeypatch):
    calls = []
    real = logits_math.entropy_from_logits

    def counted(z, chunk_size=None):
        calls.append(z.shape)
        return real(z, chunk_size)

    monkeypatch.setattr(logits_math, "entropy_from_logits", counted)
    z = logits()
    LogitOptions(entropy_chunk_size=4, entropy_checkpointing=True).entropy(z).sum().backward()
    # two slices (4 + 3 positions), each run forward and again in the backward pass
    assert sorted(shape[-2] for shape in calls) == [3, 3, 4, 4]
    calls.clear()
    PLAIN.entropy(logits()).sum().backward()
    assert len(calls) == 1
    # under no_grad there is no graph: no checkpoint, one pass
    calls.clear()
    with torch.no_grad():
        LogitOptions(entropy_checkpointing=True).entropy(logits())
    assert len(calls) == 1


def test_compile_wraps_the_functions(monkeypatch):
    compiled = []

    def fake_compile(fn, dynamic):
        compiled.append((fn.__name__, dynamic))
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    logit_options._compiled.cache_clear()
    try:
        options = LogitOptions(compile=True)
        z, targets = logits(), torch.randint(0, 13, (3, 7))
        torch.testing.assert_close(options.logprobs(z, targets), PLAIN.logprobs(z, targets))
        options.entropy(z)
    finally:
        logit_options._compiled.cache_clear()
    assert compiled == [("logprobs_from_logits", True), ("entropy_from_logits", True)]


@pytest.mark.slow
def test_really_compiled_on_this_device():
    logit_options._compiled.cache_clear()
    z, targets = logits(), torch.randint(0, 13, (3, 7))
    options = LogitOptions(compile=True, entropy_chunk_size=3)
    torch.testing.assert_close(options.logprobs(z, targets), PLAIN.logprobs(z, targets))
    torch.testing.assert_close(options.entropy(z), PLAIN.entropy(z))


def test_the_options_come_from_the_roles_keys():
    actor = "actor_rollout_ref.actor"
    cfg = load_config(
        [
            *REQUIRED,
            f"{actor}.entropy_from_logits_with_chunking=true",
            f"{actor}.entropy_from_logits_chunk_size=512",
            f"{actor}.fsdp_config.entropy_checkpointing=true",  # verl's other spelling
            f"{actor}.use_torch_compile=true",
        ]
    )
    assert LogitOptions.of(cfg.actor_rollout_ref.actor) == LogitOptions(512, True, True)
    assert LogitOptions.of(load_config(REQUIRED).actor_rollout_ref.actor) == PLAIN
