"""A sweep's worker processes (``processes.Worker``): several points, one process, same runs."""

import os
import subprocess
import sys

import pytest

from rl_batch import artifacts
from rl_batch.runs import run as run_lib
from rl_batch.sweeps import processes, sweep
from tests.run_fixtures import TIMING, tiny_run_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture()
def in_repo(monkeypatch):
    """The worker child (``python -m rl_batch.sweeps.worker``) runs from the repository."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("PYTHONPATH", REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _config_file(tmp_path, name: str, **changes) -> str:
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "runs" / name), **changes)
    c.budget_responses = 32
    os.makedirs(c.run_dir, exist_ok=True)
    path = os.path.join(c.run_dir, "requested_config.json")
    artifacts.write_json_atomic(path, c.to_dict())
    return path


def _non_timing(run_dir: str) -> list[dict]:
    return [
        {k: v for k, v in line.items() if not k.startswith(TIMING)}
        for line in artifacts.read_metrics(run_dir)
    ]


@pytest.mark.slow  # 18 s on a loaded 2-core machine
def test_a_worker_runs_points_one_after_another_and_survives_a_failed_one(tmp_path, in_repo):
    bad = _config_file(tmp_path, "bad", eval_metric="pass")
    good = [_config_file(tmp_path, f"s{s}", seed=s) for s in (0, 1)]
    worker = processes.Worker(str(tmp_path / "workers.log"))
    try:
        with pytest.raises(RuntimeError, match="eval_metric=.pass.: expected one of"):
            worker.run(bad, str(tmp_path / "bad.log"))
        pid = worker.proc.pid
        for i, path in enumerate(good):
            worker.run(path, str(tmp_path / "runs" / f"s{i}" / "stdout.log"))
        assert worker.proc.pid == pid  # one process ran all three
    finally:
        worker.close()
    assert worker.proc is None
    assert "Traceback" in (tmp_path / "bad.log").read_text()  # the point's own log
    for i in (0, 1):
        run_dir = str(tmp_path / "runs" / f"s{i}")
        assert artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))["status"] == (
            sweep.FINISHED
        )
        assert "finished: N*=" in open(os.path.join(run_dir, "stdout.log")).read()
    # The second point, run after another in the same process, logs what a process of its
    # own logs (every metric outside the timing fields).
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "alone"), seed=1)
    c.budget_responses = 32
    run_lib.run(c, progress=False)
    assert _non_timing(str(tmp_path / "alone")) == _non_timing(str(tmp_path / "runs" / "s1"))


def test_a_worker_that_dies_fails_its_point_and_the_next_point_starts_a_new_one(
    tmp_path, in_repo, monkeypatch
):
    path = _config_file(tmp_path, "s0")
    worker = processes.Worker(str(tmp_path / "workers.log"))
    start = processes.Worker._start

    def dying(self):  # reads the request, then exits as a crashed child would
        return subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.readline(); sys.exit(3)"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    monkeypatch.setattr(processes.Worker, "_start", dying)
    with pytest.raises(RuntimeError, match="worker process exited with 3; see .*stdout.log"):
        worker.run(path, str(tmp_path / "runs" / "s0" / "stdout.log"))
    assert worker.proc is None
    monkeypatch.setattr(processes.Worker, "_start", start)
    try:
        worker.run(path, str(tmp_path / "runs" / "s0" / "stdout.log"))
    finally:
        worker.close()
    summary = artifacts.read_json(str(tmp_path / "runs" / "s0" / artifacts.SUMMARY_FILE))
    assert summary["status"] == sweep.FINISHED


@pytest.mark.slow  # 25 s on a loaded 2-core machine
def test_a_concurrent_sweep_runs_its_points_in_workers(tmp_path, in_repo):
    from experiments.configs import base

    c = base.sweep_config(tiny_run_config(str(tmp_path / "work")))
    c.budget_responses = 32
    c.sweep.prompts, c.sweep.group_sizes, c.sweep.seeds = "4", "4", "0,1,2"
    c.sweep.concurrent = 2
    assert c.sweep.reuse_workers  # the default
    d = str(tmp_path / "sweep")
    record = sweep.run_sweep(c, d, log=lambda s: None)
    assert {r["status"] for r in record["runs"]} == {sweep.FINISHED}
    assert os.path.exists(os.path.join(d, "workers.log"))  # (what workers print between points)
    for r in record["runs"]:
        assert "finished: N*=" in open(os.path.join(d, "runs", r["name"], "stdout.log")).read()


def test_cpu_slices_split_the_cpus_evenly_or_not_at_all():
    assert processes.cpu_slices(2, [0, 1]) == [frozenset({0}), frozenset({1})]
    assert processes.cpu_slices(2, [0, 1, 2, 3, 4]) == [frozenset({0, 1}), frozenset({2, 3})]
    assert processes.cpu_slices(3, [0, 1]) is None  # fewer CPUs than workers: shared
    assert processes.cpu_slices(1, [0, 1]) is None  # one worker: every CPU


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_a_pinned_worker_runs_on_its_slice_only(tmp_path, in_repo):
    cpus = frozenset({sorted(os.sched_getaffinity(0))[0]})
    worker = processes.Worker(str(tmp_path / "workers.log"), cpus=cpus)
    proc = worker._start()
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            allowed = next(line for line in f if line.startswith("Cpus_allowed_list:"))
        assert allowed.split()[1] == str(min(cpus))
    finally:
        worker.proc = proc
        worker.close()
    assert proc.returncode == 0  # (end of input: the child exits)


def test_sweep_speed_reads_its_settings():
    from experiments import sweep_speed

    assert sweep_speed.parse_settings("a=--x=1 --y=2,b=--x=2") == {
        "a": ["--x=1", "--y=2"],
        "b": ["--x=2"],
    }
    with pytest.raises(ValueError, match="'--x=1' is not label=flags"):
        sweep_speed.parse_settings("--x=1")
