"""The plain recommendation: equivalent (two one-sided tests), slower, or undecided."""

import json
import os

import numpy as np
import pytest
from analysis_fixtures import write_sweep
from scipy import stats

from rl_batch.analysis import curves, equivalence, intervals, planner, report, time_to_target
from rl_batch.analysis.time_to_target import Estimate

# q(B) = B / (1.6 + 0.017 B) in the fixture: q(64) = 23.8, q(128) = 33.9, q(256) = 43.0
# responses/s; T is proportional to tau multiplier / q, so B = 256 at 1.27 x the samples of
# B = 128 takes 1.27 x 33.9 / 43.0 = 1.001 x its time, and B = 64 at 1 x takes 1.42 x.
EQUAL_CONFIGS = ((16, 8, "sqrt", 1.0), (32, 8, "sqrt", 1.27), (8, 8, "sqrt", 1.0))
TIGHT = (0.98, 0.99, 1.0, 1.01, 1.02)


def _analysis(tmp_path, configs, factors, **kw):
    d = write_sweep(str(tmp_path / "s"), configs=configs, seed_factors=factors, **kw)
    return time_to_target.analyze_sweep(curves.load_sweep(d))


def test_verdicts_worked_by_hand():
    one = Estimate(1.0, 1.0, 1.0, 3)
    assert equivalence._verdict(Estimate(1.01, 0.96, 1.049, 5), one, 0.05) == "equivalent"
    # The 90 % interval pokes out of [0.95, 1.05]: not shown equivalent; the 95 % one
    # contains 1: not shown slower either.
    assert (
        equivalence._verdict(Estimate(1.01, 0.96, 1.06, 5), Estimate(1.01, 0.95, 1.07, 5), 0.05)
        == "undecided"
    )
    assert (
        equivalence._verdict(Estimate(1.2, 1.1, 1.3, 5), Estimate(1.2, 1.05, 1.35, 5), 0.05)
        == "slower"
    )
    # No interval (one seed): never equivalent, never slower.
    nan = float("nan")
    assert (
        equivalence._verdict(Estimate(1.0, nan, nan, 1), Estimate(1.0, nan, nan, 1), 0.05)
        == "undecided"
    )


def test_seeds_to_decide_matches_the_closed_form():
    # Two samples [0.9, 1.1]: equal means (ratio 1, never "different"), per-seed variance
    # of the log mean 0.02 on each side; at m seeds var = 0.04 / m, df = 2 (m - 1)
    # (Welch with equal parts). Equivalence at 5 %: t_0.95 sqrt(0.04 / m) <= log(1.05).
    a = np.array([[0.9], [1.1]])
    m = next(
        m
        for m in range(2, 101)
        if stats.t.ppf(0.95, 2 * (m - 1)) * np.sqrt(0.04 / m) <= np.log(1.05)
    )
    assert 45 <= m <= 52  # 16.8 t^2 with t about 1.66
    assert intervals.seeds_to_decide(a, a, [1.0], 0.05) == m
    # A 20 % gap is a difference long before it is anything else: at m seeds the 95 %
    # interval of log(1.2 / 1) = 0.182 must exclude 0.
    b = a * 1.2
    m_diff = next(
        m
        for m in range(2, 101)
        if stats.t.ppf(0.975, 2 * (m - 1)) * np.sqrt(0.04 / m) < np.log(1.2)
    )
    assert (
        intervals.seeds_to_decide(b, a, [1.0], 0.05) == m_diff == 6
    )  # t_0.975(10) 0.0816 = 0.1819 < 0.1823
    assert intervals.seeds_to_decide(a[:1], a, [1.0], 0.05) is None  # one seed: no spread


def test_holm_level():
    assert intervals.holm_level(0.95, 1) == pytest.approx(0.95)
    assert intervals.holm_level(0.95, 4) == pytest.approx(0.9875)
    with pytest.raises(ValueError, match="k must be >= 1"):
        intervals.holm_level(0.95, 0)


def test_two_equivalent_batches_are_one_recommended_set(tmp_path):
    analysis = _analysis(tmp_path, EQUAL_CONFIGS, TIGHT, reference="P8_G8_sqrt_s0")
    plan = planner.plan_full(analysis)
    verdicts = {p.key.batch: p.verdict for p in plan.pairs}
    assert {plan.best.batch, *[b for b, v in verdicts.items() if v == "equivalent"]} == {128, 256}
    assert verdicts[64] == "slower"
    assert plan.decided and {k.batch for k in plan.recommended_set} == {128, 256}
    assert plan.recommendation is None  # two members: no single configuration
    s = plan.verdict
    assert s.startswith("Use B = ") and " or " in s and "of each other" in s, s
    assert "both faster than the next, B = 64, which takes 42 % longer" in s, s
    # T(64) / T(member) = 1.42 by the fixture's formula (1.0 x 33.9 / 23.8 against B = 128).
    assert "T(B = 64) / T(B = 128) = 1.42" in s, s
    obj = planner.plan_to_json(plan)
    assert sorted(obj["recommended_batches"]) == [128, 256] and obj["sentence"] == s
    assert obj["equivalence_delta"] == 0.05
    assert {p["verdict"] for p in obj["pairs"]} == {"equivalent", "slower"}


def test_the_report_opens_with_the_sentence(tmp_path):
    analysis = _analysis(tmp_path, EQUAL_CONFIGS, TIGHT, reference="P8_G8_sqrt_s0")
    text = report.build_report(analysis, resamples=0)
    lines = text.splitlines()
    assert lines[2].startswith("**Recommendation.** Use B = "), lines[:4]


def test_a_narrow_margin_leaves_it_undecided_with_the_seeds_that_would_decide(tmp_path):
    d = write_sweep(str(tmp_path / "s"), configs=EQUAL_CONFIGS, seed_factors=TIGHT)
    analysis = time_to_target.analyze_sweep(curves.load_sweep(d), delta=0.005)
    plan = planner.plan_full(analysis)
    open_ = [p for p in plan.pairs if p.verdict == "undecided"]
    assert [p.key.batch for p in open_] and not plan.decided
    s = plan.verdict
    assert s.startswith("Undecided at this power:") and "at delta = 0.005" in s, s
    assert "more seeds per configuration would tell" in s or "more seeds than 100" in s
    assert {k.batch for k in plan.candidates} == {128, 256}  # B = 64 is still shown slower


def test_wide_seeds_are_undecided_not_equivalent(tmp_path):
    analysis = _analysis(tmp_path, EQUAL_CONFIGS, (0.8, 1.0, 1.2))
    plan = planner.plan_full(analysis)
    pair = next(p for p in plan.pairs if p.key.batch in (128, 256))
    assert pair.verdict == "undecided" and pair.seeds is not None and pair.seeds > 3
    assert f"about {pair.seeds - 3} more seeds per configuration would tell" in plan.verdict


def test_the_margin_comes_from_the_sweep_and_is_checked(tmp_path):
    d = write_sweep(str(tmp_path / "s"), configs=EQUAL_CONFIGS, seed_factors=TIGHT)
    path = os.path.join(d, "sweep.json")
    with open(path) as f:
        record = json.load(f)
    record["grid"] = {"equivalence_delta": 0.2}
    with open(path, "w") as f:
        json.dump(record, f)
    assert time_to_target.analyze_sweep(curves.load_sweep(d)).delta == 0.2
    with pytest.raises(
        ValueError, match="equivalence_delta must be a number in \\(0, 1\\), got 1.5"
    ):
        time_to_target.analyze_sweep(curves.load_sweep(d), delta=1.5)


def test_a_sweep_refuses_a_bad_margin_before_compute():
    from experiments.configs import grpo_cpu
    from rl_batch.sweeps import sweep

    base = grpo_cpu.get_config()
    base.sweep.equivalence_delta = 0.0
    with pytest.raises(ValueError, match="sweep.equivalence_delta must be a number in"):
        sweep.plan(base, "/nonexistent", device_count=1)
