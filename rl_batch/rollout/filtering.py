"""Dynamic-sampling filter (DAPO): drop prompt groups whose rewards are all equal.

A group whose G responses all got the same reward has zero group-relative advantage, so
it contributes no policy gradient under GRPO; DAPO drops such groups (and keeps sampling
until the batch is full). Dropped responses cost generation time but are not training
samples: the protocol counts only retained responses in ``responses_cum``.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class FilterResult:
    """Which prompt groups survive, and the response counts the run loop logs.

    Attributes:
        keep_p: bool ``[P]``, True for groups with at least two distinct rewards.
        prompts_generated: ``P``.
        prompts_retained: number of kept groups.
        responses_generated: ``P * G``.
        responses_retained: ``prompts_retained * G``.
    """

    keep_p: np.ndarray
    prompts_generated: int
    prompts_retained: int
    responses_generated: int
    responses_retained: int

    @property
    def keep_fraction(self) -> float:
        """Fraction of groups kept (0.0 for an empty batch)."""
        return self.prompts_retained / self.prompts_generated if self.prompts_generated else 0.0


def dynamic_sampling_filter(rewards_pg: np.ndarray, atol: float = 0.0) -> FilterResult:
    """Marks groups whose rewards are not all equal.

    Args:
        rewards_pg: rewards ``[P, G]`` (one row per prompt, one column per response).
        atol: rewards within ``atol`` of each other count as equal (0 = exact, right for
            0/1 rewards; use a small value for continuous rewards).

    Returns:
        A `FilterResult`.

    Raises:
        ValueError: when ``rewards_pg`` is not 2-D or contains NaN.
    """
    rewards_pg = np.asarray(rewards_pg, dtype=np.float64)
    if rewards_pg.ndim != 2:
        raise ValueError(f"rewards_pg must be [P, G], got shape {rewards_pg.shape}")
    if np.isnan(rewards_pg).any():
        raise ValueError("rewards_pg contains NaN")
    p, g = rewards_pg.shape
    if g == 0:
        keep_p = np.zeros((p,), dtype=bool)
    else:
        spread_p = rewards_pg.max(axis=1) - rewards_pg.min(axis=1)  # [P]
        keep_p = spread_p > atol
    kept = int(keep_p.sum())
    return FilterResult(
        keep_p=keep_p,
        prompts_generated=p,
        prompts_retained=kept,
        responses_generated=p * g,
        responses_retained=kept * g,
    )
