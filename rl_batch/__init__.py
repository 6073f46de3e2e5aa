"""rl_batch: which batch size reaches a target model quality in the least wall time?

Subpackages in data-flow order; imports point down this list only (``analysis`` reads
run artifacts and imports none of the JAX layers):

- ``models``: the transformer (dense and MoE), its sharding rules, log-prob heads, FLOP
  counts and Hugging Face checkpoint interop.
- ``tasks``: verifiable-reward tasks, their data and rewards.
- ``rollout``: the KV-cache sampler and the rollouts built on it (groups of responses,
  rewards, filtering, async and partial rollout).
- ``algorithms``: the RL maths (``losses``), the update skeleton
  (``policy_loss``, ``update_step``, ...; ``learner`` maps them), GRPO,
  PPO and the batch-size scaling rules of the optimizer (``lr_rules``).
- ``runs``: one training run: its resolved spec, loop, accounting, checkpoints,
  tracking, warm start and export.
- ``sweeps``: a grid of runs, their workers and calibrated throughput.
- ``analysis``: time to target, critical batches, findings, planner, figures, report.

Top-level modules are the shared base, imported by every layer: ``artifacts`` (the run
and sweep directory contract), ``targets`` (the definition of N*, q and T),
``provenance``, ``tokenizers``, ``distributed``, ``locks``, ``gradient_noise`` (the
noise-scale estimator that a batch schedule and the analysis share) and ``bench`` (the
benchmark harness: timed rounds, host load, medians, tables).
"""
