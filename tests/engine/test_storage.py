"""engine/storage.py against a local directory, a real S3-compatible server (moto in
server mode, reached over HTTP on 127.0.0.1) and, where the package is installed, a
GCS emulator (gcp-storage-emulator, also a local HTTP server)."""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import uuid
from pathlib import Path

import pytest

from engine.errors import EngineError
from engine.storage import (
    BackgroundUploader,
    GCSStore,
    LocalStore,
    S3Store,
    StorageError,
    is_remote,
    open_store,
)

SECRET = "SENTINEL-secret-4f1c9e7a0b"
BUCKET = "rlctl-ckpt-test"
MiB = 1024 * 1024


# ----------------------------------------------------------------------------- servers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """A moto S3 server on 127.0.0.1 with one bucket, for the whole session."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture
def aws_env(moto_endpoint, monkeypatch, tmp_path):
    """This test's AWS settings: the moto endpoint, dummy keys, no files or IMDS."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIATESTINGKEYID0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto_endpoint


@pytest.fixture(scope="session")
def gcs_emulator():
    """A gcp-storage-emulator server on 127.0.0.1 with one bucket (skips if not installed)."""
    pytest.importorskip("google.cloud.storage")
    emulator = pytest.importorskip("gcp_storage_emulator.server")
    port = _free_port()
    server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def gcs_env(gcs_emulator, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    return gcs_emulator


def _prefix() -> str:
    return f"runs/{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["local", "s3", "gcs"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    if request.param == "s3":
        request.getfixturevalue("aws_env")
        return open_store(f"s3://{BUCKET}/{_prefix()}")
    request.getfixturevalue("gcs_env")
    return open_store(f"gs://{BUCKET}/{_prefix()}")


def _make_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


CHECKPOINT = {
    "actor/model_world_size_2_rank_0.distcp": os.urandom(300_000),
    "actor/model_world_size_2_rank_1.distcp": os.urandom(300_001),
    "actor/.metadata": b"\x00\x01binary\xff",
    "actor/hf/config.json": b'{"hidden_size": 8}',
    "rng/rank_0.pt": os.urandom(1234),
    "trainer_state.json": b'{"step": 10}',
    "empty.txt": b"",
}


# ----------------------------------------------------------------------------- Store API


def test_round_trip_nested_directory(store, tmp_path):
    src = _make_tree(tmp_path / "staging", CHECKPOINT)
    store.upload_dir(src, "global_step_10")
    out = tmp_path / "out"
    store.download_dir("global_step_10", out)
    assert _read_tree(out) == CHECKPOINT


def test_uploads_merge_into_one_destination(store, tmp_path):
    """Each node uploads its own shards of one checkpoint to the same place."""
    node0 = _make_tree(tmp_path / "n0", {"actor/rank_0.distcp": b"a0", "rng/rank_0.pt": b"r0"})
    node1 = _make_tree(tmp_path / "n1", {"actor/rank_1.distcp": b"a1", "rng/rank_1.pt": b"r1"})
    store.upload_dir(node0, "global_step_5")
    store.upload_dir(node1, "global_step_5")
    store.upload_dir(_make_tree(tmp_path / "again", {"rng/rank_0.pt": b"R0"}), "global_step_5")
    out = tmp_path / "out"
    store.download_dir("global_step_5", out)
    assert _read_tree(out) == {
        "actor/rank_0.distcp": b"a0",
        "actor/rank_1.distcp": b"a1",
        "rng/rank_0.pt": b"R0",
        "rng/rank_1.pt": b"r1",
    }


def test_list_dirs_and_exists(store, tmp_path):
    assert store.list_dirs() == []
    src = _make_tree(tmp_path / "s", {"actor/a.bin": b"x", "critic/c.bin": b"y", "f.json": b"{}"})
    for step in (20, 10, 30):
        store.upload_dir(src, f"global_step_{step}")
    assert store.list_dirs() == ["global_step_10", "global_step_20", "global_step_30"]
    assert store.list_dirs("global_step_10") == ["actor", "critic"]
    assert store.list_dirs("global_step_10/actor") == []
    assert store.list_dirs("missing") == []
    assert store.exists("global_step_10/f.json")  # a file
    assert store.exists("global_step_10/actor")  # a "directory"
    assert store.exists("global_step_10/actor/")
    assert not store.exists("global_step_10/COMPLETE")
    assert not store.exists("global_step_1")  # a name that only prefixes others
    assert not store.exists("global_step_10/act")


def test_marker_write_and_read(store):
    assert store.read_text("global_step_10/COMPLETE") is None
    store.write_text("global_step_10/COMPLETE", '{"step": 10}')
    assert store.read_text("global_step_10/COMPLETE") == '{"step": 10}'
    assert store.exists("global_step_10/COMPLETE")
    store.write_text("global_step_10/COMPLETE", "überschrieben ✓")
    assert store.read_text("global_step_10/COMPLETE") == "überschrieben ✓"


def test_delete_dir(store, tmp_path):
    src = _make_tree(tmp_path / "s", {"actor/a.bin": b"x", "b.json": b"{}"})
    store.upload_dir(src, "global_step_1")
    store.upload_dir(src, "global_step_10")
    store.write_text("global_step_1/COMPLETE", "1")
    store.delete_dir("global_step_1")
    assert store.list_dirs() == ["global_step_10"]
    assert not store.exists("global_step_1")
    assert store.read_text("global_step_1/COMPLETE") is None
    assert store.exists("global_step_10/actor/a.bin")  # a sibling sharing the name's prefix
    store.delete_dir("global_step_1")  # already gone: fine
    with pytest.raises(StorageError, match="refusing to delete the whole store"):
        store.delete_dir("")


def test_store_opened_at_a_checkpoint(store, tmp_path):
    """How resume uses it: a store rooted at one checkpoint, its root downloaded."""
    store.upload_dir(_make_tree(tmp_path / "s", CHECKPOINT), "global_step_7")
    store.write_text("global_step_7/COMPLETE", "7")
    sub = type(store)(store.url("global_step_7"))
    assert sub.exists("COMPLETE")
    assert sub.read_text("trainer_state.json") == '{"step": 10}'
    out = tmp_path / "resume"
    sub.download_dir("", out)
    assert _read_tree(out) == {**CHECKPOINT, "COMPLETE": b"7"}


def test_download_of_nothing_is_an_error(store, tmp_path):
    with pytest.raises(StorageError, match=r"nothing to download at .*global_step_99"):
        store.download_dir("global_step_99", tmp_path / "out")


def test_upload_of_a_missing_directory_is_an_error(store, tmp_path):
    with pytest.raises(StorageError, match="is not a directory"):
        store.upload_dir(tmp_path / "nope", "global_step_1")


def test_dotdot_paths_are_refused(store):
    with pytest.raises(StorageError, match=r"must not contain '\.\.'"):
        store.read_text("../other_run/COMPLETE")


# ----------------------------------------------------------------------------- big files


def test_s3_large_file_goes_multipart(aws_env, tmp_path):
    import boto3

    store = S3Store(
        f"s3://{BUCKET}/{_prefix()}", multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB
    )
    files = {"actor/big.distcp": os.urandom(20 * MiB), "small.json": b"{}"}
    store.upload_dir(_make_tree(tmp_path / "s", files), "global_step_1")
    head = boto3.client("s3").head_object(
        Bucket=BUCKET, Key=f"{store.prefix}/global_step_1/actor/big.distcp"
    )
    assert head["ContentLength"] == 20 * MiB
    assert head["ETag"].strip('"').endswith("-4")  # four 5 MiB parts
    out = tmp_path / "out"
    store.download_dir("global_step_1", out)
    assert _read_tree(out) == files


def test_gcs_large_file_goes_in_chunks(gcs_env, tmp_path):
    store = GCSStore(f"gs://{BUCKET}/{_prefix()}", chunk_size=4 * MiB)
    files = {"actor/big.distcp": os.urandom(9 * MiB + 17)}
    store.upload_dir(_make_tree(tmp_path / "s", files), "global_step_1")
    out = tmp_path / "out"
    store.download_dir("global_step_1", out)
    assert _read_tree(out) == files


# ----------------------------------------------------------------------------- uploader


def test_background_uploader_keeps_order_and_waits(store, tmp_path):
    done: list[str] = []
    with BackgroundUploader(store) as uploader:
        for step in (1, 2, 3):
            src = _make_tree(tmp_path / f"s{step}", {f"rank_0/{step}.bin": bytes([step]) * 1000})
            name = f"global_step_{step}"
            uploader.submit(src, name, on_done=lambda n=name: done.append(n))
        uploader.wait()
        assert uploader.pending() == 0
    assert done == ["global_step_1", "global_step_2", "global_step_3"]
    assert store.list_dirs() == done
    assert store.exists("global_step_3/rank_0/3.bin")


class _GatedStore(LocalStore):
    """A LocalStore whose uploads wait for a gate, recording their order."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = threading.Event()
        self.started: list[str] = []

    def upload_dir(self, local_dir: Path, dest: str) -> None:
        self.started.append(dest)
        assert self.gate.wait(10)
        super().upload_dir(local_dir, dest)


def test_background_uploader_does_not_block_and_times_out(tmp_path):
    store = _GatedStore(tmp_path / "store")
    src = _make_tree(tmp_path / "s", {"a.bin": b"a"})
    uploader = BackgroundUploader(store)
    uploader.submit(src, "global_step_1")  # returns while the upload waits
    uploader.submit(src, "global_step_2")
    assert uploader.pending() == 2
    with pytest.raises(TimeoutError, match=r"2 checkpoint uploads .* still running"):
        uploader.wait(timeout=0.05)
    store.gate.set()
    uploader.wait(timeout=10)
    assert uploader.pending() == 0
    assert store.started == ["global_step_1", "global_step_2"]
    with pytest.raises(StorageError, match="must not contain"):
        uploader.submit(src, "../elsewhere")  # refused in the caller, never queued
    assert uploader.pending() == 0
    uploader.close()
    with pytest.raises(RuntimeError, match="after close"):
        uploader.submit(src, "global_step_3")


def test_background_upload_error_to_a_missing_bucket(aws_env, tmp_path):
    store = open_store(f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/run")
    src = _make_tree(tmp_path / "s", {"actor/a.bin": b"x" * 100, "b.json": b"{}"})
    done: list[str] = []
    uploader = BackgroundUploader(store)
    uploader.submit(src, "global_step_10", on_done=lambda: done.append("10"))
    with pytest.raises(StorageError) as err:
        uploader.wait(timeout=30)
    message = str(err.value)
    assert isinstance(err.value, EngineError)
    assert f"{store.url('global_step_10')}" in message
    assert str(src) in message
    assert "does not exist" in message
    assert "AWS_ENDPOINT_URL" in message
    assert SECRET not in message and SECRET not in repr(err.value.__cause__)
    assert done == []  # no marker would be written
    assert uploader.pending() == 0  # the error was raised: nothing is left
    uploader.close()


def test_failed_upload_stays_pending_until_raised(tmp_path):
    """pending() == 0 must mean "all in the store": a failure keeps it above 0."""
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    store = _GatedStore(blocker / "store")  # every write under a file fails
    src = _make_tree(tmp_path / "s", {"a.bin": b"a"})
    uploader = BackgroundUploader(store)
    uploader.submit(src, "global_step_1")
    uploader.submit(src, "global_step_2")
    store.gate.set()
    with uploader._cond:  # both have run (and failed): the queue is empty
        assert uploader._cond.wait_for(lambda: uploader._unfinished == 0, timeout=10)
    assert uploader.pending() == 2  # both failed; neither counts as done
    with pytest.raises(StorageError, match=r"global_step_1 failed.*\(and 1 more uploads failed"):
        uploader.submit(src, "global_step_3")  # the next save hears of it
    assert uploader.pending() == 0
    uploader.close()


def test_on_done_errors_are_reported_without_secrets(aws_env, tmp_path):
    store = open_store(f"s3://{BUCKET}/{_prefix()}")
    src = _make_tree(tmp_path / "s", {"a.bin": b"a"})

    def on_done() -> None:
        raise ValueError(f"callback saw {os.environ['AWS_SECRET_ACCESS_KEY']}")

    uploader = BackgroundUploader(store)
    uploader.submit(src, "global_step_1", on_done=on_done)
    with pytest.raises(StorageError, match="on_done callback failed: ValueError") as err:
        uploader.close()
    assert SECRET not in str(err.value)
    assert store.exists("global_step_1/a.bin")


# ----------------------------------------------------------------------------- S3 errors


def test_s3_missing_bucket_is_a_storage_error(aws_env):
    store = open_store("s3://no-such-bucket-rlctl/run")
    with pytest.raises(StorageError, match="bucket 'no-such-bucket-rlctl' does not exist") as e1:
        store.list_dirs()
    with pytest.raises(StorageError, match="does not exist") as e2:
        store.read_text("global_step_1/COMPLETE")
    with pytest.raises(StorageError, match="does not exist") as e3:
        store.exists("global_step_1/COMPLETE")
    for err in (e1, e2, e3):
        assert "s3://no-such-bucket-rlctl/run" in str(err.value)
        assert SECRET not in str(err.value)
        assert err.value.__cause__ is None  # nothing else printed with it


def test_s3_without_credentials(aws_env, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    store = open_store(f"s3://{BUCKET}/run")
    with pytest.raises(StorageError, match="no AWS credentials found") as err:
        store.write_text("x", "y")
    assert "AWS_ACCESS_KEY_ID" in str(err.value) and "AWS_PROFILE" in str(err.value)
    assert f"s3://{BUCKET}/run/x" in str(err.value)


def test_s3_unreachable_endpoint(aws_env, monkeypatch):
    endpoint = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    store = open_store(f"s3://{BUCKET}/run")
    with pytest.raises(StorageError, match="cannot reach the S3 endpoint") as err:
        store.list_dirs()
    assert endpoint in str(err.value) and "AWS_ENDPOINT_URL" in str(err.value)
    assert SECRET not in str(err.value)


def test_s3_service_specific_endpoint_wins(aws_env, monkeypatch, tmp_path):
    """R2/MinIO style: AWS_ENDPOINT_URL_S3 names the S3 endpoint only."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    store = open_store(f"s3://{BUCKET}/{_prefix()}")
    store.write_text("global_step_1/COMPLETE", "1")
    assert store.read_text("global_step_1/COMPLETE") == "1"


# ----------------------------------------------------------------------------- GCS errors


def test_gcs_missing_bucket_is_a_storage_error(gcs_env):
    store = open_store("gs://no-such-bucket-rlctl/run")
    with pytest.raises(StorageError, match="bucket 'no-such-bucket-rlctl' does not exist"):
        store.list_dirs()
    with pytest.raises(StorageError, match="does not exist"):
        store.read_text("global_step_1/COMPLETE")
    with pytest.raises(StorageError, match="does not exist"):
        store.exists("global_step_1/COMPLETE")


def test_gcs_without_credentials(monkeypatch, tmp_path):
    pytest.importorskip("google.cloud.storage")
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    # An explicit key file that is missing fails at once, before any metadata-server probe.
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing-key.json"))
    monkeypatch.setenv("NO_GCE_CHECK", "true")
    with pytest.raises(StorageError, match="no Google Cloud credentials found") as err:
        open_store("gs://some-bucket/run")
    assert "GOOGLE_APPLICATION_CREDENTIALS" in str(err.value)
    assert "gs://some-bucket/run" in str(err.value)


# ----------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    ("path", "remote"),
    [
        ("s3://b/p", True),
        ("gs://b", True),
        ("/tmp/ckpt", False),
        ("checkpoints/x", False),
        ("file:///tmp/x", False),
        ("s3:/b", False),
    ],
)
def test_is_remote(path, remote):
    assert is_remote(path) is remote


def test_open_store_kinds(aws_env, tmp_path):
    assert isinstance(open_store(str(tmp_path)), LocalStore)
    local = open_store(f"file://{tmp_path}/run")
    assert isinstance(local, LocalStore) and local.url("a") == f"{tmp_path}/run/a"
    s3 = open_store("s3://bucket/a//b/")
    assert isinstance(s3, S3Store)
    assert (s3.bucket, s3.prefix, s3.root) == ("bucket", "a/b", "s3://bucket/a/b")
    assert s3.url("global_step_1/") == "s3://bucket/a/b/global_step_1"
    assert open_store("s3://bucket").url("x") == "s3://bucket/x"


def test_open_store_gcs_url(gcs_env):
    gcs = open_store("gs://bucket/run/")
    assert isinstance(gcs, GCSStore)
    assert (gcs.bucket_name, gcs.prefix, gcs.url("x")) == ("bucket", "run", "gs://bucket/run/x")


@pytest.mark.parametrize("url", ["s3://", "s3:///prefix", "gs://"])
def test_bucket_url_needs_a_bucket(url):
    with pytest.raises(StorageError, match="bucket/prefix"):
        open_store(url)


def test_unknown_scheme_points_at_s3_compatible_endpoints():
    with pytest.raises(StorageError, match="unsupported storage URL 'r2://b/p'") as err:
        open_store("r2://b/p")
    assert "AWS_ENDPOINT_URL" in str(err.value)


@pytest.mark.parametrize(
    ("url", "module", "extra"),
    [("s3://b/p", "boto3", "aws"), ("gs://b/p", "google.cloud.storage", "gcs")],
)
def test_missing_backend_names_the_extra(monkeypatch, url, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    parent = sys.modules.get(module.rpartition(".")[0])
    if parent is not None:  # `from google.cloud import storage` reads the attribute first
        monkeypatch.delattr(parent, module.rpartition(".")[2], raising=False)
    with pytest.raises(StorageError, match=rf"pip install 'rlctl\[{extra}\]'"):
        open_store(url)
