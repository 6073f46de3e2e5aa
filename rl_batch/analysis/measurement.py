"""How the sweep measured: estimator, validation noise, seed noise, throughput noise.

The report's "Measurement" section, from the same runs as the rest of it:

- *Estimator*: N*, T and q at the single target, or the band means over
  ``[target_band_lo, target]`` (``rl_batch.targets.time_to_band``), with the other
  estimator's r_N beside it.
- *Validation noise*: with ``eval_metric="p_ref"`` each eval line holds both the exact
  p(reference) and the sampled mean@k of the same policy; the RMS of their difference
  is the sampling noise that an N* on mean@k would carry (accuracy units).
- *Seed noise*: the coefficient of variation of N* over each configuration's seeds
  (training noise once validation is exact).
- *Throughput noise*: runs with identical compute per update (same P and G, any LR rule
  or seed) should have equal measured q; their spread is host contention. With a
  calibration (``rl_batch.sweeps.calibrate``) the analysis uses the calibrated q, shown beside.
- *Power*: each ratio's interval half-width (ratio units) and the seeds per configuration
  at which it would reach ``POWER_HALF_WIDTH`` with the spread measured here
  (`intervals.seeds_for_half_width`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from rl_batch import targets
from rl_batch.analysis import intervals
from rl_batch.analysis import time_to_target as ttt
from rl_batch.analysis.time_to_target import Analysis, StepRounds, fmt_estimate, markdown_table

Q_DISAGREEMENT = 0.10  # measured q of identical-compute runs: max/min above 1 + this warns
POWER_HALF_WIDTH = 0.2  # the ratio half-width a decided study aims at (ratio units)
MAX_SEEDS = 100


@dataclasses.dataclass(frozen=True)
class ComputeGroup:
    """Runs that do identical compute per update (same P x G) and their measured q."""

    prompts: int
    group_size: int
    runs: tuple[str, ...]
    q_measured: tuple[float, ...]

    @property
    def spread(self) -> float:
        """max / min - 1 of the measured q (0 for one run)."""
        return max(self.q_measured) / min(self.q_measured) - 1.0


def compute_groups(analysis: Analysis) -> list[ComputeGroup]:
    """Runs grouped by (P, G) with their measured q (runs without a q left out)."""
    groups: dict[tuple[int, int], list[tuple[str, float]]] = {}
    for key, runs in analysis.runs_by_key.items():
        for r in runs:
            t = analysis.targets[r.name]
            q = t.q_measured if t.calibrated else t.q
            if q is not None and q > 0:
                groups.setdefault((key.prompts, key.group_size), []).append((r.name, q))
    return [
        ComputeGroup(p, g, tuple(n for n, _ in v), tuple(q for _, q in v))
        for (p, g), v in sorted(groups.items())
    ]


def drift_words(step_rounds: StepRounds) -> str:
    """What the intervals of r_q and T/T_ref take from a calibration in blocks."""
    tau2, df = step_rounds.drift
    sizes = [step_rounds.blocks.count(b) for b in sorted(set(step_rounds.blocks))]
    return (
        f"The intervals of r_q and T/T_ref add, to the seeds' spread, the step-time ratio's "
        f"spread within the calibration's {len(sizes)} blocks ({' + '.join(map(str, sizes))} "
        f"rounds, before and after the runs) and how far one configuration's step time "
        f"relative to the others' moved between blocks: {math.sqrt(tau2):.3f} on the log "
        f"scale ({df:.0f} df; `intervals.block_drift`)."
    )


def q_warnings(analysis: Analysis, tol: float = Q_DISAGREEMENT) -> list[str]:
    """One line per identical-compute group whose measured q disagrees by more than tol."""
    out = []
    for grp in compute_groups(analysis):
        if len(grp.runs) > 1 and grp.spread > tol:
            lo, hi = min(grp.q_measured), max(grp.q_measured)
            then = (
                "T and q below use the calibrated step times"
                if analysis.calibrated
                else "T and q below carry it: run `python -m experiments.calibrate`"
            )
            out.append(
                f"runs with identical compute ({grp.prompts}x{grp.group_size}, "
                f"{len(grp.runs)} runs) disagree in measured q by {grp.spread:.0%} "
                f"({lo:.4g} to {hi:.4g} responses/s): host contention; {then}."
            )
    return out


def validation_noise(analysis: Analysis) -> tuple[float, int] | None:
    """RMS of (sampled mean@k - exact p_ref) over every eval line that has both, and the
    number of lines; None when no run logged both."""
    diffs = [
        float(e["eval_mean_at_k"]) - float(e["eval_p_ref"])
        for runs in analysis.runs_by_key.values()
        for r in runs
        for e in r.eval_records
        if e.get("eval_p_ref") is not None and e.get("eval_mean_at_k") is not None
    ]
    if not diffs:
        return None
    return float(np.sqrt(np.mean(np.square(diffs)))), len(diffs)


def validation_metric(analysis: Analysis) -> str:
    """The eval lines' ``eval_metric`` (``mean_at_k`` for runs that predate the field)."""
    for runs in analysis.runs_by_key.values():
        for r in runs:
            for e in r.eval_records:
                return str(e.get("eval_metric", "mean_at_k"))
    return "mean_at_k"


def _cv(values: Sequence[float]) -> float | None:
    v = np.asarray(values, float)
    if len(v) < 2:
        return None
    return float(v.std(ddof=1) / v.mean())


def _cv_cell(values: Sequence[float | None]) -> str:
    if any(v is None for v in values):
        return "-"
    cv = _cv(values)  # type: ignore[arg-type]
    return "-" if cv is None else f"{cv:.2f}"


def _half_width(e: ttt.Estimate | None) -> float | None:
    if e is None or e.exact or not (np.isfinite(e.lo) and np.isfinite(e.hi)):
        return None
    return (e.hi - e.lo) / 2.0


@dataclasses.dataclass(frozen=True)
class Power:
    """One configuration's ratio half-widths and the seeds that would bring them to
    ``half_width`` (``None``: no interval, or more than ``MAX_SEEDS``)."""

    name: str
    batch: int
    seeds: int
    r_n_half: float | None
    r_n_seeds: int | None
    r_t_half: float | None
    r_t_seeds: int | None


def _fields(stats: ttt.ConfigStats, names: Sequence[str]) -> np.ndarray:
    """[seeds, len(names)] of each seed's ``RunTarget`` fields (NaN where missing), in
    seed order."""
    runs = ttt.by_seed(stats.runs)
    return np.array([[getattr(r, n) or np.nan for n in names] for r in runs], float)


def _seeds_needed(a, ref, names, weights, half_width, level) -> int | None:
    x, r = _fields(a, names), _fields(ref, names)
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(r))):
        return None
    paired = ttt.matched_pair(a.runs, ref.runs)
    return intervals.seeds_for_half_width(
        x, r, weights, half_width, level, MAX_SEEDS, paired=paired
    )


def power(analysis: Analysis, half_width: float = POWER_HALF_WIDTH) -> list[Power]:
    """`Power` of every configuration but the reference that reached the target."""
    ref = analysis.stats[analysis.reference]
    out = []
    for key, s in analysis.stats.items():
        if key == analysis.reference or not (s.reached and ref.reached):
            continue
        ratios, level = analysis.ratios[key], analysis.level
        out.append(
            Power(
                key.name,
                key.batch,
                s.n_seeds,
                _half_width(ratios.r_n),
                _seeds_needed(s, ref, ["n_star"], [1.0], half_width, level),
                _half_width(ratios.r_t),
                _seeds_needed(s, ref, ["n_star", "q"], [1.0, -1.0], half_width, level),
            )
        )
    return out


def power_lines(analysis: Analysis, half_width: float = POWER_HALF_WIDTH) -> list[str]:
    """The power table and its one-sentence summary."""
    rows = power(analysis, half_width)
    if not rows:
        return []

    def cell(v, spec=".2f"):
        return "-" if v is None else format(v, spec)

    def seeds_cell(v):
        return f"> {MAX_SEEDS}" if v is None else str(v)

    table = [
        [p.name, str(p.batch), str(p.seeds), cell(p.r_n_half), seeds_cell(p.r_n_seeds)]
        + [cell(p.r_t_half), seeds_cell(p.r_t_seeds)]
        for p in rows
    ]
    halves = [h for p in rows for h in (p.r_n_half, p.r_t_half)]
    met = sum(h is not None and h <= half_width for h in halves)
    needed = [n for p in rows for n in (p.r_n_seeds, p.r_t_seeds)]
    most = f"> {MAX_SEEDS}" if any(n is None for n in needed) else str(max(needed))
    summary = (
        f"Power: {met} of {len(halves)} ratio intervals (r_N, T/T_ref) have half-width <= "
        f"{half_width:g} at the seeds run; with the seed spread measured here, every one "
        f"would at about {most} seeds per configuration."
    )
    header = ["config", "B", "seeds", "r_N half-width", f"seeds for r_N +-{half_width:g}"]
    header += ["T/T_ref half-width", f"seeds for T/T_ref +-{half_width:g}"]
    return [summary, ""] + markdown_table(header, table) + [""]


def estimator_words(analysis: Analysis) -> str:
    """How N*, T and q are read (the report's header and Measurement section say the same)."""
    if analysis.band_lo is None:
        return f"N*, T and q at the single target {analysis.target:g}"
    return (
        f"N*, T and q are geometric means over {targets.BAND_LEVELS} accuracy levels from "
        f"{analysis.band_lo:g} to the target {analysis.target:g} (the band)"
    )


def crossing_words(analysis: Analysis) -> str:
    """How a level's crossing is read off the evaluations (`targets.CROSSINGS`)."""
    if analysis.crossing == "update":
        return (
            "a level's N* is the first update at or after its crossing interpolated between "
            'two evaluations (`target_crossing="update"`: a batch of B responses reaches a '
            "level at a multiple of B)"
        )
    return (
        "a level's N* is its crossing interpolated between two evaluations "
        '(`target_crossing="linear"`; on average half a batch early)'
    )


def _all_prompt_keyed(analysis: Analysis) -> bool:
    return all(t.rollout_keys == "prompt" for t in analysis.targets.values())


def pairing_words(analysis: Analysis) -> str:
    """Which ratios are paired by seed (`time_to_target.matched_pair`)."""
    if _all_prompt_keyed(analysis):
        return (
            "every run keys each response by its prompt's position and member index "
            '(`rollout_keys="prompt"`): one seed gives every configuration the same prompts '
            "with the same random numbers (common random numbers), so every ratio between "
            "configurations that ran the same seeds compares them seed by seed (paired)"
        )
    return (
        "configurations of one shape that differ only in the learning rule (e.g. fixed "
        "against sqrt LR) draw the same prompts with the same rollout keys per seed (common "
        "random numbers) and are compared seed by seed (paired); every other ratio as "
        "independent samples"
    )


def interval_words(analysis: Analysis) -> str:
    """The intervals' method, level and degrees of freedom (header and Measurement)."""
    if analysis.method == "bootstrap":
        return (
            f"percentile bootstrap over seeds ({analysis.n_boot} replicates, "
            f"{analysis.level:.0%}, rng seed {analysis.seed})"
        )
    df = (
        "n - 1 degrees of freedom over the n paired seeds"
        if _all_prompt_keyed(analysis)
        else "n - 1 degrees of freedom where paired by seed, Welch's otherwise"
    )
    return (
        f"{analysis.level:.0%} Student-t over seeds (means; ratios: delta method on the log, {df})"
    )


def measurement_section(analysis: Analysis) -> list[str]:
    """The report's "Measurement" section (see the module docstring)."""
    sw = analysis.sweep
    band = analysis.band_lo is not None
    other = None  # the single-target analysis beside the band's
    if band:
        other = ttt.analyze_sweep(
            sw,
            target=analysis.target,
            reference=analysis.reference.name,
            method=analysis.method,
            band_lo=None,
            calibrated=analysis.calibrated,
        )
    metric = validation_metric(analysis)
    out = ["## Measurement", ""]
    out.append(
        "- Validation metric: "
        + (
            "exact p(reference response) (`p_ref`, mean@inf of exact matches, no sampling noise)"
            if metric == "p_ref"
            else "sampled mean@k"
        )
        + "."
    )
    out.append(
        f"- Estimator: {estimator_words(analysis)}"
        + ("; the single-target r_N is shown beside." if band else ".")
    )
    out.append(f"- Crossing: {crossing_words(analysis)}.")
    out.append(f"- Intervals: {interval_words(analysis)}; {pairing_words(analysis)}.")
    noise = validation_noise(analysis)
    if noise is not None:
        out.append(
            f"- Validation noise: sampled mean@k differs from the exact p_ref of the same "
            f"policy by {noise[0]:.3f} RMS over {noise[1]} evaluations (what an N* on "
            f"mean@k would carry)."
        )
    if analysis.calibrated:
        rounds = analysis.step_rounds.rounds if analysis.step_rounds else 0
        out.append(
            "- Throughput: T and q use calibrated step times (every configuration's step "
            "timed side by side, interleaved, in one process: `calibration.json`); the "
            "measured q of each run is shown beside. "
            + (
                drift_words(analysis.step_rounds)
                if analysis.step_rounds and analysis.step_rounds.drift
                else f"The intervals of r_q and T/T_ref add the spread of the step-time ratio "
                f"over the {rounds} calibration rounds to the seeds' spread."
                if rounds >= 2
                else "The intervals of r_q and T/T_ref carry the seeds' spread only (one "
                "calibration round)."
            )
            + (
                f" Calibration used: {analysis.sweep.calibration_note}."
                if analysis.sweep.calibration_note
                else ""
            )
        )
    else:
        out.append("- Throughput: measured q of each run (no calibration.json).")
    out.append("")
    out += [f"**Warning:** {w}" for w in q_warnings(analysis)]
    out.append("")
    rows = []
    for key, s in analysis.stats.items():
        r_n = analysis.ratios[key]
        row = [key.name, str(key.batch), str(s.n_seeds), _cv_cell([r.n_star for r in s.runs])]
        row.append(fmt_estimate(r_n.r_n, ".3g", r_n.missing_label))
        if other is not None:
            o, o_r = other.stats[key], other.ratios[key]
            row += [
                _cv_cell([r.n_star for r in o.runs]),
                fmt_estimate(o_r.r_n, ".3g", o_r.missing_label),
            ]
        row.append(fmt_estimate(s.q, ".4g", "-"))
        if analysis.calibrated:
            measured = [analysis.targets[r.name].q_measured for r in analysis.runs_by_key[key]]
            ok = [m for m in measured if m is not None]
            row.append(fmt_estimate(ttt.mean_estimate(ok, method=analysis.method)) if ok else "-")
        rows.append(row)
    name = "band" if band else "single target"
    header = ["config", "B", "seeds", f"N* CV ({name})", f"r_N ({name})"]
    if other is not None:
        header += ["N* CV (single target)", "r_N (single target)"]
    header.append("q used (calibrated)" if analysis.calibrated else "q (measured)")
    if analysis.calibrated:
        header.append("q measured")
    return out + markdown_table(header, rows) + [""] + power_lines(analysis)
