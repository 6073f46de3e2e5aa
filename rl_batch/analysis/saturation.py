"""A second estimator near the plateau: each curve's ceiling and midpoint (ScaleRL's form).

N* at a target where the curves flatten mixes speed with ceiling: a configuration that
rises as fast but saturates a little lower needs many more responses to cross. Beside the
band estimator (``time_to_target``), each run's validation curve is fitted with the
saturating form of ScaleRL (Khatri et al. 2025, arXiv 2510.13786), in responses C:

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

``A`` is the ceiling (the asymptote), ``C_mid`` the responses at which half of the rise
from ``R0`` to ``A`` is done, ``B`` the steepness (in log C). ``R0`` is the run's first
evaluation when it is at C = 0 (the policy before training), else a free parameter.

The fit is a robust least squares (``scipy.optimize.least_squares``, soft-L1 loss with
scale ``F_SCALE``, so one noisy evaluation does not move it) over ``(A, log C_mid,
log B)`` from a few starts, ``R0 <= A <= a_max`` (1 for an accuracy). A curve that
stops early leaves ``A`` an extrapolation: ``reach`` is the share of the fitted rise
``A - R0`` its last evaluation covers, and only fits with ``reach >= MIN_REACH`` count
for the ceilings (a run stopped at a target below the plateau does not show its ceiling).

Per configuration: ``A`` (mean over seeds, t interval) and ``C_mid`` (geometric mean, t
interval on its log). Verdict on "larger batches change the ceiling" (ScaleRL reports
that batch size moves the asymptote): in the sqrt family, each batch's ``A / A_ref``
(seeds paired where the runs are matched, as for r_N) against ``[1 / (1 + tol), 1 + tol]``
with ``tol = DEFAULT_CEILING_TOL``: *holds* when some batch's interval lies outside it,
*does not hold* when every batch's interval lies inside it, else *undecided at this power*.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy import optimize

from rl_batch.analysis import critical_batch, intervals
from rl_batch.analysis.curves import RunData
from rl_batch.analysis.findings import FAILS, HOLDS, NOT_MEASURED, UNDECIDED, Finding
from rl_batch.analysis.time_to_target import (
    Analysis,
    Estimate,
    by_seed,
    exact_one,
    fmt_estimate,
    markdown_table,
    matched_pair,
    ratio_estimate,
)
from rl_batch.artifacts import Configuration

F_SCALE = 0.01  # soft-L1 scale: residuals beyond ~0.01 accuracy count linearly, not squared
MIN_REACH = 0.8  # a fit counts for the ceiling when its data cover this share of the rise
DEFAULT_CEILING_TOL = 0.02  # A / A_ref within [1/1.02, 1.02]: "the same ceiling"
B_BOUNDS = (0.2, 10.0)


@dataclasses.dataclass(frozen=True)
class SigmoidFit:
    """``R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)`` fitted to one curve.

    Attributes:
      A: the ceiling.
      c_mid: responses at half of the rise.
      B: steepness in log responses.
      R0: the value at C = 0.
      rmse: root mean square residual of the fitted points.
      c_last: responses at the last evaluation.
    """

    A: float  # noqa: N815
    c_mid: float
    B: float  # noqa: N815
    R0: float  # noqa: N815
    rmse: float
    c_last: float

    def predict(self, c) -> np.ndarray:
        """R at responses ``c`` (R0 at 0)."""
        c = np.asarray(c, dtype=np.float64)
        safe = np.where(c > 0, c, 1.0)
        frac = np.where(c > 0, 1.0 / (1.0 + (self.c_mid / safe) ** self.B), 0.0)
        return self.R0 + (self.A - self.R0) * frac

    @property
    def reach(self) -> float:
        """The share of the rise ``A - R0`` done at the last evaluation (by the fit)."""
        return float(1.0 / (1.0 + (self.c_mid / self.c_last) ** self.B))


def fit_sigmoid(c: Sequence[float], acc: Sequence[float], a_max: float = 1.0) -> SigmoidFit | None:
    """Robust least-squares fit of ScaleRL's saturating form to one curve.

    Args:
      c: [E] retained responses at the evaluations (increasing).
      acc: [E] validation accuracy at each.
      a_max: upper bound of the ceiling (1 for an accuracy).

    Returns:
      The fit, or ``None`` with fewer than 3 evaluations at C > 0 (4 when R0 is free),
      or a curve that does not rise.
    """
    c = np.asarray(c, dtype=np.float64)
    acc = np.asarray(acc, dtype=np.float64)
    ok = np.isfinite(c) & np.isfinite(acc)
    c, acc = c[ok], acc[ok]
    r0_fixed = c.size > 0 and c[0] == 0.0
    r0 = float(acc[0]) if r0_fixed else None
    pos = c > 0
    cp, ap = c[pos], acc[pos]
    if cp.size < (3 if r0_fixed else 4) or float(ap.max()) <= float(acc.min()):
        return None
    lo_r0 = float(acc.min()) - 0.5 * float(np.ptp(acc)) if not r0_fixed else r0

    def unpack(x):
        a, log_mid, log_b = x[:3]
        return a, float(np.exp(log_mid)), float(np.exp(log_b)), (r0 if r0_fixed else x[3])

    def residual(x):
        a, mid, b, rr = unpack(x)
        return rr + (a - rr) / (1.0 + (mid / cp) ** b) - ap

    top = float(ap.max())
    lower = [r0 if r0_fixed else float(acc.min()), np.log(cp.min() / 100.0), np.log(B_BOUNDS[0])]
    upper = [a_max, np.log(cp.max() * 100.0), np.log(B_BOUNDS[1])]
    start_r0 = r0 if r0_fixed else float(ap[0])
    half = start_r0 + 0.5 * (top - start_r0)
    mid0 = float(cp[np.argmax(ap >= half)])
    if not r0_fixed:
        lower.append(lo_r0)
        upper.append(top)
    best = None
    a0 = min(top + 0.1 * (top - start_r0) + 1e-6, a_max)
    for b0 in (0.7, 1.5, 3.0):  # three starts in steepness (~20 ms each)
        x0 = [a0, np.log(mid0), np.log(b0)] + ([] if r0_fixed else [start_r0])
        x0 = np.clip(x0, np.array(lower) + 1e-9, np.array(upper) - 1e-9)
        res = optimize.least_squares(
            residual, x0, bounds=(lower, upper), loss="soft_l1", f_scale=F_SCALE
        )
        if best is None or res.cost < best.cost:
            best = res
    a, mid, b, rr = unpack(best.x)
    rmse = float(np.sqrt(np.mean(residual(best.x) ** 2)))
    return SigmoidFit(float(a), mid, b, float(rr), rmse, float(cp.max()))


@dataclasses.dataclass(frozen=True)
class ConfigCeiling:
    """One configuration's fitted ceilings over its seeds.

    Attributes:
      key: the configuration.
      fits: seed -> fit (``None``: no fit), in seed order.
      A: mean ceiling over the seeds whose fit reaches `MIN_REACH` (``None``: none).
      c_mid: geometric-mean midpoint over the same seeds, t interval on its log.
      reach: mean reach over the fitted seeds.
      n_used: seeds whose fit counts.
    """

    key: Configuration
    fits: dict[int | None, SigmoidFit | None]
    A: Estimate | None  # noqa: N815
    c_mid: Estimate | None
    reach: float | None
    n_used: int

    def used(self) -> dict[int | None, SigmoidFit]:
        """Seed -> fit, for the fits that count (``reach >= MIN_REACH``)."""
        return {s: f for s, f in self.fits.items() if f is not None and f.reach >= MIN_REACH}


def _t_estimate(values: Sequence[float], level: float, log: bool = False) -> Estimate:
    v = np.log(values) if log else np.asarray(values, dtype=np.float64)
    m, lo, hi = intervals.t_mean(v, level)
    if log:
        m, lo, hi = float(np.exp(m)), float(np.exp(lo)), float(np.exp(hi))
    return Estimate(m, lo, hi, len(values))


def config_ceiling(key: Configuration, runs: Sequence[RunData], level: float) -> ConfigCeiling:
    """Fits each seed's curve and summarises the configuration (see the module docstring)."""
    fits = {r.seed: fit_sigmoid(r.eval_responses, r.eval_accuracy) for r in runs}
    fitted = [f for f in fits.values() if f is not None]
    reach = float(np.mean([f.reach for f in fitted])) if fitted else None
    used = [f for f in fitted if f.reach >= MIN_REACH]
    a = _t_estimate([f.A for f in used], level) if used else None
    mid = _t_estimate([f.c_mid for f in used], level, log=True) if used else None
    return ConfigCeiling(key, fits, a, mid, reach, len(used))


def ceilings(analysis: Analysis) -> dict[Configuration, ConfigCeiling]:
    """Every configuration's fitted ceilings (`config_ceiling`), in the analysis' order."""
    return {k: config_ceiling(k, runs, analysis.level) for k, runs in analysis.runs_by_key.items()}


def ceiling_ratio(
    analysis: Analysis, cc: ConfigCeiling, ref: ConfigCeiling, level: float | None = None
) -> Estimate | None:
    """``A / A_ref`` over the seeds whose fits count on both sides where the runs are a
    matched pair (`time_to_target.matched_pair`; then seed by seed), else over each side's
    own seeds (``None`` when a side has none); its interval at ``level`` (default the
    analysis')."""
    if cc.key == ref.key:
        return exact_one(cc.n_used) if cc.n_used else None
    mine, theirs = cc.used(), ref.used()
    if not mine or not theirs:
        return None
    t_a = by_seed([analysis.targets[r.name] for r in analysis.runs_by_key[cc.key]])
    t_r = by_seed([analysis.targets[r.name] for r in analysis.runs_by_key[ref.key]])
    common = sorted(set(mine) & set(theirs), key=lambda s: (s is None, s or 0))
    paired = matched_pair(t_a, t_r) and None not in common and len(common) >= 2
    if paired:
        a = [mine[s].A for s in common]
        r = [theirs[s].A for s in common]
    else:
        a, r = [f.A for f in mine.values()], [f.A for f in theirs.values()]
    level = analysis.level if level is None else level
    args = (analysis.n_boot, level, analysis.seed, analysis.method)
    return ratio_estimate(a, r, [1.0], *args, paired=paired)


def ceiling_finding(
    analysis: Analysis,
    found: dict[Configuration, ConfigCeiling] | None = None,
    tol: float = DEFAULT_CEILING_TOL,
) -> Finding:
    """Whether larger batches change the ceiling A in the sqrt family (module docstring)."""
    name = "larger batches change the ceiling A"
    paper = "ScaleRL: batch size moves the asymptote of the saturating fit"
    found = found if found is not None else ceilings(analysis)
    fam = critical_batch.family_keys(list(analysis.stats), reference=analysis.reference)
    ref_key = analysis.reference if analysis.reference in fam else (fam[0] if fam else None)
    if len(fam) < 2 or ref_key is None or found[ref_key].A is None:
        return Finding(name, paper, "-", NOT_MEASURED, "no sqrt family of 2+ batches with a fit")
    ratios = {k: ceiling_ratio(analysis, found[k], found[ref_key]) for k in fam if k != ref_key}
    measured = "; ".join(
        f"B={k.batch}: {fmt_estimate(e, missing='no fit past ' + f'{MIN_REACH:.0%}')}"
        for k, e in ratios.items()
    )
    measured = f"A / A(B={ref_key.batch}): {measured}"
    band = (1.0 / (1.0 + tol), 1.0 + tol)
    decided = [(k, e) for k, e in ratios.items() if e is not None and e.has_interval]
    # "Some batch moves A" is any of K: each read at Holm's first-step level; "every batch
    # keeps A" reads each at the analysis' level.
    any_level = intervals.holm_level(analysis.level, max(len(ratios), 1))
    wide = {k: ceiling_ratio(analysis, found[k], found[ref_key], any_level) for k in ratios}
    outside = [
        k.batch
        for k, e in wide.items()
        if e is not None and e.has_interval and (e.lo > band[1] or e.hi < band[0])
    ]
    if outside:
        holm = f"; any of {len(ratios)}: read at {any_level:.2%} (Holm)" if len(ratios) > 1 else ""
        return Finding(name, paper, measured, HOLDS, f"B = {outside[0]}: interval outside "
                       f"[{band[0]:.3g}, {band[1]:.3g}]{holm}")  # fmt: skip
    inside = len(decided) == len(ratios) and all(
        band[0] <= e.lo and e.hi <= band[1] for _, e in decided
    )
    if inside:
        return Finding(name, paper, measured, FAILS, f"every interval inside [{band[0]:.3g}, "
                       f"{band[1]:.3g}]")  # fmt: skip
    why = (
        "a batch has no fit whose data reach the plateau, or no interval"
        if len(decided) < len(ratios)
        else f"an interval spans the edge of [{band[0]:.3g}, {band[1]:.3g}]"
    )
    return Finding(name, paper, measured, UNDECIDED, why)


def saturation_section(analysis: Analysis, tol: float = DEFAULT_CEILING_TOL) -> list[str]:
    """The report's section: per-configuration A, C_mid and the ceiling verdict."""
    found = ceilings(analysis)
    if not any(c.fits for c in found.values()):
        return []
    ref = found.get(analysis.reference)
    rows = []
    for k, c in found.items():
        n_fit = sum(f is not None for f in c.fits.values())
        ratio = ceiling_ratio(analysis, c, ref) if ref is not None else None
        rows.append(
            [
                k.name,
                k.batch,
                f"{c.n_used}/{n_fit}/{len(c.fits)}",
                fmt_estimate(c.A, ".3g", "-"),
                fmt_estimate(c.c_mid, ".3g", "-"),
                "-" if c.reach is None else f"{c.reach:.2f}",
                fmt_estimate(ratio, ".3g", "-"),
            ]
        )
    f = ceiling_finding(analysis, found, tol)
    out = ["## Saturating fit: ceiling and midpoint (ScaleRL form)", ""]
    out += [
        "Each run's curve fitted with R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) in "
        "retained responses (robust least squares; R0 the evaluation at C = 0). A fit "
        f"counts when its last evaluation covers >= {MIN_REACH:.0%} of the fitted rise "
        "(reach); a run stopped below its plateau leaves A an extrapolation. A: mean over "
        f"seeds, C_mid: geometric mean, {analysis.level:.0%} t intervals; A / A_ref paired "
        "by seed where the runs are matched.",
        "",
    ]
    out += markdown_table(
        ["config", "B", "seeds counted/fitted/all", "ceiling A", "midpoint C_mid (responses)",
         "mean reach", "A / A_ref"],
        rows,
    )  # fmt: skip
    out += ["", f"- {f.name}: **{f.verdict}** ({f.note}); {f.measured}", ""]
    return out
