"""Checkpoints in an S3 bucket (a real S3-compatible server, moto, on loopback): saved with
background uploads, marked complete last, pruned, and resumed from.

The runs are processes of their own: the workers upload, and they get the bucket's
address and keys as a job's workers do, from the environment of the process that starts
the Ray node (the test sets them; the Ray node of the in-process runs started before)."""

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def s3_server(monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"])
    client.create_bucket(Bucket="ckpt")
    yield client
    server.stop()


def test_checkpoints_to_a_bucket_and_resume(s3_server, tiny_model_dir, tmp_path, engine_process):
    from engine.data.synthetic import write_synthetic_dataset

    train, _ = write_synthetic_dataset(tmp_path / "data", n_train=64, n_val=8)
    url = "s3://ckpt/runs/demo"

    def run(steps: int):
        return engine_process(
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"data.train_files={train}",
            f"trainer.default_local_dir={url}",
            "trainer.experiment_name=demo",
            "data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "algorithm.adv_estimator=grpo",
            "trainer.save_freq=2", "trainer.max_actor_ckpt_to_keep=1",
            f"trainer.total_training_steps={steps}",
            cwd=tmp_path,
        )  # fmt: skip

    first = run(4)
    assert first.returncode == 0, first.stderr[-3000:]
    keys = {
        o["Key"] for o in s3_server.list_objects_v2(Bucket="ckpt", Prefix="runs/demo/")["Contents"]
    }
    assert "runs/demo/global_step_4/COMPLETE" in keys
    assert "runs/demo/global_step_4/actor/model/.metadata" in keys
    assert {
        "runs/demo/global_step_4/rng/rank_0.pt",
        "runs/demo/global_step_4/rng/rank_1.pt",
    } <= keys
    assert not any(k.startswith("runs/demo/global_step_2/") for k in keys)  # kept the last 1
    # Logs stay on the driver's machine; the bucket holds the checkpoints and the
    # progress rlctl status reads when the run's machine is out of its reach.
    assert (tmp_path / "runs" / "rlctl" / "demo" / "metrics.jsonl").is_file()
    assert "testing-secret" not in first.stdout + first.stderr
    assert progress_steps(tmp_path, f"{url}/progress.json") == ([1, 2, 3, 4], 4)

    resumed = run(6)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {url}/global_step_4 at step 4" in resumed.stdout
    keys = {
        o["Key"] for o in s3_server.list_objects_v2(Bucket="ckpt", Prefix="runs/demo/")["Contents"]
    }
    assert "runs/demo/global_step_6/COMPLETE" in keys
    # the resumed run kept the first run's steps: the curve goes on from the bucket
    assert progress_steps(tmp_path, f"{url}/progress.json") == ([1, 2, 3, 4, 5, 6], 6)


def progress_steps(tmp_path, url: str) -> tuple[list[int], int | None]:
    """The steps and total `rlctl status` shows for a SkyPilot job whose checkpoints
    are at ``url``'s folder (rlctl reads the bucket the engine wrote)."""
    from rlctl.store.jobs import JobStore
    from rlctl.store.progress import read_progress

    store = JobStore(tmp_path / "jobs.db")
    job = store.create(name="q", recipe_path="r.yaml", recipe_yaml="", plan_json="{}",
                       backend="skypilot")  # fmt: skip
    job = store.set_handle(job.id, {"mode": "managed", "job_id": 1, "progress": url})
    p = read_progress(job)
    assert p.note is None, p.note
    return [step for step, _ in p.scores], p.total_steps
