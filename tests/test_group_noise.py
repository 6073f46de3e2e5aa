"""The inter-/intra-prompt split of the gradient noise (GRPO groups): the half-group
layout, the learner's statistics against a direct computation, and recovery of known
covariances from synthetic per-response gradients ``g_pj = mu + a_p + e_pj``."""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch import gradient_noise
from rl_batch.algorithms import noise_statistics as noise_lib
from rl_batch.algorithms import update_step
from rl_batch.analysis import noise_scale as ns


def test_group_pair_order_layout_by_hand():
    # P = 4 prompts x G = 4, M = 4 micro-batches (2 pairs). Pair 0 holds prompts 0, 2,
    # pair 1 prompts 1, 3; micro-batch 2k takes members 0, 1, micro-batch 2k + 1 members 2, 3.
    order = noise_lib.group_pair_order(4, 4, 4)
    pieces = order.reshape(-1, 4).T  # [M, rows]: micro-batch m, row i = order[i * M + m]
    np.testing.assert_array_equal(pieces[0], [0, 1, 8, 9])
    np.testing.assert_array_equal(pieces[1], [2, 3, 10, 11])
    np.testing.assert_array_equal(pieces[2], [4, 5, 12, 13])
    np.testing.assert_array_equal(pieces[3], [6, 7, 14, 15])
    assert sorted(order.tolist()) == list(range(16))


@pytest.mark.parametrize(
    "p, g, m, match",
    [(4, 4, 2, "micro_batches >= 4"), (4, 3, 4, "even group_size"), (3, 4, 4, "divisible")],
)
def test_group_pair_order_rejects_bad_layouts(p, g, m, match):
    with pytest.raises(ValueError, match=match):
        noise_lib.group_pair_order(p, g, m)


class _Rows(NamedTuple):
    x: jax.Array  # [B, D] each response's gradient
    response_mask: jax.Array  # [B, 1]


def _linear_loss(params_d, micro, num_seqs):
    """Sum over real rows of <params, x_r> / num_seqs (the batch's real rows): each
    response's gradient is x_r, the batch gradient their mean; own scale B / b."""
    real_b = micro.response_mask[:, 0].astype(jnp.float32)
    loss = jnp.sum(real_b * (micro.x @ params_d)) / num_seqs
    own = num_seqs / jnp.maximum(jnp.sum(real_b), 1.0)
    return loss, ({"loss": loss}, {}, own)


def _learner_stats(x_sbd, mask_sb, group_size, micro_batches, pair_dot="direct"):
    """accumulate_gradients' half-group-pair metrics for each step s of per-response
    gradients x."""
    params = jnp.zeros(x_sbd.shape[-1])

    def one(x_bd, mask_b):
        num_seqs = jnp.maximum(jnp.sum(mask_b.astype(jnp.float32)), 1.0)
        batch = _Rows(x=x_bd, response_mask=mask_b[:, None])
        loss_fn = functools.partial(_linear_loss, num_seqs=num_seqs)
        _, _, metrics = update_step.accumulate_gradients(
            loss_fn,
            params,
            batch,
            micro_batches,
            group_size=group_size,
            layout="pairs",
            pair_dot=pair_dot,
        )
        return metrics

    return jax.jit(jax.vmap(one))(jnp.asarray(x_sbd, jnp.float32), jnp.asarray(mask_sb))


def test_learner_statistics_match_a_direct_computation():
    # P = 8, G = 4, M = 4; prompts 1 and 6 dropped (padding): pair 0 holds prompts 0, 2,
    # 4, 6 (3 real), pair 1 prompts 1, 3, 5, 7 (3 real).
    p, g, m, d = 8, 4, 4, 5
    rng = np.random.default_rng(1)
    x_bd = rng.normal(size=(p * g, d)) + 0.5
    keep_p = np.ones(p, bool)
    keep_p[[1, 6]] = False
    mask_b = np.repeat(keep_p, g)
    got = jax.tree.map(lambda v: float(v[0]), _learner_stats(x_bd[None], mask_b[None], g, m))
    running = _learner_stats(x_bd[None], mask_b[None], g, m, pair_dot="running")
    running = jax.tree.map(lambda v: float(v[0]), running)
    # Direct: each half's own mean gradient over its real rows.
    order = noise_lib.group_pair_order(p, g, m)
    pieces = order.reshape(-1, m).T  # [M, rows]
    half = [x_bd[r][mask_b[r]].mean(axis=0) for r in pieces]
    assert got["grad_sq_micro"] == pytest.approx(np.mean([h @ h for h in half]), rel=1e-5)
    # The direct estimate is the mean of <g_2k, g_2k+1> itself.
    direct = np.mean([half[0] @ half[1], half[2] @ half[3]])
    assert got["grad_dot_pair"] == pytest.approx(direct, rel=1e-5)
    # The running-sum estimate differs from <g_2k, g_2k+1> by a mean-zero term;
    # reproduce it exactly: own_2k (<g_2k+1, acc_<=2k> - <g_2k, acc_<2k>).
    real = mask_b.sum()
    grads = [x_bd[r][mask_b[r]].sum(axis=0) / real for r in pieces]  # full-normalised
    own = [real / mask_b[r].sum() for r in pieces]
    acc = np.cumsum([np.zeros(d)] + grads, axis=0)  # acc[m] = sum of grads before m
    cross = [
        own[2 * k] * (half[2 * k + 1] @ acc[2 * k + 1] - half[2 * k] @ acc[2 * k]) for k in range(2)
    ]
    assert running["grad_dot_pair"] == pytest.approx(np.mean(cross), rel=1e-5)
    # ... which is <g_2k, g_2k+1> plus own_2k <g_2k+1 - g_2k, acc_<2k> (0 for pair 0).
    assert cross[0] == pytest.approx(half[0] @ half[1], rel=1e-9)
    assert got["gns_prompts_pair"] == pytest.approx(3.0)
    assert got["gns_prompts_full"] == pytest.approx(6.0)
    assert got["gns_batch_micro"] == pytest.approx(6.0)  # 3 prompts x G / 2 each
    assert got["gns_batch_full"] == pytest.approx(24.0)
    full = x_bd[mask_b].mean(axis=0)
    assert got["grad_sq_full"] == pytest.approx(full @ full, rel=1e-5)


def test_group_noise_terms_invert_hand_worked_expectations():
    # |G|^2 = 2, tr(Sigma_inter) = 40, tr(Sigma_intra) = 96; P = 16, G = 8, M = 4:
    # pairs of n = 8 prompts, halves of b = 32 responses, B = 128.
    # sq_half = 2 + 40/8 + 96/32 = 10; dot = 2 + 40/8 = 7; sq_full = 2 + 40/16 + 96/128 = 5.25.
    g2, inter, intra = ns.group_noise_terms(10.0, 7.0, 5.25, 32, 8, 128, 16)
    assert (g2, inter, intra) == pytest.approx((2.0, 40.0, 96.0))
    # B_simple from the same micro-batches mixes the two: trace 96 + 40 * 8 * 2 / 6.
    _, trace = gradient_noise.noise_scale_terms(10.0, 5.25, 32, 128)
    assert trace == pytest.approx(96.0 + 40.0 * 8 * 2 / 6)


def _synthetic(steps, p, g, d, inter_scale, intra_scale, seed=0):
    """[S, P * G, D] gradients mu + a_p + e_pj and the true (|mu|^2, tr inter, tr intra)."""
    rng = np.random.default_rng(seed)
    mu_d = rng.normal(size=d) * 0.4
    l_a = rng.normal(size=(d, d)) * inter_scale / np.sqrt(d)  # Cov a = l_a l_a^T
    l_e = rng.normal(size=(d, d)) * intra_scale / np.sqrt(d)
    a_spd = rng.normal(size=(steps, p, 1, d)) @ l_a.T
    e_spgd = rng.normal(size=(steps, p, g, d)) @ l_e.T
    x = (mu_d + a_spd + e_spgd).reshape(steps, p * g, d)
    return x, (mu_d @ mu_d, np.trace(l_a @ l_a.T), np.trace(l_e @ l_e.T))


@pytest.mark.parametrize("micro_batches", [4, 8])
def test_recovers_known_inter_and_intra_traces(micro_batches):
    p, g, d, steps = 16, 8, 12, 6000
    # Prompt effects 3x the within-group ones (in trace): swapping them fails.
    x, (g2_true, inter_true, intra_true) = _synthetic(steps, p, g, d, 1.0, 0.6)
    assert inter_true > 2 * intra_true
    mask = np.ones(x.shape[:2], bool)
    st = jax.tree.map(np.asarray, _learner_stats(x, mask, g, micro_batches))
    g2, inter, intra = ns.group_noise_terms(
        st["grad_sq_micro"],
        st["grad_dot_pair"],
        st["grad_sq_full"],
        st["gns_batch_micro"],
        st["gns_prompts_pair"],
        st["gns_batch_full"],
        st["gns_prompts_full"],
    )
    # Sampling tolerance: 4 standard errors of the mean over the steps.
    for est, true in ((g2, g2_true), (inter, inter_true), (intra, intra_true)):
        se = est.std() / np.sqrt(steps)
        assert abs(est.mean() - true) < 4 * se, (est.mean(), true, se)
        assert 4 * se < 0.15 * true  # the test can tell the terms apart
    # Swapped, the estimates miss by far more than their tolerance.
    assert abs(inter.mean() - intra_true) > 10 * inter.std() / np.sqrt(steps)
    assert abs(intra.mean() - inter_true) > 10 * intra.std() / np.sqrt(steps)
