"""Sweeps: a grid of runs over batch sizes and LR rules, and the throughput calibration.

Owns ``sweep`` (expand and validate the grid, run its points in worker processes, write
``sweep.json``) and ``calibrate`` (every configuration's step timed side by side).
Imports ``runs`` and the layers below it; never ``experiments`` or ``launch``.
"""
