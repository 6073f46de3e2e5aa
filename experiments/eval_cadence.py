r"""What validating less often would cost a finished study: its runs re-read with fewer evaluations.

  python -m experiments.eval_cadence --sweep=sweeps/grpo_cpu --every=2,4

Each run keeps every ``every``-th of its evaluations (where validating every
``every x eval_every_responses`` retained responses would have validated it) and its
last: a run that stopped at the target stopped at an evaluation a coarser cadence might
have made later, so its last one is kept and the simulation is exact for every crossing
below it (slightly favourable to the coarse cadence at the top of the band). The sweep
is analysed again and the table gives, per cadence, the evaluations kept, each
configuration's N* and T against the full cadence's (mean over seeds), the widest r_N
and T/T_ref half-widths, and the findings whose verdict changed: what a sweep with that
cadence would have lost, bought with the validation time it saves (``time_eval_s`` of
the runs, scaled by the evaluations kept).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from absl import flags

from experiments import cli
from rl_batch.analysis import curves, findings
from rl_batch.analysis import time_to_target as ttt
from rl_batch.analysis.curves import RunData, Sweep


def thin_run(run: RunData, every: int) -> RunData:
    """``run`` with every ``every``-th evaluation (the first, the ``every``-th, ...) and
    its last, in the analysis' arrays and eval records alike. A run validates at the
    first update past ``eval_every_responses`` more retained responses, so every k-th of
    its evaluations is where a k times coarser cadence would have validated it."""
    n = len(run.eval_responses)
    if n == 0:
        return run
    idx = np.arange(n)
    keep = (idx % every == 0) | (idx == n - 1)
    return dataclasses.replace(
        run,
        eval_records=tuple(r for r, k in zip(run.eval_records, keep) if k),
        eval_responses=np.asarray(run.eval_responses)[keep],
        eval_accuracy=np.asarray(run.eval_accuracy)[keep],
    )


def thin_sweep(sweep: Sweep, every: int) -> Sweep:
    """Every run of ``sweep`` with every ``every``-th evaluation (`thin_run`)."""
    return dataclasses.replace(sweep, runs=tuple(thin_run(r, every) for r in sweep.runs))


def widest(analysis: ttt.Analysis) -> tuple[float, float]:
    """The widest r_N and T/T_ref half-widths (in ratio units) of ``analysis``."""
    r_n, r_t = [0.0], [0.0]
    for k in analysis.stats:
        if k == analysis.reference:
            continue
        ratios = analysis.ratio(k, analysis.reference)
        for est, out in ((ratios.r_n, r_n), (ratios.r_t, r_t)):
            if est is not None and est.has_interval:
                out.append((est.hi - est.lo) / 2)
    return max(r_n), max(r_t)


def verdicts(analysis: ttt.Analysis) -> dict[str, str]:
    """Finding name -> verdict of ``analysis`` (no generation report, tol 0.2)."""
    return {f.name: f.verdict for f in findings.study_findings(analysis, None, 0.2)}


def cadence_table(sweep: Sweep, every: Sequence[int]) -> list[str]:
    """The markdown table of the module docstring."""
    full = ttt.analyze_sweep(sweep)
    base = float(sweep.eval_every_responses or 256)
    n_evals = sum(len(r.eval_responses) for r in sweep.runs)
    t_eval = sum(float(r.summary.get("time_eval_s") or 0.0) for r in sweep.runs)
    rows = ["| every | evaluations kept | validation s (scaled) | N* / N*(full), per config | "
            "T / T(full), per config | widest r_N / T/T_ref half-width | verdicts changed |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    v_full = verdicts(full)
    for k in [1, *every]:
        a = full if k == 1 else ttt.analyze_sweep(thin_sweep(sweep, k))
        kept = n_evals if k == 1 else sum(len(thin_run(r, k).eval_responses)
                                          for r in sweep.runs)  # fmt: skip
        n_ratio, t_ratio = [], []
        for key, s in full.stats.items():
            s_k = a.stats.get(key)
            if s.n_star and s_k is not None and s_k.n_star:
                n_ratio.append(s_k.n_star.mean / s.n_star.mean)
            if s.time_to_target_s and s_k is not None and s_k.time_to_target_s:
                t_ratio.append(s_k.time_to_target_s.mean / s.time_to_target_s.mean)
        w_n, w_t = widest(a)
        changed = [f"{n}: {v_full[n]} -> {v}" for n, v in verdicts(a).items() if v != v_full[n]]
        rows.append(
            f"| {k} x {base:g} | {kept} of {n_evals} | {t_eval * kept / n_evals:.0f} | "
            f"{_span(n_ratio)} | {_span(t_ratio)} | {w_n:.3f} / {w_t:.3f} | "
            f"{'; '.join(changed) or 'none'} |"
        )
    return rows


def parse_every(text: str) -> list[int]:
    """``--every`` as integers >= 2 (ValueError naming the flag otherwise)."""
    try:
        every = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        every = []
    if not every or min(every) < 2:
        raise ValueError(f"--every={text!r}: give integers >= 2, e.g. 2,4")
    return every


def _span(xs: list[float]) -> str:
    return f"{min(xs):.3f}-{max(xs):.3f}" if xs else "-"


def main(argv: Sequence[str]) -> None:
    del argv
    sweep = curves.load_sweep(flags.FLAGS.sweep)
    every = parse_every(flags.FLAGS.every)
    print(f"eval_cadence: {flags.FLAGS.sweep} ({len(sweep.runs)} runs)")
    print("\n".join(cadence_table(sweep, every)))


def _define_flags() -> None:
    flags.DEFINE_string("sweep", None, "A finished sweep directory.", required=True)
    flags.DEFINE_string("every", "2,4", "Cadences to try, in multiples of the sweep's.")


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
