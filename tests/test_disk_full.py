"""A full disk (ENOSPC) while writing metrics, JSON or a checkpoint: one line naming the
directory, and nothing written before is lost."""

import errno
import json
import logging
import os
import subprocess
import sys
import threading

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rl_batch import artifacts
from rl_batch.runs import checkpoint
from rl_batch.runs import run as run_lib
from rl_batch.runs.checkpoint import Checkpointer
from tests.run_fixtures import TIMING, tiny_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _assert_one_line_naming(message: str, directory: str):
    assert "\n" not in message
    assert message.startswith("disk full") and directory in message and "--resume" in message


def test_is_disk_full_looks_through_the_chain():
    assert artifacts.is_disk_full(OSError(errno.ENOSPC, "x"))
    assert not artifacts.is_disk_full(OSError(errno.EACCES, "x"))
    try:
        try:
            _enospc()
        except OSError as e:
            raise RuntimeError("saving failed") from e
    except RuntimeError as wrapped:
        assert artifacts.is_disk_full(wrapped)
    # tensorstore's own errors carry only the text.
    assert artifacts.is_disk_full(ValueError("write failed: No space left on device [os]"))
    assert not artifacts.is_disk_full(ValueError("bad value"))


def test_asyncio_reports_of_a_full_disk_are_dropped(caplog):
    # A failed save's write tasks, reported by asyncio when nobody retrieved their
    # exception (seen on a loaded host: 18 lines ahead of the one error line).
    checkpoint.quiet_disk_full()
    error = ValueError(
        'RESOURCE_EXHAUSTED: Error writing "state.params/7": Failed to write 312 bytes '
        "to file 12: No space left on device [os_error_code='28']"
    )
    logger = logging.getLogger("asyncio")
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        logger.error("Task exception was never retrieved", exc_info=(ValueError, error, None))
        logger.error("another asyncio error")
    assert [r.getMessage() for r in caplog.records] == ["another asyncio error"]


def test_a_closed_loop_callback_after_a_full_disk_prints_nothing(monkeypatch, capsys):
    # tensorstore's write callbacks into the closed loop of a failed save, reported as a
    # bare traceback through sys.excepthook (seen on a loaded host).
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    checkpoint.quiet_disk_full()
    checkpoint._DISK_FULL_SEEN.set()
    sys.excepthook(RuntimeError, RuntimeError("Event loop is closed"), None)
    sys.excepthook(ValueError, ValueError("something else"), None)
    err = capsys.readouterr().err
    assert "Event loop is closed" not in err and "ValueError: something else" in err


def test_a_closed_loop_callback_before_the_full_disk_is_recorded_waits_for_it(monkeypatch, capsys):
    # The race .ci/run once lost: tensorstore's thread reported before the failed save's
    # error was recorded, the default hook began its traceback ("Traceback (most recent
    # call last):") and the process's exit after the one error line cut it short.
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(checkpoint, "_DISK_FULL_SEEN", threading.Event())
    monkeypatch.setattr(checkpoint, "_HOLD_S", 0.3)
    checkpoint.quiet_disk_full()
    closed = RuntimeError("Event loop is closed")
    sys.excepthook(RuntimeError, closed, None)  # no full disk within the hold: printed
    assert "RuntimeError: Event loop is closed" in capsys.readouterr().err
    threading.Timer(0.05, checkpoint._DISK_FULL_SEEN.set).start()
    sys.excepthook(RuntimeError, closed, None)  # recorded while it waits: dropped
    assert capsys.readouterr().err == ""


def test_a_metrics_line_that_does_not_fit_is_taken_back(tmp_path, monkeypatch):
    path = str(tmp_path / "metrics.jsonl")
    artifacts.append_jsonl(path, {"step": 1})
    artifacts.append_jsonl(path, {"step": 2})
    before = open(path, "rb").read()
    # The line reached the file, its fsync found the disk full.
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(artifacts.DiskFullError) as e:
        artifacts.append_jsonl(path, {"step": 3, "pad": "x" * 1000})
    _assert_one_line_naming(str(e.value), str(tmp_path))
    assert e.value.errno == errno.ENOSPC and isinstance(e.value, OSError)
    assert open(path, "rb").read() == before
    assert [r["step"] for r in artifacts.iter_jsonl(path)] == [1, 2]


def test_another_write_error_is_not_called_a_full_disk(tmp_path, monkeypatch):
    path = str(tmp_path / "metrics.jsonl")

    def eio(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(OSError) as e:
        artifacts.append_jsonl(path, {"step": 1})
    assert not isinstance(e.value, artifacts.DiskFullError) and e.value.errno == errno.EIO


def test_a_json_file_that_does_not_fit_keeps_its_old_contents(tmp_path, monkeypatch):
    path = str(tmp_path / "summary.json")
    artifacts.write_json_atomic(path, {"status": "running"})
    monkeypatch.setattr(os, "fsync", _enospc)
    with pytest.raises(artifacts.DiskFullError) as e:
        artifacts.write_json_atomic(path, {"status": "finished"})
    _assert_one_line_naming(str(e.value), str(tmp_path))
    assert artifacts.read_json(path) == {"status": "running"}
    assert os.listdir(tmp_path) == ["summary.json"]  # no temporary file left


def test_a_checkpoint_that_does_not_fit_keeps_the_earlier_steps(tmp_path, monkeypatch):
    directory = str(tmp_path / "ckpt")
    ckpt = Checkpointer(directory)
    tree = {"a": jnp.arange(4.0)}
    for step in (1, 2):
        ckpt.save(step, tree, {"step": step})
    # The metadata's file write (orbax runs it in a thread of its own) finds the disk full.
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _enospc)
    with pytest.raises(artifacts.DiskFullError) as e:
        ckpt.save(3, {"a": jnp.arange(4.0) + 1}, {"step": 3})
    _assert_one_line_naming(str(e.value), directory)
    assert ckpt.all_steps() == [1, 2]
    restored, meta = ckpt.restore(tree)
    assert meta == {"step": 2}
    np.testing.assert_array_equal(restored["a"], np.arange(4.0))


@pytest.mark.slow  # 13-48 s on a loaded 2-core machine
def test_a_run_stops_on_a_full_disk_and_resumes(tmp_path, monkeypatch):
    run_dir = str(tmp_path / "run")
    config = tiny_run_config(str(tmp_path / "work"), run_dir)  # checkpoints at steps 2, 4
    saves = []
    real_save_fn = ocp.JsonCheckpointHandler._save_fn

    def second_save_fails(self, *args, **kwargs):
        saves.append(1)
        if len(saves) == 2:
            _enospc()
        return real_save_fn(self, *args, **kwargs)

    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", second_save_fails)
    with pytest.raises(artifacts.DiskFullError) as e:
        run_lib.run(config, progress=False)
    _assert_one_line_naming(str(e.value), os.path.join(run_dir, artifacts.CHECKPOINT_DIR))
    summary = json.load(open(os.path.join(run_dir, artifacts.SUMMARY_FILE)))
    assert summary["status"] == "failed" and summary["error"].startswith("DiskFullError")
    written = artifacts.read_metrics(run_dir)
    assert [r["step"] for r in written if r["kind"] == "update"] == [1, 2, 3, 4]
    assert Checkpointer(os.path.join(run_dir, artifacts.CHECKPOINT_DIR)).all_steps() == [2]

    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", real_save_fn)  # space freed
    summary = run_lib.run(config, resume=True, progress=False)
    assert summary["status"] == "finished" and summary["steps"] == 4
    resumed = artifacts.read_metrics(run_dir)
    # What the first session logged up to its checkpoint is kept as it was.
    kept = [r for r in written if r["step"] <= 2]
    assert resumed[: len(kept)] == kept


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_train_prints_one_line_on_a_full_disk(tmp_path):
    # experiments.train with run.run failing as a full disk would (no compute).
    run_dir = str(tmp_path / "run")
    script = (
        "import sys\n"
        f"sys.argv = ['train', '--config.run_dir={run_dir}', '--quiet']\n"  # before the flags
        "from rl_batch import artifacts\n"
        "from rl_batch.runs import run\n"
        "def full(*a, **k):\n"
        f"    raise artifacts.DiskFullError({run_dir + '/checkpoints'!r})\n"
        "run.run = full\n"
        "from experiments import cli, train\n"
        "cli.run(train.main)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line == (
        f"error: disk full: no space left to write in {run_dir}/checkpoints; free space "
        "there, then continue the run with --resume (everything written before is intact)"
    )


@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_sweep_prints_one_line_on_a_full_disk(tmp_path):
    # experiments.grpo_sweep with run_sweep failing as a full disk would (no compute).
    sweep_dir = str(tmp_path / "sweep")
    script = (
        "import sys\n"
        f"sys.argv = ['grpo_sweep', '--sweep_dir={sweep_dir}', '--quiet']\n"
        "from rl_batch import artifacts\n"
        "from rl_batch.sweeps import sweep\n"
        "def full(*a, **k):\n"
        f"    raise artifacts.DiskFullError({sweep_dir!r})\n"
        "sweep.run_sweep = full\n"
        "from experiments import cli, grpo_sweep\n"
        "cli.run(grpo_sweep.main)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: disk full: no space left to write in {sweep_dir}; free space there")
    )


@pytest.mark.slow  # 10 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_full_disk_in_a_checkpoint_save_is_the_last_line_train_prints(tmp_path):
    # A real run whose first checkpoint save finds the disk full (orbax's own thread):
    # orbax and asyncio complain as the process exits; the one line must come last (and,
    # through the shared error path, alone).
    run_dir, config_json = str(tmp_path / "run"), str(tmp_path / "config.json")
    config = tiny_run_config(str(tmp_path / "work"), run_dir, stop_at_target=False)
    artifacts.write_json_atomic(config_json, config.to_dict())
    script = (
        "import errno, sys\n"
        f"sys.argv = ['train', '--config_json={config_json}', '--quiet']\n"
        "import orbax.checkpoint as ocp\n"
        "def full(*a, **k):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "ocp.JsonCheckpointHandler._save_fn = full\n"
        "from experiments import cli, train\n"
        "cli.run(train.main)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 1, out.stderr[-3000:]
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [
        f"error: disk full: no space left to write in {run_dir}/checkpoints; free space "
        "there, then continue the run with --resume (everything written before is intact)"
    ], lines[-20:]


def _small_disk_command(size: str, mount_point: str, argv: list[str]) -> list[str] | None:
    """``argv`` run with a tmpfs of ``size`` mounted at ``mount_point`` (a mount namespace
    of its own: ``unshare -rm``), or None where this machine cannot mount one."""
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        return None
    mount = f"mount -t tmpfs -o size={size} tmpfs {mount_point}"
    return ["unshare", "-rm", "sh", "-c", f'{mount} && exec "$@"', "sh", *argv]


def test_orbax_says_nothing_of_a_really_full_disk(tmp_path):
    # A 64 KiB disk and 400 KB of random floats: orbax's writer, commit and manager
    # threads each logged the failure with a traceback (4 tracebacks, 200+ lines).
    disk = tmp_path / "disk"
    disk.mkdir()
    script = (
        "import sys\n"
        "import numpy as np\n"
        "from rl_batch.runs.checkpoint import Checkpointer\n"
        f"c = Checkpointer({str(disk / 'ckpt')!r}, cleanup_tmp=True)\n"
        "try:\n"
        "    c.save(1, {'a': np.random.default_rng(0).random(100_000, np.float32)}, {})\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, e, file=sys.stderr)\n"
    )
    command = _small_disk_command("64k", str(disk), [sys.executable, "-c", script])
    if command is None:
        pytest.skip("no tmpfs can be mounted here (unshare -rm)")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stderr.splitlines() == [
        f"DiskFullError disk full: no space left to write in {disk / 'ckpt'}; free space "
        "there, then continue the run with --resume (everything written before is intact)"
    ], out.stderr[-3000:]


def test_train_on_a_really_full_disk_prints_one_line_and_resumes(tmp_path):
    # The run directory on a 100 KiB disk: the first checkpoint (~180 KB) does not fit.
    # Before, orbax's and tensorstore's threads printed 100-600 lines ahead of the error.
    disk = tmp_path / "disk"
    disk.mkdir()
    run_dir, config_json = str(disk / "run"), str(tmp_path / "config.json")
    config = tiny_run_config(str(tmp_path / "work"), run_dir, stop_at_target=False)
    artifacts.write_json_atomic(config_json, config.to_dict())
    train = [sys.executable, "-m", "experiments.train", f"--config_json={config_json}", "--quiet"]
    # The disk fills, then (a second mount: the files written are kept in a directory
    # beside it and copied onto a larger disk) the run resumes to the end.
    kept = tmp_path / "kept"
    script = f'"$@" ; status=$? ; cp -a {disk}/run {kept} ; exit $status'
    command = _small_disk_command("100k", str(disk), ["sh", "-c", script, "sh", *train])
    if command is None:
        pytest.skip("no tmpfs can be mounted here (unshare -rm)")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT}
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env)
    assert out.returncode == 1, out.stderr[-3000:]
    assert len(out.stderr.splitlines()) == 1, out.stderr[-3000:]
    (line,) = out.stderr.splitlines()
    assert line.startswith(f"error: disk full: no space left to write in {run_dir}"), line
    assert "--resume" in line
    written = artifacts.read_metrics(str(kept))
    assert [r["step"] for r in written if r["kind"] == "update"][:2] == [1, 2]

    os.rename(kept, run_dir)  # space freed: the same directory on a disk with room
    resumed = subprocess.run(
        [*train, "--resume"], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = artifacts.read_json(os.path.join(run_dir, artifacts.SUMMARY_FILE))
    assert summary["status"] == "finished" and summary["steps"] == 4
    # No checkpoint fitted: the run starts again and logs the same lines (timings aside).
    again = artifacts.read_metrics(run_dir)
    assert [_untimed(r) for r in again[: len(written)]] == [_untimed(r) for r in written]


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not any(t in k for t in TIMING)}
