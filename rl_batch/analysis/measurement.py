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
  calibration (``rl_batch.calibrate``) the analysis uses the calibrated q, shown beside.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from rl_batch.analysis import time_to_target as ttt
from rl_batch.analysis.time_to_target import Analysis, fmt_estimate, markdown_table

Q_DISAGREEMENT = 0.10  # measured q of identical-compute runs: max/min above 1 + this warns


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
    if band:
        out.append(
            f"- Estimator: N*, T and q are geometric means over 9 accuracy levels from "
            f"{analysis.band_lo:g} to the target {analysis.target:g} (the mean shift "
            f"between curves across the band); the single-target r_N is shown beside."
        )
    else:
        out.append("- Estimator: N*, T and q at the single target.")
    noise = validation_noise(analysis)
    if noise is not None:
        out.append(
            f"- Validation noise: sampled mean@k differs from the exact p_ref of the same "
            f"policy by {noise[0]:.3f} RMS over {noise[1]} evaluations (what an N* on "
            f"mean@k would carry)."
        )
    if analysis.calibrated:
        out.append(
            "- Throughput: T and q use calibrated step times (every configuration's step "
            "timed side by side, interleaved, in one process: `calibration.json`); the "
            "measured q of each run is shown beside."
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
    return out + markdown_table(header, rows) + [""]
