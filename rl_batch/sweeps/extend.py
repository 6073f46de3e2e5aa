"""A sweep's grid extension past an edge optimum (``sweep.extend_edges``).

After the grid has run, when the configuration with the smallest T has the smallest
(largest) batch of its family, the next batch beyond it is added and the grid runs again
(finished points are skipped), until the minimum of T is interior or a limit is reached
(docs/study_design.md). Which points come next is the analysis's answer
(``rl_batch.analysis.extension.next_edge_points``); the command line passes it in as
``next_step``, since this layer does not import the analysis.

``<sweep>/extensions.json`` (`artifacts.read_extensions`) records the rounds and the grid
they extend: recorded points apply only to that grid in that directory, and are named
when they do (`applied_extension`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ml_collections import ConfigDict

from rl_batch import artifacts, distributed
from rl_batch.runs import config as config_lib
from rl_batch.sweeps import sweep
from rl_batch.sweeps.processes import Processes


class Step(Protocol):
    """The analysis's answer after a pass (``extension.Extension``)."""

    points: Sequence[str]  # point keys ("PxG:rule") to add; empty when it stops
    reason: str
    best: Any  # the best configuration (``.name``)

    @property
    def stop(self) -> bool: ...


# (sweep_dir, rounds_done=, max_rounds=, max_batch=, min_group=) -> the next step
NextStep = Callable[..., Step]
# (the grid's configurations, min_group) -> points to calibrate ahead of their runs
AheadPoints = Callable[[Sequence[artifacts.Configuration], int], Sequence[str]]


def extended_config(config: ConfigDict, points: Sequence[str]) -> ConfigDict:
    """The sweep config with ``points`` ("PxG:rule") added to ``sweep.extra_points`` and
    the reference pinned (a smaller batch must not become the default reference)."""
    c = ConfigDict(config.to_dict())
    if not c.sweep.reference:
        c.sweep.reference = sweep.reference_key(c, sweep.expand_grid(c))
    extra = [p for p in str(c.sweep.extra_points).split(",") if p.strip()]
    c.sweep.extra_points = ",".join(extra + [p for p in points if p not in extra])
    return c


def grid_identity(config: ConfigDict) -> dict[str, Any]:
    """What an extension belongs to: the grid's point names, in order, and its reference
    key (pinned as `extended_config` pins it)."""
    points = sweep.expand_grid(config)
    return {"points": [p.name for p in points], "reference": sweep.reference_key(config, points)}


def added_points(ext: dict[str, Any]) -> list[str]:
    """The point keys every recorded round added, in order."""
    return [p for r in ext["rounds"] for p in r["points"]]


def _recorded_grid(ext: dict, sweep_dir: str, config: ConfigDict) -> dict | None:
    """The grid ``<sweep>/extensions.json`` extends. A file written before the grid was
    recorded in it: the grid of ``sweep.json`` (the last pass's extended grid) less the
    added points, when ``config`` extended by them is that grid; else None (unknown)."""
    if ext.get("grid"):
        return ext["grid"]
    path = os.path.join(sweep_dir, artifacts.SWEEP_FILE)
    if not os.path.exists(path):
        return None
    record = artifacts.read_json(path)
    try:
        extended = sweep.expand_grid(extended_config(config, added_points(ext)))
        ref_key = sweep.reference_key(config, sweep.expand_grid(config))
    except ValueError:
        return None
    same = [r["name"] for r in record.get("runs", [])] == [p.name for p in extended] and (
        record.get("reference") == next(p.name for p in extended if p.key == ref_key)
    )
    return grid_identity(config) if same else None


def applied_extension(config: ConfigDict, sweep_dir: str) -> tuple[ConfigDict, str]:
    """The config with the points ``<sweep>/extensions.json`` added to this very grid
    (`extended_config`), and a line that names them (or says why none apply).

    Recorded points apply only to the grid they extend, in the directory they were
    recorded in: another grid in the same directory (other prompts, group sizes, seeds,
    rules, extra points or reference) gets none. ``sweep.extend_edges`` off: none.
    """
    if not config.sweep.get("extend_edges", False):
        return config, ""
    ext = artifacts.read_extensions(sweep_dir)
    added = added_points(ext)
    if not added:
        return config, ""
    path = os.path.join(sweep_dir, artifacts.EXTENSIONS_FILE)
    if _recorded_grid(ext, sweep_dir, config) != grid_identity(config):
        return config, f"{path} extends another grid: its points ({', '.join(added)}) not added"
    rounds = len(ext["rounds"])
    return extended_config(config, added), (
        f"grid extension recorded in {path} ({rounds} round(s)): adds {', '.join(added)}"
    )


def _too_big(config, sweep_dir: str, points: list[str], processes: Processes) -> list[str]:
    """Messages for the added ``points`` whose update or sampler would not fit
    ``sweep.device_memory`` (none when it is 0): the planner's memory check."""
    memory = float(config.sweep.get("device_memory", 0) or 0)
    if not memory:
        return []
    pts, resolved = sweep.plan(config, sweep_dir, processes.device_count)
    mine = {pt.name: resolved[pt.name] for pt in pts if pt.key in set(points)}
    return sweep.check_memory(mine, memory, sweep_dir)


def write_ahead(
    config: ConfigDict, sweep_dir: str, points: Sequence[str], device_count: int | None
) -> None:
    """Writes ``<sweep>/calibration_ahead.json`` (`artifacts.read_calibration_ahead`):
    the resolved run config of each of ``points`` (keys the grid of ``config`` may add),
    so that the sweep's calibration times them beside its own configurations; removes
    the file when there are none."""
    path = os.path.join(sweep_dir, artifacts.CALIBRATION_AHEAD_FILE)
    configs = {}
    for point in sweep.expand_grid(extended_config(config, points)):
        if point.key in points and point.key not in configs:
            spec = config_lib.resolve(sweep.point_config(config, point, sweep_dir), device_count)
            configs[point.key] = spec.to_json()
    if configs:
        artifacts.write_json_atomic(path, {"version": 1, "configs": configs})
    elif os.path.exists(path):
        os.remove(path)


def run_extending(
    config: ConfigDict,
    sweep_dir: str,
    run_grid: Callable[[ConfigDict], dict[str, Any]],
    processes: Processes,
    next_step: NextStep,
    log: Callable[[str], None] = print,
    ahead: AheadPoints | None = None,
) -> dict[str, Any]:
    """Runs the grid, then extends it past an edge optimum (``sweep.extend_edges``).

    After each pass, ``next_step`` names the next batch beyond the best configuration
    when it sits at an edge of its family; those points (every seed) are added to the
    grid (`extended_config`) and the grid runs again (finished points are skipped, so
    only the new ones run, then the calibration covers every configuration). Stops when
    the minimum of T is interior, or at a limit (``sweep.extend_max_rounds``,
    ``sweep.extend_max_batch``, P = 1, memory), or when a point failed. The added points,
    the reasons and the grid go to ``<sweep>/extensions.json``; a re-run of the same
    command starts from them, so only new points run.

    Args:
      config: the sweep config.
      sweep_dir: the sweep directory.
      run_grid: runs one grid (``config -> record``; `sweep.run_sweep` bound to the
        directory and this process's settings).
      processes: this process's place (`processes.join_processes`).
      next_step: the analysis of the sweep so far (see `NextStep`;
        ``experiments.sweep_main.next_edge_step``).
      log: where progress lines go.
      ahead: the points a pass's calibration times ahead of their runs (`write_ahead`;
        ``extension.ahead_points``: the smaller-side points, the cheapest to time), so
        that an extension adding them needs no second calibration. None: none.

    Returns:
      The last pass's sweep record.

    Raises:
      ValueError: for a multi-process sweep (each process would have to agree on the
        extension), no target, or an ``extensions.json`` of another grid.
    """
    if distributed.settings(config) is not None:
        raise ValueError(
            "sweep.extend_edges=True needs a single-process sweep (every process of a "
            "multi-process one would have to agree on the added points); run the "
            "extension's points with --config.sweep.extra_points instead"
        )
    if config.get("target") is None:
        raise ValueError("sweep.extend_edges=True needs a target (T is time to the target)")
    ext = artifacts.read_extensions(sweep_dir)
    added = added_points(ext)
    path = os.path.join(sweep_dir, artifacts.EXTENSIONS_FILE)
    grid = grid_identity(config)
    if (ext["rounds"] or ext["stopped"]) and _recorded_grid(ext, sweep_dir, config) != grid:
        raise ValueError(
            f"{path} records the extension of another grid than this one (its points: "
            f"{', '.join(added) or 'none'}); run this grid in a new --sweep_dir, or remove "
            "the file to extend this grid from its start"
        )
    ext["grid"] = grid
    if added:
        log(f"[sweep] grid extension recorded in {path}: adds {', '.join(added)}")
    min_group = 1 if config.algo == "ppo" else 2
    while True:
        grid_config = extended_config(config, added)
        if ahead is not None and processes.writer:
            keys = [pt.configuration for pt in sweep.expand_grid(grid_config)]
            write_ahead(grid_config, sweep_dir, ahead(keys, min_group), processes.device_count)
        record = run_grid(grid_config)
        if not processes.writer:
            return record
        if sweep.failed_points(record):
            ext["stopped"] = "a point failed: no extension past an incomplete grid"
            break
        step = next_step(
            sweep_dir,
            rounds_done=len(ext["rounds"]),
            max_rounds=int(config.sweep.get("extend_max_rounds", 2)),
            max_batch=int(config.sweep.get("extend_max_batch", 0) or 0),
            min_group=min_group,
        )
        points = list(step.points)
        too_big = _too_big(extended_config(config, added + points), sweep_dir, points, processes)
        if too_big:
            ext["stopped"] = f"limit: memory ({'; '.join(too_big)}); {step.reason}"
            break
        if step.stop:
            ext["stopped"] = step.reason
            break
        log(f"[sweep] extending the grid: {step.reason}")
        ext["rounds"].append({"points": points, "reason": step.reason, "best": step.best.name})
        ext["stopped"] = ""
        artifacts.write_extensions(sweep_dir, ext)
        added += points
    log(f"[sweep] grid extension stopped: {ext['stopped']}")
    artifacts.write_extensions(sweep_dir, ext)
    return record
