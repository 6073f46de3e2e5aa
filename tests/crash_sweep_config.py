"""A two-point sweep of the tiny run, killed and resumed by ``tests/test_crash.py``.

Both points have B = P x G = 16 = batch_ref, where the sqrt rule and the fixed rule give
the same LR: the two runs compute the same thing under different names, so the point
that is killed and resumed can be compared with the one that ran uninterrupted.

  python -m experiments.grpo_sweep --config=tests/crash_sweep_config.py \
      --config.work_dir=DIR --sweep_dir=DIR --analyze=false
"""

from experiments.configs import base
from tests.run_fixtures import tiny_run_config


def get_config(arg=None):
    del arg
    c = base.sweep_config(tiny_run_config(work_dir="./workdir"))
    c.budget_responses = 320  # 20 updates: time to kill the second point mid-run
    c.eval_every_responses = 128
    c.eval_greedy = False
    c.sweep.prompts = "4"
    c.sweep.group_sizes = "4"
    c.sweep.lr_rules = "sqrt,fixed"
    return c
