"""Expert parallelism on 8 fake CPU devices: expert weights split over the ``expert`` mesh
axis, a sharded MoE GRPO update equal to the single-device one, the sampler on the same
mesh, and the experts-not-divisible error."""

import functools
import re

import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from rl_batch.algorithms import grpo, learner
from rl_batch.models import sharding
from rl_batch.rollout import sampler as sampler_lib
from tests.test_learner import make_batch
from tests.test_moe_learner import MOE_MODEL, _params
from tests.test_sharding import assert_same_update

OPT = learner.make_optimizer(1e-3, max_grad_norm=1.0)
# Plain SGD for the equality test: Adam's first step g / (|g| + eps) turns float noise in
# near-zero gradient entries into differences of the order of the learning rate.
SGD = optax.sgd(0.1)
KEY = jax.random.key(0)


def test_expert_weights_are_sharded_over_the_expert_axis():
    mesh = sharding.make_mesh(1, 2, 2, expert=2)  # data 1, fsdp 2, tensor 2, expert 2
    specs = sharding.describe_shardings(sharding.param_shardings(MOE_MODEL, mesh))
    assert specs["['layers'][0]['mlp']['gate_edf']"] == str(P("expert", "fsdp", "tensor"))
    assert specs["['layers'][1]['mlp']['down_efd']"] == str(P("expert", "tensor", "fsdp"))
    assert specs["['layers'][0]['mlp']['router_de']"] == str(P("fsdp", None))
    # Dense weights are replicated over the expert axis.
    assert specs["['layers'][0]['attn']['q_dnh']"] == str(P("fsdp", "tensor", None))
    assert sharding.batch_shard_count(mesh) == 4  # data x fsdp x expert

    mesh = sharding.make_mesh(2, expert=4)
    state = learner.init_train_state(MOE_MODEL, _params(), OPT, mesh=mesh)
    gate = state.params["layers"][0]["mlp"]["gate_edf"]
    assert gate.sharding.spec == P("expert", None, None)
    assert gate.addressable_shards[0].data.shape == (2, 32, 16)  # 8 experts / 4
    mu = state.opt_state.inner_state[1][0].mu["layers"][0]["mlp"]["gate_edf"]
    assert mu.sharding.spec == P("expert", None, None)  # Adam moments follow


def test_experts_not_divisible_by_the_expert_axis_is_one_error():
    mesh = sharding.make_mesh(2, expert=4)
    bad = MOE_MODEL.replace(num_experts=6)
    message = "num_experts=6 is not divisible by the mesh's expert axis (4)"
    with pytest.raises(ValueError, match=re.escape(message)):
        sharding.param_shardings(bad, mesh)
    with pytest.raises(ValueError, match=re.escape(message)):
        grpo.make_update_fn(bad, grpo.GRPOConfig(), OPT, mesh)
    # A dense model on an expert axis is plain data parallelism: no error.
    sharding.param_shardings(MOE_MODEL.replace(num_experts=0), mesh)


@functools.cache
def run_update(mesh_shape, expert):
    """One update (aux loss on) from the same params; host params, opt state, metrics."""
    devices = jax.devices()[: int(np.prod(mesh_shape)) * expert]
    mesh = sharding.make_mesh(*mesh_shape, devices=devices, expert=expert)
    state = learner.init_train_state(MOE_MODEL, _params(), SGD, mesh=mesh)
    config = grpo.GRPOConfig(router_aux_loss_coef=0.01)
    update_fn = grpo.make_update_fn(MOE_MODEL, config, SGD, mesh)
    state, metrics = update_fn(state, sharding.shard_batch(make_batch(), mesh), KEY)
    spec = state.params["layers"][1]["mlp"]["up_edf"].sharding.spec
    return jax.tree.map(np.asarray, (state.params, state.opt_state, metrics)), spec


@pytest.mark.parametrize("mesh_shape, expert", [((2, 1, 1), 4), ((1, 2, 2), 2)])
@pytest.mark.slow  # 18 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sharded_moe_update_equals_single_device(mesh_shape, expert):
    single, _ = run_update((1, 1, 1), 1)
    sharded, spec = run_update(mesh_shape, expert)
    assert spec[0] == "expert"
    assert_same_update(sharded, single)
    metrics = single[2]
    assert float(metrics["grad_norm"]) > 0 and float(metrics["moe_aux_loss"]) > 2.0
    assert "moe_load_max" in sharded[2]


@pytest.mark.slow  # 7 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sampler_runs_on_the_expert_mesh():
    params = _params()
    prompts = [[5, 17, 9, 3], [7, 8, 9], [10, 11], [1, 2, 3, 4], [6], [12, 13], [3], [2, 9]]

    def greedy(mesh):
        sampler = sampler_lib.Sampler(
            MOE_MODEL,
            eos_id=MOE_MODEL.vocab_size,  # never stops early
            pad_id=0,
            max_prompt_len=8,
            max_new_tokens=8,
            mesh=mesh,
        )
        if mesh is not None:
            state = learner.init_train_state(MOE_MODEL, params, OPT, mesh=mesh)
            p = state.params
        else:
            p = jax.tree.map(np.asarray, params)
        out = sampler(p, prompts, rng=KEY, sampling=sampler_lib.SamplingConfig(greedy=True))
        return np.asarray(out.response_tokens)

    single = greedy(None)
    assert len(np.unique(single)) > 3
    np.testing.assert_array_equal(greedy(sharding.make_mesh(2, expert=4)), single)


# ------------------------------------------------------------------------ run config


def _run_config(**changes):
    from experiments.configs import base
    from tests.run_fixtures import set_fields

    c = base.run_config()
    c.run_dir = "/tmp/unused"
    return set_fields(c, {"model.preset": "tiny-moe", **changes})


def test_run_config_checks_the_expert_axis():
    from rl_batch.runs import config as config_lib

    resolved = config_lib.resolve(_run_config(**{"mesh.expert": 4}), 8)
    assert resolved.inputs.mesh.expert == 4
    assert config_lib.data_axis_size(resolved.inputs, 8) == 8  # data 2 x expert 4 split the batch
    with pytest.raises(ValueError, match=re.escape("mesh.expert=3: must be a positive int divid")):
        config_lib.resolve(_run_config(**{"mesh.expert": 3, "mesh.data": 1}), 3)
    with pytest.raises(
        ValueError,
        match=re.escape("GRPOConfig.router_aux_loss_coef=-1.0 is invalid: expected >= 0"),
    ):
        config_lib.resolve(_run_config(**{"grpo.router_aux_loss_coef": -1.0}), 1)


def test_moe_study_config_fits_its_preset():
    from experiments.configs import grpo_study_moe
    from rl_batch.models import transformer as model_lib

    c = grpo_study_moe.get_config("/models/Qwen3-30B-A3B")
    preset = model_lib.get_preset(c.model.preset)
    assert preset.num_experts % c.mesh.expert == 0 and c.mesh.expert == 8
    assert c.grpo.record_routing and c.init.source == "hf"
    # The docstring's estimate: 5.16B parameters per device at expert=8.
    experts = preset.num_layers * preset.num_experts * 3 * 2048 * 768
    per_device = experts / 8 + (preset.num_params - experts)
    assert abs(per_device / 5.16e9 - 1) < 0.01
