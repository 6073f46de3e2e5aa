"""PPO with a separate critic: the PPO-specific maths by hand, warm-up, critic init,
sharded == single device, non-finite skips, config resolution and a tiny run.

The generic pieces (GAE, whitening, clipped losses, KL estimators) have their own
hand-worked tests in test_losses.py; here they are checked *composed* the way PPO uses
them. Compilations dominate the cost, so update functions are cached per (mesh, config).
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import base
from rl_batch import artifacts
from rl_batch.algorithms import forward, learner, ppo
from rl_batch.analysis import curves
from rl_batch.models import flops, sharding
from rl_batch.models import transformer as model_lib
from rl_batch.runs import config as config_lib
from rl_batch.runs import run as run_lib
from rl_batch.runs.checkpoint import Checkpointer
from tests.run_fixtures import TINY_MODEL, numpy_params, set_fields, tiny_run_config

CFG = model_lib.get_preset("tiny-1m", **TINY_MODEL)
CRITIC_CFG = ppo.critic_model_config(CFG)
B, P, R = 16, 4, 6
KEY = jax.random.key(0)


POLICY = numpy_params(CFG)


def make_batch(rewards=None, seed=1) -> ppo.PPOBatch:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, R + 1, B)
    prompt_mask = np.ones((B, P), bool)
    prompt_mask[1, :2] = False  # left padding
    prompt_mask[6, :1] = False
    response_mask = np.arange(R)[None, :] < lengths[:, None]
    if rewards is None:
        rewards = (np.arange(B) % 3 == 0).astype(np.float32)
    return ppo.PPOBatch(
        prompt_tokens=jnp.asarray(rng.integers(1, 64, (B, P)) * prompt_mask, jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        response_tokens=jnp.asarray(rng.integers(1, 64, (B, R)) * response_mask, jnp.int32),
        response_mask=jnp.asarray(response_mask),
        rewards=jnp.asarray(rewards, jnp.float32),
    )


# ------------------------------------------------------------------- maths by hand

MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
SCORES = np.array([1.0, 0.0], np.float32)
# Padding values are garbage on purpose: they must not leak into anything.
VALUES = np.array([[0.5, 0.6, 0.8, 9.0], [0.2, 0.1, 9.0, 9.0]], np.float32)


def advantages(scores=SCORES, values=VALUES, old=None, ref=None, **config):
    adv, ret, rew = ppo.token_advantages(
        ppo.PPOConfig(whiten_advantages=False, **config),
        jnp.asarray(scores),
        jnp.asarray(values),
        jnp.asarray(MASK),
        old_logp_br=old,
        ref_logp_br=ref,
    )
    return np.asarray(adv), np.asarray(ret), np.asarray(rew)


def test_terminal_reward_and_gae_by_hand():
    adv, ret, rew = advantages()
    # The score sits on the last real token only (row 1 scored 0: no reward anywhere).
    np.testing.assert_allclose(rew, [[0, 0, 1, 0], [0, 0, 0, 0]])
    # gamma = lambda = 1: A_j = score - V_j, every return is the score; padding -> 0.
    np.testing.assert_allclose(adv, [[0.5, 0.4, 0.2, 0], [-0.2, -0.1, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[1, 1, 1, 0], [0, 0, 0, 0]], atol=1e-6)

    # gamma = 0.5: the return of token j is 0.5^(2 - j) (reward at j = 2).
    adv, ret, _ = advantages(gamma=0.5)
    np.testing.assert_allclose(ret[0], [0.25, 0.5, 1.0, 0.0], atol=1e-6)
    np.testing.assert_allclose(adv[0], [0.25 - 0.5, 0.5 - 0.6, 1.0 - 0.8, 0.0], atol=1e-6)

    # lambda = 0.5, gamma = 1: deltas (0.1, 0.2, 0.2); A2 = 0.2, A1 = 0.2 + 0.5 * 0.2,
    # A0 = 0.1 + 0.5 * 0.3.
    adv, ret, _ = advantages(lam=0.5)
    np.testing.assert_allclose(adv[0], [0.25, 0.3, 0.2, 0.0], atol=1e-6)
    np.testing.assert_allclose(ret[0], [0.75, 0.9, 1.0, 0.0], atol=1e-6)


def test_kl_penalty_on_every_real_token_by_hand():
    old = np.array([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, 0.0, 0.0]], np.float32)
    ref = np.array([[-1.5, -2.0, -1.0, 7.0], [-0.5, -1.0, 7.0, 7.0]], np.float32)
    # k1 = old - ref = [[0.5, 0, 0.5], [-0.5, 0]] on real tokens; coef 0.1.
    adv, ret, rew = advantages(kl_coef=0.1, old=jnp.asarray(old), ref=jnp.asarray(ref))
    np.testing.assert_allclose(rew, [[-0.05, 0, 0.95, 0], [0.05, 0, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(ret, [[0.9, 0.95, 0.95, 0], [0.05, 0, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(adv, [[0.4, 0.35, 0.15, 0], [-0.15, -0.1, 0, 0]], atol=1e-6)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs reference log-probs"):
        advantages(kl_coef=0.1)


def test_whitened_advantages_and_explained_variance():
    adv, _, _ = ppo.token_advantages(
        ppo.PPOConfig(), jnp.asarray(SCORES), jnp.asarray(VALUES), jnp.asarray(MASK)
    )
    real = np.asarray(adv)[MASK]
    assert abs(real.mean()) < 1e-6 and abs(real.std() - 1.0) < 1e-4
    assert np.all(np.asarray(adv)[~MASK] == 0)
    # Returns (1, 1, 1, 0, 0), values (0.5, 0.6, 0.8, 0.2, 0.1): residuals
    # (0.5, 0.4, 0.2, -0.2, -0.1) have mean 0.16 and variance 0.372 / 5 = 0.0744; the
    # returns have variance 0.6 * 0.4 = 0.24.
    returns = jnp.asarray([[1, 1, 1, 0], [0, 0, 0, 0]], jnp.float32)
    ev = ppo.explained_variance(jnp.asarray(VALUES), returns, jnp.asarray(MASK))
    assert float(ev) == pytest.approx(1 - 0.0744 / 0.24, rel=1e-5)


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_value_of_token_j_is_read_before_token_j():
    """V_j (the value for response token j) sees the prompt and y_<j, never y_j."""
    values_fn = jax.jit(functools.partial(forward.response_outputs, CRITIC_CFG))
    params = numpy_params(CRITIC_CFG)
    params["value_d"] = np.random.default_rng(3).normal(0, 1, (CFG.hidden_size,)).astype(np.float32)
    batch = make_batch()
    j = 2
    changed = batch.replace(response_tokens=batch.response_tokens.at[:, j].add(1))
    v = np.asarray(values_fn(params, batch))
    v_changed = np.asarray(values_fn(params, changed))
    assert v.shape == (B, R)
    np.testing.assert_allclose(v[:, : j + 1], v_changed[:, : j + 1], rtol=1e-6)
    assert np.all(np.abs(v[:, j + 1] - v_changed[:, j + 1]) > 1e-6)
    # V_0 is the value at the last prompt token of the unpadded sequence.
    row = 1  # left-padded by 2
    prompt = np.asarray(batch.prompt_tokens[row, 2:])
    full = model_lib.forward(CRITIC_CFG, params, jnp.asarray(prompt)[None])
    assert float(v[row, 0]) == pytest.approx(float(full[0, -1]), rel=1e-5, abs=1e-6)


def test_critic_from_policy_copies_the_body():
    critic = ppo.critic_params_from_policy(CFG, POLICY, jax.random.key(3))
    abstract = model_lib.abstract_params(CRITIC_CFG)
    assert jax.tree.structure(critic) == jax.tree.structure(abstract)
    for key in ("embed_vd", "final_norm", "layers"):
        for a, b in zip(jax.tree.leaves(critic[key]), jax.tree.leaves(POLICY[key])):
            np.testing.assert_array_equal(a, b)
            assert a is not b  # A copy: donating one network never frees the other.
    assert critic["value_d"].shape == (CFG.hidden_size,)
    assert 0.005 < float(jnp.std(critic["value_d"])) < 0.05
    assert float(critic["value_bias"]) == 0.0


# ------------------------------------------------------------------------- updates


def optimizers(config: ppo.PPOConfig):
    return learner.make_optimizer(1e-3), ppo.make_critic_optimizer(
        1e-3, batch_scale=config.critic_batch_scale
    )


@functools.cache
def update_fn_for(mesh_shape, **config):
    cfg = ppo.PPOConfig(**config)
    mesh = sharding.make_mesh(*mesh_shape, devices=jax.devices()[: int(np.prod(mesh_shape))])
    actor_opt, critic_opt = optimizers(cfg)
    fn = ppo.make_update_fn(CFG, cfg, actor_opt, critic_opt, mesh, with_ref=bool(cfg.kl_coef))
    return fn, mesh, actor_opt, critic_opt, bool(cfg.kl_coef)


def fresh_state(mesh_shape, **config):
    _, mesh, actor_opt, critic_opt, with_ref = update_fn_for(mesh_shape, **config)
    critic = ppo.critic_params_from_policy(CFG, POLICY, jax.random.key(3))
    policy = jax.tree.map(jnp.array, POLICY)
    return ppo.init_ppo_state(
        CFG, policy, critic, actor_opt, critic_opt, with_ref=with_ref, mesh=mesh
    )


def host(tree):
    return jax.tree.map(np.asarray, tree)


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y)


def assert_trees_differ(a, b):
    diff = sum(
        float(np.abs(np.asarray(x) - np.asarray(y)).sum())
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )
    assert diff > 0


# Every option at once: a 2-update warm-up, a frozen KL reference, a critic that steps
# once per 2 batches (optax.MultiSteps) and 2 micro-batches. One compilation per mesh.
OPTIONS = dict(warmup_updates=2, kl_coef=0.05, critic_batch_scale=2, micro_batches=2)
ONE = (1, 1, 1)


@functools.cache
def trajectory(mesh_shape):
    """Four updates from the same start on a mesh: host states (start included),
    metrics, and the critic's q_dnh sharding spec."""
    f, mesh, *_ = update_fn_for(mesh_shape, **OPTIONS)
    state = fresh_state(mesh_shape, **OPTIONS)
    states, metrics = [host(state)], []
    for seed in (1, 2, 3, 4):
        state, m = f(state, sharding.shard_batch(make_batch(seed=seed), mesh), KEY)
        states.append(host(state))
        metrics.append(host(m))
    spec = state.critic.params["layers"][0]["attn"]["q_dnh"].sharding.spec
    return states, metrics, spec


@pytest.mark.slow  # 11 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_warmup_trains_only_the_critic_then_both():
    states, metrics, _ = trajectory(ONE)
    start, warm, end = states[0], states[2], states[4]
    assert [float(m["actor_trained"]) for m in metrics] == [0, 0, 1, 1]
    assert [float(m["updates"]) for m in metrics] == [1, 2, 3, 4]
    assert all(float(m["skipped"]) == 0 for m in metrics)
    # Warm-up: the actor (params, Adam state, step) is untouched, the critic learns.
    assert_trees_equal(warm.actor, start.actor)
    assert_trees_differ(warm.critic.params, start.critic.params)
    assert [float(m["grad_norm"]) > 0 for m in metrics] == [False, False, True, True]
    assert [float(m["update_norm"]) > 0 for m in metrics] == [False, False, True, True]
    assert all(float(m["critic_grad_norm"]) > 0 for m in metrics)
    # After it both networks change; the actor steps every update.
    assert_trees_differ(end.actor.params, warm.actor.params)
    assert_trees_differ(states[3].actor.params, warm.actor.params)
    assert_trees_differ(end.critic.params, warm.critic.params)
    assert (int(end.actor.step), int(end.critic.step)) == (2, 4)
    # Critic batch scale 2: odd calls only accumulate, even calls step.
    moved = [float(m["critic_update_norm"]) > 0 for m in metrics]
    assert moved == [False, True, False, True]
    assert_trees_equal(states[1].critic.params, start.critic.params)
    for m in metrics:
        for key in ("value_loss", "explained_variance", "value_mean", "critic_lr", "kl"):
            assert np.isfinite(float(m[key])), key
    assert "critic_grad_sq_micro" in metrics[0] and "grad_sq_micro" in metrics[2]
    # The reference is frozen: the actor equals it until its first step (update 3),
    # then the KL to it is positive and so is the penalty taken from the rewards.
    assert float(metrics[2]["kl"]) == 0.0
    assert float(metrics[3]["kl"]) > 0 and float(metrics[3]["kl_penalty"]) != 0
    assert_trees_equal(end.ref_params, POLICY)


def test_nonfinite_update_is_skipped_in_both_phases():
    f, mesh, *_ = update_fn_for(ONE, **OPTIONS)
    state = fresh_state(ONE, **OPTIONS)
    before = host(state)
    nan_rewards = np.where(np.arange(B) == 3, np.nan, 1.0)
    bad = sharding.shard_batch(make_batch(rewards=nan_rewards), mesh)
    for phase in (0.0, 0.0, 1.0):  # two warm-up updates, then one in the train phase
        state, m = f(state, bad, KEY)
        assert float(m["skipped"]) == 1.0 and float(m["actor_trained"]) == phase
        # Neither network nor the critic's gradient accumulator took the NaN.
        assert_trees_equal(host(state.critic), before.critic)
        assert_trees_equal(host(state.actor), before.actor)
    assert int(state.updates) == 3  # the phase clock runs on
    state, m = f(state, sharding.shard_batch(make_batch(), mesh), KEY)
    assert float(m["skipped"]) == 0.0 and float(m["actor_trained"]) == 1.0
    assert int(state.actor.step) == 1 and int(state.critic.step) == 1
    assert (float(m["clip_low"]), float(m["clip_high"])) == pytest.approx((0.2, 0.2))
    # The clip range is an argument of the compiled update: another one compiles nothing
    # and is the one the update reports (float32: 0.3 -> 0.30000001).
    programs = flops.jit_cache_size(f)
    state, m = f(state, sharding.shard_batch(make_batch(), mesh), KEY, (0.1, 0.3))
    assert (float(m["clip_low"]), float(m["clip_high"])) == pytest.approx((0.1, 0.3))
    assert flops.jit_cache_size(f) == programs


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2)])
@pytest.mark.slow  # 30 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sharded_update_equals_single_device(mesh_shape):
    single_states, single_metrics, _ = trajectory(ONE)
    states, metrics, spec = trajectory(mesh_shape)
    if mesh_shape == (2, 2, 2):
        assert spec == jax.sharding.PartitionSpec("fsdp", "tensor", None)
    for a, b in zip(jax.tree.leaves(states[-1]), jax.tree.leaves(single_states[-1])):
        # Adam turns float noise in near-zero gradients into O(lr) differences in a
        # few entries; the tree as a whole must agree closely.
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert np.linalg.norm(a - b) <= 1e-4 * np.linalg.norm(b) + 1e-7
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    for ma, mb in zip(metrics, single_metrics):
        assert ma.keys() == mb.keys()
        for key in ma:
            np.testing.assert_allclose(ma[key], mb[key], rtol=1e-4, atol=1e-6, err_msg=key)


# ------------------------------------------------------------------------- config


def ppo_run_config(**changes):
    c = base.run_config()
    c.algo, c.group_size, c.prompts, c.filter_groups = "ppo", 1, 32, False
    c.lr_ref, c.batch_ref, c.ppo.critic_lr_ref = 1.5e-4, 64, 1e-3
    return set_fields(c, changes)


def test_resolve_derives_the_critic_lr():
    c = config_lib.resolve(ppo_run_config(**{"ppo.critic_batch_scale": 8}), device_count=1)
    # Actor: 1.5e-4 * sqrt(32 / 64); critic: its own 1e-3 at k x B = 8 x 32 = 256.
    assert c.optimizer.lr == pytest.approx(1.5e-4 * np.sqrt(0.5))
    assert c.critic_optimizer.lr == pytest.approx(1e-3 * 2.0) and c.inputs.ppo.critic_lr is None
    assert c.critic_rule.batch == 256 and c.critic_rule.rule == "sqrt"
    fixed = config_lib.resolve(ppo_run_config(**{"ppo.critic_lr_rule": "fixed"}), 1)
    assert fixed.critic_optimizer.lr == pytest.approx(1e-3)
    given = config_lib.resolve(ppo_run_config(**{"ppo.critic_lr": 5e-4}), 1)
    assert given.critic_optimizer.lr == given.inputs.ppo.critic_lr == 5e-4


def test_resolve_rejects_bad_ppo_fields():
    with pytest.raises(ValueError, match="filter_groups=True with algo='ppo'"):
        config_lib.resolve(ppo_run_config(filter_groups=True), device_count=1)
    bad = {"ppo.warmup_updates": -1, "ppo.gamma": 1.5, "ppo.critic_lr_rule": "cubic"}
    with pytest.raises(ValueError) as e:
        config_lib.resolve(ppo_run_config(**bad), device_count=1)
    for text in ("ppo.warmup_updates=-1", "ppo.gamma=1.5", "ppo.critic_lr_rule='cubic'"):
        assert text in str(e.value)
    with pytest.raises(ValueError, match="PPOConfig.gamma=2"):
        ppo.PPOConfig(gamma=2.0)


# ------------------------------------------------------------------------ tiny run


@pytest.mark.slow  # 13 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_tiny_ppo_run_starts_the_sample_axis_after_warmup(tmp_path):
    work, run_dir = str(tmp_path / "work"), str(tmp_path / "run")
    changes = {"ppo.warmup_updates": 2, "eval_every_responses": 8, "eval_prompts": 4}
    changes["checkpoint_every"] = 100  # only the final checkpoint
    config = tiny_run_config(
        work, run_dir, algo="ppo", group_size=1, prompts=8, budget_responses=16, **changes
    )
    summary = run_lib.run(config, progress=False)
    assert summary["status"] == "finished" and summary["responses_cum"] == 16
    updates = artifacts.read_metrics(run_dir, "update")
    assert [u["phase"] for u in updates] == ["critic_warmup"] * 2 + ["train"] * 2
    assert [u["responses_cum"] for u in updates] == [0, 0, 8, 16]
    assert [u["responses_generated_cum"] for u in updates] == [8, 16, 24, 32]
    assert all(u["critic_grad_norm"] > 0 for u in updates)
    assert [u["grad_norm"] > 0 for u in updates] == [False, False, True, True]
    evals = artifacts.read_metrics(run_dir, "eval")
    assert [e["responses_cum"] for e in evals] == [0, 8, 16]
    saved = artifacts.read_json(os.path.join(run_dir, artifacts.CONFIG_FILE))
    assert saved["ppo"]["critic_lr"] is None  # the input: derived
    assert saved["derived"]["critic_lr"] > 0 and saved["derived"]["critic"]["batch"] == 8

    # The run's own q counts training time from the first actor update, like the analysis.
    warmup_time = updates[1]["time_train_cum_s"]
    policy_time = updates[-1]["time_train_cum_s"] - warmup_time
    assert summary["q"] == pytest.approx(16 / policy_time)

    # The analysis sets the warm-up aside.
    data = curves.load_run(run_dir)
    assert data.warmup_updates == 2 and list(data.responses) == [8, 16]
    assert data.problems == ()  # its steps, cadence and summary.json add up


def test_checkpoint_round_trip_keeps_the_phase_clock(tmp_path):
    # What a resumed run restores: no reference (kl_coef = 0), a MultiSteps critic.
    actor_opt, critic_opt = optimizers(ppo.PPOConfig(critic_batch_scale=2))
    critic = ppo.critic_params_from_policy(CFG, POLICY, jax.random.key(3))
    state = ppo.init_ppo_state(
        CFG, jax.tree.map(jnp.array, POLICY), critic, actor_opt, critic_opt, with_ref=False
    )
    state = state.replace(updates=jnp.asarray(7, jnp.int32))
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(3, {"state": state}, {"counters": {"step": 3}})
    like = jax.tree.map(jnp.zeros_like, state)
    tree, meta = ckpt.restore({"state": like})
    ckpt.close()
    restored = tree["state"]
    assert restored.ref_params is None and int(restored.updates) == 7
    assert_trees_equal(host(restored), host(state))
    assert meta["counters"]["step"] == 3
