"""The optimizer: AdamW with its hyperparameters in its state, and a linear warm-up.

``make_optimizer`` builds it (``optax.inject_hyperparams``, so the LR is state, not a
compile-time constant), ``warmup_lr`` the warm-up schedule, ``current_lr`` reads the LR
back (for the metrics), and ``with_adam_hparams`` sets new Adam values in a live state
(a batch schedule's LR rule at a new batch) without a recompile. The values come from
``rl_batch.algorithms.lr_rules``.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_batch.algorithms.train_state import TrainState


def make_optimizer(
    lr: float | Callable[[jax.Array], jax.Array],
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
) -> optax.GradientTransformation:
    """AdamW (+ global-norm clipping when ``max_grad_norm`` is set).

    Wrapped in ``optax.inject_hyperparams`` so that the learning rate (and the other
    numeric hyperparameters) live in the optimizer state: ``current_lr(opt_state)``
    reads it, and a schedule ``lr(count)`` is evaluated inside the step. Weight decay
    applies to matrices only (ndim >= 2; not to norm scales and biases).

    Args:
      lr: learning rate or schedule.
      b1, b2, eps: Adam hyperparameters.
      weight_decay: decoupled weight decay coefficient.
      max_grad_norm: clip the global gradient norm to this (None = off).

    Returns:
      An optax ``GradientTransformation``.
    """

    def factory(learning_rate, b1, b2, eps, weight_decay, max_grad_norm):
        adamw = optax.adamw(
            learning_rate,
            b1=b1,
            b2=b2,
            eps=eps,
            weight_decay=weight_decay,
            mask=lambda params: jax.tree.map(lambda x: jnp.ndim(x) >= 2, params),
        )
        if max_grad_norm is None:
            return adamw
        return optax.chain(optax.clip_by_global_norm(max_grad_norm), adamw)

    # float32 hyperparameters even for bf16 params (else b2 = 0.999 would round to 1.0).
    return optax.inject_hyperparams(
        factory, static_args=("max_grad_norm",), hyperparam_dtype=jnp.float32
    )(
        learning_rate=lr,
        b1=b1,
        b2=b2,
        eps=eps,
        weight_decay=weight_decay,
        max_grad_norm=max_grad_norm,
    )


def warmup_lr(lr: float, updates: int) -> float | Callable[[jax.Array], jax.Array]:
    """``lr`` itself when ``updates`` is 0, else the linear warm-up schedule
    ``count -> lr * min(1, (count + 1) / updates)`` (update 0 at ``lr / updates``, full
    ``lr`` from update ``updates - 1`` on), for ``make_optimizer``.

    Raises:
      ValueError: ``updates`` is not an int >= 0.
    """
    if not isinstance(updates, int) or isinstance(updates, bool) or updates < 0:
        raise ValueError(f"warm-up updates must be an int >= 0, got {updates!r}")
    if updates == 0:
        return lr

    def schedule(count: jax.Array) -> jax.Array:
        fraction = jnp.minimum(1.0, (count.astype(jnp.float32) + 1.0) / updates)
        return jnp.float32(lr) * fraction

    return schedule


def current_lr(opt_state: optax.OptState) -> jax.Array:
    """The learning rate stored by ``inject_hyperparams`` (NaN if there is none), also
    inside an ``optax.MultiSteps`` state."""
    opt_state = getattr(opt_state, "inner_opt_state", opt_state)  # optax.MultiSteps
    hyper = getattr(opt_state, "hyperparams", None)
    if hyper is None or "learning_rate" not in hyper:
        return jnp.array(jnp.nan, jnp.float32)
    return jnp.asarray(hyper["learning_rate"], jnp.float32)


def with_adam_hparams(state: TrainState, lr: float, b1: float, b2: float, eps: float):
    """``state`` with the Adam settings in its ``inject_hyperparams`` optimizer state set
    (a batch schedule's LR rule at the current batch). Each value keeps its stored
    dtype and sharding, so the jitted update does not recompile.

    Raises:
      ValueError: the optimizer state has no injected hyperparameters.
    """
    opt_state = state.opt_state
    hyper = getattr(opt_state, "hyperparams", None)
    if hyper is None or "learning_rate" not in hyper:
        raise ValueError("the optimizer state has no injected learning rate to set")
    values = {"learning_rate": lr, "b1": b1, "b2": b2, "eps": eps}
    new = dict(hyper)
    for name, value in values.items():
        old = hyper[name]
        new[name] = jax.device_put(np.asarray(value, old.dtype), old.sharding)
    return state.replace(opt_state=opt_state._replace(hyperparams=new))
