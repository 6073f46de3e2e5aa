"""t intervals for means and ratios of means, worked by hand and checked for coverage."""

import math

import numpy as np
import pytest
from scipy import stats

from rl_batch.analysis import intervals
from rl_batch.analysis import time_to_target as ttt

T2 = 4.302652729911275  # t_{0.975} at 2 degrees of freedom
T1 = 12.706204736174707  # ... at 1


def test_t_quantile_matches_tables():
    assert intervals.t_quantile(2, 0.95) == pytest.approx(T2)
    assert intervals.t_quantile(1, 0.95) == pytest.approx(T1)


def test_t_mean_by_hand():
    # mean 2, s = 1, half-width t_2 / sqrt(3).
    mean, lo, hi = intervals.t_mean([1.0, 2.0, 3.0], 0.95)
    assert mean == 2.0
    assert (lo, hi) == pytest.approx((2.0 - T2 / math.sqrt(3), 2.0 + T2 / math.sqrt(3)))
    mean, lo, hi = intervals.t_mean([5.0], 0.95)
    assert mean == 5.0 and math.isnan(lo) and math.isnan(hi)


def test_log_ratio_by_hand():
    # a = [2, 4]: mean 3, var 2; d log(mean)/d mean = 1/3, so var(log) = (1/9) * 2 / 2 = 1/9.
    # ref = [1, 1, 1]: no spread. Welch df = (1/9)^2 / ((1/9)^2 / 1) = 1.
    point, lo, hi = intervals.t_log_ratio(np.array([[2.0], [4.0]]), np.ones((3, 1)), [1.0], 0.95)
    assert point == pytest.approx(3.0)
    assert (lo, hi) == pytest.approx((3.0 * math.exp(-T1 / 3), 3.0 * math.exp(T1 / 3)))
    # r_N / r_q with N and q paired per run: the weights [1, -1] give (N_a/N_r) / (q_a/q_r).
    a = np.array([[2.0, 1.0], [4.0, 2.0]])  # N doubles with q: T = N/q is constant
    point, lo, hi = intervals.t_log_ratio(a, np.ones((2, 2)), [1.0, -1.0], 0.95)
    assert point == pytest.approx(2.0)
    # var(log mean N - log mean q) = g' S g / n, g = (1/3, -1/1.5): S = [[2, 1], [1, .5]].
    g = np.array([1 / 3, -1 / 1.5])
    var = g @ np.array([[2.0, 1.0], [1.0, 0.5]]) @ g / 2
    assert var == pytest.approx(0.0)  # perfectly correlated: the ratio has no spread
    assert (lo, hi) == pytest.approx((2.0, 2.0))
    # One seed on a side: no interval.
    _, lo, hi = intervals.t_log_ratio(np.array([[2.0]]), np.ones((3, 1)), [1.0], 0.95)
    assert math.isnan(lo) and math.isnan(hi)


def test_log_ratio_interval_covers_at_three_seeds():
    # Lognormal N* with a 30% spread, 3 seeds a side: the t interval covers the true ratio
    # of means about 95% of the time; the percentile bootstrap over 3 values does not.
    rng = np.random.default_rng(0)
    sigma, true_ratio, trials = 0.3, 1.5, 600
    t_hits = boot_hits = 0
    for i in range(trials):
        a = true_ratio * np.exp(sigma * rng.standard_normal(3) - sigma**2 / 2)
        r = np.exp(sigma * rng.standard_normal(3) - sigma**2 / 2)
        _, lo, hi = intervals.t_log_ratio(a[:, None], r[:, None], [1.0], 0.95)
        t_hits += lo <= true_ratio <= hi
        b = ttt.ratio_estimate(a, r, [1.0], 400, 0.95, i, "bootstrap")
        boot_hits += b.lo <= true_ratio <= b.hi
    assert 0.92 <= t_hits / trials <= 0.995
    assert boot_hits / trials < 0.85  # (why the t interval is the default)


def test_seeds_to_separate_by_hand():
    # Half-width 3 at 3 seeds: s = 3 sqrt(3) / t_2 = 1.208 each; the gap 4 needs
    # t_{m-1} * 2.415 / sqrt(m) < 4: m = 3 gives 6.0, m = 4 gives 3.84.
    a, b = (10.0, 7.0, 13.0, 3), (14.0, 11.0, 17.0, 3)
    assert intervals.seeds_to_separate(a, b, 0.95) == 4
    t3 = stats.t.ppf(0.975, 3)
    s = 3 * math.sqrt(3) / T2
    assert t3 * 2 * s / 2 < 4 < T2 * 2 * s / math.sqrt(3)
    assert intervals.seeds_to_separate(a, (10.0, 7.0, 13.0, 3), 0.95) is None  # equal means
    assert intervals.seeds_to_separate(a, (14.0, math.nan, math.nan, 1), 0.95) is None
    assert intervals.seeds_to_separate(a, (10.01, 7.0, 13.0, 3), 0.95, max_seeds=50) is None


def test_seeds_for_half_width_by_hand():
    # a = [2, 4] against a spread-free reference: r = 3, per-seed var(log) = 2/9, so at m
    # seeds the half-width is 3 sinh(t_{m-1} sqrt(2 / (9 m))) (Welch df = m - 1).
    a, ref = np.array([[2.0], [4.0]]), np.ones((3, 1))

    def half(m):
        return 3.0 * math.sinh(stats.t.ppf(0.975, m - 1) * math.sqrt(2.0 / (9.0 * m)))

    assert half(10) > 1.0 >= half(11)
    assert intervals.seeds_for_half_width(a, ref, [1.0], 1.0, 0.95) == 11
    assert intervals.seeds_for_half_width(a, ref, [1.0], 0.2, 0.95, max_seeds=50) is None
    # At the seeds it has, the answer agrees with the interval actually computed.
    _, lo, hi = intervals.t_log_ratio(a, ref, [1.0], 0.95)
    assert (hi - lo) / 2 == pytest.approx(half(2))
    assert intervals.seeds_for_half_width(a, ref, [1.0], half(2) + 1e-9, 0.95) == 2
    assert intervals.seeds_for_half_width(a[:1], ref, [1.0], 1.0, 0.95) is None  # 1 seed


def test_analysis_rejects_an_unknown_method():
    with pytest.raises(ValueError, match="interval method must be one of"):
        ttt.check_method("bca")


def test_paired_log_ratio_by_hand():
    # a = [2, 4], ref = [1, 3], seed i in row i of both: means 3 and 2, point 1.5. The joint
    # covariance of (a, ref) is [[2, 2], [2, 2]]; g = (1/3, -1/2), so var(log ratio) =
    # g' S g / n = (2/9 - 4/6 + 2/4) / 2 = 1/36, with n - 1 = 1 degree of freedom.
    a, ref = np.array([[2.0], [4.0]]), np.array([[1.0], [3.0]])
    point, lo_p, hi_p = intervals.t_log_ratio_paired(a, ref, [1.0], 0.95)
    assert point == pytest.approx(1.5)
    assert (lo_p, hi_p) == pytest.approx((1.5 * math.exp(-T1 / 6), 1.5 * math.exp(T1 / 6)))
    # As independent samples the shared spread counts twice: var 1/9 + 1/4.
    _, ulo, uhi = intervals.t_log_ratio(a, ref, [1.0], 0.95)
    assert uhi / ulo > hi_p / lo_p
    with pytest.raises(ValueError, match="matched rows"):
        intervals.t_log_ratio_paired(a, np.ones((3, 1)), [1.0], 0.95)
    _, lo, hi = intervals.t_log_ratio_paired(a[:1], ref[:1], [1.0], 0.95)
    assert math.isnan(lo) and math.isnan(hi)

    # Seeds for a half-width: the paired per-seed variance is 2 * (1/36) = 1/18 at m - 1 df,
    # so at m seeds the half-width is 1.5 sinh(t_{m-1} sqrt(1 / (18 m))).
    def half(m):
        return 1.5 * math.sinh(stats.t.ppf(0.975, m - 1) * math.sqrt(1.0 / (18.0 * m)))

    assert half(2) == pytest.approx((hi_p - lo_p) / 2)
    assert half(10) > 0.25 >= half(11)
    assert intervals.seeds_for_half_width(a, ref, [1.0], 0.25, 0.95, paired=True) == 11
    unpaired = intervals.seeds_for_half_width(a, ref, [1.0], 0.25, 0.95)
    assert unpaired is None or unpaired > 11  # the shared spread counted twice


def test_paired_interval_covers_with_common_noise():
    # Two configurations sharing a seed effect (correlation ~0.7 of log N*), 5 seeds: the
    # paired interval covers the true ratio about 95% of the time and is narrower on
    # average than the independent-samples one.
    rng = np.random.default_rng(1)
    true_ratio, trials, hits, widths = 1.2, 600, 0, []
    for _ in range(trials):
        shared = 0.25 * rng.standard_normal(5)
        a = true_ratio * np.exp(shared + 0.15 * rng.standard_normal(5))
        r = np.exp(shared + 0.15 * rng.standard_normal(5))
        # The noise is the same in both, so the true ratio of means is true_ratio.
        p, lo, hi = intervals.t_log_ratio_paired(a[:, None], r[:, None], [1.0], 0.95)
        _, ulo, uhi = intervals.t_log_ratio(a[:, None], r[:, None], [1.0], 0.95)
        hits += lo <= true_ratio <= hi
        widths.append((math.log(hi / lo), math.log(uhi / ulo)))
    assert 0.92 <= hits / trials <= 0.985
    paired_w, unpaired_w = np.mean(widths, axis=0)
    assert paired_w < 0.8 * unpaired_w


def test_timing_rounds_add_their_spread_by_hand():
    # Seeds: a = [2, 4] against a spread-free ref, var(log) = 1/9 at 1 df (as above).
    # Step-time log ratios over 3 calibration rounds [0.1, -0.1, 0]: variance 0.01, over 3
    # rounds 0.01/3 at 2 df. Welch-Satterthwaite combines the two.
    a, ref = np.array([[2.0], [4.0]]), np.ones((3, 1))
    v_s, v_t = 1 / 9, 0.01 / 3
    var = v_s + v_t
    df = var**2 / (v_s**2 / 1 + v_t**2 / 2)
    half = stats.t.ppf(0.975, df) * math.sqrt(var)
    point, lo, hi = intervals.t_log_ratio(a, ref, [1.0], 0.95, timing=[0.1, -0.1, 0.0])
    assert point == pytest.approx(3.0)
    assert (lo, hi) == pytest.approx((3.0 * math.exp(-half), 3.0 * math.exp(half)))
    # One round: no spread to add, the seed interval alone.
    assert intervals.t_log_ratio(a, ref, [1.0], 0.95, timing=[0.3]) == pytest.approx(
        intervals.t_log_ratio(a, ref, [1.0], 0.95)
    )


def test_calibration_blocks_split_the_timing_into_noise_and_drift_by_hand():
    # log(step_a / step_ref) in 4 rounds, two blocks of 2: block means 0.2 and 0.6, the
    # squares within blocks sum to 4 x 0.01 = 0.04 over R - n_blocks = 2 df: 0.02, over
    # R = 4: 0.005. Drift tau^2 = 0.015 of each configuration: the mean over 2 blocks of a
    # difference of two carries 2 x 0.015 / 2.
    timing = intervals.Timing((0.1, 0.3, 0.5, 0.7), (0, 0, 1, 1), (0.015, 2.0))
    assert np.ravel(timing.parts()) == pytest.approx([0.005, 2, 0.015, 2])
    a, ref = np.array([[2.0], [4.0]]), np.ones((3, 1))
    parts = [(1 / 9, 1), (0.005, 2), (0.015, 2)]
    var = sum(v for v, _ in parts)
    half = stats.t.ppf(0.975, var**2 / sum(v**2 / d for v, d in parts)) * math.sqrt(var)
    _, lo, hi = intervals.t_log_ratio(a, ref, [1.0], 0.95, timing=timing)
    assert (lo, hi) == pytest.approx((3.0 * math.exp(-half), 3.0 * math.exp(half)))
    # One block, or blocks given without a drift: the rounds' spread as before (within
    # blocks when there are several).
    x = (0.1, 0.3, 0.5, 0.7)
    assert np.ravel(intervals.Timing(x).parts()) == pytest.approx([np.var(x, ddof=1) / 4, 3])
    assert np.ravel(intervals.Timing(x, (0, 0, 1, 1)).parts()) == pytest.approx([0.005, 2])


def test_block_drift_by_hand():
    # Log step seconds, 3 configurations x 4 rounds (2 blocks of 2), no noise within a
    # block: A's moves by 0.3 between the blocks, B's and C's not. Less each round's mean,
    # A's block means differ by 0.2, B's and C's by -0.1: variances over the 2 blocks
    # 0.02, 0.005, 0.005; their mean 0.01 is tau^2 (1 - 1/3): tau^2 = 0.015, at
    # (3 - 1)(2 - 1) = 2 df -- the sample variance of the moves [0.3, 0, 0], over 2.
    y = {"a": [0, 0, 0.3, 0.3], "b": [0, 0, 0, 0], "c": [0.5, 0.5, 0.5, 0.5]}
    rounds = {k: list(np.exp(v)) for k, v in y.items()}
    tau2, df = intervals.block_drift(rounds, [0, 0, 1, 1])
    assert [tau2, df] == pytest.approx([0.015, 2.0])
    assert np.var([0.3, 0, 0], ddof=1) / 2 == pytest.approx(tau2)
    # A configuration timed as another (the same series) counts once.
    assert intervals.block_drift({**rounds, "a2": rounds["a"]}, [0, 0, 1, 1]) == pytest.approx(
        (tau2, df)
    )
    # Block means that agree: noise within blocks only, tau^2 floored at 0.
    flat = {"a": list(np.exp([0, 0.1, 0.1, 0])), "b": rounds["b"], "c": rounds["c"]}
    assert intervals.block_drift(flat, [0, 0, 1, 1]) == pytest.approx((0.0, 2.0))
    # One block, or one configuration: nothing to estimate.
    assert intervals.block_drift(rounds, [0, 0, 0, 0]) is None
    assert intervals.block_drift({"a": rounds["a"]}, [0, 0, 1, 1]) is None


def test_matched_pair_needs_the_same_seeds_and_shape():
    def runs(prompts, group, rule, seeds):
        key = ttt.Configuration("grpo", prompts, group, rule)
        return [
            ttt.RunTarget(f"r{s}", key, s, 0.5, 100.0, 1.0, 100.0, 2.0, 100.0, 1.0) for s in seeds
        ]

    fixed, sqrt = runs(16, 8, "fixed", [0, 1, 2]), runs(16, 8, "sqrt", [2, 1, 0])
    assert ttt.matched_pair(fixed, sqrt)
    assert not ttt.matched_pair(fixed, runs(16, 8, "sqrt", [0, 1, 3]))  # other seeds
    assert not ttt.matched_pair(fixed, runs(8, 16, "sqrt", [0, 1, 2]))  # other shape
    assert not ttt.matched_pair(fixed, runs(16, 8, "sqrt", [None, 1, 2]))
