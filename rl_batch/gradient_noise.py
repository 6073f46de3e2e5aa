"""The gradient noise scale's estimator (McCandlish et al. 2018, appendix A), shared by
the run (a batch schedule grows the batch on it: `rl_batch.runs.batch_schedule`) and the
analysis (`rl_batch.analysis.noise_scale`, which pools it over updates and runs).

Plain arithmetic: works on Python floats, numpy arrays and ``jax.numpy`` arrays; the
interval of a pooled noise scale (`pooled_ratio_interval`) on numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np


def noise_scale_terms(sq_small: Any, sq_big: Any, b_small: Any, b_big: Any) -> tuple[Any, Any]:
    """Unbiased ``(|G|^2, tr(Sigma))`` from squared mean-gradient norms at two batch sizes.

    Plain arithmetic on the inputs, so it works on Python floats, numpy arrays, and
    ``jax.numpy`` arrays inside a jitted update step (this module never imports JAX).

    Args:
      sq_small: ``|g_b|^2``, squared norm of the mean gradient over ``b_small`` examples.
      sq_big: ``|g_B|^2`` over ``b_big`` examples (``b_big > b_small``).
      b_small: the small batch size b.
      b_big: the big batch size B.

    Returns:
      ``(g2, trace_sigma)`` estimates (either can be negative at a single step).
    """
    g2 = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    trace_sigma = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return g2, trace_sigma


def simple_noise_scale(sq_small: Any, sq_big: Any, b_small: Any, b_big: Any) -> Any:
    """Single-step ``B_simple = tr(Sigma) / |G|^2`` (array-generic; noisy, unsmoothed)."""
    g2, trace_sigma = noise_scale_terms(sq_small, sq_big, b_small, b_big)
    return trace_sigma / g2


def pooled_ratio_interval(
    num: Sequence[float], den: Sequence[float], z: float
) -> tuple[float, float, float]:
    """``mean(num) / mean(den)`` and its Fieller interval, restricted to ratios >= 0.

    For a noise scale pooled over n updates: ``num`` the per-update traces, ``den`` the
    per-update ``|G|^2`` (each unbiased, noisy, paired by update, treated as independent
    draws). Fieller's set is every R >= 0 that the pooled means do not reject at ``z``:
    ``(m_num - R m_den)^2 <= z^2 (v_nn - 2 R v_nd + R^2 v_dd) / n``, with the sample
    (co)variances v. Unlike the delta method it stays honest when ``m_den`` is near 0:
    the set is then unbounded above (a large noise scale is not excluded) with a finite
    lower end, instead of an infinite estimate.

    Args:
      num, den: per-update numerator and denominator terms (n >= 2 of each).
      z: the normal quantile (1.96: two-sided 95 %; 1.645: one-sided 95 % lower end).

    Returns:
      ``(estimate, lo, hi)``: estimate NaN when ``mean(den) <= 0``; ``hi`` may be inf;
      ``lo == hi == 0`` when every R >= 0 is rejected (a trace significantly < 0).
    """
    x = np.asarray(num, dtype=float)
    y = np.asarray(den, dtype=float)
    n = len(x)
    if n < 2 or len(y) != n:
        raise ValueError(f"pooled_ratio_interval: need n >= 2 paired terms, got {n}, {len(y)}")
    mx, my = float(x.mean()), float(y.mean())
    cov = np.cov(x, y)  # (ddof 1)
    k = z * z / n
    a = my * my - k * cov[1, 1]
    b = -2.0 * (mx * my - k * cov[0, 1])
    c = mx * mx - k * cov[0, 0]
    estimate = mx / my if my > 0 else math.nan
    lo, hi = _nonnegative_quadratic_set(a, b, c)
    return estimate, lo, hi


def _nonnegative_quadratic_set(a: float, b: float, c: float) -> tuple[float, float]:
    """The hull ``(lo, hi)`` of ``{R >= 0: a R^2 + b R + c <= 0}`` (``(0, 0)`` if empty)."""
    if a == 0.0:
        if b == 0.0:
            return (0.0, math.inf) if c <= 0 else (0.0, 0.0)
        root = -c / b
        if b < 0:  # R >= root
            return max(root, 0.0), math.inf
        return (0.0, root) if root >= 0 else (0.0, 0.0)
    disc = b * b - 4.0 * a * c
    if a > 0:  # between the roots
        if disc < 0:
            return 0.0, 0.0
        r1 = (-b - math.sqrt(disc)) / (2.0 * a)
        r2 = (-b + math.sqrt(disc)) / (2.0 * a)
        return (max(r1, 0.0), r2) if r2 >= 0 else (0.0, 0.0)
    # a < 0: outside the roots (everywhere when there are none).
    if disc <= 0:
        return 0.0, math.inf
    r1 = (-b + math.sqrt(disc)) / (2.0 * a)  # (a < 0: this is the smaller root)
    r2 = (-b - math.sqrt(disc)) / (2.0 * a)
    return (0.0, math.inf) if r1 >= 0 else (max(r2, 0.0), math.inf)
