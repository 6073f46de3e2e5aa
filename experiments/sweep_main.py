"""The command line shared by ``experiments.grpo_sweep`` and ``experiments.ppo_sweep``.

One definition of the flags (``--config`` with its ``--config.*`` overrides,
``--sweep_dir``, ``--isolate``, ``--list_runs``, ``--only``, ``--analyze``,
``--print_config``, ``--quiet``) and of ``main``; each entry point calls `define_flags`
with its own default config once, at import, so the override flags are registered for
that config only.

With ``sweep.extend_edges``, `run_extending` runs the grid, then extends it past an edge
optimum (``rl_batch.analysis.planner.next_edge_points``) until the minimum of T is
interior or a limit is reached; docs/study_design.md describes it.
"""

import functools
import os
import sys
import time
from typing import Any

from absl import app, flags, logging

from experiments import cli
from rl_batch import artifacts

# Fields the sweep sets at every grid point, and where a sweep takes them instead.
POINT_FIELDS = {
    "prompts": "--config.sweep.prompts",
    "group_size": "--config.sweep.group_sizes",
    "lr_rule": "--config.sweep.lr_rules",
    "seed": "--config.sweep.seeds",
    "name": "--sweep_dir (points are named from the grid)",
    "run_dir": "--sweep_dir",
}


def define_flags(default_config: str) -> None:
    """Defines the sweep flags, ``--config`` defaulting to ``default_config``."""
    cli.define_config("config", default_config, "Sweep config file.", lock_config=False)
    flags.DEFINE_string("sweep_dir", None, "Output directory (default sweeps/<config>).")
    flags.DEFINE_bool("isolate", False, "Run each point in its own process.")
    flags.DEFINE_bool("list_runs", False, "Print the grid as JSON and exit.")
    flags.DEFINE_string("only", None, "Run only this grid point (by run name).")
    flags.DEFINE_bool("analyze", True, "Write figures/ and report.md at the end.")
    flags.DEFINE_bool("print_config", False, "Print the config (after overrides) and exit.")
    flags.DEFINE_bool(
        "help_config", False, "List every config field with its value and meaning, and exit."
    )
    flags.DEFINE_bool("quiet", False, "No per-run progress bars; the report is not printed.")


def check_point_overrides(argv) -> None:
    """Rejects ``--config.<field>`` for a field the sweep sets at every grid point.

    Raises:
      app.UsageError: naming the flag and the sweep field that sets it.
    """
    for arg in argv:
        field = arg.split("=", 1)[0].removeprefix("--config.")
        if arg.startswith("--config.") and field in POINT_FIELDS:
            raise app.UsageError(
                f"{arg}: a sweep sets {field} at every grid point, so this override would "
                f"be ignored; use {POINT_FIELDS[field]}"
            )


def default_sweep_dir(config_path: str) -> str:
    """``sweeps/<config file name without .py>`` (under ``$RL_BATCH_DEFAULT_ROOT`` when
    set: `artifacts.default_dir`)."""
    name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
    return artifacts.default_dir("sweeps", name)


def _or_exit(fn, *args, **kwargs):
    """``fn(...)``; a ValueError (a bad grid or config: the sweep raises them before any
    point starts, and records a failing point's errors instead) or a full disk (one line
    naming the directory; ``artifacts.DiskFullError``) exits with its message."""
    try:
        return fn(*args, **kwargs)
    except (ValueError, artifacts.DiskFullError) as e:
        cli.fail(e)


def extended_config(config, points: list[str]):
    """The sweep config with ``points`` ("PxG:rule") added to ``sweep.extra_points`` and
    the reference pinned (a smaller batch must not become the default reference)."""
    from ml_collections import ConfigDict

    from rl_batch.sweeps import sweep

    c = ConfigDict(config.to_dict())
    if not c.sweep.reference:
        c.sweep.reference = sweep.reference_key(c, sweep.expand_grid(c))
    extra = [p for p in str(c.sweep.extra_points).split(",") if p.strip()]
    c.sweep.extra_points = ",".join(extra + [p for p in points if p not in extra])
    return c


def grid_identity(config) -> dict:
    """What an extension belongs to: the grid's point names, in order, and its reference
    key (pinned as `extended_config` pins it)."""
    from rl_batch.sweeps import sweep

    points = sweep.expand_grid(config)
    return {"points": [p.name for p in points], "reference": sweep.reference_key(config, points)}


def _recorded_grid(ext: dict, sweep_dir: str, config) -> dict | None:
    """The grid ``<sweep>/extensions.json`` extends. A file written before the grid was
    recorded in it: the grid of ``sweep.json`` (the last pass's extended grid) less the
    added points, when ``config`` extended by them is that grid; else None (unknown)."""
    if ext.get("grid"):
        return ext["grid"]
    path = os.path.join(sweep_dir, artifacts.SWEEP_FILE)
    if not os.path.exists(path):
        return None
    from rl_batch.sweeps import sweep

    record = artifacts.read_json(path)
    added = [p for r in ext["rounds"] for p in r["points"]]
    try:
        extended = sweep.expand_grid(extended_config(config, added))
        ref_key = sweep.reference_key(config, sweep.expand_grid(config))
    except ValueError:
        return None
    same = [r["name"] for r in record.get("runs", [])] == [p.name for p in extended] and (
        record.get("reference") == next(p.name for p in extended if p.key == ref_key)
    )
    return grid_identity(config) if same else None


def applied_extension(config, sweep_dir: str) -> tuple[Any, str]:
    """The config with the points ``<sweep>/extensions.json`` added to this very grid
    (`extended_config`), and a line that names them (or says why none apply).

    Recorded points apply only to the grid they extend, in the directory they were
    recorded in: another grid in the same directory (other prompts, group sizes, seeds,
    rules, extra points or reference) gets none. ``sweep.extend_edges`` off: none.
    """
    if not config.sweep.get("extend_edges", False):
        return config, ""
    from rl_batch.analysis import planner

    ext = planner.read_extensions(sweep_dir)
    added = [p for r in ext["rounds"] for p in r["points"]]
    if not added:
        return config, ""
    path = os.path.join(sweep_dir, planner.EXTENSIONS_FILE)
    if _recorded_grid(ext, sweep_dir, config) != grid_identity(config):
        return config, f"{path} extends another grid: its points ({', '.join(added)}) not added"
    rounds = len(ext["rounds"])
    return extended_config(config, added), (
        f"grid extension recorded in {path} ({rounds} round(s)): adds {', '.join(added)}"
    )


def listed_config(config, sweep_dir: str):
    """The config whose grid ``--list_runs`` prints: with ``sweep.extend_edges``, the
    points recorded in ``<sweep>/extensions.json`` for this grid are added
    (`applied_extension`)."""
    return applied_extension(config, sweep_dir)[0]


def _too_big(config, sweep_dir: str, points: list[str], processes) -> list[str]:
    """Messages for the added ``points`` whose update or sampler would not fit
    ``sweep.device_memory`` (none when it is 0): the planner's memory check."""
    from rl_batch.sweeps import sweep

    memory = float(config.sweep.get("device_memory", 0) or 0)
    if not memory:
        return []
    pts, resolved = sweep.plan(config, sweep_dir, processes.device_count)
    mine = {pt.name: resolved[pt.name] for pt in pts if pt.key in set(points)}
    return sweep.check_memory(mine, memory, sweep_dir)


def run_extending(config, sweep_dir: str, run_grid, processes, log=print) -> dict:
    """Runs the grid, then extends it past an edge optimum (``sweep.extend_edges``).

    After each pass, the sweep is analysed and `planner.next_edge_points` names the next
    batch beyond the best configuration when it sits at an edge of its family; those
    points (every seed) are added to ``sweep.extra_points`` and the grid runs again
    (finished points are skipped, so only the new ones run, then the calibration
    covers every configuration). Stops when the minimum of T is interior, or at a limit
    (``sweep.extend_max_rounds``, ``sweep.extend_max_batch``, P = 1, memory), or when a
    point failed. The added points and the reasons go to ``<sweep>/extensions.json``; a
    re-run of the same command starts from them, so only new points run.

    Args:
      config: the sweep config.
      sweep_dir: the sweep directory.
      run_grid: runs one grid (``config -> record``; `sweep.run_sweep` bound to the
        directory and this process's settings).
      processes: this process's place (`sweep.join_processes`).
      log: where progress lines go.

    Returns:
      The last pass's sweep record.

    Raises:
      ValueError: for a multi-process sweep (each process would have to agree on the
        extension).
    """
    from rl_batch import artifacts, distributed
    from rl_batch.analysis import curves, planner, time_to_target
    from rl_batch.sweeps import sweep

    if distributed.settings(config) is not None:
        raise ValueError(
            "sweep.extend_edges=True needs a single-process sweep (every process of a "
            "multi-process one would have to agree on the added points); run the "
            "extension's points with --config.sweep.extra_points instead"
        )
    if config.get("target") is None:
        raise ValueError("sweep.extend_edges=True needs a target (T is time to the target)")
    ext = planner.read_extensions(sweep_dir)
    added = [p for r in ext["rounds"] for p in r["points"]]
    path = os.path.join(sweep_dir, planner.EXTENSIONS_FILE)
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
        current = extended_config(config, added)
        record = run_grid(current)
        if not processes.writer:
            return record
        if sweep.failed_points(record):
            ext["stopped"] = "a point failed: no extension past an incomplete grid"
            break
        analysis = time_to_target.analyze_sweep(curves.load_sweep(sweep_dir))
        step = planner.next_edge_points(
            analysis,
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
        artifacts.write_json_atomic(path, ext)
        added += points
    log(f"[sweep] grid extension stopped: {ext['stopped']}")
    artifacts.write_json_atomic(path, ext)
    return record


def main(argv, algo: str = "grpo"):
    """Runs the sweep (or lists its grid); exits with status 1 if a requested point failed.

    Args:
      argv: leftover command-line arguments (none are expected).
      algo: the algorithm the config must be for (``"grpo"`` or ``"ppo"``).
    """
    del argv
    from rl_batch import provenance
    from rl_batch.sweeps import sweep

    f = flags.FLAGS
    config = f.config
    if f.print_config:
        cli.print_config_and_exit(config)
    if f.help_config:
        cli.print_fields_and_exit(config, f["config"].config_filename)
    check_point_overrides(sys.argv)
    if config.algo != algo:
        raise app.UsageError(f"--config is a {config.algo!r} config; this job runs {algo!r}")
    sweep_dir = f.sweep_dir or default_sweep_dir(f["config"].config_filename)
    if f.list_runs or f.only is not None:
        # The points a grid extension added to this grid in this directory, named
        # (stderr: --list_runs prints JSON): a job of an array runs what was listed.
        config, note = _or_exit(applied_extension, config, sweep_dir)
        if note:
            print(note, file=sys.stderr)
    if f.list_runs:
        print(_or_exit(sweep.list_runs, config, sweep_dir))
        return
    # A multi-process sweep joins jax.distributed before any JAX call (run_sweep's plan
    # counts the devices); after that, each process knows whether it is the writer. With
    # --isolate this process never starts JAX's backend: its children need the devices.
    logging.set_verbosity(logging.WARNING)
    t0, started_at, load_start = time.perf_counter(), provenance.now(), provenance.load_average()
    processes = sweep.join_processes(config, isolate=f.isolate)
    run_fn = None
    if f.quiet and not f.isolate:
        from rl_batch.runs import run as run_lib

        run_fn = functools.partial(run_lib.run, progress=False)
    run_grid = functools.partial(
        sweep.run_sweep, sweep_dir=sweep_dir, isolate=f.isolate, only=f.only,
        processes=processes, run_fn=run_fn,
    )  # fmt: skip
    if config.sweep.get("extend_edges", False) and f.only is None:
        record = _or_exit(run_extending, config, sweep_dir, run_grid, processes)
    else:
        record = _or_exit(run_grid, config)
    if not processes.writer:
        return  # Process 0 writes the analysis and reports the sweep's status.
    failed = sweep.failed_points(record, only=f.only)
    if f.only is None:  # (the jobs of an array leave the sweep's shared files alone)
        provenance.record_command(
            sweep_dir, sys.argv, started_at, time.perf_counter() - t0, load_start,
            "failed" if failed else "finished", module=f"experiments.{algo}_sweep",
        )  # fmt: skip
    refused = None
    if f.analyze and f.only is None:
        from rl_batch.analysis import write_all

        try:
            written = write_all(sweep_dir)
        except ValueError as e:  # e.g. no usable runs: one line (the points' errors follow)
            refused = f"error: analysis not written: {e}"
        else:
            print(f"analysis: {len(written)} files under {sweep_dir}")
            report = os.path.join(sweep_dir, "report.md")
            if os.path.exists(report) and not f.quiet:
                print(open(report).read())
    if refused:
        print(refused, file=sys.stderr)
    if failed:
        print(
            f"{len(failed)} run(s) failed: {failed}; see {sweep_dir}/errors.log",
            file=sys.stderr,
        )
    if failed or refused:
        sys.exit(1)
