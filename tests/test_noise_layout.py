"""The whole-group micro-batch layout measures the batch noise scale B_noise.

Synthetic per-response gradients ``g_pj = mu + a_p + e_pj`` with isotropic covariances,
so every term is known by hand: D = 16, mu = 0.5 in every coordinate (|G|^2 = 16 x 0.25
= 4), prompt effects a_p ~ N(0, 1) per coordinate (tr(Sigma_inter) = 16) and response
effects e_pj ~ N(0, 4) per coordinate (tr(Sigma_intra) = 64). With G = 8:

    B_noise = (G tr_inter + tr_intra) / |G|^2 = (8 x 16 + 64) / 4 = 48 responses,

at every P. The strided layout with M = 2 puts G / 2 = 4 members of every prompt in each
micro-batch, so the prompt term cancels from its trace and stays in its |G|^2:

    B_simple(strided) = tr_intra / (|G|^2 + tr_inter / P) = 64 / (4 + 16 / P)
                      = 5.33, 8, 10.67, 12.8 at P = 2, 4, 8, 16,

intra-prompt noise only, growing with P (the number issue 47 found in the default study).
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch import gradient_noise
from rl_batch.algorithms import noise_statistics as noise_lib
from rl_batch.algorithms import update_step

G, D = 8, 16
G2, TR_INTER, TR_INTRA = 4.0, 16.0, 64.0
B_NOISE = (G * TR_INTER + TR_INTRA) / G2  # = 48


class _Rows(NamedTuple):
    x: jax.Array  # [B, D] each response's gradient
    response_mask: jax.Array  # [B, 1]


def _linear_loss(params_d, micro, num_seqs):
    """Sum over real rows of <params, x_r> / num_seqs: each response's gradient is x_r,
    the batch gradient their mean; own scale B / b."""
    real_b = micro.response_mask[:, 0].astype(jnp.float32)
    loss = jnp.sum(real_b * (micro.x @ params_d)) / num_seqs
    own = num_seqs / jnp.maximum(jnp.sum(real_b), 1.0)
    return loss, ({"loss": loss}, {}, own)


def _stats(x_sbd, micro_batches, layout, pair_dot="direct"):
    """accumulate_gradients' metrics for each step s (every row real)."""
    params = jnp.zeros(x_sbd.shape[-1])
    mask_b = jnp.ones((x_sbd.shape[1], 1), bool)

    def one(x_bd):
        batch = _Rows(x=x_bd, response_mask=mask_b)
        loss_fn = functools.partial(_linear_loss, num_seqs=jnp.float32(x_bd.shape[0]))
        _, _, metrics = update_step.accumulate_gradients(
            loss_fn, params, batch, micro_batches, group_size=G, layout=layout, pair_dot=pair_dot
        )
        return metrics

    out = jax.jit(jax.vmap(one))(jnp.asarray(x_sbd, jnp.float32))
    return jax.tree.map(np.asarray, out)


def _synthetic(steps, prompts, seed):
    """[S, P * G, D] gradients mu + a_p + e_pj with the module docstring's terms."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(steps, prompts, 1, D)) * np.sqrt(TR_INTER / D)
    e = rng.normal(size=(steps, prompts, G, D)) * np.sqrt(TR_INTRA / D)
    return (np.sqrt(G2 / D) + a + e).reshape(steps, prompts * G, D)


def _pooled(st):
    """B_simple pooled over the steps and its two-sided 95 % Fieller interval."""
    g2, trace = gradient_noise.noise_scale_terms(
        st["grad_sq_micro"], st["grad_sq_full"], st["gns_batch_micro"], st["gns_batch_full"]
    )
    return gradient_noise.pooled_ratio_interval(trace, g2, 1.96)


def test_whole_group_order_by_hand():
    # P = 4 x G = 2, M = 2: micro-batch 0 holds groups 0, 1 (rows 0-3), 1 groups 2, 3.
    pieces = noise_lib.whole_group_order(4, 2, 2).reshape(-1, 2).T  # [M, rows]
    np.testing.assert_array_equal(pieces, [[0, 1, 2, 3], [4, 5, 6, 7]])
    # P = 2 x G = 4, M = 4: each group is two consecutive micro-batches (units of r = 2).
    pieces = noise_lib.whole_group_order(2, 4, 4).reshape(-1, 4).T
    np.testing.assert_array_equal(pieces, [[0, 1], [2, 3], [4, 5], [6, 7]])
    assert noise_lib.whole_group_units(2, 4) == 2 and noise_lib.whole_group_units(4, 2) == 1
    with pytest.raises(ValueError, match="micro_layout='strided'"):
        noise_lib.whole_group_order(6, 2, 4)


@pytest.mark.parametrize("prompts, micro_batches", [(2, 2), (4, 2), (8, 2), (16, 2), (2, 4)])
@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_whole_groups_recover_b_noise_within_the_interval(prompts, micro_batches):
    steps = 4000
    x = _synthetic(steps, prompts, seed=prompts + micro_batches)
    est, lo, hi = _pooled(_stats(x, micro_batches, "groups"))
    assert lo <= B_NOISE <= hi, (est, lo, hi)
    assert hi / lo < 1.6  # an interval that can tell 48 from the strided number
    # The strided layout measures the intra-prompt term, growing with P (docstring).
    if micro_batches == 2:
        s_est, s_lo, s_hi = _pooled(_stats(x, micro_batches, "strided"))
        strided = TR_INTRA / (G2 + TR_INTER / prompts)  # 5.33, 8, 10.67, 12.8
        assert s_lo <= strided <= s_hi, (s_est, s_lo, s_hi, strided)
        assert s_hi < lo


def test_the_layouts_give_the_same_gradient():
    x = _synthetic(3, 4, seed=0)
    params = jnp.zeros(D)
    mask = jnp.ones((x.shape[1], 1), bool)
    batch = _Rows(x=jnp.asarray(x[0], jnp.float32), response_mask=mask)
    loss_fn = functools.partial(_linear_loss, num_seqs=jnp.float32(x.shape[1]))
    grads = [
        update_step.accumulate_gradients(loss_fn, params, batch, 4, group_size=G, layout=lay)[0]
        for lay in ("strided", "groups", "pairs")
    ]
    want = x[0].mean(axis=0)
    for g in grads:
        np.testing.assert_allclose(np.asarray(g), want, rtol=1e-5, atol=1e-6)


def test_direct_pair_product_has_the_lower_spread():
    # Half-group pairs, P = 16, M = 8: the running-sum estimate of <g_2k, g_2k+1> adds a
    # mean-zero term; the direct one does not. Same mean, smaller per-update spread.
    x = _synthetic(3000, 16, seed=5)
    direct = _stats(x, 8, "pairs", "direct")["grad_dot_pair"]
    running = _stats(x, 8, "pairs", "running")["grad_dot_pair"]
    # E = |G|^2 + tr_inter / n with n = 16 / 4 = 4 prompts per pair: 4 + 16 / 4 = 8.
    for v in (direct, running):
        assert abs(v.mean() - 8.0) < 4 * v.std() / np.sqrt(len(v))
    assert running.std() > 1.3 * direct.std(), (running.std(), direct.std())


def test_fieller_interval_by_hand():
    # num = [1, 3], den = [1, 1], z = 1: means 2 and 1, var(num) = 2, the rest 0, n = 2:
    # (2 - R)^2 <= 1 x 2 / 2 -> R in [1, 3].
    est, lo, hi = gradient_noise.pooled_ratio_interval([1.0, 3.0], [1.0, 1.0], 1.0)
    assert (est, lo, hi) == pytest.approx((2.0, 1.0, 3.0))
    # num = [4, 4], den = [1, -1]: mean |G|^2 = 0 (no estimate, not infinity); var(den) =
    # 2: 16 <= R^2 x 2 / 2 -> R >= 4: a lower end, no upper end.
    est, lo, hi = gradient_noise.pooled_ratio_interval([4.0, 4.0], [1.0, -1.0], 1.0)
    assert np.isnan(est) and lo == pytest.approx(4.0) and hi == np.inf
    # A trace far below 0: no R >= 0 is consistent.
    assert gradient_noise.pooled_ratio_interval([-9.0, -11.0], [1.0, 1.0], 1.0)[1:] == (0, 0)
