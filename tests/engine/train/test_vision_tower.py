"""The vision tower runs in every training forward of a vision-language batch
(engine.train.vision_tower): a micro-batch without images gets the same log-probs and a
zero gradient through the tower, and two FSDP ranks, one with an image and one without,
step together (without the blank image, gloo aborts on the ranks' mismatched gathers)."""

import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForImageTextToText

from engine.controller.dispatch import take
from engine.train.forward import response_logprobs
from engine.train.packing import model_call
from engine.train.vision_tower import NO_IMAGES
from engine.types import TokenBatch

CPU = torch.device("cpu")
REPO = Path(__file__).parents[3]


@pytest.fixture(scope="module")
def tokens(vl_prompts):
    tokenizer, samples = vl_prompts
    return TokenBatch.from_ragged(
        [s.prompt_ids for s in samples],
        [[20, 21]] * len(samples),
        tokenizer.pad_token_id,
        images=[s.images for s in samples],
    )


@pytest.mark.parametrize("packed", [False, True])
def test_a_text_micro_batch_runs_the_tower_for_nothing(tiny_vl_model_dir, tokens, packed):
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir, dtype=torch.float64)
    text = take(tokens, slice(3, 4))  # the row without an image
    call = model_call(model, text, CPU, packed)
    assert call.kwargs[NO_IMAGES] and "pixel_values" not in call.inputs
    ran = []
    model.model.visual.register_forward_hook(lambda *a: ran.append(1))
    logp, _ = response_logprobs(model, text, CPU, packed=packed)
    logp.sum().backward()
    assert ran  # the tower ran
    tower = [p.grad for n, p in model.named_parameters() if ".visual." in f".{n}"]
    assert tower and all(g is not None and (g == 0).all() for g in tower)
    # the same log-probs as the model's own forward of the row, without the tower
    ids = text.input_ids_BS[text.attention_mask_BS.bool()][None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -3:-1].log_softmax(-1)
    want = logits[[0, 1], [20, 21]].float()
    torch.testing.assert_close(logp[0].detach(), want, rtol=0, atol=1e-6)
    # a micro-batch with images passes them, no blank one
    assert NO_IMAGES not in model_call(model, take(tokens, slice(0, 1)), CPU, packed).kwargs


@pytest.mark.slow  # two processes sharding the model with FSDP2
def test_fsdp_ranks_with_and_without_images_step_together(tiny_vl_model_dir, tokens, tmp_path):
    path = tmp_path / "tokens.pkl"
    path.write_bytes(pickle.dumps(tokens))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, __file__, str(tiny_vl_model_dir), str(path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count("stepped") == 2


def _rank(rank, port, model_dir, path):
    import torch.distributed as dist

    from engine.config import FSDPConfig, ModelConfig
    from engine.device import DEVICES
    from engine.train import fsdp

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    tokens = pickle.loads(Path(path).read_bytes())
    model = fsdp.load_hf_model(ModelConfig(path=model_dir), kind="causal_lm")
    model = fsdp.shard_model(model, FSDPConfig(), DEVICES["cpu"], gradient_checkpointing=True)
    mine = take(tokens, slice(0, 1) if rank == 0 else slice(3, 4))  # an image; none
    for packed in (False, True):
        logp, _ = response_logprobs(model, mine, CPU, packed=packed)
        logp.sum().backward()
    print(f"rank {rank} stepped", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(port, sys.argv[1], sys.argv[2]), nprocs=2, join=True)
