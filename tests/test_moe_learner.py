"""GRPO updates of a MoE policy: the load-balancing loss term and its gradient, and the
expert-load metrics, checked against direct computations on the same batch."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_batch.algorithms import batch as batch_lib
from rl_batch.algorithms import forward, grpo, learner, update_step
from rl_batch.models import moe, sharding
from tests.run_fixtures import LEARNER_MODEL, numpy_params
from tests.test_learner import ADV, make_batch

MOE_MODEL = LEARNER_MODEL.replace(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16)
SGD = optax.sgd(1.0)  # the parameter change is minus the gradient
KEY = jax.random.key(0)


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def _params(seed=0):
    # Router weights larger than init so that routing is far from uniform.
    params = numpy_params(MOE_MODEL, seed)
    rng = np.random.default_rng(seed + 1)
    for layer in params["layers"].values():
        layer["mlp"]["router_de"] = rng.normal(0, 1.0, layer["mlp"]["router_de"].shape).astype(
            np.float32
        )
    return params


@functools.cache
def _update(mesh, optimizer, **config):
    return grpo.make_update_fn(MOE_MODEL, grpo.GRPOConfig(**config), optimizer, mesh)


def _run(mesh, optimizer=SGD, advantages=ADV, **config):
    params = _params()
    state = learner.init_train_state(
        MOE_MODEL, jax.tree.map(jnp.array, params), optimizer, mesh=mesh
    )
    state, metrics = _update(mesh, optimizer, **config)(state, make_batch(advantages), KEY)
    return params, jax.tree.map(np.asarray, state.params), jax.tree.map(float, metrics)


def _router(params, batch):
    """Router logits [L, B * (P + R), E] and the token mask, straight from the model."""
    _, router_lte, mask_t = forward.response_outputs(MOE_MODEL, params, batch, with_router=True)
    return router_lte, mask_t


@pytest.mark.slow  # 11 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_metrics_and_aux_loss_term(mesh):
    params, _, metrics = _run(mesh, router_aux_loss_coef=0.1)
    router_lte, mask_t = _router(jax.tree.map(jnp.asarray, params), make_batch())
    want_aux = float(moe.load_balancing_loss(router_lte, mask_t, 2))
    assert want_aux > 2.05  # unbalanced (uniform routing would give k = 2)
    np.testing.assert_allclose(metrics["moe_aux_loss"], want_aux, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"] - metrics["pg_loss"], 0.1 * want_aux, rtol=1e-4)

    # Expert load from the top-2 choices of every real token, per layer.
    top_ltk = np.argsort(-np.asarray(router_lte), axis=-1)[..., :2]
    real = np.asarray(mask_t)
    counts_le = np.stack([np.bincount(t[real].ravel(), minlength=8) for t in top_ltk])
    share_le = counts_le / counts_le.sum(1, keepdims=True)
    np.testing.assert_allclose(metrics["moe_load_max"], 8 * share_le.max(), rtol=1e-5)
    np.testing.assert_allclose(metrics["moe_load_min"], 8 * share_le.min(), rtol=1e-5)
    for e in range(8):
        np.testing.assert_allclose(metrics[f"moe_frac_e{e}"], share_le[:, e].mean(), rtol=1e-5)
    p_lte = np.asarray(jax.nn.softmax(router_lte, axis=-1))[:, real]
    entropy = -(p_lte * np.log(p_lte)).sum(-1).mean()
    np.testing.assert_allclose(metrics["moe_router_entropy"], entropy, rtol=1e-5)
    assert 0 < metrics["moe_router_entropy"] < math.log(8)


@pytest.mark.slow  # 25 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_aux_loss_gradient_reaches_the_router_only_when_configured(mesh):
    zero = np.zeros_like(ADV)  # no policy-gradient signal at all
    before, after, _ = _run(mesh, advantages=zero)
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
        np.testing.assert_array_equal(a, b)  # coef 0: nothing moves
    before, after, _ = _run(mesh, advantages=zero, router_aux_loss_coef=0.5)

    def aux(p):
        return 0.5 * moe.load_balancing_loss(*_router(p, make_batch(zero)), 2)

    grads = jax.grad(aux)(jax.tree.map(jnp.asarray, before))
    for layer in (0, 1):
        got = (
            before["layers"][layer]["mlp"]["router_de"] - after["layers"][layer]["mlp"]["router_de"]
        )
        want = np.asarray(grads["layers"][layer]["mlp"]["router_de"])
        assert np.abs(want).max() > 1e-4
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
    # Experts get no gradient from the aux loss (it depends on router logits only).
    np.testing.assert_array_equal(
        before["layers"][1]["mlp"]["gate_edf"], after["layers"][1]["mlp"]["gate_edf"]
    )


@pytest.mark.slow  # 9 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_micro_batches_give_the_same_update_and_load_metrics(mesh):
    _, one, m1 = _run(mesh)
    _, two, m2 = _run(mesh, micro_batches=2)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    keys = [k for k in m1 if k.startswith("moe_") and k != "moe_aux_loss"]
    assert len(keys) == 3 + 8
    for key in keys + ["pg_loss", "loss"]:
        np.testing.assert_allclose(m2[key], m1[key], rtol=1e-5, atol=1e-7, err_msg=key)
    # The aux loss is per micro-batch (mean over them), close to the full-batch value.
    assert abs(m2["moe_aux_loss"] / m1["moe_aux_loss"] - 1) < 0.2


@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_memory_settings_keep_the_moe_update(mesh):
    """main's memory switches (remat, chunked log-probs) on a MoE policy: the same
    loss, router metrics and update as the plain path; scan_layers is refused."""
    batch = make_batch()
    params = jax.tree.map(jnp.asarray, _params())
    num_tokens, num_seqs = batch_lib.loss_normalisers(batch.response_mask)
    config = grpo.GRPOConfig(router_aux_loss_coef=0.1)

    def loss_and_grads(model_config):
        loss_fn = functools.partial(
            grpo.grpo_loss,
            model_config,
            config,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_len=batch.response_tokens.shape[1],
        )
        grads, loss, metrics = update_step.accumulate_gradients(loss_fn, params, batch, 1)
        return jax.tree.map(np.asarray, (grads, loss, metrics))

    want = loss_and_grads(MOE_MODEL)
    got = loss_and_grads(MOE_MODEL.replace(remat="full", logits_chunk=3))
    assert set(got[2]) == set(want[2]) and "moe_load_max" in got[2]
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6)
    with pytest.raises(ValueError, match="scan_layers=True is not supported with a MoE model"):
        MOE_MODEL.replace(scan_layers=True)
