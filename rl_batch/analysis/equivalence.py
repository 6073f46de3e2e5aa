"""Equivalent, slower or undecided: the pairwise rule behind a plain recommendation.

Every reached, timed configuration k is compared with the best (the smallest mean T)
on ``T(k) / T(best)`` (`time_to_target.Analysis.ratio`: seed by seed for a matched pair,
with the calibration's timing noise where T is calibrated):

- *equivalent* when two one-sided tests at ``alpha`` (5 %) both reject a difference of
  more than ``delta``: the ``1 - 2 alpha`` (90 %) interval of the ratio lies inside
  ``[1 - delta, 1 + delta]`` (``delta``: the sweep's ``equivalence_delta``, 0.05 by
  default);
- *slower* when the ``1 - alpha`` (95 %) interval lies above 1;
- *undecided* otherwise, with the seeds per configuration at which the same spread
  would decide it either way (`intervals.seeds_to_decide`).

The recommended set is the best and every configuration equivalent to it, once no
configuration is undecided; `sentence` says it in one line: "Use B = 16 or 32 (...): T
within 3 % of each other (...), both faster than the next, B = 64, which takes 12-14 %
longer (...)", or which comparison how many more seeds would decide.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rl_batch.analysis import intervals
from rl_batch.analysis.time_to_target import (
    Analysis,
    Estimate,
    matched_pair,
    seed_values,
)
from rl_batch.artifacts import Configuration

EQUIVALENT = "equivalent"
SLOWER = "slower"
UNDECIDED = "undecided"
ALPHA = 0.05  # each one-sided test's level (equivalence: 90 % interval; difference: 95 %)


@dataclasses.dataclass(frozen=True)
class PairVerdict:
    """One configuration against the best.

    Attributes:
      key: the configuration.
      best: the configuration with the smallest mean T.
      ratio: ``T(key) / T(best)`` with its ``1 - 2 alpha`` interval (the equivalence test).
      ratio_diff: the same with its ``1 - alpha`` interval (the difference test).
      verdict: `EQUIVALENT`, `SLOWER` or `UNDECIDED`.
      seeds: undecided only: seeds per configuration that would decide it (``None``:
        unknown, fewer than 2 seeds, or more than 100).
      n_seeds: seeds per configuration now (the fewer of the two).
    """

    key: Configuration
    best: Configuration
    ratio: Estimate
    ratio_diff: Estimate
    verdict: str
    seeds: int | None
    n_seeds: int


def _verdict(eq: Estimate, diff: Estimate, delta: float) -> str:
    if eq.has_interval and 1 - delta <= eq.lo and eq.hi <= 1 + delta:
        return EQUIVALENT
    if diff.has_interval and diff.lo > 1:
        return SLOWER
    return UNDECIDED


def _seeds_to_decide(analysis: Analysis, key: Configuration, best: Configuration) -> int | None:
    """`intervals.seeds_to_decide` on the two configurations' per-seed (N*, q)."""
    s_k, s_b = analysis.stats[key], analysis.stats[best]
    paired = matched_pair(s_k.runs, s_b.runs)
    cols = [(seed_values(s, "n_star", paired), seed_values(s, "q", paired)) for s in (s_k, s_b)]
    if any(v is None for pair in cols for v in pair):
        return None
    (n_k, q_k), (n_b, q_b) = cols
    a = [[n, q] for n, q in zip(n_k, q_k)]
    ref = [[n, q] for n, q in zip(n_b, q_b)]
    return intervals.seeds_to_decide(a, ref, [1.0, -1.0], analysis.delta, ALPHA, paired)


def compare(analysis: Analysis, key: Configuration, best: Configuration) -> PairVerdict | None:
    """``key`` against ``best`` (module docstring); ``None`` when either has no T (did not
    reach in every seed, or untimed)."""
    eq = analysis.ratio(key, best, level=1 - 2 * ALPHA).r_t
    diff = analysis.ratio(key, best, level=1 - ALPHA).r_t
    if eq is None or diff is None:
        return None
    verdict = _verdict(eq, diff, analysis.delta)
    seeds = _seeds_to_decide(analysis, key, best) if verdict == UNDECIDED else None
    n = min(analysis.stats[key].n_seeds, analysis.stats[best].n_seeds)
    return PairVerdict(key, best, eq, diff, verdict, seeds, n)


def compare_all(
    analysis: Analysis, best: Configuration, keys: Sequence[Configuration]
) -> tuple[PairVerdict, ...]:
    """`compare` of every other configuration in ``keys`` (those with a T), in order."""
    found = (compare(analysis, k, best) for k in keys if k != best)
    return tuple(p for p in found if p is not None)


def labeller(keys: Sequence[Configuration]):
    """``k -> "B = 16"`` when k's batch is unique among ``keys``, else its name."""
    batches = [k.batch for k in keys]

    def label(k: Configuration) -> str:
        return f"B = {k.batch}" if batches.count(k.batch) == 1 else k.name

    return label


def _or(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _use(members: Sequence[Configuration], label) -> str:
    """``B = 16 or 32 (name, name)``, or the names where a batch is not unique."""
    names = ", ".join(k.name for k in members)
    if all(label(k).startswith("B = ") for k in members):
        return "B = " + _or([str(k.batch) for k in members]) + f" ({names})"
    return _or([k.name for k in members])


def _pct(x: float) -> str:
    return f"{100 * x:.2g} %" if abs(x) < 0.1 else f"{100 * x:.0f} %"


def _interval(e: Estimate, level: str) -> str:
    if not e.has_interval:
        return e.fmt()
    return f"{e.mean:.4g}, {level} interval [{e.lo:.4g}, {e.hi:.4g}]"


def sentence(
    analysis: Analysis,
    best: Configuration | None,
    pairs: Sequence[PairVerdict],
    keys: Sequence[Configuration],
) -> str:
    """The plan's first sentence (module docstring); ``keys`` name the batches (B = 16
    where unique)."""
    if best is None:
        return ""
    label, delta = labeller(keys), analysis.delta
    equal = [p for p in pairs if p.verdict == EQUIVALENT]
    open_ = [p for p in pairs if p.verdict == UNDECIDED]
    slower = sorted((p for p in pairs if p.verdict == SLOWER), key=lambda p: p.ratio.mean)
    members = [best, *(p.key for p in equal)]
    if open_:
        return _undecided_sentence(best, equal, open_, label, delta)
    out = f"Use {_use(members, label)}"
    if equal:
        widest = max(equal, key=lambda p: max(p.ratio.hi - 1, 1 - p.ratio.lo))
        x = max(widest.ratio.hi - 1, 1 - widest.ratio.lo)
        words = "of each other" if len(equal) == 1 else f"of {label(best)}"
        out += (
            f": T within {_pct(x)} {words} (T({label(widest.key)}) / T({label(best)}) = "
            f"{_interval(widest.ratio, '90 %')}, inside 1 ± {delta:g})"
        )
    if not slower:
        others = "" if pairs else "; no other configuration reached the target with a T"
        return out + others + "."
    nxt = slower[0].key
    gains = [analysis.ratio(nxt, k, level=1 - ALPHA).r_t for k in members]
    lo, hi = min(g.mean for g in gains) - 1, max(g.mean for g in gains) - 1
    span = _pct(lo) if abs(hi - lo) < 0.005 else f"{_pct(lo)[:-2]}-{_pct(hi)}"
    who = "" if len(members) == 1 else ("both " if len(members) == 2 else "all ")
    shown = "; ".join(
        f"T({label(nxt)}) / T({label(k)}) = {_interval(g, '95 %')}" for k, g in zip(members, gains)
    )
    return (
        out + f"{',' if equal else ':'} {who}faster than the next, {label(nxt)}, which takes "
        f"{span} longer ({shown})."
    )


def _undecided_sentence(best, equal, open_, label, delta) -> str:
    """Which comparisons remain undecided and how many seeds would decide them."""
    head = f"Undecided at this power: {label(best)} has the smallest mean T"
    if equal:
        head += f"; {_or([label(p.key) for p in equal])} within {delta:g} of it (shown)"
    parts = []
    for p in open_:
        ratio = f"T({label(p.key)}) / T({label(best)}) = {_interval(p.ratio, '90 %')}"
        if p.n_seeds < 2:
            more = "an interval first (2+ seeds per configuration)"
        elif p.seeds is None:
            more = "more than 100 seeds per configuration"
        else:
            n = max(p.seeds - p.n_seeds, 1)
            more = f"about {n} more seed{'s' if n > 1 else ''} per configuration"
        parts.append(
            f"{more} would tell {label(best)} from {label(p.key)} at delta = {delta:g} ({ratio})"
        )
    return head + "; " + "; ".join(parts) + "."
