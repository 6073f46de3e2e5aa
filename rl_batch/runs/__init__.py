"""Runs: one training run, from a resolved config to a run directory.

Owns ``config`` (validation and the one resolution of a run's derived values),
``run`` (the loop: rollout -> filter -> update -> validate), ``accounting`` (counters
and each step's metrics line), ``checkpoint``, ``tracking`` (dashboards),
``programs`` (compiled programs kept across runs), ``pretrain`` (the supervised warm
start), ``export`` (a run's policy as a Hugging Face directory) and ``memory_plan``
(device memory compiled ahead of time). Imports every layer below it.
"""
