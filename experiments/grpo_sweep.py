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

from experiments import cli, configs, sweep_main

sweep_main.define_flags(configs.path("grpo_cpu.py"))


def main(argv):
    """Runs the GRPO sweep (see `experiments.sweep_main.main`)."""
    sweep_main.main(argv, algo="grpo")


if __name__ == "__main__":
    cli.run(main)
