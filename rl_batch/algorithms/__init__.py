"""Algorithms: the RL maths and the pure, jitted update functions.

Owns ``losses`` (advantages, clipped policy loss, value loss, GAE, KL estimators as
small functions of arrays), ``learner`` (the update skeleton GRPO and PPO share:
micro-batches, gradient noise terms, shardings, donation), ``grpo``, ``ppo``,
``lr_rules`` (batch-size rules for Adam's LR, betas and eps) and ``exact_eval`` (the
teacher-forced validation metric). Imports ``models``, ``rollout`` (its batch types)
and the top-level shared modules.
"""
