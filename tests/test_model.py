"""Unit tests of rl_batch.models.transformer: config validation, parameter counts, the functional
forward, the KV-cache path, dtypes, the value head and logical axes."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.models import transformer as model_lib

SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=48,
    max_seq_len=64,
)
AXIS_NAMES = {"vocab", "embed", "q_heads", "kv_heads", "head_dim", "mlp"}


def _config(**overrides) -> model_lib.ModelConfig:
    return model_lib.ModelConfig(**{**SMALL, **overrides})


def _random_params(config, seed=0):
    """init_params, then random norm scales and biases (init makes them ones / zeros)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(model_lib.init_params(config, seed))
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    out = []
    for key, (path, x) in zip(keys, leaves):
        name = jax.tree_util.keystr(path)
        if "scale" in name or "bias" in name:
            out.append(x + (0.3 * jax.random.normal(key, x.shape)).astype(x.dtype))
        else:
            out.append(x * 5)  # std 0.1 so logits are O(1)
    return jax.tree.unflatten(treedef, out)


# ---------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "change, message",
    [
        ({"vocab_size": 0}, "ModelConfig.vocab_size must be a positive int, got 0"),
        ({"hidden_size": 32.0}, "ModelConfig.hidden_size must be a positive int, got 32.0"),
        ({"num_layers": -1}, "ModelConfig.num_layers must be a positive int"),
        ({"max_seq_len": 0}, "ModelConfig.max_seq_len must be a positive int"),
        ({"num_heads": 6, "num_kv_heads": 4}, "num_heads=6 must be a multiple of num_kv_heads=4"),
        ({"head_dim": 7}, "head_dim must be even for RoPE, got 7"),
        ({"param_dtype": "float64"}, "ModelConfig.param_dtype='float64'"),
        ({"dtype": "int8"}, "ModelConfig.dtype='int8'"),
        ({"head": "policy"}, "ModelConfig.head='policy'"),
    ],
)
def test_config_validation_names_the_field(change, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _config(**change)
    with pytest.raises(ValueError, match=re.escape(message)):  # replace validates too
        _config().replace(**change)


def test_get_preset():
    assert model_lib.get_preset("tiny-1m", num_layers=1).num_layers == 1
    assert model_lib.get_preset("tiny-1m") is model_lib.PRESETS["tiny-1m"]
    with pytest.raises(ValueError, match=r"unknown model preset 'gpt5'; known presets: \["):
        model_lib.get_preset("gpt5")


def _variants(config):
    yield config
    yield config.replace(tie_embeddings=not config.tie_embeddings)
    yield config.replace(head="value")
    yield config.replace(qkv_bias=not config.qkv_bias, qk_norm=not config.qk_norm)


def _assert_count(config):
    leaves = jax.tree.leaves(model_lib.abstract_params(config))
    assert config.num_params == sum(math.prod(x.shape) for x in leaves), config
    assert {x.dtype for x in leaves} == {jnp.dtype(config.param_dtype)}


@pytest.mark.parametrize("name", sorted(model_lib.PRESETS))
@pytest.mark.slow  # 25 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_num_params_counts_every_leaf(name):
    _assert_count(model_lib.PRESETS[name])


@pytest.mark.parametrize("config", [model_lib.PRESETS["tiny-1m"], _config()], ids=["tiny", "small"])
def test_num_params_counts_every_leaf_variants(config):
    # Head, tying, bias and QK-norm variants (on small shapes: building big ones is slow).
    for variant in _variants(config):
        _assert_count(variant)


@pytest.mark.parametrize(
    "name, published",
    [
        # Totals from the models' Hugging Face pages (embeddings counted once when tied).
        ("qwen3-0.6b", 596.0e6),
        ("qwen3-4b", 4.02e9),
        ("qwen3-8b", 8.19e9),
        ("qwen2.5-0.5b", 494.0e6),
        ("qwen2.5-1.5b", 1.54e9),
    ],
)
def test_preset_sizes_match_published_models(name, published):
    # Published totals have three significant figures.
    assert abs(model_lib.PRESETS[name].num_params / published - 1) < 5e-3


def test_preset_non_embedding_sizes():
    # Model cards: Qwen3-0.6B 0.44B, 1.7B 1.4B, 8B 6.95B non-embedding parameters.
    for name, published in [("qwen3-0.6b", 0.44e9), ("qwen3-1.7b", 1.4e9), ("qwen3-8b", 6.95e9)]:
        c = model_lib.PRESETS[name]
        embedding = c.vocab_size * c.hidden_size * (1 if c.tie_embeddings else 2)
        assert abs((c.num_params - embedding) / published - 1) < 0.02, name


def test_tiny_presets_size():
    assert model_lib.PRESETS["tiny-1m"].num_params == 992_640
    assert model_lib.PRESETS["tiny-5m"].num_params == 4_738_688


# ---------------------------------------------------------------------------- params / axes


@pytest.mark.parametrize(
    "config",
    [
        _config(qk_norm=True),
        _config(qkv_bias=True, tie_embeddings=False),
        _config(head="value"),
        model_lib.PRESETS["qwen3-8b"],
    ],
    ids=["qk_norm", "bias-untied", "value", "qwen3-8b"],
)
def test_logical_axes_tree_matches_params(config):
    params = model_lib.abstract_params(config)
    axes = model_lib.logical_axes(config)
    is_axes = lambda x: isinstance(x, tuple)
    assert jax.tree.structure(axes, is_leaf=is_axes) == jax.tree.structure(params)
    flat_axes = jax.tree.leaves(axes, is_leaf=is_axes)
    for spec, names in zip(jax.tree.leaves(params), flat_axes):
        assert len(names) == len(spec.shape)
        assert set(names) <= AXIS_NAMES
    assert axes["embed_vd"] == ("vocab", "embed")
    assert axes["layers"][0]["attn"]["q_dnh"] == ("embed", "q_heads", "head_dim")
    assert axes["layers"][1]["mlp"]["down_fd"] == ("mlp", "embed")


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_init_params_values():
    config = _config(qkv_bias=True, qk_norm=True, param_dtype="bfloat16")
    params = model_lib.init_params(config, 0)
    attn = params["layers"][1]["attn"]
    assert params["embed_vd"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(attn["q_norm"]["scale"], np.float32), 1.0)
    np.testing.assert_array_equal(np.asarray(attn["k_bias_kh"], np.float32), 0.0)
    std = float(jnp.std(params["layers"][0]["mlp"]["up_df"].astype(jnp.float32)))
    assert 0.018 < std < 0.022
    # Same seed, same params; another seed differs.
    again = model_lib.init_params(config, 0)["embed_vd"]
    np.testing.assert_array_equal(np.asarray(again), np.asarray(params["embed_vd"]))
    other = model_lib.init_params(config, 1)["embed_vd"]
    assert not np.array_equal(np.asarray(other), np.asarray(params["embed_vd"]))


# ---------------------------------------------------------------------------- small pieces


def test_positions_and_masks_by_hand():
    mask_bt = jnp.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(
        model_lib.positions_from_mask(mask_bt), [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    )
    causal = np.asarray(model_lib.causal_mask(mask_bt[:1, 1:4]))  # keys: pad, real, real
    np.testing.assert_array_equal(causal[0], [[0, 0, 0], [0, 1, 0], [0, 1, 1]])
    # Two queries written at slots 2, 3 of a 5-slot cache whose slot 0 is padding.
    kv = jnp.array([[0, 1, 1, 1, 0]], bool)
    np.testing.assert_array_equal(
        model_lib.cache_mask(kv, 2, 2)[0], [[0, 1, 1, 0, 0], [0, 1, 1, 1, 0]]
    )


def test_rms_norm_by_hand():
    x = jnp.array([[3.0, 4.0]])  # mean square 12.5
    out = model_lib.rms_norm(x, jnp.array([1.0, 2.0]), eps=0.0)
    np.testing.assert_allclose(out, [[3 / 12.5**0.5, 8 / 12.5**0.5]], rtol=1e-6)


def test_rope_is_relative():
    """<rope(q, m), rope(k, n)> depends only on m - n; position 0 is the identity."""
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 1, 1, 16))
    rot = lambda x, p: model_lib.rope(x, jnp.array([[p]]), 10_000.0)
    np.testing.assert_allclose(rot(q, 0), q, rtol=1e-6)
    dots = [float(jnp.sum(rot(q, m) * rot(k, m - 3))) for m in (3, 10, 41)]
    np.testing.assert_allclose(dots, dots[0], rtol=1e-4)
    assert abs(float(jnp.sum(rot(q, 10) * rot(k, 9))) - dots[0]) > 1e-3


def test_token_logprobs_by_hand():
    logits_btv = jnp.log(jnp.array([[[1.0, 3.0], [2.0, 2.0]]]))
    np.testing.assert_allclose(
        model_lib.token_logprobs(logits_btv, jnp.array([[1, 0]])),
        [[np.log(0.75), np.log(0.5)]],
        rtol=1e-6,
    )


def test_kv_cache_bytes_and_shape():
    config = model_lib.PRESETS["qwen3-0.6b"]
    # 2 (k, v) x 28 layers x 8 kv heads x 128 dims x 2 bytes per token.
    assert model_lib.kv_cache_bytes(config, batch=1, length=1) == 114_688
    assert model_lib.kv_cache_bytes(config, 4, 10, dtype="float32") == 114_688 * 2 * 40
    cache = model_lib.init_cache(_config(), 3, 5)
    assert len(cache) == 2 and cache[0]["k"].shape == (3, 2, 5, 8)  # [B, K, S, H]


# ---------------------------------------------------------------------------- forward


@functools.cache
def _jit_forward(config):
    return jax.jit(functools.partial(model_lib.forward, config))


@functools.cache
def _jit_cache_step(config):
    return jax.jit(functools.partial(model_lib.forward_with_cache, config))


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_cache_forward_matches_full_forward_with_left_padding():
    config = _config(qk_norm=True, qkv_bias=True)
    params = _random_params(config)
    b, p, new = 3, 6, 5
    s = p + new
    rs = np.random.RandomState(0)
    tokens_bs = rs.randint(0, config.vocab_size, (b, s)).astype(np.int32)
    mask_bs = np.ones((b, s), bool)
    mask_bs[1, :2] = False  # left padding of the prompts
    mask_bs[2, :5] = False
    tokens_bs[~mask_bs] = 0
    positions_bs = np.asarray(model_lib.positions_from_mask(mask_bs))
    full_bsv = np.asarray(_jit_forward(config)(params, tokens_bs, input_mask_bt=mask_bs))
    assert full_bsv[mask_bs].std() > 0.3  # logits carry signal

    # Prefill the prompt into slots [0, p), then decode one token per step.
    cache = model_lib.init_cache(config, b, s)
    kv_mask_bs = np.zeros((b, s), bool)
    kv_mask_bs[:, :p] = mask_bs[:, :p]
    step = _jit_cache_step(config)
    logits_bpv, cache = step(params, tokens_bs[:, :p], positions_bs[:, :p], kv_mask_bs, cache, 0)
    prompt_mask = mask_bs[:, :p]
    np.testing.assert_allclose(
        np.asarray(logits_bpv)[prompt_mask], full_bsv[:, :p][prompt_mask], atol=1e-5
    )
    for i in range(p, s):
        kv_mask_bs[:, i] = True
        logits_b1v, cache = step(
            params, tokens_bs[:, i : i + 1], positions_bs[:, i : i + 1], kv_mask_bs, cache, i
        )
        np.testing.assert_allclose(np.asarray(logits_b1v)[:, 0], full_bsv[:, i], atol=1e-5)


def test_padded_row_equals_unpadded_prompt():
    config = _config(qk_norm=True)
    params = _random_params(config, seed=3)
    prompt = np.array([[5, 9, 13, 2, 40]], np.int32)
    alone = np.asarray(_jit_forward(config)(params, np.pad(prompt, ((0, 0), (0, 3)))))[:, :5]
    padded = np.pad(prompt, ((0, 0), (3, 0)))  # three left pads
    mask = np.arange(8)[None] >= 3
    out = np.asarray(_jit_forward(config)(params, padded, input_mask_bt=mask))[:, 3:]
    np.testing.assert_allclose(out, alone, atol=1e-5)
    # RoPE is relative: shifting every position changes nothing, stretching them does.
    positions = model_lib.positions_from_mask(mask)
    for scale, changed in [(1, False), (2, True)]:
        moved = _jit_forward(config)(
            params, padded, input_mask_bt=mask, positions_bt=scale * positions + 7
        )
        assert (np.abs(np.asarray(moved)[:, 3:] - alone).max() > 1e-3) == changed


@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_bf16_compute_runs_and_tracks_fp32():
    config32 = _config(qk_norm=True, tie_embeddings=False)
    params32 = _random_params(config32, seed=4)
    tokens_bt = np.random.RandomState(1).randint(0, 97, (2, 9)).astype(np.int32)
    want = np.asarray(_jit_forward(config32)(params32, tokens_bt))
    for param_dtype in ("float32", "bfloat16"):
        config = config32.replace(dtype="bfloat16", param_dtype=param_dtype)
        params = jax.tree.map(functools.partial(jnp.asarray, dtype=param_dtype), params32)
        got = _jit_forward(config)(params, tokens_bt)
        assert got.dtype == jnp.float32 and got.shape == (2, 9, 97)
        err = float(jnp.max(jnp.abs(got - want)))
        assert np.isfinite(err) and err < 0.1 * want.std(), (param_dtype, err, want.std())


def test_value_head():
    config = _config(head="value")
    params = _random_params(config, seed=5)
    assert "lm_head_dv" not in params and params["value_d"].shape == (32,)
    tokens_bt = np.arange(14, dtype=np.int32).reshape(2, 7)
    values_bt = _jit_forward(config)(params, tokens_bt)
    assert values_bt.shape == (2, 7) and values_bt.dtype == jnp.float32
    # The head is affine in (value_d, value_bias): check against zero and doubled weights.
    zero = {**params, "value_d": jnp.zeros(32), "value_bias": jnp.asarray(0.5)}
    np.testing.assert_allclose(_jit_forward(config)(zero, tokens_bt), 0.5)
    bias = params["value_bias"]
    double = {**params, "value_d": 2 * params["value_d"]}
    np.testing.assert_allclose(
        _jit_forward(config)(double, tokens_bt) - bias, 2 * (values_bt - bias), rtol=1e-5
    )
