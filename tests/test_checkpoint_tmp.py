"""A resume after a failed or interrupted save: every state orbax's temporary entries can
be left in is cleaned before orbax lists the directory, and a failed save leaves no writer
behind (orbax stops waiting at the first failed item; the others kept writing into the
step's temporary directory, and orbax's own clean-up on resume then failed with
``OSError: [Errno 39] Directory not empty``)."""

import errno
import os
import shutil
import threading
import time

import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from rl_batch import artifacts
from rl_batch.runs import checkpoint
from rl_batch.runs.checkpoint import TMP_MARK, Checkpointer

TREE = {"a": jnp.arange(40_000.0), "b": jnp.ones((64, 64))}


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _temporary(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if TMP_MARK in n)


def _two_steps(directory: str) -> None:
    ckpt = Checkpointer(directory)
    for step in (1, 2):
        ckpt.save(step, TREE, {"step": step})
    ckpt.close()


def _leave_failed_save(directory: str) -> None:
    """What a process killed after a failed save leaves: its step 3 half written (no
    clean-up: ``cleanup_tmp`` off), once its writers have ended."""
    ckpt = Checkpointer(directory)
    real = ocp.JsonCheckpointHandler._save_fn
    ocp.JsonCheckpointHandler._save_fn = _enospc
    try:
        with pytest.raises(artifacts.DiskFullError):
            ckpt.save(3, TREE, {"step": 3})
    finally:
        ocp.JsonCheckpointHandler._save_fn = real
    assert _temporary(directory) == ["3.orbax-checkpoint-tmp"]


def _leave(state: str, directory: str) -> None:
    step3 = os.path.join(directory, "3.orbax-checkpoint-tmp")
    if state == "empty":
        os.makedirs(step3)
    elif state == "half written":
        _leave_failed_save(directory)
    elif state == "items complete, step not renamed":
        shutil.copytree(os.path.join(directory, "2"), step3)
    elif state == "item directories only":
        os.makedirs(os.path.join(step3, "state" + TMP_MARK, "ocdbt.process_0"))
        os.makedirs(os.path.join(step3, "meta" + TMP_MARK))
        open(os.path.join(step3, "state" + TMP_MARK, "ocdbt.process_0", "d"), "wb").close()
    elif state == "timestamped name (older orbax)":
        os.makedirs(os.path.join(directory, "3.orbax-checkpoint-tmp-1700000000", "state"))
    elif state == "a file":
        open(os.path.join(directory, "3.orbax-checkpoint-tmp-1700000001"), "wb").close()
    else:
        raise AssertionError(state)


STATES = [
    "empty",
    "half written",
    "items complete, step not renamed",
    "item directories only",
    "timestamped name (older orbax)",
    "a file",
]


@pytest.mark.parametrize("state", STATES)
@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_resume_cleans_each_state_a_save_can_leave(tmp_path, state):
    directory = str(tmp_path / "ckpt")
    _two_steps(directory)
    _leave(state, directory)
    assert _temporary(directory)
    resumed = Checkpointer(directory, cleanup_tmp=True)
    assert _temporary(directory) == []
    assert resumed.all_steps() == [1, 2]
    # The step the failed save was writing is written again and restored.
    resumed.save(3, {k: v + 1 for k, v in TREE.items()}, {"step": 3})
    tree, meta = resumed.restore(TREE)
    assert meta == {"step": 3} and resumed.all_steps() == [2, 3]
    np.testing.assert_array_equal(tree["a"], np.arange(40_000.0) + 1)


def test_a_reader_leaves_temporary_entries_alone(tmp_path):
    # Without cleanup_tmp (an export, another process's directory), nothing is removed.
    directory = str(tmp_path / "ckpt")
    _two_steps(directory)
    _leave("empty", directory)
    assert Checkpointer(directory).all_steps() == [1, 2]
    assert _temporary(directory) == ["3.orbax-checkpoint-tmp"]


def test_a_directory_still_being_written_is_removed_once_its_writer_stops(tmp_path):
    # A writer adds files while the clean-up runs (the race that raised ENOTEMPTY).
    step3 = tmp_path / "3.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp"
    step3.mkdir(parents=True)
    stop = time.monotonic() + 0.5

    def writer():
        i = 0
        while time.monotonic() < stop:
            try:
                (step3 / f"chunk{i}").write_bytes(b"x" * 100)
            except FileNotFoundError:  # its directory is gone: the save has ended
                return
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert checkpoint.remove_temporary(str(tmp_path)) == ["3.orbax-checkpoint-tmp"]
    finally:
        t.join()
    assert not (tmp_path / "3.orbax-checkpoint-tmp").exists()


def test_a_removal_that_races_a_writer_is_tried_again(tmp_path, monkeypatch):
    # Deterministic: the first removal fails as rmtree did in the report.
    (tmp_path / "3.orbax-checkpoint-tmp" / "state.orbax-checkpoint-tmp").mkdir(parents=True)
    real, calls = shutil.rmtree, []

    def racing_rmtree(path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", path)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shutil, "rmtree", racing_rmtree)
    checkpoint.remove_temporary(str(tmp_path))
    assert len(calls) == 2 and _temporary(str(tmp_path)) == []


def test_an_entry_that_never_settles_is_an_error(tmp_path, monkeypatch):
    (tmp_path / "3.orbax-checkpoint-tmp").mkdir()

    def always_busy(path, *args, **kwargs):
        raise OSError(errno.ENOTEMPTY, "Directory not empty", path)

    monkeypatch.setattr(shutil, "rmtree", always_busy)
    with pytest.raises(OSError, match="Directory not empty"):
        checkpoint.remove_temporary(str(tmp_path), timeout_s=0.2)


def test_a_failed_save_leaves_no_writer_and_no_temporary_directory(tmp_path, monkeypatch):
    directory = str(tmp_path / "ckpt")
    ckpt = Checkpointer(directory, cleanup_tmp=True)
    ckpt.save(1, TREE, {"step": 1})
    monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", _enospc)
    before = set(threading.enumerate())
    with pytest.raises(artifacts.DiskFullError):
        ckpt.save(2, TREE, {"step": 2})
    # The state item's writers have ended (orbax's long-lived store thread may remain);
    # on a loaded host a writer may take a moment to exit after the save has raised.
    writers = [
        t
        for t in set(threading.enumerate()) - before
        if t.name == "write_metadata_after_commits" or t.name.startswith("asyncio_")
    ]
    for t in writers:
        t.join(timeout=10)
    started = {t.name for t in set(threading.enumerate()) - before if t.is_alive()}
    assert not started & {"write_metadata_after_commits"} and not any(
        n.startswith("asyncio_") for n in started
    ), started
    assert _temporary(directory) == [] and ckpt.all_steps() == [1]
    monkeypatch.undo()
    ckpt.save(2, TREE, {"step": 2})
    assert Checkpointer(directory, cleanup_tmp=True).all_steps() == [1, 2]
