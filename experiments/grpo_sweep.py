r"""The main job: a batch-size / learning-rate sweep of GRPO, then the analysis.

With no flags it runs the CPU study (``experiments/configs/grpo_cpu.py``) into
``sweeps/grpo_cpu``: several batch sizes under the sqrt LR rule, a fixed-LR point and a
group-size pair, then writes ``figures/`` and ``report.md``. Re-running the same command
skips finished runs and resumes interrupted ones.

  python -m experiments.grpo_sweep
  python -m experiments.grpo_sweep --config=experiments/configs/grpo_gpu.py \
      --sweep_dir=sweeps/gpu --config.sweep.prompts=64,128,256
  python -m experiments.grpo_sweep --list_runs          # the grid as JSON
  python -m experiments.grpo_sweep --only=p16_g8_sqrt_s0  # one point (job arrays)

A failed point is recorded (``sweep.json``, ``errors.log``) and the other points still
run; once they have, and the analysis is written, the program exits with status 1 if any
requested point did not finish. Launched as several processes (``launch/local.sh -n N``,
SLURM, TPU VM pods), process 0 writes the files and reports the status; the others exit
0 after their share, so that launchers which stop every process when one fails do not
cut process 0 off mid-write.
"""

import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from experiments import configs

_CONFIG = config_flags.DEFINE_config_file(
    "config", configs.path("grpo_cpu.py"), "Sweep config file.", lock_config=False
)
_SWEEP_DIR = flags.DEFINE_string("sweep_dir", None, "Output directory (default sweeps/<config>).")
_ISOLATE = flags.DEFINE_bool("isolate", False, "Run each point in its own process.")
_LIST = flags.DEFINE_bool("list_runs", False, "Print the grid as JSON and exit.")
_ONLY = flags.DEFINE_string("only", None, "Run only this grid point (by run name).")
_ANALYZE = flags.DEFINE_bool("analyze", True, "Write figures/ and report.md at the end.")


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
    from rl_batch import sweep

    config = _CONFIG.value
    if config.algo != algo:
        raise app.UsageError(f"--config is a {config.algo!r} config; this job runs {algo!r}")
    sweep_dir = _SWEEP_DIR.value or default_sweep_dir(flags.FLAGS["config"].config_filename)
    if _LIST.value:
        print(sweep.list_runs(config, sweep_dir))
        return
    # A multi-process sweep joins jax.distributed before any JAX call (run_sweep's plan
    # counts the devices); after that, each process knows whether it is the writer. With
    # --isolate this process never starts JAX's backend: its children need the devices.
    logging.set_verbosity(logging.WARNING)
    processes = sweep.join_processes(config, isolate=_ISOLATE.value)
    record = sweep.run_sweep(
        config, sweep_dir, isolate=_ISOLATE.value, only=_ONLY.value, processes=processes
    )
    if not processes.writer:
        return  # Process 0 writes the analysis and reports the sweep's status.
    if _ANALYZE.value and _ONLY.value is None:
        from rl_batch.analysis import write_all

        written = write_all(sweep_dir)
        print(f"analysis: {len(written)} files under {sweep_dir}")
        report = os.path.join(sweep_dir, "report.md")
        if os.path.exists(report):
            print(open(report).read())
    failed = sweep.failed_points(record, only=_ONLY.value)
    if failed:
        print(
            f"{len(failed)} run(s) failed: {failed}; see {sweep_dir}/errors.log",
            file=sys.stderr,
        )
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
