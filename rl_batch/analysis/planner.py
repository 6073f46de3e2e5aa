"""Algorithm 1 ("align, then accelerate"): rank candidate batches by ``r_N / r_q``.

Full mode (``plan_full``): every configuration of a finished sweep is a candidate; its
measured sample cost ``r_N`` and end-to-end throughput gain ``r_q`` against the reference
give ``T/T_ref = r_N / r_q``. The best is the smallest ``T/T_ref`` among the
configurations whose every seed reached the target (step 3: confirm it reaches).

Verdicts, not winners (`rl_batch.analysis.equivalence`): every other reached, timed
configuration is compared with the best on ``T(k) / T(best)``: *equivalent* (its 90 %
interval inside ``1 +- delta``, two one-sided tests), *slower* (its 95 % interval above
1) or *undecided*. The *candidates* are the best and every configuration not shown
slower; once none is undecided they are the recommended set, and the plan's first
sentence (`Plan.sentence`) reads "Use B = 16 or 32: within x % of each other, both y %
faster than B = 64"; otherwise it names the undecided comparisons and about how many more
seeds per configuration would decide each (`intervals.seeds_to_decide`). When the
reference did not reach the target, the pairwise ratios still hold; the table ranks by T
in seconds.

Pilot mode has predicted r_N only, no pairwise T: its candidates are the best and every
configuration whose T/T_ref interval overlaps the best's (or that has none), and the seed
count is `intervals.seeds_to_separate`'s.

Pilot mode (``plan_pilot``): predicts each candidate's ``r_N`` from the first
``fraction`` of each run's runway (``fraction * budget_responses`` retained responses)
and measures ``q`` over the same window on the calibrated clock (the sweep's
``calibration.json``; without one it refuses: the runs' own timings, taken side by side
under contention, would rank the batches by the host's load), i.e. what short pilot runs
would tell.

- ``method="intermediate"``: responses needed to reach a lower level, the same for all
  candidates: ``level_frac`` of the way from the initial accuracy to the median (over
  configurations) of the best seed-mean accuracy within the window, capped at the target
  and at the reference's best (so the reference reaches it). A candidate with a seed
  that does not reach it within the window gets only a lower bound,
  ``r_N >= mean_i min(N_i, window) / mean N_ref(level)`` (seeds that did not reach
  count as the window; a seed still running that has not covered the window yet counts
  as the responses of its last evaluation), and ranks after the predicted ones.
- ``method="fit"``: fits ``acc(n) = A - (A - a0) exp(-n / tau)`` (``A <= 1``) to each
  run's window and extrapolates N* at the target (``A <= target``: predicted never).

On a full sweep, ``plan_pilot`` also reports how the pilot's pick compares with the best
configuration of the full sweep (``T(pick) / T(best)``) and the cost of the pilot as a
fraction of the sweep's (sum of calibrated training seconds used), and what it saves.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_batch.analysis import equivalence, intervals
from rl_batch.analysis.curves import RunData, Sweep, truncate_run
from rl_batch.analysis.edges import edge_sentence
from rl_batch.analysis.time_to_target import (
    DEFAULT_LEVEL,
    DEFAULT_N_BOOT,
    DEFAULT_SEED,
    INCOMPLETE,
    NO_TIMING,
    NOT_REACHED,
    Analysis,
    Estimate,
    analyze_sweep,
    calibrated_seconds,
    exact_one,
    first_crossing,
    fmt_estimate,
    ratio_estimates,
    step_time_log_ratios,
    update_crossing,
)
from rl_batch.artifacts import Configuration

PILOT_METHODS = ("intermediate", "fit")
DEFAULT_LEVEL_FRAC = 0.8
PILOT_SAVES_LITTLE = 0.9  # a pilot costing more than this share of the sweep saves little


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One candidate configuration.

    Attributes:
      key: the configuration.
      r_n: (predicted) sample cost against the reference.
      r_q: (measured) throughput gain against the reference.
      r_t: ``r_N / r_q``, the time-to-target ratio.
      reached: full mode: every seed reached the target; pilot mode: r_N was predicted.
      r_n_lower_bound: pilot mode, a candidate with a seed that did not reach the level:
        ``r_N >= this`` (see the module docstring).
      note: free-text remark.
      time_to_target_s: full mode, the mean time-to-target in seconds.
      incomplete: full mode: ``Ratios.incomplete``, its (or the reference's) missing r_N
        waits for seeds still running (shown "incomplete" rather than "not reached").
    """

    key: Configuration
    r_n: Estimate | None
    r_q: Estimate | None
    r_t: Estimate | None
    reached: bool
    r_n_lower_bound: float | None = None
    note: str = ""
    time_to_target_s: Estimate | None = None
    incomplete: bool = False

    @property
    def missing_label(self) -> str:
        return INCOMPLETE if self.incomplete else NOT_REACHED


@dataclasses.dataclass(frozen=True)
class PilotComparison:
    """How a pilot plan compares with the full sweep it was simulated on.

    Attributes:
      fraction: pilot fraction of the runway.
      method: ``intermediate`` or ``fit``.
      level: the intermediate accuracy level (``None`` for ``fit``).
      window_responses: retained responses each pilot run stops at.
      pilot_cost_s: sum over runs of training seconds within the window.
      sweep_cost_s: sum over runs of training seconds of the full runs.
      pick: the pilot's recommendation.
      best: the full sweep's recommendation (smallest measured T/T_ref).
      pick_r_t_full: the pick's measured T/T_ref in the full sweep.
      best_r_t_full: the best's measured T/T_ref.
    """

    fraction: float
    method: str
    level: float | None
    window_responses: float
    pilot_cost_s: float
    sweep_cost_s: float
    pick: Configuration | None
    best: Configuration | None
    pick_r_t_full: Estimate | None
    best_r_t_full: Estimate | None

    @property
    def cost_fraction(self) -> float:
        return self.pilot_cost_s / self.sweep_cost_s if self.sweep_cost_s > 0 else float("nan")

    @property
    def regret(self) -> float | None:
        """``T(pick) / T(best)`` in the full sweep (1.0: the pilot found the best)."""
        if self.pick_r_t_full is None or self.best_r_t_full is None:
            return None
        return self.pick_r_t_full.mean / self.best_r_t_full.mean


@dataclasses.dataclass(frozen=True)
class Plan:
    """A ranked plan and its verdict (see the module docstring).

    Attributes:
      mode: ``full`` or ``pilot``.
      target: the validation target.
      reference: the reference configuration.
      rows: candidates ranked best first.
      recommendation: the best, only when its interval excludes every other reached
        configuration's (``None`` otherwise, or when nothing reached).
      pilot: pilot mode, how the pick compares with the full sweep.
      note: free-text remark.
      best: the smallest mean T/T_ref (or T) among configurations that reached.
      candidates: the best and the configurations that cannot be told apart from it.
      seeds_to_separate: seeds per configuration at which the best's interval would
        exclude every other candidate's (``None``: unknown, e.g. no interval, or > 100).
      edge: `edge_sentence` of the best (empty when it is interior): an edge optimum is
        the smallest (or largest) batch tried, not a shown optimum.
      pairs: full mode: every other configuration with a T against the best
        (`equivalence.PairVerdict`), best first.
      sentence: full mode: the plain recommendation (`equivalence.sentence`).
      delta: full mode: the equivalence margin the pairs were decided at.
    """

    mode: str
    target: float
    reference: Configuration
    rows: tuple[PlanRow, ...]
    recommendation: Configuration | None
    pilot: PilotComparison | None = None
    note: str = ""
    best: Configuration | None = None
    candidates: tuple[Configuration, ...] = ()
    seeds_to_separate: int | None = None
    edge: str = ""
    pairs: tuple[equivalence.PairVerdict, ...] = ()
    sentence: str = ""
    delta: float | None = None

    @property
    def settled(self) -> bool:
        """Full mode: every other configuration is equivalent to the best or slower."""
        return self.best is not None and all(p.verdict != equivalence.UNDECIDED for p in self.pairs)

    @property
    def decided(self) -> bool:
        """Whether the plan names what to use: a settled set (full mode), or a single
        configuration (pilot mode)."""
        if self.mode == "full":
            return self.settled
        return self.recommendation is not None

    @property
    def recommended_set(self) -> tuple[Configuration, ...]:
        """The configurations to use (the best and those equivalent to it) once settled;
        () otherwise."""
        return self.candidates if self.decided else ()

    @property
    def verdict(self) -> str:
        """One sentence: the recommendation, or what it cannot tell apart."""
        if self.best is None and self.note.startswith(NO_TIMING):
            return f"none ({self.note})"
        if self.best is None:
            return "none (no configuration reached the target in every seed)"
        if self.sentence:
            return self.sentence
        if self.recommendation is not None:
            b = self.recommendation
            return f"{b.name} (batch {b.batch}): its interval excludes every other's"
        names = ", ".join(f"{k.name} (batch {k.batch})" for k in self.candidates)
        more = (
            f"about {self.seeds_to_separate} seeds per configuration would separate them"
            if self.seeds_to_separate is not None
            else "more seeds would be needed to separate them (an interval is missing, or "
            "more than 100 seeds)"
        )
        return f"undecided at this power between {names}; best mean {self.best.name}; {more}"


def _comparable(row: PlanRow) -> Estimate | None:
    """The estimate a plan compares candidates on: T/T_ref, or T (s) without one."""
    return row.r_t if row.r_t is not None else row.time_to_target_s


def verdict(
    ranked: Sequence[PlanRow], level: float = DEFAULT_LEVEL
) -> tuple[Configuration | None, tuple[Configuration, ...], int | None]:
    """(best, candidates, seeds to separate) of rows ranked best first.

    Candidates are the reached rows whose interval overlaps the best's, or that have
    none; the seed count is the largest `intervals.seeds_to_separate` over them.
    """
    if not ranked or not ranked[0].reached or _comparable(ranked[0]) is None:
        return None, (), None
    best = _comparable(ranked[0])
    tied, needed = [ranked[0].key], []
    for row in ranked[1:]:
        e = _comparable(row)
        if not row.reached or e is None:
            continue
        if best.has_interval and e.has_interval and e.lo > best.hi:
            continue  # Told apart.
        tied.append(row.key)
        needed.append(
            intervals.seeds_to_separate(
                (best.mean, best.lo, best.hi, best.n), (e.mean, e.lo, e.hi, e.n), level
            )
        )
    seeds = None if (not needed or None in needed) else max(needed)
    return ranked[0].key, tuple(tied), seeds


def _ranked_plan(mode, target, reference, ranked, pilot=None, note="") -> Plan:
    best, candidates, seeds = verdict(ranked)
    rec = best if len(candidates) == 1 else None
    edge = edge_sentence([r.key for r in ranked], best)
    return Plan(
        mode, target, reference, tuple(ranked), rec, pilot, note, best, candidates, seeds, edge
    )


def _rank(rows: list[PlanRow]) -> list[PlanRow]:
    def score(r: PlanRow) -> tuple[int, float]:
        if r.reached and r.r_t is not None:
            return (0, r.r_t.mean)
        if r.reached and r.time_to_target_s is not None:  # No reference ratio: seconds.
            return (0, r.time_to_target_s.mean)
        if r.r_n_lower_bound is not None and r.r_q is not None:
            return (1, r.r_n_lower_bound / r.r_q.mean)
        return (2, float(r.key.batch))

    return sorted(rows, key=score)


def plan_full(analysis: Analysis) -> Plan:
    """Ranks the sweep's configurations by measured ``T/T_ref = r_N / r_q``.

    When the reference itself did not reach the target, ranks by mean time-to-target.

    Args:
      analysis: the sweep analysis.

    Returns:
      The plan.
    """
    rows = []
    ref_stats = analysis.stats[analysis.reference]
    ref_reached = ref_stats.reached
    for k, s in analysis.stats.items():
        ra = analysis.ratios[k]
        if s.reached and s.q is None and analysis.timed:
            untimed = sum(r.q is None for r in s.runs)
            note = f"{NO_TIMING} ({untimed}/{s.n_seeds} seeds untimed): not ranked by T"
        elif s.reached:
            note = ""
        elif s.incomplete:
            note = (
                f"{INCOMPLETE} ({s.n_reached}/{s.n_seeds} seeds reached, "
                f"{s.n_pending} still running)"
            )
        else:
            note = f"{NOT_REACHED} ({s.n_reached}/{s.n_seeds} seeds)"
        rows.append(
            PlanRow(
                k,
                ra.r_n,
                ra.r_q,
                ra.r_t,
                s.reached,
                None,
                note,
                s.time_to_target_s,
                incomplete=ra.incomplete,
            )
        )
    ranked = _rank(rows)
    if ref_reached and ref_stats.q is None and analysis.timed:
        note = "reference untimed (a seed logged no training time): ranked by mean T in s"
    elif ref_reached:
        note = ""
    elif ref_stats.incomplete:
        note = "reference incomplete (seeds still running): ranked by mean T in s"
    else:
        note = "reference did not reach the target: ranked by mean T in s"
    if not analysis.timed:
        note = f"{NO_TIMING} in the runs: no T to rank by (N* and r_N only)"
    return _full_plan(analysis, ranked, note)


def _full_plan(analysis: Analysis, ranked: list[PlanRow], note: str) -> Plan:
    """The plan of ranked rows with the pairwise verdicts against the best."""
    first = ranked[0] if ranked else None
    if first is None or not first.reached or _comparable(first) is None:
        return _ranked_plan("full", analysis.target, analysis.reference, ranked, note=note)
    best = first.key
    pairs = equivalence.compare_all(analysis, best, [r.key for r in ranked])
    candidates = (best, *(p.key for p in pairs if p.verdict != equivalence.SLOWER))
    undecided = [p.seeds for p in pairs if p.verdict == equivalence.UNDECIDED]
    seeds = None if (not undecided or None in undecided) else max(undecided)
    keys = [r.key for r in ranked]
    settled = not undecided
    return Plan(
        "full",
        analysis.target,
        analysis.reference,
        tuple(ranked),
        best if settled and len(candidates) == 1 else None,
        None,
        note,
        best,
        candidates,
        seeds,
        edge_sentence(keys, best),
        pairs,
        equivalence.sentence(analysis, best, pairs, keys),
        analysis.delta,
    )


@dataclasses.dataclass(frozen=True)
class SaturatingFit:
    """``acc(n) = A - (A - a0) exp(-n / tau)``."""

    A: float  # noqa: N815
    a0: float
    tau: float
    sse: float

    def predict(self, n: Any) -> np.ndarray:
        return self.A - (self.A - self.a0) * np.exp(-np.asarray(n, dtype=np.float64) / self.tau)

    def responses_to(self, level: float) -> float | None:
        """Responses where the curve reaches ``level`` (``None``: never, A <= level)."""
        if self.a0 >= level:
            return 0.0
        if self.A <= level:
            return None
        return float(self.tau * math.log((self.A - self.a0) / (self.A - level)))


def _fit_fixed_tau(n: np.ndarray, acc: np.ndarray, tau: float, a_max: float):
    e = np.exp(-n / tau)
    design = np.stack([np.ones_like(n), -e], axis=1)  # acc = A - C e
    (a_hat, c_hat), *_ = np.linalg.lstsq(design, acc, rcond=None)
    if a_hat > a_max:  # Accuracy cannot saturate above a_max: refit C with A fixed.
        a_hat = a_max
        c_hat = float(np.dot(e, a_max - acc) / max(np.dot(e, e), 1e-300))
    c_hat = max(float(c_hat), 0.0)  # Learning curves rise.
    if c_hat == 0.0:
        a_hat = float(np.mean(acc)) if a_hat <= a_max else a_max
    sse = float(np.sum((a_hat - c_hat * e - acc) ** 2))
    return float(a_hat), c_hat, sse


def fit_saturating(
    n: Sequence[float], acc: Sequence[float], a_max: float = 1.0
) -> SaturatingFit | None:
    """Least-squares fit of ``acc(n) = A - (A - a0) exp(-n / tau)`` with ``A <= a_max``.

    For each tau on a log grid, A and ``C = A - a0`` are linear least squares; the best
    tau is then refined on a finer local grid.

    Args:
      n: [E] retained responses at evaluations.
      acc: [E] accuracies.
      a_max: upper bound on the asymptote (1 for accuracies).

    Returns:
      The fit, or ``None`` with fewer than three evaluations or no positive responses.
    """
    n = np.asarray(n, dtype=np.float64)
    acc = np.asarray(acc, dtype=np.float64)
    if n.size < 3 or n.max() <= 0:
        return None
    span = float(n.max())
    taus = np.geomspace(span / 200.0, span * 200.0, 241)
    sse = [_fit_fixed_tau(n, acc, t, a_max)[2] for t in taus]
    i = int(np.argmin(sse))
    lo, hi = taus[max(i - 1, 0)], taus[min(i + 1, len(taus) - 1)]
    fine = np.geomspace(lo, hi, 101)
    fits = [(_fit_fixed_tau(n, acc, t, a_max), t) for t in fine]
    (a_hat, c_hat, best_sse), tau = min(fits, key=lambda f: f[0][2])
    return SaturatingFit(A=a_hat, a0=a_hat - c_hat, tau=float(tau), sse=best_sse)


def pilot_lower_bound(
    n_seeds: Sequence[float | None], covered: Sequence[float], n_ref: Sequence[float]
) -> float:
    """Lower bound on a candidate's r_N when some seed did not reach the level.

    ``mean_i lower_i / mean(N_ref)`` with ``lower_i = N_i`` for a seed that reached the
    level and ``covered_i`` (the responses the pilot watched it for: the window, or
    less for a seed still running) for one that did not, whose N_i is beyond it.

    Args:
      n_seeds: [S] the candidate's per-seed N at the level (``None``: not reached).
      covered: [S] responses each seed was watched for without reaching the level.
      n_ref: the reference's per-seed N at the level (all reached).

    Returns:
      The bound (r_N is at least this).
    """
    lower = [c if n is None else n for n, c in zip(n_seeds, covered)]
    return float(np.mean(lower)) / float(np.mean(n_ref))


def _window(sweep: Sweep, runs: Sequence[RunData], fraction: float) -> float:
    runway = sweep.budget_responses or max(r.final_responses for r in runs)
    return fraction * runway


def _seed_max(runs: Sequence[RunData]) -> float:
    vals = [float(r.eval_accuracy.max()) for r in runs if r.eval_accuracy.size]
    return float(np.mean(vals)) if vals else float("nan")


def _calibrated_s(full: Analysis, run: RunData) -> float:
    """Calibrated training seconds of a run's updates (`calibrated_seconds`)."""
    updates = float(run.updates_done[-1]) if run.updates_done.size else 0.0
    return float(calibrated_seconds(full.run_step_s[run.name], updates))


def plan_pilot(
    sweep: Sweep,
    fraction: float,
    target: float | None = None,
    reference: str | None = None,
    method: str = "intermediate",
    level_frac: float = DEFAULT_LEVEL_FRAC,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = DEFAULT_SEED,
    full: Analysis | None = None,
) -> Plan:
    """Simulates pilot runs on a sweep by truncating its curves (see the module docstring).

    Args:
      sweep: the loaded sweep.
      fraction: pilot fraction of the runway, in (0, 1].
      target: validation target (``None``: the sweep's).
      reference: reference configuration (see ``resolve_reference``).
      method: ``intermediate`` or ``fit``.
      level_frac: intermediate level position (``intermediate`` only).
      n_boot, seed: bootstrap settings.
      full: the full-sweep analysis, when already computed.

    Returns:
      The pilot plan, with ``pilot`` comparing its pick with the full sweep.
    """
    if method not in PILOT_METHODS:
        raise ValueError(f"plan_pilot: method must be one of {PILOT_METHODS}, got {method!r}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"plan_pilot: fraction must be in (0, 1], got {fraction}")
    if full is None:
        full = analyze_sweep(sweep, target, reference, n_boot=n_boot, seed=seed)
    if not full.calibrated:
        raise ValueError(
            f"plan_pilot: {sweep.sweep_dir} has no calibrated step times (calibration.json "
            "for every configuration): the runs' own timings were taken side by side under "
            "contention; run `python -m experiments.calibrate` on the sweep first"
        )
    all_runs = [r for rs in full.runs_by_key.values() for r in rs]
    window = _window(sweep, all_runs, fraction)
    pilots = {k: [truncate_run(r, window) for r in rs] for k, rs in full.runs_by_key.items()}

    level, a0 = None, float("nan")
    if method == "intermediate":
        firsts = [r.eval_accuracy[0] for rs in pilots.values() for r in rs if r.eval_accuracy.size]
        maxes = [m for m in (_seed_max(rs) for rs in pilots.values()) if np.isfinite(m)]
        if firsts and maxes:
            a0, m = float(np.median(firsts)), float(np.median(maxes))
            level = min(full.target, a0 + level_frac * (m - a0), _seed_max(pilots[full.reference]))
            if not np.isfinite(level):
                level = None  # The reference has no evaluation in the window.

    def predicted_n(run: RunData) -> float | None:
        if method == "intermediate":
            if level is None or not level > a0:
                return None  # No learning visible in the window: nothing to compare.
            n = first_crossing(run.eval_responses, run.eval_accuracy, level)
            return update_crossing(n, run.responses) if full.crossing == "update" else n
        fit = fit_saturating(run.eval_responses, run.eval_accuracy)
        return None if fit is None else fit.responses_to(full.target)

    preds = {k: [predicted_n(r) for r in rs] for k, rs in pilots.items()}
    # The calibrated clock (the full analysis' T and q): seconds of the updates made.
    secs = {r.name: _calibrated_s(full, r) for rs in pilots.values() for r in rs}
    qs = {
        k: [r.final_responses / secs[r.name] for r in rs if secs[r.name] > 0]
        for k, rs in pilots.items()
    }
    ref = full.reference
    n_ref = preds[ref] if all(v is not None for v in preds[ref]) else None
    rows = []
    for k in pilots:
        n_k = preds[k] if all(v is not None for v in preds[k]) else None
        if k == ref and n_k is not None:
            one = exact_one(len(n_k))
            r_n, r_q, r_t = one, one, one
        else:
            timing = step_time_log_ratios(full.step_rounds, k.key, ref.key)
            r_n, r_q, r_t = ratio_estimates(
                n_k, qs[k] or None, n_ref, qs[ref] or None, n_boot, full.level, seed,
                full.method, timing,
            )  # fmt: skip
        bound, note = None, ""
        if n_k is None:
            if method == "intermediate" and n_ref is not None:
                # A seed still running short of the window was watched for less: up to
                # its last evaluation (its N lies beyond that, not beyond the window).
                covered = [
                    window
                    if full.targets[r.name].finished or r.final_responses >= window
                    else min(window, float(r.eval_responses[-1]) if r.eval_responses.size else 0.0)
                    for r in full.runs_by_key[k]
                ]
                bound = pilot_lower_bound(preds[k], covered, n_ref)
                missed = sum(v is None for v in preds[k])
                note = (
                    f"level {level:.3g} not reached in the pilot window by "
                    f"{missed}/{len(preds[k])} seeds"
                )
                if any(c < window for c in covered):
                    note += " (some still running short of the window)"
            elif method == "intermediate":
                note = "no prediction (the reference shows no learning in the window)"
            else:
                note = "predicted not to reach the target"
        rows.append(PlanRow(k, r_n, r_q, r_t, n_k is not None and n_ref is not None, bound, note))
    ranked = _rank(rows)
    pick = ranked[0].key if ranked and ranked[0].reached and ranked[0].r_t else None

    best_plan = plan_full(full)
    best = best_plan.best
    pilot_cost = sum(secs.values())
    sweep_cost = sum(_calibrated_s(full, r) for r in all_runs)
    comparison = PilotComparison(
        fraction=fraction,
        method=method,
        level=level,
        window_responses=window,
        pilot_cost_s=pilot_cost,
        sweep_cost_s=sweep_cost,
        pick=pick,
        best=best,
        pick_r_t_full=None if pick is None else full.ratios[pick].r_t,
        best_r_t_full=None if best is None else full.ratios[best].r_t,
    )
    note = "" if n_ref is not None else "the reference gives no prediction: no ranking"
    return _ranked_plan("pilot", full.target, ref, ranked, comparison, note)


def _est_json(e: Estimate | None, missing: str = NOT_REACHED) -> dict[str, float | None] | str:
    return missing if e is None else e.to_json()


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """JSON object of a plan (``plan.json``); missing estimates are "not reached" (or
    "incomplete" while seeds that have not reached are still running)."""
    obj: dict[str, Any] = {
        "mode": plan.mode,
        "target": plan.target,
        "reference": plan.reference.name,
        "recommendation": None if plan.recommendation is None else plan.recommendation.name,
        "recommended_batch": None if plan.recommendation is None else plan.recommendation.batch,
        "best": None if plan.best is None else plan.best.name,
        "candidates": [k.name for k in plan.candidates],
        "recommended_set": [k.name for k in plan.recommended_set],
        "recommended_batches": [k.batch for k in plan.recommended_set],
        "seeds_to_separate": plan.seeds_to_separate,
        "sentence": plan.verdict,
        "verdict": plan.verdict,
        "equivalence_delta": plan.delta,
        "pairs": [
            {
                "config": p.key.name,
                "against": p.best.name,
                "verdict": p.verdict,
                "t_ratio_90": p.ratio.to_json(),
                "t_ratio_95": p.ratio_diff.to_json(),
                "seeds_to_decide": p.seeds,
            }
            for p in plan.pairs
        ],
        "edge": plan.edge,
        "note": plan.note,
        "rows": [
            {
                "config": r.key.name,
                "algo": r.key.algo,
                "prompts": r.key.prompts,
                "group_size": r.key.group_size,
                "batch": r.key.batch,
                "lr_rule": r.key.lr_rule,
                "r_n": _est_json(r.r_n, r.missing_label),
                "r_q": _est_json(r.r_q),
                "r_t": _est_json(r.r_t, _time_label(r)),
                "reached": r.reached,
                "r_n_lower_bound": r.r_n_lower_bound,
                "time_to_target_s": (
                    _est_json(r.time_to_target_s, r.missing_label) if plan.mode == "full" else None
                ),
                "note": r.note,
            }
            for r in plan.rows
        ],
    }
    p = plan.pilot
    if p is not None:
        obj["pilot"] = {
            "fraction": p.fraction,
            "method": p.method,
            "level": p.level,
            "window_responses": p.window_responses,
            "pilot_cost_s": p.pilot_cost_s,
            "sweep_cost_s": p.sweep_cost_s,
            "cost_fraction": p.cost_fraction,
            "pick": None if p.pick is None else p.pick.name,
            "best": None if p.best is None else p.best.name,
            "pick_r_t_full": _est_json(p.pick_r_t_full),
            "best_r_t_full": _est_json(p.best_r_t_full),
            "regret": p.regret,
        }
    return obj


def _pairs_table(plan: Plan) -> list[str]:
    """Each configuration against the best: T ratio at 90 % and 95 %, the verdict at
    ``1 +- delta`` and the seeds that would decide it."""
    if not plan.pairs:
        return []
    lines = [
        "",
        f"Against the best ({plan.best.name}), equivalence margin delta = {plan.delta:g}:",
        "",
        "| config | batch | T / T(best), 90 % | 95 % | verdict | seeds to decide |",
        "|---|---:|---|---|---|---:|",
    ]
    for p in plan.pairs:
        seeds = "-" if p.verdict != equivalence.UNDECIDED else (p.seeds or "> 100")
        lines.append(
            f"| {p.key.name} | {p.key.batch} | {p.ratio.fmt('.4g')} | {p.ratio_diff.fmt('.4g')} | "
            f"{p.verdict} | {seeds} |"
        )
    return lines + [""]


def _time_label(row: PlanRow) -> str:
    """What a missing T/T_ref reads: "no timing" when r_N is there but r_q is not."""
    return NO_TIMING if row.r_n is not None and row.r_q is None else row.missing_label


def format_plan_table(plan: Plan) -> str:
    """Plain-text (markdown) table of a plan, best first, with the recommendation."""
    pred = "predicted " if plan.mode == "pilot" else ""
    lines = [
        f"| rank | config | batch | {pred}r_N | r_q | {pred}T/T_ref | note |",
        "|---:|---|---:|---|---|---|---|",
    ]
    for i, r in enumerate(plan.rows, start=1):
        r_n = fmt_estimate(r.r_n, missing=r.missing_label)
        if r.r_n is None and r.r_n_lower_bound is not None:
            r_n = f">= {r.r_n_lower_bound:.3g}"
        star = " *" if r.key in plan.recommended_set else (" ~" if r.key in plan.candidates else "")
        r_q = fmt_estimate(r.r_q, missing="-")
        lines.append(
            f"| {i} | {r.key.name}{star} | {r.key.batch} | {r_n} | {r_q}"
            f" | {fmt_estimate(r.r_t, missing=_time_label(r))} | {r.note} |"
        )
    lines.append("")
    lines.append(
        f"Reference: {plan.reference.name} (batch {plan.reference.batch}); target {plan.target:g}."
        " `*` the recommended set; `~` candidates not yet told apart from the best."
    )
    lines += _pairs_table(plan)
    verdict = plan.verdict
    lines.append(f"Recommendation: {verdict}{'' if verdict.endswith('.') else '.'}")
    if plan.edge:
        lines.append(f"**Edge of the grid:** {plan.edge}")
    if plan.note:
        lines.append(f"Note: {plan.note}.")
    p = plan.pilot
    if p is not None:
        level = "" if p.level is None else f", level {p.level:.3g}"
        saved = p.sweep_cost_s - p.pilot_cost_s
        lines.append(
            f"Pilot ({p.method}{level}): first {p.fraction:g} of the runway "
            f"({p.window_responses:.0f} responses), cost {p.pilot_cost_s:.4g} s on the "
            f"calibrated clock = {p.cost_fraction:.1%} of the full sweep's "
            f"{p.sweep_cost_s:.4g} s: it saves {saved:.4g} s ({1 - p.cost_fraction:.1%})"
            + (
                "; little: most runs end inside the window (at the target or the budget)."
                if p.cost_fraction > PILOT_SAVES_LITTLE
                else "."
            )
        )
        if p.pick is not None and p.best is not None:
            lines.append(
                f"Pilot pick {p.pick.name}: T/T_ref {fmt_estimate(p.pick_r_t_full)} in the full "
                f"sweep; best {p.best.name}: {fmt_estimate(p.best_r_t_full)}; "
                f"T(pick)/T(best) = {p.regret:.3f}."
            )
    return "\n".join(lines)
