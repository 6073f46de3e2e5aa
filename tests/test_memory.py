"""Memory features of the model against its plain path (fp32, tiny shapes): block
rematerialisation, ``jax.nn.dot_product_attention``, and their combination in a GRPO
gradient."""

import dataclasses
import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.algorithms import grpo as grpo_lib
from rl_batch.algorithms import learner
from rl_batch.models import transformer as model_lib
from tests.run_fixtures import LEARNER_MODEL, numpy_params

CFG = LEARNER_MODEL
B, P, R = 3, 4, 5


def _params(config, seed=0):
    # std 0.1 weights so that attention and logits are far from uniform.
    return jax.tree.map(lambda x: x * 5 if x.ndim >= 2 else x, numpy_params(config, seed))


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((B, P), bool)
    prompt_mask[1, :2] = False  # left padding: rows whose first queries see no key
    prompt_mask[2, :3] = False
    response_mask = np.arange(R)[None, :] < np.array([5, 2, 4])[:, None]
    return learner.Batch(
        prompt_tokens=jnp.asarray(rng.integers(1, 64, (B, P)) * prompt_mask, jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        response_tokens=jnp.asarray(rng.integers(1, 64, (B, R)) * response_mask, jnp.int32),
        response_mask=jnp.asarray(response_mask),
        advantages=jnp.asarray([1.0, -0.5, 2.0], jnp.float32),
    )


def _grpo_grads(config, params, batch):
    """Gradient of the GRPO loss (token mean) through the whole model."""
    mask = batch.response_mask
    loss_fn = functools.partial(
        grpo_lib.grpo_loss,
        config,
        grpo_lib.GRPOConfig(),
        num_tokens=jnp.sum(mask.astype(jnp.float32)),
        num_seqs=B,
        max_len=R,
    )
    return jax.jit(jax.grad(lambda p: loss_fn(p, batch)[0]))(params)


def _forward_objective(config, params, batch):
    """A weighted sum of all logits (every position, padding included): its gradient
    reaches every weight through every attention row."""
    tokens = jnp.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
    mask = jnp.concatenate([batch.prompt_mask, batch.response_mask], axis=1)
    logits = model_lib.forward(config, params, tokens, input_mask_bt=mask)
    w = jnp.sin(jnp.arange(logits.size, dtype=jnp.float32)).reshape(logits.shape)
    return jnp.sum(jnp.where(mask[..., None], logits * w, 0.0))


def _assert_trees_close(got, want, rel):
    """Every leaf within ``rel`` of the reference, relative to that leaf's largest entry
    (fp32 rounding differs where XLA fuses a rematerialised or re-ordered computation
    differently, so an entry near 0 cannot be held to a relative bound of its own)."""
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
        scale = float(jnp.max(jnp.abs(w)))
        err = float(jnp.max(jnp.abs(jnp.asarray(g) - jnp.asarray(w))))
        assert err <= rel * max(scale, 1e-30), (jax.tree_util.keystr(path), err, scale)


def _primitives(jaxpr) -> set[str]:
    out = set()
    for eqn in jaxpr.eqns:
        out.add(eqn.primitive.name)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out |= _primitives(sub)
    return out


def _shapes(jaxpr) -> set[tuple[int, ...]]:
    out = set()
    for eqn in jaxpr.eqns:
        out |= {tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars}
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            out |= _shapes(sub)
    return out


# ----------------------------------------------------------------------------- remat


def test_config_rejects_unknown_memory_settings():
    with pytest.raises(ValueError, match="ModelConfig.remat='some'"):
        CFG.replace(remat="some")
    with pytest.raises(ValueError, match="ModelConfig.attention='flash'"):
        CFG.replace(attention="flash")
    with pytest.raises(ValueError, match="logits_chunk must be a non-negative int"):
        CFG.replace(logits_chunk=-1)


def test_memory_defaults_apply_to_real_models_only():
    for name in ("qwen3-0.6b", "qwen3-1.7b", "qwen2.5-0.5b"):
        c = model_lib.with_memory_defaults(model_lib.get_preset(name))
        assert (c.remat, c.attention, c.logits_chunk) == ("full", "auto", 512), name
        assert c.scan_layers, name
    moe = model_lib.with_memory_defaults(model_lib.get_preset("qwen3-30b-a3b"))
    assert (moe.remat, moe.logits_chunk, moe.scan_layers) == ("full", 512, False)
    tiny = model_lib.get_preset("tiny-5m")
    assert (tiny.remat, tiny.attention, tiny.logits_chunk) == ("none", "einsum", 0)
    assert model_lib.with_memory_defaults(tiny) == tiny


@pytest.mark.parametrize("policy", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable"])
@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_remat_gradients_equal_plain(policy):
    params = _params(CFG)
    batch = _batch()
    want = _grpo_grads(CFG, params, batch)
    remat = CFG.replace(remat=policy)
    got = _grpo_grads(remat, params, batch)
    _assert_trees_close(got, want, rel=1e-6)
    # The remat really is there (a test of the switch, not only of equal numbers).
    jaxpr = jax.make_jaxpr(jax.grad(functools.partial(_forward_objective, remat)))(
        params, batch
    ).jaxpr
    assert {"remat2", "checkpoint"} & _primitives(jaxpr)
    plain = jax.make_jaxpr(jax.grad(functools.partial(_forward_objective, CFG)))(
        params, batch
    ).jaxpr
    assert not {"remat2", "checkpoint"} & _primitives(plain)


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_remat_does_not_touch_the_cached_path():
    """Sampling (a KV cache) runs the blocks as they are: same logits and cache."""
    params = _params(CFG)
    batch = _batch()
    positions = model_lib.positions_from_mask(batch.prompt_mask)
    outs = []
    for config in (CFG, CFG.replace(remat="full")):
        cache = model_lib.init_cache(config, B, P)
        outs.append(
            model_lib.forward_with_cache(
                config, params, batch.prompt_tokens, positions, batch.prompt_mask, cache, 0
            )
        )
    _assert_trees_close(outs[1], outs[0], rel=0)


# ------------------------------------------------------------------------- attention


def test_auto_attention_is_einsum_on_cpu():
    assert jax.default_backend() == "cpu"
    assert model_lib.attention_impl(CFG.replace(attention="auto")) == "einsum"
    assert model_lib.attention_impl(CFG.replace(attention="xla")) == "xla"


@pytest.mark.parametrize(
    "backend, dtype, head_dim, want",
    [
        ("gpu", "bfloat16", 8, "cudnn"),
        ("gpu", "float32", 8, "xla"),  # cuDNN flash attention has no fp32
        ("gpu", "bfloat16", 256, "xla"),
        ("tpu", "bfloat16", 8, "xla"),
    ],
)
def test_auto_attention_on_accelerators(monkeypatch, backend, dtype, head_dim, want):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    config = CFG.replace(attention="auto", dtype=dtype, head_dim=head_dim)
    assert model_lib.attention_impl(config) == want


@pytest.mark.slow  # 15 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_xla_attention_forward_and_gradients_equal_einsum():
    params = _params(CFG)
    batch = _batch()
    xla = CFG.replace(attention="xla")
    tokens = jnp.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
    mask = jnp.concatenate([batch.prompt_mask, batch.response_mask], axis=1)
    want = model_lib.forward(CFG, params, tokens, input_mask_bt=mask)
    got = model_lib.forward(xla, params, tokens, input_mask_bt=mask)
    assert bool(jnp.all(jnp.isfinite(got)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    g_want = jax.grad(functools.partial(_forward_objective, CFG))(params, batch)
    g_got = jax.grad(functools.partial(_forward_objective, xla))(params, batch)
    _assert_trees_close(g_got, g_want, rel=1e-5)
    # The einsum path's [B, K, G * T, S] scores are absent from the xla path.
    t = P + R
    g = CFG.num_heads // CFG.num_kv_heads
    scores = (B, CFG.num_kv_heads, g * t, t)
    forward = functools.partial(model_lib.forward, input_mask_bt=mask)
    assert scores in _shapes(jax.make_jaxpr(functools.partial(forward, CFG))(params, tokens).jaxpr)
    assert scores not in _shapes(
        jax.make_jaxpr(functools.partial(forward, xla))(params, tokens).jaxpr
    )


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_xla_attention_prefill_and_decode_equal_einsum():
    params = _params(CFG)
    batch = _batch()
    positions = model_lib.positions_from_mask(batch.prompt_mask)
    s = P + 2
    outs = []
    for config in (CFG, CFG.replace(attention="xla")):
        cache = model_lib.init_cache(config, B, P)
        logits_pre, cache = model_lib.forward_with_cache(
            config, params, batch.prompt_tokens, positions, batch.prompt_mask, cache, 0
        )
        # One decode step into a padded cache (einsum in both: T = 1).
        cache = [
            {k: jnp.pad(v, ((0, 0), (0, 0), (0, s - P), (0, 0))) for k, v in layer.items()}
            for layer in cache
        ]
        kv_mask = jnp.concatenate([batch.prompt_mask, jnp.array([[True, False]] * B)], axis=1)
        logits_dec, _ = model_lib.forward_with_cache(
            config, params, batch.response_tokens[:, :1], positions[:, -1:] + 1, kv_mask, cache, P
        )
        outs.append((logits_pre, logits_dec))
    _assert_trees_close(outs[1], outs[0], rel=1e-5)


def test_all_memory_features_together_equal_plain_grpo_gradient():
    params = _params(CFG)
    batch = _batch()
    want = _grpo_grads(CFG, params, batch)
    lean = CFG.replace(remat="full", attention="xla", logits_chunk=2)
    got = _grpo_grads(lean, params, batch)
    assert max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(want)) > 1e-3
    _assert_trees_close(got, want, rel=1e-5)


# -------------------------------------------------------------------- mixed precision


@pytest.mark.parametrize("master", [True, False])
@pytest.mark.slow  # 22 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_tiny_lr_update_changes_every_weight_with_a_gradient(master):
    """bf16 compute; float32 master weights keep an lr 1e-7 Adam step, bf16 storage
    rounds most of it away (the contrast shows the test can fail)."""
    from rl_batch.models import sharding

    bf16 = CFG.replace(dtype="bfloat16", param_dtype="bfloat16")
    config = model_lib.with_master_weights(bf16) if master else bf16
    assert config.param_dtype == ("float32" if master else "bfloat16")
    params = jax.tree.map(lambda x: jnp.asarray(x, config.param_dtype), _params(CFG))
    batch = _batch()
    grads = _grpo_grads(config, params, batch)
    should_change = [np.asarray(g) != 0 for g in jax.tree.leaves(grads)]
    assert sum(int(s.sum()) for s in should_change) > 0.9 * sum(s.size for s in should_change)

    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = learner.make_optimizer(1e-7)
    state = learner.init_train_state(config, params, optimizer, mesh=mesh)
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim >= 1]
    assert {x.dtype for x in moments} == {jnp.dtype(config.param_dtype)}
    before = [np.asarray(x) for x in jax.tree.leaves(state.params)]
    update = grpo_lib.make_update_fn(config, grpo_lib.GRPOConfig(), optimizer, mesh)
    state, metrics = update(state, batch, jax.random.key(0))
    assert float(metrics["skipped"]) == 0.0
    changed = [np.asarray(a) != b for a, b in zip(jax.tree.leaves(state.params), before)]
    n_should = sum(int(s.sum()) for s in should_change)
    n_changed = sum(int((c & s).sum()) for c, s in zip(changed, should_change))
    if master:
        for (path, _), c, s in zip(
            jax.tree_util.tree_flatten_with_path(grads)[0], changed, should_change
        ):
            np.testing.assert_array_equal(c, s, err_msg=jax.tree_util.keystr(path))
    else:
        assert n_changed < n_should


# ------------------------------------------------------------------------ run config


def _run_config(**model):
    from experiments.configs import base

    c = base.run_config()
    c.task.name = "math"  # not a synthetic task: the preset's vocabulary stays
    for key, value in model.items():
        c.model[key] = value
    return c


def test_run_config_memory_and_precision_defaults_follow_model_size():
    from rl_batch.runs import config as config_lib

    real = config_lib.make_model_config(_run_config(preset="qwen3-0.6b"))
    preset = model_lib.get_preset("qwen3-0.6b")
    assert (real.remat, real.attention, real.logits_chunk) == ("full", "auto", 512)
    assert (real.param_dtype, real.dtype) == ("float32", preset.dtype) == ("float32", "bfloat16")
    # Nothing else changed.
    undone = {k: getattr(preset, k) for k in (*model_lib.STUDY_MEMORY, "param_dtype")}
    assert real.replace(**undone) == preset
    bf16 = config_lib.make_model_config(_run_config(preset="qwen3-0.6b", master_weights=False))
    assert bf16.param_dtype == "bfloat16"
    tiny = config_lib.make_model_config(_run_config(preset="tiny-1m"))
    assert tiny == model_lib.get_preset("tiny-1m")


def test_model_overrides_are_typed_placeholders():
    """Every ModelConfig field can be set on a fresh config (what --config.model.overrides.X
    does), unset ones stay out, and an override beats the size defaults."""
    from rl_batch.runs import config as config_lib

    c = _run_config(preset="qwen3-0.6b")
    assert set(c.model.overrides.to_dict()) == {
        f.name for f in dataclasses.fields(model_lib.ModelConfig)
    }
    c.model.overrides.vocab_size = 1000
    c.model.overrides.remat = "none"
    c.model.overrides.rope_theta = 5e5
    got = config_lib.make_model_config(c)
    assert (got.vocab_size, got.remat, got.rope_theta, got.logits_chunk) == (1000, "none", 5e5, 512)
    with pytest.raises(TypeError):
        c.model.overrides.num_layers = "many"


def test_micro_batches_from_a_sequence_budget():
    from rl_batch.runs import config as config_lib

    assert config_lib.micro_batches_for(128, 32) == 4
    assert config_lib.micro_batches_for(96, 40) == 3  # 32 each: 2 pieces of 48 exceed 40
    assert config_lib.micro_batches_for(16, 64) == 1
    assert config_lib.micro_batches_for(12, 5, shards=2) == 3  # 4 each; 6 > 5
    assert config_lib.micro_batches_for(8, 1, shards=2) is None


def test_resolve_derives_micro_batches_from_micro_batch_seqs():
    from ml_collections import ConfigDict

    from experiments.configs import base
    from rl_batch.runs import config as config_lib

    c = base.run_config()
    c.run_dir = "/tmp/unused"
    c.prompts, c.group_size = 16, 8
    c.grpo.micro_batches = 16  # the input; the budget wins
    c.grpo.micro_batch_seqs = 32
    once = config_lib.resolve(c, 1)
    assert once.micro_batches == 128 // 32
    assert once.inputs.grpo.micro_batches == 16  # the input is kept
    assert config_lib.resolve(ConfigDict(once.to_json()), 1) == once  # idempotent
    c.grpo.micro_batch_seqs = 1
    with pytest.raises(ValueError, match="grpo.micro_batch_seqs=1: no micro-batch count"):
        config_lib.resolve(c, 2)  # pieces of 1 sequence cannot split over 2 devices


# ---------------------------------------------------------------------- scanned layers


@pytest.mark.parametrize("remat", ["none", "full"])
@pytest.mark.slow  # 19 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_scanned_layers_equal_the_loop(remat):
    """The forward and gradients of the stacked-layer scan against the per-layer loop
    (the layouts themselves: ``tests/test_stacked_layers.py``)."""
    params = _params(CFG)
    stacked = model_lib.stack_layers(params)
    batch = _batch()
    loop = CFG.replace(remat=remat)
    scanned = CFG.replace(remat=remat, scan_layers=True)
    tokens = jnp.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
    mask = jnp.concatenate([batch.prompt_mask, batch.response_mask], axis=1)
    want = model_lib.forward(loop, params, tokens, input_mask_bt=mask)
    got = model_lib.forward(scanned, stacked, tokens, input_mask_bt=mask)
    _assert_trees_close(got, want, rel=1e-5)
    g_want = jax.grad(functools.partial(_forward_objective, loop))(params, batch)
    g_got = jax.grad(functools.partial(_forward_objective, scanned))(stacked, batch)
    _assert_trees_close(g_got, model_lib.stack_layers(g_want), rel=1e-5)
    _assert_trees_close(
        _grpo_grads(scanned, stacked, batch),
        model_lib.stack_layers(_grpo_grads(loop, params, batch)),
        1e-5,
    )
    # One block in the program, run num_layers times.
    jaxpr = jax.make_jaxpr(functools.partial(model_lib.forward, scanned))(stacked, tokens).jaxpr
    scans = [e for e in jaxpr.eqns if e.primitive.name == "scan"]
    assert [e.params["length"] for e in scans] == [CFG.num_layers]
    loop_jaxpr = jax.make_jaxpr(functools.partial(model_lib.forward, loop))(params, tokens).jaxpr
    assert not [e for e in loop_jaxpr.eqns if e.primitive.name == "scan"]
