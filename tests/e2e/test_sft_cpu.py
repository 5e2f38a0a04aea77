"""Supervised fine-tuning runs (engine.sft) on CPU, two workers, in this process
(tests/e2e/conftest.py's ``run_sft``): the tiny model learns the synthetic chat task
(two sums a conversation, the loss on the answers only), its validation loss agrees with
the exported model's own, a run resumed from a checkpoint retraces the uninterrupted
one exactly, LoRA trains the adapter alone, and Megatron-core gives FSDP2's losses.

One run serves several checks: the learning run is also the run that is resumed,
exported and compared with Megatron."""

import importlib.util
import math
import shutil

import pytest
import torch

from engine.loop.metrics import MACHINE_METRICS  # times, throughput, memory

pytestmark = pytest.mark.slow

STEPS = 6


def _has_megatron() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    from engine.data.synthetic import write_synthetic_chats

    return write_synthetic_chats(tmp_path_factory.mktemp("chats"), n_train=128, n_val=32)


def common(model, chats, run_dir, *extra):
    train, val = chats
    return [
        f"model.path={model}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=16",
        "data.use_dynamic_bsz=false",
        "data.micro_batch_size_per_gpu=3",  # 8 rows a rank: three micro-batches, uneven
        "optim.lr=3e-3",
        "optim.lr_scheduler_type=cosine",
        "optim.lr_warmup_steps=1",
        "optim.min_lr_ratio=0.3",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=3",
        "trainer.test_freq=3",
        *extra,
    ]


def trained(records):
    return {r["step"]: {k: v for k, v in r.items() if not k.startswith(MACHINE_METRICS)}
            for r in records}  # fmt: skip


@pytest.fixture(scope="module")
def learned(run_sft, tiny_model_dir, chats, tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    run = run_sft(
        *common(tiny_model_dir, chats, root / "run", f"trainer.export_hf_dir={root / 'hf'}")
    )
    return root, trained(run.records)


def test_the_validation_loss_falls_and_is_the_exported_models(learned, chats):
    root, steps = learned
    assert sorted(steps) == list(range(1, STEPS + 1))
    first, last = steps[3]["val/loss"], steps[STEPS]["val/loss"]
    assert last < first - 0.5 and last < 5.0, (first, last)  # measured: 5.35 -> 4.39
    assert steps[STEPS]["train/loss"] < steps[1]["train/loss"] - 2.5  # 7.80 -> 4.56
    # The exported model, in plain transformers: the NLL of every validation answer (and
    # its end-of-turn token), token-mean over the set, is the run's last val/loss.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.config.sft_sections import SFTDataConfig
    from engine.sft.dataset import ConversationDataset

    model = AutoModelForCausalLM.from_pretrained(root / "hf", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(root / "hf")
    val = ConversationDataset([str(chats[1])], tokenizer, SFTDataConfig())
    nll = count = 0.0
    with torch.no_grad():
        for c in val:
            ids = torch.tensor([c.ids])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
            mask = torch.tensor(c.loss_mask[1:], dtype=torch.float32)
            nll -= float((logp.gather(-1, ids[0, 1:, None])[:, 0] * mask).sum())
            count += float(mask.sum())
    assert count == 32 * 2 * 2  # two answers a conversation, each a digit and <|im_end|>
    assert nll / count == pytest.approx(last, rel=1e-4)


def test_a_resumed_run_retraces_the_uninterrupted_one(
    learned, run_sft, tiny_model_dir, chats, tmp_path
):
    """The state a run killed after step 3's checkpoint leaves is that checkpoint: a run
    started on a folder holding only it resumes there (trainer.resume_mode=auto) and its
    steps 4-6 are the uninterrupted run's, every metric bit for bit (weights, AdamW's
    moments, the cosine schedule, the loader's position in its shuffled epoch)."""
    root, steps = learned
    shutil.copytree(root / "run" / "global_step_3", tmp_path / "run" / "global_step_3")
    resumed = trained(run_sft(*common(tiny_model_dir, chats, tmp_path / "run")).records)
    assert sorted(resumed) == [4, 5, 6]
    for step in (4, 5, 6):
        assert resumed[step] == steps[step], f"step {step} differs after resume"


def test_lora_trains_the_adapter_alone(run_sft, tiny_model_dir, chats, tmp_path):
    from transformers import AutoModelForCausalLM

    from engine.export import export_checkpoint

    run_sft(
        *common(
            tiny_model_dir, chats, tmp_path / "run", f"trainer.export_hf_dir={tmp_path / 'merged'}"
        ),
        "model.lora_rank=8",
        "model.lora_alpha=16",
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
    )
    saved = tmp_path / "run" / "global_step_2"
    assert (saved / "sft" / "hf" / "adapter_config.json").is_file()
    adapter = export_checkpoint(str(saved), tmp_path / "adapter", role="sft", adapter_only=True)
    assert (adapter / "adapter_config.json").is_file()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    merged = AutoModelForCausalLM.from_pretrained(
        tmp_path / "merged", dtype=torch.float32
    ).state_dict()
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    moved = [n for n in base if any(f".{t}." in n for t in targets) and n.endswith("weight")]
    assert moved and all(not merged[n].equal(base[n]) for n in moved)  # B·A merged in
    assert all(merged[n].equal(base[n]) for n in base if n not in moved)  # the rest as loaded


@pytest.mark.skipif(
    not _has_megatron(),
    reason="megatron-core is not installed (pip install 'rlctl[megatron]'); see test_megatron_cpu.py",
)
@pytest.mark.parametrize("tp", [1, 2], ids=["dp2", "tp2"])
def test_megatron_takes_the_fsdp_losses(tp, learned, run_sft, tiny_model_dir, chats, tmp_path):
    """The same run on Megatron-core (TP 1: two data-parallel ranks; TP 2: one replica
    split over both): every step's loss, gradient norm and rate and both validation
    losses are FSDP2's to float32 rounding (packed rows against Megatron's padded ones)."""
    _, fsdp = learned
    megatron = trained(
        run_sft(
            *common(tiny_model_dir, chats, tmp_path / "run", "engine=megatron", "optim=megatron"),
            f"engine.tensor_model_parallel_size={tp}",
            "trainer.save_freq=-1",
        ).records
    )
    for step in range(1, STEPS + 1):
        for key in ("train/loss", "train/grad_norm", "train/lr", "train/loss_tokens"):
            assert megatron[step][key] == pytest.approx(fsdp[step][key], rel=1e-4), (step, key)
    for step in (3, STEPS):
        assert megatron[step]["val/loss"] == pytest.approx(fsdp[step]["val/loss"], rel=1e-4)
    assert not math.isnan(megatron[STEPS]["train/loss"])
