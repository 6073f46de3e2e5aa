"""The CPU schedule study: does a batch-size schedule beat the best fixed batch?

And, beside it, one batch-tied rule beyond the LR: does Adam's SDE rule keep
invariance at 2x batch better than fixed betas and eps?

The default CPU study's task, base policy, target and measurement (``grpo_cpu.py``), on
fixed batches P x 8 for P = 2 ... 16 (B = 16 ... 128, sqrt LR rule; the optimum of the
default study, B = 32, inside) and two batch-size schedules (`rl_batch.runs.batch_schedule`,
the sqrt LR rule applied at each batch they take), 12 seeds each:

- ``warmup`` (``8x8:sqrt@warmup``): P = 2 -> 4 -> 8 (B = 16 -> 64) over the first 512
  retained responses, a batch-size warm-up (Merrill et al. 2025);
- ``adaptive`` (``16x8:sqrt@adaptive``): P starts at 2 and doubles, up to 16, while the
  predicted time falls: q(2B) / q(B) > (1 + 2B / B_n) / (1 + B / B_n), q from the
  default study's calibration (``sweeps/grpo_cpu/calibration.json``: run the default
  study first) and B_n a one-sided 95 % lower bound on B_noise pooled over the updates
  at the current P, at least 8 (two whole-group micro-batches per update measure it);
- ``adam-sde`` (``16x8:sqrt@adam-sde``): at 2x the reference batch (B = 128), Adam's
  betas and eps by Malladi et al.'s SDE rule (``hparam_rules.adam = "sde"``: at k = 2,
  b1 0.9 -> 0.8, b2 0.999 -> 0.998, eps / sqrt(2)) against ``16x8:sqrt``'s fixed ones.

The report's finding "a batch schedule beats the best fixed batch" gives each schedule's
T / T(best fixed batch) with its interval, and ``figures/schedule.png`` draws them with
each seed's batch under the curves; "at 2x batch, the rule for Adam keeps invariance
better than fixed Adam" gives N*(adam-sde) / N*(fixed) paired by seed. One command::

  python -m experiments.grpo_sweep --config=experiments/configs/grpo_schedule_cpu.py \\
      --sweep_dir=sweeps/grpo_schedule_cpu

docs/cpu_study.md gives its runs (commit, machine, wall, verdicts).
"""

from experiments.configs import grpo_cpu


def get_config(arg=None):
    del arg
    c = grpo_cpu.get_config()
    c.sweep.prompts = "2,4,8,16"
    c.sweep.extra_points = "8x8:sqrt@warmup,16x8:sqrt@adaptive,16x8:sqrt@adam-sde"
    c.sweep.variants = {
        "warmup": {
            "batch_schedule": {"kind": "warmup", "start_prompts": 2, "responses": 512},
            "grpo": {"micro_batch_seqs": 0},  # a schedule takes a fixed micro-batch count
        },
        "adaptive": {
            "batch_schedule": {
                "kind": "adaptive",
                "start_prompts": 2,
                "window": 8,
                "calibration": "sweeps/grpo_cpu/calibration.json",
            },
            # Two whole-group micro-batches at every P it takes (the noise statistics).
            "grpo": {"micro_batches": 2, "micro_batch_seqs": 0, "micro_layout": "groups"},
        },
        "adam-sde": {"hparam_rules": {"adam": "sde"}},
    }
    c.sweep.calibrate_gen_probe = ""  # the generation plateau is the default study's question
    return c
