"""The Qwen3-MoE block: routing and the grouped-matmul experts against a dense reference,
hand-worked router loss and metrics, config validation, layer layout, parameter counts
and the KV-cache path on a MoE model. (Parity with transformers: test_moe_hf.py.)"""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.models import moe
from rl_batch.models import transformer as model_lib

T, D, E, F = 12, 16, 4, 8


def _weights(seed=0, e=E):
    ks = jax.random.split(jax.random.key(seed), 5)
    return (
        jax.random.normal(ks[0], (T, D)),
        jax.random.normal(ks[1], (D, e)),
        0.3 * jax.random.normal(ks[2], (e, D, F)),
        0.3 * jax.random.normal(ks[3], (e, D, F)),
        0.3 * jax.random.normal(ks[4], (e, F, D)),
    )


def _dense_reference(x_td, router_de, gate_edf, up_edf, down_efd, top_k, norm_topk_prob):
    """Every expert on every token (the einsum the block avoids), then the top-k mix."""
    probs_te = jax.nn.softmax(x_td @ router_de, axis=-1)
    top_tk, idx_tk = jax.lax.top_k(probs_te, top_k)
    if norm_topk_prob:
        top_tk = top_tk / top_tk.sum(-1, keepdims=True)
    mix_te = jnp.zeros_like(probs_te).at[jnp.arange(x_td.shape[0])[:, None], idx_tk].set(top_tk)
    h_tef = jax.nn.silu(jnp.einsum("td,edf->tef", x_td, gate_edf))
    h_tef = h_tef * jnp.einsum("td,edf->tef", x_td, up_edf)
    out_ted = jnp.einsum("tef,efd->ted", h_tef, down_efd)
    return jnp.einsum("ted,te->td", out_ted, mix_te)


@pytest.mark.parametrize("impl", moe.GROUPED_IMPLS)
@pytest.mark.parametrize("top_k", [1, 2, 4])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.slow  # 33 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sparse_moe_equals_dense_reference(top_k, norm, impl):
    args = _weights(seed=top_k)
    fn = functools.partial(moe.sparse_moe, top_k=top_k, norm_topk_prob=norm, impl=impl)
    y_td, logits_te = jax.jit(fn)(*args)
    want_td = _dense_reference(*args, top_k, norm)
    assert float(jnp.std(want_td)) > 0.1
    np.testing.assert_allclose(y_td, want_td, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(logits_te, args[0] @ args[1], atol=1e-5)
    # Gradients (router included, through the routing weights) equal the reference's.
    g_ours = jax.grad(lambda a: jnp.sum(jnp.sin(fn(*a)[0])))(args)
    g_ref = jax.grad(lambda a: jnp.sum(jnp.sin(_dense_reference(*a, top_k, norm))))(args)
    for got, want in zip(g_ours, g_ref):
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("impl", moe.GROUPED_IMPLS)
def test_dropless_when_every_token_picks_one_expert(impl):
    x_td, router_de, gate_edf, up_edf, down_efd = _weights(seed=5)
    # A huge bias toward expert 2: all T tokens (T * k slots) land there; none dropped.
    x_td = jnp.concatenate([x_td[:, :-1], jnp.full((T, 1), 50.0)], axis=1)
    router_de = router_de.at[-1].set(jnp.array([0.0, 0.0, 1.0, 0.0]))
    y_td, logits_te = moe.sparse_moe(
        x_td, router_de, gate_edf, up_edf, down_efd, top_k=1, norm_topk_prob=False, impl=impl
    )
    assert (jnp.argmax(logits_te, -1) == 2).all()
    want = _dense_reference(x_td, router_de, gate_edf, up_edf, down_efd, 1, False)
    np.testing.assert_allclose(y_td, want, rtol=1e-5, atol=1e-3)


def test_grouped_matmuls_do_not_compute_every_expert():
    def jaxpr(impl):
        fn = functools.partial(moe.sparse_moe, top_k=2, norm_topk_prob=True, impl=impl)
        return str(jax.make_jaxpr(fn)(*_weights())).replace(" ", "")

    # gate, up, down as grouped matmuls on the [T * k] routed rows.
    assert jaxpr("ragged_dot").count("=ragged_dot_general[") == 3
    tiled = jaxpr("tiled")
    assert "ragged_dot" not in tiled
    # Tiles of m = 8 rows (24 rows / 4 experts, rounded up to 8): ceil(24 / 8) + 4 = 7.
    assert "f32[7,8,8]" in tiled  # [tiles, m, F]
    for text in (jaxpr("ragged_dot"), tiled):
        # No [T, E, F] intermediate: the experts never run on tokens not routed to them.
        assert f"{T},{E},{F}" not in text
    assert moe.default_grouped_impl() == "tiled"  # this is a CPU


def test_route_by_hand():
    # probs of [ln 4, ln 3, ln 2, ln 1] are [0.4, 0.3, 0.2, 0.1].
    logits_te = jnp.log(jnp.array([[4.0, 3.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]]))
    w_tk, idx_tk = moe.route(logits_te, 2, norm_topk_prob=False)
    np.testing.assert_array_equal(idx_tk, [[0, 1], [3, 2]])
    np.testing.assert_allclose(w_tk, [[0.4, 0.3], [0.4, 0.3]], rtol=1e-6)
    w_tk, _ = moe.route(logits_te, 2, norm_topk_prob=True)
    np.testing.assert_allclose(w_tk, [[4 / 7, 3 / 7]] * 2, rtol=1e-6)
    # Replayed choices keep this router's probabilities.
    w_tk, idx_tk = moe.route(logits_te, 2, False, experts_tk=jnp.array([[3, 0], [0, 1]]))
    np.testing.assert_array_equal(idx_tk, [[3, 0], [0, 1]])
    np.testing.assert_allclose(w_tk, [[0.1, 0.4], [0.1, 0.2]], rtol=1e-6)


def test_load_balancing_loss_by_hand():
    # E = 2, k = 1, one layer. Tokens 0, 1: probs [0.75, 0.25] (logit gap ln 3) -> expert
    # 0; token 2 is padding (routed to expert 1, left out). f = [1, 0], P = [0.75, 0.25]:
    # loss = E * (1 * 0.75 + 0 * 0.25) = 1.5.
    logits_lte = jnp.log(jnp.array([[[3.0, 1.0], [3.0, 1.0], [1.0, 9.0]]]))
    mask_t = jnp.array([True, True, False])
    np.testing.assert_allclose(moe.load_balancing_loss(logits_lte, mask_t, 1), 1.5, rtol=1e-6)
    # Perfectly balanced routing gives k (here E = 4, k = 2, uniform probabilities: ties
    # pick experts 0, 1, so f = [1, 1, 0, 0], P = 1/4 each: 4 * 2 / 4 = 2).
    np.testing.assert_allclose(
        moe.load_balancing_loss(jnp.zeros((2, 5, 4)), jnp.ones(5, bool), 2), 2.0, rtol=1e-6
    )
    # Two layers count together: layer 2 sends both tokens to expert 1 with P = [.25, .75].
    two = jnp.concatenate([logits_lte, jnp.log(jnp.array([[[1.0, 3.0]] * 3]))], axis=0)
    # f = [2, 2] / 4, P = [0.75 + 0.75 + 0.25 + 0.25, ...] / 4 = [0.5, 0.5]: 2 * 0.5 = 1.
    np.testing.assert_allclose(moe.load_balancing_loss(two, mask_t, 1), 1.0, rtol=1e-6)


def test_router_metrics_by_hand():
    # One layer, E = 2, k = 1: tokens 0, 1 -> expert 0, token 2 -> expert 1, token 3 pad.
    logits_lte = jnp.log(jnp.array([[[3.0, 1.0], [1.0, 1.0 / 3], [1.0, 1.0], [1.0, 0.0]]]))
    logits_lte = logits_lte.at[0, 2].set(jnp.array([0.0, 1.0]))
    mask_t = jnp.array([True, True, True, False])
    sums = moe.router_sums(logits_lte, mask_t, 1)
    np.testing.assert_array_equal(sums["moe_counts_le"], [[2.0, 1.0]])
    assert float(sums["moe_tokens"]) == 3.0
    # Entropies: two tokens at probs [.75, .25], one at sigmoid(1) = 0.7311.
    h = lambda p: -(p * math.log(p) + (1 - p) * math.log(1 - p))  # noqa: E731
    want_entropy = 2 * h(0.75) + h(1 / (1 + math.exp(-1)))
    np.testing.assert_allclose(sums["moe_entropy_sum"], want_entropy, rtol=1e-5)
    # Two micro-batches' sums add up; a second layer with loads [1, 2].
    sums2 = {
        "moe_counts_le": jnp.array([[4.0, 2.0], [2.0, 4.0]]),
        "moe_tokens": jnp.asarray(6.0),
        "moe_entropy_sum": jnp.asarray(3.0),
    }
    out = moe.finalize_router_metrics({"loss": 1.0, **sums2})
    assert set(out) == {
        "loss",
        "moe_load_max",
        "moe_load_min",
        "moe_router_entropy",
        "moe_frac_e0",
        "moe_frac_e1",
    }
    # Shares [[2/3, 1/3], [1/3, 2/3]]: max/mean = 2 * 2/3, min/mean = 2 * 1/3.
    np.testing.assert_allclose(out["moe_load_max"], 4 / 3, rtol=1e-6)
    np.testing.assert_allclose(out["moe_load_min"], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(out["moe_router_entropy"], 3.0 / (2 * 6), rtol=1e-6)
    np.testing.assert_allclose(out["moe_frac_e0"], 0.5, rtol=1e-6)
    assert moe.finalize_router_metrics({"loss": 1.0}) == {"loss": 1.0}


# ---------------------------------------------------------------------- config and layout

BASE = dict(
    vocab_size=32,
    hidden_size=16,
    num_layers=4,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    intermediate_size=24,
    qk_norm=True,
    max_seq_len=64,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=8,
)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_experts_per_tok=5), "num_experts_per_tok=5 must be in [1, num_experts=4]"),
        (dict(num_experts_per_tok=0), "num_experts_per_tok=0 must be in [1, num_experts=4]"),
        (dict(moe_intermediate_size=0), "moe_intermediate_size=0 must be positive"),
        (dict(num_experts=-1), "num_experts must be an int >= 0"),
        (dict(decoder_sparse_step=0), "decoder_sparse_step must be an int >= 1"),
        (dict(mlp_only_layers=(1, 4)), "mlp_only_layers=(1, 4) holds [4], outside layers"),
    ],
)
def test_bad_moe_config_is_one_clear_error(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        model_lib.ModelConfig(**{**BASE, **change})


def test_sparse_layer_layout_and_param_count():
    # step 2 -> layers 1, 3 sparse; mlp_only_layers (3,) makes 3 dense again.
    config = model_lib.ModelConfig(**BASE, decoder_sparse_step=2, mlp_only_layers=[3])
    assert config.mlp_only_layers == (3,)  # lists (from JSON) become hashable tuples
    assert [config.is_moe_layer(i) for i in range(4)] == [False, True, False, False]
    assert config.num_moe_layers == 1
    params = model_lib.init_params(config, 0)
    assert set(params["layers"][1]["mlp"]) == {"router_de", "gate_edf", "up_edf", "down_efd"}
    assert set(params["layers"][0]["mlp"]) == {"gate_df", "up_df", "down_fd"}
    assert params["layers"][1]["mlp"]["down_efd"].shape == (4, 8, 16)
    axes = model_lib.logical_axes(config)["layers"][1]["mlp"]
    assert axes["gate_edf"] == ("expert", "embed", "expert_mlp")
    assert axes["router_de"] == ("embed", "router_experts")
    for c in (config, model_lib.ModelConfig(**BASE), model_lib.get_preset("tiny-moe")):
        leaves = jax.tree.leaves(model_lib.abstract_params(c))
        assert c.num_params == sum(math.prod(x.shape) for x in leaves)
    # Active: each of the 4 sparse layers skips E - k = 2 experts of 3 * D * F weights.
    dense_all = model_lib.ModelConfig(**BASE)
    assert dense_all.num_params - dense_all.num_active_params == 4 * 2 * 3 * 16 * 8
    dense = model_lib.get_preset("tiny-1m")
    assert dense.num_active_params == dense.num_params and dense.num_moe_layers == 0


@pytest.mark.parametrize(
    "name, total, active",
    [
        # Model cards: Qwen3-30B-A3B 30.5B total / 3.3B activated; 235B-A22B 235B / 22B.
        ("qwen3-30b-a3b", 30.5e9, 3.3e9),
        ("qwen3-235b-a22b", 235e9, 22e9),
    ],
)
def test_moe_presets_match_published_counts(name, total, active):
    c = model_lib.get_preset(name)
    assert abs(c.num_params / total - 1) < 5e-3, c.num_params
    # "3.3B" / "22B" are rounded: ours are 3.353B and 22.19B.
    assert abs(c.num_active_params / active - 1) < 0.02, c.num_active_params
    assert c.num_moe_layers == c.num_layers and c.num_experts == 128
    assert c.num_experts_per_tok == 8 and c.norm_topk_prob


def test_tiny_moe_preset():
    c = model_lib.get_preset("tiny-moe")
    assert (c.num_experts, c.num_experts_per_tok) == (8, 2)
    assert c.num_params == 3_356_032 and c.num_active_params == 996_736


# ---------------------------------------------------------------------- model paths


def _random_params(config, seed=0):
    leaves, treedef = jax.tree.flatten(model_lib.abstract_params(config))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = [
        0.2 * jax.random.normal(k, s.shape) + (1.0 if len(s.shape) == 1 else 0.0)
        for k, s in zip(keys, leaves)
    ]
    return jax.tree.unflatten(treedef, out)


@pytest.mark.slow  # 20 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_cache_forward_matches_full_forward_on_moe():
    config = model_lib.ModelConfig(**BASE, mlp_only_layers=(2,))
    params = _random_params(config)
    b, p, s = 2, 4, 8
    rs = np.random.RandomState(0)
    tokens_bs = rs.randint(0, config.vocab_size, (b, s)).astype(np.int32)
    mask_bs = np.ones((b, s), bool)
    mask_bs[1, :2] = False
    positions_bs = np.asarray(model_lib.positions_from_mask(mask_bs))
    full_bsv = np.asarray(
        jax.jit(functools.partial(model_lib.forward, config))(
            params, tokens_bs, input_mask_bt=mask_bs
        )
    )
    step = jax.jit(functools.partial(model_lib.forward_with_cache, config))
    cache = model_lib.init_cache(config, b, s)
    kv_mask_bs = np.zeros((b, s), bool)
    kv_mask_bs[:, :p] = mask_bs[:, :p]
    logits_bpv, cache = step(params, tokens_bs[:, :p], positions_bs[:, :p], kv_mask_bs, cache, 0)
    np.testing.assert_allclose(
        np.asarray(logits_bpv)[mask_bs[:, :p]], full_bsv[:, :p][mask_bs[:, :p]], atol=1e-4
    )
    for i in range(p, s):
        kv_mask_bs[:, i] = True
        logits_b1v, cache = step(
            params, tokens_bs[:, i : i + 1], positions_bs[:, i : i + 1], kv_mask_bs, cache, i
        )
        np.testing.assert_allclose(np.asarray(logits_b1v)[:, 0], full_bsv[:, i], atol=1e-4)
    # forward_with_router: same logits, one [B * T, E] router block per sparse layer.
    out_bsv, router_lte = model_lib.forward_with_router(
        config, params, tokens_bs, input_mask_bt=mask_bs
    )
    np.testing.assert_allclose(out_bsv, full_bsv, atol=1e-5)
    assert router_lte.shape == (3, b * s, 4)
    with pytest.raises(ValueError, match="need a MoE config"):
        model_lib.forward_with_router(model_lib.get_preset("tiny-1m"), {}, tokens_bs)


def test_flops_count_active_parameters():
    from rl_batch.models import flops

    # All 4 layers sparse: per layer q 16*2*8 + k, v 2 * 16*8 + o 16*16 = 768, router
    # 16*4 = 64, k=2 experts of 3 * 16 * 8 = 768: 1600; LM head (tied) 16*32 = 512.
    config = model_lib.ModelConfig(**BASE)
    assert flops.matmul_weights(config) == 4 * 1600 + 512
    # = the active parameters less embedding-as-gather (tied: the head counts it) and norms.
    norms = 4 * (2 * 16 + 2 * 8) + 16
    assert flops.matmul_weights(config) == config.num_active_params - norms
    assert flops.layer_matmul_shapes(config, 0)["gate"] == (16, 16)  # k * F_moe = 2 * 8
    # mlp_only_layers=(1,): layer 1 is a dense MLP of width 24 and has no router.
    mixed = config.replace(mlp_only_layers=(1,))
    assert flops.layer_matmul_shapes(mixed, 1) == flops.layer_matmul_shapes(
        config.replace(num_experts=0), 1
    )
    assert flops.matmul_weights(mixed) == 3 * 1600 + (768 + 3 * 16 * 24) + 512
    # Qwen3-30B-A3B: the 3.35B active parameters less the (untied) embedding gather and
    # the norms, i.e. ~2 * 3.04B FLOPs per token (not 2 * 30.5B).
    big = model_lib.get_preset("qwen3-30b-a3b")
    norms = 48 * (2 * 2048 + 2 * 128) + 2048
    embedding = 151_936 * 2048
    assert flops.matmul_weights(big) == big.num_active_params - embedding - norms
    assert 6.0e9 < flops.model_flops_per_token(big, 0) < 6.2e9
