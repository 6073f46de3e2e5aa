r"""Does a study's answer survive a rerun? Two (or more) sweeps of one study, side by side.

  python -m experiments.compare_studies --sweeps=sweeps/run_a,sweeps/run_b

Prints, per sweep, its wall time and host load (``commands.jsonl``), the findings table
(measurement, interval, verdict), the largest 95% half-width of r_N and T/T_ref over its
configurations, and the planner's verdict; then whether the findings verdicts agree and
whether the recommendation sets (the recommendation, or the candidates that cannot be
told apart) overlap; with more than two sweeps, how many pairs of them agree on every
verdict. Exit status 1 when a verdict differs or the sets do not overlap.

``--target`` re-reads every sweep at another validation target (exact for runs that went
past it: training does not depend on the target), and each sweep's text says what its
runs would have spent had they stopped there.

``--pool`` then analyses all their runs as one sweep (``curves.pool_sweeps``: a seed run
by several sweeps counts once; T and q from the first sweep's calibration) and prints
its findings table with the same lines: the answer at the seeds of all of them.
"""

from __future__ import annotations

import itertools
import math
import sys
from typing import Any, NamedTuple

from absl import flags

from experiments import cli
from rl_batch import provenance
from rl_batch.analysis import analyze_sweep, critical_batch, findings, load_sweep, planner
from rl_batch.analysis.curves import pool_sweeps
from rl_batch.analysis.figures import load_generation

_SWEEPS = flags.DEFINE_list("sweeps", None, "Sweep directories of one study.", required=True)
_POOL = flags.DEFINE_bool("pool", False, "Also analyse all their runs as one sweep.")
_TARGET = flags.DEFINE_float("target", None, "Re-read at this target (default: each sweep's).")


def half_widths(analysis) -> tuple[dict[str, float], list[str]]:
    """Largest (hi - lo) / 2 of r_N and of T/T_ref over the configurations that reached
    the target in every seed (inf when one of them has no interval, e.g. one seed), and
    the names of those that did not reach (no ratio, no interval)."""
    worst = {"r_N": 0.0, "T/T_ref": 0.0}
    not_reached = []
    for key, r in analysis.ratios.items():
        if key == analysis.reference:
            continue
        if not analysis.stats[key].reached:
            not_reached.append(key.name)
            continue
        for name, e in (("r_N", r.r_n), ("T/T_ref", r.r_t)):
            hw = math.inf if e is None or not e.has_interval else (e.hi - e.lo) / 2
            worst[name] = max(worst[name], hw)
    return worst, not_reached


def stop_time(sweep, target: float) -> tuple[float, float]:
    """(training + validation seconds of the sweep's runs up to their first validation at
    or above ``target``, the seconds they spent): what stopping at ``target``
    (``stop_at_target``) would have cost, compilation and checkpoints aside. A run that
    never reached ``target`` counts whole."""
    to_target = spent = 0.0
    for run in sweep.runs:
        records = run.eval_records
        eval_s = [0.0]  # validation seconds before the first validation, then after each
        for e in records:
            eval_s.append(eval_s[-1] + float(e.get("time_eval_s") or 0.0))
        train_s = [float(e.get("time_train_cum_s") or 0.0) for e in records]
        whole = max([run.final_time_train, *train_s]) + eval_s[-1]
        spent += whole
        first = next((i for i, e in enumerate(records) if e["eval_accuracy"] >= target), None)
        to_target += whole if first is None else train_s[first] + eval_s[first + 1]
    return to_target, spent


class Study(NamedTuple):
    """One sweep's answer: its findings, plan, half-widths, text and target."""

    found: list
    plan: Any
    hw: dict[str, float]
    text: str
    target: float


def study(sweep_dir: str, sweep=None, target: float | None = None) -> Study:
    """`Study` of one sweep at ``target`` (default: the sweep's; ``sweep``: a pooled one,
    whose calibration and command are ``sweep_dir``'s)."""
    pooled = sweep is not None
    sweep = sweep or load_sweep(sweep_dir)
    analysis = analyze_sweep(sweep, target)
    runs = [r for rs in analysis.runs_by_key.values() for r in rs]
    found = findings.study_findings(
        analysis, load_generation(sweep_dir, runs), critical_batch.DEFAULT_TOL
    )
    plan = planner.plan_full(analysis)
    hw, not_reached = half_widths(analysis)
    seeds = sorted({s.n_seeds for s in analysis.stats.values()})
    when = f"pooled; T and q from {sweep_dir}'s calibration" if pooled else None
    lines = [
        f"## {sweep.sweep_dir}",
        "",
        f"- {when or provenance.describe_last_command(sweep_dir)[1]}",
        f"- {len(runs)} runs, {'/'.join(map(str, seeds))} seeds per configuration",
    ]
    lines += [
        f"- largest 95% half-width over the configurations that reached: r_N "
        f"{hw['r_N']:.3g}, T/T_ref {hw['T/T_ref']:.3g}; not reached in every seed: "
        f"{', '.join(not_reached) or 'none'}"
    ]
    to_target, spent = stop_time(sweep, analysis.target)
    lines += [
        f"- target {analysis.target:g}: stopping at the first validation at or above it, the "
        f"runs' training + validation would take {to_target:.0f} s of the {spent:.0f} s they "
        f"spent ({to_target / spent if spent else 1.0:.2f})"
        if analysis.timed
        else f"- target {analysis.target:g}: no timing in the runs (N* and r_N only)"
    ]
    lines += [f"- planner: {plan.verdict}", ""]
    lines += ["| finding | measured | verdict |", "|---|---|---|"]
    lines += [f"| {f.name} | {f.measured} | {f.verdict} |" for f in found]
    return Study(found, plan, hw, "\n".join(lines) + "\n", analysis.target)


def recommendation_set(plan) -> set[str]:
    """The recommendation, or the candidates it cannot tell apart (by name)."""
    if plan.recommendation is not None:
        return {plan.recommendation.name}
    return {k.name for k in plan.candidates}


def agreeing_pairs(verdicts: list[list[str]]) -> tuple[int, int]:
    """(pairs of sweeps whose verdicts are all the same, pairs): with more than two
    sweeps, how often a rerun of the study would give the same table."""
    pairs = list(itertools.combinations(verdicts, 2))
    return sum(a == b for a, b in pairs), len(pairs)


def compare_findings(found: list[list]) -> tuple[list[str], bool, list[list[str]]]:
    """The findings of several sweeps paired by name (not by position: a PPO study's
    table has findings a GRPO study's lacks).

    Args:
      found: per sweep, its findings (each with ``name`` and ``verdict``).

    Returns:
      (one line per finding name, whether every finding that all sweeps have has one
      verdict, per sweep the verdicts of those shared findings in one order). A finding
      that only some sweeps have is listed as not compared.
    """
    names = list(dict.fromkeys(f.name for fs in found for f in fs))
    by_name = [{f.name: f.verdict for f in fs} for fs in found]
    shared = [n for n in names if all(n in v for v in by_name)]
    lines = []
    for name in names:
        verdicts = [v.get(name, "-") for v in by_name]
        if name not in shared:
            mark = "not in every sweep: not compared"
        else:
            mark = "same" if len(set(verdicts)) == 1 else "DIFFERENT"
        lines.append(f"- {name}: {' / '.join(verdicts)} ({mark})")
    agree = bool(shared) and all(len({v[n] for v in by_name}) == 1 for n in shared)
    if not shared:
        lines.append("- no finding is in every sweep: nothing to compare")
    return lines, agree, [[v[n] for n in shared] for v in by_name]


def target_line(targets: list[float]) -> str | None:
    """A line saying the sweeps' targets differ (their N*, T and verdicts are then
    answers to different questions), or None when they are one."""
    if len(set(targets)) == 1:
        return None
    return (
        "- targets differ: " + " / ".join(f"{t:g}" for t in targets) + " (the findings answer "
        "different questions; --target re-reads every sweep at one)"
    )


def main(argv):
    del argv
    results = [study(d, target=_TARGET.value) for d in _SWEEPS.value]
    for result in results:
        print(result.text)
    lines, agree, verdicts = compare_findings([r.found for r in results])
    sets = [recommendation_set(r.plan) for r in results]
    overlap = set.intersection(*sets)
    print("## Across sweeps\n")
    differ = target_line([r.target for r in results])
    if differ:
        print(differ)
    print("\n".join(lines))
    print("- recommendation sets: " + " / ".join(", ".join(sorted(s)) for s in sets))
    print(f"- overlap: {', '.join(sorted(overlap)) or 'none'}")
    print(f"- findings verdicts agree: {agree}")
    if len(results) > 2:
        same, pairs = agreeing_pairs(verdicts)
        print(f"- pairs of sweeps with every verdict the same: {same} of {pairs}")
    if _POOL.value:
        pooled = pool_sweeps([load_sweep(d) for d in _SWEEPS.value])
        print("\n" + study(_SWEEPS.value[0], pooled, _TARGET.value).text)
    sys.exit(0 if agree and overlap else 1)


if __name__ == "__main__":
    cli.run(main)
