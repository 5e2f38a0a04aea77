"""python -m engine.export: a sharded FSDP2 checkpoint becomes a Hugging Face folder
that loads and computes exactly what the trained workers compute.

The sharded checkpoints are real: two processes (torchrun, gloo) shard the tiny model
with engine.train.fsdp and save it with engine.train.fsdp_checkpoint.save_role. This
file is also the script those processes run (see ``_save_sharded`` at the bottom).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).parents[2]
MARKER = "COMPLETE"
# Weights saved with both names of the tied embedding, and with only one of them.
TIED_ONE_NAME = "actor_without_lm_head"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


def _export_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine.export", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(**env),
    )


def _assert_user_error(result: subprocess.CompletedProcess, *phrases: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for phrase in phrases:
        assert phrase in result.stderr, result.stderr


def _export_main(capsys, *args: object) -> subprocess.CompletedProcess:
    """The command's entry point in this process (a subprocess costs seconds of imports);
    an unexpected exception would escape it instead of exiting."""
    from engine.export import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


def _fixed_input() -> torch.Tensor:
    return torch.tensor([[5, 17, 300, 42, 1000, 7, 8, 9], [2, 3, 4, 5, 6, 7, 8, 2047]])


@pytest.fixture(scope="module")
def sharded_run(tiny_model_dir, tmp_path_factory) -> Path:
    """A run directory with global_step_1 (complete: actor, critic and the variant
    without lm_head.weight), saved by two FSDP2 ranks."""
    run_dir = tmp_path_factory.mktemp("run")
    step = run_dir / "global_step_1"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        __file__,
        str(tiny_model_dir),
        str(step),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (step / MARKER).write_text("{}")
    return run_dir


@pytest.fixture(scope="module")
def original(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _only_role(src: Path, dest: Path, role: str) -> Path:
    """A copy of checkpoint ``src`` with one role in it."""
    dest.mkdir(parents=True)
    shutil.copytree(src / role, dest / role)
    (dest / MARKER).write_text("{}")
    return dest


# ----------------------------------------------------------------------------- exactness


def test_export_equals_the_sharded_model_exactly(sharded_run, original, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.export import export_checkpoint

    out = export_checkpoint(str(sharded_run / "global_step_1"), tmp_path / "hf")
    assert out == tmp_path / "hf"
    assert (out / "model.safetensors").is_file()
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert exported.dtype == torch.float32
    got, want = exported.state_dict(), original.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name
    with torch.no_grad():
        ids = _fixed_input()
        assert torch.equal(exported(ids).logits, original(ids).logits)
    # Inference settings back on; the tokenizer and generation config carried over.
    assert exported.config.use_cache is True
    assert exported.generation_config.eos_token_id == original.generation_config.eos_token_id
    text = "Tom has 3 apples. #### 3"
    assert (
        AutoTokenizer.from_pretrained(out)(text).input_ids
        == AutoTokenizer.from_pretrained(tiny_model_dir)(text).input_ids
    )


def test_tied_embedding_saved_under_one_name(sharded_run, original, tmp_path):
    from transformers import AutoModelForCausalLM

    from engine.export import export_checkpoint

    step = sharded_run / "global_step_1"
    ckpt = tmp_path / "global_step_1"
    ckpt.mkdir()
    shutil.copytree(step / TIED_ONE_NAME, ckpt / "actor")
    (ckpt / MARKER).write_text("{}")
    from torch.distributed.checkpoint import FileSystemReader

    stored = FileSystemReader(str(ckpt / "actor" / "model")).read_metadata().state_dict_metadata
    assert "lm_head.weight" not in stored and "model.embed_tokens.weight" in stored

    exported = AutoModelForCausalLM.from_pretrained(export_checkpoint(str(ckpt), tmp_path / "hf"))
    assert exported.config.tie_word_embeddings
    assert torch.equal(exported.lm_head.weight, original.lm_head.weight)
    with torch.no_grad():
        assert torch.equal(exported(_fixed_input()).logits, original(_fixed_input()).logits)


def test_bfloat16_export_from_the_run_dir(sharded_run, original, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "bf16"
    result = _export_cli(sharded_run, out, "--dtype", "bfloat16")
    assert result.returncode == 0, result.stderr
    # A run directory: its latest complete checkpoint, named.
    assert f"exporting {sharded_run / 'global_step_1'}" in result.stderr
    exported = AutoModelForCausalLM.from_pretrained(out, dtype="auto")
    assert exported.dtype == torch.bfloat16
    got, want = exported.state_dict(), original.state_dict()
    for name in want:
        assert got[name].dtype == torch.bfloat16, name
        assert torch.equal(got[name], want[name].to(torch.bfloat16)), name
    # Half the bytes of the float32 weights.
    fp32_bytes = sum(t.numel() * 4 for t in original.parameters())
    assert (out / "model.safetensors").stat().st_size < 0.6 * fp32_bytes


def test_critic_exports_a_one_output_token_classifier(sharded_run, tmp_path):
    from transformers import AutoModelForTokenClassification

    from engine.export import export_checkpoint

    step = sharded_run / "global_step_1"
    out = export_checkpoint(str(step), tmp_path / "critic", role="critic")
    exported = AutoModelForTokenClassification.from_pretrained(out).eval()
    assert exported.config.num_labels == 1
    assert exported.config.architectures == ["Qwen2ForTokenClassification"]
    reference = torch.load(step / "critic_full_state.pt", weights_only=True)
    got = exported.state_dict()
    assert got.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(got[name], tensor), name
    assert (out / "tokenizer.json").is_file()  # the critic saves none: the actor's


def test_later_incomplete_checkpoint_is_skipped(sharded_run, tmp_path):
    from engine.export import resolve_checkpoint

    run_dir = tmp_path / "run"
    shutil.copytree(sharded_run / "global_step_1", run_dir / "global_step_1")
    shutil.copytree(sharded_run / "global_step_1", run_dir / "global_step_3")
    (run_dir / "global_step_3" / MARKER).unlink()  # cut off while saving
    assert resolve_checkpoint(str(run_dir)) == str(run_dir / "global_step_1")


# ----------------------------------------------------------------------------- user errors


def test_user_errors_exit_2_with_the_fix(sharded_run, tmp_path, capsys):
    step = sharded_run / "global_step_1"
    out = tmp_path / "out"

    _assert_user_error(
        _export_main(capsys, tmp_path / "nowhere", out),
        "no such checkpoint directory",
        "global_step_<k>",
    )

    run_dir = tmp_path / "run"
    shutil.copytree(step, run_dir / "global_step_1")
    unfinished = run_dir / "global_step_2"
    shutil.copytree(step, unfinished)
    (unfinished / MARKER).unlink()
    _assert_user_error(
        _export_main(capsys, unfinished, out),
        "has no COMPLETE marker",
        f"Pass a complete one instead, such as {run_dir / 'global_step_1'}",
    )

    empty_run = tmp_path / "empty_run"
    (empty_run / "global_step_5").mkdir(parents=True)
    _assert_user_error(_export_main(capsys, empty_run, out), "has no complete checkpoint")
    _assert_user_error(_export_main(capsys, tmp_path, out), "neither a checkpoint")

    actor_only = _only_role(step, tmp_path / "actor_only", "actor")
    _assert_user_error(
        _export_main(capsys, actor_only, out, "--role", "critic"),
        "has no critic/",
        "pass --role actor",
    )
    critic_only = _only_role(step, tmp_path / "critic_only", "critic")
    _assert_user_error(
        _export_main(capsys, critic_only, out), "has no actor/", "pass --role critic"
    )

    no_weights = _only_role(step, tmp_path / "no_weights", "actor")
    shutil.rmtree(no_weights / "actor" / "model")
    _assert_user_error(_export_main(capsys, no_weights, out), "actor has no model/", "pass another")

    bad_config = _only_role(step, tmp_path / "bad_config", "actor")
    config_file = bad_config / "actor" / "hf" / "config.json"
    config = json.loads(config_file.read_text())
    config["num_hidden_layers"] = 3  # and four layer_types: transformers refuses it
    config_file.write_text(json.dumps(config))
    _assert_user_error(_export_main(capsys, bad_config, out), "cannot read", "layer_types")

    wrong_arch = _only_role(step, tmp_path / "wrong_arch", "actor")
    config_file = wrong_arch / "actor" / "hf" / "config.json"
    config["layer_types"] = config["layer_types"][:3]  # valid, but the weights have four
    config_file.write_text(json.dumps(config))
    _assert_user_error(
        _export_main(capsys, wrong_arch, out),
        "do not match",
        "unknown to the architecture: model.layers.3",
    )
    config["num_hidden_layers"] = 4
    config["layer_types"].append("full_attention")
    config["intermediate_size"] = 256
    config_file.write_text(json.dumps(config))
    _assert_user_error(_export_main(capsys, wrong_arch, out), "has shape", "expects")

    out.mkdir()
    (out / "model.safetensors").write_text("another model")
    _assert_user_error(_export_main(capsys, step, out), "not empty", "new output folder")
    assert (out / "model.safetensors").read_text() == "another model"  # left alone
    assert not list(tmp_path.glob(".out.partial-*"))  # and nothing half-written beside it


def test_push_to_hub_offline_fails_before_exporting(sharded_run, tmp_path):
    out = tmp_path / "hf"
    result = _export_cli(
        sharded_run / "global_step_1", out, "--push-to-hub", "me/model", HF_HUB_OFFLINE="1"
    )
    _assert_user_error(result, "HF_HUB_OFFLINE", "hf upload")
    assert not out.exists()


def test_push_to_hub_without_network_keeps_the_export(sharded_run, tmp_path):
    token = "hf_SENTINEL0123456789token"
    out = tmp_path / "hf"
    result = _export_cli(
        sharded_run / "global_step_1",
        out,
        "--push-to-hub",
        "me/model",
        "--private",
        HF_HUB_OFFLINE="0",
        HF_ENDPOINT="http://127.0.0.1:9",  # the discard port: connection refused
        HF_TOKEN=token,
    )
    _assert_user_error(result, "could not push", "hf upload me/model")
    assert token not in result.stdout + result.stderr
    assert (out / "model.safetensors").is_file()


# ----------------------------------------------------------------------------- buckets


@pytest.fixture
def s3_env(monkeypatch, tmp_path):
    """A real S3-compatible server (moto, over HTTP on 127.0.0.1) with one bucket."""
    boto3 = pytest.importorskip("boto3")
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    boto3.client("s3").create_bucket(Bucket="ckpts")
    yield "s3://ckpts"
    server.stop()


def test_export_from_a_bucket(sharded_run, original, s3_env, tmp_path):
    from transformers import AutoModelForCausalLM

    from engine.errors import EngineError
    from engine.export import export_checkpoint
    from engine.storage import open_store

    run_url = f"{s3_env}/runs/grpo"
    store = open_store(run_url)
    store.upload_dir(sharded_run / "global_step_1", "global_step_1")
    cut_off = tmp_path / "cut_off"  # an upload cut off: part of the files, no marker
    shutil.copytree(sharded_run / "global_step_1" / "actor" / "hf", cut_off / "actor" / "hf")
    store.upload_dir(cut_off, "global_step_2")

    out = export_checkpoint(run_url, tmp_path / "hf")  # the run: its latest complete one
    exported = AutoModelForCausalLM.from_pretrained(out)
    for name, tensor in original.state_dict().items():
        assert torch.equal(exported.state_dict()[name], tensor), name
    assert (out / "tokenizer.json").is_file()

    with pytest.raises(EngineError, match="no COMPLETE marker"):
        export_checkpoint(f"{run_url}/global_step_2", tmp_path / "other")
    with pytest.raises(EngineError, match="holds no complete checkpoint"):
        export_checkpoint(f"{s3_env}/runs/none", tmp_path / "other")
    critic = export_checkpoint(f"{run_url}/global_step_1", tmp_path / "critic", role="critic")
    assert (critic / "model.safetensors").is_file()
    assert (critic / "tokenizer.json").is_file()  # from the actor's hf/, downloaded too
    store.upload_dir(sharded_run / "global_step_1" / "actor", "global_step_4/actor")
    store.write_text(f"global_step_4/{MARKER}", "{}")
    with pytest.raises(EngineError, match="has no critic/: pass --role actor"):
        export_checkpoint(f"{run_url}/global_step_4", tmp_path / "other", role="critic")


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_trained_run_exports_what_the_actor_computes(tiny_model_dir, original, tmp_path):
    """Train with the real engine, export the final checkpoint, and compare log-probs
    from the export with the actor's own (workers on a local Ray cluster)."""
    import ray
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.config import load_config
    from engine.data.synthetic import write_synthetic_dataset
    from engine.export import export_checkpoint
    from engine.runtime import init_ray
    from engine.train.forward import response_logprobs
    from engine.types import TokenBatch
    from engine.workers.spawn import start_workers

    train, _ = write_synthetic_dataset(tmp_path / "data", n_train=32, n_val=8)
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "engine.main",
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"data.train_files={train}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=2",
            "data.max_prompt_length=64",
            "data.max_response_length=8",
            "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.temperature=0.7",  # log-probs depend on it
            "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "reward_model.num_workers=1",
            "trainer.val_before_train=false",
            "trainer.save_freq=3",  # and the final step, 2
            "trainer.total_training_steps=2",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    _check_startup_milestones(run_dir, result.stdout)
    final = run_dir / "global_step_2"
    assert (final / MARKER).is_file()

    exported = AutoModelForCausalLM.from_pretrained(
        export_checkpoint(str(run_dir), tmp_path / "hf")
    )
    exported.eval()
    changed = [
        name
        for name, tensor in original.state_dict().items()
        if not torch.equal(exported.state_dict()[name], tensor)
    ]
    assert len(changed) > len(original.state_dict()) // 2, "training left the weights as they were"

    cfg = load_config(config_file=final / "config.yaml")
    temperature = cfg.actor_rollout_ref.rollout.temperature
    assert temperature == 0.7
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = [tokenizer(t).input_ids for t in ("Tom has 3 apples.", "1 + 2 =", "Ana", "#### 7")]
    responses = [tokenizer(t).input_ids for t in (" He buys 2", " 3", " has 10 pens.", "")]
    responses[-1] = [tokenizer.eos_token_id]
    tokens = TokenBatch.from_ragged(prompts, responses, tokenizer.pad_token_id)

    init_ray(cfg)
    try:
        workers = start_workers(cfg)
        try:
            workers.host_all("load_checkpoint", str(final))
            actor_logp = workers.call_split("actor", "log_probs", tokens)
        finally:
            workers.shutdown()
    finally:
        ray.shutdown()

    with torch.no_grad():
        export_logp, _ = response_logprobs(
            exported, tokens, torch.device("cpu"), temperature=temperature
        )
    mask = tokens.response_mask_BR.bool()
    assert actor_logp.shape == export_logp.shape
    torch.testing.assert_close(export_logp[mask], actor_logp[mask], rtol=0, atol=1e-5)
    # And not by accident: the initial model's differ.
    with torch.no_grad():
        initial_logp, _ = response_logprobs(
            original, tokens, torch.device("cpu"), temperature=temperature
        )
    assert (initial_logp[mask] - actor_logp[mask]).abs().max() > 1e-3


def _check_startup_milestones(run_dir: Path, stdout: str) -> None:
    """The same run: the start-up's milestones (engine.startup) are in the first step's
    record only, in seconds from the process's start, in the order they happen."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, second = (
        {k.removeprefix("timing_s/startup/"): v for k, v in r.items() if "startup/" in k}
        for r in records
    )
    assert second == {}
    milestones = "imports data ray workers models first_step first_step_end"
    assert set(first) == set(milestones.split())  # no validation before this run
    assert 0 < first["imports"] <= first["data"] <= first["models"]
    assert first["ray"] <= first["workers"] <= first["models"] <= first["first_step"]
    assert first["first_step_end"] - first["first_step"] >= records[0]["timing_s/step"]
    assert "start-up, seconds from the start: " in stdout


# ----------------------------------------------------------------------------- the ranks


def _save_sharded(model_dir: str, step_dir: str) -> None:
    """One rank of torchrun: shard the tiny model (and a critic) with FSDP2 and save them
    as the trainer does; also the critic's full weights, for comparison."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from transformers import AutoTokenizer

    from engine.config import FSDPConfig, ModelConfig, OptimConfig
    from engine.device import DEVICES
    from engine.train import fsdp
    from engine.train.fsdp_checkpoint import save_role

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    step = Path(step_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for role, kind in (("actor", "causal_lm"), ("critic", "value")):
        torch.manual_seed(0)  # the critic's new value head: identical on every rank
        model = fsdp.load_hf_model(ModelConfig(path=model_dir), kind=kind)
        model = fsdp.shard_model(model, FSDPConfig(), DEVICES["cpu"], gradient_checkpointing=True)
        optimizer = fsdp.build_optimizer(model, OptimConfig())
        scheduler = fsdp.build_scheduler(optimizer, OptimConfig(), 1)
        save_role(
            step / role, model, optimizer, scheduler, {}, tokenizer if role == "actor" else None
        )
        if role == "actor":
            # The tied output embedding under one name only, as other writers store it.
            state = get_model_state_dict(model)
            assert state["lm_head.weight"] is not None
            del state["lm_head.weight"]
            variant = step / TIED_ONE_NAME
            dcp.save(state, checkpoint_id=str(variant / "model"))
            if rank == 0:
                shutil.copytree(step / role / "hf", variant / "hf")
        else:
            full = get_model_state_dict(
                model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            if rank == 0:
                torch.save(full, step / "critic_full_state.pt")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _save_sharded(sys.argv[1], sys.argv[2])
