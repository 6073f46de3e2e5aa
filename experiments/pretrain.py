r"""Supervised warm start of a base policy, cached in the work dir.

  python -m experiments.pretrain                       # the CPU study's base policy
  python -m experiments.pretrain --config.task.kwargs.n_digits=4 --force
  # Train it and write it as a base policy file (what the default studies start from):
  python -m experiments.pretrain --config=experiments/configs/grpo_cpu.py \
      --export=experiments/configs/base_policies/addition-tiny-1m.npz

Runs with ``init.source="pretrain"`` create the base policy automatically when it is
missing; this job trains it ahead of time and prints its validation accuracy and wall
time. ``--export`` also writes it as a params file (``.npz`` of host arrays) with a
``.json`` beside it (how it was made: config, steps, p_ref, commit, machine), for
``init.source="params"``: supervised pretraining is chaotic, and float rounding that
differs between CPUs (or XLA versions) gives another base policy, with another study
answer; a shipped file gives every machine the same one.
"""

import json
import os
import shutil
import sys

from absl import flags, logging

from experiments import cli, configs

_CONFIG = cli.define_config(
    "config", configs.path("grpo_cpu.py"), "Run config file.", lock_config=False
)
_FORCE = flags.DEFINE_bool("force", False, "Retrain even when a cached base policy exists.")
_EXPORT = flags.DEFINE_string(
    "export", None, "Also write the base policy here (.npz) with its record (.json) beside it."
)


def main(argv):
    del argv
    from rl_batch import artifacts, provenance
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import pretrain

    logging.set_verbosity(logging.WARNING)

    config = _CONFIG.value
    config.init.source = "pretrain"  # (this job trains one, whatever the runs start from)
    spec = config_lib.resolve(config)  # a bad value is one line (cli.run) before training
    directory = pretrain.cache_dir(spec)
    if _FORCE.value and os.path.isdir(directory):
        shutil.rmtree(directory)
    params = pretrain.base_params(spec)
    with open(os.path.join(directory, "info.json")) as f:
        info = json.load(f)
    if _EXPORT.value:
        pretrain.write_params_file(_EXPORT.value, params)
        record = dict(
            info,
            command=" ".join(["python -m experiments.pretrain", *sys.argv[1:]]),
            hardware=provenance.hardware(),
            git=provenance.git_state(),
            software=provenance.software(),
            written=provenance.now(),
        )
        artifacts.write_json_atomic(os.path.splitext(_EXPORT.value)[0] + ".json", record)
        print(f"wrote {_EXPORT.value}")
    print(
        f"base policy {info['key']}: greedy accuracy {info['val_greedy_accuracy']:.3f}, "
        f"mean@4 {info['val_mean_at_4']:.3f} on {info['val_prompts']} validation prompts, "
        f"{info['steps']} steps in {info['wall_s']:.0f}s -> {directory}"
    )


if __name__ == "__main__":
    cli.run(main)
