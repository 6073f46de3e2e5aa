"""GRPO learner on a 2-layer toy transformer, one CPU device.

Compilations are the cost here, so jitted functions are built once per module and
shared between tests that use the same shapes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_batch.algorithms import batch as batch_lib
from rl_batch.algorithms import forward, grpo, learner, losses, update_step
from rl_batch.models import flops, sharding
from rl_batch.models import transformer as model_lib
from tests.run_fixtures import LEARNER_MODEL, numpy_params

CFG = LEARNER_MODEL
B, P, R = 8, 4, 6
LR = 1e-3
# Response lengths differ a lot, so micro-batches hold different token counts.
LENGTHS = np.array([6, 3, 5, 1, 6, 2, 4, 6])
ADV = np.array([1.0, 0.5, 2.0, 1.0, -1.0, -0.5, -2.0, -1.0], np.float32)


def make_batch(advantages=ADV, **extra) -> learner.Batch:
    rng = np.random.default_rng(0)
    prompt_mask = np.ones((B, P), bool)
    prompt_mask[1, :2] = False  # left padding
    prompt_mask[5, :1] = False
    response_mask = np.arange(R)[None, :] < LENGTHS[:, None]
    return learner.Batch(
        prompt_tokens=jnp.asarray(rng.integers(1, 64, (B, P)) * prompt_mask, jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        response_tokens=jnp.asarray(rng.integers(1, 64, (B, R)) * response_mask, jnp.int32),
        response_mask=jnp.asarray(response_mask),
        advantages=jnp.asarray(advantages, jnp.float32),
        **extra,
    )


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def params():
    return numpy_params(CFG)


@pytest.fixture(scope="module")
def optimizer():
    return learner.make_optimizer(LR)


# Plain SGD with lr 1 so that the parameter change is minus the gradient (Adam's
# g / (|g| + eps) would amplify float noise in near-zero gradient entries).
SGD = optax.sgd(1.0)


def update_fn_for(mesh, optimizer, shuffle_minibatches=True, **config):
    return _update_fn(mesh, optimizer, grpo.GRPOConfig(**config), shuffle_minibatches)


@functools.cache
def _update_fn(mesh, optimizer, config, shuffle_minibatches):
    return grpo.make_update_fn(
        CFG, config, optimizer, mesh, shuffle_minibatches=shuffle_minibatches
    )


def fresh_state(params, optimizer, mesh):
    return learner.init_train_state(CFG, jax.tree.map(jnp.array, params), optimizer, mesh=mesh)


KEY = jax.random.key(0)
_logprobs = jax.jit(functools.partial(forward.compute_logprobs, CFG))
response_logits_fn = jax.jit(functools.partial(forward.response_outputs, CFG))
forward_fn = jax.jit(functools.partial(model_lib.forward, CFG))


def logprobs_fn(params, batch, temperature):
    # Host copies, so that fixture params and state params hit one compiled version.
    return _logprobs(jax.tree.map(np.asarray, params), batch, temperature)


def rel_err(a_tree, b_tree) -> float:
    a = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(a_tree)])
    b = jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(b_tree)])
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


# ------------------------------------------------------------------------------ config


def test_config_validation():
    cfg = grpo.GRPOConfig()
    assert (cfg.clip_low, cfg.clip_high, cfg.kl_coef, cfg.micro_batches) == (0.2, 0.28, 0.0, 1)
    assert cfg == grpo.GRPOConfig(num_minibatches=1, num_epochs=1)
    assert cfg.updates_per_batch == 1
    with pytest.raises(ValueError, match=r"GRPOConfig.clip_low=-0.1"):
        grpo.GRPOConfig(clip_low=-0.1)
    with pytest.raises(ValueError, match=r"GRPOConfig.loss_agg='mean'.*token_mean"):
        grpo.GRPOConfig(loss_agg="mean")
    with pytest.raises(ValueError, match=r"GRPOConfig.micro_batches=0"):
        grpo.GRPOConfig(micro_batches=0)
    with pytest.raises(ValueError, match=r"GRPOConfig.advantage='ppo'"):
        grpo.GRPOConfig(advantage="ppo")
    # Optimizer settings live in the run config (``learner.actor_optimizer``), not here.
    with pytest.raises(TypeError):
        grpo.GRPOConfig(max_grad_norm=1.0)
    with pytest.raises(TypeError):
        grpo.GRPOConfig(0.2)  # kw_only


def test_make_optimizer():
    # Hyperparameters stay float32 for bf16 params (bf16 would round b2 = 0.998 to 0.996).
    opt = learner.make_optimizer(3e-4, b2=0.998, max_grad_norm=1.0, weight_decay=0.1)
    p = {"w": jnp.ones((2, 2), jnp.bfloat16), "scale": jnp.ones((2,), jnp.bfloat16)}
    state = opt.init(p)
    assert state.hyperparams["b2"].dtype == jnp.float32
    assert float(state.hyperparams["b2"]) == pytest.approx(0.998, rel=1e-7)
    np.testing.assert_allclose(learner.current_lr(state), 3e-4, rtol=1e-7)
    # Clipping to norm 1 then Adam: first step is -lr * sign(g) - lr * wd * w on
    # matrices; norm scales are not decayed.
    f32 = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
    g = jax.tree.map(lambda x: 10.0 * x, f32)
    updates, _ = opt.update(g, opt.init(f32), f32)
    np.testing.assert_allclose(updates["w"], -3e-4 * (1 + 0.1), rtol=1e-5)
    np.testing.assert_allclose(updates["scale"], -3e-4, rtol=1e-5)
    # A schedule is evaluated in the step; its value is what current_lr reports.
    sched = learner.make_optimizer(optax.linear_schedule(1e-3, 0.0, 10))
    assert float(learner.current_lr(sched.init(f32))) == pytest.approx(1e-3)


def test_batch_advantages_prompt_major():
    # Two prompts, G = 2: rewards [[1, 0], [0, 0]] -> grpo: row 0 mean 0.5, unbiased std
    # 0.7071068 -> +-0.7071058; row 1 all equal -> 0. Flattened prompt-major.
    rewards = np.array([[1.0, 0.0], [0.0, 0.0]], np.float32)
    adv = grpo.batch_advantages(rewards, np.ones(2, bool), "grpo")
    np.testing.assert_allclose(adv, [0.7071058, -0.7071058, 0.0, 0.0], rtol=1e-5)
    # A dropped group gets 0 whatever its rewards.
    adv = grpo.batch_advantages(rewards, np.array([False, True]), "grpo")
    assert np.all(adv == 0.0)


# ---------------------------------------------------------------------- model plumbing


@pytest.mark.slow  # 9 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_logprobs_layout_matches_unpadded_forward(params):
    # Row 1 has 2 left-padding prompt tokens: its response log-probs must equal those of
    # a plain forward pass over the unpadded sequence prompt[2:] + response[:3].
    batch = make_batch()
    logp = np.asarray(logprobs_fn(params, batch, 1.0))
    for row in (0, 1):
        prompt = np.asarray(batch.prompt_tokens[row])[np.asarray(batch.prompt_mask[row])]
        response = np.asarray(batch.response_tokens[row])[: LENGTHS[row]]
        tokens = jnp.asarray(np.concatenate([prompt, response]))[None]
        logits = forward_fn(params, tokens)[0]
        n = len(prompt)
        expected = model_lib.token_logprobs(logits[n - 1 : -1][None], tokens[:, n:])[0]
        np.testing.assert_allclose(logp[row, : LENGTHS[row]], expected, rtol=1e-5, atol=1e-5)
        assert np.all(logp[row, LENGTHS[row] :] == 0.0)  # padding
    # Temperature: log softmax(logits / 2).
    logits = response_logits_fn(params, batch)
    expected = model_lib.token_logprobs(logits / 2.0, batch.response_tokens)
    np.testing.assert_allclose(logprobs_fn(params, batch, 2.0)[0], expected[0], rtol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.slow  # 18 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_micro_batched_logprobs_equal_full_batch(params, mesh, temperature):
    # The reference pass in micro-batches (B / M rows of logits at a time) gives the
    # full batch's log-probs, in the batch's row order, with or without optional fields.
    batch = make_batch(old_logprobs=jnp.zeros((B, R)))
    params = jax.tree.map(jnp.asarray, params)
    expected = np.asarray(logprobs_fn(params, batch, temperature))
    results = {}
    for m in (1, 2, 4, 8):
        fn = forward.make_logprobs_fn(CFG, mesh, temperature, micro_batches=m)
        results[m] = np.asarray(fn(params, batch))
        assert results[m].shape == (B, R)
        np.testing.assert_allclose(results[m], expected, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(results[m], results[1], rtol=1e-6, atol=1e-6)
        assert np.all(results[m][~np.asarray(batch.response_mask)] == 0.0)
    with pytest.raises(ValueError, match="cannot be split into 3 pieces"):
        forward.make_logprobs_fn(CFG, mesh, temperature, micro_batches=3)(params, batch)


# ---------------------------------------------------------------------------- updates


@pytest.mark.slow  # 17 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_update_moves_logprobs_with_advantage_sign(params, optimizer, mesh):
    batch = make_batch()
    before = np.asarray(logprobs_fn(params, batch, 1.0)).sum(axis=1)
    state, metrics = update_fn_for(mesh, optimizer)(
        fresh_state(params, optimizer, mesh), batch, KEY
    )
    after = np.asarray(logprobs_fn(state.params, batch, 1.0)).sum(axis=1)
    delta = after - before
    assert np.all(delta[ADV > 0] > 0), delta
    assert np.all(delta[ADV < 0] < 0), delta
    assert int(state.step) == 1
    # With old = stop_gradient(current): ratio 1, nothing clipped, KL 0, and the loss is
    # -sum_b A_b len_b / sum len = -(6 + 1.5 + 10 + 1 - 6 - 1 - 8 - 6) / 33 = 2.5 / 33.
    np.testing.assert_allclose(metrics["loss"], 2.5 / 33, rtol=1e-6)
    np.testing.assert_allclose(metrics["pg_loss"], 2.5 / 33, rtol=1e-6)
    assert float(metrics["clip_frac"]) == 0.0 and float(metrics["kl"]) == 0.0
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["ratio_max"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(metrics["response_len_mean"], 33 / 8)
    np.testing.assert_allclose(metrics["lr"], LR, rtol=1e-6)
    assert float(metrics["skipped"]) == 0.0
    assert float(metrics["grad_norm"]) > 0 and float(metrics["update_norm"]) > 0
    # Adam's first step moves every parameter with a non-zero gradient by ~lr.
    assert float(metrics["update_norm"]) < LR * np.sqrt(CFG.num_params)
    np.testing.assert_allclose(metrics["param_norm"], optax.tree.norm(state.params), rtol=1e-6)
    # Entropy metric = token-mean entropy of the pre-update logits.
    logits = response_logits_fn(params, batch)
    np.testing.assert_allclose(
        metrics["entropy"], losses.entropy_from_logits(logits, batch.response_mask), rtol=1e-5
    )


@pytest.mark.slow  # 16 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sampler_old_logprobs_give_same_update(params, optimizer, mesh):
    # Passing the (same-policy) behaviour log-probs explicitly equals stop_gradient.
    batch = make_batch()
    old = logprobs_fn(params, batch, 1.0)
    f = update_fn_for(mesh, optimizer)
    s1, m1 = f(fresh_state(params, optimizer, mesh), batch, KEY)
    s2, m2 = f(fresh_state(params, optimizer, mesh), batch.replace(old_logprobs=old), KEY)
    assert rel_err(s2.params, s1.params) < 1e-6
    np.testing.assert_allclose(m2["grad_norm"], m1["grad_norm"], rtol=1e-5)
    # Stale behaviour log-probs (lower by 0.5 nats) give ratio e^0.5 = 1.6487 > 1.28:
    # positive-advantage tokens are clipped, negative ones are not.
    s3, m3 = f(fresh_state(params, optimizer, mesh), batch.replace(old_logprobs=old - 0.5), KEY)
    np.testing.assert_allclose(m3["ratio_mean"], np.exp(0.5), rtol=1e-5)
    # Tokens with A > 0: 6 + 3 + 5 + 1 = 15 of 33.
    np.testing.assert_allclose(m3["clip_frac"], 15 / 33, rtol=1e-6)


def test_the_clip_range_is_an_argument_of_the_compiled_update(params, optimizer, mesh):
    # Behaviour log-probs 0.5 nats below the policy's: every ratio is e^0.5 = 1.648721.
    # A > 0 rows (sum A len = 6 + 1.5 + 10 + 1 = 18.5) clip at 1 + clip_high while the
    # ratio exceeds it; A < 0 rows (sum A len = -21) never clip (max keeps -A r). So the
    # token-mean loss is (-18.5 min(r, 1 + clip_high) + 21 r) / 33.
    batch = make_batch()
    batch = batch.replace(old_logprobs=logprobs_fn(params, batch, 1.0) - 0.5)
    r = float(np.exp(0.5))
    f = update_fn_for(mesh, optimizer)  # configured 0.2 / 0.28

    def loss_at(clip):
        return f(fresh_state(params, optimizer, mesh), batch, KEY, clip)[1]

    default = loss_at(None)
    programs = flops.jit_cache_size(f)
    cases = [(None, 0.28, 15 / 33), ((0.1, 0.6), 0.6, 15 / 33), ((0.1, 0.7), r - 1, 0.0)]
    for clip, high, clip_frac in cases:
        m = default if clip is None else loss_at(clip)
        want = (-18.5 * (1 + high) + 21 * r) / 33  # 0.331608, 0.152214, 0.124904
        np.testing.assert_allclose(m["loss"], want, rtol=1e-5)
        np.testing.assert_allclose(m["clip_frac"], clip_frac, rtol=1e-6)
        low_high = (0.2, 0.28) if clip is None else clip  # the range each update logs
        np.testing.assert_allclose((m["clip_low"], m["clip_high"]), low_high, rtol=1e-7)
    assert flops.jit_cache_size(f) == programs  # a new range compiled nothing
    # The same loss as the clip range compiled in as constants (the loss as before).
    config = grpo.GRPOConfig(clip_low=0.1, clip_high=0.6)
    n = float(np.sum(LENGTHS))
    baked, _ = grpo.grpo_loss(CFG, config, params, batch, num_tokens=n, num_seqs=8, max_len=R)
    np.testing.assert_allclose(loss_at((0.1, 0.6))["loss"], baked, rtol=1e-6)


def test_zero_advantages_zero_gradient(params, optimizer, mesh):
    state, metrics = update_fn_for(mesh, optimizer)(
        fresh_state(params, optimizer, mesh), make_batch(np.zeros(B)), KEY
    )
    assert float(metrics["grad_norm"]) == 0.0
    assert float(metrics["loss"]) == 0.0
    # Adam with a zero gradient leaves every parameter exactly where it was.
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


def test_nonfinite_update_is_skipped(params, optimizer, mesh):
    f = update_fn_for(mesh, optimizer)
    state = fresh_state(params, optimizer, mesh)
    opt_before = jax.tree.map(np.asarray, state.opt_state)
    state, metrics = f(state, make_batch(ADV * np.array([np.nan] + [1.0] * 7)), KEY)
    assert float(metrics["skipped"]) == 1.0
    assert not np.isfinite(float(metrics["loss"]))
    assert int(state.step) == 0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(jax.tree.leaves(state.opt_state), jax.tree.leaves(opt_before)):
        np.testing.assert_array_equal(a, b)
    # The next finite batch updates normally.
    state, metrics = f(state, make_batch(), KEY)
    assert float(metrics["skipped"]) == 0.0 and int(state.step) == 1


@pytest.mark.slow  # 14 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_kl_to_reference(params, optimizer, mesh):
    f = update_fn_for(mesh, optimizer, kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef=0.1 needs Batch.ref_logprobs"):
        f(fresh_state(params, optimizer, mesh), make_batch(), KEY)
    # Reference 0.1 nats below the policy on every token: k3 = exp(-0.1) + 0.1 - 1
    # = 0.0048374; loss = pg 2.5 / 33 + 0.1 * 0.0048374.
    batch = make_batch()
    batch = batch.replace(ref_logprobs=logprobs_fn(params, batch, 1.0) - 0.1)
    _, m = f(fresh_state(params, optimizer, mesh), batch, KEY)
    k3 = np.exp(-0.1) + 0.1 - 1
    np.testing.assert_allclose(m["kl"], k3, rtol=1e-4)
    np.testing.assert_allclose(m["kl_loss"], k3, rtol=1e-4)
    np.testing.assert_allclose(m["loss"], 2.5 / 33 + 0.1 * k3, rtol=1e-5)
    assert float(m["kl_old"]) == 0.0


def test_bad_batch_shapes(params, optimizer, mesh):
    batch = make_batch().replace(advantages=jnp.zeros((B, 1)))
    with pytest.raises(ValueError, match=r"Batch.advantages has shape \(8, 1\), expected \(8,\)"):
        update_fn_for(mesh, optimizer)(fresh_state(params, optimizer, mesh), batch, KEY)


# ------------------------------------------------------------------ micro-batches


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.slow  # 22 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_micro_batch_accumulation_equals_full_batch(params, mesh, loss_agg):
    sgd = SGD
    batch = make_batch()
    full_state, full = update_fn_for(mesh, sgd, loss_agg=loss_agg)(
        fresh_state(params, sgd, mesh), batch, KEY
    )
    acc_state, acc = update_fn_for(mesh, sgd, loss_agg=loss_agg, micro_batches=4)(
        fresh_state(params, sgd, mesh), batch, KEY
    )
    full_delta = jax.tree.map(jnp.subtract, full_state.params, params)
    acc_delta = jax.tree.map(jnp.subtract, acc_state.params, params)
    assert rel_err(acc_delta, full_delta) < 1e-6
    max_delta = max(float(jnp.max(jnp.abs(d))) for d in jax.tree.leaves(full_delta))
    for a, b in zip(jax.tree.leaves(acc_delta), jax.tree.leaves(full_delta)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * max_delta)
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "clip_frac", "ratio_max"):
        np.testing.assert_allclose(acc[key], full[key], rtol=1e-6, atol=1e-7, err_msg=key)
    np.testing.assert_allclose(acc["grad_sq_full"], full["grad_norm"] ** 2, rtol=1e-5)
    assert float(acc["gns_batch_micro"]) == 2 and float(acc["gns_batch_full"]) == 8
    assert "grad_sq_micro" not in full


def test_padding_rows_are_not_counted(params, mesh):
    # Rows 6 and 7 become padding (empty response). seq_mean_token_mean with ratio 1:
    # loss = -mean over the 6 real sequences of A = -(1 + 0.5 + 2 + 1 - 1 - 0.5) / 6
    # = -0.5 (counting the padding rows would give -3 / 8 = -0.375).
    batch = make_batch(ADV * np.array([1.0] * 6 + [0.0] * 2))
    batch = batch.replace(response_mask=batch.response_mask.at[6:].set(False))
    _, m = update_fn_for(mesh, SGD, loss_agg="seq_mean_token_mean")(
        fresh_state(params, SGD, mesh), batch, KEY
    )
    np.testing.assert_allclose(m["loss"], -0.5, rtol=1e-6)
    assert float(m["sequences"]) == 6.0
    # Lengths of the real rows: 6 + 3 + 5 + 1 + 6 + 2 = 23 tokens over 6 sequences.
    np.testing.assert_allclose(m["response_len_mean"], 23 / 6, rtol=1e-6)


@jax.jit
def _own_grad(p, micro):
    """Gradient of a micro-batch's own token-mean GRPO loss (its own token count)."""

    def loss(p):
        n = jnp.sum(micro.response_mask.astype(jnp.float32))
        config = grpo.GRPOConfig()
        return grpo.grpo_loss(CFG, config, p, micro, num_tokens=n, num_seqs=2, max_len=R)[0]

    return jax.grad(loss)(p)


def own_micro_grads(params, batch, micro_batches=4):
    """Each strided micro-batch's own gradient g_m, in micro-batch order."""
    micros = batch_lib.split_batch(batch, micro_batches)
    return [
        _own_grad(params, jax.tree.map(lambda x, m=m: x[m], micros)) for m in range(micro_batches)
    ]


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_gradient_noise_statistics(params, mesh):
    # grad_sq_micro must be the mean over the 4 strided micro-batches (rows m, m + 4) of
    # the squared norm of each micro-batch's own token-mean gradient g_m.
    batch = make_batch()
    _, acc = update_fn_for(mesh, SGD, micro_batches=4)(fresh_state(params, SGD, mesh), batch, KEY)
    own = own_micro_grads(params, batch)
    own_sq = [float(optax.tree.norm(g, squared=True)) for g in own]
    np.testing.assert_allclose(acc["grad_sq_micro"], np.mean(own_sq), rtol=1e-5)
    # The full token-mean gradient weighs g_m by its token share n_m / 33
    # (micro-batch tokens: rows 0,4: 12; 1,5: 5; 2,6: 9; 3,7: 7) ...
    shares = [12 / 33, 5 / 33, 9 / 33, 7 / 33]
    weighted = jax.tree.map(lambda *g: sum(s * x for s, x in zip(shares, g)), *own)
    full_sq = float(acc["grad_sq_full"])
    np.testing.assert_allclose(optax.tree.norm(weighted, squared=True), full_sq, rtol=1e-5)
    # ... while the naive mean of per-micro-batch means is a different gradient.
    naive = jax.tree.map(lambda *g: sum(g) / 4, *own)
    assert abs(float(optax.tree.norm(naive, squared=True)) - full_sq) > 1e-3 * full_sq


def test_gradient_noise_batch_sizes_count_real_sequences(params, mesh):
    """Padding rows (filtered groups) are not examples of the noise model."""
    f = update_fn_for(mesh, SGD, micro_batches=4)
    # Rows 6 and 7 are padding. The strided micro-batches (rows m, m + 4) hold 2, 2, 1
    # and 1 real sequences: b = harmonic mean = 4 / (1/2 + 1/2 + 1 + 1) = 4/3 and B = 6
    # (the raw row counts would say 8 / 4 = 2 and 8).
    keep = np.array([1.0] * 6 + [0.0] * 2)
    batch = make_batch(ADV * keep)
    batch = batch.replace(response_mask=batch.response_mask & (keep[:, None] > 0))
    _, m = f(fresh_state(params, SGD, mesh), batch, KEY)
    np.testing.assert_allclose(m["gns_batch_micro"], 4 / 3, rtol=1e-6)
    assert float(m["gns_batch_full"]) == 6.0 == float(m["sequences"])
    own_sq = [float(optax.tree.norm(g, squared=True)) for g in own_micro_grads(params, batch)]
    np.testing.assert_allclose(m["grad_sq_micro"], np.mean(own_sq), rtol=1e-5)

    # Rows 3 and 7 too: micro-batch 3 (rows 3, 7) is empty and left out, so b is the
    # harmonic mean of 2, 2, 1 = 3 / (1/2 + 1/2 + 1) = 1.5, B = 5 and grad_sq_micro the
    # mean of |g_m|^2 over micro-batches 0, 1, 2 only.
    keep = np.array([1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    batch = make_batch(ADV * keep)
    batch = batch.replace(response_mask=batch.response_mask & (keep[:, None] > 0))
    _, m = f(fresh_state(params, SGD, mesh), batch, KEY)
    np.testing.assert_allclose(m["gns_batch_micro"], 1.5, rtol=1e-6)
    assert float(m["gns_batch_full"]) == 5.0
    own_sq = [float(optax.tree.norm(g, squared=True)) for g in own_micro_grads(params, batch)]
    assert own_sq[3] == 0.0 and min(own_sq[:3]) > 0.0
    np.testing.assert_allclose(m["grad_sq_micro"], np.mean(own_sq[:3]), rtol=1e-5)


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_group_noise_update_equals_plain_and_logs_the_split(params, mesh):
    # B = 8 rows as P = 4 prompts x G = 2; M = 4 half-group micro-batches in 2 pairs of
    # 2 prompts. The row order changes the micro-batches, not the update.
    batch = make_batch()
    plain_state, plain = update_fn_for(mesh, SGD, micro_batches=4)(
        fresh_state(params, SGD, mesh), batch, KEY
    )
    split_state, split = update_fn_for(mesh, SGD, micro_batches=4, group_noise=True, group_size=2)(
        fresh_state(params, SGD, mesh), batch, KEY
    )
    delta = jax.tree.map(jnp.subtract, split_state.params, params)
    plain_delta = jax.tree.map(jnp.subtract, plain_state.params, params)
    assert rel_err(delta, plain_delta) < 1e-6
    np.testing.assert_allclose(split["grad_sq_full"], plain["grad_sq_full"], rtol=1e-5)
    assert float(split["gns_prompts_pair"]) == 2.0 and float(split["gns_prompts_full"]) == 4.0
    assert "grad_dot_pair" in split and "grad_dot_pair" not in plain
    with pytest.raises(ValueError, match="group_noise"):
        grpo.GRPOConfig(micro_batches=2, group_noise=True, group_size=2)
    with pytest.raises(ValueError, match="group_noise"):
        grpo.GRPOConfig(micro_batches=4, group_noise=True, group_size=2, num_epochs=2)


# ------------------------------------------------------------- minibatches / epochs


@pytest.mark.slow  # 35 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_minibatches_and_epochs_equal_sequential_updates(params, optimizer, mesh):
    # num_minibatches=2, num_epochs=2, no shuffling: four updates on the strided halves
    # (rows 0,2,4,6 then 1,3,5,7, twice), each against the behaviour log-probs of the
    # initial params. Reproduce them with four default single-update calls.
    batch = make_batch()
    state, metrics = update_fn_for(
        mesh, optimizer, num_minibatches=2, num_epochs=2, shuffle_minibatches=False
    )(fresh_state(params, optimizer, mesh), batch, KEY)
    assert int(state.step) == 4 and float(metrics["num_updates"]) == 4

    old = logprobs_fn(params, batch, 1.0)
    halves = batch_lib.split_batch(batch.replace(old_logprobs=old), 2)
    ref_state = fresh_state(params, optimizer, mesh)
    single = update_fn_for(mesh, optimizer)
    grad_norms = []
    for _ in range(2):
        for h in range(2):
            ref_state, m = single(ref_state, jax.tree.map(lambda x, h=h: x[h], halves), KEY)
            grad_norms.append(float(m["grad_norm"]))
    assert rel_err(state.params, ref_state.params) < 1e-5
    np.testing.assert_allclose(metrics["grad_norm"], np.mean(grad_norms), rtol=1e-5)
    # Later updates see a moved policy: ratios differ from 1.
    assert float(metrics["ratio_max"]) > 1.0


@pytest.mark.slow  # 10 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_an_update_that_makes_params_nonfinite_is_skipped(params, mesh):
    # Finite loss and grads, but an infinite step: the new params would be +-inf / nan.
    huge = optax.sgd(learning_rate=float("inf"))
    f = update_fn_for(mesh, huge)
    state, metrics = f(fresh_state(params, huge, mesh), make_batch(), KEY)
    assert np.isfinite(float(metrics["loss"])) and np.isfinite(float(metrics["grad_norm"]))
    assert float(metrics["skipped"]) == 1.0 and int(state.step) == 0
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(a, b)


def test_all_finite():
    assert bool(update_step.all_finite({"a": jnp.ones(3), "n": jnp.arange(3)}))
    assert not bool(update_step.all_finite({"a": jnp.array([1.0, jnp.inf]), "b": jnp.ones(2)}))
    assert not bool(update_step.all_finite([jnp.array(jnp.nan)]))
