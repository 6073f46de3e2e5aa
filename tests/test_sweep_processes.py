"""Sweep programs launched as several processes, and their exit status.

The end-to-end tests start real ``experiments.grpo_sweep`` processes through
``launch/local.sh -n 2`` (two CPU processes, one device each, joined through
``jax.distributed`` on a free localhost port) on the tiny two-point sweep of
``tests/crash_sweep_config.py`` cut to one update per point. A point fails for real:
its run directory holds a run of another config, which ``run.run`` refuses to resume.
"""

import json
import os
import subprocess
import sys

import pytest

from experiments.configs import base
from rl_batch import artifacts, distributed, provenance
from rl_batch.sweeps import processes as procs
from rl_batch.sweeps import sweep
from tests.run_fixtures import free_port, tiny_run_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOCAL_SH = os.path.join(REPO, "launch", "local.sh")
TIMEOUT_S = 240  # a hung collective fails the test instead of the suite
SWEEP_FLAGS = ["--config.budget_responses=16"]  # one update per point
FIRST, SECOND = "p4_g4_sqrt_s0", "p4_g4_fixed_s0"  # the two points, in run order
ENV_KEYS = ("RL_BATCH_COORDINATOR", "RL_BATCH_NUM_PROCESSES", "RL_BATCH_PROCESS_ID")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RL_BATCH_")}
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",  # one device per process
        PYTHON=sys.executable,
        PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def _local_sh(tmp_path, *args) -> subprocess.CompletedProcess:
    """``launch/local.sh -n 2 ARGS`` on the tiny sweep; process 1 logs to tmp/logs."""
    cmd = [LOCAL_SH, "-n", "2", f"--port={free_port()}", f"--log_dir={tmp_path / 'logs'}"]
    cmd += [*args, f"--config.work_dir={tmp_path / 'work'}", *SWEEP_FLAGS]
    return subprocess.run(
        cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S
    )


def _sweep_program(sweep_dir, *flags, **env) -> subprocess.CompletedProcess:
    """One ``python -m experiments.grpo_sweep`` process on the tiny sweep."""
    cmd = [sys.executable, "-m", "experiments.grpo_sweep", "--config=tests/crash_sweep_config.py"]
    cmd += [f"--config.work_dir={os.path.dirname(sweep_dir)}/work", f"--sweep_dir={sweep_dir}"]
    cmd += [*SWEEP_FLAGS, *flags]
    return subprocess.run(
        cmd, cwd=REPO, env=_env(**env), capture_output=True, text=True, timeout=TIMEOUT_S
    )


def _block_with_another_run(run_dir: str) -> None:
    """Leaves a run of another seed that has begun (a metrics line) in ``run_dir``:
    ``run.run`` refuses to resume it."""
    artifacts.write_json_atomic(os.path.join(run_dir, artifacts.CONFIG_FILE), {"seed": 99})
    line = {"kind": "eval", "step": 0}
    artifacts.append_jsonl(os.path.join(run_dir, artifacts.METRICS_FILE), line)


def _explain(proc) -> str:
    return f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


def _process_1_log(tmp_path) -> str:
    with open(tmp_path / "logs" / "process_1.log") as f:
        return f.read()


def _assert_finished_on_two_devices(run_dir: str) -> None:
    summary = artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))
    assert summary["status"] == "finished" and summary["responses_cum"] == 16
    config = artifacts.read_json(os.path.join(run_dir, artifacts.CONFIG_FILE))
    assert config["derived"]["device_count"] == 2  # the two processes formed one mesh
    # Only process 0 writes the run's metrics: the update is recorded once.
    assert [r["step"] for r in artifacts.read_metrics(run_dir, "update")] == [1]


# --------------------------------------------------------------------------- settings


def test_one_process_needs_no_initialize_even_with_a_coordinator(monkeypatch):
    # SLURM's "env" mode exports the coordinator for every job, one-node jobs included.
    monkeypatch.delenv("RL_BATCH_DISTRIBUTED", raising=False)
    monkeypatch.setenv("RL_BATCH_COORDINATOR", "node0:12321")
    monkeypatch.setenv("RL_BATCH_NUM_PROCESSES", "1")
    monkeypatch.setenv("RL_BATCH_PROCESS_ID", "0")
    assert distributed.settings() is None
    assert distributed.maybe_initialize() is False  # (initializing here would raise)
    assert distributed.launch_settings() == (1, 0)
    # The same from the config.
    monkeypatch.delenv("RL_BATCH_COORDINATOR")
    c = tiny_run_config("/tmp/unused")
    c.distributed.coordinator_address, c.distributed.num_processes = "node0:1", 1
    c.distributed.process_id = 0
    assert distributed.settings(c) is None

    monkeypatch.setenv("RL_BATCH_COORDINATOR", "node0:12321")
    monkeypatch.setenv("RL_BATCH_NUM_PROCESSES", "2")
    monkeypatch.setenv("RL_BATCH_PROCESS_ID", "1")
    assert distributed.settings() == {
        "coordinator_address": "node0:12321",
        "num_processes": 2,
        "process_id": 1,
    }
    monkeypatch.setenv("RL_BATCH_PROCESS_ID", "2")
    with pytest.raises(ValueError, match="incomplete multi-process settings"):
        distributed.settings()


def test_an_isolated_sweep_parent_takes_its_place_from_the_settings(monkeypatch):
    # The parent of --isolate children must not join jax.distributed (its children do).
    for key, value in zip(ENV_KEYS, ("localhost:1", "2", "1")):
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RL_BATCH_DISTRIBUTED", raising=False)
    c = base.sweep_config(tiny_run_config("/tmp/unused"))
    processes = procs.join_processes(c, isolate=True)
    assert not processes.writer and processes.process_id == 1
    import jax

    # Each child's mesh spans both processes' devices.
    assert processes.device_count == 2 * jax.local_device_count()
    assert not jax.distributed.is_initialized()
    monkeypatch.setenv("RL_BATCH_PROCESS_ID", "0")
    assert procs.join_processes(c, isolate=True).writer


# Run in a fresh interpreter (pytest's may have started JAX already): the sweep program
# with --isolate, its children stubbed, then whether the parent started JAX's backend.
ISOLATED_PARENT = """
import sys
from absl import app
from experiments import grpo_sweep
from rl_batch import artifacts
from rl_batch.sweeps import processes, sweep

started = []

def fake_child(spec, log_path, worker=None):
    started.append(f"{spec.inputs.name}@{spec.device_count}")
    artifacts.write_json_atomic(
        f"{spec.inputs.run_dir}/{artifacts.SUMMARY_FILE}", {"status": sweep.FINISHED}
    )

processes.run_point_process = fake_child
try:
    app.run(grpo_sweep.main, argv=["grpo_sweep", *sys.argv[1:]])
except SystemExit as e:
    assert not e.code, e.code
from jax._src import xla_bridge

print("children:", ",".join(started))
print("backend started:", xla_bridge.backends_are_initialized())
"""


@pytest.mark.parametrize("launched", [None, ("localhost:1", "2", "1")])
@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_an_isolated_sweep_parent_never_starts_the_jax_backend(tmp_path, launched):
    # On a GPU it would keep most of each card's memory from the children for the whole
    # sweep; on a TPU VM the children could not open the chips at all.
    sweep_dir = str(tmp_path / "sweep")
    cmd = [sys.executable, "-c", ISOLATED_PARENT, "--config=tests/crash_sweep_config.py"]
    cmd += [f"--config.work_dir={tmp_path}/work", f"--sweep_dir={sweep_dir}"]
    cmd += ["--isolate", "--analyze=false"]
    env = _env(XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env.update(dict(zip(ENV_KEYS, launched or ())))
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, _explain(proc)
    assert "backend started: False" in proc.stdout, _explain(proc)
    # The whole parent path ran, planning each run on the devices its child will see
    # (counted by a process with the same environment): 2, on each of the 2 processes.
    devices = 4 if launched else 2
    assert f"children: {FIRST}@{devices},{SECOND}@{devices}" in proc.stdout, _explain(proc)
    if launched:  # process 1 of 2 writes nothing of the sweep
        assert not os.path.exists(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
    else:
        record = artifacts.read_json(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
        assert [r["status"] for r in record["runs"]] == ["finished", "finished"]


def test_failed_points_are_the_requested_points_that_did_not_finish():
    record = {
        "runs": [
            {"name": "a", "status": "finished"},
            {"name": "b", "status": "failed"},
            {"name": "c", "status": "pending"},
        ]
    }
    assert sweep.failed_points(record) == ["b", "c"]
    # With --only, the other points' statuses (from an earlier sweep.json) do not count.
    assert sweep.failed_points(record, only="a") == []
    assert sweep.failed_points(record, only="b") == ["b"]


# --------------------------------------------------------------------------- end to end


@pytest.mark.slow  # two processes of ~15 s on two cores
def test_two_processes_run_a_sweep_point(tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    proc = _local_sh(tmp_path, "point", "tests/crash_sweep_config.py", sweep_dir, FIRST)
    assert proc.returncode == 0, _explain(proc)
    run_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR, FIRST)
    _assert_finished_on_two_devices(run_dir)
    point = artifacts.read_json(os.path.join(run_dir, "sweep_point.json"))
    assert {r["name"]: r["status"] for r in point["runs"]} == {FIRST: "finished", SECOND: "pending"}
    # A job of an array leaves the shared files alone.
    assert sorted(os.listdir(sweep_dir)) == [artifacts.RUNS_DIR]
    assert f"[sweep 1/1] {FIRST}: finished" in proc.stdout
    # Process 1 knew it was not process 0: it wrote and printed nothing of the sweep.
    assert "[sweep" not in _process_1_log(tmp_path)


@pytest.mark.slow  # two processes of ~15 s on two cores, then single-process reruns
def test_a_failed_point_fails_the_sweep_after_the_others_and_the_analysis(tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    runs = os.path.join(sweep_dir, artifacts.RUNS_DIR)
    _block_with_another_run(os.path.join(runs, FIRST))
    proc = _local_sh(tmp_path, "sweep", "tests/crash_sweep_config.py", sweep_dir)
    assert proc.returncode == 1, _explain(proc)
    assert f"1 run(s) failed: ['{FIRST}']" in proc.stderr
    # The failure did not stop the second point, nor the sweep's files and analysis.
    _assert_finished_on_two_devices(os.path.join(runs, SECOND))
    record = artifacts.read_json(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
    status = {r["name"]: (r["status"], r["error"]) for r in record["runs"]}
    assert status[SECOND] == ("finished", None)
    assert status[FIRST][0] == "failed"
    assert "holds a run with a different config" in status[FIRST][1]
    with open(os.path.join(sweep_dir, "errors.log")) as f:
        errors = f.read()
    assert errors.count("== ") == 1 and f"== {FIRST}\n" in errors  # written once
    assert os.path.exists(os.path.join(sweep_dir, "report.md"))
    assert "analysis:" in proc.stdout
    assert "[sweep" not in _process_1_log(tmp_path)

    # One process (a one-node SLURM job exports the coordinator too): --only reports
    # its own point, not the other points' statuses in sweep.json.
    slurm_env = dict(zip(ENV_KEYS, ("localhost:1", "1", "0")))
    proc = _sweep_program(sweep_dir, f"--only={SECOND}", **slurm_env)
    assert proc.returncode == 0, _explain(proc)
    assert f"{SECOND}: already finished, skipped" in proc.stdout
    proc = _sweep_program(sweep_dir, f"--only={FIRST}", **slurm_env)
    assert proc.returncode == 1, _explain(proc)
    point = json.load(open(os.path.join(runs, FIRST, "sweep_point.json")))
    assert {r["name"]: r["status"] for r in point["runs"]}[FIRST] == "failed"
    # The whole sweep in one process: the same exit status.
    proc = _sweep_program(sweep_dir, "--analyze=false")
    assert proc.returncode == 1, _explain(proc)
    assert f"1 run(s) failed: ['{FIRST}']" in proc.stderr
    # Each invocation of the program by process 0 is recorded, with its wall time and load.
    commands = provenance.read_commands(sweep_dir)
    assert [c["status"] for c in commands] == ["failed", "failed"]  # (not the --only jobs)
    assert "--analyze=false" in commands[-1]["argv"]
    assert all(c["wall_s"] > 0 and len(c["load_end"]) == 3 for c in commands)
