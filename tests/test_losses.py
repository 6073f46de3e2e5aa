"""Hand-worked numbers for every function in rl_batch.algorithms.losses."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.algorithms import losses


def close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)


# --------------------------------------------------------------------------- advantages

REWARDS_PG = jnp.array([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])


def test_grpo_advantages_unbiased_std():
    # Row 0: mean = 0.25; unbiased var = (0.75^2 + 3 * 0.25^2) / 3 = 0.75 / 3 = 0.25,
    # std = 0.5 -> (r - 0.25) / (0.5 + 1e-6) = [1.5, -0.5, -0.5, -0.5] (to 2e-6).
    # Row 1: all equal -> exactly 0.
    adv = losses.grpo_advantages(REWARDS_PG)
    close(adv[0], [0.75 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001, -0.25 / 0.500001])
    assert np.all(np.asarray(adv[1]) == 0.0)


def test_grpo_advantages_population_std():
    # Population var = 0.75 / 4 = 0.1875, std = sqrt(3)/4 = 0.4330127
    # -> 0.75 / 0.4330127 = sqrt(3) = 1.7320508, -0.25 / 0.4330127 = -0.5773503.
    adv = losses.grpo_advantages(REWARDS_PG, std_ddof=0, eps=0.0)
    close(adv[0], [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])


@pytest.mark.parametrize("ddof", [0, 1])
@pytest.mark.parametrize("g", [2, 3, 8, 16, 32, 64])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.2, 0.1, -0.7, 100.1, 1e6 + 0.3])
@pytest.mark.slow  # 8 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_grpo_advantages_equal_groups_are_exactly_zero(value, g, ddof):
    # fp32 means of equal values leave a residue (sixteen 0.2s: mean != 0.2), which
    # (r - mean) / (std + eps) used to blow up to -0.03 (-0.96 for 32 x 100.1, ddof 0).
    rewards_pg = jnp.stack([jnp.full((g,), value, jnp.float32), jnp.arange(g, dtype=jnp.float32)])
    adv = np.asarray(losses.grpo_advantages(rewards_pg, std_ddof=ddof))
    assert np.all(adv[0] == 0.0), adv[0]
    assert np.all(np.isfinite(adv[1])) and abs(adv[1].sum()) < 1e-3  # other rows unchanged
    grouped = losses.group_advantages(rewards_pg[:1], "grpo", std_ddof=ddof)
    assert np.all(np.asarray(grouped) == 0.0)


def test_drgrpo_and_rloo():
    # Dr.GRPO: r - mean = [0.75, -0.25, -0.25, -0.25].
    close(losses.drgrpo_advantages(REWARDS_PG)[0], [0.75, -0.25, -0.25, -0.25])
    # RLOO: r_i - mean of the other three: 1 - 0 = 1; 0 - 1/3 = -1/3 (= 4/3 * Dr.GRPO).
    close(losses.rloo_advantages(REWARDS_PG)[0], [1.0, -1 / 3, -1 / 3, -1 / 3])
    close(losses.rloo_advantages(REWARDS_PG)[1], [0.0, 0.0, 0.0, 0.0])
    close(losses.group_advantages(REWARDS_PG, "rloo"), losses.rloo_advantages(REWARDS_PG))


def test_advantage_errors():
    with pytest.raises(ValueError, match="unknown advantage mode 'ppo'"):
        losses.group_advantages(REWARDS_PG, "ppo")
    with pytest.raises(ValueError, match="G >= 2"):
        losses.rloo_advantages(jnp.ones((3, 1)))
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        losses.grpo_advantages(jnp.ones((3,)))


# ------------------------------------------------------------------------- policy loss


def test_clipped_policy_loss_asymmetric():
    # ratios 1.5, 0.5, 1.1 with A = +1, and 1.5, 0.5, 0.9 with A = -1; clip [0.8, 1.28].
    # A=+1: r=1.5: max(-1.5, -1.28) = -1.28 clipped; r=0.5: max(-0.5, -0.8) = -0.5;
    #       r=1.1: -1.1 (inside the range).
    # A=-1: r=1.5: max(1.5, 1.28) = 1.5 (not clipped: pessimistic branch is unclipped);
    #       r=0.5: max(0.5, 0.8) = 0.8 clipped; r=0.9: 0.9.
    ratios = jnp.array([[1.5, 0.5, 1.1], [1.5, 0.5, 0.9]])
    adv = jnp.array([[1.0], [-1.0]])
    old = jnp.full(ratios.shape, -2.0)
    loss, clipped = losses.clipped_policy_loss(
        old + jnp.log(ratios), old, adv, clip_low=0.2, clip_high=0.28
    )
    close(loss, [[-1.28, -0.5, -1.1], [1.5, 0.8, 0.9]])
    close(clipped, [[1, 0, 0], [0, 1, 0]])
    # Gradient wrt logp is -A * ratio where unclipped, 0 where clipped:
    # [[0, -0.5, -1.1], [1.5, 0, 0.9]].
    grad = jax.grad(
        lambda lp: jnp.sum(losses.clipped_policy_loss(lp, old, adv, clip_high=0.28)[0])
    )(old + jnp.log(ratios))
    close(grad, [[0.0, -0.5, -1.1], [1.5, 0.0, 0.9]])


def test_dual_clip():
    # A = -1, r = 5: max(5, 1.28) = 5, dual cap min(5, -A * 3) = 3 (clipped);
    # r = 1.5: 1.5 < 3 unchanged; A = +1, r = 5: -1.28 (ordinary clip, dual ignores A > 0).
    ratios = jnp.array([[5.0, 1.5, 5.0]])
    adv = jnp.array([[-1.0, -1.0, 1.0]])
    old = jnp.zeros(ratios.shape)
    loss, clipped = losses.clipped_policy_loss(jnp.log(ratios), old, adv, dual_clip=3.0)
    close(loss, [[3.0, 1.5, -1.28]])
    close(clipped, [[1, 0, 1]])
    # Without the dual clip the first token's loss is the raw 5.
    loss, _ = losses.clipped_policy_loss(jnp.log(ratios), old, adv)
    close(loss, [[5.0, 1.5, -1.28]])


# --------------------------------------------------------------------------------- KL


def test_kl_estimators():
    # p = 0.5, ref = 0.25: k1 = ln 2 = 0.693147; k2 = 0.5 ln(2)^2 = 0.240227;
    # k3: d = ln(0.25 / 0.5) = -ln 2, exp(d) - d - 1 = 0.5 + 0.693147 - 1 = 0.193147.
    # Identical policies: all three are 0.
    logp = jnp.log(jnp.array([0.5, 0.3]))
    ref = jnp.log(jnp.array([0.25, 0.3]))
    close(losses.kl_k1(logp, ref), [math.log(2), 0.0])
    close(losses.kl_k2(logp, ref), [0.5 * math.log(2) ** 2, 0.0])
    close(losses.kl_k3(logp, ref), [0.5 + math.log(2) - 1, 0.0])
    close(losses.kl_estimate(logp, ref, "k3"), losses.kl_k3(logp, ref))
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        losses.kl_estimate(logp, ref, "k4")


# ------------------------------------------------------------------------ aggregation

LOSS_BT = jnp.array([[1.0, 2.0, 3.0, 100.0], [5.0, 6.0, 100.0, 100.0]])
MASK_BT = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)


def test_aggregation_modes():
    # token_mean: (1 + 2 + 3 + 5 + 6) / 5 = 17 / 5 = 3.4 (the 100s are padding).
    close(losses.aggregate(LOSS_BT, MASK_BT, "token_mean"), 3.4)
    # seq_mean_token_mean: (6 / 3 + 11 / 2) / 2 = (2 + 5.5) / 2 = 3.75.
    close(losses.aggregate(LOSS_BT, MASK_BT, "seq_mean_token_mean"), 3.75)
    # seq_mean_token_sum_norm, max_len = T = 4: (6 / 4 + 11 / 4) / 2 = 17 / 8 = 2.125;
    # with max_len = 8: 17 / 16 = 1.0625.
    close(losses.aggregate(LOSS_BT, MASK_BT, "seq_mean_token_sum_norm"), 2.125)
    close(losses.aggregate(LOSS_BT, MASK_BT, "seq_mean_token_sum_norm", max_len=8), 1.0625)
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'"):
        losses.aggregate(LOSS_BT, MASK_BT, "sum")


@pytest.mark.parametrize("mode", losses.LOSS_AGG_MODES)
def test_aggregation_splits_with_global_normalisers(mode):
    # Row-wise split with the full batch's normalisers adds up to the full aggregate:
    # token_mean: 6/5 + 11/5 = 3.4; seq_mean_token_mean: 2/2 + 5.5/2 = 3.75.
    full = losses.aggregate(LOSS_BT, MASK_BT, mode)
    kw = dict(num_tokens=5.0, num_seqs=2, max_len=4)
    parts = [losses.aggregate(LOSS_BT[i : i + 1], MASK_BT[i : i + 1], mode, **kw) for i in (0, 1)]
    close(parts[0] + parts[1], full)


def test_nan_padding_does_not_leak():
    loss = LOSS_BT.at[1, 3].set(jnp.nan)
    close(losses.aggregate(loss, MASK_BT, "token_mean"), 3.4)


def test_masked_whiten():
    # x = [1, 2, 3], mean 2, population var 2/3, std 0.8164966 -> [-1.2247449, 0, 1.2247449].
    x = jnp.array([1.0, 2.0, 3.0, 100.0])
    m = jnp.array([1, 1, 1, 0], bool)
    close(losses.masked_whiten(x, m), [-1.2247449, 0.0, 1.2247449, 0.0])
    close(losses.masked_whiten(x, m, shift_mean=False), [0.7752551, 2.0, 3.2247449, 0.0])
    close(losses.masked_mean(x, m), 2.0)


# ---------------------------------------------------------------------------- entropy


def test_entropy():
    # logits [0, 0] -> ln 2 = 0.693147; [0, ln 3] -> p = [1/4, 3/4],
    # H = 0.25 ln 4 + 0.75 ln(4/3) = 0.346574 + 0.215762 = 0.562335. Mean = 0.627741.
    logits = jnp.array([[[0.0, 0.0], [0.0, math.log(3)], [50.0, -50.0]]])
    close(losses.token_entropy(logits)[0, :2], [math.log(2), 0.562335])
    close(losses.entropy_from_logits(logits, jnp.array([[1, 1, 0]], bool)), 0.627741)


# -------------------------------------------------------------------------------- PPO


def test_last_token_index_and_token_rewards():
    mask = jnp.array([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]], bool)
    close(losses.last_token_index(mask), [1, 0, 2])
    rewards = losses.token_level_rewards(jnp.array([2.0, 5.0, -1.0]), mask)
    # Score at the last real token; the empty row gets nothing.
    close(rewards, [[0, 2, 0, 0], [0, 0, 0, 0], [0, 0, -1, 0]])
    # KL penalty 0.5 * [0.1, 0.2, 0.3, 5] on real tokens of row [1, 1, 1, 0] with score 1:
    # [-0.05, -0.1, 1 - 0.15, 0] = [-0.05, -0.1, 0.85, 0].
    rewards = losses.token_level_rewards(
        jnp.array([1.0]),
        jnp.array([[1, 1, 1, 0]], bool),
        kl_br=jnp.array([[0.1, 0.2, 0.3, 5.0]]),
        kl_coef=0.5,
    )
    close(rewards, [[-0.05, -0.1, 0.85, 0.0]])


def test_gae_gamma_lambda_one():
    # Rewards [0, 0, 1, pad], values [0.5, 0.6, 0.7, 9]. gamma = lam = 1: A_t = R - V_t:
    # t=2: 1 + 0 - 0.7 = 0.3; t=1: 0.1 + 0.3 = 0.4; t=0: 0.1 + 0.4 = 0.5. Returns = 1.
    mask = jnp.array([[1, 1, 1, 0]], bool)
    rewards = losses.token_level_rewards(jnp.array([1.0]), mask)
    values = jnp.array([[0.5, 0.6, 0.7, 9.0]])
    adv, ret = losses.gae_advantages(rewards, values, mask)
    close(adv, [[0.5, 0.4, 0.3, 0.0]])
    close(ret, [[1.0, 1.0, 1.0, 0.0]])


def test_gae_discounted():
    # gamma = 0.9, lam = 0.5 (gamma * lam = 0.45):
    # t=2: delta = 1 - 0.7 = 0.3, A = 0.3
    # t=1: delta = 0.9 * 0.7 - 0.6 = 0.03, A = 0.03 + 0.45 * 0.3 = 0.165
    # t=0: delta = 0.9 * 0.6 - 0.5 = 0.04, A = 0.04 + 0.45 * 0.165 = 0.11425
    # returns = A + V = [0.61425, 0.765, 1.0].
    mask = jnp.array([[1, 1, 1, 0]], bool)
    rewards = jnp.array([[0.0, 0.0, 1.0, 0.0]])
    values = jnp.array([[0.5, 0.6, 0.7, 9.0]])
    adv, ret = losses.gae_advantages(rewards, values, mask, gamma=0.9, lam=0.5)
    close(adv, [[0.11425, 0.165, 0.3, 0.0]])
    close(ret, [[0.61425, 0.765, 1.0, 0.0]])


def test_gae_skips_masked_positions():
    # Mask [1, 0, 1, 0]: the hole at t=1 is skipped, so t=0 bootstraps from V_2:
    # t=2: A = 1 - 0.7 = 0.3; t=0: delta = 0.7 - 0.5 = 0.2, A = 0.2 + 0.3 = 0.5.
    mask = jnp.array([[1, 0, 1, 0]], bool)
    rewards = jnp.array([[0.0, 0.0, 1.0, 0.0]])
    values = jnp.array([[0.5, 123.0, 0.7, 9.0]])
    adv, _ = losses.gae_advantages(rewards, values, mask)
    close(adv, [[0.5, 0.0, 0.3, 0.0]])


def test_clipped_value_loss():
    # c = 0.1.
    # t0: V=1, old=0.8, R=2: (1-2)^2 = 1; clip(1, 0.7, 0.9) = 0.9, (0.9-2)^2 = 1.21
    #     -> 0.5 * 1.21 = 0.605, clipped.
    # t1: V=1, old=1.5, R=0: 1; clip -> 1.4, 1.96 -> 0.98, clipped.
    # t2: V=1, old=1.0, R=1.5: 0.25 both -> 0.125, not clipped.
    # t3: V=1, old=0.0, R=0.5: 0.25; clip -> 0.1, 0.16 -> max 0.25 -> 0.125, not clipped.
    values = jnp.array([[1.0, 1.0, 1.0, 1.0]])
    old = jnp.array([[0.8, 1.5, 1.0, 0.0]])
    returns = jnp.array([[2.0, 0.0, 1.5, 0.5]])
    loss, clipped = losses.clipped_value_loss(values, old, returns, clip_range=0.1)
    close(loss, [[0.605, 0.98, 0.125, 0.125]])
    close(clipped, [[1, 1, 0, 0]])
    loss, clipped = losses.clipped_value_loss(values, old, returns, clip_range=None)
    close(loss, [[0.5, 0.5, 0.125, 0.125]])
    close(clipped, [[0, 0, 0, 0]])
