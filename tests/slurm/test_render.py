"""The Slurm backend without Slurm: the sbatch script it renders, the Ray bootstrap
library, the profile loader, and how Slurm's answers map to job states."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from rlctl import api
from rlctl.backends import slurm
from rlctl.backends.slurm import SlurmBackend, SlurmProfile, load_profile, profile_from_mapping
from rlctl.errors import RlctlError
from rlctl.job.spec import build_spec
from rlctl.recipe.load import load_recipe
from rlctl.store.jobs import Job, JobState

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "templates" / "ray" / "ray_cluster.sh"
JOB_ID = "t-abc123"
NASTY = "a$(touch PWNED)`touch PWNED2`; touch PWNED3 'q' \"dq\"\nline2 $HOME \\"


def write_recipe(tmp_path: Path, body: str, base: str = "quickstart.yaml") -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: {REPO / 'recipes' / base}\n{body}")
    return path


def rendered(tmp_path: Path, recipe: Path | str, **profile) -> dict[str, str]:
    recipe_obj = load_recipe(REPO / "recipes" / recipe if isinstance(recipe, str) else recipe)
    plan = api.plan_recipe(recipe_obj)
    backend = SlurmBackend(SlurmProfile(job_root=str(tmp_path / "jobs"), **profile))
    spec = build_spec(recipe_obj, plan, backend.paths(JOB_ID, recipe_obj.checkpoints))
    return backend.render(JOB_ID, spec).files


def sbatch_lines(script: str) -> list[str]:
    return [
        line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH")
    ]


def driver_command(script: str) -> list[str]:
    """The driver step's command, as bash will split it: the engine under its supervisor."""
    (line,) = [
        x for x in script.splitlines() if x.strip().startswith("exec ") and "engine.super" in x
    ]
    return shlex.split(line)[1:]


def doctor_command(script: str) -> list[str]:
    """The pre-flight step's command on each node, as bash will split it."""
    (line,) = [x for x in script.splitlines() if x.strip().startswith("exec ") and "doctor" in x]
    return shlex.split(line)[1:]


CPU2 = 'hardware: {accelerators: "cpu:1", nodes: 2}\n'


def test_cpu_job_sbatch_lines(tmp_path):
    files = rendered(tmp_path, write_recipe(tmp_path, CPU2))
    assert set(files) == {"job.sbatch", "ray_cluster.sh", "engine.yaml"}
    root = tmp_path / "jobs" / JOB_ID
    assert sbatch_lines(files["job.sbatch"]) == [
        f"--job-name={JOB_ID}",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=2",
        f"--output={root}/job.log",
        "--open-mode=append",
        "--no-requeue",
    ]
    script = files["job.sbatch"]
    assert "RAY_RESOURCE=CPU" in script and "RAY_NODES=2" in script
    # the node-array bug: one array element per node
    assert 'mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")' in script
    assert "srun --overlap --nodes=1 --ntasks=1 -w" in script
    assert files["ray_cluster.sh"] == LIBRARY.read_text()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    # every node's pre-flight before Ray: disk for the checkpoints, an all-reduce over both
    env = f"{tmp_path}/jobs/{JOB_ID}"
    assert doctor_command(script) == [
        f"{env}/env/bin/python", "-m", "engine.doctor", f"--disk={env}/run:0.03",
        "--node=${SLURMD_NODENAME:-$(hostname)}", "--rank=$2", "--world=$RAY_NODES", "${network[@]}",
    ]  # fmt: skip
    assert 'step rlctl-doctor "${nodes[$i]}" doctor "$i" &' in script
    assert script.index("step rlctl-doctor") < script.index("step rlctl-ray")
    # the engine under its supervisor, its restarts from the engine config, its record in
    # the job's directory; no requeue without --requeue
    assert driver_command(script) == [
        f"{root}/env/bin/python", "-m", "engine.supervisor", "--max-restarts", "3",
        "--record", f"{root}/restarts.json", "--stop-marker", f"{root}/stop-requested",
        "--", "--config", f"{root}/engine.yaml",
    ]  # fmt: skip


def test_every_profile_option(tmp_path):
    files = rendered(
        tmp_path,
        "ppo_qwen7b_gsm8k.yaml",
        partition="gpu",
        account="proj-42",
        qos="high",
        constraint="h100&ib",
        time="24:00:00",
        mem="0",
        cpus_per_task=96,
        exclusive=True,
        requeue=True,
        signal_grace_s=300,
        sbatch=("--reservation=rl", "--comment=rlctl"),
    )
    lines = sbatch_lines(files["job.sbatch"])
    for expected in (
        "--gres=gpu:h100:8",
        "--cpus-per-task=96",
        "--partition=gpu",
        "--account=proj-42",
        "--qos=high",
        "--constraint=h100&ib",
        "--time=24:00:00",
        "--mem=0",
        "--exclusive",
        "--requeue",
        "--signal=B:TERM@300",
        "--reservation=rl",
        "--comment=rlctl",
    ):
        assert expected in lines, (expected, lines)
    assert "--no-requeue" not in lines
    # requeue on: the supervisor may leave a preempted run to Slurm, through the marker
    root = tmp_path / "jobs" / JOB_ID
    command = driver_command(files["job.sbatch"])
    assert command[command.index("--requeue-marker") + 1] == f"{root}/requeue"
    assert 'if [ -e "$REQUEUE_MARKER" ]; then' in files["job.sbatch"]
    assert "export NCCL_DEBUG=WARN" in files["job.sbatch"]  # the catalog's env fragment
    assert "RAY_RESOURCE=GPU" in files["job.sbatch"] and "DEVICES_PER_NODE=8" in files["job.sbatch"]


@pytest.mark.parametrize(
    ("request_kind", "expected"),
    [
        ("gres", "--gres=gpu:h100:8"),
        ("gres-untyped", "--gres=gpu:8"),
        ("gpus-per-node", "--gpus-per-node=8"),
    ],
)
def test_gres_or_gpus(tmp_path, request_kind, expected):
    files = rendered(tmp_path, "ppo_qwen7b_gsm8k.yaml", gpu_request=request_kind)
    devices = [
        line for line in sbatch_lines(files["job.sbatch"]) if line.startswith(("--gres", "--gpus"))
    ]
    assert devices == [expected]


def test_ascend_and_amd(tmp_path):
    ascend = rendered(tmp_path, "grpo_qwen7b_ascend.yaml", network_interface="eth0")["job.sbatch"]
    assert "--gres=npu:ascend910b:8" in sbatch_lines(ascend)
    assert "RAY_RESOURCE=NPU" in ascend
    assert "export HCCL_CONNECT_TIMEOUT=1200" in ascend
    assert "export HCCL_SOCKET_IFNAME=eth0" in ascend and "export NCCL_SOCKET_IFNAME=eth0" in ascend
    amd = rendered(tmp_path, "grpo_qwen3_8b_mi300x.yaml", container="apptainer", image="/img/r.sif")
    assert "--gres=gpu:mi300x:8" in sbatch_lines(amd["job.sbatch"])
    assert "IN_CONTAINER=(apptainer exec --rocm --bind=" in amd["job.sbatch"]


def test_containers(tmp_path):
    root = tmp_path / "jobs" / JOB_ID
    pyxis = rendered(
        tmp_path,
        "ppo_qwen7b_gsm8k.yaml",
        container="pyxis",
        container_mounts=("/data:/data",),
    )["job.sbatch"]
    assert (
        f"STEP_PREFIX=(--container-image=vllm/vllm-openai:v0.33.0 --container-mounts={root}:{root},/data:/data"
        in pyxis
    )
    apptainer = rendered(
        tmp_path, "ppo_qwen7b_gsm8k.yaml", container="apptainer", image="/images/rl.sif"
    )["job.sbatch"]
    assert f"IN_CONTAINER=(apptainer exec --nv --bind={root}:{root} /images/rl.sif)" in apptainer
    none = rendered(tmp_path, "ppo_qwen7b_gsm8k.yaml")["job.sbatch"]
    assert "STEP_PREFIX=()" in none and "IN_CONTAINER=()" in none


def test_injection_passes_literally(tmp_path):
    """Env values and engine overrides holding $(...), backticks, ;, quotes and newlines
    reach the job as text: run the script's header with bash, nothing is executed."""
    recipe = tmp_path / "evil.yaml"
    import yaml

    recipe.write_text(
        f"extends: {REPO / 'recipes' / 'quickstart.yaml'}\n"
        + yaml.safe_dump(
            {
                "hardware": {"accelerators": "cpu:1", "nodes": 2},
                "env": {"EVIL": NASTY, "PLAIN": "x"},
                "engine": {"trainer.project_name": NASTY},
            }
        )
    )
    files = rendered(tmp_path, recipe)
    script = files["job.sbatch"]
    assert NASTY not in script  # never raw
    assert yaml.safe_load(files["engine.yaml"])["trainer"]["project_name"] == NASTY
    header = script.split('. "$RLCTL_ROOT/ray_cluster.sh"')[0]
    work = tmp_path / "work"
    work.mkdir()
    out = subprocess.run(
        ["bash", "-c", header + '\nprintf "%s" "$EVIL"'],
        cwd=work,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == NASTY
    assert list(work.iterdir()) == []  # no PWNED files


@pytest.mark.parametrize(
    "profile",
    [
        {"partition": "gpu\n#SBATCH --x"},
        {"partition": "a;touch x"},
        {"account": "$(id)"},
        {"sbatch": ("--comment=$(id)",)},
        {"sbatch": ("--comment=a\ntouch x",)},
        {"sbatch": ("not-an-option",)},
        {"job_root": "/tmp/a b"},
        {"container": "docker"},
        # values that are options, not values (issue 15)
        {"partition": "--help"},
        {"account": "-rf"},
        {"sbatch": ("-rf",)},
        {"sbatch": ("--help",)},
        {"sbatch": ("--reservation=--help",)},
        {"sbatch": ("--export=NONE",)},  # would drop the secrets from the job's environment
        {"sbatch": ("--output=/elsewhere",)},  # rlctl reads the log where it put it
        {"sbatch": ("-J other",)},
        {"image": "a'b\"c"},
        {"image": "--help"},
        {"network_interface": "-x"},
        {"container_mounts": ("/a:/b,/c:/d",)},
    ],
)
def test_unsafe_profile_values_are_refused(profile):
    with pytest.raises(RlctlError) as info:
        SlurmProfile(**profile)
    field = next(iter(profile))
    assert field.replace("container_mounts", "container_mounts entry") in str(info.value) or (
        field == "sbatch" and "sbatch line" in str(info.value)
    )


@pytest.mark.parametrize(
    "profile",
    [
        {"sbatch": ("--reservation=rl", "--exclusive", "-p gpu", "--gres=gpu:8", "--comment rl")},
        {"image": "nvcr.io#nvidia/pytorch:24.01-py3"},
        {"image": "docker://rlctl/engine:0.1.0-cuda"},
        {"network_interface": "^docker,lo"},
        {"time": "1-00:00:00", "constraint": "a100&ib", "partition": "gpu,debug"},
    ],
)
def test_site_values_as_sites_write_them(profile):
    SlurmProfile(**profile)


def test_an_unquoted_time_is_refused_not_read_as_minutes(tmp_path):
    """YAML 1.1 reads `time: 24:00:00` as 86400 (base 60): sbatch would take minutes."""
    with pytest.raises(RlctlError, match="time 86400 is a number") as info:
        profile_from_mapping({"time": 86400})
    assert 'quote it: time: "24:00:00"' in info.value.hint
    assert profile_from_mapping({"time": "24:00:00"}).time == "24:00:00"


def test_profile_loader(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path))
    assert load_profile() == SlurmProfile()
    (tmp_path / "slurm.yaml").write_text(
        "partition: gpu\nexclusive: true\nsbatch: --reservation=rl\nprelude: [module load cuda]\n"
    )
    profile = load_profile()
    assert profile.partition == "gpu" and profile.exclusive
    assert profile.sbatch == ("--reservation=rl",) and profile.prelude == ("module load cuda",)
    with pytest.raises(RlctlError, match="partiton") as err:
        profile_from_mapping({"partiton": "gpu"})
    assert "partition" in (err.value.hint or "")
    with pytest.raises(RlctlError, match="true or false"):
        profile_from_mapping({"exclusive": "yes"})
    # CLI options win over the profile
    assert SlurmBackend(profile, partition="debug", ssh=None).profile.partition == "debug"


# ---------------------------------------------------------------------------
# states


def make_job(tmp_path: Path) -> Job:
    log = tmp_path / "job.log"
    log.write_text("step 1/3\nTraceback (most recent call last):\nValueError: boom\n")
    return Job(
        id=JOB_ID,
        name="t",
        recipe_path="r",
        recipe_yaml="",
        plan_json="{}",
        backend="slurm",
        handle={"slurm_job_id": "42", "root": str(tmp_path), "log": str(log), "ssh": None},
        state=JobState.RUNNING,
        reason=None,
        exit_code=None,
        log_path=None,
        created_at=0.0,
        updated_at=0.0,
        started_at=None,
        ended_at=None,
    )


def fake_slurm(monkeypatch, answers: dict[str, tuple[int, str]]):
    def run(self, argv, input=None, check=False, timeout=60):
        key = " ".join(argv[:2]) if argv[0] != "sacct" or argv[1] != "-c" else "sacct -c"
        if argv[0] == "sacct" and argv[1] != "-c":
            key = "sacct"
        code, out = answers.get(key, (1, ""))
        return subprocess.CompletedProcess(argv, code, out.encode(), b"error")

    monkeypatch.setattr(slurm.Shell, "run", run)


@pytest.mark.parametrize(
    ("answers", "state", "code"),
    [
        ({"squeue -h": (0, "PENDING|Resources\n")}, JobState.PENDING, None),
        ({"squeue -h": (0, "RUNNING|None\n")}, JobState.RUNNING, None),
        ({"squeue -h": (0, "CONFIGURING|None\n")}, JobState.PROVISIONING, None),
        ({"sacct": (0, "COMPLETED|0:0\n")}, JobState.SUCCEEDED, 0),
        ({"sacct": (0, "FAILED|3:0\n")}, JobState.FAILED, 3),
        ({"sacct -c": (0, "41|COMPLETED|0:0\n42|FAILED|7:0\n")}, JobState.FAILED, 7),
        ({"scontrol show": (0, "JobId=42 JobState=TIMEOUT ExitCode=0:15")}, JobState.FAILED, 143),
        ({"scontrol show": (0, "JobId=42 JobState=CANCELLED ExitCode=0:0")}, JobState.CANCELLED, 0),
        ({"scontrol show": (0, "JobId=42 JobState=NODE_FAIL ExitCode=1:0")}, JobState.FAILED, 1),
        ({"sacct": (0, "PREEMPTED|0:0\n")}, JobState.FAILED, 0),
        ({"sacct": (0, "CANCELLED by 0|0:0\n")}, JobState.CANCELLED, 0),
    ],
)
def test_status_mapping(tmp_path, monkeypatch, answers, state, code):
    fake_slurm(monkeypatch, answers)
    seen = SlurmBackend(SlurmProfile(job_root=str(tmp_path))).status(make_job(tmp_path))
    assert seen.state == state, seen
    assert seen.exit_code == code
    if state == JobState.FAILED:
        assert "ValueError: boom" in (seen.reason or "")  # the log's tail
    if state == JobState.PENDING:
        assert seen.reason == "queued: Resources"


def test_status_without_any_record_reads_the_exit_code_file(tmp_path, monkeypatch):
    fake_slurm(monkeypatch, {})
    backend = SlurmBackend(SlurmProfile(job_root=str(tmp_path)))
    assert backend.status(make_job(tmp_path)).state == JobState.FAILED
    (tmp_path / "exit_code").write_text("0\n")
    assert backend.status(make_job(tmp_path)).state == JobState.SUCCEEDED


def test_rejected_submission_is_a_clear_error(tmp_path, monkeypatch):
    def run(self, argv, input=None, check=False, timeout=60):
        err = b"sbatch: error: invalid partition specified: nosuch\n"
        return subprocess.CompletedProcess(argv, 1, b"", err)

    monkeypatch.setattr(slurm.Shell, "run", run)
    recipe = load_recipe(write_recipe(tmp_path, CPU2))
    backend = SlurmBackend(SlurmProfile(job_root=str(tmp_path / "jobs")))
    prepared = api.prepare_for(recipe, backend, JOB_ID)
    with pytest.raises(RlctlError, match="invalid partition specified: nosuch"):
        backend.submit(make_job(tmp_path), prepared, {})


def test_secrets_reach_the_remote_shell_through_stdin():
    argv = slurm._with_secrets(["bash", "-c", 'printf "%s|" "$A" "$B"'])
    secrets = {"A": NASTY, "B": "é%s"}
    out = subprocess.run(argv, input=slurm._secret_lines(secrets), capture_output=True)
    assert out.stdout.decode() == f"{NASTY}|é%s|"
    assert all(value not in " ".join(argv) for value in secrets.values())


# ---------------------------------------------------------------------------
# the Ray bootstrap library


def run_library(script: str, tmp_path: Path, fake_status: str = "") -> subprocess.CompletedProcess:
    fake_ray = tmp_path / "ray"
    fake_ray.write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {tmp_path}/ray.calls\n'
        f'if [ "$1" = status ]; then cat {tmp_path}/status; fi\n'
    )
    fake_ray.chmod(0o755)
    (tmp_path / "status").write_text(fake_status)
    env = {**os.environ, "RLCTL_RAY": str(fake_ray), "RLCTL_RAY_POLL_S": "0.1"}
    env.pop("RAY_AUTH_MODE", None)
    env.pop("RAY_AUTH_TOKEN", None)
    return subprocess.run(
        ["bash", "-c", f". {LIBRARY}\n{script}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


STATUS_2_NODES = """======== Autoscaler status ========
Node status
---------------------------------------------------------------
Active:
 1 node_aaaa
 1 node_bbbb
Pending:
 (no pending nodes)

Resources
---------------------------------------------------------------
Usage:
 0.0/4.0 CPU
 0.0/16.0 GPU
 0B/10.00GiB memory
"""


def test_library_start_args(tmp_path):
    out = run_library(
        "rlctl_ray_head 6400 8 4 GPU /tmp/x; wait; "
        "rlctl_ray_worker 10.0.0.1 6400 8 4 NPU /tmp/y; wait; "
        "rlctl_ray_worker 10.0.0.1 6400 2 0 CPU /tmp/z; wait; echo token=${#RAY_AUTH_TOKEN}",
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "token=32" in out.stdout  # a per-job token, exported for the other steps
    head, npu, cpu = (tmp_path / "ray.calls").read_text().splitlines()
    assert head == (
        "start --head --block --port=6400 --include-dashboard=false --disable-usage-stats"
        " --temp-dir=/tmp/x --num-cpus=8 --num-gpus=4"
    )
    assert npu.startswith("start --address=10.0.0.1:6400 --block")
    assert npu.endswith('--num-cpus=8 --num-gpus=0 --resources={"NPU": 4}')
    assert cpu.endswith("--num-cpus=2 --num-gpus=0")


def test_library_worker_needs_the_heads_token(tmp_path):
    out = run_library("export RAY_AUTH_MODE=token; rlctl_ray_worker h 1 1 0 CPU /tmp/z", tmp_path)
    assert out.returncode == 2 and "RAY_AUTH_TOKEN" in out.stderr


def test_library_wait(tmp_path):
    ready = run_library("rlctl_ray_wait 2 16 5 h:1", tmp_path, STATUS_2_NODES)
    assert ready.returncode == 0, ready.stderr
    assert "ray cluster ready: 2 nodes, 16 GPU, 0 NPU, 4 CPU" in ready.stdout
    cpu_only = run_library(
        "rlctl_ray_wait 2 4 5 h:1", tmp_path, STATUS_2_NODES.replace(" 0.0/16.0 GPU\n", "")
    )
    assert cpu_only.returncode == 0, cpu_only.stderr
    late = run_library("rlctl_ray_wait 3 16 1 h:1", tmp_path, STATUS_2_NODES)
    assert late.returncode == 1
    assert "2 of 3 nodes and 16 of 16 devices joined" in late.stderr
    assert "node_aaaa" in late.stderr  # which nodes did join


def test_library_stop_by_pid(tmp_path):
    out = run_library(
        "sleep 300 & RLCTL_RAY_PID=$!; p=$RLCTL_RAY_PID; rlctl_ray_stop; "
        'kill -0 "$p" 2>/dev/null && echo alive || echo stopped; rlctl_ray_stop',
        tmp_path,
    )
    assert out.stdout.strip() == "stopped"
    code = [line for line in LIBRARY.read_text().splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "ray stop" in line or "start ray stop" in line]


# ---------------------------------------------------------------------------
# through a login node: a stand-in `ssh` that runs the remote command here


def test_submit_and_logs_over_ssh(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(
        "#!/usr/bin/env bash\n"
        f'echo "$*" >> {tmp_path}/ssh.calls\n'
        'while [ "$1" = -o ]; do shift 2; done\n'
        'shift\nexec bash -c "$1"\n'  # the host, then the remote command line
    )
    (bin_dir / "sbatch").write_text(
        "#!/usr/bin/env bash\n"
        f'printf "%s" "$HF_TOKEN" > {tmp_path}/secret.seen\n'
        f'echo "$*" > {tmp_path}/sbatch.args\n'
        "echo '77;cluster'\n"
    )
    for exe in bin_dir.iterdir():
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    recipe = load_recipe(write_recipe(tmp_path, CPU2))
    backend = SlurmBackend(SlurmProfile(job_root=str(tmp_path / "jobs")), ssh="me@login")
    got = backend.submit(
        make_job(tmp_path), api.prepare_for(recipe, backend, JOB_ID), {"HF_TOKEN": NASTY}
    )
    root = tmp_path / "jobs" / JOB_ID
    assert got == {
        "slurm_job_id": "77",
        "root": str(root),
        "log": f"{root}/job.log",
        "ssh": "me@login",
    }
    assert sorted(p.name for p in root.iterdir()) == [
        "engine.yaml", "job.sbatch", "ray_cluster.sh", "rlctl-0.1.0-py3-none-any.whl"
    ]  # fmt: skip
    assert os.access(root / "job.sbatch", os.X_OK)
    assert (tmp_path / "secret.seen").read_text() == NASTY  # through stdin, not argv
    assert NASTY not in (tmp_path / "ssh.calls").read_text()
    assert (tmp_path / "sbatch.args").read_text().split() == [
        "--parsable",
        f"--chdir={root}",
        f"{root}/job.sbatch",
    ]
    (root / "job.log").write_text("step 1/2\nstep 2/2\n")
    job = make_job(tmp_path)
    job = Job(**{**job.__dict__, "handle": got})
    assert list(backend.logs(job, follow=False)) == ["step 1/2", "step 2/2"]
