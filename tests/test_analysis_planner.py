"""Algorithm 1 planner: full and pilot modes on a synthetic sweep with a known best batch."""

import json
import math
import os
import subprocess
import sys

import analysis_fixtures as fx
import pytest

from rl_batch import artifacts
from rl_batch.analysis import curves, planner
from rl_batch.analysis import time_to_target as ttt

BEST = artifacts.Configuration("grpo", 32, 8, "sqrt")  # B = 256: r_N 1.05, r_q 1.81.


def write_calibration(sweep_dir: str, configs=fx.STANDARD_CONFIGS, rounds: int = 1) -> None:
    """A calibration.json whose step times are the fixtures' seconds per update (the
    runs' own timings are then the calibrated clock: the pilot's numbers stay exact)."""
    cal = {}
    for p, g, rule, *_ in configs:
        step = fx.time_per_update_s(p * g)
        cal[f"{p}x{g}:{rule}"] = {"batch": p * g, "step_s": [step] * rounds,
                                  "step_s_median": step}  # fmt: skip
    obj = {"version": 1, "rounds": rounds, "steps": 2, "configs": cal}
    artifacts.write_json_atomic(os.path.join(sweep_dir, artifacts.CALIBRATION_FILE), obj)


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    d = fx.write_sweep(str(tmp_path_factory.mktemp("sweep")))
    write_calibration(d)
    return d


@pytest.fixture(scope="module")
def full(sweep_dir):
    return ttt.analyze_sweep(curves.load_sweep(sweep_dir), n_boot=200)


def _expected_r_t(batch, mult):
    return mult * fx.q_of(64) / fx.q_of(batch)


def test_full_plan_ranks_by_r_t(full):
    plan = planner.plan_full(full)
    assert plan.recommendation == BEST
    assert plan.rows[0].r_t.mean == pytest.approx(_expected_r_t(256, 1.05), rel=0.01)  # 0.581
    means = [r.r_t.mean for r in plan.rows if r.r_t is not None]
    assert means == sorted(means)
    last = plan.rows[-1]
    assert last.key == artifacts.Configuration("grpo", 64, 8, "fixed") and not last.reached
    assert last.r_t is None and "not reached" in last.note
    # The study's ordering: fixed LR at 2x the batch is slower than the reference.
    fixed = next(r for r in plan.rows if r.key == artifacts.Configuration("grpo", 16, 8, "fixed"))
    assert fixed.r_t.mean == pytest.approx(_expected_r_t(128, 1.67), rel=0.01)  # 1.17
    assert fixed.r_t.mean > 1.0
    obj = planner.plan_to_json(plan)
    assert obj["recommendation"] == "grpo-P32-G8-sqrt" and obj["recommended_batch"] == 256
    assert obj["rows"][-1]["r_n"] == "not reached"
    # Each row's configured batch B = P x G ("batch_responses" is an update's retained count).
    assert all(r["batch"] == r["prompts"] * r["group_size"] for r in obj["rows"])
    assert not any("batch_responses" in r for r in obj["rows"])
    json.dumps(obj)  # Serializable.


@pytest.mark.parametrize("method", ["intermediate", "fit"])
def test_pilot_picks_the_best_at_a_fraction_of_the_cost(sweep_dir, full, method):
    plan = planner.plan_pilot(
        curves.load_sweep(sweep_dir), 0.3, method=method, full=full, n_boot=100
    )
    assert plan.recommendation == BEST
    p = plan.pilot
    assert p.best == BEST and p.pick == BEST and p.regret == pytest.approx(1.0)
    assert p.window_responses == pytest.approx(0.3 * fx.BUDGET)
    # Cost: every run keeps the updates within 3600 responses.
    pilot_cost = sweep_cost = 0.0
    for prompts, group, _, _ in fx.STANDARD_CONFIGS:
        b = prompts * group
        pilot_cost += 2 * (3600 // b) * fx.time_per_update_s(b)
        sweep_cost += 2 * math.ceil(fx.BUDGET / b) * fx.time_per_update_s(b)
    assert p.pilot_cost_s == pytest.approx(pilot_cost)
    assert p.sweep_cost_s == pytest.approx(sweep_cost)
    assert p.cost_fraction == pytest.approx(pilot_cost / sweep_cost)  # About 0.29.
    by_key = {r.key: r for r in plan.rows}
    # Same curve family, so r_N at any level equals the tau ratio.
    assert by_key[BEST].r_n.mean == pytest.approx(1.05, rel=0.02)
    assert by_key[BEST].r_q.mean == pytest.approx(fx.q_of(256) / fx.q_of(64), rel=1e-6)
    never = by_key[artifacts.Configuration("grpo", 64, 8, "fixed")]
    if method == "fit":
        assert never.r_n.mean == pytest.approx(10.0, rel=0.05)  # Extrapolated from 30%.
    else:
        assert 0.0 < p.level < fx.TARGET
        assert never.r_n is None and never.r_n_lower_bound > 1.0
        assert plan.rows[-1].r_n is None  # Bounds rank after the predictions.


def test_pilot_fraction_validation(sweep_dir, full):
    with pytest.raises(ValueError, match="fraction"):
        planner.plan_pilot(curves.load_sweep(sweep_dir), 0.0, full=full)
    with pytest.raises(ValueError, match="method"):
        planner.plan_pilot(curves.load_sweep(sweep_dir), 0.3, method="guess", full=full)


def test_fit_saturating_recovers_parameters():
    n = [0.0, 500.0, 1000.0, 1500.0, 2000.0, 2500.0]
    acc = [fx.accuracy(x, 3000.0, a_max=0.7, a0=0.1) for x in n]
    fit = planner.fit_saturating(n, acc)
    assert fit.A == pytest.approx(0.7, rel=1e-3) and fit.a0 == pytest.approx(0.1, abs=1e-3)
    assert fit.tau == pytest.approx(3000.0, rel=0.01)
    assert fit.responses_to(0.5) == pytest.approx(3000.0 * math.log(0.6 / 0.2), rel=0.01)
    assert fit.responses_to(0.75) is None  # Above the asymptote.
    assert planner.fit_saturating([0.0, 1.0], [0.1, 0.2]) is None


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_plan_batch_cli_writes_plan_json(sweep_dir):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-m", "experiments.plan_batch", f"--sweep={sweep_dir}", "--n_boot=50"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    # The plain sentence first, then the table (and again under it).
    assert out.stdout.startswith("Use B = 256 (grpo-P32-G8-sqrt): faster than the next"), out.stdout
    assert "Recommendation: Use B = 256 (grpo-P32-G8-sqrt)" in out.stdout
    assert "the recommendation set held grpo-P32-G8-sqrt (batch 256) 100%" in out.stdout
    plan = json.load(open(os.path.join(sweep_dir, "plan.json")))
    assert plan["mode"] == "full" and plan["recommended_batch"] == 256
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.plan_batch",
            f"--sweep={sweep_dir}",
            "--n_boot=50",
            "--pilot_fraction=0.3",
            "--reference=P8_G8_sqrt_s1",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "T(pick)/T(best) = 1.000" in out.stdout
    pilot = json.load(open(os.path.join(sweep_dir, "plan_pilot.json")))
    assert pilot["pilot"]["pick"] == "grpo-P32-G8-sqrt"
    assert 0.2 < pilot["pilot"]["cost_fraction"] < 0.35


def test_pilot_too_short_to_see_learning(sweep_dir, full):
    # 1% of the runway: one evaluation at most for the large batches, no usable level.
    plan = planner.plan_pilot(curves.load_sweep(sweep_dir), 0.01, full=full, n_boot=20)
    assert plan.recommendation is None and "no prediction" in plan.note
    assert all(r.r_n is None for r in plan.rows)
    obj = planner.plan_to_json(plan)
    json.dumps(obj)
    assert obj["pilot"]["best"] == "grpo-P32-G8-sqrt"


def test_pilot_lower_bound_hand_values():
    # Seeds N = 1000 and not reached in a 3600-response window; N_ref = 1000, 1200:
    # r_N >= mean(1000, 3600) / 1100 = 2.0909 (not 3600 / 1100 = 3.27).
    assert planner.pilot_lower_bound([1000.0, None], [3600.0, 3600.0], [1000.0, 1200.0]) == (
        pytest.approx(2300.0 / 1100.0)
    )
    # A seed still running, watched for 2000 responses only, counts as 2000.
    assert planner.pilot_lower_bound([None, None], [3600.0, 2000.0], [1100.0]) == pytest.approx(
        2800.0 / 1100.0
    )


def _linear_run(run_dir, prompts, slope, budget=4000, q=10.0):
    """acc = n / slope (evaluated after every update), time = n / q."""
    os.makedirs(run_dir, exist_ok=True)
    batch, n, step = prompts * 8, 0, 0
    lines = [{"kind": "eval", "step": 0, "responses_cum": 0, "eval_accuracy": 0.0}]
    while n < budget:
        n += batch
        step += 1
        lines.append(
            {
                "kind": "update",
                "step": step,
                "responses_cum": n,
                "time_train_cum_s": n / q,
                "prompts": prompts,
                "group_size": 8,
            }
        )
        lines.append({"kind": "eval", "step": step, "responses_cum": n, "eval_accuracy": n / slope})
    with open(os.path.join(run_dir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)


def test_pilot_bound_averages_min_of_n_and_window(tmp_path):
    from rl_batch import artifacts

    # Reference P=16 (B=128): both seeds acc = n/4000. Candidate P=64 (B=512): seed 0
    # acc = n/4000, seed 1 acc = n/40000 (misses the level in the window).
    runs = []
    for name, prompts, slope in [
        ("ref_s0", 16, 4000.0),
        ("ref_s1", 16, 4000.0),
        ("big_s0", 64, 4000.0),
        ("big_s1", 64, 40000.0),
    ]:
        _linear_run(str(tmp_path / "runs" / name), prompts, slope)
        runs.append(
            {
                "name": name,
                "prompts": prompts,
                "group_size": 8,
                "lr_rule": "sqrt",
                "seed": int(name[-1]),
                "status": "finished",
            }
        )
    artifacts.write_json_atomic(
        str(tmp_path / "sweep.json"),
        {
            "name": "lin",
            "algo": "grpo",
            "target": 0.9,
            "reference": "ref_s0",
            "budget_responses": 4000,
            "runs": runs,
        },
    )
    write_calibration(str(tmp_path), [(16, 8, "sqrt"), (64, 8, "sqrt")])
    plan = planner.plan_pilot(curves.load_sweep(str(tmp_path)), 0.5, n_boot=20)
    # Window 2000. Best accuracy in it: reference 1920/4000 = 0.48; candidate seeds
    # 1536/4000 = 0.384 and 1536/40000 = 0.0384, mean 0.2112. Level = 0.8 x median of
    # (0.48, 0.2112) = 0.27648, reached at N = 0.27648 x 4000 = 1105.92 on acc = n/4000.
    assert plan.pilot.window_responses == pytest.approx(2000.0)
    assert plan.pilot.level == pytest.approx(0.8 * (0.48 + 0.2112) / 2)
    n_lvl = 0.27648 * 4000.0
    big = next(r for r in plan.rows if r.key.prompts == 64)
    assert big.r_n is None and not big.reached
    assert big.r_n_lower_bound == pytest.approx((n_lvl + 2000.0) / 2 / n_lvl)  # 1.4042
    assert "by 1/2 seeds" in big.note
    assert ">= 1.4" in planner.format_plan_table(plan)


def test_overlapping_intervals_give_candidates_not_a_winner(tmp_path):
    # B = 128 and 256 have T/T_ref 0.70 and 0.58; with a 40% seed spread of N* their
    # intervals overlap: no single recommendation, both candidates, and a seed count.
    configs = [(8, 8, "sqrt", 1.0), (16, 8, "sqrt", 1.0), (32, 8, "sqrt", 1.05)]
    d = fx.write_sweep(str(tmp_path / "wide"), configs=configs, seed_factors=(0.6, 1.0, 1.4))
    plan = planner.plan_full(ttt.analyze_sweep(curves.load_sweep(d)))
    b128, b256 = (
        artifacts.Configuration("grpo", 16, 8, "sqrt"),
        artifacts.Configuration("grpo", 32, 8, "sqrt"),
    )
    assert plan.best == b256 and plan.recommendation is None and not plan.decided
    assert b128 in plan.candidates and plan.candidates[0] == b256
    rows = {r.key: r for r in plan.rows}
    assert rows[b128].r_t.lo <= rows[b256].r_t.hi  # why they cannot be told apart
    assert plan.seeds_to_separate is not None and plan.seeds_to_separate > 3
    text = planner.format_plan_table(plan)
    assert "Recommendation: Undecided at this power: B = 256 has the smallest mean T" in text
    assert "more seeds per configuration would tell B = 256 from B = 128" in text
    obj = planner.plan_to_json(plan)
    assert obj["recommendation"] is None and obj["best"] == "grpo-P32-G8-sqrt"
    assert obj["candidates"][0] == "grpo-P32-G8-sqrt" and "grpo-P16-G8-sqrt" in obj["candidates"]
    # The same curves with a 1% spread: one winner.
    d = fx.write_sweep(str(tmp_path / "tight"), configs=configs)
    plan = planner.plan_full(ttt.analyze_sweep(curves.load_sweep(d)))
    assert plan.recommendation == b256 and plan.candidates == (b256,)


def test_one_seed_names_no_winner(tmp_path):
    configs = [(8, 8, "sqrt", 1.0), (16, 8, "sqrt", 1.0), (32, 8, "sqrt", 1.05)]
    d = fx.write_sweep(str(tmp_path / "one"), configs=configs, seed_factors=(1.0,))
    plan = planner.plan_full(ttt.analyze_sweep(curves.load_sweep(d)))
    assert (
        plan.best == artifacts.Configuration("grpo", 32, 8, "sqrt") and plan.recommendation is None
    )
    assert len(plan.candidates) == 3 and plan.seeds_to_separate is None  # (no interval)
    assert "an interval first (2+ seeds per configuration) would tell B = 256 from" in plan.verdict
    assert "nan" not in plan.verdict


def test_pilot_refuses_without_calibration_and_says_what_it_saves(tmp_path, sweep_dir, full):
    d = fx.write_sweep(str(tmp_path))
    with pytest.raises(ValueError, match="no calibrated step times"):
        planner.plan_pilot(curves.load_sweep(d), 0.3, n_boot=20)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-m", "experiments.plan_batch", f"--sweep={d}", "--n_boot=20",
         "--pilot_fraction=0.3"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0 and "no calibrated step times" in out.stderr
    assert len([ln for ln in out.stderr.splitlines() if ln.strip()]) == 1, out.stderr
    plan = planner.plan_pilot(curves.load_sweep(sweep_dir), 0.3, full=full, n_boot=20)
    p = plan.pilot
    text = planner.format_plan_table(plan)
    saved = p.sweep_cost_s - p.pilot_cost_s
    assert f"it saves {saved:.4g} s ({1 - p.cost_fraction:.1%})." in text
    # A pilot over the whole runway costs the sweep: it says that it saves nothing.
    whole = planner.plan_pilot(curves.load_sweep(sweep_dir), 1.0, full=full, n_boot=20)
    assert "; little: most runs end inside the window" in planner.format_plan_table(whole)


def test_pilot_r_q_is_the_calibrated_step_time_ratio(tmp_path):
    # The runs' own clock says every batch runs at q = 10 responses/s (contention), the
    # calibration that B = 512 steps take 2x B = 128's for 4x the responses: r_q = 2.
    runs = []
    for name, prompts in [("ref_s0", 16), ("ref_s1", 16), ("big_s0", 64), ("big_s1", 64)]:
        _linear_run(str(tmp_path / "runs" / name), prompts, 4000.0)
        runs.append({"name": name, "prompts": prompts, "group_size": 8, "lr_rule": "sqrt",
                     "seed": int(name[-1]), "status": "finished"})  # fmt: skip
    artifacts.write_json_atomic(
        str(tmp_path / "sweep.json"),
        {"name": "lin", "algo": "grpo", "target": 0.9, "reference": "ref_s0",
         "budget_responses": 4000, "runs": runs},
    )  # fmt: skip
    cal = {"16x8:sqrt": {"batch": 128, "step_s": [1.0, 1.0], "step_s_median": 1.0},
           "64x8:sqrt": {"batch": 512, "step_s": [2.0, 2.0], "step_s_median": 2.0}}  # fmt: skip
    obj = {"version": 1, "rounds": 2, "steps": 2, "configs": cal}
    artifacts.write_json_atomic(str(tmp_path / artifacts.CALIBRATION_FILE), obj)
    plan = planner.plan_pilot(curves.load_sweep(str(tmp_path)), 0.5, n_boot=20)
    big = next(r for r in plan.rows if r.key.prompts == 64)
    assert big.r_q.mean == pytest.approx(2.0)
    assert big.r_q.lo == pytest.approx(2.0) and big.r_q.hi == pytest.approx(2.0)  # no spread
    # Window 2000 responses: 15 updates of 128 (15 s) and 3 of 512 (6 s) per seed.
    assert plan.pilot.pilot_cost_s == pytest.approx(2 * 15 * 1.0 + 2 * 3 * 2.0)
