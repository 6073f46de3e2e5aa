"""The train state (params + optimizer state) and its placement on the mesh.

``init_train_state`` checks the params against the model config and wraps them with a
fresh optimizer state (``rl_batch.algorithms.optimizer.make_optimizer``), placed by
``train_state_shardings`` when a mesh is given. The update that changes a state is
``rl_batch.algorithms.update_step.apply_update``.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib

Params = Any


@flax.struct.dataclass
class TrainState:
    """Everything an update changes.

    Attributes:
      step: [] int32, optimizer updates *applied* so far (a skipped non-finite update
        does not count; equals Adam's own step count).
      params: the model parameter tree (shared with the sampler).
      opt_state: the optax state (``inject_hyperparams``: the LR lives in it).
    """

    step: jax.Array
    params: Params
    opt_state: optax.OptState


def _check_params(model_config: model_lib.ModelConfig, params: Params) -> None:
    expected = model_lib.abstract_params(model_config)
    exp_flat, exp_def = jax.tree_util.tree_flatten_with_path(expected)
    got_flat, got_def = jax.tree_util.tree_flatten_with_path(params)
    if exp_def != got_def:
        raise ValueError(
            "params do not match the model config's parameter tree: "
            f"expected {exp_def}, got {got_def}"
        )
    for (path, e), (_, g) in zip(exp_flat, got_flat):
        if tuple(e.shape) != tuple(jnp.shape(g)):
            raise ValueError(
                f"param {jax.tree_util.keystr(path)} has shape {tuple(jnp.shape(g))}, "
                f"the model config expects {tuple(e.shape)}"
            )


def train_state_shardings(
    model_config: model_lib.ModelConfig, optimizer: optax.GradientTransformation, mesh: Mesh
) -> TrainState:
    """A ``TrainState`` of ``NamedSharding``: params by the rule table, optimizer state
    following the params, scalars replicated."""
    params_sh = sharding_lib.param_shardings(model_config, mesh)
    opt_sh = sharding_lib.opt_state_shardings(
        optimizer, params_sh, model_lib.abstract_params(model_config)
    )
    return TrainState(step=sharding_lib.replicated(mesh), params=params_sh, opt_state=opt_sh)


def init_train_state(
    model_config: model_lib.ModelConfig,
    params: Params,
    optimizer: optax.GradientTransformation,
    *,
    mesh: Mesh | None = None,
) -> TrainState:
    """Wraps ``params`` with a fresh optimizer state.

    With ``mesh`` the params are placed by ``train_state_shardings`` and the optimizer
    state is created already sharded. The update function donates the state, so use
    ``state.params`` afterwards, not the ``params`` passed in.

    Args:
      model_config: the model shape (the params are checked against it).
      params: the parameter tree.
      optimizer: from ``make_optimizer``.
      mesh: optional mesh to place the state on.

    Returns:
      A ``TrainState`` with ``step = 0``.
    """
    _check_params(model_config, params)
    if mesh is None:
        return TrainState(
            step=jnp.zeros((), jnp.int32), params=params, opt_state=optimizer.init(params)
        )
    shardings = train_state_shardings(model_config, optimizer, mesh)
    params = jax.device_put(params, shardings.params)
    opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(params)
    step = jax.device_put(jnp.zeros((), jnp.int32), shardings.step)
    return TrainState(step=step, params=params, opt_state=opt_state)
