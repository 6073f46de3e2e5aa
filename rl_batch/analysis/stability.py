"""How often each finding's verdict comes out the same on other seeds (a seed bootstrap).

A verdict whose measurement sits near its decision line can flip between two runs of
the study with different seeds although each run's interval is right: the default CPU
study's "B = P x G is the batch unit" (holds inside [0.833, 1.2]) read N*(16x8) /
N*(8x16) as 0.911 [0.845, 0.981] (holds) on seeds 40-53 and 0.915 [0.805, 1.04]
(undecided) on seeds 0-11. A report should say which of its verdicts are that fragile.

``seed_shares`` resamples the sweep's seeds with replacement, as many as it has: a
drawn seed brings its run of every configuration, relabelled as a new seed, so runs
that share random numbers (``time_to_target.matched_pair``) stay paired. Each resample
is analysed as the sweep was (``reanalyze``), every finding is decided again and the
planner's recommendation set (``planner.plan_full``) formed again, in one pass. The
share of resamples that reach each verdict (or hold a configuration in the set)
estimates how often a rerun with as many fresh seeds would. These are the bootstrap's
estimates from the seeds at hand: they treat the sweep's spread as the truth's and keep
the sweep's timing (calibration) in every resample, so they speak of seed noise only.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from rl_batch.analysis import planner
from rl_batch.analysis.curves import RunData, Sweep
from rl_batch.analysis.findings import Finding
from rl_batch.analysis.time_to_target import Analysis, reanalyze, run_is_usable
from rl_batch.artifacts import Configuration

DEFAULT_RESAMPLES = 200  # share's standard error <= 3.5 points


def resample_seeds(sweep: Sweep, drawn: Sequence[int]) -> Sweep:
    """``sweep`` with the runs of seeds ``drawn`` (repeats allowed): the i-th drawn seed's
    runs, of every configuration, become seed i (named ``<run>@i``)."""
    by_seed: dict[int, list[RunData]] = collections.defaultdict(list)
    for run in sweep.runs:
        if run.seed is not None:
            by_seed[run.seed].append(run)
    runs = [
        dataclasses.replace(run, seed=i, name=f"{run.name}@{i}")
        for i, seed in enumerate(drawn)
        for run in by_seed[seed]
    ]
    return dataclasses.replace(sweep, runs=tuple(runs))


def resampled(analysis: Analysis, resamples: int, seed: int = 0) -> Iterator[Analysis]:
    """Analyses of ``resamples`` draws of the sweep's seeds with replacement (as many as
    it has; none when it has fewer than 2 seeds). A draw without a usable run of the
    reference (its seeds' reference runs failed or are missing) is left out."""
    seeds = sorted({r.seed for r in analysis.sweep.runs if r.seed is not None})
    if len(seeds) < 2:
        return
    rng = np.random.default_rng(seed)
    for _ in range(resamples):
        drawn = rng.choice(seeds, size=len(seeds), replace=True)
        sweep = resample_seeds(analysis.sweep, drawn.tolist())
        if any(r.key == analysis.reference and run_is_usable(r)[0] for r in sweep.runs):
            yield reanalyze(analysis, sweep)


@dataclasses.dataclass(frozen=True)
class Shares:
    """What resamples of a sweep's seeds decide (``seed_shares``).

    Attributes:
      resamples: the resamples drawn.
      used: those analysed (a draw without a usable reference run is left out).
      verdicts: finding name -> {verdict: share of the used resamples that reach it}.
      in_set: configuration -> share whose recommendation set (``planner.plan_full``'s
        candidates) holds it, most frequent first.
      best: configuration -> share in which it has the best mean T.
    """

    resamples: int
    used: int
    verdicts: dict[str, dict[str, float]]
    in_set: dict[Configuration, float]
    best: dict[Configuration, float]


def seed_shares(
    analysis: Analysis,
    decide: Callable[[Analysis], list[Finding]] | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Shares | None:
    """Verdict and recommendation shares over one set of seed resamples.

    Args:
      analysis: the sweep's analysis (its sweep's runs are resampled).
      decide: the findings of an analysis (``findings.study_findings`` with the report's
        generation report and tolerance); None: recommendation shares only.
      resamples: bootstrap resamples.
      seed: the resampling rng's seed.

    Returns:
      The shares over the analysable resamples (``resampled``), or None when there is
      none (fewer than 2 seeds).
    """
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    in_set: collections.Counter = collections.Counter()
    best: collections.Counter = collections.Counter()
    n = 0
    for a in resampled(analysis, resamples, seed):
        n += 1
        for f in decide(a) if decide is not None else ():
            counts[f.name][f.verdict] += 1
        plan = planner.plan_full(a)
        in_set.update(plan.candidates)
        best.update([plan.best] if plan.best is not None else [])
    if not n:
        return None
    return Shares(
        resamples,
        n,
        {name: {v: k / n for v, k in c.most_common()} for name, c in counts.items()},
        {k: c / n for k, c in in_set.most_common()},
        {k: c / n for k, c in best.most_common()},
    )


def recommendation_sentence(shares: Shares | None) -> str:
    """How often each configuration is in the recommendation set over the seed resamples
    ("" without shares)."""
    if shares is None or not shares.in_set:
        return ""
    names = ", ".join(f"{k.name} (batch {k.batch}) {_pct(s)}" for k, s in shares.in_set.items())
    firsts = ", ".join(f"{k.name} {_pct(s)}" for k, s in shares.best.items())
    return (
        f"Over {shares.resamples} resamples of the seeds (as in the findings table), the "
        f"recommendation set held {names}; best mean: {firsts}."
    )


def fmt_shares(own: str, shares: dict[str, float]) -> str:
    """``"71% (undecided at this power 29%)"``: the share of resamples that reach the
    sweep's own verdict ``own``, then the others'."""
    others = ", ".join(f"{v} {_pct(s)}" for v, s in shares.items() if v != own and s > 0)
    return _pct(shares.get(own, 0.0)) + (f" ({others})" if others else "")


def _pct(share: float) -> str:
    return "<1%" if 0 < share < 0.005 else f"{share:.0%}"
