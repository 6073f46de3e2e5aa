"""Mesh, sharding rules and sharded GRPO updates on 8 fake CPU devices (conftest.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from rl_batch.algorithms import grpo, learner
from rl_batch.models import sharding
from rl_batch.models import transformer as model_lib
from tests.run_fixtures import LEARNER_MODEL, numpy_params

CFG = LEARNER_MODEL
B, P_LEN, R = 8, 4, 6
KEY = jax.random.key(0)
OPT = learner.make_optimizer(1e-3, max_grad_norm=1.0)


def test_eight_fake_devices():
    assert jax.device_count() == 8, "tests/conftest.py should force 8 host devices"


# -------------------------------------------------------------------------------- mesh


def test_make_mesh_shapes():
    mesh = sharding.make_mesh()
    assert mesh.axis_names == ("data", "fsdp", "expert", "tensor")
    assert dict(mesh.shape) == {"data": 8, "fsdp": 1, "expert": 1, "tensor": 1}
    shape = dict(sharding.make_mesh(fsdp=2, tensor=2).shape)
    assert shape == {"data": 2, "fsdp": 2, "expert": 1, "tensor": 2}
    shape = dict(sharding.make_mesh(2, 4, 1).shape)
    assert shape == {"data": 2, "fsdp": 4, "expert": 1, "tensor": 1}
    shape = dict(sharding.make_mesh(2, expert=4).shape)
    assert shape == {"data": 2, "fsdp": 1, "expert": 4, "tensor": 1}
    one = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    assert one.size == 1


def test_make_mesh_errors():
    with pytest.raises(ValueError, match=r"data=3 x fsdp=1 x tensor=1 = 3 .* 8 available"):
        sharding.make_mesh(3)
    with pytest.raises(ValueError, match=r"8 devices are not divisible by fsdp=3 x tensor=1"):
        sharding.make_mesh(fsdp=3)
    with pytest.raises(ValueError, match="tensor=0"):
        sharding.make_mesh(tensor=0)


# ------------------------------------------------------------------------------- rules


def test_logical_to_spec_rules_and_fallbacks():
    mesh = sharding.make_mesh(2, 2, 2)
    # embed -> fsdp, q_heads -> tensor, head_dim replicated.
    assert sharding.logical_to_spec(("embed", "q_heads", "head_dim"), (32, 4, 8), mesh) == P(
        "fsdp", "tensor", None
    )
    # Not divisible: 3 heads on a 2-way tensor axis -> that dimension replicated.
    assert sharding.logical_to_spec(("embed", "q_heads"), (32, 3), mesh) == P("fsdp", None)
    # A mesh axis is used once per array: with mlp also mapped to fsdp, the second
    # dimension falls back to replicated.
    rules = (("embed", "fsdp"), ("mlp", "fsdp"))
    assert sharding.logical_to_spec(("embed", "mlp"), (32, 64), mesh, rules) == P("fsdp", None)
    assert sharding.logical_to_spec(("mlp", "embed"), (64, 32), mesh, rules) == P("fsdp", None)
    # Size-1 mesh axes give unsharded dims; scalars give P().
    data_only = sharding.make_mesh()
    assert sharding.logical_to_spec(("vocab", "embed"), (64, 32), data_only) == P(None, None)
    assert sharding.logical_to_spec((), (), mesh) == P()
    with pytest.raises(ValueError, match=r"logical axis 'experts' has no sharding rule"):
        sharding.logical_to_spec(("experts",), (4,), mesh)


def test_param_shardings_tree():
    mesh = sharding.make_mesh(2, 2, 2)
    specs = sharding.describe_shardings(sharding.param_shardings(CFG, mesh))
    assert specs["['embed_vd']"] == str(P("tensor", "fsdp"))
    assert specs["['layers'][0]['attn']['q_dnh']"] == str(P("fsdp", "tensor", None))
    assert specs["['layers'][1]['attn']['k_dkh']"] == str(P("fsdp", "tensor", None))
    assert specs["['layers'][0]['attn']['o_nhd']"] == str(P("tensor", None, "fsdp"))
    assert specs["['layers'][0]['mlp']['down_fd']"] == str(P("tensor", "fsdp"))
    assert specs["['layers'][0]['attn']['q_norm']['scale']"] == str(P(None))
    assert specs["['final_norm']['scale']"] == str(P("fsdp"))
    # 2 KV heads on a 4-way tensor axis: replicated; 4 query heads: sharded.
    specs = sharding.describe_shardings(sharding.param_shardings(CFG, sharding.make_mesh(2, 1, 4)))
    assert specs["['layers'][0]['attn']['k_dkh']"] == str(P(None, None, None))
    assert specs["['layers'][0]['attn']['q_dnh']"] == str(P(None, "tensor", None))


def test_batch_sharding_and_divisibility():
    mesh = sharding.make_mesh(2, 2, 2)
    assert sharding.batch_shard_count(mesh) == 4
    x = sharding.shard_batch({"a": np.zeros((8, 3))}, mesh)["a"]
    assert x.sharding.spec == P(("data", "fsdp", "expert"))
    rows = {(s.index[0].start, s.index[0].stop) for s in x.addressable_shards}
    assert rows == {(0, 2), (2, 4), (4, 6), (6, 8)}  # 4 row blocks, each on 2 devices
    with pytest.raises(ValueError, match=r"batch size 6 is not divisible by the 4 batch shards"):
        sharding.shard_batch({"a": np.zeros((6, 3))}, mesh)


# ----------------------------------------------------------------------- train state


@pytest.fixture(scope="module")
def params():
    return numpy_params(CFG)


def test_train_state_is_sharded(params):
    mesh = sharding.make_mesh(2, 2, 2)
    state = learner.init_train_state(CFG, params, OPT, mesh=mesh)
    q = state.params["layers"][0]["attn"]["q_dnh"]
    assert q.sharding.spec == P("fsdp", "tensor", None)
    assert q.addressable_shards[0].data.shape == (16, 2, 8)  # 32 / fsdp 2, 4 / tensor 2
    assert state.params["embed_vd"].sharding.spec == P("tensor", "fsdp")
    # Adam moments follow the params; counts and injected hyperparameters replicated.
    adam_state = state.opt_state.inner_state[1][0]
    assert adam_state.mu["layers"][0]["attn"]["q_dnh"].sharding.spec == P("fsdp", "tensor", None)
    assert adam_state.nu["embed_vd"].sharding.spec == P("tensor", "fsdp")
    assert adam_state.count.sharding.spec == P()
    assert state.opt_state.hyperparams["learning_rate"].sharding.spec == P()
    assert state.step.sharding.spec == P()
    with pytest.raises(ValueError, match=r"param \['embed_vd'\] has shape \(3, 32\)"):
        bad = dict(params, embed_vd=np.zeros((3, 32), np.float32))
        learner.init_train_state(CFG, bad, OPT)


# ------------------------------------------------------------- sharded == single device


def make_batch() -> learner.Batch:
    rng = np.random.default_rng(1)
    lengths = np.array([6, 3, 5, 1, 6, 2, 4, 6])
    prompt_mask = np.ones((B, P_LEN), bool)
    prompt_mask[1, :2] = False
    response_mask = np.arange(R)[None, :] < lengths[:, None]
    return learner.Batch(
        prompt_tokens=jnp.asarray(rng.integers(1, 64, (B, P_LEN)) * prompt_mask, jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        response_tokens=jnp.asarray(rng.integers(1, 64, (B, R)) * response_mask, jnp.int32),
        response_mask=jnp.asarray(response_mask),
        advantages=jnp.asarray([1.0, 0.5, 2.0, 1.0, -1.0, -0.5, -2.0, -1.0]),
    )


@functools.cache
def run_update(mesh_shape, **config):
    """One update from the same params on a mesh; returns host params and metrics."""
    devices = jax.devices()[: int(np.prod(mesh_shape))]
    mesh = sharding.make_mesh(*mesh_shape, devices=devices)
    state = learner.init_train_state(CFG, numpy_params(CFG), OPT, mesh=mesh)
    update_fn = grpo.make_update_fn(CFG, grpo.GRPOConfig(**config), OPT, mesh)
    state, metrics = update_fn(state, sharding.shard_batch(make_batch(), mesh), KEY)
    specs = {
        "q_dnh": state.params["layers"][0]["attn"]["q_dnh"].sharding.spec,
        "embed_vd": state.params["embed_vd"].sharding.spec,
    }
    host = jax.tree.map(np.asarray, (state.params, state.opt_state, metrics))
    return host, specs


def assert_same_update(a, b):
    params_a, opt_a, metrics_a = a
    params_b, opt_b, metrics_b = b
    flat_a = np.concatenate([x.ravel() for x in jax.tree.leaves(params_a)])
    flat_b = np.concatenate([x.ravel() for x in jax.tree.leaves(params_b)])
    assert np.linalg.norm(flat_a - flat_b) / np.linalg.norm(flat_b) < 1e-5
    np.testing.assert_allclose(flat_a, flat_b, rtol=1e-5, atol=1e-6)
    for x, y in zip(jax.tree.leaves(opt_a), jax.tree.leaves(opt_b)):
        # Float32 sums in another order: near-zero moments differ by ~1e-5 of the leaf's
        # scale, so the absolute tolerance follows that scale.
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5 * float(np.abs(y).max()) + 1e-12)
    assert metrics_a.keys() == metrics_b.keys()
    for key in metrics_a:
        np.testing.assert_allclose(
            metrics_a[key], metrics_b[key], rtol=1e-5, atol=1e-7, err_msg=key
        )


@pytest.mark.parametrize("mesh_shape", [(2, 2, 2), (8, 1, 1)])
@pytest.mark.slow  # 25 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sharded_update_equals_single_device(mesh_shape):
    single, _ = run_update((1, 1, 1))
    sharded, specs = run_update(mesh_shape)
    assert_same_update(sharded, single)
    assert float(single[2]["skipped"]) == 0.0 and float(single[2]["grad_norm"]) > 0
    if mesh_shape == (2, 2, 2):
        assert specs == {"q_dnh": P("fsdp", "tensor", None), "embed_vd": P("tensor", "fsdp")}
    else:
        assert specs == {"q_dnh": P(None, None, None), "embed_vd": P(None, None)}


@pytest.mark.slow  # 19 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sharded_minibatches_and_micro_batches():
    # 2 minibatches of 4, each in 2 micro-batches of 2, on a mesh with 2 batch shards.
    config = dict(num_minibatches=2, micro_batches=2)
    single, _ = run_update((1, 1, 1), **config)
    sharded, _ = run_update((2, 1, 4), **config)
    assert_same_update(sharded, single)
    assert float(single[2]["num_updates"]) == 2.0


def test_micro_batch_must_split_over_batch_shards(params):
    # Micro-batches of 2 sequences cannot spread over 4 batch shards.
    mesh = sharding.make_mesh(2, 2, 2)
    state = learner.init_train_state(CFG, params, OPT, mesh=mesh)
    update_fn = grpo.make_update_fn(CFG, grpo.GRPOConfig(micro_batches=4), OPT, mesh)
    with pytest.raises(ValueError, match=r"micro-batch of 2 sequences .* 4 batch shards"):
        update_fn(state, sharding.shard_batch(make_batch(), mesh), KEY)


def test_opt_state_shardings_plain_optimizer():
    # Works for any optax optimizer, e.g. plain Adam without injected hyperparameters.
    mesh = sharding.make_mesh(2, 2, 2)
    shardings = sharding.param_shardings(CFG, mesh)
    opt_sh = sharding.opt_state_shardings(
        optax.adam(1e-3), shardings, model_lib.abstract_params(CFG)
    )
    assert opt_sh[0].mu["embed_vd"].spec == P("tensor", "fsdp")
    assert opt_sh[0].count.spec == P()
