"""The study's findings (docs/design.md section 1), each measured on a sweep with a verdict.

Every finding gets our measurement, its interval, and one of `HOLDS`, `FAILS`,
`UNDECIDED` ("undecided at this power": the interval does not decide it) or
`NOT_MEASURED` (the sweep has no data for it). A verdict is only as strong as its
interval: a finding whose measurement has no interval (one seed, or one throughput
measurement) says so in its note.

- **sqrt-LR invariance**: inside the sqrt family, r_N <= 1 + tol past the reference
  (`critical_batch.critical_training_batch`); holds when even the conservative end of the
  CI walk is above the reference batch, does not hold when even the optimistic end stops
  at it.
- **Actor gradient norm falls with B** (and, for PPO, **actor and critic norms scale
  differently**): the per-seed log-log slope of the mean gradient norm against B in the
  sqrt family (seeds paired by seed number), with a t interval over seeds.
- **G x P is the batch unit**: configurations of one batch B = P x G with different G
  (same algorithm and LR rule): the ratio of their N* lies within
  ``[1 / (1 + tol), 1 + tol]``.
- **Fixed LR at 2x batch**: at twice the reference batch, the fixed-LR configuration
  needs more samples than the sqrt-LR one (N* ratio > 1, or fixed never reaches).
- **A batch-tied rule for X at 2x batch** (one finding per configuration whose variant
  sets an ``hparam_rules`` field off its default, `hparam_rule_findings`): at twice the
  reference batch, N*(rule X) / N*(fixed X) against the variant-less configuration of the
  same P, G and LR rule (paired by seed where the runs are); holds when the interval lies
  below 1 (the rule keeps invariance better), does not hold when above 1.
- **Generation throughput saturates**: the measured plateau lies inside the measured
  range of concurrency (one measurement: no interval).
- **T is U-shaped in B**: in the sqrt family, an interior batch whose T both ends exceed
  by more than ``1 + tol`` (the tolerance of invariance and of the batch unit: a U
  whose arms rise less is not one a batch choice can use; the study's arms are 1.4x and
  1.7x its minimum). Holds when, for some interior batch, both ends' T / T(interior)
  intervals lie above ``1 + tol`` (an end that never reaches counts as slower); does not
  hold when every interior batch has an end whose interval lies below ``1 + tol``.
- **Two critical batches**: which comes first, the critical generation batch or the
  critical training batch, decides the best batch; decided when their walks (the
  training batch's CI walk; the generation batch's from its tokens/s intervals,
  `generation_batch_walk`) do not meet.

N* ratios between two configurations are compared seed by seed when their runs are a
matched pair (`time_to_target.matched_pair`: common random numbers), else as
independent samples.

`cost_structure` gives the share of training time spent in generation, scoring, the
update and idle per batch, and `cost_sentence` what it implies for the hardware.

Length: over 800 lines because each finding of the study is one function here, beside
the verdict helpers they share (`_slower_than`, `_holm_words`); the findings table is
built from this one list (`study_findings`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rl_batch.analysis import critical_batch, edges, intervals
from rl_batch.analysis.cost_model import GenerationReport, fit_problems
from rl_batch.analysis.time_to_target import (
    Analysis,
    Estimate,
    by_seed,
    fmt_estimate,
    matched_pair,
    ratio_estimate,
    reanalyze,
)
from rl_batch.artifacts import Configuration

HOLDS = "holds"
FAILS = "does not hold"
UNDECIDED = "undecided at this power"
NOT_MEASURED = "not measured"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One finding of the study as measured here.

    Attributes:
      name: the finding (short).
      paper: what the study reports.
      measured: our measurement, with its interval.
      verdict: `HOLDS`, `FAILS`, `UNDECIDED` or `NOT_MEASURED`.
      note: how the verdict was decided, or why it could not be.
    """

    name: str
    paper: str
    measured: str
    verdict: str
    note: str = ""


def _family(analysis: Analysis, lr_rule: str = "sqrt") -> list[Configuration]:
    return critical_batch.family_keys(
        list(analysis.stats), lr_rule=lr_rule, reference=analysis.reference
    )


def invariance_finding(analysis: Analysis, tol: float) -> Finding:
    """sqrt-LR batch-size invariance past the reference (see the module docstring)."""
    name, paper = "sqrt-LR invariance", "curves coincide for P = 64..1024 (G = 8), then fall"
    crit = critical_batch.critical_training_batch(analysis, tol)
    if crit is None:
        return Finding(name, paper, "-", NOT_MEASURED, "no sqrt family of 2+ batches reached")
    ref = crit.reference.batch
    walk = f"[{crit.critical_batch_lo}, {crit.critical_batch_hi}]"
    measured = (
        f"r_N <= {1 + tol:g} from B = {ref} up to B = {crit.critical_batch} (CI walk {walk}); "
        f"first outside: {crit.first_outside or 'none measured'}"
    )
    if not crit.has_interval:
        return Finding(name, paper, measured, UNDECIDED, "an r_N on the walk has no interval")
    if crit.critical_batch_lo > ref:
        verdict, note = HOLDS, f"conservative walk passes B = {crit.critical_batch_lo} > {ref}"
    elif crit.critical_batch_hi == ref:
        verdict, note = FAILS, "even the optimistic walk stops at the reference"
    else:
        verdict, note = UNDECIDED, "the CI walk spans the reference"
    return Finding(name, paper, measured, verdict, note)


def _seed_slopes(analysis: Analysis, field: str) -> list[float]:
    """Per-seed log-log slope of the mean ``field`` against B in the sqrt family."""
    fam = _family(analysis)
    trend = critical_batch.grad_norm_trend(analysis, field)
    if trend is None or len(fam) < 2:
        return []
    window = trend.window_responses
    by_seed: dict[int, dict[int, float]] = {}
    for k in fam:
        for r in analysis.runs_by_key.get(k, []):
            v = critical_batch.run_mean_field(r, field, window)
            if r.seed is not None and v is not None and v > 0 and r.final_responses >= window:
                by_seed.setdefault(int(r.seed), {})[k.batch] = v
    slopes = []
    for norms in by_seed.values():
        if len(norms) >= 2:
            b = np.array(sorted(norms), dtype=np.float64)
            g = np.array([norms[int(x)] for x in b])
            slopes.append(float(np.polyfit(np.log(b), np.log(g), 1)[0]))
    return slopes


def _fmt_interval(mean: float, lo: float, hi: float, n: int) -> str:
    return Estimate(mean, lo, hi, n).fmt()


def grad_norm_findings(analysis: Analysis, level: float) -> list[Finding]:
    """Actor norm falls with B; for PPO, actor and critic norms scale differently."""
    out = []
    actor = _seed_slopes(analysis, "grad_norm")
    name, paper = "actor grad norm falls with B", "the actor gradient norm falls with B"
    if not actor:
        out.append(Finding(name, paper, "-", NOT_MEASURED, "no grad_norm at 2+ batches"))
    else:
        mean, lo, hi = intervals.t_mean(actor, level)
        measured = f"log-log slope {_fmt_interval(mean, lo, hi, len(actor))} over seeds"
        if not np.isfinite(hi):
            verdict, note = UNDECIDED, "one seed: no interval"
        else:
            verdict = HOLDS if hi < 0 else (FAILS if lo >= 0 else UNDECIDED)
            note = "slope interval below 0" if hi < 0 else "slope interval reaches 0"
        out.append(Finding(name, paper, measured, verdict, note))
    critic = _seed_slopes(analysis, "critic_grad_norm")
    name = "PPO: actor and critic norms scale differently"
    paper = "actor norm falls with B, critic norm stays flat and noisy"
    if not critic or not actor:
        return out + [Finding(name, paper, "-", NOT_MEASURED, "no PPO critic norms")]
    n = min(len(actor), len(critic))
    diff = np.asarray(actor[:n]) - np.asarray(critic[:n])
    mean, lo, hi = intervals.t_mean(diff, level)
    c_mean, c_lo, c_hi = intervals.t_mean(critic, level)
    measured = (
        f"critic slope {_fmt_interval(c_mean, c_lo, c_hi, len(critic))}; actor - critic "
        f"{_fmt_interval(mean, lo, hi, n)}"
    )
    if not np.isfinite(hi):
        return out + [Finding(name, paper, measured, UNDECIDED, "one seed: no interval")]
    verdict = HOLDS if hi < 0 else (FAILS if lo > 0 else UNDECIDED)
    return out + [Finding(name, paper, measured, verdict, "sign of actor - critic slope")]


def _n_stars(analysis: Analysis, key: Configuration) -> list[float] | None:
    s = analysis.stats[key]
    return [r.n_star for r in s.runs] if s.reached else None


def _n_star_ratio(analysis: Analysis, num: Configuration, den: Configuration) -> Estimate:
    """mean N*(num) / mean N*(den) (both reached in every seed) with the analysis' interval
    method; seed by seed when the two form a matched pair (`time_to_target.matched_pair`)."""
    a, b = analysis.stats[num].runs, analysis.stats[den].runs
    paired = matched_pair(a, b)
    if paired:
        a, b = by_seed(a), by_seed(b)
    return ratio_estimate(
        [r.n_star for r in a],
        [r.n_star for r in b],
        [1.0],
        analysis.n_boot,
        analysis.level,
        analysis.seed,
        analysis.method,
        paired=paired,
    )


def _fmt_ratio(e: Estimate) -> str:
    """The estimate, with "paired by seed" when its interval is a matched-pair one."""
    return e.fmt() + (" (paired by seed)" if e.paired else "")


def batch_unit_finding(analysis: Analysis, tol: float) -> Finding:
    """Configurations of one B = P x G with different G need the same samples."""
    name, paper = "B = P x G is the batch unit", "(128, 8) ~ (64, 16); (256, 8) ~ (128, 16)"
    keys = sorted(analysis.stats, key=lambda k: k.sort_key())
    pairs = [
        (a, b)
        for i, a in enumerate(keys)
        for b in keys[i + 1 :]
        if (a.batch, a.family) == (b.batch, b.family) and a.group_size != b.group_size
    ]
    if not pairs:
        return Finding(name, paper, "-", NOT_MEASURED, "no two G at one batch")
    band = (1.0 / (1.0 + tol), 1.0 + tol)
    parts, verdicts = [], []
    for a, b in pairs:
        na, nb = _n_stars(analysis, a), _n_stars(analysis, b)
        label = f"N*({a.prompts}x{a.group_size}) / N*({b.prompts}x{b.group_size})"
        if na is None or nb is None:
            parts.append(f"{label}: not reached")
            verdicts.append(UNDECIDED)
            continue
        e = _n_star_ratio(analysis, a, b)
        parts.append(f"{label} = {_fmt_ratio(e)}")
        verdicts.append(_band_verdict(e, tol))
    verdict = verdicts[0] if len(set(verdicts)) == 1 else UNDECIDED
    note = f"holds when the interval lies in [{band[0]:.3g}, {band[1]:.3g}]"
    return Finding(name, paper, "; ".join(parts), verdict, note)


def _band_verdict(e: Estimate, tol: float) -> str:
    """HOLDS inside [1/(1+tol), 1+tol] (the same), FAILS outside it, else UNDECIDED."""
    band = (1.0 / (1.0 + tol), 1.0 + tol)
    if not e.has_interval:
        return UNDECIDED
    if band[0] <= e.lo and e.hi <= band[1]:
        return HOLDS
    if e.lo > band[1] or e.hi < band[0]:
        return FAILS
    return UNDECIDED


def critic_variants(analysis: Analysis) -> list[Configuration]:
    """PPO configurations that differ from the reference only in the critic's settings
    (batch scale, LR rule), sorted by them."""
    ref = analysis.reference
    return sorted(
        (
            k
            for k in analysis.stats
            if k.critic != ref.critic
            and (k.algo, k.prompts, k.group_size, k.lr_rule, k.variant)
            == (ref.algo, ref.prompts, ref.group_size, ref.lr_rule, ref.variant)
        ),
        key=lambda k: k.critic,
    )


def critic_batch_finding(analysis: Analysis, tol: float) -> Finding:
    """PPO: does the critic's batch (``critic_batch_scale``) or LR rule change N*?"""
    name = "PPO: the critic's batch scale is the actor's"
    paper = "actor and critic may need different batch scales (open question)"
    ref = analysis.reference
    variants = critic_variants(analysis)
    if not variants:
        return Finding(name, paper, "-", NOT_MEASURED, "no critic variant of the reference")
    n_ref = _n_stars(analysis, ref)
    parts, verdicts = [], []
    for k in variants:
        n_k = _n_stars(analysis, k)
        label = f"N*(critic {k.critic}) / N*(critic default)"
        if n_ref is None or n_k is None:
            parts.append(f"{label}: not reached")
            verdicts.append(UNDECIDED)
            continue
        e = _n_star_ratio(analysis, k, ref)
        parts.append(f"{label} = {_fmt_ratio(e)}")
        verdicts.append(_band_verdict(e, tol))
    # It holds when no critic setting changes N*; one that does refutes it.
    if FAILS in verdicts:
        verdict = FAILS
    else:
        verdict = HOLDS if set(verdicts) == {HOLDS} else UNDECIDED
    note = (
        f"each ratio against [{1 / (1 + tol):.3g}, {1 + tol:.3g}]: inside = same N*, "
        "outside = the critic's batch matters"
    )
    return Finding(name, paper, "; ".join(parts), verdict, note)


EV_WINDOW = 5  # updates averaged for the critic's explained variance at the warm-up's end


def critic_explained_variance(analysis: Analysis) -> list[tuple[Configuration, Estimate, Estimate]]:
    """PPO: per configuration, the critic's explained variance on fresh batches averaged
    over the last `EV_WINDOW` warm-up updates and over the actor's updates, each a mean
    over seeds with its t interval (``explained_variance`` of the update lines)."""
    rows = []
    for k in sorted(analysis.stats, key=lambda k: k.sort_key()):
        warm, train = [], []
        for r in analysis.runs_by_key.get(k, []):
            w = [x.get("explained_variance") for x in r.warmup_records[-EV_WINDOW:]]
            t = r.field("explained_variance")
            w = [float(v) for v in w if v is not None]
            if w:
                warm.append(float(np.mean(w)))
            if np.isfinite(t).any():
                train.append(float(np.nanmean(t)))
        if warm or train:
            level = analysis.level
            rows.append((k, _mean_estimate(warm, level), _mean_estimate(train, level)))
    return rows


def _mean_estimate(values: list[float], level: float) -> Estimate | None:
    if not values:
        return None
    mean, lo, hi = intervals.t_mean(values, level)
    return Estimate(mean, lo, hi, len(values))


def fixed_lr_finding(analysis: Analysis) -> Finding:
    """At twice the reference batch, fixed LR needs more samples than sqrt LR."""
    name = "fixed LR at 2x batch needs more samples"
    paper = "updates ratio 0.50-0.67 (sqrt) vs 0.75-0.83 (fixed): ~1.67x the samples"
    ref = analysis.reference
    at = [
        k
        for k in analysis.stats
        if (k.algo, k.critic, k.variant) == (ref.algo, ref.critic, ref.variant)
        and k.batch == 2 * ref.batch
    ]
    fixed = [k for k in at if k.lr_rule == "fixed"]
    sqrt = [k for k in at if k.lr_rule == "sqrt" and k.group_size == ref.group_size]
    if not fixed or not sqrt:
        return Finding(
            name, paper, "-", NOT_MEASURED, f"no fixed and sqrt point at B = {2 * ref.batch}"
        )
    f, s = fixed[0], sqrt[0]
    rf, rs = analysis.ratios[f].r_updates, analysis.ratios[s].r_updates
    updates = f"updates ratio {fmt_estimate(rs)} (sqrt) vs {fmt_estimate(rf)} (fixed), ideal 0.5"
    ns, nf = _n_stars(analysis, s), _n_stars(analysis, f)
    if ns is None:
        return Finding(name, paper, updates, UNDECIDED, "sqrt LR did not reach the target")
    if nf is None:
        st = analysis.stats[f]
        if st.incomplete:
            return Finding(name, paper, updates, UNDECIDED, "fixed-LR seeds still running")
        return Finding(name, paper, updates, HOLDS, "fixed LR did not reach within the budget")
    e = _n_star_ratio(analysis, f, s)
    measured = f"N*(fixed) / N*(sqrt) = {_fmt_ratio(e)}; {updates}"
    if not e.has_interval:
        return Finding(name, paper, measured, UNDECIDED, "no interval")
    verdict = HOLDS if e.lo > 1.0 else (FAILS if e.hi < 1.0 else UNDECIDED)
    return Finding(name, paper, measured, verdict, "N* ratio interval against 1")


def generation_finding(gen: GenerationReport | None, level: float = 0.95) -> Finding:
    """Generation throughput saturates inside the measured concurrency range: some c below
    the largest reaches ``gen.frac`` of its tokens/s.

    With repeated measurements per concurrency (``gen.samples``: calibration visits or
    runs) each c's ratio to the largest c has a t interval: *holds* when one lies above
    ``frac``, *does not hold* when all lie below, else undecided. A single measurement
    per concurrency decides on the point values (said so in "how decided"). Either way
    the verdict rests on the model ``t_step = a + b c``: it is withheld (undecided, "how
    decided" says why) when `cost_model.fit_problems` finds the fit poor.
    """
    name, paper = "generation throughput saturates", "4x the batch costs far less than 4x time"
    if gen is None:
        return Finding(name, paper, "-", NOT_MEASURED, "no throughput data")
    batches = [float(b) for b in gen.fit.batches]
    top = max(batches)
    best = float(np.max(gen.fit.tokens_per_s))
    measured = (
        f"plateau ({gen.frac:.0%} of the best, {best:.4g} tokens/s) at c = "
        f"{gen.plateau_batch_measured} of c <= {int(top)} measured ({gen.source})"
    )
    ratios = _ratios_to(gen, level, top)
    if ratios is not None:
        measured += (
            "; tokens/s against c = "
            + f"{int(top)}: "
            + ", ".join(f"c={int(c)}: {_fmt_interval(p, lo, hi, 0)}" for c, (p, lo, hi) in ratios)
        )
    problems = fit_problems(gen, level)
    if problems:  # the verdict rests on t_step = a + b c: withheld when it does not fit
        why = "withheld: the fit t_step = a + b c is poor (" + "; ".join(problems) + ")"
        return Finding(name, paper, measured, UNDECIDED, why)
    if ratios is None:
        verdict = HOLDS if gen.plateau_batch_measured < top else FAILS
        return Finding(name, paper, measured, verdict, "one measurement: no interval")
    # "Some smaller c reaches frac" is any of K: read at Holm's first-step level.
    any_ratios = _ratios_to(gen, intervals.holm_level(level, max(len(ratios), 1)), top) or []
    if any(lo >= gen.frac for _, (_, lo, _) in any_ratios):
        how = f"a smaller c's interval lies above {gen.frac:.0%}"
        verdict, how = HOLDS, how + _holm_words(level, len(ratios))
    elif ratios and all(hi < gen.frac for _, (_, _, hi) in ratios):
        verdict, how = FAILS, f"every smaller c's interval lies below {gen.frac:.0%}"
    else:
        verdict, how = UNDECIDED, f"an interval contains {gen.frac:.0%}"
    return Finding(name, paper, measured, verdict, how)


def _ratios_to(
    gen: GenerationReport, level: float, ref: float
) -> list[tuple[float, tuple[float, float, float]]] | None:
    """[(c, (ratio, lo, hi))]: each concurrency below ``ref``'s tokens/s against ``ref``'s,
    with t intervals over the repeated measurements (None: under 2 at ``ref``)."""
    ref_samples = np.asarray(gen.samples.get(ref, ()), float)
    if len(ref_samples) < 2:
        return None
    ratios = []
    for c in sorted(float(b) for b in gen.fit.batches if b < ref):
        own = np.asarray(gen.samples.get(c, ()), float)
        if len(own) >= 2:
            ratio = intervals.t_log_ratio(own[:, None], ref_samples[:, None], [1.0], level)
            ratios.append((c, ratio))
    return ratios


def generation_batch_walk(gen: GenerationReport, level: float) -> tuple[float, float] | None:
    """The critical generation batch's interval. The batch is the smallest concurrency
    whose tokens/s reaches ``gen.frac`` of the best measured
    (``GenerationReport.plateau_batch_measured``); the walk reads it off each smaller
    concurrency's tokens/s interval against the best one's: at their upper ends
    (optimistic) and at their lower ends (conservative; the best one itself when none
    does), both capped by the KV-cache bound. None without repeated measurements."""
    batches = [float(b) for b in gen.fit.batches]
    best = batches[int(np.argmax(gen.fit.tokens_per_s))]
    ratios = _ratios_to(gen, level, best)
    if ratios is None:
        return None
    lo = next((c for c, (_, _, hi) in ratios if hi >= gen.frac), best)
    hi = next((c for c, (_, lo_c, _) in ratios if lo_c >= gen.frac), best)
    cap = float(gen.max_kv_batch) if gen.max_kv_batch is not None else float("inf")
    return min(lo, cap), min(hi, cap)


def _slower_than(
    analysis: Analysis,
    end: Configuration,
    k: Configuration,
    factor: float,
    level: float | None = None,
) -> bool | None:
    """Whether ``end`` is decidedly more than ``factor`` times slower than ``k``: T(end) /
    T(k)'s interval (at ``level``, default the analysis') lies above ``factor`` (False:
    below it; None: it spans it or there is none). A configuration that finished without
    reaching is slower by any factor."""
    s_end, s_k = analysis.stats[end], analysis.stats[k]
    if not s_k.reached:
        return None if s_k.incomplete else False
    if not s_end.reached:
        return None if s_end.incomplete else True
    r = analysis.ratio(end, k, level).r_t
    if r is None or not r.has_interval:
        return None
    return True if r.lo > factor else (False if r.hi < factor else None)


def u_shape_finding(analysis: Analysis, tol: float) -> Finding:
    """T against B in the sqrt family has an interior minimum whose arms rise by more than
    ``1 + tol`` (see the module docstring)."""
    name, paper = "T is U-shaped in B", "P = 512, 1024: 0.74x, 0.71x; P = 2048, 4096: 1.23x, 1.18x"
    fam = _family(analysis)
    if len(fam) < 3:
        return Finding(name, paper, "-", NOT_MEASURED, "fewer than 3 sqrt batches")
    r_t = {k: analysis.ratios[k].r_t for k in fam}
    measured = ", ".join(
        f"B={k.batch}: {fmt_estimate(r_t[k], missing=analysis.ratios[k].time_missing_label)}"
        for k in fam
    )
    reached = [k for k in fam if r_t[k] is not None]
    if not reached:
        why = "no sqrt batch reached" if analysis.timed else "no timing in the runs"
        return Finding(name, paper, measured, NOT_MEASURED, why)
    best = min(reached, key=lambda k: r_t[k].mean)
    factor = 1.0 + tol

    def bottom(k: Configuration, level: float) -> bool | None:
        """Whether both ends are decidedly over ``factor`` x slower than ``k`` at ``level``
        (False: an end decidedly is not; None: cannot tell). Both arms must hold (an
        intersection-union test: each at ``level``, unadjusted)."""
        arms = [_slower_than(analysis, end, k, factor, level) for end in (fam[0], fam[-1])]
        return False if False in arms else (True if all(arms) else None)

    interior = fam[1:-1]
    # "Some interior batch is a bottom" is any of K: each read at Holm's first-step level.
    any_level = intervals.holm_level(analysis.level, len(interior))
    found = [k.batch for k in interior if bottom(k, any_level)]
    bottoms = {k: bottom(k, analysis.level) for k in interior}
    where = f"best mean at B = {best.batch}"
    if best in (fam[0], fam[-1]):  # The U is not tested on the arm that was not tried.
        where += f" ({edges.EDGE_WORDS[edges.SMALLER if best == fam[0] else edges.LARGER]})"
    holm = _holm_words(analysis.level, len(interior))
    if found:
        note = f"{where}; both ends over {factor:g}x slower than B = {found[0]}{holm}"
        return Finding(name, paper, measured, HOLDS, note)
    if not any(b is None for b in bottoms.values()):
        note = f"{where}; every interior batch has an end within {factor:g}x of its T"
        return Finding(name, paper, measured, FAILS, note)
    note = f"{where}; an end's T / T(interior) interval spans {factor:g}{holm}"
    return Finding(name, paper, measured, UNDECIDED, note)


def _holm_words(level: float, k: int) -> str:
    """How an "any of k" finding was read (empty for k = 1)."""
    if k <= 1:
        return ""
    return (
        f" (any of {k}: each read at {intervals.holm_level(level, k):.2%}, Holm; "
        f'an "every" verdict at {level:.0%})'
    )


def critical_order_finding(analysis: Analysis, gen: GenerationReport | None, tol: float) -> Finding:
    """Which of the two critical batches comes first."""
    name = "two critical batches"
    paper = "the critical generation and training batches differ; their order decides"
    crit = critical_batch.critical_training_batch(analysis, tol)
    if crit is None or gen is None:
        return Finding(name, paper, "-", NOT_MEASURED, "needs both critical batches")
    cg = gen.critical_generation_batch
    walk = generation_batch_walk(gen, analysis.level)
    g_lo, g_hi = walk if walk is not None else (cg, cg)
    lo, hi = crit.critical_batch_lo, crit.critical_batch_hi
    measured = f"generation {cg:.4g}" + (f" (walk [{g_lo:.4g}, {g_hi:.4g}])" if walk else "")
    measured += f"; training {crit.critical_batch} (CI walk [{lo}, {hi}])"
    if lo is None or hi is None or crit.first_outside_incomplete:
        return Finding(name, paper, measured, UNDECIDED, "the training batch has no interval")
    if g_hi < lo:
        return Finding(name, paper, measured, HOLDS, "throughput plateaus before invariance breaks")
    if g_lo > hi:
        return Finding(name, paper, measured, HOLDS, "invariance breaks before throughput plateaus")
    return Finding(name, paper, measured, UNDECIDED, "the two batches' walks meet")


def schedule_kind(analysis: Analysis, k: Configuration) -> str:
    """The batch-size schedule of configuration ``k``'s runs (``batch_schedule.kind`` of
    its first run's config; ``"fixed"`` when absent)."""
    runs = analysis.runs_by_key.get(k) or []
    section = (runs[0].config.get("batch_schedule") or {}) if runs else {}
    return str(section.get("kind", "fixed"))


def scheduled_configurations(analysis: Analysis) -> list[Configuration]:
    """The sweep's configurations with a batch-size schedule, in sort order."""
    keys = sorted(analysis.stats, key=lambda k: k.sort_key())
    return [k for k in keys if schedule_kind(analysis, k) != "fixed"]


def best_fixed_batch(analysis: Analysis) -> Configuration | None:
    """The configuration without a batch schedule (another variant, e.g. a hyperparameter
    rule, counts) whose every seed reached with the smallest mean T (the same algorithm
    as the reference); None when none did."""
    fixed = _fixed_keys(analysis)
    return min(fixed, key=lambda k: analysis.stats[k].time_to_target_s.mean, default=None)


def schedule_ratios(analysis: Analysis) -> list[tuple[Configuration, Estimate | None]]:
    """Each scheduled configuration's T / T(best fixed batch) (`best_fixed_batch`), with
    its interval (paired by seed where the runs are; None: it did not reach)."""
    best = best_fixed_batch(analysis)
    if best is None:
        return []
    return [(k, analysis.ratio(k, best).r_t) for k in scheduled_configurations(analysis)]


def _fixed_keys(analysis: Analysis) -> list[Configuration]:
    """Configurations without a batch schedule that reached with a T (same algorithm as
    the reference)."""
    return [
        k
        for k, s in analysis.stats.items()
        if k.algo == analysis.reference.algo
        and schedule_kind(analysis, k) == "fixed"
        and s.reached
        and s.time_to_target_s is not None
    ]


def _seed_halves(analysis: Analysis) -> tuple[list[int], list[int]] | None:
    """Every other seed (sorted) for choosing, the rest for comparing; None under 4 seeds
    (a half needs 2 for an interval)."""
    seeds = sorted({r.seed for r in analysis.sweep.runs if r.seed is not None})
    return (seeds[0::2], seeds[1::2]) if len(seeds) >= 4 else None


def _on_seeds(analysis: Analysis, seeds: Sequence[int]) -> Analysis | None:
    """``analysis`` redone on the runs of ``seeds`` only (None: the reference has none)."""
    runs = tuple(r for r in analysis.sweep.runs if r.seed in set(seeds))
    try:
        return reanalyze(analysis, dataclasses.replace(analysis.sweep, runs=runs))
    except (ValueError, KeyError):
        return None


NO_GAIN_LEVEL = 0.90  # one-sided 5 %: the lower end of a 90 % interval (equivalence.ALPHA)


def _schedule_verdict(
    analysis: Analysis, k: Configuration, against: Sequence[Configuration], any_level: float
) -> tuple[str, str]:
    """(verdict, measured) of schedule ``k`` against the fixed configurations ``against``
    (the best, or every one the best could be): holds when its T is decidedly below each
    (at ``any_level``); does not hold when, against each, it is decidedly slower (the
    analysis' level) or shown to gain no more than the sweep's equivalence margin
    (``T / T(fixed) >= 1 - delta`` at one-sided 5 %: the 90 % interval's lower end, the
    equivalence test's level)."""
    s = analysis.stats[k]
    if not s.reached or s.time_to_target_s is None:
        return (UNDECIDED, "incomplete") if s.incomplete else (FAILS, "not reached")
    below, not_faster, shown = [], [], []
    for f in against:
        r_any = analysis.ratio(k, f, any_level).r_t
        r = analysis.ratio(k, f).r_t
        r_gain = analysis.ratio(k, f, NO_GAIN_LEVEL).r_t
        shown.append(f"T / T(B = {f.batch}) = {_fmt_ratio(r)}")
        below.append(r_any is not None and r_any.has_interval and r_any.hi < 1.0)
        slower = r is not None and r.has_interval and r.lo > 1.0
        no_gain = r_gain is not None and r_gain.has_interval and r_gain.lo >= 1 - analysis.delta
        if no_gain and not slower:
            lo = f"{NO_GAIN_LEVEL:.0%} lower end {r_gain.lo:.3g}"
            shown[-1] += f", gain at most {analysis.delta:.0%} ({lo})"
        not_faster.append(slower or no_gain)
    verdict = HOLDS if all(below) else (FAILS if all(not_faster) else UNDECIDED)
    return verdict, ", ".join(shown)


def schedule_finding(analysis: Analysis) -> Finding:
    """Does a batch-size schedule reach the target in less time than the best fixed batch
    of the sweep? Holds when some schedule's T is decidedly below the best fixed batch's
    (any of K schedules: each read at Holm's level, `intervals.holm_level`); does not hold
    when every schedule is decidedly slower, gains at most the margin, or never reached;
    else undecided.

    "Beats" means by more than the sweep's equivalence margin: a schedule whose T is shown
    to be at least ``1 - delta`` of the best fixed batch's does not beat it
    (`_schedule_verdict`).

    The best fixed batch is the smallest mean T, and a best picked on the seeds it is then
    compared on looks faster than it is (a winner's curse). With 4 or more seeds it is
    picked on every other seed and compared on the rest; with fewer, the schedule is
    compared with every fixed configuration not shown slower than the best (the set the
    true best is in) and must be faster (or slower) than each.
    """
    name = "a batch schedule beats the best fixed batch"
    paper = "not in the study (batch warm-up: 43% fewer steps for OLMo-1B, Merrill et al. 2025)"
    scheduled = scheduled_configurations(analysis)
    if not scheduled:
        return Finding(name, paper, "-", NOT_MEASURED, "no configuration with a batch schedule")
    best = best_fixed_batch(analysis)
    if best is None or not analysis.timed:
        return Finding(name, paper, "-", NOT_MEASURED, "no fixed batch reached with a T")
    halves = _seed_halves(analysis)
    pick, judge = (
        (_on_seeds(analysis, halves[0]), _on_seeds(analysis, halves[1])) if halves else (None, None)
    )
    held_out = pick is not None and judge is not None and best_fixed_batch(pick) is not None
    if held_out:
        best = best_fixed_batch(pick)
        against, on = [best], judge
        how = (
            f"against the best fixed batch {best.name}, picked on seeds {halves[0]} and "
            f"compared on seeds {halves[1]}"
        )
    else:
        on = analysis
        against = [best] + [
            k
            for k in _fixed_keys(analysis)
            if k != best and not _slower_than(analysis, k, best, 1.0)
        ]
        how = (
            f"against every fixed batch not shown slower than the best {best.name} "
            f"({', '.join(k.name for k in against)}; under 4 seeds, none held out)"
        )
    any_level = intervals.holm_level(analysis.level, len(scheduled))
    parts, verdicts = [], []
    for k in scheduled:
        verdict, measured = _schedule_verdict(on, k, against, any_level)
        parts.append(f"{k.variant or schedule_kind(analysis, k)}: {measured}")
        verdicts.append(verdict)
    verdict = HOLDS if HOLDS in verdicts else (FAILS if set(verdicts) == {FAILS} else UNDECIDED)
    note = (
        how
        + "; holds when a schedule's interval lies below 1"
        + _holm_words(analysis.level, len(scheduled))
        + f"; does not hold when each is slower or gains at most {analysis.delta:.0%}"
        + f" (its {NO_GAIN_LEVEL:.0%} interval's lower end >= {1 - analysis.delta:.3g})"
    )
    return Finding(name, paper, "; ".join(parts), verdict, note)


def _hparam_rules_of(analysis: Analysis, k: Configuration) -> dict[str, str]:
    """The ``hparam_rules`` section of configuration ``k``'s first run's config ({}: none,
    e.g. a run written before the section existed)."""
    runs = analysis.runs_by_key.get(k) or []
    section = (runs[0].config.get("hparam_rules") or {}) if runs else {}
    return {str(name): str(rule) for name, rule in section.items()}


def hparam_rules_off_default(analysis: Analysis, k: Configuration) -> dict[str, str]:
    """The ``hparam_rules`` fields that configuration ``k``'s variant sets otherwise than
    the variant-less configuration of the same P, G and LR rule (its runs' configs; the
    run config owns the defaults, which the analysis does not import): ``{}`` when ``k``
    has no variant or no such partner."""
    if not k.variant:
        return {}
    fixed = dataclasses.replace(k, variant="")
    if fixed not in analysis.runs_by_key:
        return {}
    mine, theirs = _hparam_rules_of(analysis, k), _hparam_rules_of(analysis, fixed)
    return {name: rule for name, rule in mine.items() if theirs.get(name, rule) != rule}


def hparam_rule_configurations(analysis: Analysis) -> list[tuple[Configuration, Configuration]]:
    """``(rule, fixed)`` pairs at twice the reference batch: each configuration of the
    reference's algorithm and critic whose variant sets an ``hparam_rules`` field off its
    default, with the variant-less configuration of the same P, G and LR rule (pairs
    without one are left out), in sort order."""
    ref = analysis.reference
    keys = sorted(analysis.stats, key=lambda k: k.sort_key())
    at = [
        k for k in keys if (k.algo, k.critic) == (ref.algo, ref.critic) and k.batch == 2 * ref.batch
    ]
    pairs = []
    for k in at:
        if not k.variant or not hparam_rules_off_default(analysis, k):
            continue
        fixed = dataclasses.replace(k, variant="")
        if fixed in analysis.stats:
            pairs.append((k, fixed))
    return pairs


def hparam_rule_findings(analysis: Analysis) -> list[Finding]:
    """At twice the reference batch, does a batch-tied rule for a hyperparameter X
    (``hparam_rules``: Adam's betas/eps, the clip range, the warm-up) keep invariance
    better than fixed X? One finding per `hparam_rule_configurations` pair: N*(rule X) /
    N*(fixed X) with its interval (paired by seed where the runs are a matched pair);
    holds when it lies below 1 (fewer samples at 2x batch), does not hold when above 1,
    else undecided. A side that never reached decides it when the other did."""
    out = []
    for k, fixed in hparam_rule_configurations(analysis):
        rules = hparam_rules_off_default(analysis, k)
        x = ", ".join(f"{name}={rule}" for name, rule in rules.items())
        name = f"at 2x batch, the rule {x} keeps invariance better than fixed"
        paper = "not in the study" + (
            " (Malladi et al. 2022 derive the SDE rule for Adam's betas and eps)"
            if "adam" in rules
            else ""
        )
        label = f"N*({k.variant}) / N*(fixed) at B = {k.batch}"
        ns, nf = _n_stars(analysis, k), _n_stars(analysis, fixed)
        if ns is None or nf is None:
            pending = analysis.stats[k].incomplete or analysis.stats[fixed].incomplete
            if pending:
                verdict, how = UNDECIDED, "seeds still running"
            elif ns is None and nf is None:
                verdict, how = UNDECIDED, "neither reached the target"
            elif ns is None:
                verdict, how = FAILS, f"{k.name} did not reach; {fixed.name} did"
            else:
                verdict, how = HOLDS, f"{fixed.name} did not reach; {k.name} did"
            out.append(Finding(name, paper, f"{label}: -", verdict, how))
            continue
        e = _n_star_ratio(analysis, k, fixed)
        measured = f"{label} = {_fmt_ratio(e)}"
        if not e.has_interval:
            out.append(Finding(name, paper, measured, UNDECIDED, "no interval"))
            continue
        verdict = HOLDS if e.hi < 1.0 else (FAILS if e.lo > 1.0 else UNDECIDED)
        how = f"against {fixed.name}; holds when the N* ratio's interval lies below 1"
        out.append(Finding(name, paper, measured, verdict, how))
    return out


def study_findings(
    analysis: Analysis, generation: GenerationReport | None, tol: float
) -> list[Finding]:
    """Every finding of docs/design.md section 1, measured on the sweep (and, where the
    sweep has batch-size schedules, `schedule_finding`; where it has hyperparameter-rule
    variants at twice the reference batch, `hparam_rule_findings`)."""
    return [
        invariance_finding(analysis, tol),
        *grad_norm_findings(analysis, analysis.level),
        batch_unit_finding(analysis, tol),
        *([critic_batch_finding(analysis, tol)] if analysis.reference.algo == "ppo" else []),
        fixed_lr_finding(analysis),
        generation_finding(generation),
        u_shape_finding(analysis, tol),
        critical_order_finding(analysis, generation, tol),
        *([schedule_finding(analysis)] if scheduled_configurations(analysis) else []),
        *hparam_rule_findings(analysis),
    ]


COST_PARTS = ("time_generate_s", "time_score_s", "time_update_s", "time_idle_s")


def time_per_update(analysis: Analysis) -> list[tuple[int, dict[str, float]]]:
    """Per batch: mean seconds per update line in each of `COST_PARTS` (all its runs).

    Returns:
      ``[(batch, {part: seconds})]`` by batch; a batch whose runs carry no timings is left out.
    """
    totals: dict[int, dict[str, float]] = {}
    lines: dict[int, int] = {}
    for k, runs in analysis.runs_by_key.items():
        t = totals.setdefault(k.batch, dict.fromkeys(COST_PARTS, 0.0))
        for r in runs:
            if not r.has_field("time_update_s"):
                continue
            lines[k.batch] = lines.get(k.batch, 0) + len(r.update_records)
            for part in COST_PARTS:
                if r.has_field(part):
                    t[part] += float(np.nansum(r.field(part)))
    return [
        (b, {p: v / lines[b] for p, v in totals[b].items()})
        for b in sorted(totals)
        if lines.get(b) and sum(totals[b].values()) > 0
    ]


def cost_structure(analysis: Analysis) -> list[tuple[int, dict[str, float]]]:
    """Per batch: the share of training time in each of `COST_PARTS` (all its runs)."""
    return [
        (b, {p: v / sum(parts.values()) for p, v in parts.items()})
        for b, parts in time_per_update(analysis)
    ]


def cost_sentence(rows: Sequence[tuple[int, dict[str, float]]]) -> str:
    """What the measured cost structure implies for this hardware (one sentence)."""
    if not rows:
        return "No timings in the update lines: cost structure unknown."
    gen = [s["time_generate_s"] for _, s in rows]
    upd = [s["time_update_s"] for _, s in rows]
    span = f"generation {min(gen):.0%}-{max(gen):.0%}, update {min(upd):.0%}-{max(upd):.0%}"
    if all(u > g for u, g in zip(upd, gen)):
        return (
            f"The update dominates training time at every batch ({span}): the reverse of LLM "
            "RL at scale, where generation dominates, so here throughput gains with batch come "
            "mostly from the update, and the generation plateau matters less for T."
        )
    if all(g > u for u, g in zip(upd, gen)):
        return (
            f"Generation dominates training time at every batch ({span}), as in LLM RL at "
            "scale: the generation plateau is what batch size buys."
        )
    return f"Neither generation nor the update dominates at every batch ({span})."
