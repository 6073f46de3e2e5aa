"""The study's figures from a sweep directory (PNG and PDF in ``<sweep>/figures/``).

Figures (each skipped, with a logged note, when the sweep has no data for it):

- ``invariance``: accuracy against cumulative retained responses for each batch of the
  sqrt family (the invariance family), and beside it the gradient norm against batch.
- ``group_size``: configurations with the same ``B = P x G`` but different (P, G).
- ``lr_rule``: fixed against sqrt LR, with updates-to-target bars against the ideal
  ``B_ref / B``.
- ``throughput_ratio``: per batch, ``B / B_ref`` against the collection-time multiple
  ``t_gen(B) / t_gen(B_ref)`` per update (their ratio is the generation throughput gain;
  the family's smallest batch stands in when the reference is outside the family).
- ``critical_batches``: generation throughput against batch with the plateau (and the
  KV-cache bound) marked; ``r_N`` against batch with the critical training batch marked.
- ``time_to_target``: ``T / T_ref`` against batch; the recommendation ringed in gold, or,
  when the planner cannot tell them apart, every candidate ringed in grey.
- ``accuracy_vs_time``: accuracy against training seconds per configuration (the study's
  question: which batch gets there first in wall time), on the calibrated clock when the
  sweep has a calibration, with each configuration's T and its interval on the target line.
- ``seed_curves``: small multiples, one panel per configuration, every seed's whole
  validation curve against responses with its crossing of the target ticked.
- ``ratios``: ``r_N`` and ``r_q`` against batch in one panel (their ratio is ``T/T_ref``).
- ``time_breakdown``: seconds per update in generation, scoring, update and idle per batch.
- ``training_signals``: reward, entropy, KL and response length against responses, the
  seed mean per configuration with its band; the KL panel says which KL was logged.
- ``critic`` (PPO): the critic's explained variance per update, warm-up included, and N*
  against the critic's settings (batch scale, LR rule) at the reference.

Accuracy curves against responses or time: the seed mean only where every seed has data
(runs stop at the target, so past the first stop a mean over the seeds still running would
be a mean over the slow ones) with the seed min-max band; beyond it, how the seeds reach
the target, in a thin strip under the panel: the share of the configuration's seeds at the
target against x, a step at each seed's crossing (`_plot_reach`), and an x on the panel
where a seed ended short of it. Each seed's own curve beyond the common range is drawn
only in ``seed_curves``, one panel per configuration: drawn faint in the shared panels
(8 configurations x 12 seeds in the default study) they overlapped into an unreadable
tangle, and one tail per configuration (its slowest seed) would show the extreme, not how
the seeds spread. The strip keeps every seed's outcome and when it came, the thing a
reader of a time-to-target study needs past the common range. Training signals
(``plot_binned``) show each seed's bin means past it as faint dots (no lines to cross).
The y label names the sweep's validation metric (``eval_metric``).

Error bars are the intervals over seeds (`time_to_target`'s method, Student-t by
default); an estimate without one (a single seed) is drawn as a hollow marker with no
bar, never a zero-length bar. Every figure is titled with the sweep, the target and the
seeds per configuration; batch axes are log2 with the measured batches as labelled ticks,
and points of another group size at the same batch are shifted sideways, not hidden.

Only the object-oriented matplotlib API is used (``Figure`` with an Agg canvas), so
nothing changes the global backend and every function also works in a notebook: the
``figure_*`` functions return the ``Figure`` (or ``None``), ``write_all`` saves everything.

Length: over 800 lines because every figure of the study is one function here, beside
the drawing helpers they share (seed bands, undecided markers, the fit's quality text);
a figure is read and changed in one place.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator, ScalarFormatter

from rl_batch import artifacts, targets
from rl_batch.analysis import (
    cost_model,
    critical_batch,
    findings,
    intervals,
    measurement,
    noise_scale,
    planner,
)
from rl_batch.analysis.curves import (
    RunData,
    load_sweep,
    mean_curve,
    seed_curves,
)
from rl_batch.analysis.time_to_target import (
    DEFAULT_N_BOOT,
    Analysis,
    RunTarget,
    analyze_sweep,
    calibrated_seconds,
    run_time_to_target,
)
from rl_batch.artifacts import Configuration

log = logging.getLogger(__name__)

FORMATS = ("png", "pdf")
RULE_MARKERS = {"sqrt": "o", "fixed": "s", "linear": "^", "malladi": "D", "surge": "P"}
RULE_COLORS = {"sqrt": "C0", "fixed": "C1", "linear": "C2", "malladi": "C4", "surge": "C5"}


def _figure(
    analysis: Analysis, ncols: int = 2, width: float = 5.2, height: float = 4.0, nrows: int = 1
) -> Figure:
    """A figure titled with the sweep, the target and the seeds per configuration."""
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    seeds = "/".join(str(n) for n in sorted({s.n_seeds for s in analysis.stats.values()}))
    fig.suptitle(
        f"sweep {analysis.sweep.name}: target {analysis.target:g}, {seeds} seed(s) per "
        f"configuration, reference B={analysis.reference.batch}",
        fontsize=9,
    )
    return fig


def _batch_axis(ax, batches: Sequence[float]) -> None:
    """A log2 batch axis whose ticks are the measured batches, labelled as integers."""
    ticks = sorted({int(b) for b in batches})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(b) for b in ticks])
    ax.xaxis.set_minor_locator(NullLocator())


def _shift(batch: float, group_size: int, reference: Configuration) -> float:
    """x of a point: another group size than the reference's sits a little to the side."""
    if group_size == reference.group_size:
        return float(batch)
    return float(batch) * 2 ** (0.08 if group_size > reference.group_size else -0.08)


def _batch_colors(batches: Sequence[int]) -> dict[int, tuple[float, ...]]:
    from matplotlib import colormaps

    uniq = sorted(set(batches))
    cmap = colormaps["viridis"]
    n = max(len(uniq) - 1, 1)
    return {b: cmap(0.9 * i / n) for i, b in enumerate(uniq)}


def _errorbars(ax, b, ests, color, marker, label, linestyle="none", capsize=3) -> None:
    """Means with their bootstrap intervals as error bars.

    An estimate without an interval (fewer than two seeds) is a hollow marker with no
    bar; an exact one (the reference's ratio to itself) a filled marker with no bar:
    never a zero-length bar that reads like a measured interval.
    """
    b = np.asarray(b, dtype=float)
    m = np.array([e.mean for e in ests])
    has = np.array([e.has_interval for e in ests], dtype=bool)
    exact = np.array([e.exact for e in ests], dtype=bool)
    bar = has & ~exact
    if linestyle != "none":
        ax.plot(b, m, linestyle=linestyle, color=color, marker="none")
    if bar.any():
        err = np.array(
            [
                [e.mean - e.lo for e, k in zip(ests, bar) if k],
                [e.hi - e.mean for e, k in zip(ests, bar) if k],
            ]
        )
        ax.errorbar(
            b[bar],
            m[bar],
            yerr=err,
            fmt=marker,
            capsize=capsize,
            color=color,
            label=label,
            linestyle="none",
        )
    if exact.any():
        ax.plot(
            b[exact],
            m[exact],
            marker,
            color=color,
            linestyle="none",
            label=None if bar.any() else label,
        )
    if (~has).any():
        ax.plot(
            b[~has],
            m[~has],
            marker,
            markerfacecolor="none",
            color=color,
            linestyle="none",
            label=f"{label} (no CI: < 2 seeds)",
        )


def _grid(runs: Sequence[RunData], points: int = 200) -> np.ndarray:
    hi = max((float(r.eval_responses[-1]) for r in runs if r.eval_responses.size), default=1.0)
    return np.linspace(0.0, hi, points)


def metric_label(analysis: Analysis, wrap: bool = False) -> str:
    """The y label of a validation curve, from the runs' ``eval_metric`` (and ``eval_k``);
    ``wrap``: its parenthesis on a second line (a panel with a strip under it is too
    short for the long ``p_ref`` label)."""
    metric = measurement.validation_metric(analysis)
    if metric == "p_ref":
        label = "validation p_ref (exact mean p(reference response))"
    else:
        ks = {e.get("eval_k") for rs in analysis.runs_by_key.values() for r in rs
              for e in r.eval_records[:1]}  # fmt: skip
        k = next(iter(ks)) if len(ks) == 1 and None not in ks else "k"
        label = f"validation accuracy (mean@{k})"
    return label.replace(" (", "\n(", 1) if wrap else label


SEED_STYLE = {"markersize": 3, "alpha": 0.45}  # a seed's own signal past the common range
CURVE_NOTE = (
    "line: seed mean where every seed has data (to the first seed's stop); band: seed min-max"
)
REACH_NOTE = (
    "share of seeds at the target: a step at each seed's crossing (x above: a seed\n"
    "that ended short of it); every seed's whole curve: seed_curves"
)
REACH_LABEL = "seeds at\ntarget"  # the y label of the strip under a curves panel


def seed_reach(analysis: Analysis, k: Configuration) -> list[RunTarget]:
    """Where each seed of ``k`` (with evaluations, in `seed_curves` order) reaches the
    target itself (not the band): `run_time_to_target` at ``analysis.target`` read the
    way the analysis reads N* (``crossing``), on its clock (calibrated where it is). Its
    ``n_star`` and ``time_to_target_s`` are the report's per-seed N* and T at a single
    target; ``None`` where the seed never reached it."""
    return [
        run_time_to_target(
            r, analysis.target, None, analysis.run_step_s.get(r.name), analysis.crossing
        )
        for r in analysis.runs_by_key[k]
        if r.eval_responses.size
    ]


def reach_steps(crossings: Sequence[float | None], x_end: float) -> tuple[np.ndarray, np.ndarray]:
    """The share of n seeds at the target against x, as a step curve (``where="post"``).

    Args:
      crossings: [n] each seed's crossing of the target (``None``: never reached).
      x_end: where the curve ends (the last seed's last evaluation).

    Returns:
      (x [K + 2], share [K + 2]) for the K seeds that reached: x = 0, the K crossings in
      order, ``x_end``; share = 0, 1/n, ..., K/n, K/n (below 1 while a seed has not reached).
    """
    c = np.sort(np.array([v for v in crossings if v is not None], dtype=float))
    n = max(len(crossings), 1)
    end = max(float(x_end), float(c[-1]) if c.size else 0.0)
    x = np.concatenate([[0.0], c, [end]])
    share = np.concatenate([[0.0], np.arange(1, c.size + 1) / n, [c.size / n]])
    return x, share


def _plot_reach(ax, reach_ax, xs_ys, crossings, color, linestyle, name: str) -> None:
    """Past the common range, how a configuration's seeds reach the target: the share of
    seeds at the target against x on ``reach_ax`` (`reach_steps`; one step per seed), and
    on ``ax`` an x at the last evaluation of each seed that ended short of it.

    Args:
      ax: the curves panel.
      reach_ax: the strip under it (shared x).
      xs_ys: [n] each seed's (x [E], accuracy [E]).
      crossings: [n] each seed's crossing of the target on the same x (``None``: never).
      color, linestyle: the configuration's.
      name: the configuration's name (the artists' labels, read back by the tests).
    """
    x_end = max(float(x[-1]) for x, _ in xs_ys)
    sx, share = reach_steps(crossings, x_end)
    reach_ax.step(sx, share, where="post", color=color, linestyle=linestyle, linewidth=1.2,
                  label=f"_reach {name}")  # fmt: skip
    for (x, y), c in zip(xs_ys, crossings):
        if c is None:  # stopped (or still running) below the target: where it ended
            ax.plot([x[-1]], [y[-1]], "x", color=color, markersize=5, label=f"_short {name}")


def _reach_axes(fig: Figure, spec, ax):
    """The thin strip under a curves panel ``ax`` (at ``spec``, sharing its x) that
    `_plot_reach` draws in; ``ax`` keeps its x tick labels off."""
    reach_ax = fig.add_subplot(spec, sharex=ax)
    _reach_axes_style(ax, reach_ax)
    return reach_ax


def _reach_axes_style(ax, reach_ax) -> None:
    """The reach strip's y axis (share of seeds, 0 to all) and note; the curves panel
    ``ax`` above it without x tick labels."""
    ax.tick_params(labelbottom=False)
    reach_ax.set_ylim(-0.05, 1.08)
    reach_ax.set_yticks([0.0, 0.5, 1.0], ["0", "1/2", "all"])
    reach_ax.grid(axis="y", color="0.85", linewidth=0.6)
    reach_ax.set_ylabel(REACH_LABEL, fontsize=7)
    reach_ax.set_title(REACH_NOTE, fontsize=6, color="0.35", loc="left")


def _plot_curves(
    ax, reach_ax, analysis: Analysis, keys: Sequence[Configuration], styles: dict
) -> None:
    """Seed-mean accuracy against responses where every seed has data, with the seed
    min-max band; past the first seed's stop (runs stop at the target) no mean over the
    seeds still running (they are the slow ones) and no per-seed tails either (12 seeds
    x 8 configurations overlap into a tangle): the strip ``reach_ax`` below shows how the
    seeds reach the target instead (`_plot_reach`), and `figure_seed_curves` every seed's
    whole curve."""
    runs = [r for k in keys for r in analysis.runs_by_key[k]]
    grid = _grid(runs)
    for k in keys:
        mean, lo, hi = mean_curve(analysis.runs_by_key[k], grid)
        st = styles[k]
        color, linestyle = st.get("color"), st.get("linestyle", "-")
        ax.plot(grid, mean, label=st.get("label", k.label), color=color, linestyle=linestyle)
        if len(analysis.runs_by_key[k]) > 1:
            ax.fill_between(grid, lo, hi, color=color, alpha=0.15, linewidth=0)
        seeds = [(r.eval_responses, r.eval_accuracy) for r, _ in seed_curves(
            analysis.runs_by_key[k], grid)]  # fmt: skip
        if seeds:
            crossings = [t.n_star for t in seed_reach(analysis, k)]
            _plot_reach(ax, reach_ax, seeds, crossings, color, linestyle, k.name)
    ax.axhline(analysis.target, color="0.5", linestyle=":", linewidth=1, label="target")
    reach_ax.set_xlabel("cumulative retained responses")
    ax.set_ylabel(metric_label(analysis, wrap=True))
    ax.text(0.01, 0.01, CURVE_NOTE, transform=ax.transAxes, fontsize=6, color="0.35")
    ax.legend(fontsize=7)


def _curves_beside(analysis: Analysis) -> tuple:
    """A figure of a curves panel with its reach strip (left) beside a full-height
    panel (right): (figure, curves axes, right axes, strip axes), in ``fig.axes`` order."""
    fig = _figure(analysis, 2, height=4.6)
    gs = fig.add_gridspec(2, 2, height_ratios=[3, 1])
    ax = fig.add_subplot(gs[0, 0])
    ax2 = fig.add_subplot(gs[:, 1])
    return fig, ax, ax2, _reach_axes(fig, gs[1, 0], ax)


def figure_invariance(analysis: Analysis, tol: float = critical_batch.DEFAULT_TOL) -> Figure | None:
    """Accuracy against responses per batch (sqrt family) and gradient norm against batch."""
    fam = critical_batch.family_keys(list(analysis.stats), reference=analysis.reference)
    if not fam:
        log.info("figure invariance: skipped (no sqrt-LR configurations)")
        return None
    fig, ax, ax2, reach_ax = _curves_beside(analysis)
    colors = _batch_colors([k.batch for k in fam])
    _plot_curves(
        ax,
        reach_ax,
        analysis,
        fam,
        {k: {"color": colors[k.batch], "label": f"B={k.batch} ({k.label})"} for k in fam},
    )
    ax.set_title(f"{analysis.sweep.algo}: sqrt LR, G={fam[0].group_size}")
    trends = [
        critical_batch.grad_norm_trend(analysis, field)
        for field in ("grad_norm", "critic_grad_norm")
    ]
    trends = [t for t in trends if t is not None]
    if not trends:
        ax2.text(0.5, 0.5, "no grad_norm logged", ha="center", va="center", transform=ax2.transAxes)
    for tr, color in zip(trends, ("C0", "C3")):
        name = "actor" if tr.field == "grad_norm" else "critic"
        ax2.plot(tr.batches, tr.norms, "o-", color=color, label=f"{name} (slope {tr.slope:.2f})")
        if tr.slowdown_segment is not None:
            ax2.axvspan(*tr.slowdown_segment, color=color, alpha=0.1, label=f"{name} decline slows")
    crit = critical_batch.critical_training_batch(analysis, tol)
    if crit is not None and trends:
        critical_line(ax2, crit)
    _batch_axis(ax2, [b for t in trends for b in t.batches] or [k.batch for k in fam])
    ax2.set_yscale("log")
    ax2.yaxis.set_major_formatter(ScalarFormatter())
    ax2.yaxis.set_minor_formatter(ScalarFormatter())
    ax2.set_xlabel("training batch B (responses)")
    ax2.set_ylabel(
        f"mean gradient norm (first {trends[0].window_responses:.0f} responses)"
        if trends
        else "mean gradient norm"
    )
    if trends:
        ax2.legend(fontsize=7)
    return fig


def critical_line(ax, crit: critical_batch.CriticalTrainingBatch) -> None:
    """The critical training batch as a vertical line: black dashed when the CI walk lands
    on it, grey dotted and labelled "undecided" when it does not (or stops at an
    incomplete batch), with the words of `CriticalTrainingBatch.describe`."""
    firm = crit.decided and not crit.first_outside_incomplete
    ax.axvline(
        crit.critical_batch,
        color="k" if firm else "0.45",
        linestyle="--" if firm else ":",
        linewidth=1.2,
        label=f"critical training batch {crit.describe()}",
    )


def _group_pairs(analysis: Analysis) -> list[list[Configuration]]:
    by_batch: dict[tuple[str, str, int], list[Configuration]] = {}
    for k in analysis.stats:
        by_batch.setdefault((k.algo, k.lr_rule, k.batch), []).append(k)
    return [
        sorted(ks, key=lambda k: k.group_size)
        for ks in by_batch.values()
        if len({k.group_size for k in ks}) > 1
    ]


def figure_group_size(analysis: Analysis) -> Figure | None:
    """Same ``B = P x G``, different (P, G): curves and gradient norm against responses."""
    pairs = _group_pairs(analysis)
    if not pairs:
        log.info("figure group_size: skipped (no two configurations share B with different G)")
        return None
    keys = [k for ks in pairs for k in ks]
    groups = sorted({k.group_size for k in keys})
    batches = sorted({k.batch for k in keys})
    colors = {g: f"C{i}" for i, g in enumerate(groups)}
    dashes = ["-", "--", ":", "-."]
    styles = {
        k: {
            "color": colors[k.group_size],
            "linestyle": dashes[batches.index(k.batch) % 4],
            "label": f"B={k.batch}: {k.label}",
        }
        for k in keys
    }
    fig, ax, ax2, reach_ax = _curves_beside(analysis)
    _plot_curves(ax, reach_ax, analysis, keys, styles)
    ax.set_title("group size at fixed B = P x G")
    plotted = False
    with_norm = [r for k in keys for r in analysis.runs_by_key[k] if r.has_field("grad_norm")]
    edges = np.linspace(0.0, max((r.final_responses for r in with_norm), default=1.0), 31)
    for k in keys:
        runs = [r for r in analysis.runs_by_key[k] if r.has_field("grad_norm")]
        if runs:
            st = styles[k]
            plot_binned(ax2, runs, "grad_norm", edges, st["color"], st["linestyle"], st["label"])
            plotted = True
    if plotted:
        ax2.set_xlabel("cumulative retained responses")
        ax2.set_ylabel("actor gradient norm")
        ax2.set_title(SIGNAL_NOTE.replace("; ", ";\n"), fontsize=7)
        ax2.legend(fontsize=7)
    else:
        ax2.text(0.5, 0.5, "no grad_norm logged", ha="center", va="center", transform=ax2.transAxes)
    return fig


def figure_lr_rule(analysis: Analysis) -> Figure | None:
    """Fixed against sqrt LR: curves and updates-to-target against the reference."""
    ref = analysis.reference
    fixed = [
        k
        for k in analysis.stats
        if k.lr_rule == "fixed"
        and k.algo == ref.algo
        and k.group_size == ref.group_size
        and k != ref
    ]
    if not fixed:
        log.info("figure lr_rule: skipped (no fixed-LR configuration beside the reference)")
        return None
    others = [
        k
        for k in analysis.stats
        if k.lr_rule != "fixed"
        and k != ref
        and k.algo == ref.algo
        and k.group_size == ref.group_size
        and k.batch in {f.batch for f in fixed}
    ]
    keys = [ref, *sorted(others + fixed, key=lambda k: (k.batch, k.lr_rule))]
    batches = sorted({k.batch for k in keys})
    dashes = ["-", "--", ":", "-."]
    styles = {
        k: {
            "color": "k" if k == ref else ("C1" if k.lr_rule == "fixed" else "C0"),
            "linestyle": dashes[batches.index(k.batch) % 4],
            "label": ("reference " if k == ref else "") + f"B={k.batch} {k.lr_rule}",
        }
        for k in keys
    }
    fig, ax, ax2, reach_ax = _curves_beside(analysis)
    _plot_curves(ax, reach_ax, analysis, keys, styles)
    ax.set_title("LR rule at larger batch")
    bars = [k for k in keys if k != ref]
    x = np.arange(len(bars))
    for i, k in enumerate(bars):
        ra = analysis.ratios[k]
        color = styles[k]["color"]
        if ra.r_updates is None:
            ax2.text(i, 0.02, ra.missing_label, rotation=90, ha="center", va="bottom", fontsize=8)
            continue
        e = ra.r_updates
        if e.has_interval:
            ax2.bar(
                i,
                e.mean,
                color=color,
                alpha=0.8,
                yerr=[[e.mean - e.lo], [e.hi - e.mean]],
                capsize=3,
            )
            ax2.text(i, e.hi, f"{e.mean:.2f}", ha="center", va="bottom", fontsize=8)
        else:  # One seed: no interval to draw.
            ax2.bar(i, e.mean, color=color, alpha=0.8, hatch="//")
            ax2.text(i, e.mean, f"{e.mean:.2f}\nno CI", ha="center", va="bottom", fontsize=8)
        ax2.hlines(ra.ideal_updates, i - 0.4, i + 0.4, colors="k", linestyles="--")
    ax2.set_xticks(x, [f"B={k.batch}\n{k.lr_rule}" for k in bars])
    ax2.set_ylabel(f"updates to target / reference (B={ref.batch})")
    ax2.set_title("dashed: ideal B_ref / B")
    return fig


def _gen_time_per_update(runs: Sequence[RunData]) -> float | None:
    vals = []
    for r in runs:
        t = r.field("time_generate_s")
        t = t[np.isfinite(t)]
        if t.size:
            vals.append(float(np.median(t)))
    return float(np.mean(vals)) if vals else None


def figure_throughput_ratio(analysis: Analysis) -> Figure | None:
    """Response-count multiple against collection-time multiple per update, per batch."""
    fam = critical_batch.family_keys(list(analysis.stats), reference=analysis.reference)
    pts = [(k.batch, _gen_time_per_update(analysis.runs_by_key[k])) for k in fam]
    pts = [(b, t) for b, t in pts if t is not None and t > 0]
    if len(pts) < 2:
        log.info("figure throughput_ratio: skipped (time_generate_s for < 2 batches)")
        return None
    ref = analysis.reference
    b0, t0 = next(((b, t) for b, t in pts if b == ref.batch and ref in fam), pts[0])
    fig = _figure(analysis, 1, width=6.0)
    ax = fig.subplots()
    x = np.arange(len(pts))
    resp = [b / b0 for b, _ in pts]
    tgen = [t / t0 for _, t in pts]
    ax.bar(x - 0.2, resp, 0.4, label="responses per update (B / B_ref)", color="C0")
    ax.bar(x + 0.2, tgen, 0.4, label="collection time per update (t / t_ref)", color="C1")
    for i, (r, t) in enumerate(zip(resp, tgen)):
        ax.text(i, max(r, t), f"{r / t:.2f}x", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [str(b) for b, _ in pts])
    ax.set_xlabel("training batch B (responses)")
    ax.set_ylabel(f"multiple of the reference batch B = {b0}")
    ax.set_title("generation throughput gain = response multiple / time multiple")
    ax.legend(fontsize=7)
    return fig


def figure_critical_batches(
    analysis: Analysis,
    generation: cost_model.GenerationReport | None,
    tol: float = critical_batch.DEFAULT_TOL,
) -> Figure | None:
    """Throughput plateau (critical generation batch) and r_N edge (critical training batch)."""
    crit = critical_batch.critical_training_batch(analysis, tol)
    if generation is None and crit is None:
        log.info("figure critical_batches: skipped (no throughput data and no r_N family)")
        return None
    fig = _figure(analysis, 2)
    ax, ax2 = fig.subplots(1, 2)
    if generation is not None:
        g = generation
        ax.plot(g.fit.batches, g.fit.tokens_per_s, "o", color="C0", label="measured")
        bars = [(c, intervals.t_mean(g.samples[c], analysis.level)) for c in sorted(g.samples)
                if len(g.samples[c]) >= 2]  # fmt: skip
        if bars:  # repeated measurements (calibration rounds): their t intervals
            c_b = np.array([c for c, _ in bars], dtype=float)
            m_b = np.array([m for _, (m, _, _) in bars])
            err = np.array([[m - lo for _, (m, lo, _) in bars], [hi - m for _, (m, _, hi) in bars]])
            ax.errorbar(c_b, m_b, yerr=err, fmt="none", ecolor="C0", capsize=3,
                        label=f"{analysis.level:.0%} t interval over rounds")  # fmt: skip
        walk = findings.generation_batch_walk(g, analysis.level)
        if walk is not None:
            ax.axvspan(walk[0], walk[1] * 1.0001, color="0.6", alpha=0.25,
                       label=f"plateau CI walk [{walk[0]:.4g}, {walk[1]:.4g}]")  # fmt: skip
        cs = np.geomspace(g.fit.batches.min(), g.fit.batches.max(), 200)
        ax.plot(
            cs,
            g.fit.predict(cs),
            "-",
            color="C0",
            alpha=0.6,
            label=f"fit c / (a + b c), a={g.fit.a_s:.3g}s b={g.fit.b_s:.3g}s\n"
            f"R^2 {g.fit.r2:.3f}, largest miss {g.fit.max_rel_residual:.0%}",
        )
        problems = cost_model.fit_problems(g, analysis.level)
        quality = (
            "fit poor: " + "; ".join(problems) + "\n-> saturation verdict withheld"
            if problems
            else f"fit within {cost_model.MAX_REL_RESIDUAL:.0%} of every point"
        )
        ax.text(0.02, 0.98, quality, transform=ax.transAxes, fontsize=7, va="top",
                color="C3" if problems else "0.3")  # fmt: skip
        ax.axvline(
            g.plateau_batch_measured,
            color="k",
            linestyle="--",
            label=f"plateau ({g.frac:.0%} of best) c={g.plateau_batch_measured}",
        )
        if g.max_kv_batch is not None:
            ax.axvline(
                g.max_kv_batch,
                color="C3",
                linestyle="-.",
                label=f"KV-cache bound c={g.max_kv_batch}",
            )
        _batch_axis(ax, g.fit.batches)
        ax.set_xlabel("generation concurrency (sequences)")
        ax.set_ylabel("generated tokens / s")
        title = f"critical generation batch ({g.source})"
        if g.model_warnings:
            title += "\nWARNING: throughput.json measured another model preset"
        ax.set_title(title)
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no throughput data", ha="center", va="center", transform=ax.transAxes)
    if crit is not None:
        fam = [k for k, e in zip(crit.family, crit.r_n) if e is not None]
        est = [e for e in crit.r_n if e is not None]
        b = np.array([k.batch for k in fam], dtype=float)
        _errorbars(ax2, b, est, "C0", "o", "r_N (sqrt LR)", linestyle="-")
        missing = [k for k, e in zip(crit.family, crit.r_n) if e is None]
        for mk in missing:
            ax2.annotate(
                analysis.stats[mk].missing_label,
                (mk.batch, 1.0 + tol),
                rotation=90,
                fontsize=7,
                ha="center",
                va="bottom",
            )
        ax2.axhspan(0.0, 1.0 + tol, color="0.85", alpha=0.5, label=f"r_N <= 1 + {tol:g}")
        critical_line(ax2, crit)
        if crit.has_interval and crit.critical_batch_lo is not None:
            lo_b, hi_b = crit.critical_batch_lo, crit.critical_batch_hi
            ax2.axvspan(lo_b * 0.97, hi_b * 1.03, color="C1", alpha=0.12,
                        label="critical training batch: CI walk")  # fmt: skip
        bs = [
            s.median_second_half
            for rs in analysis.runs_by_key.values()
            for r in rs
            if (s := noise_scale.run_noise_scale(r)) is not None
        ]
        bs = [v for v in bs if np.isfinite(v) and v > 0]
        if bs:
            ax2.axvline(
                float(np.median(bs)),
                color="C2",
                linestyle=":",
                label=f"noise scale B_simple {np.median(bs):.0f}",
            )
        _batch_axis(ax2, [k.batch for k in crit.family])
        lows = [e.lo if e.has_interval else e.mean for e in est]  # every bar drawn whole
        ax2.set_ylim(bottom=max(0.0, min(0.8, min(lows) - 0.05)) if lows else 0.8)
        ax2.set_xlabel("training batch B (responses)")
        ax2.set_ylabel(f"r_N = N*(B) / N*(B={crit.reference.batch})")
        ax2.set_title("critical training batch")
        ax2.legend(fontsize=7)
    else:
        ax2.text(
            0.5,
            0.5,
            "no sqrt-LR family reaching the target",
            ha="center",
            va="center",
            transform=ax2.transAxes,
        )
    return fig


def figure_time_to_target(analysis: Analysis) -> Figure | None:
    """``T / T_ref`` against batch per LR rule, with the best configuration starred."""
    rows = [(k, r.r_t) for k, r in analysis.ratios.items()]
    if not any(e is not None for _, e in rows):
        log.info("figure time_to_target: skipped (reference did not reach the target)")
        return None
    fig = _figure(analysis, 1, width=6.5)
    ax = fig.subplots()
    ref = analysis.reference
    reached = [(k, e) for k, e in rows if e is not None]
    top = max(e.hi if e.has_interval else e.mean for _, e in reached)
    for rule in sorted({k.lr_rule for k, _ in rows}):
        pts = sorted([(k, e) for k, e in reached if k.lr_rule == rule], key=lambda p: p[0].batch)
        if pts:
            _errorbars(
                ax,
                [_shift(k.batch, k.group_size, ref) for k, _ in pts],
                [e for _, e in pts],
                RULE_COLORS.get(rule),
                RULE_MARKERS.get(rule, "v"),
                f"{rule} LR",
            )
            for k, e in pts:
                if k.group_size != ref.group_size:
                    ax.annotate(
                        f"G={k.group_size}",
                        (_shift(k.batch, k.group_size, ref), e.mean),
                        fontsize=7,
                        xytext=(4, 4),
                        textcoords="offset points",
                    )
        for k, e in rows:
            if e is None and k.lr_rule == rule:
                miss = analysis.ratios[k].missing_label
                ax.plot([k.batch], [top * 1.1], "x", color="C3")
                ax.annotate(
                    f"{rule}: {miss}",
                    (k.batch, top * 1.1),
                    fontsize=7,
                    xytext=(4, -10),
                    textcoords="offset points",
                )
    # Rings around the points (drawn on top, hollow): the point and its bar stay visible.
    plan = planner.plan_full(analysis)
    est = dict(reached)
    ringed = [k for k in plan.candidates if k in est]
    for i, k in enumerate(ringed):
        if plan.decided:
            label = f"recommended: {k.label} ({est[k].mean:.2f}x)"
        else:
            label = f"undecided between {len(ringed)} candidates" if i == 0 else None
        ax.plot(
            [_shift(k.batch, k.group_size, ref)],
            [est[k].mean],
            "o",
            markersize=15,
            markerfacecolor="none",
            markeredgewidth=2,
            color="goldenrod" if plan.decided else "0.45",
            label=label,
            zorder=5,
        )
    ax.axhline(1.0, color="0.5", linestyle=":", linewidth=1)
    _batch_axis(ax, [k.batch for k, _ in rows])
    ax.set_xlabel("training batch B (responses)")
    ax.set_ylabel(f"time to target / reference (B={analysis.reference.batch})")
    ax.set_title(f"time to target {analysis.target:g}: T/T_ref = r_N / r_q")
    ax.legend(fontsize=7)
    return fig


def eval_times(run: RunData, step_s: float | np.ndarray | None = None) -> np.ndarray:
    """[E] training seconds at each evaluation: the run's own, interpolated on the update
    lines, or with ``step_s`` (the calibrated seconds per update: one, or [U] for a batch
    schedule, ``Analysis.run_step_s``) the calibrated time of the updates done at the
    evaluation, the clock its T is on."""
    xp = np.concatenate([[0.0], run.responses])
    if step_s is not None:
        updates = np.interp(run.eval_responses, xp, np.concatenate([[0.0], run.updates_done]))
        return np.asarray(calibrated_seconds(step_s, updates))
    fp = np.concatenate([[0.0], run.time_train])
    return np.interp(run.eval_responses, xp, fp)


def time_curves(
    analysis: Analysis, k: Configuration
) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Configuration ``k``'s accuracy against training seconds (calibrated where the
    analysis is): each seed's (seconds [E], accuracy [E]), and the seed mean [100] on a
    time grid [100] up to the first seed's last evaluation (where every seed has data)."""
    runs = [r for r in analysis.runs_by_key[k] if r.eval_responses.size]
    seeds = [(eval_times(r, analysis.run_step_s.get(r.name)), r.eval_accuracy) for r in runs]
    grid = np.linspace(0.0, min(float(x[-1]) for x, _ in seeds), 100)
    acc = np.stack([np.interp(grid, x, y) for x, y in seeds])  # [R, 100]
    return seeds, grid, acc


def t_marker_level(analysis: Analysis) -> tuple[float, str, bool]:
    """Where `figure_accuracy_vs_time` draws each T and what it says about it: (y level,
    title words, whether T is a band mean). At a single target T is the crossing of the
    target (on the target line); with a band, T is the geometric mean of the crossing
    times of the band's levels (``targets.time_to_band``), drawn at the band's middle
    with a tick across the band: a curve reaches the target itself later than T."""
    if analysis.band_lo is None:
        return analysis.target, "markers on the target line: T and its interval", False
    mid = 0.5 * (analysis.band_lo + analysis.target)
    words = (
        f"markers: T = geometric mean of the crossing times of the {targets.BAND_LEVELS} levels\n"
        f"of the band [{analysis.band_lo:g}, {analysis.target:g}] (shaded), drawn mid-band"
    )
    return mid, words, True


def figure_accuracy_vs_time(analysis: Analysis) -> Figure | None:
    """Validation accuracy against training seconds, per configuration: the seed mean
    where every seed has data (to the first seed's stop) with the seed min-max band, and
    each configuration's T (with its interval) at the level it stands for
    (`t_marker_level`); in the strip below, the share of its seeds at the target against
    time, a step at each seed's crossing (`_plot_reach`: how the seeds get there, where
    12 faint seed tails per configuration would overlap into a tangle). With a
    calibration, the x axis is the calibrated time its T is measured on."""
    keys = [k for k in sorted(analysis.stats, key=lambda k: k.sort_key())
            if any(r.eval_responses.size for r in analysis.runs_by_key[k])]  # fmt: skip
    if not keys:
        log.info("figure accuracy_vs_time: skipped (no evaluations)")
        return None
    calibration = analysis.calibrated
    t_level, t_words, band = t_marker_level(analysis)
    fig = _figure(analysis, 1, width=7.0, height=5.2)
    ax, reach_ax = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    _reach_axes_style(ax, reach_ax)
    colors = _config_colors(keys)
    dashes = {
        "sqrt": "-",
        "fixed": "--",
        "linear": ":",
        "malladi": "-.",
        "surge": (0, (5, 1, 1, 1)),
    }
    for k in keys:
        seeds, grid, acc = time_curves(analysis, k)
        st = analysis.stats[k]
        t = "" if st.time_to_target_s is None else f", T {st.time_to_target_s.fmt('.3g')} s"
        color, style = colors[k], dashes.get(k.lr_rule, "-")
        ax.plot(grid, acc.mean(axis=0), color=color, linestyle=style,
                label=f"B={k.batch} {k.label}{t}")  # fmt: skip
        if len(seeds) > 1:
            lo, hi = acc.min(axis=0), acc.max(axis=0)
            ax.fill_between(grid, lo, hi, color=color, alpha=0.12, linewidth=0)
        crossings = [rt.time_to_target_s if rt.reached else None for rt in seed_reach(analysis, k)]
        _plot_reach(ax, reach_ax, seeds, crossings, color, style, k.name)
        e = st.time_to_target_s
        if e is not None:  # T on the axis it is measured on, at the level it stands for
            has = e.has_interval and not e.exact
            xerr = [[e.mean - e.lo], [e.hi - e.mean]] if has else None
            face = color if has else "none"  # hollow: no interval (one seed)
            bar = ax.errorbar([e.mean], [t_level], xerr=xerr, fmt="o", color=color,
                              markersize=4, capsize=3, markerfacecolor=face)  # fmt: skip
            bar.lines[0].set_label(f"_T {k.name}")  # read back by the tests
            if band:  # the band T averages over: a tick across it
                ax.plot([e.mean, e.mean], [analysis.band_lo, analysis.target], color=color,
                        linewidth=1, alpha=0.6, label=f"_T band {k.name}")  # fmt: skip
    ax.axhline(analysis.target, color="0.5", linestyle=":", linewidth=1, label="target")
    if band:
        ax.axhspan(analysis.band_lo, analysis.target, color="0.5", alpha=0.08, linewidth=0,
                   label=f"band [{analysis.band_lo:g}, {analysis.target:g}]")  # fmt: skip
    if calibration:
        reach_ax.set_xlabel("calibrated training time (s): updates x the configuration's step time")
    else:
        reach_ax.set_xlabel("training time (s): generation + scoring + update + idle")
    ax.set_ylabel(metric_label(analysis, wrap=True))
    ax.set_title(f"accuracy against training time\n{t_words}\n{CURVE_NOTE}", fontsize=8)
    ax.legend(fontsize=6, ncol=2)
    return fig


def figure_seed_curves(analysis: Analysis, ncols: int = 4) -> Figure | None:
    """Small multiples: every seed's whole validation curve against responses, one panel
    per configuration (the curves the other figures summarise past the common range by
    the share of seeds at the target), with the target line, each seed's crossing of it
    (`seed_reach`) as a black tick on the line, and an x at the end of a seed that
    stopped short of it. Panels share both axes, so configurations compare across them."""
    keys = [k for k in sorted(analysis.stats, key=lambda k: k.sort_key())
            if any(r.eval_responses.size for r in analysis.runs_by_key[k])]  # fmt: skip
    if not keys:
        log.info("figure seed_curves: skipped (no evaluations)")
        return None
    ncols = min(ncols, len(keys))
    nrows = -(-len(keys) // ncols)
    fig = _figure(analysis, ncols, width=3.3, height=2.6, nrows=nrows)
    axes = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False).ravel()
    colors = _config_colors(keys)
    for ax, k in zip(axes, keys):
        runs = [r for r in analysis.runs_by_key[k] if r.eval_responses.size]
        reach = seed_reach(analysis, k)
        for r, rt in zip(runs, reach):
            ax.plot(r.eval_responses, r.eval_accuracy, color=colors[k], linewidth=0.8,
                    alpha=0.7, label=f"_seed {r.name}")  # fmt: skip
            if rt.reached:
                ax.plot([rt.n_star], [analysis.target], "|", color="k", markersize=7,
                        label=f"_cross {r.name}")  # fmt: skip
            else:
                ax.plot([r.eval_responses[-1]], [r.eval_accuracy[-1]], "x", color="C3",
                        markersize=5, label=f"_short {r.name}")  # fmt: skip
        ax.axhline(analysis.target, color="0.5", linestyle=":", linewidth=1)
        n_reached = sum(rt.reached for rt in reach)
        ax.set_title(f"B={k.batch} {k.label}: {n_reached}/{len(reach)} seeds reached",
                     fontsize=7)  # fmt: skip
    for ax in axes[len(keys) :]:
        ax.set_visible(False)
    for i, ax in enumerate(axes[: len(keys)]):
        if i + ncols >= len(keys):  # no panel under it: its x axis is labelled
            ax.tick_params(labelbottom=True)
            ax.set_xlabel("cumulative retained responses", fontsize=7)
        if i % ncols == 0:
            ax.set_ylabel(metric_label(analysis, wrap=True), fontsize=7)
    fig.suptitle(
        fig.get_suptitle() + "\nevery seed's own curve; tick: its crossing of the target "
        f"({analysis.crossing} crossing, as N* is read); x: ended short of the target",
        fontsize=9,
    )
    return fig


def _batch_steps(run: RunData, step_s: float | np.ndarray | None) -> tuple[np.ndarray, ...]:
    """A run's training batch (responses per update, as configured: P x G) against
    retained responses and against training seconds, as step curves [U + 1]."""
    batch_u = np.array([float(r.get("prompts", run.key.prompts)) for r in run.update_records])
    batch_u = batch_u * float(run.key.group_size)
    responses = np.concatenate([[0.0], run.responses])
    if step_s is not None:
        seconds = calibrated_seconds(step_s, np.arange(batch_u.size + 1.0))
    else:
        seconds = np.concatenate([[0.0], run.time_train])
    return responses, seconds, np.concatenate([batch_u[:1], batch_u])


def figure_schedule(analysis: Analysis) -> Figure | None:
    """Batch-size schedules against the best fixed batch: accuracy against responses
    (left) and against training time (right; calibrated where the sweep has a
    calibration), each with the share of seeds at the target (`_plot_reach`) and the
    training batch every seed had drawn under it, and T / T(best fixed) with its
    interval in the legend."""
    scheduled = findings.scheduled_configurations(analysis)
    best = findings.best_fixed_batch(analysis)
    if not scheduled or best is None:
        log.info("figure schedule: skipped (no batch schedule, or no fixed batch reached)")
        return None
    keys = [best, *scheduled]
    ratios = dict(findings.schedule_ratios(analysis))
    colors = _config_colors(keys)
    styles = {}
    for k in keys:
        r = ratios.get(k)
        t = "" if k == best else f", T/T_best {r.fmt('.3g') if r is not None else 'not reached'}"
        kind = findings.schedule_kind(analysis, k)
        label = (k.label if kind == k.variant else f"{k.label} ({kind})") + t
        styles[k] = {"color": colors[k], "label": label}
    fig = _figure(analysis, 2, width=5.6, height=2.4, nrows=3)
    (acc_n, acc_t), (r_n, r_t), (b_n, b_t) = fig.subplots(
        3, 2, sharex="col", height_ratios=[2.2, 0.8, 1]
    )
    _reach_axes_style(acc_n, r_n)
    _reach_axes_style(acc_t, r_t)
    _plot_curves(acc_n, r_n, analysis, keys, styles)
    r_n.set_xlabel("")
    for k in keys:
        seeds, grid, acc = time_curves(analysis, k)
        acc_t.plot(grid, acc.mean(axis=0), color=colors[k])
        crossings = [rt.time_to_target_s if rt.reached else None for rt in seed_reach(analysis, k)]
        _plot_reach(acc_t, r_t, seeds, crossings, colors[k], "-", k.name)
        for run in analysis.runs_by_key[k]:
            n, secs, b = _batch_steps(run, analysis.run_step_s.get(run.name))
            b_n.step(n, b, where="pre", color=colors[k], linewidth=0.8, alpha=0.5)
            b_t.step(secs, b, where="pre", color=colors[k], linewidth=0.8, alpha=0.5)
    acc_t.axhline(analysis.target, color="0.5", linestyle=":", linewidth=1)
    acc_t.set_ylabel(metric_label(analysis, wrap=True))
    acc_n.set_title(f"batch schedules against the best fixed batch (B = {best.batch})", fontsize=8)
    acc_t.set_title("the same against training time", fontsize=8)
    batches = sorted({int(b) for k in keys for r in analysis.runs_by_key[k]
                      for b in _batch_steps(r, None)[2]})  # fmt: skip
    for ax in (b_n, b_t):
        ax.set_yscale("log", base=2)
        ax.set_yticks(batches, [str(b) for b in batches])
        ax.yaxis.set_minor_locator(NullLocator())
        ax.set_ylabel("batch B = P x G\n(each seed)")
    b_n.set_xlabel("cumulative retained responses")
    b_t.set_xlabel("calibrated training time (s)" if analysis.calibrated else "training time (s)")
    return fig


def _config_colors(keys: Sequence[Configuration]) -> dict[Configuration, str]:
    """A distinct colour per configuration (tab10, then tab20), in sort order."""
    from matplotlib import colormaps

    ordered = sorted(set(keys), key=Configuration.sort_key)
    cmap = colormaps["tab10" if len(ordered) <= 10 else "tab20"]
    return {k: cmap(i % cmap.N) for i, k in enumerate(ordered)}


def figure_ratios(analysis: Analysis) -> Figure | None:
    """r_N and r_q against batch in one panel: T/T_ref is their ratio."""
    fam = critical_batch.family_keys(list(analysis.stats), reference=analysis.reference)
    pts = [(k, analysis.ratios[k]) for k in fam]
    if len(pts) < 2 or not any(r.r_q is not None for _, r in pts):
        log.info("figure ratios: skipped (fewer than two sqrt batches with r_q)")
        return None
    fig = _figure(analysis, 1, width=6.5)
    ax = fig.subplots()
    for name, color, marker in (("r_n", "C3", "o"), ("r_q", "C0", "s")):
        have = [(k, getattr(r, name)) for k, r in pts if getattr(r, name) is not None]
        if have:
            label = "r_N (sample cost)" if name == "r_n" else "r_q (throughput gain)"
            _errorbars(ax, [k.batch for k, _ in have], [e for _, e in have], color, marker,
                       label, linestyle="-")  # fmt: skip
    for k, r in pts:
        if r.r_n is None:
            ax.annotate(r.missing_label, (k.batch, 1.0), rotation=90, fontsize=7, ha="center")
    ax.axhline(1.0, color="0.5", linestyle=":", linewidth=1)
    ax.set_yscale("log", base=2)
    log_ticks(ax)
    _batch_axis(ax, [k.batch for k in fam])
    ax.set_xlabel("training batch B (responses)")
    ax.set_ylabel(f"ratio to the reference (B={analysis.reference.batch})")
    ax.set_title("larger batch is faster where r_q > r_N (T/T_ref = r_N / r_q)")
    ax.legend(fontsize=7)
    return fig


def log_ticks(ax, lo: float | None = None, hi: float | None = None) -> list[float]:
    """Readable labelled ticks on a log y axis: powers of 2 split into 2, 4 or 8 steps, as
    fine as needed for at least 4 ticks inside the axis' limits (``lo``, ``hi``; default
    the current ones); no minor labels. Returns the ticks."""
    if lo is None or hi is None:
        lo, hi = ax.get_ylim()
    ticks: list[float] = []
    for per_octave in (1, 2, 4, 8):
        k = np.arange(np.floor(np.log2(lo) * per_octave), np.ceil(np.log2(hi) * per_octave) + 1)
        ticks = [float(v) for v in 2.0 ** (k / per_octave) if lo <= v <= hi]
        if len(ticks) >= 4:
            break
    ax.set_yticks(ticks, [f"{v:.3g}" for v in ticks])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_ylim(lo, hi)
    return ticks


def figure_time_breakdown(analysis: Analysis) -> Figure | None:
    """Mean seconds per update in each part of training time, stacked, per batch."""
    rows = findings.time_per_update(analysis)
    if not rows:
        log.info("figure time_breakdown: skipped (no time_update_s)")
        return None
    labels = {"time_generate_s": "generation", "time_score_s": "scoring",
              "time_update_s": "update", "time_idle_s": "idle"}  # fmt: skip
    fig = _figure(analysis, 1, width=6.5)
    ax = fig.subplots()
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for i, part in enumerate(findings.COST_PARTS):
        h = np.array([parts[part] for _, parts in rows])
        ax.bar(x, h, 0.6, bottom=bottom, label=labels[part], color=f"C{i}")
        bottom += h
    shares = [parts["time_generate_s"] / total for (_, parts), total in zip(rows, bottom)]
    for i, share in enumerate(shares):
        ax.text(i, bottom[i], f"gen {share:.0%}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [str(b) for b, _ in rows])
    ax.set_xlabel("training batch B (responses)")
    ax.set_ylabel("seconds per update (mean over update lines)")
    ax.set_title(
        f"time per update by part: generation {min(shares):.0%}-{max(shares):.0%} of training"
    )
    ax.text(0.01, 0.99, BREAKDOWN_NOTE, transform=ax.transAxes, fontsize=6, color="0.35",
            va="top", ha="left", wrap=True)  # fmt: skip
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 0.93))
    return fig


# The bars are the runs' own clocks: with runs sharing the host (sweep.concurrent) a
# batch's seconds per update move with what ran beside it, so only the shares compare.
BREAKDOWN_NOTE = (
    "the runs' own timings, not the calibrated step times that T uses: runs that shared\n"
    "the host (sweep.concurrent) read slower, so compare the parts' shares, not the heights"
)


SIGNALS = (
    ("reward_mean", "mean reward"),
    ("entropy", "token entropy"),
    ("kl", None),  # labelled by kl_label: what the logged KL is depends on kl_coef
    ("response_len_mean", "response length (tokens)"),
)


def kl_label(runs: Sequence[RunData]) -> str:
    """What the logged ``kl`` is: k3 to the frozen reference (the initial policy) where
    the run's ``kl_coef > 0``, else k3 to the behaviour policy (the sampler's log-probs,
    before the update: ~0 with one update per batch)."""
    coefs = set()
    for r in runs:
        v = (r.config.get(r.key.algo) or {}).get("kl_coef") if r.config else None
        coefs.add(float(v or 0.0) > 0.0)
    if coefs == {True}:
        return "KL to the reference policy (k3; kl_coef > 0)"
    if coefs == {False}:
        return "KL to the behaviour policy (k3; kl_coef = 0)"
    return "KL (k3): to the reference where kl_coef > 0, else to the behaviour policy"


def binned_seeds(runs: Sequence[RunData], field: str, edges: np.ndarray) -> np.ndarray:
    """[R, K] per-run means of an update field in the responses bins ``edges`` ([K + 1]);
    a bin without an update line inside the run's range (a batch wider than a bin) is
    interpolated between its neighbours; NaN outside the run's range."""
    k = len(edges) - 1
    rows = []
    for r in runs:
        v = r.field(field)
        ok = np.isfinite(v)
        idx = np.clip(np.searchsorted(edges, r.responses[ok], side="left") - 1, 0, k - 1)
        sums, counts = np.zeros(k), np.zeros(k)
        np.add.at(sums, idx, v[ok])
        np.add.at(counts, idx, 1)
        row = np.full(k, np.nan)
        has = counts > 0
        row[has] = sums[has] / counts[has]
        if has.sum() >= 2:
            i0, i1 = np.flatnonzero(has)[[0, -1]]
            inner = np.arange(i0, i1 + 1)
            row[inner] = np.interp(inner, np.flatnonzero(has), row[has])
        rows.append(row)
    return np.stack(rows) if rows else np.full((0, k), np.nan)


def plot_binned(ax, runs: Sequence[RunData], field: str, edges: np.ndarray, color, style,
                label: str | None, floor: float | None = None) -> None:  # fmt: skip
    """One configuration's update field against responses: the seed mean of binned values
    (`binned_seeds`) where every seed has data, the seed min-max band, and each seed's own
    bin means past that as faint dots (no survivors-only mean; dots, as lines 12 seeds x
    8 configurations cross into a tangle). ``floor``: values below it are drawn at it
    (the k3 KL is never negative; below 0 is float rounding)."""
    centers = 0.5 * (edges[1:] + edges[:-1])
    v_rk = binned_seeds(runs, field, edges)
    if floor is not None:
        v_rk = np.where(np.isfinite(v_rk), np.maximum(v_rk, floor), v_rk)
    all_k = np.isfinite(v_rk).all(axis=0)
    filled = np.where(all_k, v_rk, 0.0)
    mean = np.where(all_k, filled.mean(axis=0), np.nan)
    ax.plot(centers, mean, color=color, linestyle=style, linewidth=1.2, label=label)
    if len(runs) > 1:
        lo = np.where(all_k, np.min(np.where(all_k, v_rk, np.inf), axis=0), np.nan)
        hi = np.where(all_k, np.max(np.where(all_k, v_rk, -np.inf), axis=0), np.nan)
        ax.fill_between(centers, lo, hi, color=color, alpha=0.15, linewidth=0)
    past = ~all_k & (np.cumsum(all_k[::-1])[::-1] == 0)  # bins after the common range
    if past.any():  # dots, not lines: 12 seeds x 8 configurations of lines are a tangle
        for row in v_rk:
            ax.plot(centers[past], row[past], ".", color=color, **SEED_STYLE)


SIGNAL_NOTE = (
    "lines: seed mean where every seed has data, band: seed min-max; dots: each seed's "
    "bin means past that"
)
KL_FLOOR = 1e-6  # a k3 KL below this at every update is ~0 (float rounding), drawn so


def _field_max(runs: Sequence[RunData], field: str) -> float:
    """The largest finite value of an update field over the runs (0 without any)."""
    vals = [np.nanmax(v) for r in runs if r.has_field(field)
            for v in [r.field(field)] if np.isfinite(v).any()]  # fmt: skip
    return float(max(vals)) if vals else 0.0


def kl_axis(ax, runs: Sequence[RunData]) -> None:
    """The KL panel's y range from 0 (k3 is never negative; values below 0 are drawn at
    0) and, when every value stays under `KL_FLOOR`, up to it with a note that it is ~0."""
    top = _field_max(runs, "kl")
    if top < KL_FLOOR:
        ax.set_ylim(0.0, KL_FLOOR)
        ax.text(0.5, 0.5, f"KL < {KL_FLOOR:g} at every update: ~0 (float rounding;\n"
                "values below 0 drawn at 0)", transform=ax.transAxes, ha="center",
                va="center", fontsize=7, color="0.3")  # fmt: skip
    else:
        ax.set_ylim(bottom=0.0)


def figure_training_signals(analysis: Analysis, bins: int = 30) -> Figure | None:
    """Reward, entropy, KL and response length against responses: per configuration, the
    seed mean of binned values where every seed has data, the seed min-max band, and
    each seed's own bin means (faint dots) past that; one colour per configuration."""
    keys = [k for k in sorted(analysis.stats, key=lambda k: k.sort_key())
            if analysis.runs_by_key[k]]  # fmt: skip
    runs = [r for k in keys for r in analysis.runs_by_key[k]]
    fields = [(f, name) for f, name in SIGNALS if any(r.has_field(f) for r in runs)]
    if not fields:
        log.info("figure training_signals: skipped (no reward, entropy, KL or length logged)")
        return None
    fig = _figure(analysis, 2, height=3.2, nrows=2)
    axes = fig.subplots(2, 2).ravel()
    colors = _config_colors(keys)
    edges = np.linspace(0.0, max(r.final_responses for r in runs) or 1.0, bins + 1)
    for ax, (field, name) in zip(axes, fields):
        floor = 0.0 if field == "kl" else None  # k3 >= 0: a value below 0 is rounding
        for k in keys:
            own = [r for r in analysis.runs_by_key[k] if r.has_field(field)]
            if own:
                style = "-" if k.lr_rule == "sqrt" else "--"
                label = f"B={k.batch} {k.label}" if ax is axes[0] else None
                plot_binned(ax, own, field, edges, colors[k], style, label, floor)
        ax.set_xlabel("cumulative retained responses")
        ax.set_ylabel(name or kl_label(runs), fontsize=8)
        if field == "kl":
            kl_axis(ax, runs)
        elif field == "response_len_mean":  # from 0: a 31-32 token range reads as a swing
            ax.set_ylim(0.0, 1.1 * max(_field_max(runs, field), 1.0))
    for ax in axes[len(fields) :]:
        ax.set_visible(False)
    axes[0].legend(fontsize=6, ncol=2)
    axes[0].set_title(SIGNAL_NOTE, fontsize=7)
    return fig


def figure_critic(analysis: Analysis) -> Figure | None:
    """PPO: the critic's explained variance per update (warm-up included, one line per
    run) and N* against the critic's settings at the reference (batch scale, LR rule)."""
    runs = [(k, r) for k in sorted(analysis.stats, key=lambda k: k.sort_key())
            for r in analysis.runs_by_key[k]]  # fmt: skip
    field = "explained_variance"
    runs = [(k, r) for k, r in runs if any(x.get(field) is not None
            for x in (*r.warmup_records, *r.update_records))]  # fmt: skip
    if not runs:
        log.info("figure critic: skipped (no explained_variance logged)")
        return None
    fig = _figure(analysis, 2)
    ax, ax2 = fig.subplots(1, 2)
    colors = _batch_colors([k.batch for k, _ in runs])
    labelled = set()
    for k, r in runs:
        ev = [np.nan if x.get(field) is None else float(x[field])
              for x in (*r.warmup_records, *r.update_records)]  # fmt: skip
        updates = np.arange(1, len(ev) + 1) - r.warmup_updates
        label = k.label if k not in labelled else None
        labelled.add(k)
        ax.plot(updates, ev, color=colors[k.batch], linestyle="--" if k.critic else "-",
                linewidth=0.8, alpha=0.8, label=label)  # fmt: skip
    ax.axvline(0.5, color="0.5", linewidth=0.8, linestyle=":")
    ax.axhline(0.0, color="0.7", linewidth=0.6)
    ax.set_xlabel("update (critic warm-up at <= 0, the actor from 1)")
    ax.set_ylabel("critic explained variance (fresh batch)")
    ax.legend(fontsize=6)
    ref = analysis.reference
    keys = [ref, *findings.critic_variants(analysis)]
    ests = [analysis.ratios[k].r_n for k in keys]
    if len(keys) < 2 or any(e is None for e in ests):
        ax2.set_visible(False)
        return fig
    x = np.arange(len(keys))
    _errorbars(ax2, x, ests, "C0", "o", "N* / N*(critic default)")
    ax2.axhline(1.0, color="0.5", linewidth=0.8, linestyle=":")
    ax2.set_xticks(x, [k.critic or "default" for k in keys])
    ax2.set_xlabel(f"critic settings at B={ref.batch} (kK: critic steps once per K batches)")
    ax2.set_ylabel("r_N against the reference")
    return fig


def save_figure(fig: Figure, out_dir: str, name: str) -> list[str]:
    """Saves ``fig`` as ``<out_dir>/<name>.png`` and ``.pdf``; returns the paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for ext in FORMATS:
        path = os.path.join(out_dir, f"{name}.{ext}")
        fig.savefig(path, dpi=120)
        paths.append(path)
    return paths


def write_figures(
    analysis: Analysis,
    out_dir: str,
    generation: cost_model.GenerationReport | None = None,
    tol: float = critical_batch.DEFAULT_TOL,
) -> tuple[list[str], list[str]]:
    """Writes every figure that has data.

    Args:
      analysis: the sweep analysis.
      out_dir: output directory.
      generation: critical generation batch report (for ``critical_batches``).
      tol: r_N tolerance of the critical training batch.

    Returns:
      (written paths, names of the skipped figures).
    """
    makers = {
        "invariance": lambda: figure_invariance(analysis, tol),
        "group_size": lambda: figure_group_size(analysis),
        "lr_rule": lambda: figure_lr_rule(analysis),
        "throughput_ratio": lambda: figure_throughput_ratio(analysis),
        "critical_batches": lambda: figure_critical_batches(analysis, generation, tol),
        "time_to_target": lambda: figure_time_to_target(analysis),
        "accuracy_vs_time": lambda: figure_accuracy_vs_time(analysis),
        "seed_curves": lambda: figure_seed_curves(analysis),
        "ratios": lambda: figure_ratios(analysis),
        "time_breakdown": lambda: figure_time_breakdown(analysis),
        "training_signals": lambda: figure_training_signals(analysis),
    }
    if analysis.reference.algo == "ppo":
        makers["critic"] = lambda: figure_critic(analysis)
    if findings.scheduled_configurations(analysis):
        makers["schedule"] = lambda: figure_schedule(analysis)
    written, skipped = [], []
    for name, make in makers.items():
        fig = make()
        if fig is None:
            skipped.append(name)
            continue
        written += save_figure(fig, out_dir, name)
    return written, skipped


def load_generation(
    sweep_dir: str, runs: Sequence[RunData], throughput_path: str | None = None
) -> cost_model.GenerationReport | None:
    """Critical generation batch from ``throughput_path`` (default
    ``<sweep>/throughput.json`` when present), else from the sweep's interleaved
    calibration (``calibration.json``), else from the runs' metrics."""
    path = throughput_path or os.path.join(sweep_dir, cost_model.THROUGHPUT_FILE)
    if throughput_path is not None and not os.path.exists(path):
        raise FileNotFoundError(f"throughput file {path} does not exist")
    tp = cost_model.load_throughput(path) if os.path.exists(path) else None
    calibration = artifacts.read_calibration_generation(sweep_dir)
    return cost_model.generation_report(tp, runs, calibration=calibration)


def write_all(
    sweep_dir: str,
    target: float | None = None,
    reference: str | None = None,
    tol: float = critical_batch.DEFAULT_TOL,
    throughput_path: str | None = None,
    n_boot: int = DEFAULT_N_BOOT,
) -> list[str]:
    """Writes ``<sweep>/figures/*.png|pdf`` and ``<sweep>/report.md``.

    Args:
      sweep_dir: the sweep directory.
      target: validation target (``None``: ``sweep.json``'s).
      reference: reference configuration (``None``: ``sweep.json``'s, see
        ``time_to_target.resolve_reference``).
      tol: r_N tolerance of the critical training batch.
      throughput_path: throughput file (default ``<sweep>/throughput.json`` if present).
      n_boot: bootstrap replicates.

    Returns:
      The written paths (figures, then the report).
    """
    from rl_batch.analysis import report  # Imports this module: keep the import local.

    sweep = load_sweep(sweep_dir)
    analysis = analyze_sweep(sweep, target, reference, n_boot=n_boot)
    runs = [r for rs in analysis.runs_by_key.values() for r in rs]
    generation = load_generation(sweep_dir, runs, throughput_path)
    fig_dir = os.path.join(sweep_dir, artifacts.FIGURES_DIR)
    written, skipped = write_figures(analysis, fig_dir, generation, tol)
    text = report.build_report(analysis, generation, tol=tol, figures=written, skipped=skipped)
    path = os.path.join(sweep_dir, artifacts.REPORT_FILE)
    with open(path, "w") as f:
        f.write(text)
    return [*written, path]
