"""Critical training batch and gradient-norm trend on synthetic sweeps with known answers."""

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch.analysis import critical_batch as cb
from rl_batch.analysis import curves
from rl_batch.analysis import time_to_target as ttt


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    d = fx.write_sweep(str(tmp_path_factory.mktemp("sweep")))
    return ttt.analyze_sweep(curves.load_sweep(d), n_boot=200)


def test_family_is_sqrt_at_reference_group_size(analysis):
    fam = cb.family_keys(list(analysis.stats), reference=analysis.reference)
    assert [k.batch for k in fam] == [64, 128, 256, 512, 1024]
    assert all(k.group_size == 8 and k.lr_rule == "sqrt" for k in fam)
    fam16 = cb.family_keys(list(analysis.stats), group_size=16, reference=analysis.reference)
    assert [k.batch for k in fam16] == [128]
    assert cb.critical_training_batch(analysis, group_size=16) is None  # One batch only.


def test_critical_training_batch_known_edge(analysis):
    # tau multipliers 1, 1, 1.05, 1.6, 2.5 (x 0.99/1.01 per seed): r_N = those ratios.
    crit = cb.critical_training_batch(analysis, tol=0.2)
    assert crit.critical_batch == 256 and crit.first_outside == 512
    assert (crit.critical_batch_lo, crit.critical_batch_hi) == (256, 256)
    assert crit.r_n_at_critical.mean == pytest.approx(1.05, rel=0.01)
    assert [round(e.mean, 2) for e in crit.r_n] == [1.0, 1.0, 1.05, 1.6, 2.5]
    assert cb.critical_training_batch(analysis, tol=0.7).critical_batch == 512
    assert cb.critical_training_batch(analysis, tol=2.0).first_outside is None
    assert cb.critical_training_batch(analysis, tol=0.01).critical_batch == 128


@pytest.mark.parametrize("method, lo_end", [("bootstrap", 128), ("t", 64)])
def test_critical_batch_interval_walks_with_the_r_n_bounds(tmp_path, method, lo_end):
    # tol = 0.04: r_N(256) = 1.05 lies outside, but its interval straddles 1.04. With two
    # seeds (tau x 0.99 / 1.01) the percentile bootstrap gives about [1.03, 1.07] and r_N(128)
    # = 1.0 stays inside; the t interval (1 degree of freedom per side) is wider, so r_N(128)'s
    # upper bound passes 1.04 too and the conservative walk stops at 64. The optimistic walk
    # passes 256 with either.
    d = fx.write_sweep(str(tmp_path / "sweep"))
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=200, method=method)
    crit = cb.critical_training_batch(a, tol=0.04)
    e = crit.r_n[2]
    assert e.lo < 1.04 < e.hi
    assert (crit.critical_batch, crit.critical_batch_lo, crit.critical_batch_hi) == (
        128,
        lo_end,
        256,
    )


def test_trend_from_norms_hand_values():
    b = np.array([64.0, 128.0, 256.0, 512.0, 1024.0])
    g = np.sqrt(1.0 + 256.0 / b)  # |G|^2 = 1, tr(Sigma) = 256.
    slope, seg, slow, knee = cb.trend_from_norms(b, g, slow_frac=0.5)
    expected_seg = np.diff(np.log(g)) / np.log(2.0)
    np.testing.assert_allclose(seg, expected_seg)
    assert seg[0] == pytest.approx(0.5 * np.log(3.0 / 5.0) / np.log(2.0))  # -0.368
    assert slow == 3  # -0.132 is the first slope flatter than 0.5 x -0.368.
    assert knee == pytest.approx(256.0)
    assert slope == pytest.approx(np.polyfit(np.log(b), np.log(g), 1)[0])
    # Pure noise (norm ~ B^-1/2): the decline never slows; no positive |G|^2, no knee.
    _, seg, slow, knee = cb.trend_from_norms(b, 3.0 / np.sqrt(b))
    np.testing.assert_allclose(seg, -0.5)
    assert slow is None and knee is None


def test_grad_norm_trend_actor_and_critic(tmp_path):
    configs = [(p, 1, "sqrt", 1.0) for p in (16, 32, 64, 128)]
    d = fx.write_sweep(
        str(tmp_path),
        configs=configs,
        seed_factors=(1.0,),
        algo="ppo",
        reference=None,
        critic=True,
        warmup_updates=3,
    )
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=50)
    actor = cb.grad_norm_trend(a, "grad_norm")
    critic = cb.grad_norm_trend(a, "critic_grad_norm")
    np.testing.assert_allclose(actor.batches, [16, 32, 64, 128])
    np.testing.assert_allclose(actor.norms, np.sqrt(fx.G2 + fx.TRACE_SIGMA / actor.batches))
    assert actor.knee_batch == pytest.approx(fx.TRACE_SIGMA / fx.G2)
    assert critic.knee_batch == pytest.approx(64.0 / 4.0)  # Fixture critic: 4 + 64 / B.
    assert critic.slope > actor.slope  # The critic's norm falls more slowly with batch.
    assert cb.grad_norm_trend(a, "no_such_field") is None


def test_grad_norm_trend_window_ignores_running_seed(tmp_path):
    # sqrt family 64..1024, one finished seed each, budget 12000: the runs stop at
    # ceil(12000/B)*B = 12032 (B = 64, 128, 256) and 12288 (B = 512, 1024), so the
    # window is 12032. A second seed of B = 128 has just started: 2 updates, 256 responses.
    configs = [(p, 8, "sqrt", 1.0) for p in (8, 16, 32, 64, 128)]
    d = fx.write_sweep(str(tmp_path), configs=configs, seed_factors=(1.0,))
    before = cb.grad_norm_trend(ttt.analyze_sweep(curves.load_sweep(d), n_boot=20))
    name = fx.add_seed(d, prompts=16, group_size=8, seed=1, tau=fx.TAU0, budget=256)
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=20)
    assert [r.final_responses for r in a.runs_by_key[a.reference]] == [12032.0]
    p16 = next(k for k in a.stats if k.prompts == 16)
    assert sorted(r.final_responses for r in a.runs_by_key[p16]) == [256.0, 12032.0]
    assert a.stats[p16].incomplete  # The running seed is kept by the statistics...
    after = cb.grad_norm_trend(a)
    # ...but not by the trend: same window, same five batches, same norms.
    assert before.window_responses == after.window_responses == 12032.0
    np.testing.assert_allclose(after.batches, [64, 128, 256, 512, 1024])
    np.testing.assert_allclose(after.batches, before.batches)
    np.testing.assert_allclose(after.norms, before.norms)
    assert before.left_out == () and after.left_out == (name,)
    # An explicit window the running seed covers keeps it; B = 512 and 1024 have no
    # update within 256 responses, so they drop out.
    short = cb.grad_norm_trend(a, window_responses=256.0)
    np.testing.assert_allclose(short.batches, [64, 128, 256])
    assert short.left_out == ()
    from rl_batch.analysis import report

    assert f"Left out: {name} (stopped before 12032 responses)." in report.build_report(a)


def test_one_seed_has_no_ci_walk(tmp_path):
    from rl_batch.analysis import report

    # One seed per configuration (the default CPU configs): r_N has no interval, so the
    # critical batch has a point value but no CI walk, and the report says so.
    d = fx.write_sweep(str(tmp_path / "s"), configs=fx.STANDARD_CONFIGS[:4], seed_factors=(1.0,))
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=100)
    ref = a.stats[a.reference]
    assert ref.n_seeds == 1 and not ref.n_star.has_interval
    crit = cb.critical_training_batch(a, tol=0.2)
    assert crit.critical_batch == 256 and crit.first_outside == 512  # r_N 1, 1.05, 1.6.
    assert crit.critical_batch_lo is None and crit.critical_batch_hi is None
    assert not crit.has_interval
    text = report.build_report(a)
    assert "CI walk: unavailable" in text
    assert "(1 seed, no CI)" in text
    assert "[" + f"{ref.n_star.mean:.4g}" + "," not in text  # No "x [x, x]" interval.
    row = next(line for line in text.splitlines() if line.startswith("| grpo-P8-G8-sqrt"))
    assert f"| {ref.n_star.mean:.4g} (1 seed, no CI) |" in row
