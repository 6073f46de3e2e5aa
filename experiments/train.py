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
    "A run config (or a run's config.json) as JSON; --config.* flags are applied on top of it.",
)
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the run's latest checkpoint.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", "", "host:port of process 0.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 0, "Processes of a multi-host run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", -1, "This process's index.")
_QUIET = flags.DEFINE_bool("quiet", False, "No progress bar.")
_PRINT_CONFIG = flags.DEFINE_bool(
    "print_config", False, "Check the config (after overrides), print it resolved and exit."
)
_HELP_CONFIG = flags.DEFINE_bool(
    "help_config", False, "List every config field with its value and meaning, and exit."
)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def refuse_ignored_flags() -> None:
    """Refuses flags a run would ignore: ``--config`` beside ``--config_json`` (the JSON
    file is the config), and ``--config.sweep.*`` (one run has no sweep section).

    Raises:
      app.UsageError: naming the flag.
    """
    if _CONFIG_JSON.value and flags.FLAGS["config"].present:
        raise app.UsageError(
            "--config and --config_json both give the run config; give one "
            "(--config.* flags apply on top of either)"
        )
    swept = sorted(k for k in flags.FLAGS["config"].override_values if k.startswith("sweep."))
    if swept and not _CONFIG_JSON.value:
        raise app.UsageError(
            f"--config.{swept[0]}: train runs one configuration, which has no sweep section; "
            "a sweep is experiments.grpo_sweep or experiments.ppo_sweep"
        )


def main(argv):
    del argv
    refuse_ignored_flags()
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
    # After flag parsing: jax reads XLA_FLAGS at import.
    from rl_batch import distributed, locks
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import run

    logging.set_verbosity(logging.WARNING)  # Orbax logs every checkpoint step at INFO.
    # SIGTERM (a scheduler's stop, a sweep parent passing its own on) stops the run as
    # Ctrl-C does: summary.json says "interrupted", and --resume continues it.
    signal.signal(signal.SIGTERM, _interrupt)
    locks.die_with_parent()  # a sweep's --isolate child stops with its parent

    # The run's one resolution (a derived section in a JSON file is recomputed: the
    # --config.* flags may have changed its inputs). A mistake (a bad value, a locked or
    # damaged run directory, a full disk) is one line: cli.run.
    distributed.maybe_initialize(config)  # (before resolve counts the devices)
    spec = config_lib.resolve(config)
    summary = run.run(spec, resume=_RESUME.value, progress=not _QUIET.value)
    reached = summary["n_star"] if summary["reached"] else artifacts.NOT_REACHED
    print(
        f"{summary['status']}: N*={reached} q={summary['q']} "
        f"T={summary['time_to_target_s']} final accuracy={summary['final_eval_accuracy']}"
    )
    from rl_batch.tasks import plugin

    hint = plugin.target_hint(
        config.task.name, summary, config.target, config.get("target_band_lo")
    )
    if hint:
        print(hint)


if __name__ == "__main__":
    cli.run(main)
