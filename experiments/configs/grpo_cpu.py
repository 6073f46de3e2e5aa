"""The default CPU study: GRPO batch scaling on 3-digit scratchpad addition, ~1M model.

Seven runs that fit a laptop CPU in minutes: the invariance family P x 8 for P = 4 ... 64
(B = 32 ... 512 responses) under the sqrt LR rule, the fixed LR rule at 2x the
reference batch, and a group-size pair (8 x 16 against 16 x 8, both B = 128). All runs
share an 8192-response runway, validate every 512 responses (mean@4 on 128 held-out
prompts) and stop once the target, 0.5 from a warm start near 0.3, has been confirmed by
two validations. (A 0.42 target was crossed before the first validation by some warm
starts, leaving N* to a straight line from 0.)

The LR was tuned at the reference batch (8 x 8 = 64 responses): 5e-5 learns steadily
from the warm start, 1.5e-4 first knocks accuracy down (Adam's first steps move every
weight by ~lr) before recovering.
"""

from experiments.configs import base


def get_config(arg=None):
    del arg
    c = base.sweep_config(base.run_config())
    c.lr_ref, c.batch_ref = 5e-5, 64
    c.budget_responses = 8192
    c.eval_every_responses = 512
    c.target = 0.5
    c.stop_at_target = True
    c.confirm_evals = 2
    c.sweep.prompts = "4,8,16,32,64"
    c.sweep.group_sizes = "8"
    c.sweep.lr_rules = "sqrt"
    c.sweep.extra_points = "16x8:fixed,8x16:sqrt"
    c.sweep.reference = "8x8:sqrt"
    return c
