"""Orbax checkpoints of a run: arrays (the train state) plus JSON metadata (counters).

No PRNG state is stored: a run derives every key from its seed and the counters.

Orbax writes each step into a temporary directory and renames it when complete, so a
process killed mid-save leaves no checkpoint that ``latest_step`` would return. Saves
here are synchronous: when ``save`` returns, the step is on disk.

A save that fails because the disk is full raises ``artifacts.DiskFullError`` (one
line naming the directory) and leaves the earlier steps as they were. Orbax's own report
of it is silenced (`quiet_disk_full`): each of its writer threads, its commit thread and
its manager log the failure with a traceback (absl ``logging.exception``), and
tensorstore's callbacks into the closed event loop of a failed write print theirs through
``sys.unraisablehook``: hundreds of lines on stderr before the one line, for each failed save.
Only records and tracebacks of ENOSPC are dropped (the second kind only once a full disk
was seen); every other error of orbax is printed as before.

Temporary directories (``<step>.orbax-checkpoint-tmp*``) are this module's to clean, not
orbax's: a failed save can leave orbax's writer threads of its other items still writing
into one after the error (orbax stops waiting at the first failed item), and orbax's
own clean-up then races them (``OSError: Directory not empty``). So a failed save waits
for the threads it started before raising, and the directory's writer
(``cleanup_tmp``) removes every temporary entry, in whatever state it was left (empty,
partly written, items complete but not renamed, a stray file, still being written),
before orbax lists the directory (`remove_temporary`).

Each step's metadata carries a CRC-32 of every array of the tree (``meta["checksums"]``,
arrays this process holds whole). ``restore`` of the latest step checks them, and when a
step cannot be read or its arrays do not match their checksums (damaged on disk), it
warns, naming the step and the problem, and falls back to the previous step; only a
checkpoint of another model or optimizer (``CheckpointMismatchError``) stops it. The
steps it fell back from are remembered: ``has_step`` says they are not held, and
``save`` of such a step replaces the damaged copy (so a resumed run rewrites it when it
gets there, and the next resume neither warns nor redoes those steps).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
import threading
import time
import zlib
from concurrent.futures import thread as _pool_thread
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from rl_batch import artifacts

log = logging.getLogger(__name__)
CHECKSUMS = "checksums"  # meta key: array name -> CRC-32 of its bytes
TMP_MARK = ".orbax-checkpoint-tmp"  # in the name of every temporary entry orbax writes
# How long a failed save waits for its writer threads, and the clean-up for a temporary
# directory that keeps changing under it (a writer of a save that is ending).
SETTLE_TIMEOUT_S = 120.0
_pool_worker = _pool_thread._worker  # the target of a ThreadPoolExecutor's threads


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the tree it is restored into."""


class CheckpointDamagedError(ValueError):
    """A checkpoint step cannot be read, or its arrays do not match their checksums."""


def checksums(tree: Any) -> dict[str, int]:
    """CRC-32 of the bytes of each array of ``tree`` that this process holds whole."""
    out = {}
    for path, x in jax.tree_util.tree_leaves_with_path(tree):
        if not hasattr(x, "shape") or not getattr(x, "is_fully_addressable", True):
            continue
        out[path_name(path)] = zlib.crc32(np.ascontiguousarray(jax.device_get(x)).tobytes())
    return out


def _join_threads_since(before: set[threading.Thread], timeout_s: float) -> None:
    """Waits (at most ``timeout_s`` in all) for the threads started since ``before``,
    less the workers of thread pools (orbax's metadata store keeps one for the manager's
    life; they hold no write of the failed save once its other threads have ended)."""
    deadline = time.monotonic() + timeout_s
    started = set(threading.enumerate()) - before
    for t in [t for t in started if getattr(t, "_target", None) is not _pool_worker]:
        while t is not threading.current_thread() and time.monotonic() < deadline:
            try:
                t.join(max(0.0, deadline - time.monotonic()))
                break
            except RuntimeError:  # listed while starting: joinable once it has started
                time.sleep(0.01)


def remove_temporary(directory: str, timeout_s: float = SETTLE_TIMEOUT_S) -> list[str]:
    """Removes orbax's temporary entries (names holding ``TMP_MARK``) under ``directory``.

    An entry may be a directory in any state (empty, partly written, items complete but
    the step not renamed) or a file. A directory a writer is still filling (a removal
    that fails with "Directory not empty", or a file gone before it was removed) is
    tried again until it is gone, for at most ``timeout_s``.

    Returns:
      The names removed.

    Raises:
      OSError: an entry still there after ``timeout_s``, or another error of removal.
    """
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if TMP_MARK in n)
    deadline = time.monotonic() + timeout_s
    for name in names:
        path = os.path.join(directory, name)
        pause = 0.01
        while os.path.lexists(path):
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path)
                else:
                    os.remove(path)
            except OSError as e:  # a writer of an ending save: wait for it, then again
                if e.errno not in (errno.ENOTEMPTY, errno.ENOENT) or time.monotonic() > deadline:
                    raise
                time.sleep(pause)
                pause = min(2 * pause, 0.5)
        log.info("removed the temporary checkpoint entry %s", path)
    return names


class _DiskFullRecords(logging.Filter):
    """Drops log records that report a full disk (text or exception chain): orbax logs
    one, with its traceback, from each thread of a failed save."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if (error is not None and artifacts.is_disk_full(error)) or artifacts.is_disk_full(
            Exception(record.getMessage())
        ):
            _DISK_FULL_SEEN.set()
            return False
        return True


_DISK_FULL_FILTER = _DiskFullRecords()
_DISK_FULL_SEEN = threading.Event()  # a full disk was reported in this process
# How long a closed-loop callback's report waits to learn that a full disk explains it:
# tensorstore's threads can report before the failed save's own error reaches the
# thread that records it (then the report began, and the process's exit cut it short).
_HOLD_S = 2.0


def _explained_by_full_disk(error: BaseException | None) -> bool:
    """Whether ``error`` is a closed-loop callback of a save that failed on a full disk
    (waiting up to ``_HOLD_S`` for that failure to be recorded)."""
    return _is_closed_loop_callback(error) and _DISK_FULL_SEEN.wait(timeout=_HOLD_S)


def _is_closed_loop_callback(error: BaseException | None) -> bool:
    """tensorstore completing a write of a failed save into its closed event loop."""
    return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


def _quiet_unraisablehook(hook):
    """``hook`` (``sys.unraisablehook``) that drops a closed-loop callback's traceback
    when a full disk explains it (`_explained_by_full_disk`); anything else goes to
    ``hook``."""

    def unraisablehook(unraisable):
        if _explained_by_full_disk(unraisable.exc_value):
            return
        hook(unraisable)

    unraisablehook.quiets_disk_full = True
    return unraisablehook


def _quiet_excepthook(hook):
    """``hook`` (``sys.excepthook``) that drops the same closed-loop callback's traceback
    when a full disk explains it: tensorstore's threads also report it through
    ``PyErr_Print`` (a bare traceback, seen on a loaded host); anything else goes to
    ``hook``."""

    def excepthook(kind, value, traceback):
        if _explained_by_full_disk(value):
            return
        hook(kind, value, traceback)

    excepthook.quiets_disk_full = True
    return excepthook


def quiet_disk_full() -> None:
    """Silences orbax's and tensorstore's stderr report of a full disk in this process.

    Orbax logs (through absl, logger ``absl``) a save's failure from each of its threads
    with a traceback, and asyncio (logger ``asyncio``) reports each of a failed save's
    write tasks whose exception nobody retrieved ("Task exception was never retrieved",
    when the loop outlives the save: seen on a loaded host); those records are dropped
    when they report ENOSPC. tensorstore's
    write callbacks into the event loop a failed save closed print ``RuntimeError: Event
    loop is closed`` through ``sys.unraisablehook`` or ``sys.excepthook``; dropped once a
    full disk was seen.
    The save raises ``artifacts.DiskFullError``, whose one line says it all. Idempotent.
    """
    for name in ("absl", "orbax", "asyncio"):
        logger = logging.getLogger(name)
        if _DISK_FULL_FILTER not in logger.filters:
            logger.addFilter(_DISK_FULL_FILTER)
    if not getattr(sys.unraisablehook, "quiets_disk_full", False):
        sys.unraisablehook = _quiet_unraisablehook(sys.unraisablehook)
    if not getattr(sys.excepthook, "quiets_disk_full", False):
        sys.excepthook = _quiet_excepthook(sys.excepthook)


def path_name(path) -> str:
    """A path name that is the same for a live tree and orbax's stored metadata tree.

    Orbax stores dict keys as strings and named tuples as dicts, so only the sequence
    of key names is compared.
    """
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return "/".join(parts)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    return {
        path_name(path): tuple(np.shape(x))
        for path, x in jax.tree_util.tree_leaves_with_path(tree)
        if hasattr(x, "shape")
    }


class Checkpointer:
    """Saves and restores ``(tree, meta)`` pairs under ``directory``.

    Args:
      directory: where step subdirectories live (``<run>/checkpoints``).
      max_to_keep: how many most recent steps to keep.
      cleanup_tmp: delete temporary directories of saves that never completed (a
        process killed mid-save); only for the directory's own writer, never for a
        directory another process may be saving into.
    """

    def __init__(self, directory: str, max_to_keep: int = 2, cleanup_tmp: bool = False):
        self.directory = os.path.abspath(directory)
        quiet_disk_full()
        # Process 0 cleans, as orbax's own clean-up would (its primary host).
        self._cleanup = cleanup_tmp and jax.process_index() == 0
        if self._cleanup:
            remove_temporary(self.directory)
        # (orbax's clean-up off: done above, robustly; see the module doc.)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, cleanup_tmp_directories=False
        )
        # Named handlers let a fresh process read a step's tree metadata (shapes) before
        # restoring it; without them orbax reports no metadata and the shape check is lost.
        handlers = {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(
            self.directory, options=options, item_handlers=handlers
        )
        self._damaged: set[int] = set()  # steps `restore` fell back from

    def latest_step(self) -> int | None:
        """The newest complete step, or None when there is none."""
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """All complete steps on disk, oldest first."""
        return sorted(self._manager.all_steps())

    def has_step(self, step: int) -> bool:
        """Whether ``step`` is on disk and not known to be damaged (`restore` fell back
        from it)."""
        return step not in self._damaged and step in self._manager.all_steps()

    def save(self, step: int, tree: Any, meta: dict[str, Any]) -> None:
        """Writes ``tree`` (arrays) and ``meta`` (JSON, with the arrays' checksums added)
        as ``step`` and waits for it; a damaged copy of ``step`` that `restore` fell
        back from is deleted first."""
        meta = {**meta, CHECKSUMS: checksums(tree)}
        if step in self._damaged:
            if step in self._manager.all_steps():
                log.warning("replacing damaged checkpoint %s/%d", self.directory, step)
                self._manager.delete(step)
            self._damaged.discard(step)
        args = ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta))
        before = set(threading.enumerate())
        try:
            self._manager.save(step, args=args, force=True)
            self._manager.wait_until_finished()
        except Exception as e:
            # The step stays a temporary directory, which latest_step never returns; the
            # earlier steps are kept (orbax prunes them only after a save completes). The
            # other items' writers may still run: waited for, then (one process) the
            # temporary directory goes, so a resume in this process starts clean.
            _join_threads_since(before, SETTLE_TIMEOUT_S)
            if self._cleanup and jax.process_count() == 1:
                remove_temporary(self.directory)
            if artifacts.is_disk_full(e):
                _DISK_FULL_SEEN.set()
                raise artifacts.DiskFullError(self.directory) from e
            raise

    def restore(self, like: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Restores the tree at ``step`` (default: latest) into the structure of ``like``.

        Args:
          like: a tree of arrays or ``jax.ShapeDtypeStruct`` (shardings are kept) with
            the structure, shapes and dtypes expected.
          step: which step; the latest when None.

        Returns:
          (tree, meta). With ``step=None`` a damaged latest step falls back to the
          previous one, with a warning (see the module doc).

        Raises:
          FileNotFoundError: no checkpoint in the directory.
          CheckpointMismatchError: the checkpoint holds different names or shapes
            (the message lists the first differences).
          CheckpointDamagedError: the step asked for (or every step) is damaged.
        """
        if step is not None:
            return self._restore_checked(like, step)
        steps = sorted(self.all_steps(), reverse=True)
        if not steps:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        for i, candidate in enumerate(steps):
            try:
                return self._restore_checked(like, candidate)
            except CheckpointDamagedError as e:
                if i + 1 == len(steps):
                    raise
                self._damaged.add(candidate)
                log.warning("%s; falling back to step %d", e, steps[i + 1])
        raise AssertionError("unreachable")

    def _restore_checked(self, like: Any, step: int) -> tuple[Any, dict[str, Any]]:
        """`restore` of one step, its arrays checked against their checksums."""
        where = f"checkpoint {self.directory}/{step}"
        try:
            tree, meta = self._restore_step(like, step)
        except CheckpointMismatchError:
            raise
        except Exception as e:  # orbax, tensorstore and json raise many kinds
            raise CheckpointDamagedError(f"{where} cannot be read ({type(e).__name__}: {e})") from e
        expected = meta.get(CHECKSUMS) or {}
        got = checksums(tree)
        bad = sorted(name for name, crc in expected.items() if got.get(name, crc) != crc)
        if bad:
            raise CheckpointDamagedError(
                f"{where}: {len(bad)} array(s) do not match their checksums ({', '.join(bad[:3])})"
            )
        return tree, {k: v for k, v in meta.items() if k != CHECKSUMS}

    def _restore_step(self, like: Any, step: int) -> tuple[Any, dict[str, Any]]:
        self._check_compatible(like, step)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        args = ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
        )
        restored = self._manager.restore(step, args=args)
        return restored.state, dict(restored.meta)

    def restore_params(self, params_like: Any, step: int | None = None) -> Any:
        """Restores only the parameters of a checkpoint (e.g. to start a new run from it).

        Works for run checkpoints (``{"state": TrainState}``, or a PPO state whose policy
        is ``state.actor``) and base policies (``{"params": ...}``); the shapes are checked
        against ``params_like``.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        args = ocp.args.Composite(state=ocp.args.StandardRestore())
        tree = self._manager.restore(step, args=args).state
        if "state" in tree:  # a run: GRPO keeps state.params, PPO state.actor.params
            state = tree["state"]
            params = state["actor"]["params"] if "actor" in state else state["params"]
        else:
            params = tree["params"]
        problems = []
        got, expected = _shapes(params), _shapes(params_like)
        for name in sorted(expected.keys() | got.keys()):
            if expected.get(name) != got.get(name):
                problems.append(
                    f"{name}: checkpoint {got.get(name)}, expected {expected.get(name)}"
                )
        if problems:
            raise CheckpointMismatchError(
                f"params in {self.directory}/{step} do not match the model:\n  "
                + "\n  ".join(problems[:10])
            )
        # Rebuild in the model's own structure (int layer keys, its dtypes).
        by_name = {path_name(path): x for path, x in jax.tree_util.tree_leaves_with_path(params)}
        return jax.tree_util.tree_map_with_path(
            lambda path, like: jax.numpy.asarray(by_name[path_name(path)], dtype=like.dtype),
            params_like,
        )

    def restore_policy_params(self, params_like: Any, step: int | None = None) -> Any:
        """Restores only the policy parameters of a run checkpoint, as numpy arrays.

        Unlike `restore_params`, nothing else is read from disk (no optimizer state, no
        PPO critic or reference): an orbax partial restore of ``state.params`` (GRPO) or
        ``state.actor.params`` (PPO), or ``params`` of a base-policy checkpoint.

        Args:
          params_like: a tree with the model's structure and shapes (e.g.
            ``model.abstract_params(config)``).
          step: which step; the latest when None.

        Returns:
          A tree in ``params_like``'s structure of host numpy arrays in the stored dtype.

        Raises:
          FileNotFoundError: no checkpoint in the directory, or no such step.
          CheckpointMismatchError: the stored parameters have other names or shapes.
        """
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        if step not in self.all_steps():
            raise FileNotFoundError(
                f"no step {step} in {self.directory}; available steps: {self.all_steps()}"
            )
        metadata = self._manager.item_metadata(step)
        stored = metadata["state"] if metadata is not None else None
        stored = getattr(stored, "tree", stored)
        if stored is None:
            raise FileNotFoundError(f"{self.directory}/{step} holds no state metadata")
        if "state" in stored:  # a run: GRPO keeps state.params, PPO state.actor.params
            keys = (
                ("state", "actor", "params") if "actor" in stored["state"] else ("state", "params")
            )
        else:
            keys = ("params",)
        node = stored
        for key in keys:
            node = node[key]
        got, expected = _shapes(node), _shapes(params_like)
        problems = [
            f"{name}: checkpoint {got.get(name)}, expected {expected.get(name)}"
            for name in sorted(expected.keys() | got.keys())
            if expected.get(name) != got.get(name)
        ]
        if problems:
            raise CheckpointMismatchError(
                f"params in {self.directory}/{step} do not match the model:\n  "
                + "\n  ".join(problems[:10])
            )
        item = jax.tree.map(lambda x: np.zeros((), np.float32), params_like)
        restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
        for key in reversed(keys):
            item, restore_args = {key: item}, {key: restore_args}
        tree = ocp.PyTreeCheckpointer().restore(
            os.path.join(self.directory, str(step), "state"),
            args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True),
        )
        for key in keys:
            tree = tree[key]
        by_name = {path_name(path): x for path, x in jax.tree_util.tree_leaves_with_path(tree)}
        return jax.tree_util.tree_map_with_path(
            lambda path, _: np.asarray(by_name[path_name(path)]), params_like
        )

    def _check_compatible(self, like: Any, step: int) -> None:
        metadata = self._manager.item_metadata(step)
        stored_tree = metadata["state"] if metadata is not None else None
        if stored_tree is None:
            return
        stored_tree = getattr(stored_tree, "tree", stored_tree)
        stored = _shapes(stored_tree)
        expected = _shapes(like)

        def order(name):  # parameters first: the optimizer state only mirrors them
            return ("opt_state" in name, name)

        problems = []
        for name in sorted(expected.keys() - stored.keys(), key=order)[:5]:
            problems.append(f"missing {name} (expected shape {expected[name]})")
        for name in sorted(stored.keys() - expected.keys(), key=order)[:5]:
            problems.append(f"unexpected {name} (shape {stored[name]})")
        mismatched = [n for n in expected.keys() & stored.keys() if expected[n] != stored[n]]
        for name in sorted(mismatched, key=order)[: max(10 - len(problems), 0)]:
            problems.append(f"{name}: checkpoint shape {stored[name]}, expected {expected[name]}")
        if problems:
            raise CheckpointMismatchError(
                f"checkpoint {self.directory}/{step} does not match the model/optimizer "
                f"being restored ({len(mismatched)} arrays of different shape; was it written "
                "with another model config?):\n  " + "\n  ".join(problems)
            )

    def close(self) -> None:
        self._manager.close()
