"""``actor_rollout_ref.model.use_fused_kernels`` and its options: checked up front,
each problem naming the key, the value and the fix."""

import pytest

from engine.config import load_config
from engine.errors import ConfigError

BASE = ["actor_rollout_ref.model.path=/models/tiny", "data.train_files=train.parquet"]
KEY = "actor_rollout_ref.model"


def one_problem(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        load_config([*BASE, *overrides])
    assert len(info.value.problems) == 1, info.value.problems
    return info.value.problems[0]


def test_off_by_default_and_verl_names_load():
    assert load_config(BASE).actor_rollout_ref.model.use_fused_kernels is False
    cfg = load_config(
        [*BASE, f"{KEY}.use_fused_kernels=true", f"{KEY}.fused_kernel_options.chunk_size=300"]
    )
    opts = cfg.actor_rollout_ref.model.fused_kernel_options
    assert cfg.actor_rollout_ref.model.use_fused_kernels and opts.chunk_size == 300
    assert opts.impl_backend == "torch"


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            [f"{KEY}.fused_kernel_options.chunk_size=0"],
            f"{KEY}.fused_kernel_options.chunk_size must be a positive number of tokens, got 0;",
        ),
        (
            [f"{KEY}.fused_kernel_options.impl_backend=triton"],
            f"{KEY}.fused_kernel_options.impl_backend: unknown fused kernel backend 'triton'",
        ),
        (
            [
                f"{KEY}.use_fused_kernels=true",
                f"{KEY}.fused_kernel_options.impl_backend=liger",
                "trainer.device=cpu",
            ],
            "impl_backend=liger runs Triton kernels on NVIDIA/AMD GPUs, but trainer.device=cpu:"
            " use impl_backend=torch",
        ),
        (
            ["algorithm.adv_estimator=gae", "critic.model.use_fused_kernels=true"],
            "critic.model.use_fused_kernels=true: the critic's value head has one output",
        ),
    ],
    ids=["chunk-0", "unknown-backend", "liger-on-cpu", "critic"],
)
def test_bad_values_are_refused_with_the_fix(overrides, expected):
    assert expected in one_problem(overrides)


def test_liger_on_gpus_is_accepted():
    cfg = load_config(
        [
            *BASE,
            f"{KEY}.use_fused_kernels=true",
            f"{KEY}.fused_kernel_options.impl_backend=liger",
            "trainer.device=cuda",
        ]
    )
    assert cfg.actor_rollout_ref.model.fused_kernel_options.impl_backend == "liger"


def test_megatron_roles_run_with_full_logits_and_a_note():
    # verl accepts the key with its Megatron engine: so does this one, whose Megatron head
    # keeps its full logits; the run is told so at start.
    from engine.config.notes import notes

    cfg = load_config(
        [*BASE, f"{KEY}.use_fused_kernels=true", "actor_rollout_ref.actor.strategy=megatron"]
    )
    (note,) = notes(cfg)
    assert "under megatron (actor)" in note and "actor_rollout_ref.actor.strategy" in note
    assert not notes(load_config([*BASE, f"{KEY}.use_fused_kernels=true"]))
