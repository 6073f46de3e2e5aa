"""Chunked log-probs and entropy (rl_batch.models.logprobs) against the [B, R, V] reference:
values, gradients, the GRPO update, the absence of a [B, R, V] array, and the sampler's
last-position-only prefill."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.algorithms import forward, learner, losses
from rl_batch.algorithms import grpo as grpo_lib
from rl_batch.models import logprobs as logprobs_lib
from rl_batch.models import sharding
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import sampler as sampler_lib
from tests.run_fixtures import LEARNER_MODEL, numpy_params

CFG = LEARNER_MODEL
B, P, R = 4, 3, 7


def _params(config, seed=0):
    # std 0.1 weights so that logits are O(1) and the softmax is far from uniform.
    return jax.tree.map(lambda x: x * 5 if x.ndim >= 2 else x, numpy_params(config, seed))


def _batch(seed=0, b=B, p=P, r=R):
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((b, p), bool)
    prompt_mask[1, :2] = False  # left padding
    lengths = rng.integers(1, r + 1, b)
    response_mask = np.arange(r)[None, :] < lengths[:, None]
    return learner.Batch(
        prompt_tokens=jnp.asarray(rng.integers(1, 64, (b, p)) * prompt_mask, jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        response_tokens=jnp.asarray(rng.integers(1, 64, (b, r)) * response_mask, jnp.int32),
        response_mask=jnp.asarray(response_mask),
        advantages=jnp.asarray(rng.normal(size=b), jnp.float32),
    )


def _reference(hidden_brd, head_dv, targets_br, temperature):
    """The pre-chunking computation: full [B, R, V] logits, model.token_logprobs and
    losses.token_entropy."""
    logits_brv = (hidden_brd @ head_dv.astype(hidden_brd.dtype)).astype(jnp.float32)
    logits_brv = logits_brv / temperature
    return (
        model_lib.token_logprobs(logits_brv, targets_br),
        losses.token_entropy(logits_brv),
    )


def _inputs(seed=0, b=3, r=11, d=16, v=50):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    hidden_brd = jax.random.normal(k1, (b, r, d), jnp.float32)
    head_dv = 0.5 * jax.random.normal(k2, (d, v), jnp.float32)
    targets_br = jax.random.randint(k3, (b, r), 0, v)
    return hidden_brd, head_dv, targets_br


@pytest.mark.parametrize("chunk", [0, 1, 4, 11, 32])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.slow  # 29 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_chunked_values_and_gradients_equal_reference(chunk, temperature):
    hidden_brd, head_dv, targets_br = _inputs()
    w_logp = jax.random.normal(jax.random.key(5), targets_br.shape)
    w_ent = jax.random.normal(jax.random.key(6), targets_br.shape)

    def objective(fn, hidden, head):
        logp, ent = fn(hidden, head)
        return jnp.sum(w_logp * logp) + jnp.sum(w_ent * ent)

    def chunked(hidden, head):
        return logprobs_lib.logprobs_and_entropy(
            hidden, head, targets_br, temperature=temperature, chunk=chunk
        )

    def reference(hidden, head):
        return _reference(hidden, head, targets_br, temperature)

    got = chunked(hidden_brd, head_dv)
    want = reference(hidden_brd, head_dv)
    for g, w in zip(got, want):
        assert g.shape == targets_br.shape and g.dtype == jnp.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    got_grads = jax.grad(functools.partial(objective, chunked), argnums=(0, 1))(hidden_brd, head_dv)
    want_grads = jax.grad(functools.partial(objective, reference), argnums=(0, 1))(
        hidden_brd, head_dv
    )
    for g, w in zip(got_grads, want_grads):
        assert float(jnp.max(jnp.abs(w))) > 1e-2  # a real gradient, not zeros
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _max_intermediate_size(jaxpr) -> int:
    """Largest element count of any value a jaxpr (or a sub-jaxpr) produces."""
    biggest = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            shape = getattr(var.aval, "shape", ())
            biggest = max(biggest, int(np.prod(shape)) if shape else 1)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            biggest = max(biggest, _max_intermediate_size(sub))
    return biggest


@pytest.mark.parametrize("chunk, has_full_logits", [(0, True), (8, False)])
def test_no_full_logits_array_in_forward_or_backward(chunk, has_full_logits):
    b, r, d, v = 3, 32, 16, 50
    hidden_brd, head_dv, targets_br = _inputs(b=b, r=r, d=d, v=v)

    def loss(hidden, head):
        logp, ent = logprobs_lib.logprobs_and_entropy(hidden, head, targets_br, chunk=chunk)
        return jnp.sum(logp) + jnp.sum(ent)

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(hidden_brd, head_dv).jaxpr
    biggest = _max_intermediate_size(jaxpr)
    assert (biggest >= b * r * v) == has_full_logits, biggest
    if not has_full_logits:
        # One block of logits, the head's gradient [D, V] or the hidden states [B, R, D].
        assert biggest <= max(b * chunk * v, d * v, b * r * d)


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("chunk", [0, 2, 5])
@pytest.mark.slow  # 23 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_response_logprobs_equal_full_forward(tie, chunk):
    config = CFG.replace(tie_embeddings=tie, logits_chunk=chunk)
    params = _params(config)
    batch = _batch()
    logp, ent = jax.jit(functools.partial(logprobs_lib.response_logprobs, config))(
        params, batch, 0.8
    )
    logits_brv = forward.response_outputs(config, params, batch) / 0.8
    mask = np.asarray(batch.response_mask)
    want_logp = model_lib.token_logprobs(logits_brv, batch.response_tokens)
    np.testing.assert_allclose(np.asarray(logp)[mask], np.asarray(want_logp)[mask], atol=1e-5)
    want_ent = losses.token_entropy(logits_brv)
    np.testing.assert_allclose(np.asarray(ent)[mask], np.asarray(want_ent)[mask], atol=1e-5)


@pytest.mark.slow  # 14 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_chunked_grpo_update_equals_unchunked():
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = learner.make_optimizer(1e-3)
    batch = _batch()
    grpo = grpo_lib.GRPOConfig(temperature=0.9, micro_batches=2)
    results = []
    for chunk in (0, 3):
        config = CFG.replace(logits_chunk=chunk)
        state = learner.init_train_state(config, _params(config), optimizer, mesh=mesh)
        update = grpo_lib.make_update_fn(config, grpo, optimizer, mesh)
        results.append(update(state, batch, jax.random.key(0)))
    (state0, m0), (state1, m1) = results
    assert float(m0["grad_norm"]) > 0
    for key in ("loss", "grad_norm", "entropy", "logprob_mean", "kl"):
        np.testing.assert_allclose(m1[key], m0[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for a, b in zip(jax.tree.leaves(state1.params), jax.tree.leaves(state0.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("head", ["lm", "value"])
@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_last_only_logits_equal_last_column(head):
    config = CFG.replace(head=head)
    params = _params(config)
    batch = _batch()
    b, p = batch.prompt_tokens.shape
    positions = model_lib.positions_from_mask(batch.prompt_mask)

    def run(last_only):
        cache = model_lib.init_cache(config, b, p)
        out, _ = model_lib.forward_with_cache(
            config,
            params,
            batch.prompt_tokens,
            positions,
            batch.prompt_mask,
            cache,
            0,
            last_only=last_only,
        )
        return out

    full, last = run(False), run(True)
    assert last.shape[1] == 1
    np.testing.assert_allclose(last[:, 0], full[:, -1], rtol=1e-6, atol=1e-6)


def _shapes(jaxpr) -> set[tuple[int, ...]]:
    """Shapes of every value a jaxpr (or a sub-jaxpr) produces."""
    out = set()
    for eqn in jaxpr.eqns:
        out |= {tuple(getattr(var.aval, "shape", ())) for var in eqn.outvars}
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out |= _shapes(sub)
    return out


def test_prefill_computes_only_last_logits():
    """The sampler's prefill makes [B, 1, V] logits, never [B, P, V] (which a forward
    over the prompt without ``last_only`` does)."""
    config = CFG.replace(vocab_size=211)
    params = _params(config)
    b, p = 2, 9
    tokens = jnp.ones((b, p), jnp.int32)
    mask = jnp.ones((b, p), bool)
    fn = functools.partial(
        sampler_lib.prefill, config, max_new_tokens=4, response_len=4, eos_id=1, pad_id=0
    )
    shapes = _shapes(jax.make_jaxpr(fn)(params, tokens, mask, jax.random.key(0)).jaxpr)
    assert (b, 1, config.vocab_size) in shapes
    assert (b, p, config.vocab_size) not in shapes
    forward_fn = functools.partial(model_lib.forward, config)
    assert (b, p, config.vocab_size) in _shapes(jax.make_jaxpr(forward_fn)(params, tokens).jaxpr)
