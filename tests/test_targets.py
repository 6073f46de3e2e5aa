"""One time-to-target routine: summary.json and the analysis agree on N*, T, q, updates."""

import json
import os

import analysis_fixtures as fx
import numpy as np
import pytest
from ml_collections import ConfigDict

from rl_batch import artifacts, targets
from rl_batch.analysis import curves
from rl_batch.analysis import time_to_target as ttt
from rl_batch.runs import run


def _slow_tail_records():
    """The issue's constructed case: 20 updates of 10 responses at 1 s, then 4 at 5 s.

    Validation: 0.0 at 0 responses, 1.0 at 240 (40 s); the 0.5 target crosses at
    N* = 120, reached after the 12th update, 12 s. Interpolating time on the two
    evaluations instead (0 s at 0, 40 s at 240) would give 20 s.
    """
    lines = [{"kind": "eval", "step": 0, "responses_cum": 0, "time_train_cum_s": 0.0,
              "eval_accuracy": 0.0}]  # fmt: skip
    t = 0.0
    for step in range(1, 25):
        t += 1.0 if step <= 20 else 5.0
        lines.append(
            {
                "kind": "update",
                "step": step,
                "responses_cum": 10 * step,
                "time_train_cum_s": t,
                "prompts": 5,
                "group_size": 2,
                "batch_responses": 10,
            }  # fmt: skip
        )
    lines.append({"kind": "eval", "step": 24, "responses_cum": 240, "time_train_cum_s": t,
                  "eval_accuracy": 1.0})  # fmt: skip
    return lines


def _write_run(run_dir, lines):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, artifacts.METRICS_FILE), "w") as f:
        for rec in lines:
            f.write(json.dumps(rec) + "\n")
    artifacts.write_json_atomic(os.path.join(run_dir, artifacts.CONFIG_FILE), {"algo": "grpo"})


def _summary(lines, target):
    c = ConfigDict({"name": "hand", "target": target})
    return run._summary(c, run.Counters(), lines, "finished")


def test_time_is_interpolated_on_the_update_lines():
    reach = targets.reach_of_records(_slow_tail_records(), 0.5)
    assert reach.n_star == pytest.approx(120.0)
    assert reach.time_to_target_s == pytest.approx(12.0)  # not 20 s (the eval grid)
    assert reach.q == pytest.approx(10.0)
    assert reach.updates_to_target == pytest.approx(12.0)
    assert reach.responses_final == 240 and reach.time_train_final == pytest.approx(40.0)


def test_summary_json_and_the_analysis_agree_exactly(tmp_path):
    lines = _slow_tail_records()
    _write_run(str(tmp_path / "r"), lines)
    analysed = ttt.run_time_to_target(curves.load_run(str(tmp_path / "r")), 0.5)
    summary = _summary(lines, 0.5)
    assert summary["reached"] and summary["time_to_target_s"] == pytest.approx(12.0)
    assert summary["n_star"] == analysed.n_star
    assert summary["time_to_target_s"] == analysed.time_to_target_s
    assert summary["q"] == analysed.q
    assert summary["updates_to_target"] == analysed.updates_to_target


def test_not_reached_agrees_too(tmp_path):
    lines = _slow_tail_records()
    _write_run(str(tmp_path / "r"), lines)
    analysed = ttt.run_time_to_target(curves.load_run(str(tmp_path / "r")), 1.5)
    summary = _summary(lines, 1.5)
    assert not summary["reached"] and summary["n_star_text"] == artifacts.NOT_REACHED
    assert summary["time_to_target_s"] is None and summary["updates_to_target"] is None
    assert summary["q"] == analysed.q == pytest.approx(240 / 40.0)


def test_ppo_warmup_summary_matches_the_analysis(tmp_path):
    d = str(tmp_path / "warm")
    fx.write_run(d, prompts=32, group_size=1, tau=1500.0, algo="ppo", budget=6000,
                 warmup_updates=7, critic=True)  # fmt: skip
    analysed = ttt.run_time_to_target(curves.load_run(d), 0.8)
    summary = _summary(artifacts.read_metrics(d), 0.8)
    assert analysed.reached
    assert summary["n_star"] == analysed.n_star
    assert summary["time_to_target_s"] == analysed.time_to_target_s
    assert summary["updates_to_target"] == analysed.updates_to_target


def _linear_run_records():
    """Accuracy 0.4 + n / 1000 (evals every 50 responses), updates of 10 responses at 1 s."""
    lines = []
    for step in range(0, 31):
        if step:
            lines.append({"kind": "update", "step": step, "responses_cum": 10 * step,
                          "time_train_cum_s": float(step), "batch_responses": 10})  # fmt: skip
        if step % 5 == 0:
            lines.append({"kind": "eval", "step": step, "responses_cum": 10 * step,
                          "time_train_cum_s": float(step),
                          "eval_accuracy": 0.4 + step / 100})  # fmt: skip
    return lines


def test_band_is_the_geometric_mean_of_the_levels_crossings():
    # Level a is interpolated at n = 1000 (a - 0.4): 0.42 .. 0.46 -> 20, 25, ..., 60
    # responses; each is reached by the next update of 10 responses.
    reach = targets.reach_of_records(_linear_run_records(), 0.46, band_lo=0.42)
    ns = np.array([20.0, 30, 30, 40, 40, 50, 50, 60, 60])
    assert reach.n_star == pytest.approx(float(np.exp(np.log(ns).mean())))
    linear = targets.reach_of_records(_linear_run_records(), 0.46, 0.42, crossing="linear")
    ns = np.linspace(20.0, 60.0, targets.BAND_LEVELS)
    assert linear.n_star == pytest.approx(float(np.exp(np.log(ns).mean())))
    assert reach.time_to_target_s == pytest.approx(reach.n_star / 10)  # 10 responses/s
    assert reach.updates_to_target == pytest.approx(reach.n_star / 10)
    # The band's top level alone is the single-target N*.
    single = targets.reach_of_records(_linear_run_records(), 0.46)
    assert single.n_star == pytest.approx(60.0)
    assert reach.n_star < single.n_star


def test_band_not_reached_when_its_top_is_not():
    reach = targets.reach_of_records(_linear_run_records(), 0.75, band_lo=0.42)
    assert reach.n_star is None and reach.time_to_target_s is None
    assert reach.q == pytest.approx(10.0)  # the whole run's throughput


def test_band_lower_edge_must_be_below_the_target():
    with pytest.raises(ValueError, match="below the target"):
        targets.band_levels(0.5, 0.5)


def test_summary_carries_the_band_estimate():
    c = ConfigDict({"name": "lin", "target": 0.46, "target_band_lo": 0.42})
    s = run._summary(c, run.Counters(), _linear_run_records(), "finished")
    band = targets.reach_of_records(_linear_run_records(), 0.46, 0.42)
    assert s["n_star"] == pytest.approx(60.0)
    assert s["n_star_band"] == band.n_star and s["time_to_band_s"] == band.time_to_target_s


def test_update_crossing_hand_values():
    responses = np.array([64.0, 128.0, 128.0, 192.0])  # the third update kept nothing
    assert targets.update_crossing(100.0, responses) == 128.0
    assert targets.update_crossing(128.0, responses) == 128.0  # on an update: that one
    assert targets.update_crossing(128.0 * (1 + 1e-14), responses) == 128.0  # float rounding
    assert targets.update_crossing(150.0, responses) == 192.0
    assert targets.update_crossing(0.0, responses) == 0.0  # met before any update
    assert targets.update_crossing(300.0, responses) == 300.0  # past the update lines
    assert targets.update_crossing(None, responses) is None


def test_one_update_per_evaluation_reaches_at_the_evaluation():
    # B = 256 with an evaluation after every update: accuracy 0.40 -> 0.50 -> 0.60. The
    # interpolated 0.45 sits at 128 responses, but no policy between the two evaluations
    # exists: the update at 256 reaches it, at its time and update count.
    lines = [{"kind": "eval", "step": 0, "responses_cum": 0, "time_train_cum_s": 0.0,
              "eval_accuracy": 0.40}]  # fmt: skip
    for step, acc in ((1, 0.50), (2, 0.60)):
        lines.append({"kind": "update", "step": step, "responses_cum": 256 * step,
                      "time_train_cum_s": 2.0 * step})  # fmt: skip
        lines.append({"kind": "eval", "step": step, "responses_cum": 256 * step,
                      "time_train_cum_s": 2.0 * step, "eval_accuracy": acc})  # fmt: skip
    reach = targets.reach_of_records(lines, 0.45)
    assert (reach.n_star, reach.time_to_target_s, reach.updates_to_target) == (256.0, 2.0, 1.0)
    linear = targets.reach_of_records(lines, 0.45, crossing="linear")
    assert (linear.n_star, linear.time_to_target_s, linear.updates_to_target) == (128.0, 1.0, 0.5)
    with pytest.raises(ValueError, match="target_crossing='nearest'"):
        targets.reach_of_records(lines, 0.45, crossing="nearest")
