"""Multi-controller runs: two CPU processes on one mesh match one process with two devices.

Each process is a real ``python -m experiments.train`` with one CPU device, joined
through ``jax.distributed`` on a free localhost port; the reference is one process that
sees two CPU devices. Both use the same data-parallel mesh (data=2), so every update
must produce the same metrics. The two-process run is split into two legs (the second
one resumes from the first one's checkpoint), so collective checkpoint saving and
restoring are covered too.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from rl_batch import artifacts
from tests.run_fixtures import assert_same_records, deterministic, free_port, tiny_run_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 240  # per leg; a hung collective fails the test instead of the suite


def _env(devices: int) -> dict:
    """The child's environment: CPU, ``devices`` devices, and the test session's
    compilation cache (tests/conftest.py sets it), so that a resumed leg, and every later
    test here, reuses the programs compiled before it."""
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
        PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
    )
    return env


def _write_config(path: str, config) -> str:
    with open(path, "w") as f:
        json.dump(config.to_dict(), f)
    return path


def _start(config_json: str, log_path: str, devices: int, extra=(), resume=False):
    cmd = [sys.executable, "-m", "experiments.train", f"--config_json={config_json}", "--quiet"]
    cmd += ["--resume"] if resume else []
    log = open(log_path, "w")
    proc = subprocess.Popen(
        cmd + list(extra),
        cwd=REPO,
        env=_env(devices),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    proc.log_path = log_path
    log.close()
    return proc


def _wait_all(procs, timeout_s: float, expect_ok: bool = True) -> None:
    """Waits for every process; on a failure (when success is expected) or the timeout
    kills the rest and fails the test."""
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if (failed and expect_ok) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait()
    for p in procs:
        if p.returncode == -signal.SIGKILL or (expect_ok and p.returncode != 0):
            with open(p.log_path) as f:
                tail = f.read()[-3000:]
            pytest.fail(f"{' '.join(p.args[2:4])} exited with {p.returncode}:\n{tail}")


def _two_processes(config_json: str, tmp_path, leg: str, resume: bool):
    port = free_port()
    procs = []
    for i in range(2):
        flags = [f"--coordinator_address=localhost:{port}", "--num_processes=2"]
        flags.append(f"--process_id={i}")
        log_path = str(tmp_path / f"{leg}_process_{i}.log")
        procs.append(_start(config_json, log_path, devices=1, extra=flags, resume=resume))
    return procs


def _assert_same(a, b, what):
    assert_same_records(a, b, rel=1e-5, abs=1e-6, what=what)


@pytest.mark.slow  # three processes of ~30 s on two cores
def test_two_processes_match_one_process_with_two_devices(tmp_path):
    work_dir = str(tmp_path / "work")
    multi_dir, ref_dir = str(tmp_path / "multi"), str(tmp_path / "ref")
    # No greedy validation: one sampler compilation fewer per process.
    full = dict(budget_responses=64, checkpoint_every=2, eval_greedy=False)
    ref_json = _write_config(str(tmp_path / "ref.json"), tiny_run_config(work_dir, ref_dir, **full))
    leg1 = tiny_run_config(work_dir, multi_dir, **dict(full, budget_responses=32))
    leg1_json = _write_config(str(tmp_path / "leg1.json"), leg1)
    leg2_json = _write_config(
        str(tmp_path / "leg2.json"), tiny_run_config(work_dir, multi_dir, **full)
    )

    # The reference (one process, two devices) runs beside the first two-process leg.
    ref = _start(ref_json, str(tmp_path / "ref.log"), devices=2)
    _wait_all(_two_processes(leg1_json, tmp_path, "leg1", resume=False) + [ref], TIMEOUT_S)
    assert artifacts.read_json(os.path.join(multi_dir, artifacts.SUMMARY_FILE))["steps"] == 2
    _wait_all(_two_processes(leg2_json, tmp_path, "leg2", resume=True), TIMEOUT_S)

    multi = artifacts.read_metrics(multi_dir)
    reference = artifacts.read_metrics(ref_dir)
    # Only process 0 writes: each step is recorded once.
    steps = [r["step"] for r in multi if r["kind"] == "update"]
    assert steps == [1, 2, 3, 4]
    _assert_same(deterministic(multi, "update"), deterministic(reference, "update"), "update")
    _assert_same(deterministic(multi, "eval"), deterministic(reference, "eval"), "eval")
    config = artifacts.read_json(os.path.join(multi_dir, artifacts.CONFIG_FILE))
    assert config["derived"]["device_count"] == 2
    summary = artifacts.read_json(os.path.join(multi_dir, artifacts.SUMMARY_FILE))
    ref_summary = artifacts.read_json(os.path.join(ref_dir, artifacts.SUMMARY_FILE))
    assert summary["status"] == ref_summary["status"] == "finished"
    assert summary["responses_cum"] == ref_summary["responses_cum"] == 64
    assert summary["final_eval_accuracy"] == ref_summary["final_eval_accuracy"]
    # The collective checkpoint of the last step is complete and loadable.
    ckpt_steps = sorted(
        int(d) for d in os.listdir(os.path.join(multi_dir, artifacts.CHECKPOINT_DIR)) if d.isdigit()
    )
    assert ckpt_steps[-1] == 4


@pytest.mark.slow
def test_two_processes_save_the_initial_state_when_a_run_stops_before_any_update(tmp_path):
    # A random policy never solves addition: with filtering, the first rollout batch is
    # empty and the run stops with a checkpoint of the state it started from.
    run_dir = str(tmp_path / "run")
    config = tiny_run_config(
        str(tmp_path / "work"), run_dir, filter_groups=True, max_empty_rollouts=1
    )
    config.eval_greedy = False
    config_json = _write_config(str(tmp_path / "run.json"), config)
    procs = _two_processes(config_json, tmp_path, "stop", resume=False)
    _wait_all(procs, TIMEOUT_S, expect_ok=False)
    for p in procs:
        with open(p.log_path) as f:
            log = f.read()
        assert p.returncode != 0
        assert "error: 1 rollout batches in a row had no group" in log, log[-3000:]
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    assert sorted(d for d in os.listdir(ckpt_dir) if d.isdigit()) == ["0"]
    summary = artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))
    assert summary["status"] == "failed" and "no group" in summary["error"]


def _warm_start_config(work_dir, run_dir):
    c = tiny_run_config(work_dir, run_dir, budget_responses=32, eval_greedy=False)
    c.init.source = "pretrain"  # a supervised warm start, cached in work_dir
    c.pretrain.steps, c.pretrain.warmup_steps, c.pretrain.batch_size = 12, 2, 16
    c.pretrain.eval_every, c.pretrain.eval_prompts, c.pretrain.stop_accuracy = 6, 8, 1.0
    return c


@pytest.mark.slow  # two warm starts and eight processes of ~30 s on two cores
def test_two_processes_warm_start_from_an_empty_cache_or_a_one_process_one(tmp_path):
    cases = {}
    for name in ("empty", "cached"):  # which process count builds the warm start first
        work = str(tmp_path / f"work_{name}")
        cases[name] = {
            leg: _write_config(
                str(tmp_path / f"{name}_{leg}.json"),
                _warm_start_config(work, str(tmp_path / f"{name}_{leg}")),
            )
            for leg in ("multi", "one")
        }
    # First legs: two processes on an empty cache, beside one process on another.
    _wait_all(
        _two_processes(cases["empty"]["multi"], tmp_path, "empty_multi", resume=False)
        + [_start(cases["cached"]["one"], str(tmp_path / "cached_one.log"), devices=2)],
        2 * TIMEOUT_S,
    )
    # Then each cache is used by the other process count.
    _wait_all(
        _two_processes(cases["cached"]["multi"], tmp_path, "cached_multi", resume=False)
        + [_start(cases["empty"]["one"], str(tmp_path / "empty_one.log"), devices=2)],
        2 * TIMEOUT_S,
    )
    for name in ("empty", "cached"):
        multi = artifacts.read_metrics(str(tmp_path / f"{name}_multi"))
        one = artifacts.read_metrics(str(tmp_path / f"{name}_one"))
        assert [r["step"] for r in multi if r["kind"] == "update"] == [1, 2]
        _assert_same(deterministic(multi, "update"), deterministic(one, "update"), name)
        _assert_same(deterministic(multi, "eval"), deterministic(one, "eval"), name)


@pytest.mark.slow
def test_two_processes_start_from_a_one_process_runs_checkpoint(tmp_path):
    work_dir = str(tmp_path / "work")
    first = tiny_run_config(work_dir, str(tmp_path / "first"), budget_responses=32)
    first.eval_greedy = False
    _wait_all([_start(_write_config(str(tmp_path / "first.json"), first),
                      str(tmp_path / "first.log"), devices=1)], TIMEOUT_S)  # fmt: skip
    legs = {}
    for leg in ("multi", "one"):
        c = tiny_run_config(work_dir, str(tmp_path / leg), budget_responses=32)
        c.eval_greedy = False
        c.init.source, c.init.path = "checkpoint", os.path.join(first.run_dir, "checkpoints")
        legs[leg] = _write_config(str(tmp_path / f"{leg}.json"), c)
    _wait_all(
        _two_processes(legs["multi"], tmp_path, "from_ckpt", resume=False)
        + [_start(legs["one"], str(tmp_path / "one.log"), devices=2)],
        2 * TIMEOUT_S,
    )
    multi, one = (artifacts.read_metrics(str(tmp_path / leg)) for leg in ("multi", "one"))
    _assert_same(deterministic(multi, "update"), deterministic(one, "update"), "update")
    _assert_same(deterministic(multi, "eval"), deterministic(one, "eval"), "eval")


@pytest.mark.slow
def test_two_processes_start_from_an_hf_checkpoint(tmp_path):
    # init.source="hf": every process reads the safetensors itself (host arrays); a math
    # run from a tiny Qwen3-layout directory, two processes against one with two devices.
    from tests.hf_fixtures import make_tiny_hf_dir

    hf_dir = make_tiny_hf_dir(tmp_path / "hf")
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"question": f"What is {i}+1?", "answer": f"#### {i + 1}"}) + "\n"
            for i in range(16)
        )  # fmt: skip
    )
    legs = {}
    for leg in ("multi", "one"):
        c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / leg), budget_responses=32)
        c.task.name, c.task.kwargs = "math", {"max_prompt_len": 64, "max_response_len": 8}
        c.task.train_file = c.task.validation_file = str(data)
        c.init.source, c.init.path = "hf", str(hf_dir)
        c.model.overrides = {}
        c.prompts, c.group_size, c.eval_greedy = 4, 2, False
        legs[leg] = _write_config(str(tmp_path / f"{leg}.json"), c)
    _wait_all(
        _two_processes(legs["multi"], tmp_path, "from_hf", resume=False)
        + [_start(legs["one"], str(tmp_path / "one.log"), devices=2)],
        2 * TIMEOUT_S,
    )
    multi, one = (artifacts.read_metrics(str(tmp_path / leg)) for leg in ("multi", "one"))
    assert deterministic(multi, "update"), "no update lines"
    _assert_same(deterministic(multi, "update"), deterministic(one, "update"), "update")
    _assert_same(deterministic(multi, "eval"), deterministic(one, "eval"), "eval")
