"""Algorithms: the RL maths and the pure, jitted update functions.

Owns ``losses`` (advantages, clipped policy loss, value loss, GAE, KL estimators as
small functions of arrays), the update skeleton GRPO and PPO share (``batch``,
``train_state``, ``optimizer``, ``forward``, ``policy_loss``, ``update_step`` with
micro-batches, shardings and donation, ``noise_statistics``), ``learner`` (the
``Algorithm`` protocol the run loop drives), ``grpo``, ``ppo``,
``lr_rules`` (batch-size rules for Adam's LR, betas and eps) and ``exact_eval`` (the
teacher-forced validation metric). Imports ``models``, ``rollout`` (its batch types)
and the top-level shared modules.
"""
