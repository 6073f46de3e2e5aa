"""The gradient noise scale's estimator (McCandlish et al. 2018, appendix A), shared by
the run (a batch schedule grows the batch on it: `rl_batch.runs.batch_schedule`) and the
analysis (`rl_batch.analysis.noise_scale`, which pools it over updates and runs).

Plain arithmetic: works on Python floats, numpy arrays and ``jax.numpy`` arrays.
"""

from __future__ import annotations

from typing import Any


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
