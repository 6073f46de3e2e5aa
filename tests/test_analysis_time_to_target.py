"""Time-to-target: N*, q, T, updates, seed bootstrap and ratios, on hand-made runs."""

import dataclasses
import json
import os

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch import artifacts, targets
from rl_batch.analysis import curves
from rl_batch.analysis import time_to_target as ttt


def _write_metrics(run_dir, lines, config=None, summary=None):
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, artifacts.METRICS_FILE), "w") as f:
        for rec in lines:
            f.write(json.dumps(rec) + "\n")
    artifacts.write_json_atomic(os.path.join(run_dir, artifacts.CONFIG_FILE), config or {})
    artifacts.write_json_atomic(
        os.path.join(run_dir, artifacts.SUMMARY_FILE), summary or {"status": "finished"}
    )


def _upd(n, t, step, batch=100):
    return {
        "kind": "update",
        "step": step,
        "responses_cum": n,
        "time_train_cum_s": t,
        "prompts": batch // 4,
        "group_size": 4,
        "batch_responses": batch,
    }


def _ev(n, acc, step=0):
    return {
        "kind": "eval",
        "step": step,
        "responses_cum": n,
        "eval_accuracy": acc,
        "time_train_cum_s": 0.0,
        "eval_k": 4,
    }


def _hand_run(tmp_path):
    # Updates of 100 responses at 10, 25, 45, 70 s; evals 0.0 @ 0, 0.4 @ 200, 0.8 @ 400.
    lines = [_ev(0, 0.0)]
    for i, t in enumerate([10.0, 25.0, 45.0, 70.0]):
        lines.append(_upd(100 * (i + 1), t, step=i))
        if i % 2 == 1:
            lines.append(_ev(100 * (i + 1), 0.4 * (i + 1) / 2, step=i + 1))
    d = str(tmp_path / "run")
    _write_metrics(d, lines, config={"algo": "grpo", "lr_rule": "sqrt", "seed": 3})
    return curves.load_run(d)


def test_first_crossing_hand_values():
    x, y = [0, 100, 200, 300], [0.1, 0.3, 0.5, 0.7]
    assert ttt.first_crossing(x, y, 0.4) == pytest.approx(150.0)
    assert ttt.first_crossing(x, y, 0.7) == pytest.approx(300.0)
    assert ttt.first_crossing(x, y, 0.05) == 0.0  # Already met at the first evaluation.
    assert ttt.first_crossing(x, y, 0.71) is None
    # The *first* crossing counts, even if the curve later dips.
    assert ttt.first_crossing([0, 100, 200, 300], [0.1, 0.6, 0.3, 0.9], 0.5) == pytest.approx(80)


def test_interp_first_with_repeated_positions():
    xp = np.array([0.0, 100.0, 100.0, 200.0])  # A filtered-out update: time, no responses.
    fp = np.array([0.0, 10.0, 20.0, 30.0])
    assert ttt.interp_first(50.0, xp, fp) == pytest.approx(5.0)
    assert ttt.interp_first(100.0, xp, fp) == pytest.approx(10.0)  # First reach of 100.
    assert ttt.interp_first(150.0, xp, fp) == pytest.approx(25.0)
    assert ttt.interp_first(500.0, xp, fp) == pytest.approx(30.0)


def test_run_time_to_target_interpolates_n_time_updates(tmp_path):
    run = _hand_run(tmp_path)
    assert run.key == artifacts.Configuration("grpo", 25, 4, "sqrt") and run.seed == 3
    rt = ttt.run_time_to_target(run, 0.6)  # Crosses halfway between 200 and 400.
    assert rt.n_star == pytest.approx(300.0)
    assert rt.time_to_target_s == pytest.approx(45.0)
    assert rt.q == pytest.approx(300.0 / 45.0)
    assert rt.updates_to_target == pytest.approx(3.0)
    # 0.5 is interpolated at 250 responses, between the updates at 200 and 300: the
    # policy first reaches it with the update at 300 ...
    rt = ttt.run_time_to_target(run, 0.5)
    assert rt.n_star == pytest.approx(300.0)
    assert rt.time_to_target_s == pytest.approx(45.0)
    assert rt.updates_to_target == pytest.approx(3.0)
    # ... and at the interpolated point itself with crossing="linear".
    rt = ttt.run_time_to_target(run, 0.5, crossing="linear")
    assert rt.n_star == pytest.approx(250.0)
    assert rt.time_to_target_s == pytest.approx(35.0)  # Halfway between 25 s and 45 s.
    assert rt.updates_to_target == pytest.approx(2.5)


def test_not_reached_is_none_and_q_uses_whole_run(tmp_path):
    rt = ttt.run_time_to_target(_hand_run(tmp_path), 0.9)
    assert not rt.reached
    assert rt.n_star is None and rt.time_to_target_s is None and rt.updates_to_target is None
    assert rt.q == pytest.approx(400.0 / 70.0)
    stats = ttt.config_stats([rt])
    assert stats.n_star is None and stats.time_to_target_s is None
    assert ttt.fmt_estimate(stats.n_star) == "not reached"


def test_bootstrap_mean_interval_matches_normal_theory():
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 1.0, size=400)
    e = ttt.bootstrap_mean(x, n_boot=4000, seed=0)
    assert e.mean == pytest.approx(x.mean())
    half = 1.96 / np.sqrt(400)  # Normal-theory half-width of the 95% interval.
    assert (e.hi - e.lo) / 2 == pytest.approx(half, rel=0.15)
    assert e.lo < e.mean < e.hi
    assert ttt.bootstrap_mean(x, n_boot=500, seed=7) == ttt.bootstrap_mean(x, n_boot=500, seed=7)


def test_one_seed_has_no_interval():
    one = ttt.bootstrap_mean([1234.0])
    assert one.mean == 1234.0 and one.n == 1
    assert np.isnan(one.lo) and np.isnan(one.hi) and not one.has_interval
    assert one.fmt(".4g") == "1234 (1 seed, no CI)"
    assert one.to_json() == {"mean": 1234.0, "lo": None, "hi": None, "n": 1}
    two = ttt.bootstrap_mean([1.0, 3.0], n_boot=200)
    assert two.has_interval and two.lo >= 1.0 and two.hi <= 3.0 and two.lo < two.hi
    # A ratio with one seed on either side has no interval either.
    r_n, r_q, r_t = ttt.ratio_estimates([100.0, 120.0], [2.0, 2.2], [50.0], [1.0])
    assert r_n.mean == pytest.approx(110.0 / 50.0)
    assert not (r_n.has_interval or r_q.has_interval or r_t.has_interval)
    r_n, _, _ = ttt.ratio_estimates([100.0], [2.0], [50.0, 60.0], [1.0, 1.0])
    assert not r_n.has_interval and r_n.fmt() == "1.82 (1 seed, no CI)"


def _target(name, n, t, b=128, updates=None):
    key = artifacts.Configuration("grpo", b // 8, 8, "sqrt")
    return ttt.RunTarget(
        name, key, 0, 0.5, n, t, None if n is None else n / t, updates, n or 0.0, t
    )


def test_study_numbers_same_n_faster_q():
    # P=128 reference: N* = 122.88K in 11.90 h; P=1024: same N*, q +41%.
    t_ref = 11.90 * 3600
    ref = ttt.config_stats([_target("ref", 122880.0, t_ref)])
    big = ttt.config_stats([_target("big", 122880.0, t_ref / 1.41, b=1024)])
    r = ttt.config_ratios(big, ref)
    assert r.r_n.mean == pytest.approx(1.0)
    assert r.r_q.mean == pytest.approx(1.41)
    assert r.r_t.mean == pytest.approx(1 / 1.41) and round(r.r_t.mean, 3) == 0.709
    # P=2048: N* +60%, q +30%: T ratio 1.6 / 1.3 = 1.23.
    n, q = 1.6 * 122880.0, 1.3 * 122880.0 / t_ref
    worse = ttt.config_stats([_target("worse", n, n / q, b=2048)])
    r = ttt.config_ratios(worse, ref)
    assert r.r_n.mean == pytest.approx(1.6) and r.r_q.mean == pytest.approx(1.3)
    assert r.r_t.mean == pytest.approx(1.6 / 1.3) and round(r.r_t.mean, 2) == 1.23


def test_ratio_bootstrap_over_seeds():
    ref = ttt.config_stats(
        [_target(f"r{i}", n, 100.0, updates=10.0) for i, n in enumerate([100.0, 110.0, 90.0])]
    )
    big = ttt.config_stats(
        [_target(f"b{i}", n, 50.0, b=256, updates=5.5) for i, n in enumerate([100.0, 100.0, 100.0])]
    )
    r = ttt.config_ratios(big, ref)
    assert r.r_n.mean == pytest.approx(1.0)
    assert r.r_n.lo < 1.0 < r.r_n.hi  # The reference's seed spread shows in the interval.
    assert r.r_q.mean == pytest.approx(2.0)  # q = N/T: 2, 2.2, 1.8 vs 1, 1.1, 0.9.
    assert r.r_t.mean == pytest.approx(0.5)
    assert r.r_updates.mean == pytest.approx(0.55) and r.ideal_updates == pytest.approx(0.5)
    self_r = ttt.config_ratios(ref, ref)
    assert (self_r.r_n.lo, self_r.r_n.hi) == (1.0, 1.0)


def test_linear_sweep_end_to_end(tmp_path):
    """Exact N*, T ratios through load_sweep/analyze_sweep on piecewise-linear runs."""
    sweep = tmp_path / "sweep"
    runs = []
    # acc(n) = n / 1000 (reaches 0.5 at n = 500) with time = n / q.
    for name, prompts, slope, q in [
        ("ref", 16, 1000.0, 10.0),
        ("fast", 64, 1000.0, 14.1),
        ("slow", 128, 1600.0, 13.0),
    ]:
        batch = prompts * 8
        lines = [_ev(0, 0.0)]
        n = 0
        for step in range(int(2000 / batch) + 2):
            n += batch
            lines.append(_upd(n, n / q, step, batch=batch))
            lines.append(_ev(n, min(n / slope, 1.0), step + 1))
        _write_metrics(str(sweep / "runs" / name), lines)
        runs.append(
            {
                "name": name,
                "prompts": prompts,
                "group_size": 8,
                "lr_rule": "sqrt",
                "seed": 0,
                "status": "finished",
            }
        )
    artifacts.write_json_atomic(
        str(sweep / "sweep.json"),
        {"name": "lin", "algo": "grpo", "target": 0.5, "reference": "ref", "runs": runs},
    )
    a = ttt.analyze_sweep(curves.load_sweep(str(sweep)), n_boot=50)
    ref, fast, slow = (artifacts.Configuration("grpo", p, 8, "sqrt") for p in (16, 64, 128))
    assert a.reference == ref
    assert a.stats[ref].n_star.mean == pytest.approx(500.0)
    assert a.stats[ref].time_to_target_s.mean == pytest.approx(50.0)
    assert a.stats[ref].updates_to_target.mean == pytest.approx(500 / 128)
    assert a.ratios[fast].r_t.mean == pytest.approx(1 / 1.41)
    assert a.ratios[slow].r_n.mean == pytest.approx(1.6)
    assert a.ratios[slow].r_t.mean == pytest.approx(1.6 / 1.3)
    # 4x the batch with the same N*: a quarter of the updates (the ideal B_ref / B).
    assert a.ratios[fast].r_updates.mean == pytest.approx(0.25)


def test_ppo_warmup_shifts_axes(tmp_path):
    kw = dict(prompts=32, group_size=1, tau=1500.0, algo="ppo", budget=6000)
    fx.write_run(str(tmp_path / "plain"), **kw)
    fx.write_run(str(tmp_path / "warm"), warmup_updates=7, critic=True, **kw)
    plain = ttt.run_time_to_target(curves.load_run(str(tmp_path / "plain")), 0.8)
    warm_run = curves.load_run(str(tmp_path / "warm"))
    assert warm_run.warmup_updates == 7 and warm_run.responses[0] == 32
    warm = ttt.run_time_to_target(warm_run, 0.8)
    assert warm.n_star == pytest.approx(plain.n_star)
    assert warm.time_to_target_s == pytest.approx(plain.time_to_target_s)
    assert warm.updates_to_target == pytest.approx(plain.updates_to_target)


def test_a_configured_reference_without_runs_falls_back_with_a_warning(tmp_path, caplog):
    d = fx.write_sweep(str(tmp_path / "s"), configs=fx.STANDARD_CONFIGS[:3])
    raw = artifacts.read_json(os.path.join(d, "sweep.json"))
    raw["reference"] = "P64_G8_sqrt_s0"  # a run this sweep does not have
    artifacts.write_json_atomic(os.path.join(d, "sweep.json"), raw)
    with caplog.at_level("WARNING"):
        a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=10)
    assert a.reference == artifacts.Configuration("grpo", 8, 8, "sqrt")  # the smallest sqrt batch
    assert "'P64_G8_sqrt_s0' has no usable run" in caplog.text


def test_reference_resolution_and_exclusion(tmp_path):
    d = fx.write_sweep(str(tmp_path / "s"), configs=fx.STANDARD_CONFIGS[:3])
    # Mark one run failed in sweep.json: it must be left out, not counted as not reached.
    raw = artifacts.read_json(os.path.join(d, "sweep.json"))
    raw["runs"][-1]["status"] = "failed"
    artifacts.write_json_atomic(os.path.join(d, "sweep.json"), raw)
    sweep = curves.load_sweep(d)
    a = ttt.analyze_sweep(sweep, n_boot=50)
    assert a.reference == artifacts.Configuration("grpo", 8, 8, "sqrt")
    assert a.excluded == ((raw["runs"][-1]["name"], "failed"),)
    p32 = artifacts.Configuration("grpo", 32, 8, "sqrt")
    assert a.stats[p32].n_seeds == 1 and a.stats[p32].reached
    for ref in ("P16_G8_sqrt_s1", "grpo-P16-G8-sqrt", "P=16 G=8 sqrt", "16x8:sqrt"):
        assert ttt.analyze_sweep(sweep, reference=ref, n_boot=10).reference.prompts == 16
    with pytest.raises(ValueError, match="nope"):
        ttt.analyze_sweep(sweep, reference="nope")
    # A target nobody reaches: every N* is "not reached", q is still measured.
    a = ttt.analyze_sweep(sweep, target=1.5, n_boot=10)
    assert all(s.n_star is None and s.q is not None for s in a.stats.values())
    assert all(r.r_t is None and r.r_q is not None for r in a.ratios.values())


def _unfinished_sweep(tmp_path, reach_before_stop):
    """P=8 and P=16 (G=8), 2 seeds; seed 1 of P=16 is still running.

    tau = 2000: the target 0.8 is crossed at n = 2000 ln 5 = 3219. With
    ``reach_before_stop`` the running seed has 4096 responses (past it), else 1024.
    """
    d = fx.write_sweep(str(tmp_path / "s"), configs=[(8, 8, "sqrt", 1.0), (16, 8, "sqrt", 1.0)])
    fx.add_seed(
        d,
        prompts=16,
        group_size=8,
        seed=1,
        tau=fx.TAU0 * fx.SEED_TAU_FACTORS[1],
        budget=4096 if reach_before_stop else 1024,
    )
    return d


def test_unfinished_seed_keeps_config_incomplete(tmp_path):
    from rl_batch.analysis import critical_batch, planner, report

    d = _unfinished_sweep(tmp_path, reach_before_stop=False)
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    k = artifacts.Configuration("grpo", 16, 8, "sqrt")
    s = a.stats[k]
    # Both seeds count; the finished one reached, the running one not yet: no N*, T.
    assert a.excluded == ()
    assert (s.n_seeds, s.n_reached, s.n_pending) == (2, 1, 1)
    assert s.incomplete and not s.reached
    assert s.n_star is None and s.time_to_target_s is None and s.updates_to_target is None
    assert s.q is not None and s.q.n == 2  # Throughput is measured on both.
    assert a.ratios[k].r_n is None and a.ratios[k].r_t is None
    text = report.build_report(a)
    row = next(line for line in text.splitlines() if line.startswith("| grpo-P16-G8-sqrt"))
    assert "| 1/2 (1 running) | incomplete |" in row
    assert "not reached" not in row
    run_row = next(
        line for line in text.splitlines() if line.startswith("| P16_G8_sqrt_s1 | grpo-")
    )
    assert run_row.count("not reached yet") == 3 and "| running |" in run_row
    # The critical batch walk stops at the incomplete B = 128: only a lower bound.
    crit = critical_batch.critical_training_batch(a)
    assert crit.critical_batch == 64 and crit.first_outside == 128
    assert crit.first_outside_incomplete
    assert "at least **64** responses (the walk stops at B = 128, incomplete)" in text
    plan = planner.plan_full(a)
    prow = next(r for r in plan.rows if r.key == k)
    assert prow.note == "incomplete (1/2 seeds reached, 1 still running)"
    assert plan.recommendation == artifacts.Configuration("grpo", 8, 8, "sqrt")
    table_row = next(
        line for line in planner.format_plan_table(plan).splitlines() if "grpo-P16-G8-sqrt" in line
    )
    assert "| 128 | incomplete |" in table_row and "not reached" not in table_row
    assert planner.plan_to_json(plan)["rows"][-1]["r_n"] == "incomplete"


def test_running_seed_that_reached_counts(tmp_path):
    d = _unfinished_sweep(tmp_path, reach_before_stop=True)
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    s = a.stats[artifacts.Configuration("grpo", 16, 8, "sqrt")]
    assert (s.n_seeds, s.n_reached, s.n_pending) == (2, 2, 0) and s.reached
    # Mean over both seeds of the interpolated crossings (tau = 1980 and 2020).
    expected = np.mean([a.targets[r.name].n_star for r in a.runs_by_key[s.key]])
    assert s.n_star.mean == pytest.approx(expected)
    assert 0.99 * 2000 * np.log(5) < s.n_star.mean < 1.01 * 2000 * np.log(5) + 128


def test_finished_seed_that_never_reached_is_not_reached(tmp_path):
    # Same as above but the short seed finished (its budget ended): "not reached".
    d = _unfinished_sweep(tmp_path, reach_before_stop=False)
    raw = artifacts.read_json(os.path.join(d, "sweep.json"))
    for r in raw["runs"]:
        r["status"] = "finished"
    artifacts.write_json_atomic(os.path.join(d, "sweep.json"), raw)
    # (its summary.json too: a finished run whose summary says "running" is excluded)
    path = os.path.join(d, "runs", fx.run_name(16, 8, "sqrt", 1), artifacts.SUMMARY_FILE)
    artifacts.write_json_atomic(path, {**artifacts.read_json(path), "status": "finished"})
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    s = a.stats[artifacts.Configuration("grpo", 16, 8, "sqrt")]
    assert (s.n_seeds, s.n_reached, s.n_pending) == (2, 1, 0)
    assert not s.incomplete and s.n_star is None and s.missing_label == "not reached"


def test_a_run_whose_metrics_end_before_its_summary_is_excluded(tmp_path):
    d = fx.write_sweep(str(tmp_path), configs=fx.STANDARD_CONFIGS[:2])
    name = fx.run_name(8, 8, "sqrt", 1)
    path = os.path.join(d, "runs", name, artifacts.METRICS_FILE)
    lines = open(path).readlines()
    open(path, "w").writelines(lines[: len(lines) // 2])  # half of it lost
    analysis = ttt.analyze_sweep(curves.load_sweep(d))
    ((excluded, why),) = analysis.excluded
    assert excluded == name and "metrics disagree with summary.json" in why
    assert name not in analysis.targets


def _uncached_reach(run, target, band_lo=None, crossing="update"):
    return targets.time_to_band(
        eval_responses=run.eval_responses,
        eval_accuracy=run.eval_accuracy,
        responses=run.responses,
        time_train=run.time_train,
        updates_done=run.updates_done,
        levels=targets.band_levels(target, band_lo),
        crossing=crossing,
    )


def test_remembered_reach_follows_the_arrays_not_the_run(tmp_path):
    # The per-run reach is remembered by the arrays' content (the seed resamples' runs are
    # new RunData of the same arrays): a new RunData of the same arrays hits, and a run of
    # the same name with other arrays, or an array changed in place, never gets a stale one.
    run = _hand_run(tmp_path)
    first = ttt.run_time_to_target(run, 0.6, band_lo=0.2)
    hits = ttt.band_reach.cache_info()["hits"]
    again = ttt.run_time_to_target(dataclasses.replace(run, name="run@1", seed=1), 0.6, 0.2)
    assert ttt.band_reach.cache_info()["hits"] == hits + 1
    assert (again.n_star, again.time_to_target_s) == (first.n_star, first.time_to_target_s)

    slower = dataclasses.replace(run, time_train=run.time_train * 2.0)  # same name
    other = ttt.run_time_to_target(slower, 0.6, band_lo=0.2)
    assert other.time_to_target_s == _uncached_reach(slower, 0.6, 0.2).time_to_target_s
    assert other.time_to_target_s == pytest.approx(2.0 * first.time_to_target_s)

    late = dataclasses.replace(run, eval_responses=run.eval_responses.copy())
    ttt.run_time_to_target(late, 0.6, band_lo=0.2)
    late.eval_responses[1:] += 100.0  # changed in place after a call: a new key
    moved = ttt.run_time_to_target(late, 0.6, band_lo=0.2)
    assert moved.n_star == _uncached_reach(late, 0.6, 0.2).n_star != first.n_star
    # The target, the band and the crossing are in the key too.
    for args in [(0.7, 0.2, "update"), (0.6, None, "update"), (0.6, 0.2, "linear")]:
        rt = ttt.run_time_to_target(run, args[0], args[1], crossing=args[2])
        assert rt.n_star == _uncached_reach(run, *args).n_star
