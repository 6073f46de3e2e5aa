"""The command line shared by ``experiments.grpo_sweep`` and ``experiments.ppo_sweep``.

One definition of the flags (``--config`` with its ``--config.*`` overrides,
``--sweep_dir``, ``--isolate``, ``--list_runs``, ``--only``, ``--analyze``) and of
``main``; each entry point calls `define_flags` with its own default config once, at
import, so the override flags are registered for that config only.
"""

import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags


def define_flags(default_config: str) -> None:
    """Defines the sweep flags, ``--config`` defaulting to ``default_config``."""
    config_flags.DEFINE_config_file(
        "config", default_config, "Sweep config file.", lock_config=False
    )
    flags.DEFINE_string("sweep_dir", None, "Output directory (default sweeps/<config>).")
    flags.DEFINE_bool("isolate", False, "Run each point in its own process.")
    flags.DEFINE_bool("list_runs", False, "Print the grid as JSON and exit.")
    flags.DEFINE_string("only", None, "Run only this grid point (by run name).")
    flags.DEFINE_bool("analyze", True, "Write figures/ and report.md at the end.")


def default_sweep_dir(config_path: str) -> str:
    """``sweeps/<config file name without .py>``."""
    name = os.path.splitext(os.path.basename(config_path.split(":")[0]))[0]
    return os.path.join("sweeps", name)


def main(argv, algo: str = "grpo"):
    """Runs the sweep (or lists its grid); exits with status 1 if a requested point failed.

    Args:
      argv: leftover command-line arguments (none are expected).
      algo: the algorithm the config must be for (``"grpo"`` or ``"ppo"``).
    """
    del argv
    from rl_batch import provenance, sweep

    f = flags.FLAGS
    config = f.config
    if config.algo != algo:
        raise app.UsageError(f"--config is a {config.algo!r} config; this job runs {algo!r}")
    sweep_dir = f.sweep_dir or default_sweep_dir(f["config"].config_filename)
    if f.list_runs:
        print(sweep.list_runs(config, sweep_dir))
        return
    # A multi-process sweep joins jax.distributed before any JAX call (run_sweep's plan
    # counts the devices); after that, each process knows whether it is the writer. With
    # --isolate this process never starts JAX's backend: its children need the devices.
    logging.set_verbosity(logging.WARNING)
    t0, started_at, load_start = time.perf_counter(), provenance.now(), provenance.load_average()
    processes = sweep.join_processes(config, isolate=f.isolate)
    record = sweep.run_sweep(config, sweep_dir, isolate=f.isolate, only=f.only, processes=processes)
    if not processes.writer:
        return  # Process 0 writes the analysis and reports the sweep's status.
    failed = sweep.failed_points(record, only=f.only)
    if f.only is None:  # (the jobs of an array leave the sweep's shared files alone)
        provenance.record_command(
            sweep_dir, sys.argv, started_at, time.perf_counter() - t0, load_start,
            "failed" if failed else "finished",
        )  # fmt: skip
    if f.analyze and f.only is None:
        from rl_batch.analysis import write_all

        written = write_all(sweep_dir)
        print(f"analysis: {len(written)} files under {sweep_dir}")
        report = os.path.join(sweep_dir, "report.md")
        if os.path.exists(report):
            print(open(report).read())
    if failed:
        print(
            f"{len(failed)} run(s) failed: {failed}; see {sweep_dir}/errors.log",
            file=sys.stderr,
        )
        sys.exit(1)
