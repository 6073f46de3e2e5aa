"""The default CPU PPO study: batch scaling of PPO with a critic, G = 1 (B = P).

Same task, model and supervised warm start as the GRPO CPU study
(``experiments/configs/grpo_cpu.py``: 3-digit scratchpad addition, ~1M-parameter
model), so both share one cached base policy in ``work_dir``. The critic is a copy of the
warm-start policy with a new scalar value head; it trains alone for the first 5 rollout
batches (the study: 30), and the sample axis starts when the actor starts.

Four batch sizes P = 32 ... 256 under the sqrt LR rule for both networks (reference
B = 64: actor 5e-5 as in the GRPO study, critic 1e-3), a 3072-response runway validated
every 512 responses. Measured on the 2-core CPU: ~1 s per update at B = 64 (the update
-- critic forward for the values, critic and actor forward/backward -- dominates;
generation is ~0.1 s), and the critic's explained variance on fresh batches stays near 0
within such budgets (it tracks the mean reward: PPO here works with a learned mean
baseline).
"""

from experiments.configs import base


def get_config(arg=None):
    del arg
    c = base.sweep_config(base.run_config())
    c.algo = "ppo"
    c.group_size = 1
    c.filter_groups = False  # a critic gives every response a baseline
    c.lr_ref, c.batch_ref = 5e-5, 64
    c.ppo.critic_lr_ref = 1e-3
    c.ppo.warmup_updates = 5
    c.budget_responses = 3072
    c.eval_every_responses = 512
    c.target = 0.4
    c.sweep.prompts = "32,64,128,256"
    c.sweep.group_sizes = "1"
    c.sweep.lr_rules = "sqrt"
    c.sweep.reference = "64x1:sqrt"
    return c
