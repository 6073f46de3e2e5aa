"""Each figure draws what its title, axes and the report say (issue 50): the plotted data
are read back from the matplotlib artists (lines' x/y data, legend and text labels) and
compared with the report's numbers, on small synthetic sweeps (`analysis_fixtures`)."""

import json
import math
import os
import re

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.analysis import cost_model, critical_batch, curves, figures, report
from rl_batch.analysis import time_to_target as ttt

BAND_LO = 0.6  # the band [0.6, 0.8] below the fixtures' target 0.8


def _set_band(sweep_dir: str, band_lo: float) -> None:
    path = os.path.join(sweep_dir, artifacts.SWEEP_FILE)
    sw = artifacts.read_json(path)
    artifacts.write_json_atomic(path, {**sw, "target_band_lo": band_lo})


def _rewrite_updates(sweep_dir: str, fields) -> None:
    """Sets update-line fields in every run: ``fields(run_name, i) -> dict``."""
    for name in os.listdir(os.path.join(sweep_dir, artifacts.RUNS_DIR)):
        run_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR, name)
        recs = artifacts.read_metrics(run_dir)
        out, i = [], 0
        for rec in recs:
            if rec.get("kind") != "eval":
                rec = {**rec, **fields(name, i)}
                i += 1
            out.append(json.dumps(rec) + "\n")
        with open(os.path.join(run_dir, artifacts.METRICS_FILE), "w") as f:
            f.writelines(out)


@pytest.fixture(scope="module")
def band(tmp_path_factory):
    d = fx.write_sweep(str(tmp_path_factory.mktemp("band")))
    _set_band(d, BAND_LO)
    return ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)


def _t_markers(ax) -> dict[str, tuple[float, float]]:
    """Configuration name -> (x, y) of its T marker (labelled ``_T <name>``)."""
    return {
        ln.get_label()[3:]: (float(ln.get_xdata()[0]), float(ln.get_ydata()[0]))
        for ln in ax.get_lines()
        if ln.get_label().startswith("_T ") and not ln.get_label().startswith("_T band")
    }


def test_accuracy_vs_time_draws_the_band_mean_t_where_the_curves_are_in_the_band(band):
    assert band.band_lo == BAND_LO
    ax = figures.figure_accuracy_vs_time(band).axes[0]
    assert "geometric mean of the crossing times of the 9 levels" in ax.get_title()
    assert f"[{BAND_LO:g}, {fx.TARGET:g}]" in ax.get_title()
    marks = _t_markers(ax)
    reached = {k.name: s for k, s in band.stats.items() if s.time_to_target_s is not None}
    assert set(marks) == set(reached)
    table = "\n".join(report.config_table(band))
    for name, (x, y) in marks.items():
        t = reached[name].time_to_target_s.mean
        assert x == pytest.approx(t)  # the report's T, on the axis it is measured on
        assert f"| {t:.4g} [" in table
        assert y == pytest.approx(0.5 * (BAND_LO + fx.TARGET))  # mid-band, not the target
    # The band T is what the curves do: the seed-mean curve at x = T lies inside the band
    # (here acc = 1 - exp(-n / tau), T's level ~ 0.71), below the target it reaches later.
    for k in band.stats:
        if k.name not in marks:
            continue
        seeds, grid, acc = figures.time_curves(band, k)
        mean = acc.mean(axis=0)
        t = marks[k.name][0]
        assert BAND_LO < float(np.interp(t, grid, mean)) < fx.TARGET
        t_target = float(np.interp(fx.TARGET, mean, grid))  # mean is increasing here
        assert t < t_target
    # Each T has a tick across the band it averages over.
    ticks = [ln for ln in ax.get_lines() if ln.get_label().startswith("_T band")]
    assert len(ticks) == len(marks)
    assert all(list(ln.get_ydata()) == [BAND_LO, fx.TARGET] for ln in ticks)


def test_reach_strip_steps_at_the_target_itself_later_than_the_band_t(band):
    # With a band, T is a band mean (mid-band marker); the strip's steps are where each
    # seed reaches the target itself: its single-target T, later than its band T.
    assert band.band_lo == BAND_LO and not band.calibrated
    reach_ax = figures.figure_accuracy_vs_time(band).axes[1]
    lines = {ln.get_label()[len("_reach ") :]: ln for ln in reach_ax.get_lines()
             if ln.get_label().startswith("_reach ")}  # fmt: skip
    assert set(lines) == {k.name for k in band.stats}
    for k, st in band.stats.items():
        runs = band.runs_by_key[k]
        at_target = [ttt.run_time_to_target(r, fx.TARGET, None, None, band.crossing)
                     for r in runs]  # fmt: skip
        x, share = lines[k.name].get_xdata(), lines[k.name].get_ydata()
        done = sorted(t.time_to_target_s for t in at_target if t.reached)
        np.testing.assert_allclose(x[1:-1], done)
        assert share[-1] == pytest.approx(len(done) / len(runs))
        assert (share[-1] == 1.0) == (st.time_to_target_s is not None)  # the report's "reached"
        for r, t in zip(runs, at_target):
            if t.reached:
                assert t.time_to_target_s > band.targets[r.name].time_to_target_s


def test_accuracy_vs_time_single_target_marks_t_on_the_target_line(tmp_path):
    a = ttt.analyze_sweep(curves.load_sweep(fx.write_sweep(str(tmp_path))), n_boot=50)
    ax = figures.figure_accuracy_vs_time(a).axes[0]
    assert "markers on the target line" in ax.get_title()
    marks = _t_markers(ax)
    assert marks and all(y == fx.TARGET for _, y in marks.values())
    for k, s in a.stats.items():
        if k.name in marks:
            assert marks[k.name][0] == pytest.approx(s.time_to_target_s.mean)


def _gen(calibration: dict[float, list[float]]) -> cost_model.GenerationReport:
    return cost_model.generation_report(None, (), calibration=calibration)


def test_generation_r2_is_on_the_tokens_per_s_drawn(tmp_path):
    # Step times c / tokens/s lie close to a line (R^2 0.993 on them), but its tokens/s
    # c / (a + b c) misses c = 8 by +40%: R^2 on the tokens/s drawn is 0.956.
    c = np.array([8.0, 64.0, 256.0, 512.0])
    tps = np.array([1000.0, 7000.0, 8800.0, 9200.0])
    gen = _gen({x: [t] for x, t in zip(c, tps)})
    b, a = np.polyfit(c, c / tps, 1)
    pred = c / (a + b * c)
    step_r2 = 1 - np.sum((c / tps - (a + b * c)) ** 2) / np.sum((c / tps - np.mean(c / tps)) ** 2)
    assert step_r2 > 0.99  # what the report used to print
    want = 1 - np.sum((tps - pred) ** 2) / np.sum((tps - tps.mean()) ** 2)
    assert gen.fit.r2 == pytest.approx(want) and gen.fit.r2 < 0.96
    assert gen.fit.max_rel_residual == pytest.approx(np.max(np.abs(pred / tps - 1)))
    assert gen.fit.rel_residuals[0] == pytest.approx(0.397, abs=0.001)  # misses c = 8
    assert cost_model.fit_problems(gen) == ["the fit misses c = 8 by +40% (> 10%)"]

    d = fx.write_sweep(str(tmp_path))
    an = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    ax = figures.figure_critical_batches(an, gen).axes[0]
    measured = next(ln for ln in ax.get_lines() if ln.get_label() == "measured")
    np.testing.assert_allclose(measured.get_xdata(), c)
    np.testing.assert_allclose(measured.get_ydata(), tps)
    fit = next(ln for ln in ax.get_lines() if ln.get_label().startswith("fit c / (a + b c)"))
    np.testing.assert_allclose(fit.get_ydata(), gen.fit.predict(fit.get_xdata()))
    assert f"R^2 {gen.fit.r2:.3f}, largest miss 40%" in fit.get_label()
    texts = [t.get_text() for t in ax.texts]
    assert any(t.startswith("fit poor: the fit misses c = 8 by +40%") and "withheld" in t
               for t in texts)  # fmt: skip
    text = report.build_report(an, gen, resamples=0)
    assert f"R^2 = {gen.fit.r2:.3f}, largest miss 40% of a measured point" in text
    assert "**Fit quality:** poor (the fit misses c = 8 by +40% (> 10%))" in text
    row = re.search(r"\| generation throughput saturates \|[^\n]*", text).group(0)
    assert "**undecided at this power**" in row and "withheld" in row
    assert f"| 8 | 1000 | {pred[0]:.4g} | +39.7% |" in text  # the fit's miss in the table


def test_a_good_fit_is_drawn_and_reported_as_good(tmp_path):
    c = [10.0, 100.0, 1000.0]
    gen = _gen({x: [1000.0 * x / (100.0 + x)] for x in c})  # exactly a = 0.1 s, b = 1 ms
    an = ttt.analyze_sweep(curves.load_sweep(fx.write_sweep(str(tmp_path))), n_boot=50)
    ax = figures.figure_critical_batches(an, gen).axes[0]
    assert any(t.get_text() == "fit within 10% of every point" for t in ax.texts)
    text = report.build_report(an, gen, resamples=0)
    assert "R^2 = 1.000, largest miss 0% of a measured point" in text
    assert "Fit quality: no negative intercept" in text


def test_training_signals_kl_at_zero_and_length_from_zero(tmp_path):
    d = fx.write_sweep(str(tmp_path), configs=fx.STANDARD_CONFIGS[:2])
    # k3 logged at -7e-9 (float rounding: k3 is never negative), lengths 31-32 tokens.
    _rewrite_updates(d, lambda name, i: {"kl": -7e-9, "response_len_mean": 31.0 + (i % 2)})
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    fig = figures.figure_training_signals(a)
    by_label = {ax.get_ylabel(): ax for ax in fig.axes if ax.get_visible()}
    kl = by_label["KL to the behaviour policy (k3; kl_coef = 0)"]
    ys = np.concatenate([ln.get_ydata() for ln in kl.get_lines()])
    ys = ys[np.isfinite(ys)]
    assert ys.size and np.all(ys == 0.0)  # drawn at 0, not at -7e-9
    assert kl.get_ylim() == (0.0, figures.KL_FLOOR)
    assert any("~0 (float rounding" in t.get_text() for t in kl.texts)
    length = by_label["response length (tokens)"]
    lo, hi = length.get_ylim()
    assert lo == 0.0 and hi == pytest.approx(1.1 * 32.0)


def test_training_signals_kl_above_the_floor_keeps_its_range(tmp_path):
    d = fx.write_sweep(str(tmp_path), configs=fx.STANDARD_CONFIGS[:2])
    _rewrite_updates(d, lambda name, i: {"kl": 1e-3 * (1 + i % 3)})
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    fig = figures.figure_training_signals(a)
    kl = next(ax for ax in fig.axes if ax.get_ylabel().startswith("KL"))
    top = max(np.nanmax(ln.get_ydata()) for ln in kl.get_lines())
    assert kl.get_ylim()[0] == 0.0 and kl.get_ylim()[1] >= top > 1e-3 and not kl.texts


def _critical_line(ax):
    return next(ln for ln in ax.get_lines() if ln.get_label().startswith("critical training"))


@pytest.mark.parametrize("undecided", [False, True])
def test_critical_training_batch_drawn_as_decided_or_undecided(tmp_path, undecided):
    # r_N at B = 256: 1.05 with seeds within 1% (decided: 256), or 1.15 with seeds spread
    # 0.7x-1.4x around it (its interval spans 1.2: undecided, 256 by the means).
    configs = ((8, 8, "sqrt", 1.0), (16, 8, "sqrt", 1.0), (32, 8, "sqrt", 1.15 if undecided
               else 1.05), (64, 8, "sqrt", 2.5))  # fmt: skip
    factors = (0.7, 1.0, 1.4) if undecided else (0.99, 1.01)
    d = fx.write_sweep(str(tmp_path), configs=configs, seed_factors=factors)
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    crit = critical_batch.critical_training_batch(a)
    assert crit.critical_batch == 256 and crit.decided == (not undecided)
    text = "\n".join(report._critical_section(a, critical_batch.DEFAULT_TOL))
    gen = _gen({x: [1000.0 * x / (100.0 + x)] for x in (10.0, 100.0, 1000.0)})
    for fig, i in ((figures.figure_invariance(a), 1), (figures.figure_critical_batches(a, gen), 1)):
        line = _critical_line(fig.axes[i])
        assert list(line.get_xdata()) == [256, 256]
        if undecided:
            assert "undecided at this power (256 by the means)" in text
            assert line.get_linestyle() == ":" and line.get_label().startswith(
                "critical training batch undecided (256 by the means; CI walk ["
            )
        else:
            assert "- critical training batch: **256** responses" in text
            assert line.get_linestyle() == "--"
            assert line.get_label() == "critical training batch 256 (CI walk [256, 256])"
        legend = [t.get_text() for t in fig.axes[i].get_legend().get_texts()]
        assert line.get_label() in legend


def test_r_n_panel_shows_every_interval_whole(tmp_path):
    configs = ((8, 8, "sqrt", 0.5), (16, 8, "sqrt", 1.0), (32, 8, "sqrt", 1.05))
    d = fx.write_sweep(str(tmp_path), configs=configs, seed_factors=(0.5, 1.0, 1.5),
                       reference="P16_G8_sqrt_s0")  # fmt: skip
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    crit = critical_batch.critical_training_batch(a)
    lows = [e.lo for e in crit.r_n if e is not None and e.has_interval]
    ax = figures.figure_critical_batches(a, None).axes[1]
    assert ax.get_ylim()[0] <= min(lows) and math.isfinite(min(lows))


@pytest.mark.parametrize("band_lo", [None, BAND_LO])
def test_report_header_and_measurement_say_the_same(tmp_path, band_lo):
    d = fx.write_sweep(str(tmp_path))
    if band_lo is not None:
        _set_band(d, band_lo)
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    text = report.build_report(a, None, resamples=0)
    header = text.split("## Findings")[0]
    section = text.split("## Measurement")[1].split("\n## ")[0]
    estimator = "N*, T and q are geometric means over 9 accuracy levels from 0.6 to the target"
    if band_lo is None:
        estimator = "N*, T and q at the single target 0.8"
    # The fixtures' runs key rollouts by rollout index: only a shape's LR rules are paired.
    intervals = (
        "95% Student-t over seeds (means; ratios: delta method on the log, n - 1 degrees of "
        "freedom where paired by seed, Welch's otherwise)"
    )
    assert a.crossing == "linear"  # the fixtures' sweep.json has no target_crossing
    crossing = "a level's N* is its crossing interpolated between two evaluations"
    for part in (header, section):
        assert estimator in part and intervals in part and crossing in part
    assert "first crossing (interpolated)" not in text
    assert "compared seed by seed (paired); every other ratio as independent samples" in section


def test_config_table_gives_each_batchs_updates_to_the_bands_lower_edge(band, tmp_path):
    # The column is what a single-target analysis at the band's lower edge reads per seed.
    d = fx.write_sweep(str(tmp_path))
    edge = ttt.analyze_sweep(curves.load_sweep(d), target=BAND_LO, band_lo=None, n_boot=50)
    table = report.config_table(band)
    assert table[0].endswith(f"| updates to {BAND_LO:g} (median [min, max]) |")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table[2:]}
    cells = []
    for k in band.stats:
        per_seed = [edge.targets[r.name].updates_to_target for r in edge.runs_by_key[k]]
        reached = [u for u in per_seed if u is not None]
        if reached:
            cells.append(f"{np.median(reached):.4g} [{min(reached):.4g}, {max(reached):.4g}]")
        else:
            cells.append("-")
        assert rows[k.name].endswith(f"| {cells[-1]} |")
    assert len(set(cells) - {"-"}) >= 2  # the fixtures' batches differ
    # Without a band the column is not there.
    assert "updates to" not in report.config_table(edge)[0].split("updates to target")[1]
