"""A vision-language actor's export (engine.export, engine.train.fsdp_checkpoint): the
folder holds what the model needs to load with its processor (preprocessor_config.json,
the chat template, the tokenizer), and loaded back through the engine's own processor
path (engine.models.processor) it reads the prompts as the run read them and gives the
trained model's log-probs.

The checkpoint is real: one gloo rank (a process of its own) shards the tiny Qwen2.5-VL
with FSDP2, changes its vision tower's weights (so that an export of the base model's
would fail), and saves it as the trainer does. This file is also that process's script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).parents[2]
VISION_SCALE = 1.5  # the vision tower's weights, times this, before the save


def _scale_vision(model) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".visual." in f".{name}":
                param.mul_(VISION_SCALE)


@pytest.fixture(scope="module")
def exported(tiny_vl_model_dir, tmp_path_factory) -> Path:
    from engine.export import export_checkpoint

    step = tmp_path_factory.mktemp("run") / "global_step_1"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, __file__, str(tiny_vl_model_dir), str(step)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (step / "COMPLETE").write_text("{}")
    return export_checkpoint(str(step), tmp_path_factory.mktemp("out") / "vl")


def _prompts(folder, parquet):
    """The prompts as a run reads them with ``folder``'s tokenizer and processor."""
    from transformers import AutoConfig, AutoTokenizer

    from engine.config import DataConfig
    from engine.data import RLDataset
    from engine.models.processor import load_vision_processor

    tokenizer = AutoTokenizer.from_pretrained(folder)
    processor = load_vision_processor(folder, tokenizer, AutoConfig.from_pretrained(folder))
    data = RLDataset(str(parquet), tokenizer, DataConfig(), processor=processor)
    return tokenizer, [data[i] for i in range(len(data))]


def _logprobs(model, tokenizer, samples):
    from engine.train.forward import response_logprobs
    from engine.types import TokenBatch

    tokens = TokenBatch.from_ragged(
        [s.prompt_ids for s in samples],
        [[20, 21, 22]] * len(samples),
        tokenizer.pad_token_id,
        images=[s.images for s in samples],
    )
    with torch.no_grad():
        return response_logprobs(model, tokens, torch.device("cpu"))[0]


def test_export_loads_with_its_processor_and_gives_the_trained_logprobs(
    exported, tiny_vl_model_dir, tmp_path
):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from transformers import AutoModelForImageTextToText

    from engine.data.shapes import make_rows

    names = {p.name for p in exported.iterdir()}
    assert {"preprocessor_config.json", "chat_template.jinja", "tokenizer.json"} <= names
    parquet = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist(make_rows(4, split="test", seed=1)), parquet)
    tokenizer, samples = _prompts(exported, parquet)
    _, base_samples = _prompts(tiny_vl_model_dir, parquet)
    for got, want in zip(samples, base_samples, strict=True):  # the same prompts and pixels
        assert got.prompt_ids == want.prompt_ids
        assert torch.equal(got.images.pixel_values_PD, want.images.pixel_values_PD)
        assert torch.equal(got.images.positions_3P, want.images.positions_3P)

    model = AutoModelForImageTextToText.from_pretrained(exported, dtype=torch.float32).eval()
    trained = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float32)
    base = _logprobs(trained.eval(), tokenizer, samples)
    _scale_vision(trained)
    expected = _logprobs(trained, tokenizer, samples)
    got = _logprobs(model, tokenizer, samples)
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(got, base, atol=1e-3)  # the vision tower's own weights


def _save(model_dir: str, step_dir: str) -> None:
    """The checkpoint's one rank: shard, change the vision tower, save as the trainer."""
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from engine.config import FSDPConfig, ModelConfig, OptimConfig
    from engine.device import DEVICES
    from engine.train import fsdp
    from engine.train.fsdp_checkpoint import save_role

    store = Path(step_dir).parent / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    model = fsdp.load_hf_model(ModelConfig(path=model_dir), kind="causal_lm")
    model = fsdp.shard_model(model, FSDPConfig(), DEVICES["cpu"], gradient_checkpointing=False)
    _scale_vision(model)
    optimizer = fsdp.build_optimizer(model, OptimConfig())
    scheduler = fsdp.build_scheduler(optimizer, OptimConfig(), 1)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    save_role(Path(step_dir) / "actor", model, optimizer, scheduler, {}, tokenizer)
    dist.destroy_process_group()


if __name__ == "__main__":
    _save(sys.argv[1], sys.argv[2])
