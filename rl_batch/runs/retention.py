"""Which checkpoints a finished run keeps (``sweep.keep_checkpoints``), and what a resume
does where they were removed.

The analysis reads ``metrics.jsonl`` and ``summary.json`` only; checkpoints serve resume.
A live run keeps orbax's last ``max_to_keep`` (2) steps: a damaged latest step falls back
to the one before (``rl_batch.runs.checkpoint``). Once a sweep's point has finished, the
sweep applies its policy (`prune_finished`):

- ``"extendable"`` (default): a run that stopped at its budget keeps its final step, the
  one a larger budget resumes from (Adam's moments included: restarting them would
  change the extended curve); a run that stopped at its confirmed target keeps none.
- ``"none"``: no finished run keeps a checkpoint.
- ``"all"``: every run keeps what it left (its last two steps).

Where the policy keeps no step of a run stopped at its target, the sweep sets the run's
``io.prune_at_target`` (`prune_at_target`) and the run applies it itself at its end: no
final save, `write_removed`, `remove_saved_steps` (``rl_batch.runs.run``).

A run whose steps were all removed keeps ``checkpoints/removed.json`` (`REMOVED_FILE`):
its final counters and its metrics lines. Resumed under a config that keeps it stopped
(the same one, a larger budget past a confirmed target), it trains nothing and its
summary is rebuilt from them; under one that trains it further (``stop_at_target=False``,
more ``confirm_evals``, a larger budget past a budget stop), it trains again from step 0,
with one warning line: the same seed redoes the same steps (re-timed), then goes on
(``rl_batch.runs.run``). The default study's runs all stop at their target: it keeps no
checkpoint (docs/reliability.md has the measured sizes).
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from rl_batch import artifacts

log = logging.getLogger(__name__)

POLICIES = ("extendable", "none", "all")
DEFAULT_POLICY = "extendable"
REMOVED_FILE = "removed.json"  # in <run>/checkpoints/: the final counters and metrics
STOP_BUDGET = "budget"  # (accounting.STOP_BUDGET: a run that spent its budget)
STOP_TARGET = "target"  # (accounting.STOP_TARGET: a run stopped at its confirmed target)


def sweep_policy(sweep_config: Any) -> str:
    """``sweep.keep_checkpoints`` of a sweep config's ``sweep`` section (the default when
    unset)."""
    return str(sweep_config.get("keep_checkpoints", DEFAULT_POLICY))


def check_policy(policy: str) -> None:
    """Raises ValueError (one line) for a ``sweep.keep_checkpoints`` not in `POLICIES`."""
    if policy not in POLICIES:
        raise ValueError(f"sweep.keep_checkpoints={policy!r}: must be one of {', '.join(POLICIES)}")


def steps_kept(policy: str, stopped: str) -> int | None:
    """How many final steps a run that stopped for ``stopped`` ("target", "budget")
    keeps under ``policy``; None: all it left."""
    check_policy(policy)
    if policy == "all":
        return None
    return 1 if policy == "extendable" and stopped == STOP_BUDGET else 0


# Orbax's layout of a step (``rl_batch.runs.checkpoint.Checkpointer``), read here as plain
# files so that a sweep's parent process neither imports orbax nor starts JAX's backend
# (which would hold its children's accelerators): a complete step is a directory named by
# its number (a save in progress is a temporary directory of another name), its metadata
# item the JSON file ``<step>/meta/metadata``. tests/test_retention.py checks both
# against steps saved by the Checkpointer.
META_FILE = os.path.join("meta", "metadata")
CHECKSUMS = "checksums"  # (checkpoint.CHECKSUMS: not part of the kept metadata)


def saved_steps(ckpt_dir: str) -> list[int]:
    """The complete steps in ``ckpt_dir``, oldest first."""
    if not os.path.isdir(ckpt_dir):
        return []
    return sorted(
        int(n)
        for n in os.listdir(ckpt_dir)
        if n.isdigit() and os.path.isdir(os.path.join(ckpt_dir, n))
    )


def read_step_meta(ckpt_dir: str, step: int) -> dict[str, Any]:
    """The JSON metadata saved with ``step`` (counters, metrics lines, rollouts carried),
    its checksums left out.

    Raises:
      OSError, ValueError: the file is missing or not JSON (named).
    """
    meta = artifacts.read_json(os.path.join(ckpt_dir, str(step), META_FILE))
    return {k: v for k, v in meta.items() if k != CHECKSUMS}


def removed_path(run_dir: str) -> str:
    return os.path.join(run_dir, artifacts.CHECKPOINT_DIR, REMOVED_FILE)


def prune_finished(run_dir: str, policy: str) -> str:
    """Applies ``policy`` to the checkpoints of the finished run in ``run_dir``.

    Before the last step goes, its counters and metrics lines are written to
    `REMOVED_FILE` (a crash in between leaves the step, which a resume then uses). A run
    whose final step cannot be read keeps its checkpoints.

    Returns:
      A line saying what was removed ("" when nothing was), or that the run kept none
      itself (``no checkpoint kept``: it pruned its own at its target).
    """
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    steps = saved_steps(ckpt_dir)
    if not steps:  # (a run that pruned itself at its target: `prunes_own_final_step`)
        own = os.path.exists(removed_path(run_dir))
        return f"no checkpoint kept (sweep.keep_checkpoints={policy})" if own else ""
    try:
        meta = read_step_meta(ckpt_dir, steps[-1])
        stopped = meta["counters"].get("stopped", "")
    except (OSError, ValueError, KeyError, AttributeError) as e:  # damaged: keep it all
        log.warning("%s: checkpoints kept: step %d unreadable (%s)", run_dir, steps[-1], e)
        return ""
    keep = steps_kept(policy, stopped)
    if keep is None or len(steps) <= keep:
        return ""
    if keep == 0:
        write_removed(run_dir, policy, steps[-1], meta["counters"], meta.get("metrics"))
    gone = steps[: len(steps) - keep]
    _remove_steps(ckpt_dir, gone)
    kept = f", step {steps[-1]} kept" if keep else ""
    removed = ", ".join(map(str, gone))
    return f"checkpoints removed (steps {removed}{kept}; sweep.keep_checkpoints={policy})"


def prune_at_target(policy: str) -> str:
    """``io.prune_at_target`` of a sweep point under ``sweep.keep_checkpoints=policy``:
    the policy when it keeps no step of a run stopped at its target, else "" (also for a
    policy that is none: the sweep refuses it by name, `check_policy`)."""
    return policy if policy in POLICIES and steps_kept(policy, STOP_TARGET) == 0 else ""


def prunes_own_final_step(policy: str, stopped: str) -> bool:
    """Whether a run under ``io.prune_at_target=policy`` that stopped for ``stopped``
    skips its final save: a target stop under a policy that keeps no step of it, so the
    sweep would remove that save a moment later."""
    return stopped == STOP_TARGET and prune_at_target(policy) != ""


def write_removed(run_dir: str, policy: str, step: int, counters: dict, metrics: list) -> None:
    """`REMOVED_FILE` of a run whose steps go: its final ``counters`` and ``metrics`` lines
    at ``step`` (what `prune_finished` copies from the final step's metadata)."""
    marker = {"step": step, "policy": policy, "counters": counters, "metrics": metrics}
    artifacts.write_json_atomic(removed_path(run_dir), marker)


def remove_saved_steps(run_dir: str) -> None:
    """Deletes every saved step of ``run_dir``, after `write_removed`."""
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    _remove_steps(ckpt_dir, saved_steps(ckpt_dir))


def _remove_steps(ckpt_dir: str, steps: list[int]) -> None:
    """Deletes ``steps`` of ``ckpt_dir`` in the order given (oldest first: the final
    step goes last)."""
    for step in steps:
        shutil.rmtree(os.path.join(ckpt_dir, str(step)))


def read_removed(run_dir: str) -> dict[str, Any] | None:
    """`REMOVED_FILE` of ``run_dir`` when no checkpoint step is left there, else None.

    Raises:
      ValueError: the file is not readable JSON (named).
    """
    path = removed_path(run_dir)
    if not os.path.exists(path):
        return None
    if saved_steps(os.path.dirname(path)):  # (a save since, or a prune cut short)
        return None
    try:
        return artifacts.read_json(path)
    except ValueError as e:  # (names the file)
        raise ValueError(f"{e}; delete it to train the run again from step 0") from e


def clear_removed(run_dir: str) -> None:
    """Deletes `REMOVED_FILE` (a run that trains again from step 0)."""
    path = removed_path(run_dir)
    if os.path.exists(path):
        os.remove(path)
