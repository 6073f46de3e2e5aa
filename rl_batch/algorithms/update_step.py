"""One optimizer update of a learner: accumulate the gradient, apply it, jit the step.

``accumulate_gradients`` sums a loss's gradient over micro-batches in ``lax.scan`` (and
hands each micro-batch's gradient to ``noise_statistics`` for the gradient-noise
statistics), ``apply_update`` makes the optimizer step or skips it whole when anything
is non-finite, ``delta_norm`` measures it, and ``jit_update`` jits a learner's
``update_fn(state, batch, rng, clip)`` with its shardings and the state donated, the
policy-ratio clip range (``policy_loss.ClipRange``) an argument of it. GRPO
(``grpo.make_update_fn``) and PPO (``ppo.make_update_fn``) assemble their updates from
these.

Shape letters (docs/glossary.md): B sequences, R response tokens, M micro-batches.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from rl_batch.algorithms import noise_statistics as noise_lib
from rl_batch.algorithms.batch import split_batch
from rl_batch.algorithms.policy_loss import ClipRange
from rl_batch.algorithms.train_state import TrainState
from rl_batch.models import moe as moe_lib
from rl_batch.models import sharding as sharding_lib

Params = Any
Metrics = dict[str, jax.Array]


# The micro-batch layouts of ``accumulate_gradients`` (``noise_statistics``): which rows
# each micro-batch holds, and so what its gradient-noise statistics measure.
LAYOUTS = ("strided", "groups", "pairs")


def accumulate_gradients(
    loss_fn: Callable[[Params, Any], tuple[jax.Array, tuple[Metrics, Metrics, jax.Array]]],
    params: Params,
    batch: Any,
    micro_batches: int,
    mesh: Mesh | None = None,
    group_size: int = 0,
    layout: str = "strided",
    pair_dot: str = "direct",
) -> tuple[Params, jax.Array, Metrics]:
    """Gradient of ``sum_m loss_fn(params, micro_batch_m)`` via ``lax.scan``.

    ``loss_fn`` must normalise by the full batch's totals (see ``grpo_loss``), so the
    sum over micro-batches is the full-batch loss and its gradient (the same sum in any
    layout, up to float rounding).

    Args:
      loss_fn: ``(params, batch) -> (loss, (sums, maxes, own_scale))``.
      params: differentiated parameters.
      batch: the batch (leaves [B, ...], with a [B, R] ``response_mask``).
      micro_batches: M; B must be divisible by M.
      mesh: optional, to keep micro-batches sharded.
      group_size: G, for the ``groups`` and ``pairs`` layouts: the batch is P prompts x
        G responses, prompt-major.
      layout: ``"strided"``: rows m, m + M, ... (every group cut alike: the noise
        statistics see the intra-prompt noise only); ``"groups"``: rows reordered by
        ``whole_group_order``, measurement units of whole groups, so ``grad_sq_micro``
        has ``E = |G|^2 + (G tr(Sigma_inter) + tr(Sigma_intra)) / b`` and B_simple is the
        batch noise scale B_noise; ``"pairs"``: rows reordered by ``group_pair_order``
        (micro-batches 2k and 2k + 1 hold the two halves of the same whole groups) and
        the statistics of the inter-/intra-prompt split added.
      pair_dot: ``pairs``: ``"direct"`` takes ``<g_2k, g_2k+1>`` from the kept gradient of
        micro-batch 2k (one more parameter-sized buffer); ``"running"`` reads it off the
        running sum (no buffer; about 2.4x the per-update spread).

    Returns:
      (grads, loss, metrics). With M > 1 the metrics include the gradient-noise-scale
      statistics of ``rl_batch.algorithms.noise_statistics`` (``grad_sq_micro``,
      ``grad_sq_full``, ``gns_batch_micro``, ``gns_batch_full``; with ``pairs`` also
      ``grad_dot_pair``, ``gns_prompts_pair``, ``gns_prompts_full``).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: expected one of {LAYOUTS}")
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro_batches == 1:
        (loss, (sums, maxes, _)), grads = grad_fn(params, batch)
        return grads, loss, moe_lib.finalize_router_metrics({**sums, **maxes})

    rows = jax.tree.leaves(batch)[0].shape[0]
    unit = 1  # micro-batches per measurement unit
    if layout == "pairs":
        order = noise_lib.group_pair_order(rows // group_size, group_size, micro_batches)
        batch = jax.tree.map(lambda x: x[order], batch)
    elif layout == "groups":
        order = noise_lib.whole_group_order(rows // group_size, group_size, micro_batches)
        unit = noise_lib.whole_group_units(rows // group_size, micro_batches)
        batch = jax.tree.map(lambda x: x[order], batch)
    stacked = split_batch(batch, micro_batches, mesh)
    seqs_m = noise_lib.real_sequences(stacked.response_mask)  # [M]
    direct = layout == "pairs" and pair_dot == "direct"

    def zeros_like_params():
        return jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)

    def body(carry, xs):
        micro, m = xs
        grads_acc, sums_acc, maxes_acc, kept = carry
        (_, (sums, maxes, own_scale)), grads = grad_fn(params, micro)
        sums_acc = jax.tree.map(jnp.add, sums_acc, sums)
        maxes_acc = jax.tree.map(jnp.maximum, maxes_acc, maxes)
        grads32 = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        own = jnp.asarray(own_scale, jnp.float32)
        own_sq = jnp.square(own) * noise_lib.tree_sq_norm(grads32)  # |g_m|^2
        dot = jnp.float32(0.0)
        if layout == "pairs" and direct:  # <g_m, g_m-1>: the previous own gradient, kept
            dot = own * noise_lib.tree_dot(grads32, kept["prev"])
            kept = {"prev": jax.tree.map(lambda g: own * g, grads32)}
        elif layout == "pairs":  # <g_m, sum of the earlier micro-batches' grads>
            dot = own * noise_lib.tree_dot(grads32, grads_acc)
        elif unit > 1:  # a unit's gradient: the sum over its micro-batches, then reset
            acc = jax.tree.map(jnp.add, kept["unit"], grads32)
            inv_own = kept["inv_own"] + 1.0 / own  # own_unit = 1 / sum(1 / own_m)
            own_sq = noise_lib.tree_sq_norm(acc) / jnp.square(inv_own)
            last = m % unit == unit - 1
            kept = {
                "unit": jax.tree.map(lambda a: jnp.where(last, 0.0, a), acc),
                "inv_own": jnp.where(last, 0.0, inv_own),
            }
        grads_acc = jax.tree.map(jnp.add, grads_acc, grads32)
        return (grads_acc, sums_acc, maxes_acc, kept), (own_sq, dot, own)

    first = jax.tree.map(lambda x: x[0], stacked)
    _, (sums0, maxes0, _) = jax.eval_shape(loss_fn, params, first)
    kept0 = {}
    if direct:
        kept0 = {"prev": zeros_like_params()}
    elif layout == "groups" and unit > 1:
        kept0 = {"unit": zeros_like_params(), "inv_own": jnp.float32(0.0)}
    init = (
        zeros_like_params(),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums0),
        jax.tree.map(lambda s: jnp.full(s.shape, -jnp.inf, s.dtype), maxes0),
        kept0,
    )
    xs = (stacked, jnp.arange(micro_batches))
    (grads, sums, maxes, _), (own_sq_m, dot_m, own_m) = jax.lax.scan(body, init, xs)
    seqs_u, own_sq_u = seqs_m, own_sq_m
    if unit > 1:  # [M / r] units: their sequences, and the squared norm at each unit's end
        seqs_u = seqs_m.reshape(-1, unit).sum(axis=1)
        own_sq_u = own_sq_m[unit - 1 :: unit]
    metrics = {
        **moe_lib.finalize_router_metrics({**sums, **maxes}),
        **noise_lib.micro_batch_statistics(seqs_u, own_sq_u, grads),
    }
    if layout == "pairs":
        cross_k = dot_m[1::2] if direct else noise_lib.running_pair_cross(dot_m, own_m)
        metrics.update(noise_lib.pair_statistics(seqs_m, cross_k, group_size))
    # Accumulated in float32; hand back gradients in the parameters' dtype.
    grads = jax.tree.map(lambda g, p: g.astype(jnp.result_type(p)), grads, params)
    return grads, sums["loss"], metrics


def all_finite(tree: Any) -> jax.Array:
    """Scalar bool: every value of every floating-point leaf of ``tree`` is finite."""
    leaves = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
    ]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def apply_update(
    state: TrainState,
    grads: Params,
    loss: jax.Array,
    optimizer: optax.GradientTransformation,
) -> tuple[TrainState, Metrics]:
    """One optimizer update, skipped (state unchanged) if the loss, the grads, or any
    value of the new params or optimizer state is non-finite (an infinite or huge LR
    makes finite grads into non-finite params).

    Returns:
      (new state, {"grad_norm": pre-clipping global norm, "skipped": 0. or 1.}).
    """
    grad_norm = optax.tree.norm(grads)
    updates, new_opt_state = optimizer.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    ok = (
        jnp.isfinite(loss)
        & jnp.isfinite(grad_norm)
        & all_finite(new_params)
        & all_finite(new_opt_state)
    )

    def keep_if_ok(new, old):
        return jnp.where(ok, new, old)

    new_state = state.replace(
        step=state.step + ok.astype(state.step.dtype),
        params=jax.tree.map(keep_if_ok, new_params, state.params),
        opt_state=jax.tree.map(keep_if_ok, new_opt_state, state.opt_state),
    )
    return new_state, {"grad_norm": grad_norm, "skipped": 1.0 - ok.astype(jnp.float32)}


def delta_norm(new: Params, old: Params) -> jax.Array:
    """Global norm of ``new - old`` in float32 (an update's size)."""
    return optax.tree.norm(
        jax.tree.map(lambda n, o: n.astype(jnp.float32) - o.astype(jnp.float32), new, old)
    )


class JittedUpdate:
    """A learner's jitted ``update_fn(state, batch, rng, clip=None) -> (state, metrics)``.

    ``clip`` (a ``policy_loss.ClipRange``, or a ``(clip_low, clip_high)`` pair) is the
    policy-ratio clip range of this update, None for the algorithm config's own. It is
    always passed to the compiled program as two float32 scalars, so every range runs
    the same program: a batch schedule's clip at each batch (``hparam_rules.clip``)
    recompiles nothing.

    Attributes:
      jitted: the ``jax.jit`` function of ``(state, batch, rng, clip)``.
      clip: the configured range (the algorithm config's ``clip_low``, ``clip_high``).
    """

    def __init__(self, jitted: Callable, clip: ClipRange):
        self.jitted, self.clip = jitted, clip

    def _args(self, state, batch, rng, clip) -> tuple:
        clip = self.clip if clip is None else ClipRange.of(*clip)
        return state, batch, rng, clip

    def __call__(self, state, batch, rng, clip=None):
        return self.jitted(*self._args(state, batch, rng, clip))

    def lower(self, state, batch, rng, clip=None):
        """``jax.jit``'s ``lower`` at these arguments (memory plans, cost analysis)."""
        return self.jitted.lower(*self._args(state, batch, rng, clip))

    def _cache_size(self) -> int:
        """Compiled programs held (``flops.jit_cache_size`` reads it as for a ``jax.jit``)."""
        return self.jitted._cache_size()


def jit_update(
    update_fn: Callable, state_sharding: Any, mesh: Mesh, clip: ClipRange
) -> JittedUpdate:
    """``jax.jit`` of ``update_fn(state, batch, rng, clip)``: the state donated and kept
    on ``state_sharding``, the batch split over the mesh's batch axes, rng, clip range and
    metrics replicated; ``clip`` is the range a call without one trains with."""
    replicated = sharding_lib.replicated(mesh)
    jitted = jax.jit(
        update_fn,
        in_shardings=(state_sharding, sharding_lib.batch_sharding(mesh), replicated, replicated),
        out_shardings=(state_sharding, replicated),
        donate_argnums=0,
    )
    return JittedUpdate(jitted, ClipRange.of(*clip))
