"""The default CPU study: GRPO batch scaling on 3-digit addition with a ~1M model.

Runs in minutes on a 2-core CPU. Batch sizes P x 8 for P in 4..32 under the sqrt LR
rule, the fixed-LR rule at 2x the reference batch, and a group-size pair
(8 x 16 against 16 x 8).
"""

from experiments.configs import base


def get_config(arg=None):
    del arg
    c = base.sweep_config(base.run_config())
    c.sweep.prompts = "4,8,16,32"
    c.sweep.group_sizes = "8"
    c.sweep.lr_rules = "sqrt"
    c.sweep.extra_points = "16x8:fixed,8x16:sqrt"
    c.sweep.reference = "8x8:sqrt"
    c.batch_ref = 64
    return c
