r"""PPO batch-size sweep, then the analysis: ``experiments.grpo_sweep`` for ``algo="ppo"``.

The same command line as ``experiments.grpo_sweep`` (``--sweep_dir``, ``--isolate``,
``--list_runs``, ``--only``, ``--analyze``, ``--config.*`` overrides) and the same exit
status (1 if a requested point failed); the default config is the CPU PPO study
``experiments/configs/ppo_cpu.py`` (output ``sweeps/ppo_cpu``).

  python -m experiments.ppo_sweep
  python -m experiments.ppo_sweep --sweep_dir=/tmp/ppo_sweep --config.sweep.prompts=32,64
  python -m experiments.ppo_sweep --list_runs
"""

from experiments import cli, configs, sweep_main

sweep_main.define_flags(configs.path("ppo_cpu.py"))


def main(argv):
    """Runs the PPO sweep (see `experiments.sweep_main.main`)."""
    sweep_main.main(argv, algo="ppo")


if __name__ == "__main__":
    cli.run(main)
