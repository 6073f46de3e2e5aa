r"""Runs one configuration: ``python -m experiments.train --config=... --config.run_dir=DIR``.

Examples::

  python -m experiments.train --config=experiments/configs/grpo_cpu.py \
      --config.run_dir=runs/p16_g8 --config.prompts=16 --config.group_size=8
  # Continue after a crash or a kill:
  python -m experiments.train --config=experiments/configs/grpo_cpu.py \
      --config.run_dir=runs/p16_g8 --resume

Multi-process (one command per process; on TPU VMs / SLURM use
``RL_BATCH_DISTRIBUTED=auto`` instead of the three flags)::

  python -m experiments.train ... --coordinator_address=host0:1234 \
      --num_processes=2 --process_id=0
"""

import os
import signal
import sys

from absl import app, flags, logging
from ml_collections import ConfigDict

from experiments import cli, configs
from rl_batch import artifacts

_CONFIG = cli.define_config(
    "config", configs.path("grpo_cpu.py"), "Run config file.", lock_config=False
)
_CONFIG_JSON = flags.DEFINE_string(
    "config_json",
    None,
    "A complete run config as JSON (used by sweeps with --isolate); --config.* flags are "
    "applied on top of it.",
)
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the run's latest checkpoint.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", "", "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Processes of a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index.")
_QUIET = flags.DEFINE_bool("quiet", False, "No progress bar.")
_SERVE = flags.DEFINE_bool(
    "serve", False, "Run the points a sweep sends on stdin, one after another (sweep.Worker)."
)
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "Check the config (after overrides), print it resolved and exit."
)
_HELP_CONFIG = flags.DEFINE_bool(
    "help_config", False, "List every config field with its value and meaning, and exit."
)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def serve() -> None:
    """``--serve``: a sweep's worker (``rl_batch.sweeps.sweep.serve_points``)."""
    from rl_batch import locks
    from rl_batch.sweeps import sweep  # After flag parsing: jax reads XLA_FLAGS at import.

    logging.set_verbosity(logging.WARNING)
    signal.signal(signal.SIGTERM, _interrupt)
    locks.die_with_parent()
    replies = os.fdopen(os.dup(1), "w")  # the protocol; stray output goes to stderr
    os.dup2(2, 1)
    sweep.serve_points(sys.stdin, replies)


def main(argv):
    del argv
    if _SERVE.value:
        return serve()
    if _CONFIG_JSON.value:
        config = ConfigDict(artifacts.read_json(_CONFIG_JSON.value))
        overrides = flags.FLAGS["config"].override_values
        config = cli.apply_overrides(config, overrides, _CONFIG_JSON.value)
    else:
        config = _CONFIG.value
        if "sweep" in config:
            del config["sweep"]
    if _PRINT_CONFIG.value:
        from rl_batch.runs import config as config_lib  # (after flag parsing: imports jax)

        cli.print_config_and_exit(config, resolve=config_lib.resolve)
    if _HELP_CONFIG.value:
        cli.print_fields_and_exit(config, flags.FLAGS["config"].config_filename)
    if _COORDINATOR.value or _NUM_PROCESSES.value:
        config.distributed.coordinator_address = _COORDINATOR.value
        config.distributed.num_processes = _NUM_PROCESSES.value
        config.distributed.process_id = _PROCESS_ID.value
    if not config.run_dir:
        raise app.UsageError("set the run directory: --config.run_dir=DIR")
    ckpt_dir = os.path.join(config.run_dir, artifacts.CHECKPOINT_DIR)
    if not _RESUME.value and os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
        raise app.UsageError(
            f"{config.run_dir} already holds checkpoints: pass --resume to continue it, "
            "or choose a new --config.run_dir"
        )
    from rl_batch import locks
    from rl_batch.runs import run  # After flag parsing: jax reads XLA_FLAGS at import.

    logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO.
    # SIGTERM (a scheduler's stop, a sweep parent passing its own on) stops the run as
    # Ctrl-C does: summary.json says "interrupted", and --resume continues it.
    signal.signal(signal.SIGTERM, _interrupt)
    locks.die_with_parent()  # a sweep's --isolate child stops with its parent

    # A mistake (a bad value, a locked or damaged run directory, a full disk: one line
    # naming the directory, and that --resume continues the run) is one line: cli.run.
    summary = run.run(config, resume=_RESUME.value, progress=not _QUIET.value)
    reached = summary["n_star"] if summary["reached"] else artifacts.NOT_REACHED
    print(
        f"{summary['status']}: N*={reached} q={summary['q']} "
        f"T={summary['time_to_target_s']} final accuracy={summary['final_eval_accuracy']}"
    )


if __name__ == "__main__":
    cli.run(main)
