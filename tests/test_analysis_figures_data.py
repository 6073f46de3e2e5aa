"""Figures that draw the data as it is: no survivors-only means, curves to their end on
the clock T is measured on, the study's metric on the y axis, per-configuration signal
means, readable log ticks and the calibration's intervals (issue 37)."""

import math
import os

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.analysis import cost_model, curves, figures
from rl_batch.analysis import time_to_target as ttt

FACTORS = (0.8, 0.95, 1.05, 1.3)  # seeds' tau factors: they reach the target apart


def _stopping_sweep(sweep_dir: str, calibrate: bool = True) -> str:
    """The standard synthetic sweep, each seed stopped at the evaluation that reaches the
    target (as ``stop_at_target`` runs do), with a 5-round calibration.json."""
    fx.write_sweep(sweep_dir, seed_factors=FACTORS)
    rng = np.random.default_rng(0)
    configs = {}
    for p, g, rule, mult in fx.STANDARD_CONFIGS:
        for s, f in enumerate(FACTORS):
            tau = fx.TAU0 * mult * f
            n_star = tau * math.log(1 / (1 - fx.TARGET))
            if n_star < fx.BUDGET:
                budget = int(n_star // fx.EVAL_EVERY + 1) * fx.EVAL_EVERY
                run_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR, fx.run_name(p, g, rule, s))
                fx.write_run(run_dir, prompts=p, group_size=g, lr_rule=rule, seed=s, tau=tau,
                             budget=budget)  # fmt: skip
        b = p * g
        steps = [fx.time_per_update_s(b) * (1 + 0.05 * rng.standard_normal()) for _ in range(5)]
        tok = [b / fx.step_time_s(b) * (1 + 0.04 * rng.standard_normal()) for _ in range(5)]
        configs[f"{p}x{g}:{rule}"] = {
            "batch": b, "step_s": steps, "step_s_median": float(np.median(steps)),
            "gen_concurrency": b, "gen_tokens_per_s": tok, "generate_s": steps,
        }  # fmt: skip
    if calibrate:
        cal = {"version": 1, "rounds": 5, "steps": 2, "configs": configs}
        artifacts.write_json_atomic(os.path.join(sweep_dir, artifacts.CALIBRATION_FILE), cal)
    return sweep_dir


@pytest.fixture(scope="module")
def stopping(tmp_path_factory):
    d = _stopping_sweep(str(tmp_path_factory.mktemp("stop")))
    return ttt.analyze_sweep(curves.load_sweep(d), n_boot=100)


def test_mean_curve_only_where_every_seed_has_data(tmp_path):
    # Two seeds: one stops at 1024 responses (it reached), one runs to 3072.
    for seed, (tau, budget) in enumerate(((500.0, 1024), (4000.0, 3072))):
        fx.write_run(str(tmp_path / f"s{seed}"), prompts=8, group_size=8, tau=tau, seed=seed,
                     budget=budget)  # fmt: skip
    runs = [curves.load_run(str(tmp_path / f"s{seed}")) for seed in (0, 1)]
    grid = np.linspace(0.0, 3072.0, 13)  # every 256 responses
    mean, lo, hi = curves.mean_curve(runs, grid)
    both = grid <= 1024
    expect = [np.interp(grid[both], r.eval_responses, r.eval_accuracy) for r in runs]
    np.testing.assert_allclose(mean[both], np.mean(expect, axis=0))
    np.testing.assert_allclose(lo[both], np.min(expect, axis=0))
    # Past the fast seed's stop, a mean of the slow seed alone would fall from ~0.55 to
    # ~0.27 (survivorship; the old nanmean did): none is drawn.
    assert np.isnan(mean[~both]).all() and np.isnan(hi[~both]).all()
    ys = [y for _, y in curves.seed_curves(runs, grid)]
    assert np.isfinite(ys[1]).all() and np.isnan(ys[0][~both]).all()


def _lines(ax):
    return [ln for ln in ax.get_lines() if len(ln.get_xdata()) > 1]


def _reach_lines(ax) -> dict[str, object]:
    """Configuration name -> its share-of-seeds-at-the-target step line (``_reach <name>``)."""
    return {ln.get_label()[len("_reach ") :]: ln for ln in ax.get_lines()
            if ln.get_label().startswith("_reach ")}  # fmt: skip


def test_curves_stop_at_the_first_stop_and_the_strip_runs_to_every_seeds_end(stopping):
    fig = figures.figure_invariance(stopping)
    ax, reach_ax = fig.axes[0], fig.axes[2]
    fam = [k for k in stopping.stats if k.lr_rule == "sqrt" and k.group_size == 8]
    runs = [r for k in fam for r in stopping.runs_by_key[k]]
    # The curves panel: one mean per configuration and the target line, no seed tails.
    data = [ln for ln in _lines(ax) if not ln.get_label().startswith("_")]
    assert sorted(ln.get_label() for ln in data) == sorted(
        [f"B={k.batch} ({k.label})" for k in fam] + ["target"]
    )
    for k in fam:
        mean = next(ln for ln in data if ln.get_label() == f"B={k.batch} ({k.label})")
        x, y = mean.get_xdata(), mean.get_ydata()
        first_stop = min(float(r.eval_responses[-1]) for r in stopping.runs_by_key[k])
        assert float(np.max(x[np.isfinite(y)])) <= first_stop  # no survivors-only mean
    # The strip below reaches the last seed's end: nothing is cut at the first stop.
    last = max(float(r.eval_responses[-1]) for r in runs)
    ends = [float(ln.get_xdata()[-1]) for ln in _reach_lines(reach_ax).values()]
    assert max(ends) == pytest.approx(last)
    assert ax.get_ylabel() == "validation accuracy\n(mean@4)"
    # The figure says what it draws: the note on the panel, the strip's caption.
    assert figures.CURVE_NOTE in [t.get_text() for t in ax.texts]
    assert "share of seeds at the target" in reach_ax.get_title(loc="left")
    assert "share of seeds at the target" in figures.figure_accuracy_vs_time(stopping).axes[
        1].get_title(loc="left")  # fmt: skip


def test_reach_strip_steps_at_each_seeds_crossing_as_the_report_reads_it(stopping):
    # Single target (no band): each step is one seed's N* (responses) or T (calibrated
    # seconds), the per-seed numbers the report's means are taken over.
    assert stopping.band_lo is None and stopping.calibrated
    inv = _reach_lines(figures.figure_invariance(stopping).axes[2])
    vs_t = _reach_lines(figures.figure_accuracy_vs_time(stopping).axes[1])
    fam = [k for k in stopping.stats if k.lr_rule == "sqrt" and k.group_size == 8]
    assert set(inv) == {k.name for k in fam} and set(vs_t) == {k.name for k in stopping.stats}
    for k in fam:
        seeds = [stopping.targets[r.name] for r in stopping.runs_by_key[k]]
        assert all(t.reached for t in seeds)
        n = len(seeds)
        x, share = inv[k.name].get_xdata(), inv[k.name].get_ydata()
        np.testing.assert_allclose(x[1:-1], sorted(t.n_star for t in seeds))
        np.testing.assert_allclose(share, [*(np.arange(n + 1) / n), 1.0])
        assert np.mean(x[1:-1]) == pytest.approx(stopping.stats[k].n_star.mean)  # report's N*
        xt = vs_t[k.name].get_xdata()
        np.testing.assert_allclose(xt[1:-1], sorted(t.time_to_target_s for t in seeds))
        assert np.mean(xt[1:-1]) == pytest.approx(stopping.stats[k].time_to_target_s.mean)
    # One seed by hand: acc(n) = 1 - exp(-n / tau), evaluations every 256 responses, N*
    # at the linear crossing of 0.8 (the fixture's sweep.json reads N* so).
    assert stopping.crossing == "linear"
    k = artifacts.Configuration("grpo", 8, 8, "sqrt")
    tau = fx.TAU0 * FACTORS[0]
    e1 = math.ceil(tau * math.log(5) / fx.EVAL_EVERY) * fx.EVAL_EVERY  # first eval >= 0.8
    e0 = e1 - fx.EVAL_EVERY
    a0, a1 = 1 - math.exp(-e0 / tau), 1 - math.exp(-e1 / tau)
    n_lin = e0 + (0.8 - a0) * (e1 - e0) / (a1 - a0)
    assert inv[k.name].get_xdata()[1] == pytest.approx(n_lin)


def test_a_seed_short_of_the_target_is_marked_and_keeps_the_share_below_all(stopping):
    # P = 64 fixed never reaches 0.8 within the budget (tau x 10): 0 of 4 at its end.
    k = artifacts.Configuration("grpo", 64, 8, "fixed")
    runs = stopping.runs_by_key[k]
    assert not any(stopping.targets[r.name].reached for r in runs)
    fig = figures.figure_accuracy_vs_time(stopping)
    ax, reach_ax = fig.axes
    line = _reach_lines(reach_ax)[k.name]
    assert list(line.get_ydata()) == [0.0, 0.0]
    step_s = stopping.sweep.calibration[k.key]
    assert line.get_xdata()[-1] == pytest.approx(
        max(float(figures.eval_times(r, step_s)[-1]) for r in runs))  # fmt: skip
    marks = [ln for ln in ax.get_lines() if ln.get_label() == f"_short {k.name}"]
    got = sorted((float(m.get_xdata()[0]), float(m.get_ydata()[0])) for m in marks)
    want = sorted((float(figures.eval_times(r, step_s)[-1]), float(r.eval_accuracy[-1]))
                  for r in runs)  # fmt: skip
    np.testing.assert_allclose(got, want)
    # Configurations whose seeds all reached have no such mark.
    assert all(ln.get_label().split(" ")[-1] == k.name for ln in ax.get_lines()
               if ln.get_label().startswith("_short "))  # fmt: skip


def test_seed_curves_draw_every_seed_whole_with_its_crossing(stopping):
    fig = figures.figure_seed_curves(stopping)
    keys = sorted(stopping.stats, key=lambda k: k.sort_key())
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert len(panels) == len(keys)
    for ax, k in zip(panels, keys):
        runs = stopping.runs_by_key[k]
        n_reached = sum(stopping.targets[r.name].reached for r in runs)
        assert ax.get_title().endswith(f": {n_reached}/{len(runs)} seeds reached")
        for r in runs:  # the seed's own evaluations, to its last one
            (ln,) = [ln for ln in ax.get_lines() if ln.get_label() == f"_seed {r.name}"]
            np.testing.assert_allclose(ln.get_xdata(), r.eval_responses)
            np.testing.assert_allclose(ln.get_ydata(), r.eval_accuracy)
            t = stopping.targets[r.name]
            marks = [m for m in ax.get_lines() if m.get_label() in (f"_cross {r.name}",
                     f"_short {r.name}")]  # fmt: skip
            assert len(marks) == 1
            if t.reached:
                assert marks[0].get_label() == f"_cross {r.name}"
                assert float(marks[0].get_xdata()[0]) == pytest.approx(t.n_star)
                assert float(marks[0].get_ydata()[0]) == stopping.target
            else:
                assert marks[0].get_label() == f"_short {r.name}"


def test_accuracy_vs_time_on_the_calibrated_clock_with_t_on_the_target_line(stopping):
    assert stopping.calibrated
    fig = figures.figure_accuracy_vs_time(stopping)
    ax, reach_ax = fig.axes
    assert reach_ax.get_xlabel().startswith("calibrated training time")
    k = artifacts.Configuration("grpo", 32, 8, "sqrt")
    step_s = stopping.sweep.calibration[k.key]
    ends = [float(figures.eval_times(r, step_s)[-1]) for r in stopping.runs_by_key[k]]
    assert min(ends) < max(ends)  # the seeds stop apart
    # The mean stops at the first stop; the strip goes on to the last seed's end.
    mean = next(ln for ln in ax.get_lines() if ln.get_label().startswith(f"B={k.batch} "))
    assert float(np.max(mean.get_xdata())) == pytest.approx(min(ends))
    assert float(_reach_lines(reach_ax)[k.name].get_xdata()[-1]) == pytest.approx(max(ends))
    # T (calibrated) is marked on the target line of the axis it is measured on.
    t = stopping.stats[k].time_to_target_s.mean
    marks = [ln for ln in ax.get_lines() if ln.get_label().startswith("_T ")]
    assert any(float(m.get_xdata()[0]) == pytest.approx(t) for m in marks)
    assert all(float(m.get_ydata()[0]) == stopping.target for m in marks)


def test_y_label_names_the_sweeps_metric(tmp_path):
    d = fx.write_sweep(str(tmp_path))
    for name in os.listdir(os.path.join(d, artifacts.RUNS_DIR)):
        path = os.path.join(d, artifacts.RUNS_DIR, name, artifacts.METRICS_FILE)
        lines = artifacts.read_metrics(os.path.dirname(path))
        with open(path, "w") as f:
            for rec in lines:
                if rec.get("kind") == "eval":
                    rec = {**rec, "eval_metric": "p_ref"}
                f.write(__import__("json").dumps(rec) + "\n")
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    assert "p_ref" in figures.figure_invariance(a).axes[0].get_ylabel()
    assert "p_ref" in figures.figure_accuracy_vs_time(a).axes[0].get_ylabel()


def test_training_signals_one_mean_per_configuration_and_kl_named(stopping):
    fig = figures.figure_training_signals(stopping)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    labels = [ln.get_label() for ln in axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert len(labels) == len(stopping.stats)  # one labelled line per configuration
    colors = {tuple(ln.get_color()) for ln in axes[0].get_lines() if ln.get_label() in labels}
    assert len(colors) == len(labels)  # two B = 128 configurations no longer share one
    ylabels = [ax.get_ylabel() for ax in axes]
    assert "KL to the behaviour policy (k3; kl_coef = 0)" in ylabels


def test_time_breakdown_says_its_bars_are_the_runs_own_clocks(stopping):
    (ax,) = figures.figure_time_breakdown(stopping).axes
    assert figures.BREAKDOWN_NOTE in [t.get_text() for t in ax.texts]
    heights = [p.get_height() for p in ax.patches]
    assert heights and all(h >= 0 for h in heights)


def test_kl_label_follows_kl_coef(stopping):
    runs = [r for rs in stopping.runs_by_key.values() for r in rs][:2]
    with_ref = [r.__class__(**{**r.__dict__, "config": {"grpo": {"kl_coef": 0.01}}}) for r in runs]
    assert figures.kl_label(with_ref) == "KL to the reference policy (k3; kl_coef > 0)"
    assert "where kl_coef > 0" in figures.kl_label([with_ref[0], runs[1]])


def test_ratios_log_axis_has_readable_ticks(stopping):
    ax = figures.figure_ratios(stopping).axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) >= 4 and "1" in labels


@pytest.mark.parametrize("lo,hi,expect", [(0.9, 1.2, 4), (0.5, 4.0, 4), (0.7, 3.0, 5)])
def test_log_ticks_are_dense_enough(lo, hi, expect):
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    ax.set_yscale("log", base=2)
    ticks = figures.log_ticks(ax, lo, hi)
    assert len(ticks) >= expect and all(lo <= t <= hi for t in ticks)


def test_critical_batches_show_the_calibrations_intervals(stopping):
    gen = cost_model.generation_report(
        None,
        [r for rs in stopping.runs_by_key.values() for r in rs],
        calibration=artifacts.read_calibration_generation(stopping.sweep.sweep_dir),
    )
    fig = figures.figure_critical_batches(stopping, gen)
    left, right = fig.axes[:2]
    legend = [t.get_text() for t in left.get_legend().get_texts()]
    assert any("t interval over rounds" in t for t in legend)
    assert any(t.startswith("plateau CI walk") for t in legend)
    assert any("critical training batch: CI walk" in t.get_text()
               for t in right.get_legend().get_texts())  # fmt: skip


def test_binned_signal_mean_only_where_every_seed_has_data(tmp_path):
    from matplotlib.figure import Figure

    for seed, budget in enumerate((1024, 3072)):
        fx.write_run(str(tmp_path / f"s{seed}"), prompts=8, group_size=8, tau=2000.0,
                     seed=seed, budget=budget)  # fmt: skip
    runs = [curves.load_run(str(tmp_path / f"s{seed}")) for seed in (0, 1)]
    edges = np.linspace(0.0, 3072.0, 13)  # bins of 256 responses: one update of 64 in four
    v_rk = figures.binned_seeds(runs, "grad_norm", edges)
    assert np.isfinite(v_rk[1]).all() and np.isnan(v_rk[0][4:]).all()
    ax = Figure().subplots()
    figures.plot_binned(ax, runs, "grad_norm", edges, "C0", "-", "mean")
    mean, *tails = ax.get_lines()
    x, y = mean.get_xdata(), mean.get_ydata()
    assert np.isfinite(y[x < 1024]).all() and np.isnan(y[x > 1024]).all()
    assert len(tails) == 2  # each seed's own values past the common range, as dots
    for tail, r in zip(tails, v_rk):
        assert tail.get_linestyle() == "None" and tail.get_marker() == "."
        past = tail.get_xdata() > 1024
        assert past.all()  # only the bins past the common range
        np.testing.assert_allclose(tail.get_ydata(), r[4:])
