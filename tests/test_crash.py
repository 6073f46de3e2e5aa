"""Crash safety with real process kills (SIGKILL): runs, checkpoint saves and sweeps.

Every run here is a subprocess (``experiments.train``, ``experiments.grpo_sweep`` or a
small checkpoint driver) killed by ``os.kill(pid, SIGKILL)`` at a point the test watches
for on disk, then resumed; a last one feeds NaN rewards to a run, which must skip those
updates and stop with a checkpoint. The subprocesses see one CPU device and share a
persistent compilation cache, so only the first one pays for compiling the tiny model.
"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.runs.checkpoint import Checkpointer
from tests.run_fixtures import assert_same_records, deterministic, tiny_run_config

# Training runs in subprocesses, crashed and resumed: the slow tier (-m slow).
pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 120  # per subprocess
TMP_MARK = ".orbax-checkpoint-tmp"
# 20 updates, a checkpoint every 2: a window of several saves in which to kill.
RUN = dict(budget_responses=320, eval_every_responses=128, eval_greedy=False, checkpoint_every=2)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("jax_cache"))
    return dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=1",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
        JAX_COMPILATION_CACHE_DIR=cache,
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


# ----------------------------------------------------------------------------- helpers


def _start(cmd, env, log_path):
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log_path
    return proc


def _log(proc) -> str:
    with open(proc.log_path) as f:
        return f.read()


def _finish(proc, timeout_s=TIMEOUT_S) -> str:
    """Waits for a subprocess that must succeed; returns its output."""
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"{proc.args} timed out:\n{_log(proc)[-3000:]}")
    assert proc.returncode == 0, _log(proc)[-3000:]
    return _log(proc)


def _kill_when(proc, condition, timeout_s=TIMEOUT_S, delay_s=0.0) -> None:
    """SIGKILLs ``proc`` as soon as ``condition()`` holds (plus ``delay_s``)."""
    deadline = time.monotonic() + timeout_s
    try:
        while not condition():
            if proc.poll() is not None:
                pytest.fail(f"exited ({proc.returncode}) before the kill:\n{_log(proc)[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"the kill condition never held:\n{_log(proc)[-3000:]}")
            time.sleep(0.005)
        time.sleep(delay_s)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _complete_steps(ckpt_dir: str) -> list[int]:
    """Steps orbax has finished (renamed from their temporary directories)."""
    if not os.path.isdir(ckpt_dir):
        return []
    return sorted(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())


def _tmp_dirs(ckpt_dir: str) -> list[str]:
    return [d for d in os.listdir(ckpt_dir) if TMP_MARK in d] if os.path.isdir(ckpt_dir) else []


def _update_steps(run_dir: str) -> list[int]:
    path = os.path.join(run_dir, artifacts.METRICS_FILE)
    if not os.path.exists(path):
        return []
    steps = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n") and '"kind": "update"' in line:
                steps.append(json.loads(line)["step"])
    return steps


def _past_a_checkpoint(run_dir: str):
    """True once a checkpoint exists and metrics of a later update have been written."""
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)

    def condition():
        done, steps = _complete_steps(ckpt_dir), _update_steps(run_dir)
        return bool(done) and bool(steps) and max(steps) > max(done)

    return condition


def _assert_same_metrics(a, b):
    a, b = deterministic(a), deterministic(b)
    assert [r["kind"] for r in a] == [r["kind"] for r in b]
    assert_same_records(a, b, rel=1e-6, abs=1e-7)


def _train_cmd(config_json: str, resume: bool = False):
    cmd = [sys.executable, "-m", "experiments.train", f"--config_json={config_json}", "--quiet"]
    return cmd + (["--resume"] if resume else [])


# ------------------------------------------------------------------------------- tests


def test_killed_run_resumes_from_its_last_checkpoint_with_the_same_metrics(env, work_dir, tmp_path):
    ref_dir, run_dir = str(tmp_path / "ref"), str(tmp_path / "run")
    ref_json, run_json = str(tmp_path / "ref.json"), str(tmp_path / "run.json")
    artifacts.write_json_atomic(ref_json, tiny_run_config(work_dir, ref_dir, **RUN).to_dict())
    artifacts.write_json_atomic(run_json, tiny_run_config(work_dir, run_dir, **RUN).to_dict())
    _finish(_start(_train_cmd(ref_json), env, str(tmp_path / "ref.log")))

    victim = _start(_train_cmd(run_json), env, str(tmp_path / "killed.log"))
    _kill_when(victim, _past_a_checkpoint(run_dir))
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    last = max(_complete_steps(ckpt_dir))
    before = artifacts.read_metrics(run_dir)
    # A killed run's summary says it was running (never "finished").
    assert artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))["status"] == "running"
    assert max(_update_steps(run_dir)) < 20  # killed mid-run
    # A half-written checkpoint of a later step, as a kill during a save leaves it.
    leftover = os.path.join(ckpt_dir, f"{last + 2}{TMP_MARK}-1700000000")
    os.makedirs(os.path.join(leftover, "state"))
    with open(os.path.join(leftover, "state", "partial"), "wb") as f:
        f.write(b"\0" * 100)

    # Without --resume the CLI refuses to touch a run directory that holds checkpoints
    # (it checks before starting anything, so it may run beside the resumed run).
    refused = _start(_train_cmd(run_json), env, str(tmp_path / "refused.log"))
    _finish(_start(_train_cmd(run_json, resume=True), env, str(tmp_path / "resumed.log")))
    assert refused.wait(timeout=TIMEOUT_S) != 0 and "pass --resume" in _log(refused)

    after = artifacts.read_metrics(run_dir)
    _assert_same_metrics(after, artifacts.read_metrics(ref_dir))
    # Work up to the checkpoint was kept as written (timings included); later updates
    # were redone (new timings), so no more than the work since the checkpoint was lost.
    kept = [r for r in before if r["step"] <= last]
    assert after[: len(kept)] == kept
    redone = [r for r in before if r["step"] > last and r["kind"] == "update"]
    for old in redone:
        new = next(r for r in after if r["kind"] == "update" and r["step"] == old["step"])
        assert new["time_update_s"] != old["time_update_s"]
    summary = artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))
    assert summary["status"] == "finished" and summary["steps"] == 20
    assert max(_complete_steps(ckpt_dir)) == 20
    assert not os.path.exists(leftover)  # temporary directories are cleaned up on resume


# A checkpoint driver: saves steps 1, 2, ... of a 32 MB tree whose every value is the step.
_SAVER = """
import sys
import jax
import jax.numpy as jnp
from rl_batch.runs.checkpoint import Checkpointer
ckpt = Checkpointer(sys.argv[1])
for step in range(1, 200):
    tree = {f"w{i}": jnp.full((1024, 1024), step, jnp.float32) for i in range(8)}
    ckpt.save(step, tree, {"step": step})
"""


def _like():
    return {f"w{i}": jnp.zeros((1024, 1024), jnp.float32) for i in range(8)}


def test_a_checkpoint_killed_mid_save_is_never_restored(env, tmp_path):
    killed_mid_save = 0
    for attempt, delay_s in enumerate((0.0, 0.01, 0.03)):
        ckpt_dir = str(tmp_path / f"ckpt{attempt}")
        saver = _start(
            [sys.executable, "-c", _SAVER, ckpt_dir], env, str(tmp_path / f"saver{attempt}.log")
        )
        # Kill once a step is complete and the next one is being written.
        _kill_when(
            saver,
            lambda d=ckpt_dir: bool(_complete_steps(d)) and bool(_tmp_dirs(d)),
            delay_s=delay_s,
        )
        complete, partial = _complete_steps(ckpt_dir), _tmp_dirs(ckpt_dir)
        killed_mid_save += bool(partial)
        ckpt = Checkpointer(ckpt_dir)
        last = ckpt.latest_step()
        assert last == complete[-1]
        # Every partial directory belongs to a step after the last complete one.
        assert all(int(d.split(".")[0]) > last for d in partial)
        tree, meta = ckpt.restore(_like())
        assert meta == {"step": last}
        for leaf in tree.values():
            np.testing.assert_array_equal(np.asarray(leaf), last)
        # Saving the interrupted step again (as a resumed run does) works.
        ckpt.save(last + 1, {k: v + last + 1 for k, v in _like().items()}, {"step": last + 1})
        assert ckpt.latest_step() == last + 1
        ckpt.close()
    assert killed_mid_save >= 1, "no kill landed during a save"


def test_killed_sweep_skips_finished_points_and_resumes_the_interrupted_one(
    env, work_dir, tmp_path
):
    sweep_dir = str(tmp_path / "sweep")
    cmd = [
        sys.executable,
        "-m",
        "experiments.grpo_sweep",
        "--config=tests/crash_sweep_config.py",
        f"--config.work_dir={work_dir}",
        f"--sweep_dir={sweep_dir}",
        "--analyze=false",
    ]
    runs = os.path.join(sweep_dir, artifacts.RUNS_DIR)
    first, second = os.path.join(runs, "p4_g4_sqrt_s0"), os.path.join(runs, "p4_g4_fixed_s0")
    past_checkpoint = _past_a_checkpoint(second)

    def first_done_second_running():
        summary = os.path.join(first, artifacts.SUMMARY_FILE)
        return _status(summary) == "finished" and past_checkpoint()

    _kill_when(_start(cmd, env, str(tmp_path / "killed.log")), first_done_second_running)
    assert artifacts.read_json(os.path.join(first, artifacts.SUMMARY_FILE))["status"] == "finished"
    assert _status(os.path.join(second, artifacts.SUMMARY_FILE)) == "running"
    first_metrics_mtime = os.path.getmtime(os.path.join(first, artifacts.METRICS_FILE))

    out = _finish(_start(cmd, env, str(tmp_path / "resumed.log")))
    assert "p4_g4_sqrt_s0: already finished, skipped" in out
    assert "(resuming)" in out.split("p4_g4_fixed_s0: B=")[1].splitlines()[0]
    assert os.path.getmtime(os.path.join(first, artifacts.METRICS_FILE)) == first_metrics_mtime
    record = artifacts.read_json(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
    assert {r["name"]: r["status"] for r in record["runs"]} == {
        "p4_g4_sqrt_s0": "finished",
        "p4_g4_fixed_s0": "finished",
    }
    # Same LR, seed and batch: the resumed point matches the uninterrupted one.
    _assert_same_metrics(artifacts.read_metrics(second), artifacts.read_metrics(first))


def _status(summary_path: str) -> str | None:
    """A summary's status (None while there is no readable summary yet)."""
    try:
        return artifacts.read_json(summary_path)["status"]
    except (OSError, ValueError):
        return None


# A run whose training rollouts 2 and 5, 6, 7, ... have NaN rewards (0 is the compile
# warm-up; validation rollouts, with k = 2 responses per prompt, stay finite).
_NAN_RUN = """
import dataclasses, json, sys
import numpy as np
from ml_collections import ConfigDict
from rl_batch.rollout import groups as rollout_lib
from rl_batch.runs import run as run_lib


real_rollout, training_calls = rollout_lib.rollout, []

def rollout(sampler, params, task, tokenizer, examples, group_size, **kwargs):
    ro = real_rollout(sampler, params, task, tokenizer, examples, group_size, **kwargs)
    if group_size == 4:
        training_calls.append(len(training_calls))
        if training_calls[-1] == 2 or training_calls[-1] >= 5:
            ro = dataclasses.replace(ro, rewards_pg=np.full_like(ro.rewards_pg, np.nan))
    return ro

rollout_lib.rollout = rollout
run_lib.run(ConfigDict(json.load(open(sys.argv[1]))), progress=False)
"""


def test_non_finite_updates_are_skipped_then_stop_the_run_with_a_checkpoint(
    env, work_dir, tmp_path
):
    from rl_batch.models import transformer as model_lib
    from rl_batch.runs import config as config_lib

    run_dir = str(tmp_path / "run")
    config = tiny_run_config(
        work_dir, run_dir, **dict(RUN, checkpoint_every=4, max_consecutive_skips=3)
    )
    config_json = str(tmp_path / "run.json")
    artifacts.write_json_atomic(config_json, config.to_dict())
    proc = _start([sys.executable, "-c", _NAN_RUN, config_json], env, str(tmp_path / "nan.log"))
    try:
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    out = _log(proc)
    assert proc.returncode != 0
    assert (
        "FloatingPointError: 3 consecutive updates had non-finite loss or gradients (step 7)" in out
    )
    assert "update 2 skipped: non-finite loss or gradients (1 in a row" in out

    updates = artifacts.read_metrics(run_dir, "update")
    assert [r["skipped"] for r in updates] == [0, 1, 0, 0, 1, 1, 1]
    # Skipped updates add no samples to the sample axis.
    assert [r["responses_cum"] for r in updates] == [16, 16, 32, 48, 48, 48, 48]
    summary = artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))
    assert summary["status"] == "failed" and summary["skipped_updates"] == 4
    assert "3 consecutive updates" in summary["error"]
    # The stop left a checkpoint; the skipped updates did not touch the parameters.
    ckpt = Checkpointer(os.path.join(run_dir, artifacts.CHECKPOINT_DIR))
    assert ckpt.all_steps() == [4, 7]
    like = model_lib.abstract_params(config_lib.resolve(config, 1).model)
    before, after = ckpt.restore_params(like, step=4), ckpt.restore_params(like, step=7)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ckpt.close()
