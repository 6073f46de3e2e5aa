"""The command line shared by ``experiments.grpo_sweep`` and ``experiments.ppo_sweep``.

One definition of the flags (``--config`` with its ``--config.*`` overrides,
``--sweep_dir``, ``--isolate``, ``--list_runs``, ``--only``, ``--analyze``,
``--print_config``, ``--quiet``) and of ``main``; each entry point calls `define_flags`
with its own default config once, at import, so the override flags are registered for
that config only.

With ``sweep.extend_edges``, ``rl_batch.sweeps.extend.run_extending`` runs the grid, then
extends it past an edge optimum (`next_edge_step`: the analysis's
``extension.next_edge_points``) until the minimum of T is interior or a limit is reached;
docs/study_design.md describes it.
"""

import functools
import os
import sys
import time

from absl import app, flags, logging

from experiments import cli
from rl_batch import artifacts


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
    from rl_batch.sweeps.sweep import POINT_FIELDS

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


def failed_message(failed: list[str], sweep_dir: str) -> str:
    """The line naming the points that did not finish, and where their errors are:
    ``errors.log`` only when a point wrote one (else sweep.json's statuses)."""
    errors_log = os.path.join(sweep_dir, "errors.log")
    where = (
        f"see {errors_log}"
        if os.path.exists(errors_log)
        else f"their status is in {os.path.join(sweep_dir, artifacts.SWEEP_FILE)}"
    )
    return f"{len(failed)} run(s) failed: {failed}; {where}"


def next_edge_step(sweep_dir: str, **limits):
    """The grid extension's next step after a pass (``rl_batch.sweeps.extend.NextStep``):
    the sweep analysed as the report does, then `extension.next_edge_points` with
    ``limits`` (``rounds_done``, ``max_rounds``, ``max_batch``, ``min_group``)."""
    from rl_batch.analysis import curves, extension, time_to_target

    analysis = time_to_target.analyze_sweep(curves.load_sweep(sweep_dir))
    return extension.next_edge_points(analysis, **limits)


def _ahead_points(keys, min_group: int):
    """The grid extension's points a calibration times ahead (``rl_batch.sweeps.extend``'s
    ``ahead``): `extension.ahead_points`."""
    from rl_batch.analysis import extension

    return extension.ahead_points(keys, min_group)


def main(argv, algo: str = "grpo"):
    """Runs the sweep (or lists its grid); exits with status 1 if a requested point failed.

    Args:
      argv: leftover command-line arguments (none are expected).
      algo: the algorithm the config must be for (``"grpo"`` or ``"ppo"``).
    """
    del argv
    from rl_batch import provenance
    from rl_batch.sweeps import extend, sweep
    from rl_batch.sweeps import processes as procs

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
        config, note = _or_exit(extend.applied_extension, config, sweep_dir)
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
    processes = procs.join_processes(config, isolate=f.isolate)
    run_fn = None
    if f.quiet and not f.isolate:
        from rl_batch.runs import run as run_lib

        run_fn = functools.partial(run_lib.run, progress=False)
    run_grid = functools.partial(
        sweep.run_sweep, sweep_dir=sweep_dir, isolate=f.isolate, only=f.only,
        processes=processes, run_fn=run_fn,
    )  # fmt: skip
    if config.sweep.get("extend_edges", False) and f.only is None:
        record = _or_exit(
            extend.run_extending, config, sweep_dir, run_grid, processes, next_edge_step,
            ahead=_ahead_points,
        )  # fmt: skip
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
        print(failed_message(failed, sweep_dir), file=sys.stderr)
    if failed or refused:
        sys.exit(1)
