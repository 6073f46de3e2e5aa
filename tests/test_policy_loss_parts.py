"""The pieces of ``policy_loss.policy_loss``, each checked against numbers worked by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.algorithms import policy_loss as policy_loss_lib

CLIPS = {"clip_low": 0.2, "clip_high": 0.28}


def test_token_surrogate_clips_each_token_by_the_sign_of_its_advantage():
    # Ratios 1.5, 0.5, 1 in both rows; advantages +1 and -2 (one per sequence).
    logp = jnp.log(jnp.array([[1.5, 0.5, 1.0], [1.5, 0.5, 1.0]]))
    mask = jnp.ones((2, 3), bool)
    loss, clipped = policy_loss_lib.surrogate_per_token(
        logp, jnp.zeros((2, 3)), jnp.array([1.0, -2.0]), mask, surrogate="token", **CLIPS
    )
    # A > 0: max(-A r, -A clip(r, 0.8, 1.28)); r = 1.5 is capped at 1.28.
    # A < 0: r = 0.5 is raised to 0.8 (-(-2) * 0.8 = 1.6 > 1.0).
    np.testing.assert_allclose(loss, [[-1.28, -0.5, -1.0], [3.0, 1.6, 2.0]], rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[1, 0, 0], [0, 1, 0]])


def test_gspo_surrogate_repeats_each_sequences_loss_over_its_tokens():
    logp = jnp.array([[0.3, 0.1, 5.0], [0.5, 9.0, 9.0]])
    mask = jnp.array([[True, True, False], [True, False, False]])
    loss, clipped = policy_loss_lib.surrogate_per_token(
        logp, jnp.zeros((2, 3)), jnp.array([1.0, 2.0]), mask, surrogate="gspo", **CLIPS
    )
    # Row 0: s = exp(mean(0.3, 0.1)) = exp(0.2) = 1.2214 < 1.28, unclipped: -1.2214.
    # Row 1: s = exp(0.5) = 1.6487, capped at 1.28: -2 * 1.28 = -2.56. Padding is ignored.
    want = [[-math.exp(0.2)] * 3, [-2.56] * 3]
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    np.testing.assert_array_equal(clipped, [[0, 0, 0], [1, 1, 1]])


def test_surrogate_rejects_a_bad_setting():
    x = jnp.zeros((2, 3))
    mask = jnp.ones((2, 3), bool)
    with pytest.raises(ValueError, match="one advantage per sequence"):
        policy_loss_lib.surrogate_per_token(x, x, x, mask, surrogate="gspo", **CLIPS)
    with pytest.raises(ValueError, match="surrogate='dapo'"):
        policy_loss_lib.surrogate_per_token(x, x, x[:, 0], mask, surrogate="dapo", **CLIPS)


def test_weighted_sum_and_token_mean_part_skip_padding():
    mask = jnp.array([[True, True, False]])
    x = jnp.array([[1.0, 3.0, 100.0]])
    w = jnp.array([[0.5, 0.25, 9.0]])
    assert float(policy_loss_lib.weighted_sum(x, w, mask)) == pytest.approx(1.25)
    # A share of the full batch's token mean: 4 / 8 real tokens of the full batch.
    assert float(policy_loss_lib.token_mean_part(x, mask, jnp.float32(8.0))) == pytest.approx(0.5)
    # Metrics are not differentiated.
    grad = jax.grad(lambda x: policy_loss_lib.token_mean_part(x, mask, jnp.float32(8.0)))(x)
    np.testing.assert_array_equal(grad, np.zeros((1, 3)))


def test_kl_terms_with_and_without_a_reference():
    logp = jnp.zeros((1, 2))
    mask = jnp.ones((1, 2), bool)
    w = jnp.full((1, 2), 0.5)
    n = jnp.float32(2.0)
    kl_loss, sums = policy_loss_lib.kl_terms(logp, logp, None, w, mask, n)
    assert kl_loss is None and sums.keys() == {"kl_old", "kl"}
    assert float(sums["kl"]) == float(sums["kl_old"]) == 0.0
    # k3 at d = log 2 - 0: e^d - d - 1 = 2 - log 2 - 1 = 0.30685; 0 at the second token.
    ref = jnp.array([[math.log(2.0), 0.0]])
    kl_loss, sums = policy_loss_lib.kl_terms(logp, logp, ref, w, mask, n)
    k3 = 1.0 - math.log(2.0)
    assert float(kl_loss) == pytest.approx(0.5 * k3, rel=1e-6)
    assert float(sums["kl_loss"]) == float(kl_loss)
    assert float(sums["kl"]) == pytest.approx(k3 / 2, rel=1e-6)
    assert float(sums["kl_old"]) == 0.0


def test_ratio_metrics_leave_out_padding():
    logp = jnp.array([[math.log(2.0), math.log(0.5), 30.0]])
    mask = jnp.array([[True, True, False]])
    sums, maxes = policy_loss_lib.ratio_metrics(logp, jnp.zeros((1, 3)), mask, jnp.float32(2.0))
    assert float(sums["ratio_mean"]) == pytest.approx(1.25, rel=1e-6)  # (2 + 0.5) / 2
    assert float(maxes["ratio_max"]) == pytest.approx(2.0, rel=1e-6)  # not exp(20)


def test_own_gradient_scale():
    # 3 real tokens in 2 real sequences (the third row is padding).
    mask = jnp.array([[True, True, False], [True, False, False], [False, False, False]])
    scale = policy_loss_lib.own_gradient_scale(mask, "token_mean", jnp.float32(12.0), 6)
    assert float(scale) == 4.0  # 12 full-batch tokens / 3
    for agg in ("seq_mean_token_mean", "seq_mean_token_sum_norm"):
        assert float(policy_loss_lib.own_gradient_scale(mask, agg, jnp.float32(12.0), 6)) == 3.0
