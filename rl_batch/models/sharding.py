"""Device mesh, the logical-axis rule table, and shardings for params, batches, state.

One mesh with four named axes:

- ``data``: pure data parallelism (parameters replicated across it);
- ``fsdp``: data parallelism whose members also split the parameters and optimizer
  state along the ``embed`` axis (ZeRO-3 / FSDP);
- ``expert``: expert parallelism for MoE models: the experts of every sparse layer (and
  their optimizer state) are split over it, E / expert per device; for everything else
  it is one more data-parallel axis (it splits the batch; dense weights are replicated
  over it);
- ``tensor``: tensor (model) parallelism over heads, MLP width and vocabulary.

Batches are split over ``("data", "fsdp", "expert")`` together: every device of a
``data`` x ``fsdp`` x ``expert`` slice holds a different part of the batch, and a
``tensor`` group shares one. The routed tokens meet their experts through GSPMD: the
expert weights are stored sharded and XLA inserts the collectives the grouped matmuls
need (no hand-written all-to-all dispatch).

Parameters carry logical axis names (``rl_batch.models.transformer.logical_axes``) mapped to mesh
axes by ``LOGICAL_AXIS_RULES`` below -- the only table of its kind in the project. Two
fallbacks keep every model shardable on every mesh, both to *replication* of that one
dimension (never an error):

1. a dimension whose size is not divisible by its mesh axis size (e.g. 2 KV heads on a
   4-way ``tensor`` axis) is replicated;
2. a mesh axis is used at most once per array; a later dimension mapped to an axis
   already used by an earlier dimension of the same array is replicated.

No ``PartitionSpec`` literal lives outside this module.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rl_batch.models import transformer as model_lib

MESH_AXES = ("data", "fsdp", "expert", "tensor")
# Mesh axes that split the batch dimension of rollout batches and activations.
BATCH_AXES = ("data", "fsdp", "expert")

# Logical axis -> mesh axis (None = replicated). Every logical axis the model uses must
# appear here, so that a new axis name fails loudly instead of silently replicating.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("expert", "expert"),  # the E axis of MoE expert weights
    ("expert_mlp", "tensor"),  # an expert's SwiGLU width
    ("router_experts", None),  # the router's E outputs: small, replicated
    (model_lib.LAYERS_AXIS, None),  # the L axis of stacked blocks (scan_layers)
)


def make_mesh(
    data: int = -1,
    fsdp: int = 1,
    tensor: int = 1,
    devices: Sequence[Any] | None = None,
    *,
    expert: int = 1,
) -> Mesh:
    """Builds the ``('data', 'fsdp', 'expert', 'tensor')`` mesh.

    Args:
      data: size of the ``data`` axis; -1 = all devices left after fsdp x expert x tensor.
      fsdp: size of the ``fsdp`` axis.
      tensor: size of the ``tensor`` axis.
      devices: devices to use (default ``jax.devices()``, all processes).
      expert: size of the ``expert`` axis (MoE expert parallelism).

    Returns:
      A ``jax.sharding.Mesh`` with auto (GSPMD-propagated) axes.

    Raises:
      ValueError: if the sizes do not multiply to the device count (names the sizes).
    """
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    for name, size in (("fsdp", fsdp), ("expert", expert), ("tensor", tensor)):
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"mesh axis {name}={size!r} must be a positive int")
    others = fsdp * expert * tensor
    sizes = f"fsdp={fsdp} x tensor={tensor}" + (f" x expert={expert}" if expert > 1 else "")
    if data == -1:
        if n % others:
            raise ValueError(
                f"cannot infer data: {n} devices are not divisible by {sizes} = {others}"
            )
        data = n // others
    if not isinstance(data, int) or data < 1 or data * others != n:
        raise ValueError(
            f"mesh data={data} x {sizes} = {data * others} does not match the {n} available devices"
        )
    shape = (data, fsdp, expert, tensor)
    try:
        # Topology-aware device order on TPU/GPU; plain order on CPU.
        from jax.experimental import mesh_utils

        grid = mesh_utils.create_device_mesh(shape, devices=devices)
    except (ValueError, NotImplementedError, AssertionError):
        grid = np.asarray(devices, dtype=object).reshape(shape)
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return Mesh(grid, MESH_AXES, axis_types=auto)


def logical_to_spec(
    axes: Sequence[str],
    shape: Sequence[int],
    mesh: Mesh,
    rules: Sequence[tuple[str, str | None]] = LOGICAL_AXIS_RULES,
) -> P:
    """PartitionSpec for one array from its logical axes, with the two fallbacks.

    Args:
      axes: logical axis name per dimension (``()`` for a scalar).
      shape: the array's shape (same length as ``axes``).
      mesh: the mesh.
      rules: logical -> mesh axis table.

    Returns:
      A ``PartitionSpec`` with one entry per dimension.
    """
    table = dict(rules)
    if len(axes) != len(shape):
        raise ValueError(f"logical axes {tuple(axes)} do not match shape {tuple(shape)}")
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        if name not in table:
            raise ValueError(
                f"logical axis {name!r} has no sharding rule; known axes: {sorted(table)}"
            )
        mesh_axis = table[name]
        # A mesh built without an axis the rules name (e.g. no ``expert``): replicated.
        if mesh_axis not in mesh.shape:
            mesh_axis = None
        if mesh_axis is None or mesh_axis in used or dim % mesh.shape[mesh_axis]:
            spec.append(None)
            continue
        used.add(mesh_axis)
        spec.append(mesh_axis if mesh.shape[mesh_axis] > 1 else None)
    return P(*spec)


def param_specs(
    model_config: model_lib.ModelConfig,
    mesh: Mesh,
    rules: Sequence[tuple[str, str | None]] = LOGICAL_AXIS_RULES,
) -> Any:
    """Tree of ``PartitionSpec`` shaped like the model's params.

    Raises:
      ValueError: when a MoE model's experts do not split evenly over the ``expert`` axis
        (replicating them instead, as other axes fall back, would hide a config mistake).
    """
    check_experts_divisible(model_config, mesh)
    axes = model_lib.logical_axes(model_config)
    shapes = model_lib.abstract_params(model_config)
    return jax.tree.map(
        lambda a, s: logical_to_spec(a, s.shape, mesh, rules),
        axes,
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def param_shardings(
    model_config: model_lib.ModelConfig,
    mesh: Mesh,
    rules: Sequence[tuple[str, str | None]] = LOGICAL_AXIS_RULES,
) -> Any:
    """Tree of ``NamedSharding`` shaped like the model's params.

    Args:
      model_config: the model shape (its logical axes come from ``model.logical_axes``).
      mesh: the mesh.
      rules: logical -> mesh axis table.

    Returns:
      A tree with the same structure as ``model.init_params(model_config, ...)``.
    """
    specs = param_specs(model_config, mesh, rules)
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P)
    )


def check_experts_divisible(model_config: model_lib.ModelConfig, mesh: Mesh) -> None:
    """Raises ValueError unless a MoE model's ``num_experts`` is a multiple of the
    ``expert`` axis size. (For a dense model the axis is one more data-parallel axis.)"""
    size = mesh.shape.get("expert", 1)
    if model_config.num_experts and model_config.num_experts % size:
        raise ValueError(
            f"num_experts={model_config.num_experts} is not divisible by the mesh's "
            f"expert axis ({size}): every device must hold the same number of experts"
        )


def replicated(mesh: Mesh) -> NamedSharding:
    """A fully replicated sharding (scalars, RNG keys, metrics)."""
    return NamedSharding(mesh, P())


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The ``BATCH_AXES`` this mesh has (all of them on a ``make_mesh`` mesh)."""
    return tuple(a for a in BATCH_AXES if a in mesh.shape)


def batch_shard_count(mesh: Mesh) -> int:
    """Number of pieces the batch dimension is split into (data x fsdp x expert)."""
    return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of batch-major arrays: dimension 0 split over ``('data', 'fsdp',
    'expert')``.

    Used as a pytree *prefix* it shards every leaf of a batch along its first dimension.
    """
    return NamedSharding(mesh, P(batch_axes(mesh)))


# The sampler splits its batch over ``data`` only: ``rollout.static.decode_sharded`` runs one
# decode loop per ``data`` shard with the parameters as given. Where ``fsdp > 1`` the
# learner's batch layout (``BATCH_AXES``) differs; the rollout comes back to the host and
# ``shard_batch`` places the learner's batch anew (the reshard).
SAMPLER_BATCH_AXIS = "data"


def sampler_batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of the sampler's prompt batch: dimension 0 split over ``data``."""
    return NamedSharding(mesh, P(SAMPLER_BATCH_AXIS))


def replicated_spec() -> P:
    """The spec of an array every shard of a ``shard_map`` sees whole (params, scalars)."""
    return P()


def sampler_shard_spec(axis: str = SAMPLER_BATCH_AXIS) -> P:
    """The ``shard_map`` spec of a sampler array split over ``axis`` along dimension 0."""
    return P(axis)


def sampler_state_specs(state: Any, axis: str = SAMPLER_BATCH_AXIS) -> Any:
    """``shard_map`` specs of a sampler state: arrays split over ``axis`` along dimension
    0, scalars (the step counter) whole."""
    return jax.tree.map(lambda x: P(axis) if x.ndim else P(), state)


def stacked_batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of ``[M, B / M, ...]`` stacks of micro/mini-batches (dim 1 split)."""
    return NamedSharding(mesh, P(None, batch_axes(mesh)))


def check_batch_divisible(batch_size: int, mesh: Mesh, what: str = "batch") -> None:
    """Raises ValueError unless ``batch_size`` splits evenly over the batch axes."""
    n = batch_shard_count(mesh)
    if batch_size % n:
        sizes = " x ".join(f"{a}={mesh.shape[a]}" for a in batch_axes(mesh))
        raise ValueError(
            f"{what} size {batch_size} is not divisible by the {n} batch shards (mesh {sizes})"
        )


def shard_batch(batch: Any, mesh: Mesh) -> Any:
    """Places a (host) batch pytree on the mesh, split along dimension 0.

    With several processes every process passes the same full host batch and keeps
    the shards of its own devices (the run loop gathers rollouts to every process).

    Raises:
      ValueError: if a leaf's leading dimension is not divisible by the batch shards.
    """
    for leaf in jax.tree.leaves(batch):
        check_batch_divisible(int(np.shape(leaf)[0]), mesh)
    return jax.device_put(batch, batch_sharding(mesh))


def opt_state_shardings(
    optimizer: optax.GradientTransformation, params_shardings: Any, abstract_params: Any
) -> Any:
    """Shardings of ``optimizer.init(params)``: param-shaped parts follow the params,
    everything else (step counts, injected hyperparameters) is replicated.

    Args:
      optimizer: the optax transformation.
      params_shardings: tree of ``NamedSharding`` shaped like the params.
      abstract_params: the params as ``jax.ShapeDtypeStruct`` leaves.

    Returns:
      A tree of ``NamedSharding`` shaped like the optimizer state.
    """
    mesh = jax.tree.leaves(params_shardings)[0].mesh
    abstract_state = jax.eval_shape(optimizer.init, abstract_params)
    return optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract_state,
        params_shardings,
        transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, optax.MaskedNode),
    )


def describe_shardings(shardings: Any) -> dict[str, str]:
    """``{'path/to/param': 'PartitionSpec(...)'}`` for logging a sharding tree."""
    flat = jax.tree_util.tree_flatten_with_path(shardings)[0]
    return {jax.tree_util.keystr(path): str(s.spec) for path, s in flat}
