"""The stacked-layer parameter layout (``ModelConfig.scan_layers``) against the per-layer
one: the same weights at init, the same forward, cache path, samples and GRPO update,
and every file format (base-policy .npz, run checkpoint, Hugging Face) read and written
in either layout."""

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.algorithms import grpo, learner
from rl_batch.models import hf as hf_lib
from rl_batch.models import sharding
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import sampler
from rl_batch.runs import pretrain, sections
from rl_batch.runs import run as run_lib
from rl_batch.runs.checkpoint import Checkpointer, CheckpointMismatchError
from tests.hf_fixtures import random_params, tiny_config
from tests.run_fixtures import LEARNER_MODEL, numpy_params

LOOP = LEARNER_MODEL
STACKED = LOOP.replace(scan_layers=True)


def _assert_trees_equal(got, want, rtol=0.0, atol=0.0):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(got)[0], jax.tree.leaves(want)):
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(w), rtol=rtol, atol=atol, err_msg=jax.tree_util.keystr(path)
        )


def test_init_stores_the_per_layer_weights_stacked():
    per_layer = model_lib.init_params(LOOP, 3)
    stacked = model_lib.init_params(STACKED, 3)
    assert not model_lib.is_stacked(per_layer) and model_lib.is_stacked(stacked)
    assert sorted(per_layer["layers"]) == list(range(LOOP.num_layers))
    q = stacked["layers"]["attn"]["q_dnh"]
    assert q.shape == (LOOP.num_layers, *per_layer["layers"][0]["attn"]["q_dnh"].shape)
    _assert_trees_equal(stacked, model_lib.stack_layers(per_layer))
    _assert_trees_equal(model_lib.unstack_layers(stacked), per_layer)
    _assert_trees_equal(model_lib.to_layout(LOOP, stacked), per_layer)
    assert model_lib.to_layout(STACKED, stacked) is stacked
    abstract = model_lib.abstract_params(STACKED)
    assert jax.tree.map(lambda x: x.shape, abstract) == jax.tree.map(lambda x: x.shape, stacked)
    axes = model_lib.logical_axes(STACKED)["layers"]
    assert axes["attn"]["q_dnh"] == ("layers", "embed", "q_heads", "head_dim")
    assert axes["input_norm"]["scale"] == ("layers", "embed")
    assert model_lib.logical_axes(STACKED)["embed_vd"] == ("vocab", "embed")
    # The layer axis is never sharded; the others keep their rules.
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    want = sharding.param_specs(LOOP, mesh)["layers"][0]
    got = sharding.param_specs(STACKED, mesh)["layers"]
    jax.tree.map(
        lambda g, w: g == jax.sharding.PartitionSpec(None, *w) or pytest.fail(f"{g} vs {w}"),
        got,
        want,
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
    )


def test_host_arrays_stack_on_the_host():
    stacked = model_lib.stack_layers(numpy_params(LOOP))
    assert isinstance(stacked["layers"]["attn"]["q_dnh"], np.ndarray)


def _prompts(b=3, p=4, seed=0):
    rng = np.random.default_rng(seed)
    mask = np.ones((b, p), bool)
    mask[1, :2] = False  # left padding
    return jnp.asarray(rng.integers(1, 64, (b, p)) * mask, jnp.int32), jnp.asarray(mask)


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_forward_and_cache_path_equal_the_per_layer_model():
    params = jax.tree.map(lambda x: 5 * x if x.ndim >= 2 else x, numpy_params(LOOP))
    stacked = model_lib.stack_layers(params)
    tokens, mask = _prompts()
    _assert_trees_equal(
        model_lib.forward(STACKED, stacked, tokens, input_mask_bt=mask),
        model_lib.forward(LOOP, params, tokens, input_mask_bt=mask),
        atol=1e-5,
    )
    # Prefill into a cache, then one decode step, on both layouts.
    b, p = tokens.shape
    positions = model_lib.positions_from_mask(mask)
    outs = {}
    for config, tree in ((LOOP, params), (STACKED, stacked)):
        cache = model_lib.init_cache(config, b, p + 1)
        kv_mask = jnp.concatenate([mask, jnp.ones((b, 1), bool)], axis=1)
        logits, cache = model_lib.forward_with_cache(
            config, tree, tokens, positions, kv_mask, cache, 0
        )
        step, cache = model_lib.forward_with_cache(
            config, tree, tokens[:, -1:], positions[:, -1:] + 1, kv_mask, cache, p
        )
        outs[config.scan_layers] = (logits, step, cache)
    _assert_trees_equal(outs[True], outs[False], atol=1e-6)
    # Training passes run one block under a scan; cache passes stay unrolled.
    scan_jaxpr = jax.make_jaxpr(functools.partial(model_lib.forward, STACKED))(stacked, tokens)
    assert [e.params["length"] for e in scan_jaxpr.jaxpr.eqns if e.primitive.name == "scan"] == [
        LOOP.num_layers
    ]


@pytest.mark.slow  # 11 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sampler_draws_the_same_tokens():
    params = numpy_params(LOOP)
    tokens, mask = _prompts(b=4)
    kwargs = dict(max_new_tokens=6, eos_id=1, pad_id=0, response_len=6)
    want = sampler.sample_batch(LOOP, params, tokens, mask, jax.random.key(1), **kwargs)
    got = sampler.sample_batch(
        STACKED, model_lib.stack_layers(params), tokens, mask, jax.random.key(1), **kwargs
    )
    np.testing.assert_array_equal(got.response_tokens, want.response_tokens)
    np.testing.assert_allclose(got.response_logprobs, want.response_logprobs, atol=1e-5)


@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_grpo_update_on_the_stack_equals_the_per_layer_update():
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = learner.make_optimizer(1e-3)
    tokens, mask = _prompts(b=4)
    r = 5
    response_mask = np.arange(r)[None, :] < np.array([5, 2, 4, 1])[:, None]
    rng = np.random.default_rng(2)
    batch = learner.Batch(
        prompt_tokens=tokens,
        prompt_mask=mask,
        response_tokens=jnp.asarray(rng.integers(1, 64, (4, r)) * response_mask, jnp.int32),
        response_mask=jnp.asarray(response_mask),
        advantages=jnp.asarray([1.0, -0.5, 2.0, -1.0], jnp.float32),
    )
    params = numpy_params(LOOP)
    results = {}
    for config, tree in ((LOOP, params), (STACKED, model_lib.stack_layers(params))):
        tree = jax.tree.map(jnp.array, tree)
        state = learner.init_train_state(config, tree, optimizer, mesh=mesh)
        update = grpo.make_update_fn(config, grpo.GRPOConfig(), optimizer, mesh)
        for _ in range(2):
            state, metrics = update(state, batch, jax.random.key(0))
        results[config.scan_layers] = (state.params, metrics["loss"], metrics["grad_norm"])
    got_params, got_loss, got_norm = results[True]
    want_params, want_loss, want_norm = results[False]
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(got_norm, want_norm, rtol=1e-5)
    _assert_trees_equal(got_params, model_lib.stack_layers(want_params), atol=1e-6)
    # A tree in the other layout is refused before compute.
    with pytest.raises(ValueError, match="params do not match"):
        learner.init_train_state(STACKED, jax.tree.map(jnp.array, params), optimizer, mesh=mesh)


def test_params_file_reads_either_layout(tmp_path):
    params = numpy_params(LOOP)
    per_layer_file = str(tmp_path / "per_layer.npz")
    stacked_file = str(tmp_path / "stacked.npz")
    pretrain.write_params_file(per_layer_file, params)
    pretrain.write_params_file(stacked_file, model_lib.stack_layers(params))
    for path in (per_layer_file, stacked_file):
        _assert_trees_equal(
            pretrain.load_params_file(path, STACKED), model_lib.stack_layers(params)
        )
        _assert_trees_equal(pretrain.load_params_file(path, LOOP), params)
    with pytest.raises(ValueError, match=r"stacked.npz: no array layers/attn/k_dkh of shape \(3, "):
        pretrain.load_params_file(stacked_file, STACKED.replace(num_layers=3))


def test_run_checkpoint_restores_into_either_layout(tmp_path):
    params = jax.tree.map(jnp.asarray, numpy_params(LOOP))
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, {"params": params}, {})
    _assert_trees_equal(
        run_lib.restore_either_layout(ckpt, STACKED), model_lib.stack_layers(params)
    )
    _assert_trees_equal(run_lib.restore_either_layout(ckpt, LOOP), params)
    # A model that matches neither layout: the error compares with the model's own
    # (stacked) layout, which has no per-layer arrays.
    want = r"layers/0/attn/q_dnh: checkpoint \(32, 4, 8\), expected None"
    with pytest.raises(CheckpointMismatchError, match=want):
        run_lib.restore_either_layout(ckpt, STACKED.replace(num_layers=3))
    ckpt.close()


def test_initial_params_from_a_per_layer_checkpoint(tmp_path):
    params = jax.tree.map(jnp.asarray, numpy_params(LOOP))
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, {"params": params}, {})
    ckpt.close()
    init = sections.Init(source="checkpoint", path=str(tmp_path / "ckpt"))
    spec = types.SimpleNamespace(init=init, model=STACKED)  # (the two fields it reads)
    _assert_trees_equal(run_lib.initial_params(spec), model_lib.stack_layers(params))


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_hf_checkpoint_maps_to_and_from_the_stack(tmp_path, family):
    config = tiny_config(family)
    params = random_params(config, seed=4)
    stacked_config = config.replace(scan_layers=True)
    hf_lib.save_hf_checkpoint(config, params, tmp_path / "per_layer", model_type=family)
    hf_lib.save_hf_checkpoint(
        stacked_config, model_lib.stack_layers(params), tmp_path / "stacked", model_type=family
    )
    # The same files from either layout.
    from safetensors.numpy import load_file

    a = load_file(str(tmp_path / "per_layer" / "model.safetensors"))
    b = load_file(str(tmp_path / "stacked" / "model.safetensors"))
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    assert (tmp_path / "per_layer" / "config.json").read_text() == (
        tmp_path / "stacked" / "config.json"
    ).read_text()
    got_config, got = hf_lib.load_hf_checkpoint(tmp_path / "per_layer", scan_layers=True)
    assert got_config == stacked_config
    _assert_trees_equal(got, model_lib.stack_layers(params))
    _, host = hf_lib.load_hf_checkpoint(tmp_path / "per_layer", scan_layers=True, as_numpy=True)
    assert isinstance(host["layers"]["mlp"]["up_df"], np.ndarray)


@pytest.mark.slow  # 21 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_stacked_run_resumes_exports_and_matches_the_per_layer_run(tmp_path):
    """End to end: a run of the stacked model, stopped and resumed from its checkpoint,
    logs the updates of an uninterrupted per-layer run (same seed), and its export is
    the per-layer HF checkpoint of its params."""
    from rl_batch import artifacts
    from rl_batch.runs import export
    from tests.run_fixtures import assert_same_records, deterministic, tiny_run_config

    work = str(tmp_path / "work")
    loop_dir, stacked_dir = str(tmp_path / "loop"), str(tmp_path / "stacked")
    run_lib.run(tiny_run_config(work, loop_dir, budget_responses=64), progress=False)
    for budget in (32, 64):
        c = tiny_run_config(work, stacked_dir, budget_responses=budget)
        c.model.overrides.scan_layers = True
        run_lib.run(c, progress=False)
    loop = deterministic(artifacts.read_metrics(loop_dir), "update")
    stacked = deterministic(artifacts.read_metrics(stacked_dir), "update")
    assert len(loop) == len(stacked) == 4
    assert_same_records(loop, stacked, rel=1e-5, abs=1e-7)

    out = str(tmp_path / "hf")
    export.export_run(stacked_dir, out)
    hf_config, per_layer = hf_lib.load_hf_checkpoint(out, as_numpy=True)
    assert not hf_config.scan_layers and not model_lib.is_stacked(per_layer)
    # (The run stored its blocks stacked: a per-layer tree would not match this.)
    ckpt = Checkpointer(str(tmp_path / "stacked" / artifacts.CHECKPOINT_DIR))
    stacked_params = ckpt.restore_policy_params(
        model_lib.abstract_params(hf_config.replace(scan_layers=True))
    )
    ckpt.close()
    _assert_trees_equal(model_lib.stack_layers(per_layer), stacked_params)
