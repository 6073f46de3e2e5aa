"""Confidence intervals that stay meaningful at 3-5 seeds.

A percentile bootstrap over three seeds has about ten distinct resamples: its interval is
too narrow and jumps with the rng. The default here is Student's t:

- a mean over seeds: ``mean ± t_{n-1} s / sqrt(n)``;
- a ratio of means of two independent configurations (``r_N``, ``r_q``) or a product of
  such ratios (``T/T_ref = (N_a / N_ref) / (q_a / q_ref)``, N and q paired per run): the
  delta method on the log scale, ``log r ± t_df se``, where ``se^2`` adds the two
  configurations' variances of the log of their means (each ``w' D^-1 S D^-1 w / n``:
  ``S`` the covariance of the run's fields, ``D`` their means, ``w`` the exponents) and
  ``df`` is Welch-Satterthwaite's. The interval is ``exp`` of that: positive, asymmetric.
  A ratio that holds calibrated step times (``r_q``, ``T/T_ref``) adds the timing noise
  (`Timing`): the variance over calibration rounds of the log ratio of the two step times
  (each round times both side by side), divided by the rounds R, with R - 1 degrees of
  freedom; with rounds in blocks timed apart (before and after the runs) the spread within
  blocks, plus how far the host's relative step times moved between blocks
  (`block_drift`);
- the same ratio of two configurations run as a matched pair (`t_log_ratio_paired`): the
  two rows of one seed share their randomness (common random numbers: same prompts, same
  rollout keys), so ``S`` is the joint covariance of both configurations' fields over the
  seeds, the cross-covariance enters with its sign, and ``df = n - 1``.

With fewer than two seeds in either sample there is no interval (NaN bounds). Every
function returns ``(point, lo, hi)``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import numpy as np
from scipy import special, stats

from rl_batch.analysis import memo

NAN = float("nan")


@functools.lru_cache(maxsize=4096)
def t_quantile(df: float, level: float) -> float:
    """The two-sided Student-t quantile for coverage ``level`` at ``df`` degrees of freedom
    (kept: a report's resamples ask for the same few tens of thousands of times).

    Inside the distribution's domain this is ``scipy.special.stdtrit``, the function
    ``stats.t.ppf`` evaluates there (the same float, without its argument checks, the
    larger part of its cost); elsewhere ``stats.t.ppf`` itself."""
    q = 0.5 + level / 2.0
    if df > 0 and 0 < q < 1:
        return float(special.stdtrit(df, q))
    return float(stats.t.ppf(q, df))


def t_mean(values: Sequence[float], level: float) -> tuple[float, float, float]:
    """Mean of ``values`` with its t interval (NaN bounds with fewer than two values)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("t_mean: no values")
    mean = float(x.mean())
    if x.size < 2:
        return mean, NAN, NAN
    half = t_quantile(x.size - 1, level) * float(x.std(ddof=1)) / np.sqrt(x.size)
    return mean, mean - half, mean + half


@dataclasses.dataclass(frozen=True)
class Timing:
    """The calibration's part of a ratio that holds calibrated step times.

    Attributes:
      log_ratios: ``log(step_a / step_b)`` in each calibration round (both timed side by
        side in one round).
      blocks: each round's block: rounds timed in one sitting (``rl_batch.sweeps.calibrate``:
        one block before the runs, one after them); ``None``: all in one.
      drift: ``(variance, df)`` of one configuration's relative log step time from block to
        block (`block_drift`, over every configuration); ``None``: not estimated.
    """

    log_ratios: tuple[float, ...]
    blocks: tuple[int, ...] | None = None
    drift: tuple[float, float] | None = None

    def parts(self) -> list[tuple[float, float]]:
        """``(variance, df)`` parts of the mean log ratio: one block, ``var / R`` with
        ``R - 1`` df; several, the spread within blocks (``R - n_blocks`` df) and the drift
        of both configurations between blocks, ``2 tau^2 / n_blocks``."""
        x = np.asarray(self.log_ratios, dtype=np.float64)
        if x.size < 2:
            return []
        b = np.asarray(self.blocks if self.blocks is not None else [0] * x.size)
        labels = np.unique(b)
        if labels.size < 2:
            return [(float(x.var(ddof=1)) / x.size, x.size - 1)]
        within = sum(float(((x[b == k] - x[b == k].mean()) ** 2).sum()) for k in labels)
        out = []
        if x.size > labels.size:
            out.append((within / (x.size - labels.size) / x.size, x.size - labels.size))
        if self.drift is not None and self.drift[0] > 0:
            out.append((2 * self.drift[0] / labels.size, self.drift[1]))
        return out


def block_drift(
    rounds: dict[str, Sequence[float]], blocks: Sequence[int]
) -> tuple[float, float] | None:
    """How far one configuration's step time, relative to the others', moves between
    calibration blocks: ``(tau^2, df)`` on the log scale, or None with fewer than two
    blocks or two distinct configurations.

    ``z[k, r]`` is configuration k's log step seconds in round r less the round's mean over
    configurations (the host's overall speed cancels in every ratio); its block means vary
    by ``tau^2 (1 - 1/K)`` from the drift and by the within-block noise of a mean, which is
    subtracted: ``tau^2 = K / (K - 1) mean_k [var_b(mean z[k, b]) - s_k^2 mean_b(1 / n_b)]``,
    floored at 0, with ``(K - 1)(n_blocks - 1)`` degrees of freedom. Configurations timed as
    another (identical series) count once.

    Args:
      rounds: configuration -> step seconds per round (every series as long as ``blocks``).
      blocks: each round's block.
    """
    b = np.asarray(blocks)
    labels = np.unique(b)
    series = {tuple(float(v) for v in s) for s in rounds.values() if len(s) == b.size}
    if labels.size < 2 or len(series) < 2 or b.size <= labels.size:
        return None
    z = np.log(np.asarray(sorted(series), dtype=np.float64))  # [K, R]
    z = z - z.mean(axis=0)
    k = z.shape[0]
    means = np.stack([z[:, b == lab].mean(axis=1) for lab in labels], axis=1)  # [K, nb]
    resid = z - means[:, np.searchsorted(labels, b)]
    s2 = (resid**2).sum(axis=1) / (b.size - labels.size)  # [K] within-block variance
    noise = s2 * float(np.mean([1.0 / np.sum(b == lab) for lab in labels]))
    tau2 = max(0.0, float(np.mean(means.var(axis=1, ddof=1) - noise))) * k / (k - 1)
    return tau2, float((k - 1) * (labels.size - 1))


# Remembered by content (`memo.by_content`): a report's seed resamples ask for the same
# variances many thousand times (each interval level, each finding), in new arrays.
@memo.by_content(max_bytes=16 << 20)
def _log_mean_var(x: np.ndarray, w: np.ndarray) -> float:
    """Delta-method variance of ``sum_j w_j log mean(x[:, j])``; x is [n, d]."""
    m = x.mean(axis=0)
    g = w / m  # gradient of the log statistic with respect to the means
    cov = np.atleast_2d(np.cov(x, rowvar=False, ddof=1))
    return float(g @ cov @ g) / x.shape[0]


def t_log_ratio(
    a: np.ndarray,
    ref: np.ndarray,
    weights: Sequence[float],
    level: float,
    timing: Timing | Sequence[float] | None = None,
) -> tuple[float, float, float]:
    """``prod_j (mean a_j / mean ref_j)^w_j`` with a delta-method t interval on its log.

    Args:
      a: [n_a, d] per-seed fields of one configuration (e.g. columns N*, q).
      ref: [n_ref, d] the same fields of the reference configuration.
      weights: [d] exponents (``[1]`` for a ratio of means, ``[1, -1]`` for r_N / r_q).
      level: coverage.
      timing: for a ratio that holds calibrated step times (r_q, T/T_ref), the log ratio of
        the two configurations' step times in each calibration round (measured side by
        side; a plain sequence: one block); its parts (`Timing.parts`) are added to the
        variance. ``None``: seed noise only.

    Returns:
      (point, lo, hi); NaN bounds when a side has fewer than two seeds or a mean is not
      positive.
    """
    return _interval(*_welch_parts(a, ref, weights), level, timing)


def _welch_parts(
    a: np.ndarray, ref: np.ndarray, weights: Sequence[float]
) -> tuple[float, tuple[tuple[float, float], ...]]:
    """(point, ((variance, df), ...) of its log per independent sample; () when a side has
    fewer than two seeds or a mean is not positive)."""
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    return _welch_parts_of(a, ref, np.asarray(weights, dtype=np.float64))


@memo.by_content(max_bytes=16 << 20)
def _welch_parts_of(
    a: np.ndarray, ref: np.ndarray, w: np.ndarray
) -> tuple[float, tuple[tuple[float, float], ...]]:
    ma, mr = a.mean(axis=0), ref.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(np.prod((ma / mr) ** w))
    if min(len(a), len(ref)) < 2 or np.any(ma <= 0) or np.any(mr <= 0):
        return point, ()
    return point, ((_log_mean_var(a, w), len(a) - 1), (_log_mean_var(ref, w), len(ref) - 1))


def _interval(
    point: float,
    parts: Sequence[tuple[float, float]],
    level: float,
    timing: Timing | Sequence[float] | None = None,
) -> tuple[float, float, float]:
    """``exp(log point ± t_df sqrt(sum var))`` over independent variance parts ``(var,
    df)``, ``df`` by Welch-Satterthwaite; ``timing`` adds its parts (`Timing.parts`; a
    plain sequence of log step-time ratios, one per calibration round: ``var / R`` with
    ``R - 1`` degrees of freedom)."""
    if not parts:
        return point, NAN, NAN
    if timing is not None:
        if not isinstance(timing, Timing):
            timing = Timing(tuple(float(v) for v in timing))
        parts = [*parts, *timing.parts()]
    var = sum(v for v, _ in parts)
    if not var > 0:
        return point, point, point  # every seed identical: no spread to show
    df = var**2 / sum(v**2 / d for v, d in parts if v > 0)
    half = t_quantile(df, level) * np.sqrt(var)
    log_point = float(np.log(point))
    return point, float(np.exp(log_point - half)), float(np.exp(log_point + half))


def t_log_ratio_paired(
    a: np.ndarray,
    ref: np.ndarray,
    weights: Sequence[float],
    level: float,
    timing: Timing | Sequence[float] | None = None,
) -> tuple[float, float, float]:
    """`t_log_ratio` of two configurations whose rows are matched (row i of both ran seed i).

    The delta method on the joint [n, 2d] sample: with ``g = [w / mean a, -w / mean ref]``
    and ``S`` the [2d, 2d] covariance over the n matched rows, ``var = g' S g / n`` and the
    t quantile has ``n - 1`` degrees of freedom. A positive correlation between the two
    configurations' seeds (what common random numbers give) narrows the interval; with
    none it is about as wide as `t_log_ratio`'s (fewer degrees of freedom).

    Args:
      a: [n, d] per-seed fields of one configuration.
      ref: [n, d] the same fields of the other configuration, row i the same seed as a's.
      weights: [d] exponents.
      level: coverage.
      timing: as in `t_log_ratio`.

    Returns:
      (point, lo, hi); NaN bounds with fewer than two pairs or a non-positive mean.

    Raises:
      ValueError: the two samples have different numbers of rows.
    """
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    if a.shape != ref.shape:
        raise ValueError(f"paired ratio needs matched rows, got {a.shape} and {ref.shape}")
    point, var = _paired_parts(a, ref, np.asarray(weights, dtype=np.float64))
    if var is None:
        return point, NAN, NAN
    return _interval(point, [(var, len(a) - 1)], level, timing)


@memo.by_content(max_bytes=16 << 20)
def _paired_parts(a: np.ndarray, ref: np.ndarray, w: np.ndarray) -> tuple[float, float | None]:
    """(point, variance of its log) of `t_log_ratio_paired`; variance None with fewer than
    two pairs or a non-positive mean."""
    ma, mr = a.mean(axis=0), ref.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        point = float(np.prod((ma / mr) ** w))
    if len(a) < 2 or np.any(ma <= 0) or np.any(mr <= 0):
        return point, None
    return point, _log_mean_var(np.concatenate([a, ref], axis=1), np.concatenate([w, -w]))


def seeds_for_half_width(
    a: np.ndarray,
    ref: np.ndarray,
    weights: Sequence[float],
    half_width: float,
    level: float,
    max_seeds: int = 100,
    paired: bool = False,
) -> int | None:
    """Seeds per configuration at which `t_log_ratio`'s interval (``paired``:
    `t_log_ratio_paired`'s, rows matched by seed) would have half-width
    ``(hi - lo) / 2 <= half_width`` in ratio units.

    The per-seed variances of the log statistic (``a``, ``ref`` as in `t_log_ratio`) and
    the point ratio are assumed unchanged at ``m`` seeds on both sides; the calibration's
    timing spread is not included.

    Returns:
      The smallest ``m >= 2``; ``None`` when an interval is missing or more than
      ``max_seeds`` would be needed.
    """
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    w = np.asarray(weights, dtype=np.float64)
    point, lo, hi = (t_log_ratio_paired if paired else t_log_ratio)(a, ref, w, level)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    if paired:  # one per-seed variance of the paired log ratio, n - 1 df
        sa2 = _log_mean_var(np.concatenate([a, ref], axis=1), np.concatenate([w, -w])) * len(a)
        sr2 = 0.0
    else:
        sa2, sr2 = _log_mean_var(a, w) * len(a), _log_mean_var(ref, w) * len(ref)  # per seed
    for m in range(2, max_seeds + 1):
        var = (sa2 + sr2) / m
        if var <= 0:
            return m
        df = var**2 / (((sa2 / m) ** 2 + (sr2 / m) ** 2) / (m - 1))
        half = t_quantile(df, level) * np.sqrt(var)
        if point * np.sinh(half) <= half_width:  # (e^{+h} - e^{-h}) / 2 of the ratio
            return m
    return None


def seeds_to_separate(
    a: tuple[float, float, float, int],
    b: tuple[float, float, float, int],
    level: float,
    max_seeds: int = 100,
) -> int | None:
    """Seeds per configuration at which two t intervals of means would stop overlapping.

    Each interval is ``(mean, lo, hi, n)`` from `t_mean`; its seed spread ``s`` is read
    back from its half-width, and the same spreads and means are assumed at ``m`` seeds.

    Returns:
      The smallest ``m`` (at least the seeds already run) with
      ``t_{m-1} (s_a + s_b) / sqrt(m) < |mean_a - mean_b|``; ``None`` when the means are
      equal, an interval is missing, or more than ``max_seeds`` would be needed.
    """

    def spread(e):
        mean, lo, hi, n = e
        if n < 2 or not (np.isfinite(lo) and np.isfinite(hi)):
            return None
        return (hi - lo) / 2.0 * np.sqrt(n) / t_quantile(n - 1, level)

    sa, sb = spread(a), spread(b)
    gap = abs(a[0] - b[0])
    if sa is None or sb is None or gap == 0:
        return None
    for m in range(max(a[3], b[3], 2), max_seeds + 1):
        if t_quantile(m - 1, level) * (sa + sb) / np.sqrt(m) < gap:
            return m
    return None


def holm_level(level: float, k: int) -> float:
    """The coverage at which each of ``k`` intervals is read when a finding holds if *any*
    of them shows its effect: ``1 - (1 - level) / k``.

    At least one of ``k`` hypotheses is rejected by Holm's step-down procedure at family
    error ``1 - level`` exactly when the smallest p-value is below ``(1 - level) / k``, its
    first step; so "some interval at this level excludes the null" is Holm's (and
    Bonferroni's) decision on "any". A finding that needs *all* ``k`` (an intersection-union
    test) reads each at ``level``, unadjusted.
    """
    if k < 1:
        raise ValueError(f"holm_level: k must be >= 1, got {k}")
    return 1.0 - (1.0 - level) / k


def seeds_to_decide(
    a: np.ndarray,
    ref: np.ndarray,
    weights: Sequence[float],
    delta: float,
    alpha: float = 0.05,
    paired: bool = False,
    max_seeds: int = 100,
) -> int | None:
    """Seeds per configuration at which the ratio ``a / ref`` (as in `t_log_ratio`, or
    `t_log_ratio_paired` when ``paired``) would be decided at margin ``delta``: either
    *equivalent* (its ``1 - 2 alpha`` interval inside ``[1 - delta, 1 + delta]``, two
    one-sided tests at ``alpha``) or *different* (its ``1 - alpha`` interval excludes 1).

    The point ratio and each side's per-seed variance of the log statistic are assumed
    unchanged at ``m`` seeds; the calibration's timing spread is not included.

    Returns:
      The smallest ``m >= 2``; ``None`` when a side has fewer than two seeds (no spread to
      extrapolate) or more than ``max_seeds`` would be needed.
    """
    a = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    ref = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    w = np.asarray(weights, dtype=np.float64)
    point, _ = _welch_parts(a, ref, w)
    if min(len(a), len(ref)) < 2 or not (np.isfinite(point) and point > 0):
        return None
    if paired:
        s2 = [_log_mean_var(np.concatenate([a, ref], axis=1), np.concatenate([w, -w])) * len(a)]
    else:
        s2 = [_log_mean_var(a, w) * len(a), _log_mean_var(ref, w) * len(ref)]  # per seed
    log_p, lo_edge, hi_edge = np.log(point), np.log1p(-delta), np.log1p(delta)
    for m in range(2, max_seeds + 1):
        var = sum(s2) / m
        if var <= 0:
            return m
        df = var**2 / sum((s / m) ** 2 / (m - 1) for s in s2 if s > 0)
        se = np.sqrt(var)
        h_eq, h_diff = t_quantile(df, 1 - 2 * alpha) * se, t_quantile(df, 1 - alpha) * se
        if lo_edge <= log_p - h_eq and log_p + h_eq <= hi_edge:
            return m
        if abs(log_p) > h_diff:
            return m
    return None
