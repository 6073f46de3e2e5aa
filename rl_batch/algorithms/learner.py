"""The update skeleton GRPO and PPO share, and the interface the run loop uses.

``rl_batch.algorithms.grpo`` and ``rl_batch.algorithms.ppo`` each build one pure, jitted
``update_fn(state, batch, rng) -> (state, metrics)`` from these pieces and wrap it in an
adapter implementing ``Algorithm`` (the protocol ``rl_batch.runs.run`` calls):

- train state: ``TrainState`` (params + optimizer state), ``init_train_state`` placed on
  the mesh by ``train_state_shardings``; ``make_optimizer`` / ``actor_optimizer``;
- batches: ``Batch`` (the policy-gradient batch of both learners), shape checks
  (``check_rollout_shapes``), ``rollout_fields`` (the sequences of a rollout, dropped
  groups masked), ``loss_normalisers``;
- the model: ``response_outputs`` (logits or values aligned with the response tokens),
  ``compute_logprobs`` (and micro-batched, jitted variants);
- the loss: ``policy_loss``, the clipped surrogate with token-mean metrics (GRPO with
  per-sequence advantages, the PPO actor with per-token ones), built from small pure
  pieces (``surrogate_per_token``, ``weighted_sum``, ``kl_terms``, ``moe_terms``,
  ``ratio_metrics``, ``token_mean_part``, ``own_gradient_scale``);
- the step: ``accumulate_gradients`` (micro-batches in ``lax.scan``, gradient noise
  statistics), ``apply_update`` (skipped whole when non-finite), ``sequence_metrics``,
  ``delta_norm``, ``jit_update`` (shardings and donation).

Sequence layout of a ``Batch``: ``tokens = concat(prompt, response)`` [B, T] with
T = I + R, mask likewise, positions ``model.positions_from_mask(mask)``. Prompts are
left-padded (the last prompt column is a real token), responses right-padded. The logits
at index ``I - 1 + j`` predict response token ``j``, so the response logits are
``logits[:, I - 1 : I + R - 1]``. Log-probs use ``logits / temperature`` (the sampler
reports log-probs under softmax(logits / temperature)).

Shape letters (docs/glossary.md): B sequences, I prompt tokens, R response tokens,
T = I + R, V vocabulary, L layers, E experts, A experts per token, M micro-batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from rl_batch.algorithms import losses
from rl_batch.models import logprobs as logprobs_lib
from rl_batch.models import moe as moe_lib
from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib

Params = Any
Metrics = dict[str, jax.Array]


# ----------------------------------------------------------------------- containers


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


@flax.struct.dataclass
class Batch:
    """One rollout batch (B responses; prompt-major when it holds groups: row p * G + g).

    Attributes:
      prompt_tokens: [B, I] int32, left-padded.
      prompt_mask: [B, I] bool.
      response_tokens: [B, R] int32, right-padded.
      response_mask: [B, R] bool, True on generated tokens up to and including EOS.
      advantages: [B] float32 per-sequence advantages (GRPO); ``grpo_loss`` also takes
        [B, R] per-token advantages (the PPO actor).
      old_logprobs: [B, R] behaviour-policy log-probs (the sampler's, at the sampling
        temperature), or None to use ``stop_gradient`` of the current ones (exact with
        one update per batch, where the ratio is 1 at the update).
      ref_logprobs: [B, R] reference-policy log-probs, or None.
      routed_experts: [B, I + R, L, A] int expert choices of a MoE policy's sampler
        (``SampleOutput.routed_experts``; -1 = none), or None. Given, the update logs
        ``moe_routing_disagreement`` and, with ``GRPOConfig.routing_replay``, routes by it.

    Rows whose ``response_mask`` is all False are padding: they add nothing to the loss,
    its normalisers or the metrics. Pad a filtered batch to a fixed B with such rows
    (one compilation) and give them finite advantages (e.g. 0).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    response_tokens: jax.Array
    response_mask: jax.Array
    advantages: jax.Array
    old_logprobs: jax.Array | None = None
    ref_logprobs: jax.Array | None = None
    routed_experts: jax.Array | None = None

    @property
    def size(self) -> int:
        return self.response_tokens.shape[0]


def check_rollout_shapes(
    batch: Any, per_sequence: tuple[str, ...], per_token: tuple[str, ...], name: str
) -> None:
    """Raises ValueError naming the field when a rollout batch's shapes disagree.

    Every rollout batch has ``prompt_tokens`` [B, I], ``prompt_mask`` [B, I],
    ``response_tokens`` / ``response_mask`` [B, R]; ``per_sequence`` fields must be [B]
    and ``per_token`` fields [B, R] (None is allowed for optional fields). Trace time.
    """
    b, i = batch.prompt_tokens.shape
    r = batch.response_tokens.shape[1]
    expected = {"prompt_mask": (b, i), "response_tokens": (b, r), "response_mask": (b, r)}
    expected |= {field: (b,) for field in per_sequence}
    expected |= {field: (b, r) for field in per_token}
    for field, shape in expected.items():
        value = getattr(batch, field)
        if value is not None and tuple(value.shape) != shape:
            raise ValueError(
                f"{name}.{field} has shape {tuple(value.shape)}, expected {shape} "
                f"(B={b}, I={i}, R={r})"
            )
    if i < 1 or r < 1:
        raise ValueError(f"{name} needs I >= 1 and R >= 1, got I={i}, R={r}")


def check_batch(batch: Batch) -> None:
    """Shape check of a GRPO ``Batch`` (see ``check_rollout_shapes``)."""
    check_rollout_shapes(batch, ("advantages",), ("old_logprobs", "ref_logprobs"), "Batch")
    routed = batch.routed_experts
    b, s = (
        batch.prompt_tokens.shape[0],
        batch.prompt_tokens.shape[1] + batch.response_tokens.shape[1],
    )
    if routed is not None and (routed.ndim != 4 or routed.shape[:2] != (b, s)):
        raise ValueError(
            f"Batch.routed_experts has shape {tuple(routed.shape)}, "
            f"expected (B={b}, I + R={s}, L, A)"
        )


# ------------------------------------------------------------------------ optimizer


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


# ---------------------------------------------------------------------- train state


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


# ------------------------------------------------------------------ model plumbing


def response_outputs(
    model_config: model_lib.ModelConfig,
    params: Params,
    batch: Any,
    *,
    with_router: bool = False,
    replay: bool = False,
) -> Any:
    """Model outputs aligned with the response tokens.

    Args:
      model_config: the model shape (``head="lm"`` or ``"value"``).
      params: its parameters.
      batch: anything with ``prompt_tokens``, ``prompt_mask``, ``response_tokens``,
        ``response_mask`` (see ``Batch``).
      with_router: also return a MoE model's router logits (``transformer.forward_with_router``).
      replay: with ``with_router``, route by ``batch.routed_experts`` (routing replay).

    Returns:
      [B, R, V] float32 logits whose row j predicts response token j (``head="lm"``),
      or [B, R] values of the state before response token j (``head="value"``). With
      ``with_router``: (that, router logits [L, B * T, E], token mask [B * T]).
    """
    i = batch.prompt_tokens.shape[1]
    r = batch.response_tokens.shape[1]
    tokens_bt = jnp.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
    mask_bt = jnp.concatenate(
        [batch.prompt_mask.astype(bool), batch.response_mask.astype(bool)], axis=1
    )
    positions_bt = model_lib.positions_from_mask(mask_bt)
    if with_router:
        replay_btla = None
        if replay:
            replay_btla = getattr(batch, "routed_experts", None)
            if replay_btla is None:
                raise ValueError("routing replay needs the batch's routed_experts (None)")
        out, router_lte = model_lib.forward_with_router(
            model_config,
            params,
            tokens_bt,
            input_mask_bt=mask_bt,
            positions_bt=positions_bt,
            replay_experts_btlk=replay_btla,
        )
        return out[:, i - 1 : i + r - 1], router_lte, mask_bt.reshape(-1)
    out = model_lib.forward(
        model_config, params, tokens_bt, input_mask_bt=mask_bt, positions_bt=positions_bt
    )
    return out[:, i - 1 : i + r - 1]


def compute_logprobs(
    model_config: model_lib.ModelConfig,
    params: Params,
    batch: Any,
    temperature: float = 1.0,
    replay: bool = False,
) -> jax.Array:
    """[B, R] log-probs of the response tokens under softmax(logits / temperature),
    0 on padding. Jittable (``temperature`` static); use for reference log-probs or
    evaluation. ``replay``: a MoE model routed by ``batch.routed_experts`` (routing
    replay)."""
    if replay:
        logp_br = logprobs_lib.response_logprobs_and_router(
            model_config, params, batch, temperature, replay=True
        )[0]
    else:
        logp_br, _ = logprobs_lib.response_logprobs(model_config, params, batch, temperature)
    return jnp.where(batch.response_mask.astype(bool), logp_br, 0.0)


class _ResponseInputs(NamedTuple):
    """The fields ``response_outputs`` reads (all a log-prob micro-batch loop carries)."""

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    response_tokens: jax.Array
    response_mask: jax.Array


def compute_logprobs_micro(
    model_config: model_lib.ModelConfig,
    params: Params,
    batch: Any,
    temperature: float = 1.0,
    micro_batches: int = 1,
    mesh: Mesh | None = None,
) -> jax.Array:
    """``compute_logprobs`` computed ``micro_batches`` pieces at a time (``lax.map``).

    The same [B, R] result, but only [B / M, R, V] logits live at once, as in an update
    with ``micro_batches=M``. The pieces are ``split_batch``'s strided ones (no
    communication on a sharded batch when M divides the per-device row count).
    """
    if micro_batches == 1:
        return compute_logprobs(model_config, params, batch, temperature)
    inputs = _ResponseInputs(
        batch.prompt_tokens, batch.prompt_mask, batch.response_tokens, batch.response_mask
    )
    stacked = split_batch(inputs, micro_batches, mesh)
    logp_mbr = jax.lax.map(
        lambda micro: compute_logprobs(model_config, params, micro, temperature), stacked
    )
    # Piece m, row i is batch row i * M + m (``split_batch``): undo the split.
    b = batch.response_tokens.shape[0]
    logp_br = jnp.swapaxes(logp_mbr, 0, 1).reshape(b, logp_mbr.shape[2])
    if mesh is not None:
        logp_br = jax.lax.with_sharding_constraint(logp_br, sharding_lib.batch_sharding(mesh))
    return logp_br


def make_logprobs_fn(
    model_config: model_lib.ModelConfig,
    mesh: Mesh,
    temperature: float = 1.0,
    micro_batches: int = 1,
) -> Callable[[Params, Batch], jax.Array]:
    """Jitted ``(params, batch) -> logprobs [B, R]`` with the mesh's shardings (e.g. for
    reference-policy log-probs; the batch may carry None for the optional fields).

    ``micro_batches`` (M) runs the forward on B / M rows at a time (see
    ``compute_logprobs_micro``), so that it needs no more logits memory than an update
    with as many micro-batches; B must be divisible by M.
    """
    return jax.jit(
        functools.partial(
            compute_logprobs_micro,
            model_config,
            temperature=temperature,
            micro_batches=micro_batches,
            mesh=mesh,
        ),
        in_shardings=(
            sharding_lib.param_shardings(model_config, mesh),
            sharding_lib.batch_sharding(mesh),
        ),
        out_shardings=sharding_lib.batch_sharding(mesh),
    )


# ------------------------------------------------------------------------ the loss


def check_policy_loss_fields(config: Any, bad: Callable[[str, str], None]) -> None:
    """Validates the ``policy_loss`` settings of an algorithm config (``clip_low``,
    ``clip_high``, ``loss_agg``, ``temperature``, ``micro_batches``); ``bad(name,
    expected)`` raises the config's own error."""
    for name in ("clip_low", "clip_high"):
        if not 0.0 <= getattr(config, name) < 10.0:
            bad(name, "a float in [0, 10)")
    if config.clip_low >= 1.0:
        bad("clip_low", "< 1 (the lower ratio bound 1 - clip_low must stay positive)")
    if config.loss_agg not in losses.LOSS_AGG_MODES:
        bad("loss_agg", f"one of {losses.LOSS_AGG_MODES}")
    if not config.temperature > 0.0:
        bad("temperature", "> 0")
    value = config.micro_batches
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        bad("micro_batches", "a positive int")


def policy_loss(
    model_config: model_lib.ModelConfig,
    params: Params,
    batch: Batch,
    *,
    clip_low: float,
    clip_high: float,
    loss_agg: str,
    temperature: float,
    kl_coef: float,
    num_tokens: jax.Array,
    num_seqs: jax.Array | int,
    max_len: int,
    surrogate: str = "token",
    router_aux_loss_coef: float = 0.0,
    routing_replay: bool = False,
    micro_batches: int = 1,
) -> tuple[jax.Array, tuple[Metrics, Metrics, jax.Array]]:
    """Clipped policy-gradient loss of one (micro-)batch, normalised by the *full*
    batch's totals.

    ``batch.advantages`` are [B] per sequence (GRPO) or [B, R] per token (the PPO
    actor). With ``batch.ref_logprobs`` the k3 KL to the reference is reported (``kl``)
    and weighs ``kl_coef`` in the loss. A MoE policy (``num_experts > 0``) also reports
    its router's expert-load metrics (``moe.router_sums``, turned into metrics by
    ``accumulate_gradients``), ``moe_aux_loss`` (HF's load-balancing loss, weighing
    ``router_aux_loss_coef`` in the loss) and, when the batch carries the sampler's
    ``routed_experts``, ``moe_routing_disagreement``.

    The pieces, each a pure function of arrays: ``surrogate_per_token`` (the clipped
    surrogate), ``losses.aggregation_weights`` and ``weighted_sum`` (aggregation),
    ``kl_terms`` (KL to the reference and to the behaviour policy), ``moe_terms`` (the
    load-balancing loss and router metrics), ``ratio_metrics``, ``token_mean_part`` (the
    metrics) and ``own_gradient_scale``.

    Args:
      model_config: the policy's shape.
      params: the policy parameters (differentiated).
      batch: the (micro-)batch.
      clip_low, clip_high: ratio bounds ``1 - clip_low``, ``1 + clip_high``.
      loss_agg: one of ``losses.LOSS_AGG_MODES``.
      temperature: log-probs use ``logits / temperature``.
      kl_coef: weight of the KL-to-reference term (needs ``batch.ref_logprobs``).
      num_tokens: real response tokens in the full batch (token_mean normaliser).
      num_seqs: real sequences in the full batch (rows with at least one response
        token; all-padding rows are not counted).
      max_len: fixed length normaliser (seq_mean_token_sum_norm).
      surrogate: one of ``losses.POLICY_LOSSES``: ``"token"``, the token-level clipped
        surrogate (``losses.clipped_policy_loss``); ``"gspo"``, GSPO's sequence-level
        ratio and clipping (``losses.gspo_policy_loss``; needs [B] advantages and is a
        sequence mean, so use it with ``loss_agg="seq_mean_token_mean"``).
      router_aux_loss_coef: weight of a MoE policy's load-balancing loss (0 = off).
      routing_replay: route a MoE policy by ``batch.routed_experts`` (required) instead
        of its router's top-k.
      micro_batches: micro-batches of the update: each one's load-balancing loss counts
        ``1 / micro_batches``.

    Returns:
      (loss, (sums, maxes, own_scale)): ``sums`` are metrics that add up over
      micro-batches to the full-batch value, ``maxes`` combine by max, and ``own_scale``
      converts this micro-batch's gradient to the gradient of its own normalised loss
      (``|g_own| = own_scale * |g|``), for the gradient noise scale.
    """
    if kl_coef and batch.ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} needs Batch.ref_logprobs, which is None")
    mask_br = batch.response_mask.astype(bool)
    logp_br, entropy_br, router = _policy_logprobs(
        model_config, params, batch, temperature, routing_replay
    )
    if batch.old_logprobs is None:
        old_br = jax.lax.stop_gradient(logp_br)
    else:
        old_br = batch.old_logprobs.astype(jnp.float32)
    ref_br = None if batch.ref_logprobs is None else batch.ref_logprobs.astype(jnp.float32)

    pg_br, clipped_br = surrogate_per_token(
        logp_br,
        old_br,
        batch.advantages.astype(jnp.float32),
        mask_br,
        surrogate=surrogate,
        clip_low=clip_low,
        clip_high=clip_high,
    )
    w_br = losses.aggregation_weights(
        mask_br, loss_agg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len
    )
    pg_loss = weighted_sum(pg_br, w_br, mask_br)
    kl_loss, sums = kl_terms(logp_br, old_br, ref_br, w_br, mask_br, num_tokens)
    loss = pg_loss
    if kl_loss is not None:
        loss = loss + kl_coef * kl_loss
    if router is not None:
        aux, moe_sums = moe_terms(
            model_config, *router, getattr(batch, "routed_experts", None), micro_batches
        )
        if router_aux_loss_coef:
            loss = loss + router_aux_loss_coef * aux
        sums.update(moe_sums)

    ratio_sums, maxes = ratio_metrics(logp_br, old_br, mask_br, num_tokens)
    sums.update(
        ratio_sums,
        pg_loss=pg_loss,
        loss=loss,
        clip_frac=token_mean_part(clipped_br, mask_br, num_tokens),
        entropy=token_mean_part(entropy_br, mask_br, num_tokens),
        logprob_mean=token_mean_part(logp_br, mask_br, num_tokens),
    )
    own_scale = own_gradient_scale(mask_br, loss_agg, num_tokens, num_seqs)
    return loss, (sums, maxes, own_scale)


def _policy_logprobs(
    model_config: model_lib.ModelConfig,
    params: Params,
    batch: Batch,
    temperature: float,
    routing_replay: bool,
) -> tuple[jax.Array, jax.Array, tuple[jax.Array, jax.Array] | None]:
    """(log-probs [B, R], entropies [B, R], router) of the batch's response tokens under
    the policy; ``router`` is a MoE policy's (router logits [L, B * T, E], token mask
    [B * T]) over all B * T tokens, None for a dense one. Chunked over response positions
    (``model_config.logits_chunk``): no [B, R, V]."""
    if model_config.num_experts:
        logp_br, entropy_br, router_lte, router_mask_t = logprobs_lib.response_logprobs_and_router(
            model_config, params, batch, temperature, replay=routing_replay
        )
        return logp_br, entropy_br, (router_lte, router_mask_t)
    if routing_replay:
        raise ValueError("routing_replay=True needs a MoE policy (num_experts > 0)")
    logp_br, entropy_br = logprobs_lib.response_logprobs(model_config, params, batch, temperature)
    return logp_br, entropy_br, None


def surrogate_per_token(
    logp_br: jax.Array,
    old_br: jax.Array,
    adv: jax.Array,
    mask_br: jax.Array,
    *,
    surrogate: str,
    clip_low: float,
    clip_high: float,
) -> tuple[jax.Array, jax.Array]:
    """The clipped surrogate as per-token values, ready for ``losses.aggregation_weights``.

    Args:
      logp_br: [B, R] current log-probs (differentiated).
      old_br: [B, R] behaviour-policy log-probs.
      adv: [B] per-sequence (GRPO) or [B, R] per-token (the PPO actor) advantages.
      mask_br: [B, R] bool real response tokens.
      surrogate: ``"token"`` (``losses.clipped_policy_loss``) or ``"gspo"``
        (``losses.gspo_policy_loss``, [B] advantages only).
      clip_low, clip_high: ratio bounds ``1 - clip_low``, ``1 + clip_high``.

    Returns:
      (loss [B, R], clipped [B, R]: 1.0 where clipping removed the gradient). GSPO's
      per-sequence loss and clip indicator are repeated over each sequence's tokens:
      under seq_mean_token_mean weights (mask / (len * seqs)) the weighted sum is then
      mean_b loss_b.
    """
    if surrogate == "gspo":
        if adv.ndim != 1:
            raise ValueError(
                f"surrogate='gspo' needs one advantage per sequence, got shape {adv.shape}"
            )
        loss_b, clipped_b, _ = losses.gspo_policy_loss(
            logp_br, old_br, adv, mask_br, clip_low=clip_low, clip_high=clip_high
        )
        return (
            jnp.broadcast_to(loss_b[:, None], mask_br.shape),
            jnp.broadcast_to(clipped_b[:, None], mask_br.shape),
        )
    if surrogate == "token":
        adv_br = adv[:, None] if adv.ndim == 1 else adv
        return losses.clipped_policy_loss(
            logp_br, old_br, adv_br, clip_low=clip_low, clip_high=clip_high
        )
    raise ValueError(f"surrogate={surrogate!r}; expected one of {losses.POLICY_LOSSES}")


def weighted_sum(x_br: jax.Array, w_br: jax.Array, mask_br: jax.Array) -> jax.Array:
    """``sum(w * x)`` over real tokens: a loss term under ``aggregation_weights`` ``w``."""
    return jnp.sum(jnp.where(mask_br, x_br * w_br, 0.0))


def token_mean_part(x_br: jax.Array, mask_br: jax.Array, num_tokens: jax.Array) -> jax.Array:
    """This micro-batch's share of the full batch's token mean of ``x`` (not
    differentiated): the shares of all micro-batches add up to the full-batch mean."""
    return losses.masked_sum(jax.lax.stop_gradient(x_br), mask_br) / num_tokens


def kl_terms(
    logp_br: jax.Array,
    old_br: jax.Array,
    ref_br: jax.Array | None,
    w_br: jax.Array,
    mask_br: jax.Array,
    num_tokens: jax.Array,
) -> tuple[jax.Array | None, Metrics]:
    """The k3 KL to the reference as a loss term, and the KL metrics.

    Args:
      logp_br: [B, R] current log-probs.
      old_br: [B, R] behaviour-policy log-probs.
      ref_br: [B, R] float32 reference log-probs, or None (no reference kept).
      w_br: [B, R] aggregation weights of the loss.
      mask_br: [B, R] bool real response tokens.
      num_tokens: real response tokens of the full batch.

    Returns:
      (kl_loss, sums): ``kl_loss`` is ``sum(w * k3(logp, ref))`` (None without a
      reference); ``sums`` hold token-mean parts of ``kl_old`` (k3 to the behaviour
      policy) and ``kl`` (k3 to the reference, else ``kl_old``), and ``kl_loss``.
    """
    sums = {"kl_old": token_mean_part(losses.kl_k3(logp_br, old_br), mask_br, num_tokens)}
    if ref_br is None:
        sums["kl"] = sums["kl_old"]
        return None, sums
    kl_ref_br = losses.kl_k3(logp_br, ref_br)
    kl_loss = weighted_sum(kl_ref_br, w_br, mask_br)
    sums["kl_loss"] = kl_loss
    sums["kl"] = token_mean_part(kl_ref_br, mask_br, num_tokens)
    return kl_loss, sums


def moe_terms(
    model_config: model_lib.ModelConfig,
    router_lte: jax.Array,
    router_mask_t: jax.Array,
    routed_experts: jax.Array | None,
    micro_batches: int,
) -> tuple[jax.Array, Metrics]:
    """A MoE policy's load-balancing loss and its router metrics.

    Args:
      model_config: the policy's shape (``num_experts_per_tok`` = A).
      router_lte: [L, B * T, E] router logits over all B * T tokens (T = I + R).
      router_mask_t: [B * T] real (prompt + response) tokens.
      routed_experts: [B, T, L, A] the sampler's expert choices, or None.
      micro_batches: micro-batches of the update; each one's loss counts
        ``1 / micro_batches``.

    Returns:
      (aux, sums): HF's load-balancing loss of this micro-batch (differentiated), and
      ``moe_aux_loss``, the router sums (``moe.router_sums``) and, with
      ``routed_experts``, the routing-disagreement sums.
    """
    k = model_config.num_experts_per_tok
    aux = moe_lib.load_balancing_loss(router_lte, router_mask_t, k) / micro_batches
    sums = {"moe_aux_loss": jax.lax.stop_gradient(aux)}
    sums.update(moe_lib.router_sums(router_lte, router_mask_t, k))
    if routed_experts is not None:
        mask_bt = router_mask_t.reshape(routed_experts.shape[:2])
        sums.update(moe_lib.routing_disagreement_sums(router_lte, routed_experts, mask_bt, k))
    return aux, sums


def ratio_metrics(
    logp_br: jax.Array,
    old_br: jax.Array,
    mask_br: jax.Array,
    num_tokens: jax.Array,
) -> tuple[Metrics, Metrics]:
    """(sums, maxes): the token-mean part of the ratio ``pi / pi_old`` (``ratio_mean``)
    and its largest value over real tokens (``ratio_max``); the log-ratio is clamped to
    [-20, 20] like the losses'."""
    ratio_br = jnp.exp(jnp.clip(logp_br - old_br, -20.0, 20.0))
    sums = {"ratio_mean": token_mean_part(ratio_br, mask_br, num_tokens)}
    maxes = {"ratio_max": jnp.max(jnp.where(mask_br, jax.lax.stop_gradient(ratio_br), 0.0))}
    return sums, maxes


def own_gradient_scale(
    mask_br: jax.Array, loss_agg: str, num_tokens: jax.Array, num_seqs: jax.Array | int
) -> jax.Array:
    """``|g_own| / |g|``: converts a micro-batch's gradient under the full batch's
    normalisers to the gradient of its own normalised loss (for the gradient noise
    scale): full-batch tokens (token_mean) or sequences over this micro-batch's."""
    if loss_agg == "token_mean":
        return num_tokens / jnp.maximum(jnp.sum(mask_br.astype(jnp.float32)), 1.0)
    real_seqs = jnp.sum(jnp.any(mask_br, axis=1).astype(jnp.float32))
    return num_seqs / jnp.maximum(real_seqs, 1.0)


# ------------------------------------------------------------- generic update blocks


def split_batch(batch: Any, n: int, mesh: Mesh | None = None) -> Any:
    """[B, ...] leaves -> [n, B / n, ...]; piece m holds rows m, m + n, m + 2n, ...

    Strided so that each piece takes an equal share of every device's rows (no
    communication when the batch is sharded along dimension 0 and n divides the
    per-device row count).
    """

    def split(x):
        if x.shape[0] % n:
            raise ValueError(f"batch of {x.shape[0]} rows cannot be split into {n} pieces")
        return jnp.swapaxes(x.reshape(x.shape[0] // n, n, *x.shape[1:]), 0, 1)

    out = jax.tree.map(split, batch)
    if mesh is not None:
        out = jax.lax.with_sharding_constraint(out, sharding_lib.stacked_batch_sharding(mesh))
    return out


def _tree_sq_norm(tree) -> jax.Array:
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


def _tree_dot(a, b) -> jax.Array:
    return sum(
        jnp.sum(x.astype(jnp.float32) * y.astype(jnp.float32))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def check_group_pairs(prompts: int, group_size: int, micro_batches: int) -> None:
    """Raises ValueError unless a batch of ``prompts`` x ``group_size`` rows splits into
    ``micro_batches`` half-group pairs (``group_pair_order``): M >= 4 and even (two pairs
    at least: one pair cannot tell the prompt means' spread from the mean gradient), G
    even, and P divisible by M / 2."""
    if micro_batches < 4 or micro_batches % 2:
        raise ValueError(
            f"the group noise split needs an even micro_batches >= 4, got {micro_batches}"
        )
    if group_size < 2 or group_size % 2:
        raise ValueError(f"the group noise split needs an even group_size, got {group_size}")
    if prompts % (micro_batches // 2):
        raise ValueError(
            f"the group noise split needs prompts ({prompts}) divisible by micro_batches / 2 "
            f"({micro_batches // 2})"
        )


def group_pair_order(prompts: int, group_size: int, micro_batches: int) -> np.ndarray:
    """[B] row order that makes ``split_batch``'s micro-batches half-group pairs.

    Rows are prompt-major (row ``p * G + g``). With K = M / 2 pairs, pair k holds the
    groups p = k, k + K, k + 2K, ... (P / K of them, whole); its micro-batch 2k holds
    their members g < G / 2 and micro-batch 2k + 1 their members g >= G / 2. So the two
    micro-batches of a pair share all their prompts and two micro-batches of different
    pairs share none (the layout ``rl_batch.analysis.noise_scale.group_noise_terms``
    assumes). ``batch[order]`` then ``split_batch(., M)`` gives that layout: micro-batch
    m, row i is reordered row ``i * M + m``.

    Raises:
      ValueError: from ``check_group_pairs``.
    """
    check_group_pairs(prompts, group_size, micro_batches)
    k_pairs, half = micro_batches // 2, group_size // 2
    rows = prompts * group_size // micro_batches  # per micro-batch
    i = np.arange(rows)[:, None]  # [rows, 1] row within a micro-batch
    m = np.arange(micro_batches)[None, :]  # [1, M]
    prompt = m // 2 + k_pairs * (i // half)  # [rows, M]
    member = (m % 2) * half + i % half  # [rows, M]
    return (prompt * group_size + member).reshape(-1)  # index i * M + m


def accumulate_gradients(
    loss_fn: Callable[[Params, Any], tuple[jax.Array, tuple[Metrics, Metrics, jax.Array]]],
    params: Params,
    batch: Any,
    micro_batches: int,
    mesh: Mesh | None = None,
    group_size: int = 0,
) -> tuple[Params, jax.Array, Metrics]:
    """Gradient of ``sum_m loss_fn(params, micro_batch_m)`` via ``lax.scan``.

    ``loss_fn`` must normalise by the full batch's totals (see ``grpo_loss``), so the
    sum over micro-batches is the full-batch loss and its gradient.

    Args:
      loss_fn: ``(params, batch) -> (loss, (sums, maxes, own_scale))``.
      params: differentiated parameters.
      batch: the batch (leaves [B, ...], with a [B, R] ``response_mask``).
      micro_batches: M; B must be divisible by M.
      mesh: optional, to keep micro-batches sharded.
      group_size: G > 0: the batch is P prompts x G responses, prompt-major; its rows
        are reordered by ``group_pair_order`` (micro-batches 2k and 2k + 1 hold the two
        halves of the same whole groups) and the statistics of the inter-/intra-prompt
        noise split are added. 0: rows in order, no split.

    Returns:
      (grads, loss, metrics). With M > 1 the metrics include the gradient-noise-scale
      statistics (see ``rl_batch.analysis.noise_scale``), counted in real sequences:
      rows whose ``response_mask`` is all False (padding of filtered groups) are not
      examples, and micro-batches holding none are left out:

      - ``grad_sq_micro``: mean over the non-empty micro-batches of the squared norm of
        each one's own gradient ``|g_m|^2``;
      - ``grad_sq_full``: the full batch's ``|g_B|^2``;
      - ``gns_batch_micro``: the harmonic mean of the non-empty micro-batches' sequence
        counts ``b_m`` (B / M without padding), the size b for which
        ``E[grad_sq_micro] = |G|^2 + tr(Sigma) / b``; 0 when every row is padding;
      - ``gns_batch_full``: real sequences in the batch.

      With ``group_size`` > 0 also (see ``noise_scale.group_noise_terms``):

      - ``grad_dot_pair``: mean over the pairs whose micro-batches hold real sequences
        of an unbiased estimate of ``<g_2k, g_2k+1>``, the inner product of the two
        halves' own gradients, ``E = |G|^2 + tr(Sigma_inter) / n_k`` with ``n_k`` the
        real prompts of pair k. It is read off the running sum of the gradients (no
        gradient is kept): with ``d_m = <g_m, sum_{m' < m} grad_m'>`` (``grad_m'`` the
        full-batch-normalised gradient, ``g_m = own_m grad_m``),
        ``own_2k (d_2k+1 - d_2k) = <g_2k+1, g_2k> + own_2k <g_2k+1 - g_2k, sum_{m' < 2k}
        grad_m'>`` and the last term has mean 0 (the halves share their prompts; the
        earlier pairs hold other prompts);
      - ``gns_prompts_pair``: the harmonic mean of those pairs' real prompts ``n_k``;
      - ``gns_prompts_full``: real prompts in the batch (groups with a real sequence).
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if micro_batches == 1:
        (loss, (sums, maxes, _)), grads = grad_fn(params, batch)
        return grads, loss, moe_lib.finalize_router_metrics({**sums, **maxes})

    if group_size:
        rows = jax.tree.leaves(batch)[0].shape[0]
        order = group_pair_order(rows // group_size, group_size, micro_batches)
        batch = jax.tree.map(lambda x: x[order], batch)
    stacked = split_batch(batch, micro_batches, mesh)
    # Real sequences per micro-batch [M]: rows with at least one response token.
    seqs_m = jnp.sum(jnp.any(stacked.response_mask.astype(bool), axis=2), axis=1)
    seqs_m = seqs_m.astype(jnp.float32)

    def body(carry, micro):
        grads_acc, sums_acc, maxes_acc = carry
        (_, (sums, maxes, own_scale)), grads = grad_fn(params, micro)
        sums_acc = jax.tree.map(jnp.add, sums_acc, sums)
        maxes_acc = jax.tree.map(jnp.maximum, maxes_acc, maxes)
        own_sq = jnp.square(own_scale) * _tree_sq_norm(grads)
        # <g_m, sum of the earlier micro-batches' grads> (before this one is added).
        dot = own_scale * _tree_dot(grads, grads_acc) if group_size else jnp.float32(0.0)
        grads_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_acc, grads)
        return (grads_acc, sums_acc, maxes_acc), (own_sq, dot, jnp.asarray(own_scale, jnp.float32))

    first = jax.tree.map(lambda x: x[0], stacked)
    _, (sums0, maxes0, _) = jax.eval_shape(loss_fn, params, first)
    init = (
        jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums0),
        jax.tree.map(lambda s: jnp.full(s.shape, -jnp.inf, s.dtype), maxes0),
    )
    (grads, sums, maxes), (own_sq_m, dot_m, own_m) = jax.lax.scan(body, init, stacked)
    # E|g_m|^2 = |G|^2 + tr(Sigma) / b_m, so the mean over non-empty micro-batches goes
    # with b = 1 / mean(1 / b_m), the harmonic mean (an empty one has no gradient).
    nonempty_m = seqs_m > 0
    n_nonempty = jnp.sum(nonempty_m.astype(jnp.float32))
    inv_seqs = jnp.sum(jnp.where(nonempty_m, 1.0 / jnp.maximum(seqs_m, 1.0), 0.0))
    grad_sq_micro = jnp.sum(jnp.where(nonempty_m, own_sq_m, 0.0)) / jnp.maximum(n_nonempty, 1.0)
    seqs_micro = jnp.where(n_nonempty > 0, n_nonempty / jnp.maximum(inv_seqs, 1e-30), 0.0)
    metrics = {
        **moe_lib.finalize_router_metrics({**sums, **maxes}),
        "grad_sq_micro": grad_sq_micro,
        "grad_sq_full": _tree_sq_norm(grads),
        "gns_batch_micro": seqs_micro,
        "gns_batch_full": jnp.sum(seqs_m),
    }
    if group_size:
        metrics.update(_pair_statistics(seqs_m, dot_m, own_m, group_size))
    # Accumulated in float32; hand back gradients in the parameters' dtype.
    grads = jax.tree.map(lambda g, p: g.astype(jnp.result_type(p)), grads, params)
    return grads, sums["loss"], metrics


def _pair_statistics(
    seqs_m: jax.Array, dot_m: jax.Array, own_m: jax.Array, group_size: int
) -> Metrics:
    """``grad_dot_pair``, ``gns_prompts_pair``, ``gns_prompts_full`` (see
    ``accumulate_gradients``) from the [M] real sequences, running-sum inner products
    and own-gradient scales of the half-group micro-batches."""
    cross_k = own_m[0::2] * (dot_m[1::2] - dot_m[0::2])  # [M / 2]
    # A dropped group empties its rows in both halves; count a pair's real prompts by
    # its real sequences (a whole group is G of them).
    prompts_k = (seqs_m[0::2] + seqs_m[1::2]) / group_size  # [M / 2]
    real_k = (seqs_m[0::2] > 0) & (seqs_m[1::2] > 0)
    n_real = jnp.sum(real_k.astype(jnp.float32))
    inv_prompts = jnp.sum(jnp.where(real_k, 1.0 / jnp.maximum(prompts_k, 1e-30), 0.0))
    return {
        "grad_dot_pair": jnp.sum(jnp.where(real_k, cross_k, 0.0)) / jnp.maximum(n_real, 1.0),
        "gns_prompts_pair": jnp.where(n_real > 0, n_real / jnp.maximum(inv_prompts, 1e-30), 0.0),
        "gns_prompts_full": jnp.sum(seqs_m) / group_size,
    }


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


# ---------------------------------------------------------------- update skeleton


def loss_normalisers(response_mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(real response tokens, real sequences) of a batch, each at least 1.

    Rows without response tokens are padding (fixed shapes after filtering).
    """
    mask_br = response_mask.astype(bool)
    num_tokens = jnp.maximum(jnp.sum(mask_br.astype(jnp.float32)), 1.0)
    num_seqs = jnp.maximum(jnp.sum(jnp.any(mask_br, axis=1).astype(jnp.float32)), 1.0)
    return num_tokens, num_seqs


def check_split(b: int, num_minibatches: int, micro_batches: int, n_shards: int) -> None:
    """Raises ValueError unless B rows split into minibatches of micro-batches whose
    size the mesh's batch shards divide (trace time)."""
    per_update = b // num_minibatches
    if b % num_minibatches or per_update % micro_batches:
        raise ValueError(
            f"batch of {b} sequences cannot be split into num_minibatches="
            f"{num_minibatches} x micro_batches={micro_batches}"
        )
    micro = per_update // micro_batches
    if micro % n_shards:
        raise ValueError(
            f"micro-batch of {micro} sequences (batch {b} / num_minibatches "
            f"{num_minibatches} / micro_batches {micro_batches}) is not "
            f"divisible by the {n_shards} batch shards of the mesh"
        )


def sequence_metrics(response_mask: jax.Array) -> Metrics:
    """``response_len_mean`` (over real rows), ``response_tokens`` and ``sequences``."""
    lengths_b = jnp.sum(response_mask.astype(jnp.float32), axis=1)
    num_real = jnp.sum((lengths_b > 0).astype(jnp.float32))
    return {
        "response_len_mean": jnp.sum(lengths_b) / jnp.maximum(num_real, 1.0),
        "response_tokens": jnp.sum(lengths_b),
        "sequences": num_real,
    }


def delta_norm(new: Params, old: Params) -> jax.Array:
    """Global norm of ``new - old`` in float32 (an update's size)."""
    return optax.tree.norm(
        jax.tree.map(lambda n, o: n.astype(jnp.float32) - o.astype(jnp.float32), new, old)
    )


def jit_update(update_fn: Callable, state_sharding: Any, mesh: Mesh) -> Callable:
    """``jax.jit`` of ``update_fn(state, batch, rng)``: the state donated and kept on
    ``state_sharding``, the batch split over the mesh's batch axes, rng and metrics
    replicated."""
    replicated = sharding_lib.replicated(mesh)
    return jax.jit(
        update_fn,
        in_shardings=(state_sharding, sharding_lib.batch_sharding(mesh), replicated),
        out_shardings=(state_sharding, replicated),
        donate_argnums=0,
    )


def rollout_fields(ro: Any, keep_p: np.ndarray) -> dict[str, jax.Array]:
    """The sequences of a rollout (row p * G + g) as batch fields, on the host.

    ``prompt_tokens``, ``prompt_mask``, ``response_tokens``, ``response_mask`` (all False
    on the responses of dropped groups, ``keep_p`` False) and ``old_logprobs`` (the
    sampler's). Dropped rows weigh nothing while every batch keeps one shape.
    """
    s = ro.samples
    g = ro.rewards_pg.shape[1]
    keep_b = np.repeat(np.asarray(keep_p, bool), g)
    return dict(
        prompt_tokens=jnp.asarray(s.prompt_tokens, jnp.int32),
        prompt_mask=jnp.asarray(s.prompt_mask, bool),
        response_tokens=jnp.asarray(s.response_tokens, jnp.int32),
        response_mask=jnp.asarray(np.asarray(s.response_mask, bool) & keep_b[:, None]),
        old_logprobs=jnp.asarray(s.response_logprobs, jnp.float32),
    )


# ------------------------------------------------------------ the run loop's view


@runtime_checkable
class Algorithm(Protocol):
    """What ``rl_batch.runs.run`` needs of a learner (``grpo.GRPO``, ``ppo.PPO``).

    Attributes:
      filter_groups: drop groups whose rewards are all equal before the update.
      update_fn: the jitted ``update_fn(state, batch, rng) -> (state, metrics)``.
    """

    filter_groups: bool
    update_fn: Callable[[Any, Any, jax.Array], tuple[Any, Metrics]]

    def init_state(self, params: Params) -> Any:
        """The train state from the initial policy."""
        ...

    def policy_params(self, state: Any) -> Params:
        """The policy's params in ``state`` (what the sampler generates with)."""
        ...

    def make_batch(self, ro: Any, keep_p: np.ndarray) -> Any:
        """The update's sharded batch from a rollout and its [P] kept groups."""
        ...

    def trains_policy(self, metrics: dict) -> bool:
        """Whether the update with these metrics trained the policy (the sample axis)."""
        ...

    def extra_update_flops(self, costs: dict[str, float]) -> float:
        """FLOPs ``make_batch`` adds to an update besides forward + backward."""
        ...
