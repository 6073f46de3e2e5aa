"""Critical training batch and the gradient-norm trend against batch.

Critical training batch: within a *family* (one algorithm, one group size, one LR rule,
``sqrt`` by default), walk up the batches from the family's reference; the critical batch
is the largest batch before the first one whose sample cost ``r_N`` exceeds ``1 + tol``
(or that does not reach the target): where the learning curves against cumulative
responses leave the reference family. The interval uses the bootstrap bounds of r_N: the
conservative end walks with r_N's upper bound, the optimistic end with its lower bound.
A walk that meets an r_N without an interval (fewer than two seeds on either side) has
no bound to walk with, so that end is unavailable (``None``), never the point estimate.

Gradient-norm trend: each run's mean ``grad_norm`` (and ``critic_grad_norm``) over the
same training window of responses, averaged over seeds, against batch on log-log axes.
Under the gradient-noise model ``E|g_B|^2 = |G|^2 + tr(Sigma)/B`` the local log-log slope
of the norm is ``-0.5 (B_noise/B) / (1 + B_noise/B)``: about -0.5 while noise dominates,
flattening to 0 past ``B_noise = tr(Sigma)/|G|^2``. With ``slow_frac = 0.5`` the first
segment whose slope is under half the first segment's marks where the decline slows
(close to ``B_noise`` when the first segment is noise dominated); ``knee_batch`` fits
``norm^2 = g2 + s/B`` by least squares and reports ``s/g2``. Grad norms are measured
along different trajectories, so this is a diagnostic, not a proof (as in the study).
The default window is the shortest *finished* run of the family: a seed still running
(kept by ``run_is_usable`` so its configuration reads "incomplete") must not shrink the
window of every other run. Runs that stop short of the window (a running seed with few
updates) are left out of the trend and listed in ``GradNormTrend.left_out``; a batch
whose runs all stop short drops out of the trend.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import numpy as np

from rl_batch.analysis.curves import RunData
from rl_batch.analysis.time_to_target import Analysis, Estimate
from rl_batch.artifacts import Configuration

DEFAULT_TOL = 0.2


def family_keys(
    keys: Sequence[Configuration],
    group_size: int | None = None,
    lr_rule: str = "sqrt",
    algo: str | None = None,
    reference: Configuration | None = None,
) -> list[Configuration]:
    """Configurations of one family, sorted by batch.

    Args:
      keys: candidate configurations.
      group_size: the family's group size; ``None`` uses the reference's when it has
        ``lr_rule``, else the most common group size among ``lr_rule`` configurations.
      lr_rule: the LR rule of the family.
      algo: the algorithm; ``None`` uses the reference's (or the most common).
      reference: the analysis reference configuration.

    Returns:
      The family's configurations in increasing batch (one per batch).
    """
    # One PPO critic setting and variant per family: the reference's (none without one).
    critic = reference.critic if reference is not None else ""
    variant = reference.variant if reference is not None else ""
    pool = [k for k in keys if k.lr_rule == lr_rule and (k.critic, k.variant) == (critic, variant)]
    if not pool:
        return []
    if algo is None:
        algo = (
            reference.algo
            if reference is not None
            else Counter(k.algo for k in pool).most_common(1)[0][0]
        )
    pool = [k for k in pool if k.algo == algo]
    if group_size is None:
        if reference is not None and reference in pool:
            group_size = reference.group_size
        elif pool:
            group_size = Counter(k.group_size for k in pool).most_common(1)[0][0]
    fam = sorted((k for k in pool if k.group_size == group_size), key=lambda k: k.batch)
    return fam


@dataclasses.dataclass(frozen=True)
class CriticalTrainingBatch:
    """The edge of batch-size invariance in one family.

    Attributes:
      family: the family's configurations, by batch.
      reference: the family reference (the analysis reference when in the family, else
        the family's smallest batch); r_N is measured against it.
      tol: tolerance on r_N (inside the family while ``r_N <= 1 + tol``).
      r_n: r_N per family configuration (``None``: not reached).
      critical_batch: largest batch before the first that leaves the family.
      critical_batch_lo: the same walk with r_N's upper bootstrap bound (conservative);
        ``None`` when the walk meets an r_N without an interval.
      critical_batch_hi: the same walk with r_N's lower bootstrap bound (optimistic);
        ``None`` likewise.
      first_outside: the first batch that leaves the family (``None``: none does).
      r_n_at_critical: r_N at the critical batch.
      first_outside_incomplete: the first batch outside has no r_N only because some of
        its (or the reference's) seeds are still running: it may yet turn out inside.
    """

    family: tuple[Configuration, ...]
    reference: Configuration
    tol: float
    r_n: tuple[Estimate | None, ...]
    critical_batch: int
    critical_batch_lo: int | None
    critical_batch_hi: int | None
    first_outside: int | None
    r_n_at_critical: Estimate | None
    first_outside_incomplete: bool = False

    @property
    def has_interval(self) -> bool:
        """Whether both ends of the CI walk are available."""
        return self.critical_batch_lo is not None and self.critical_batch_hi is not None

    @property
    def decided(self) -> bool:
        """Whether both ends of the CI walk land on the means' critical batch (else the
        report and the figures say "undecided at this power")."""
        return self.critical_batch_lo == self.critical_batch_hi == self.critical_batch

    def describe(self) -> str:
        """The critical batch as the report and the figures name it: ``64 [64, 64]``,
        ``undecided (64 by the means; CI walk [64, 128])``, ``at least 64 (B = 128
        incomplete)``."""
        if self.first_outside_incomplete:
            return f"at least {self.critical_batch} (B = {self.first_outside} incomplete)"
        walk = (
            f"CI walk [{self.critical_batch_lo}, {self.critical_batch_hi}]"
            if self.has_interval
            else "no CI walk: an r_N without interval"
        )
        if self.decided:
            return f"{self.critical_batch} ({walk})"
        return f"undecided ({self.critical_batch} by the means; {walk})"


def _walk(r_vals: Sequence[float | None], start: int, tol: float):
    """(index of the last config before the first stop, index of that stop or None) from
    start; the walk stops at an r that is None, not finite, or > 1 + tol."""
    last = start
    for i in range(start + 1, len(r_vals)):
        r = r_vals[i]
        if r is None or not np.isfinite(r) or r > 1.0 + tol:
            return last, i
        last = i
    return last, None


def _walk_bound(r_n: Sequence[Estimate | None], bound: str, start: int, tol: float) -> int | None:
    """``_walk`` on r_N's ``lo`` or ``hi``; ``None`` if it meets an r_N without interval."""
    # An r_N without interval reads NaN, where ``_walk`` stops too.
    vals = [
        None if e is None else (getattr(e, bound) if e.has_interval else float("nan")) for e in r_n
    ]
    last, stop = _walk(vals, start, tol)
    if stop is not None and r_n[stop] is not None and not r_n[stop].has_interval:
        return None  # No bound to compare: this end of the interval is unknown.
    return last


def critical_training_batch(
    analysis: Analysis,
    tol: float = DEFAULT_TOL,
    group_size: int | None = None,
    lr_rule: str = "sqrt",
) -> CriticalTrainingBatch | None:
    """Largest batch whose sample cost stays within ``1 + tol`` of the family reference.

    Args:
      analysis: the sweep analysis.
      tol: tolerance on r_N (default 0.2).
      group_size: family group size (default: the reference's, see ``family_keys``).
      lr_rule: family LR rule (default ``sqrt``).

    Returns:
      The critical training batch, or ``None`` when the family has fewer than two
      batches or its reference does not reach the target (every seed).
    """
    fam = family_keys(list(analysis.stats), group_size, lr_rule, reference=analysis.reference)
    if len(fam) < 2:
        return None
    ref = analysis.reference if analysis.reference in fam else fam[0]
    if not analysis.stats[ref].reached:
        return None
    ratios = analysis.ratios if ref == analysis.reference else analysis.ratios_against(ref)
    r_n = [ratios[k].r_n for k in fam]
    start = fam.index(ref)
    mean = [None if e is None else e.mean for e in r_n]
    i_mid, i_out = _walk(mean, start, tol)
    i_lo = _walk_bound(r_n, "hi", start, tol)
    i_hi = _walk_bound(r_n, "lo", start, tol)
    return CriticalTrainingBatch(
        family=tuple(fam),
        reference=ref,
        tol=tol,
        r_n=tuple(r_n),
        critical_batch=fam[i_mid].batch,
        critical_batch_lo=None if i_lo is None else fam[i_lo].batch,
        critical_batch_hi=None if i_hi is None else fam[i_hi].batch,
        first_outside=None if i_out is None else fam[i_out].batch,
        r_n_at_critical=r_n[i_mid],
        first_outside_incomplete=(
            i_out is not None and r_n[i_out] is None and analysis.stats[fam[i_out]].incomplete
        ),
    )


def run_mean_field(run: RunData, field: str, window_responses: float | None = None) -> float | None:
    """Mean of an update-line field over the run's first ``window_responses`` responses."""
    if not run.has_field(field):
        return None
    v = run.field(field)
    if window_responses is not None:
        v = v[run.responses <= window_responses]
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else None


@dataclasses.dataclass(frozen=True)
class GradNormTrend:
    """Mean gradient norm against batch (log-log) in one family.

    Attributes:
      field: the update-line field (``grad_norm`` or ``critic_grad_norm``).
      batches: [K] batches with data.
      norms: [K] seed-mean gradient norm in the window.
      window_responses: the common window (responses) the norms are averaged over.
      slope: least-squares slope of log(norm) on log(batch).
      segment_slopes: [K-1] slopes between consecutive batches.
      slowdown_segment: (B_i, B_i+1) of the first segment flatter than ``slow_frac`` of
        the first segment's slope (``None``: the decline never slows, or never starts).
      knee_batch: ``s/g2`` from fitting ``norm^2 = g2 + s/B`` (``None`` unless g2, s > 0).
      left_out: names of the runs left out because they stop short of the window
        (e.g. seeds still running), in family order.
    """

    field: str
    batches: np.ndarray
    norms: np.ndarray
    window_responses: float
    slope: float
    segment_slopes: np.ndarray
    slowdown_segment: tuple[int, int] | None
    knee_batch: float | None
    left_out: tuple[str, ...] = ()


def trend_from_norms(
    batches: Sequence[float], norms: Sequence[float], slow_frac: float = 0.5
) -> tuple[float, np.ndarray, int | None, float | None]:
    """Log-log slope, segment slopes, slowdown segment index and knee of a norm trend.

    Args:
      batches: [K] increasing batches.
      norms: [K] positive gradient norms.
      slow_frac: a segment is "slow" when its slope is flatter than ``slow_frac`` times
        the first segment's (negative) slope.

    Returns:
      (slope, segment_slopes [K-1], index of the first slow segment or None, knee or None).
    """
    b = np.asarray(batches, dtype=np.float64)
    g = np.asarray(norms, dtype=np.float64)
    lb, lg = np.log(b), np.log(g)
    slope = float(np.polyfit(lb, lg, 1)[0]) if b.size >= 2 else float("nan")
    seg = np.diff(lg) / np.diff(lb)
    slow = None
    if seg.size >= 2 and seg[0] < 0:
        for i in range(1, seg.size):
            if seg[i] > slow_frac * seg[0]:  # Both negative: flatter than slow_frac x first.
                slow = i
                break
    # norm^2 = g2 + s / B is linear in 1/B.
    knee = None
    if b.size >= 2:
        s, g2 = np.polyfit(1.0 / b, g**2, 1)
        if g2 > 0 and s > 0:
            knee = float(s / g2)
    return slope, seg, slow, knee


def grad_norm_trend(
    analysis: Analysis,
    field: str = "grad_norm",
    group_size: int | None = None,
    lr_rule: str = "sqrt",
    window_responses: float | None = None,
    slow_frac: float = 0.5,
) -> GradNormTrend | None:
    """Gradient norm against batch in one family (see the module docstring).

    Args:
      analysis: the sweep analysis.
      field: ``grad_norm`` (actor) or ``critic_grad_norm``.
      group_size, lr_rule: the family (see ``family_keys``).
      window_responses: responses window for the per-run mean; ``None`` uses the
        shortest finished run of the family (the common runway; the shortest run of
        any status when none has finished).
      slow_frac: see ``trend_from_norms``.

    Returns:
      The trend, or ``None`` when fewer than two batches carry ``field``. Runs whose
      ``final_responses`` fall short of the window (seeds still running, say) are left
      out and named in ``left_out``.
    """
    fam = family_keys(list(analysis.stats), group_size, lr_rule, reference=analysis.reference)
    runs = {k: [r for r in analysis.runs_by_key[k] if r.has_field(field)] for k in fam}
    runs = {k: rs for k, rs in runs.items() if rs}
    if len(runs) < 2:
        return None
    if window_responses is None:
        every = [r for rs in runs.values() for r in rs]
        finished = [r for r in every if analysis.targets[r.name].finished]
        window_responses = min(r.final_responses for r in (finished or every))
    kept: dict[Configuration, list[RunData]] = {}
    left_out: list[str] = []
    for k, rs in runs.items():
        for r in rs:
            if r.final_responses >= window_responses:
                kept.setdefault(k, []).append(r)
            else:
                left_out.append(r.name)
    batches, norms = [], []
    for k, rs in kept.items():
        vals = [run_mean_field(r, field, window_responses) for r in rs]
        vals = [v for v in vals if v is not None and v > 0]
        if vals:
            batches.append(k.batch)
            norms.append(float(np.mean(vals)))
    if len(batches) < 2:
        return None
    slope, seg, slow, knee = trend_from_norms(batches, norms, slow_frac)
    return GradNormTrend(
        field=field,
        batches=np.asarray(batches, dtype=np.float64),
        norms=np.asarray(norms),
        window_responses=float(window_responses),
        slope=slope,
        segment_slopes=seg,
        slowdown_segment=None if slow is None else (batches[slow], batches[slow + 1]),
        knee_batch=knee,
        left_out=tuple(left_out),
    )
