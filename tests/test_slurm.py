"""A real SLURM: the job array `launch.make_jobs --scheduler=slurm` writes, run by sbatch.

The module fixture brings up a single-node SLURM on this machine with
``launch/slurm_single_node.sh`` (munged, slurmctld and slurmd on localhost, as root;
slurm-wlm and munge are apt-get installed when missing and ``RL_BATCH_SLURM_SETUP=1``, as
``.ci/run`` sets). Where that cannot be done (not root, not installed and not asked to, no
apt-get, the install or a daemon fails) the tests are skipped with the reason. Then:

- the two-point sweep of ``tests/crash_sweep_config.py`` is submitted as a job array with
  two JAX processes per array task (``--tasks_per_node=2`` on the one node, one CPU device
  each), and ``launch.collect --analyze`` merges it into a sweep with both points finished;
- one point is submitted again and its array task requeued (``scontrol requeue``) once it
  has written a checkpoint: the requeued task resumes from it and its metrics match the
  uninterrupted run's, each update once.

About 3 minutes on two cores (the first task compiles the tiny model; the others reuse the
persistent compilation cache).
"""

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from rl_batch import artifacts
from rl_batch import provenance as provenance_lib
from tests.run_fixtures import assert_same_records, deterministic

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "launch", "slurm_single_node.sh")
CONFIG = "tests/crash_sweep_config.py"  # two points, a checkpoint every 2 updates
UPDATES = 40  # of B = 16 responses: time enough to requeue a task mid-run
POINTS = ["p4_g4_sqrt_s0", "p4_g4_fixed_s0"]
SETUP_TIMEOUT_S = 900  # apt-get install included
ARRAY_TIMEOUT_S = 600

pytestmark = pytest.mark.slow


def _skip_reason() -> str | None:
    if sys.platform != "linux":
        return f"single-node SLURM needs Linux, this is {sys.platform}"
    if os.geteuid() != 0:
        return "single-node SLURM needs root (it apt-get installs and starts munged/slurmd)"
    if not shutil.which("slurmctld"):
        if os.environ.get("RL_BATCH_SLURM_SETUP") != "1":
            # A test suite must not install system packages unasked (.ci/run asks).
            return (
                "slurmctld is not installed; set RL_BATCH_SLURM_SETUP=1 to let this test "
                "apt-get install slurm-wlm and munge"
            )
        if not shutil.which("apt-get"):
            return "slurmctld is not installed and there is no apt-get to install it"
    return None


@pytest.fixture(scope="module")
def slurm():
    """Brings up the single-node SLURM (or skips with the reason); stops what it started."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        proc = subprocess.run(
            [SCRIPT], capture_output=True, text=True, timeout=SETUP_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"{SCRIPT} did not finish within {SETUP_TIMEOUT_S}s")
    if proc.returncode != 0:
        pytest.skip(
            f"{SCRIPT} could not bring up SLURM (exit {proc.returncode}):\n"
            f"{(proc.stdout + proc.stderr)[-3000:]}"
        )
    started = "already up" not in proc.stderr
    yield
    if started:
        subprocess.run([SCRIPT, "--stop"], capture_output=True, check=False)


@pytest.fixture(scope="module")
def job_env(tmp_path_factory):
    """The environment sbatch passes on to the tasks (--export=ALL): CPU, one device per
    process, a compilation cache shared by all tasks."""
    cache = str(tmp_path_factory.mktemp("jax_cache"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RL_BATCH_", "SLURM_"))}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        JAX_COMPILATION_CACHE_DIR=cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    return env


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


def _run(cmd, env, timeout=120) -> str:
    proc = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{cmd} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def _make_jobs(sweep_dir: str, work_dir: str, env, port: int) -> str:
    """Writes the job array for CONFIG; returns the sbatch script's path."""
    _run(
        [
            sys.executable,
            "-m",
            "launch.make_jobs",
            "--scheduler=slurm",
            f"--sweep_config={CONFIG}",
            f"--sweep_dir={sweep_dir}",
            "--nodes=1",
            "--tasks_per_node=2",
            "--gpus_per_node=0",
            "--time=00:15:00",
            f"--port={port}",
            f"--python={sys.executable}",
            f"--extra_flag=--config.work_dir={work_dir}",
            f"--extra_flag=--config.budget_responses={16 * UPDATES}",
            "--extra_flag=--analyze=false",
        ],
        env,
    )
    script = os.path.join(sweep_dir, "jobs", "sweep.sbatch")
    assert os.path.exists(script)
    return script


def _sbatch(script: str, env, *options) -> str:
    return _run(["sbatch", "--parsable", *options, script], env).strip().split(";")[0]


def _job_states(job_id: str) -> dict[str, str]:
    """Array task id -> state, from scontrol (accounting is off, so no sacct)."""
    proc = subprocess.run(
        ["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, check=False
    )
    states = {}
    for line in proc.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        states[fields.get("ArrayTaskId", "?")] = fields.get("JobState", "?")
    return states


def _log_text(sweep_dir: str, job_id: str, index: int) -> str:
    path = os.path.join(sweep_dir, "jobs", "logs", f"rl_batch-{job_id}_{index}.out")
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _queued(job_id: str) -> str:
    """squeue's lines for the job's tasks still pending or running ("" when none)."""
    proc = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True)
    return proc.stdout.strip()


def _wait_array(job_id: str, sweep_dir: str, indices, timeout_s=ARRAY_TIMEOUT_S) -> None:
    """Waits until every array task has left the queue, and checks each completed."""
    deadline = time.monotonic() + timeout_s
    while True:
        queued = _queued(job_id)
        if not queued:
            break
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], check=False)
            logs = "\n".join(_log_text(sweep_dir, job_id, i)[-2000:] for i in indices)
            pytest.fail(f"job {job_id} still queued after {timeout_s}s:\n{queued}\n{logs}")
        time.sleep(2)
    states = _job_states(job_id)
    for i in indices:
        assert states.get(str(i)) == "COMPLETED", (states, _log_text(sweep_dir, job_id, i)[-3000:])


def _start_when_held(task: str, timeout_s: float = 60) -> None:
    """Once the requeued ``task`` is pending on its begin time, moves that to now."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proc = subprocess.run(
            ["scontrol", "-o", "show", "job", task], capture_output=True, text=True, check=False
        )
        fields = dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)
        if fields.get("JobState") == "PENDING" and fields.get("Reason") == "BeginTime":
            subprocess.run(
                ["scontrol", "update", f"jobid={task}", "StartTime=now"],
                capture_output=True,
                check=False,
            )
        elif fields.get("JobState") not in ("COMPLETING", "PENDING", "REQUEUED"):
            return  # running again (or done)
        time.sleep(0.5)


def _complete_steps(ckpt_dir: str) -> list[int]:
    if not os.path.isdir(ckpt_dir):
        return []
    return sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())


def _update_steps(run_dir: str) -> list[int]:
    path = os.path.join(run_dir, artifacts.METRICS_FILE)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [
            json.loads(line)["step"]
            for line in f
            if line.endswith("\n") and '"kind": "update"' in line
        ]


@pytest.fixture(scope="module")
def finished_sweep(slurm, job_env, work_dir, tmp_path_factory):
    """The two-point sweep, run as a job array and collected: its directory."""
    sweep_dir = str(tmp_path_factory.mktemp("sweep"))
    script = _make_jobs(sweep_dir, work_dir, job_env, port=23400)
    job_id = _sbatch(script, job_env)
    _wait_array(job_id, sweep_dir, range(len(POINTS)))
    for i, name in enumerate(POINTS):
        log = _log_text(sweep_dir, job_id, i)
        assert f"array task {i}: run {name} on 1 node(s)" in log, log[-3000:]
    return sweep_dir


def test_job_array_runs_both_points_with_two_processes_and_collects(finished_sweep, job_env):
    sweep_dir = finished_sweep
    out = _run(
        [sys.executable, "-m", "launch.collect", f"--sweep_dir={sweep_dir}", "--analyze"],
        job_env,
        timeout=300,
    )
    record = artifacts.read_json(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
    assert {r["name"]: r["status"] for r in record["runs"]} == dict.fromkeys(POINTS, "finished"), (
        out
    )
    for name in POINTS:
        run_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR, name)
        assert _update_steps(run_dir) == list(range(1, UPDATES + 1))
        summary = artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))
        assert summary["status"] == "finished" and summary["steps"] == UPDATES
        assert summary["responses_cum"] == 16 * UPDATES
        # Two JAX processes ran the point (process 0 records how many there were).
        provenance = artifacts.read_json(os.path.join(run_dir, provenance_lib.FILE))
        assert [p["hardware"]["process_count"] for p in provenance["sessions"]] == [2]
    assert os.path.exists(os.path.join(sweep_dir, "report.md"))


def test_requeued_array_task_resumes_from_its_checkpoint(
    finished_sweep, job_env, work_dir, tmp_path
):
    sweep_dir = str(tmp_path / "sweep")
    script = _make_jobs(sweep_dir, work_dir, job_env, port=23500)
    job_id = _sbatch(script, job_env, "--array=0")
    task = f"{job_id}_0"
    run_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR, POINTS[0])
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)

    # Requeue once a checkpoint is complete and a later update has been logged.
    deadline = time.monotonic() + ARRAY_TIMEOUT_S
    while True:
        done, steps = _complete_steps(ckpt_dir), _update_steps(run_dir)
        if done and steps and max(steps) > max(done):
            break
        if not _queued(job_id) or time.monotonic() > deadline:
            pytest.fail(f"no checkpoint before the task ended:\n{_log_text(sweep_dir, job_id, 0)}")
        time.sleep(0.1)
    killed_at = max(steps)
    assert killed_at < UPDATES, "the run finished before it could be requeued"
    _run(["scontrol", "requeue", task], job_env)
    # SLURM holds a requeued job back by a begin time (about 2 minutes); start it now.
    _start_when_held(task)
    _wait_array(job_id, sweep_dir, [0])

    log = _log_text(sweep_dir, job_id, 0)  # the requeued run's (sbatch truncates on restart)
    start = log.split(f"{POINTS[0]}: B=")[1].splitlines()[0]
    assert "(resuming)" in start, log[-3000:]
    summary = artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))
    assert summary["status"] == "finished" and summary["steps"] == UPDATES
    assert _update_steps(run_dir) == list(range(1, UPDATES + 1))  # each update once, none lost
    # Both sessions (the requeued task's first start and its resume) ran two processes.
    provenance = artifacts.read_json(os.path.join(run_dir, provenance_lib.FILE))
    assert [p["hardware"]["process_count"] for p in provenance["sessions"]] == [2, 2]
    # The resumed run computes what the uninterrupted one did.
    resumed = deterministic(artifacts.read_metrics(run_dir))
    reference = deterministic(
        artifacts.read_metrics(os.path.join(finished_sweep, artifacts.RUNS_DIR, POINTS[0]))
    )
    assert [r["kind"] for r in resumed] == [r["kind"] for r in reference]
    assert_same_records(resumed, reference, rel=1e-5, abs=1e-6)
