r"""Supervised warm start of a base policy, cached in the work dir.

  python -m experiments.pretrain                       # the CPU study's base policy
  python -m experiments.pretrain --config.task.kwargs.n_digits=4 --force

Sweeps and runs create the base policy automatically when it is missing; this job
trains it ahead of time and prints its validation accuracy and wall time.
"""

import json
import os
import shutil

from absl import app, flags, logging

from experiments import cli, configs

_CONFIG = cli.define_config(
    "config", configs.path("grpo_cpu.py"), "Run config file.", lock_config=False
)
_FORCE = flags.DEFINE_bool("force", False, "Retrain even when a cached base policy exists.")


def main(argv):
    del argv
    from rl_batch import pretrain

    logging.set_verbosity(logging.WARNING)

    config = _CONFIG.value
    directory = pretrain.cache_dir(config)
    if _FORCE.value and os.path.isdir(directory):
        shutil.rmtree(directory)
    pretrain.base_params(config)
    with open(os.path.join(directory, "info.json")) as f:
        info = json.load(f)
    print(
        f"base policy {info['key']}: greedy accuracy {info['val_greedy_accuracy']:.3f}, "
        f"mean@4 {info['val_mean_at_4']:.3f} on {info['val_prompts']} validation prompts, "
        f"{info['steps']} steps in {info['wall_s']:.0f}s -> {directory}"
    )


if __name__ == "__main__":
    app.run(main)
