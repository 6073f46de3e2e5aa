"""The report's Measurement section: estimator, validation noise, q disagreement."""

import json
import os

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.analysis import curves, measurement, report
from rl_batch.analysis import time_to_target as ttt

CONFIGS = fx.STANDARD_CONFIGS[:2]  # 8x8 and 16x8, sqrt


def _rewrite(run_dir, fn):
    path = os.path.join(run_dir, artifacts.METRICS_FILE)
    lines = [fn(json.loads(x)) for x in open(path)]
    with open(path, "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)


def _slow_down(run_dir, factor):
    def fn(r):
        if "time_train_cum_s" in r:
            r["time_train_cum_s"] *= factor
        return r

    _rewrite(run_dir, fn)


@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_identical_compute_runs_that_disagree_in_q_are_named(tmp_path):
    d = fx.write_sweep(str(tmp_path), configs=CONFIGS)
    assert measurement.q_warnings(ttt.analyze_sweep(curves.load_sweep(d))) == []
    _slow_down(os.path.join(d, "runs", fx.run_name(8, 8, "sqrt", 1)), 1.3)
    (w,) = measurement.q_warnings(ttt.analyze_sweep(curves.load_sweep(d)))
    assert "8x8, 2 runs" in w and "by 30%" in w and "experiments.calibrate" in w
    artifacts.write_json_atomic(
        os.path.join(d, artifacts.CALIBRATION_FILE),
        {"configs": {"8x8:sqrt": {"step_s_median": 0.5}, "16x8:sqrt": {"step_s_median": 0.8}}},
    )
    analysis = ttt.analyze_sweep(curves.load_sweep(d))
    (w,) = measurement.q_warnings(analysis)  # still measured as disagreeing ...
    assert "use the calibrated step times" in w
    # ... but the calibrated q of the two seeds agree (same retained responses per update).
    qs = [analysis.targets[fx.run_name(8, 8, "sqrt", s)].q for s in (0, 1)]
    assert qs[0] == pytest.approx(qs[1], rel=1e-3)
    text = report.build_report(analysis)
    assert "**Warning:** runs with identical compute (8x8" in text
    assert "q used (calibrated)" in text and "q measured" in text


def test_validation_noise_is_the_rms_of_sampled_minus_exact(tmp_path):
    d = fx.write_sweep(str(tmp_path), configs=CONFIGS)
    diffs = []

    def add_both(r):
        if r.get("kind") == "eval":
            diff = 0.03 if len(diffs) % 2 else -0.01
            diffs.append(diff)
            r.update(eval_p_ref=r["eval_accuracy"], eval_mean_at_k=r["eval_accuracy"] + diff)
            r["eval_metric"] = "p_ref"
        return r

    for name in os.listdir(os.path.join(d, "runs")):
        _rewrite(os.path.join(d, "runs", name), add_both)
    analysis = ttt.analyze_sweep(curves.load_sweep(d))
    rms, n = measurement.validation_noise(analysis)
    assert n == len(diffs) and rms == pytest.approx(float(np.sqrt(np.mean(np.square(diffs)))))
    assert measurement.validation_metric(analysis) == "p_ref"
    assert "exact p(reference response)" in "\n".join(measurement.measurement_section(analysis))


def test_band_sweep_shows_the_single_target_beside(tmp_path):
    d = fx.write_sweep(str(tmp_path), configs=CONFIGS)
    raw = artifacts.read_json(os.path.join(d, artifacts.SWEEP_FILE))
    raw["target_band_lo"] = 0.5
    artifacts.write_json_atomic(os.path.join(d, artifacts.SWEEP_FILE), raw)
    analysis = ttt.analyze_sweep(curves.load_sweep(d))
    single = ttt.analyze_sweep(curves.load_sweep(d), band_lo=None)
    assert analysis.band_lo == 0.5 and single.band_lo is None
    name = fx.run_name(8, 8, "sqrt", 0)
    assert analysis.targets[name].n_star < single.targets[name].n_star  # 0.5..0.8 vs 0.8
    text = "\n".join(measurement.measurement_section(analysis))
    assert "geometric means over 9 accuracy levels from 0.5 to the target 0.8" in text
    assert "r_N (band)" in text and "r_N (single target)" in text


def test_power_is_the_ratio_half_width_and_the_seeds_it_needs(tmp_path):
    # Seeds with 0.9 / 1.1 of the time constant: N* spreads about 10% per configuration.
    d = fx.write_sweep(str(tmp_path), configs=CONFIGS, seed_factors=(0.9, 1.1))
    analysis = ttt.analyze_sweep(curves.load_sweep(d))
    (p,) = measurement.power(analysis)
    r = analysis.ratios[artifacts.Configuration("grpo", 16, 8, "sqrt")]
    assert p.batch == 128 and p.seeds == 2
    assert p.r_n_half == pytest.approx((r.r_n.hi - r.r_n.lo) / 2)
    assert p.r_t_half == pytest.approx((r.r_t.hi - r.r_t.lo) / 2)
    # Two seeds give t_1 = 12.7: far too wide; more seeds would bring it to +-0.2.
    assert p.r_n_half > measurement.POWER_HALF_WIDTH and 2 < p.r_n_seeds <= 100
    stats = analysis.stats
    n = [[x.n_star] for x in stats[r.key].runs], [[x.n_star] for x in stats[r.reference].runs]
    assert p.r_n_seeds == measurement.intervals.seeds_for_half_width(*n, [1.0], 0.2, 0.95)
    # A looser bar is met with fewer seeds; the summary counts what is met now.
    (loose,) = measurement.power(analysis, half_width=1e6)
    assert loose.r_n_seeds == 2
    text = "\n".join(measurement.measurement_section(analysis))
    assert "Power: 0 of 2 ratio intervals (r_N, T/T_ref) have half-width <= 0.2" in text
    assert f"at about {max(p.r_n_seeds, p.r_t_seeds)} seeds per configuration" in text


def test_sweep_json_says_how_n_star_is_read(tmp_path):
    # A sweep.json without target_crossing (written before the field) reads N* at the
    # interpolated point; one that says "update" at the update that realizes it.
    d = fx.write_sweep(str(tmp_path), configs=CONFIGS)
    old = ttt.analyze_sweep(curves.load_sweep(d))
    raw = artifacts.read_json(os.path.join(d, artifacts.SWEEP_FILE))
    assert "target_crossing" not in raw and old.crossing == "linear"
    raw["target_crossing"] = "update"
    artifacts.write_json_atomic(os.path.join(d, artifacts.SWEEP_FILE), raw)
    new = ttt.analyze_sweep(curves.load_sweep(d))
    assert new.crossing == "update"
    for name, rt in new.targets.items():
        run = new.sweep.run(name)
        assert rt.n_star in set(run.responses)  # on an update line
        assert 0 <= rt.n_star - old.targets[name].n_star < run.key.prompts * run.key.group_size
    text = "\n".join(measurement.measurement_section(new))
    assert "N* is the first update at or after its crossing" in text
