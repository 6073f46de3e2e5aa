"""GSPO's sequence-level clipped loss: hand-worked numbers, its relation to the token
loss, and the learner option (``GRPOConfig.policy_loss="gspo"``)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.algorithms import forward, grpo, learner, losses
from rl_batch.models import sharding
from tests.run_fixtures import LEARNER_MODEL, numpy_params
from tests.test_learner import ADV, make_batch


def close(x, y, tol=1e-5):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def test_gspo_loss_by_hand():
    # Sequence 0: 2 real tokens with log-ratios 0.1, 0.3 -> mean 0.2, s = e^0.2 = 1.221403,
    #   A = +1, inside [1 - 0.2, 1 + 0.28]: loss = -1.221403, not clipped.
    # Sequence 1: log-ratios -0.5, -0.1 and a padding token (log-ratio 7, ignored) ->
    #   mean -0.3, s = e^-0.3 = 0.740818, A = -1: max(0.740818, 0.8) = 0.8, clipped.
    # Sequence 2: all padding: s = 1, A = 2: loss -2.
    old = jnp.full((3, 3), -1.0)
    log_ratio = jnp.array([[0.1, 0.3, 5.0], [-0.5, -0.1, 7.0], [3.0, 3.0, 3.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 0], [0, 0, 0]], bool)
    adv = jnp.array([1.0, -1.0, 2.0])
    loss_b, clipped_b, lr_b = losses.gspo_policy_loss(
        old + log_ratio, old, adv, mask, clip_low=0.2, clip_high=0.28
    )
    close(loss_b, [-math.exp(0.2), 0.8, -2.0])
    close(clipped_b, [0.0, 1.0, 0.0])
    close(lr_b, [0.2, -0.3, 0.0])
    # d loss_0 / d logp_t = -A s / len = -1.221403 / 2 on real tokens; clipped sequence 1
    # gets no gradient; padding none.
    grad = jax.grad(
        lambda lp: jnp.sum(
            losses.gspo_policy_loss(lp, old, adv, mask, clip_low=0.2, clip_high=0.28)[0]
        )
    )(old + log_ratio)
    e = math.exp(0.2) / 2
    close(grad, [[-e, -e, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


def test_gspo_default_clip_is_narrow():
    # GSPO's 3e-4 / 4e-4: a mean log-ratio of 0.001 (s = 1.0010005) is clipped at 1.0004.
    old = jnp.zeros((1, 2))
    loss_b, clipped_b, _ = losses.gspo_policy_loss(
        old + 0.001, old, jnp.array([1.0]), jnp.ones((1, 2), bool)
    )
    close(loss_b, [-1.0004], tol=1e-7)
    assert float(clipped_b[0]) == 1.0


def test_gspo_equals_token_loss_for_one_token_sequences():
    rs = np.random.RandomState(0)
    logp = jnp.asarray(rs.normal(-1, 0.3, (6, 1)))
    old = jnp.asarray(rs.normal(-1, 0.3, (6, 1)))
    adv = jnp.asarray(rs.normal(0, 1, (6,)))
    mask = jnp.ones((6, 1), bool)
    seq_b, seq_clip_b, _ = losses.gspo_policy_loss(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.28
    )
    tok_bt, tok_clip_bt = losses.clipped_policy_loss(
        logp, old, adv[:, None], clip_low=0.2, clip_high=0.28
    )
    close(seq_b, tok_bt[:, 0])
    close(seq_clip_b, tok_clip_bt[:, 0])
    assert 0 < float(seq_clip_b.sum()) < 6  # some clipped, some not


def test_grpo_config_gspo_validation():
    grpo.GRPOConfig(policy_loss="gspo", loss_agg="seq_mean_token_mean")
    with pytest.raises(ValueError, match=r"policy_loss='dapo' is invalid"):
        grpo.GRPOConfig(policy_loss="dapo")
    with pytest.raises(ValueError, match=r"loss_agg='token_mean' is invalid: expected "):
        grpo.GRPOConfig(policy_loss="gspo")


@pytest.mark.slow  # 10 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_gspo_update_loss_matches_direct_computation():
    cfg = LEARNER_MODEL
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    params = jax.tree.map(jnp.asarray, numpy_params(cfg))
    batch = make_batch()
    logp = forward.compute_logprobs(cfg, params, batch)
    # A behaviour policy off by +-0.15 per token so some sequences clip at 0.1.
    rs = np.random.RandomState(3)
    old = jnp.where(batch.response_mask, logp + jnp.asarray(rs.uniform(-0.15, 0.15, logp.shape)), 0)
    batch = batch.replace(old_logprobs=old.astype(jnp.float32))
    config = grpo.GRPOConfig(
        policy_loss="gspo", loss_agg="seq_mean_token_mean", clip_low=0.02, clip_high=0.02
    )
    opt = learner.make_optimizer(1e-3)
    state = learner.init_train_state(cfg, params, opt, mesh=mesh)
    _, metrics = grpo.make_update_fn(cfg, config, opt, mesh)(state, batch, jax.random.key(0))
    loss_b, clipped_b, _ = losses.gspo_policy_loss(
        logp, old, jnp.asarray(ADV), batch.response_mask, clip_low=0.02, clip_high=0.02
    )
    close(metrics["pg_loss"], jnp.mean(loss_b), tol=1e-5)
    assert 0 < float(clipped_b.sum()) < 8
    lengths = np.asarray(batch.response_mask.sum(1))
    want_clip = float(np.sum(np.asarray(clipped_b) * lengths) / lengths.sum())
    close(metrics["clip_frac"], want_clip, tol=1e-6)
