"""The default CPU PPO study: actor and critic batch scales of PPO, G = 1 (B = P).

The task is ``arithmetic_mix`` (3-digit additions and 3x1-digit multiplications, half
and half, with scratchpads) on the ~1M-parameter model, from the shipped base policy
``base_policies/arithmetic_mix-tiny-1m.npz``.

The protocol is the study's: G = 1, the critic (a copy of the warm-start policy with a
new value head) trains alone for the first 30 rollout batches, and the sample axis starts
when the actor starts; sqrt LR for both networks (reference B = 64: actor 5e-5, critic
1e-3). The grid: the actor family P = 32, 64, 128 and, at the reference, the critic
stepping once per 2 and per 4 rollout batches (``critic_batch_scale``; its LR resolved for
its effective batch k x B). B = 256 is left out for time; add it with
``--config.sweep.prompts=32,64,128,256``.

The study record, ``docs/ppo_study.md``, gives the runs of this config (explained
variance, N* spread, wall time) and, in its lab notes, why this task and base policy.
"""

from experiments import configs
from experiments.configs import base


def get_config(arg=None):
    del arg
    c = base.sweep_config(base.run_config())
    c.algo = "ppo"
    c.task.name = "arithmetic_mix"
    c.task.kwargs = {"scratchpad": True}
    # Every run starts from the shipped base policy (docs/ppo_study.md). The pretrain
    # settings are how it was made: its warm start ended where its exact p_ref first
    # reached 0.40, checked every 2 steps.
    c.init.source = "params"
    c.init.path = configs.base_policy("arithmetic_mix-tiny-1m")
    c.pretrain.stop_metric = "p_ref"
    c.pretrain.stop_accuracy = 0.4
    c.pretrain.eval_every = 2
    c.pretrain.seed = 1
    c.group_size = 1
    c.filter_groups = False  # a critic gives every response a baseline
    c.lr_ref, c.batch_ref = 5e-5, 64
    c.ppo.critic_lr_ref = 1e-3
    c.ppo.warmup_updates = 30
    c.budget_responses = 6144
    c.eval_every_responses = 256
    c.eval_metric = "p_ref"
    c.eval_ref_prompts = 512
    c.eval_prompts = 64
    c.eval_k = 1
    c.eval_greedy = False
    c.target = 0.465
    c.stop_at_target = True
    c.confirm_evals = 1
    c.sweep.prompts = "32,64,128"
    c.sweep.group_sizes = "1"
    c.sweep.lr_rules = "sqrt"
    c.sweep.extra_points = "64x1:sqrt:k2,64x1:sqrt:k4"
    c.sweep.reference = "64x1:sqrt"
    c.sweep.seeds = "0,1,2"
    c.sweep.concurrent = 2
    c.sweep.calibrate_rounds = 3
    return c
