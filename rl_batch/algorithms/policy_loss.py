"""The clipped policy-gradient loss of GRPO and of the PPO actor.

``policy_loss`` is the whole loss of one (micro-)batch: log-probs and entropies of the
response tokens under the policy, the clipped surrogate (``surrogate_per_token``: the
token-level ``losses.clipped_policy_loss`` or GSPO's sequence-level
``losses.gspo_policy_loss``), aggregated by ``losses.aggregation_weights``
(``weighted_sum``), plus ``kl_coef`` x k3-KL to a reference (``kl_terms``) and, for a
MoE policy, its load-balancing loss (``moe_terms``); the metrics (``ratio_metrics``,
``token_mean_part``) and the micro-batch's own-gradient scale (``own_gradient_scale``,
for the gradient noise statistics). Each piece is a short pure function of arrays;
tests/test_policy_loss_parts.py checks each against numbers worked by hand.

``grpo.grpo_loss`` calls ``policy_loss`` with GRPO's settings; ``ppo`` with the actor's.
The clip range reaches the loss as ``ClipRange``, an argument of the jitted update (not a
constant compiled into it), so a batch schedule's clip at each batch needs no recompile.
Every loss is normalised by the *full* batch's totals (``num_tokens``, ``num_seqs``), so
the micro-batches' losses add up to the full batch's (``update_step.accumulate_gradients``).

Shape letters (docs/glossary.md): B sequences, I prompt tokens, R response tokens,
T = I + R, L layers, E experts, A experts per token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_batch.algorithms import losses
from rl_batch.algorithms.batch import Batch
from rl_batch.models import logprobs as logprobs_lib
from rl_batch.models import moe as moe_lib
from rl_batch.models import transformer as model_lib

Params = Any
Metrics = dict[str, jax.Array]


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


class ClipRange(NamedTuple):
    """The policy-ratio clip range one update trains with: ratio bounds ``1 - low``,
    ``1 + high``. A pytree of two [] float32 values, passed to the jitted update as an
    argument (traced), so a new range at a new scheduled batch reuses the compiled
    update (``hparam_rules.clip``: ``rl_batch.runs.sections.BatchRules.at``)."""

    low: jax.Array | np.ndarray  # [] float32: clip_low
    high: jax.Array | np.ndarray  # [] float32: clip_high

    @classmethod
    def of(cls, clip_low: float, clip_high: float) -> ClipRange:
        """The range as float32 scalars (one argument type for every call: Python floats
        would be weakly typed, a second compiled program)."""
        return cls(np.float32(clip_low), np.float32(clip_high))


def policy_loss(
    model_config: model_lib.ModelConfig,
    params: Params,
    batch: Batch,
    *,
    clip_low: float | jax.Array,
    clip_high: float | jax.Array,
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
    ``update_step.accumulate_gradients``), ``moe_aux_loss`` (HF's load-balancing loss, weighing
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
      clip_low, clip_high: ratio bounds ``1 - clip_low``, ``1 + clip_high`` (floats, or
        [] arrays: a ``ClipRange`` traced through the update).
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
    clip_low: float | jax.Array,
    clip_high: float | jax.Array,
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
