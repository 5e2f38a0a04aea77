"""``python -m engine.sft``'s config (engine/config/sft*.py): every key of verl's SFT
trainer is known (tests/engine/verl_sft_keys.txt, made by ``scripts/verl_schema_keys.py
--sft``), verl's command lines load (group choices, Megatron's spellings), the rules
refuse what cannot run with the fix, and the command's --check, --help and notes work
without torch."""

from pathlib import Path

import pytest
import yaml

from engine.config.aliases import schema_key
from engine.config.given import field_at, start_note
from engine.config.keys import leaf
from engine.config.load import load
from engine.config.sft import SFT, engine_view
from engine.config.sft_sections import SFTConfig
from engine.errors import ConfigError
from engine.sft.cli import main

VERL_SFT_KEYS = [
    line.strip()
    for line in (Path(__file__).parent / "verl_sft_keys.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
REQUIRED = ["model.path=/models/tiny", "data.train_files=train.parquet"]


def sft(*overrides: str):
    return load([*REQUIRED, *overrides], schema=SFT).config


@pytest.mark.parametrize("key", VERL_SFT_KEYS)
def test_every_verl_sft_key_is_known(key):
    """A key of the schema under its own name or verl's other spelling, or a key inside
    a mapping that holds one of verl's subtrees."""
    target = schema_key(key, SFT.names)
    if leaf(target, SFTConfig) is not None:
        return
    found = field_at(target, SFTConfig())
    assert found is not None and found[1] != target, f"{key}: unknown to engine.sft"


def test_a_verl_fsdp_script_loads_as_written():
    """run_qwen3_8b_fsdp.sh's arguments (LoRA, Ulysses) with its defaults filled in."""
    cfg = sft(
        "data.val_files=test.parquet",
        "data.micro_batch_size_per_gpu=64",
        "data.messages_key=messages",
        "data.ignore_input_ids_mismatch=True",
        "optim.lr=1e-4",
        "engine=fsdp",
        "engine.ulysses_sequence_parallel_size=2",
        "model.use_remove_padding=true",
        "trainer.logger=['console']",
        "trainer.total_epochs=2",
        "model.lora_rank=32",
        "model.lora_alpha=16",
        "model.target_modules=all-linear",
        "trainer.n_gpus_per_node=8",
    )
    assert cfg.engine.strategy == "fsdp" and cfg.data_parallel_size == 4
    view = engine_view(cfg, 10)
    actor = view.actor_rollout_ref.actor
    assert actor.strategy == "fsdp2" and view.ulysses_size("actor") == 2
    assert view.actor_rollout_ref.model.lora_rank == 32 and actor.optim.lr == 1e-4
    assert actor.optim.total_training_steps == 10 and actor.grad_clip == 1.0
    assert view.token_budget("actor") == 8192 * 2  # verl's token budget × the SP group


def test_a_verl_megatron_script_loads_as_written():
    """run_qwen_megatron_fsdp.sh's arguments: Megatron's optimizer keys are read under
    this engine's names (lr_decay_style, min_lr), its other knobs accepted and named."""
    loaded = load(
        [
            *REQUIRED,
            "model=hf_model",
            "optim=megatron",
            "optim.lr=1e-5",
            "optim.lr_warmup_steps_ratio=0.2",
            "optim.betas=[0.9,0.95]",
            "optim.lr_warmup_init=0",
            "optim.lr_decay_style=cosine",
            "optim.min_lr=1e-6",
            "engine=megatron",
            "engine.tensor_model_parallel_size=4",
            "engine.use_megatron_fsdp=True",
            "+engine.override_transformer_config.gradient_accumulation_fusion=False",
            "trainer.logger=['console','file']",
            "trainer.n_gpus_per_node=8",
            "data.train_batch_size=8",
        ],
        schema=SFT,
    )
    cfg = loaded.config
    assert cfg.megatron and cfg.optim.lr_scheduler_type == "cosine"
    assert cfg.optim.min_lr_ratio == pytest.approx(0.1) and cfg.data_parallel_size == 2
    view = engine_view(cfg, 5)
    assert view.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 4
    note = start_note(loaded, "python -m engine.sft")
    assert note is not None
    for key in (
        "optim.lr_warmup_init",
        "engine.use_megatron_fsdp",
        "engine.override_transformer_config",
    ):
        assert key in note


def test_a_verl_automodel_script_loads_as_fsdp2():
    """run_qwen2_5_0_5b_automodel.sh's arguments: verl's AutoModel engine with every
    parallel size 1 is FSDP2 of the Hugging Face model, which this engine runs; its
    names for the checkpointing switch and the dtype are read as this engine's."""
    cfg = sft(
        "engine=automodel",
        "engine.distributed_strategy=fsdp2",
        "engine.tp_size=1",
        "engine.pp_size=1",
        "engine.cp_size=1",
        "engine.ep_size=1",
        "engine.use_torch_compile=False",
        "engine.activation_checkpointing=True",
        "engine.mp_param_dtype=bf16",
        "optim=automodel",
        "optim.lr=1e-5",
        "optim.lr_warmup_steps_ratio=0.2",
        "optim.weight_decay=0.1",
        "optim.betas=[0.9,0.95]",
        "optim.init_lr_ratio=0",
        "optim.min_lr_ratio=0.1",
        "trainer.n_gpus_per_node=8",
    )
    assert cfg.engine.strategy == "fsdp2" and not cfg.megatron
    assert cfg.model.enable_gradient_checkpointing and cfg.engine.dtype == "bfloat16"
    o = cfg.optim
    assert (o.lr, o.init_lr_ratio, o.min_lr_ratio, o.betas) == (1e-5, 0.0, 0.1, [0.9, 0.95])
    assert engine_view(cfg, 10).actor_rollout_ref.actor.strategy == "fsdp2"


def test_optim_automodel_brings_verls_defaults_for_it():
    """verl's optim/automodel.yaml differs from its fsdp one: a script that names the
    group and sets nothing else gets its values, not SFT's fsdp defaults."""
    plain, automodel = sft().optim, sft("optim=automodel").optim
    assert (plain.lr, plain.init_lr_ratio, plain.lr_scheduler_type) == (1e-3, 0.0, "constant")
    assert automodel.lr == 1e-5 and automodel.init_lr_ratio == 0.1
    assert (automodel.min_lr_ratio, automodel.lr_scheduler_type) == (0.01, "cosine")
    assert sft("optim=automodel", "optim.lr=3e-5").optim.lr == 3e-5  # the script's value wins


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["engine.tensor_model_parallel_size=2"], "is Megatron's: set engine=megatron"),
        (["engine=megatron", "engine.ulysses_sequence_parallel_size=2"], "context_parallel_size"),
        (["engine=megatron", "model.lora_rank=8"], "LoRA trains under FSDP2 here"),
        (["trainer.n_gpus_per_node=3", "data.train_batch_size=8"], "must split evenly over the 3"),
        (
            [
                "engine.ulysses_sequence_parallel_size=2",
                "model.use_remove_padding=false",
                "trainer.n_gpus_per_node=2",
            ],
            "needs model.use_remove_padding=true",
        ),
        (["data.truncation=middle"], "data.truncation"),
        (["trainer.save_freq=each"], "after_each_epoch"),
        (["optim.optimizer=Muon"], "trains with AdamW"),
        (["data.custom_cls.path=my.py", "data.custom_cls.name=D"], "messages column"),
        (["engine=torchtitan"], "TorchTitan engine is not in this engine"),
        (["trainer.default_hdfs_dir=hdfs://x"], "bucket URL"),
        (["engine.qat.enable=true"], "quantization-aware training"),
        (["engine=automodel", "engine.ep_size=8"], r"engine=megatron with engine\.expert_model"),
        (["engine=automodel", "engine.tp_size=2"], r"engine\.tensor_model_parallel_size=2"),
        (["engine=automodel", "engine.distributed_strategy=ddp"], "only fsdp2 here"),
        (["engine=automodel", "engine.enable_fp8=true"], "FP8 training is not in this engine"),
        (["optim=automodel", "optim.init_lr_ratio=1.5"], r"init_lr_ratio must be in \[0, 1\]"),
    ],
)
def test_what_cannot_run_is_refused_with_the_fix(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        sft(*overrides)


def test_an_unknown_key_suggests_the_near_miss():
    with pytest.raises(ConfigError, match=r"did you mean 'data\.max_length'"):
        sft("data.max_lenght=10")


def test_check_imports_neither_torch_nor_ray():
    import subprocess
    import sys

    code = (
        "import sys; from engine.sft.cli import main;"
        f" main(['--check', *{REQUIRED!r}, 'trainer.n_gpus_per_node=2', 'data.train_batch_size=8']);"
        " print('torch' in sys.modules, 'ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False False"), out.stdout


def test_check_help_and_print_config(capsys):
    main(["--check", *REQUIRED, "trainer.n_gpus_per_node=2", "data.train_batch_size=8"])
    out = capsys.readouterr().out
    assert out.startswith("config ok: supervised fine-tuning of /models/tiny")
    main(["--help", "data.max_length", "optim.lr_decay_style"])
    out = capsys.readouterr().out
    assert "data.max_length\n  type:    int\n  default: 1024" in out
    assert "verl's spelling of optim.lr_scheduler_type" in out
    main(["--print-config", *REQUIRED, "optim.warmup_style=cosine"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["optim"]["lr_scheduler_type"] == "cosine"
    with pytest.raises(SystemExit) as exited:
        main(["--check", *REQUIRED, "engine.strategy=veomni"])
    assert exited.value.code == 2


def test_every_key_has_help_and_docs_sft_md_lists_them():
    from engine.config.docs import SFT_DOC_PATH, render_sft_page
    from engine.config.keys import config_keys, sections

    missing = [k for k in config_keys(SFTConfig) if not leaf(k, SFTConfig).help.strip()]
    assert not missing, f"give these fields help text: {missing}"
    assert all(text for section, text in sections(SFTConfig).items()), "a section lacks a docstring"
    page = SFT_DOC_PATH.read_text(encoding="utf-8")
    assert page == render_sft_page(page), (
        "docs/sft.md's key tables are out of date: run"
        " `python -m engine.config.docs --sft --write` and commit it"
    )
