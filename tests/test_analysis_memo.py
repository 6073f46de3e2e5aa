"""Functions of arrays remembered by content (`memo.by_content`): a hit returns exactly
what the function computes, and any change to the numbers is a miss."""

import numpy as np
from scipy import stats

from rl_batch.analysis import intervals, memo


def _counted(max_bytes=1 << 20):
    calls = []

    @memo.by_content(max_bytes)
    def total(x, label=None):
        calls.append(label)
        return float(x.sum()), x.shape, label

    return total, calls


def test_a_hit_needs_the_same_numbers_shape_dtype_and_plain_arguments():
    total, calls = _counted()
    x = np.arange(6, dtype=np.float64)
    assert total(x, "a") == (15.0, (6,), "a")
    assert total(x.copy(), "a") == (15.0, (6,), "a") and len(calls) == 1  # new object, hit
    assert total(x.reshape(2, 3), "a")[1] == (2, 3)  # same bytes, other shape
    assert total(x.astype(np.float32), "a")[0] == 15.0  # other dtype
    assert total(x, "b")[2] == "b"  # other plain argument
    assert total(x, 1)[2] == 1 and total(x, True)[2] is True  # 1 and True are two keys
    assert len(calls) == 6
    zero, negative = np.zeros(1), np.array([-0.0])  # equal numbers, other bits: two keys
    total(zero), total(negative)
    assert len(calls) == 8


def test_an_array_changed_in_place_is_a_new_key():
    total, calls = _counted()
    x = np.ones(4)
    assert total(x)[0] == 4.0
    x[0] = 5.0
    assert total(x)[0] == 8.0 and len(calls) == 2
    x[0] = 1.0
    assert total(x)[0] == 4.0 and len(calls) == 2  # the first numbers again: a hit


def test_other_arguments_are_computed_uncached():
    calls = []

    @memo.by_content(1 << 20)
    def shape(x, extra=None):
        calls.append(1)
        return x.shape

    others = [
        (np.asfortranarray(np.ones((2, 3))),),  # not C-ordered
        (np.ones(4)[::2],),  # a strided view
        (np.array(["a", "b"]),),  # not numeric
        (np.ones(3), 0.5),  # a float argument (0.0 and -0.0 would share a key)
        (np.ones(3), [1]),  # unhashable
    ]
    for args in others * 2:
        shape(*args)
    assert len(calls) == 2 * len(others) and shape.cache_info()["entries"] == 0


def test_the_cache_is_bounded_by_bytes_least_recently_used_first():
    total, calls = _counted(max_bytes=3 * (memo._ENTRY_OVERHEAD + 800))
    xs = [np.full(100, float(i)) for i in range(4)]  # 800 bytes each
    for x in xs[:3]:
        total(x)
    total(xs[0])  # used again: the oldest is now xs[1]
    total(xs[3])  # evicts xs[1]
    info = total.cache_info()
    assert info["entries"] == 3 and info["bytes"] <= 3 * (memo._ENTRY_OVERHEAD + 800)
    n = len(calls)
    total(xs[0]), total(xs[2]), total(xs[3])
    assert len(calls) == n
    total(xs[1])
    assert len(calls) == n + 1
    total(np.zeros(1000))  # larger than the whole cache: computed, never kept
    assert total.cache_info()["entries"] == 3


def test_remembered_intervals_follow_their_inputs():
    rng = np.random.default_rng(3)
    a, ref = rng.lognormal(5, 0.3, (6, 2)), rng.lognormal(5, 0.3, (6, 2))
    w = [1.0, -1.0]
    paired = intervals.t_log_ratio_paired(a, ref, w, 0.95)
    welch = intervals.t_log_ratio(a, ref, w, 0.95)
    assert intervals.t_log_ratio_paired(a.copy(), ref.copy(), w, 0.95) == paired  # a hit
    # Changed numbers (in place, or a row of another run) never return the old interval.
    b = a.copy()
    intervals.t_log_ratio_paired(b, ref, w, 0.95)
    b[0, 0] *= 3.0
    moved = intervals.t_log_ratio_paired(b, ref, w, 0.95)
    assert moved != paired
    assert moved[0] == intervals._paired_parts.__wrapped__(b, ref, np.array(w))[0]
    c = a.copy()
    c[:, 1] = a[::-1, 1]  # the same numbers per column, in other rows
    assert intervals.t_log_ratio(c, ref, w, 0.95) != welch  # N* and q of a run go together
    assert intervals.t_log_ratio_paired(c, ref, w, 0.95) != paired
    # A remembered variance is the one computed afresh, to the bit.
    var = intervals._log_mean_var(np.concatenate([a, ref], axis=1), np.array([1, -1, -1, 1.0]))
    direct = intervals._log_mean_var.__wrapped__(
        np.concatenate([a, ref], axis=1), np.array([1, -1, -1, 1.0])
    )
    assert var == direct


def test_t_quantile_is_scipy_s_ppf_exactly():
    for df in [1, 2, 3.5, 11, 17.25, 40, 1e3, 1e7]:
        for level in [0.5, 0.9, 0.95, 0.99, 1 - 0.05 / 3]:
            assert intervals.t_quantile(df, level) == float(stats.t.ppf(0.5 + level / 2, df))
    assert np.isnan(intervals.t_quantile(0.0, 0.95))  # outside the domain: scipy's answer
