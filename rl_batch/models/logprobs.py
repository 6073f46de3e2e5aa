"""Token log-probs and entropy from hidden states, without a [B, R, V] logits array.

With V = 151,936 the fp32 response logits of one 2k-token sequence are 1.2 GB, and the
backward pass of ``log_softmax`` keeps several arrays of that size. Here the head is
applied to ``chunk`` response positions at a time inside a ``lax.scan`` whose body is
rematerialised (``jax.checkpoint``): the forward pass keeps only the [B, R] results,
and the backward pass recomputes one [B, chunk, V] block of logits at a time. Values
and gradients equal the unchunked computation (``chunk=0``), which is the reference.

Numerics match ``rl_batch.models.transformer``'s head: logits = ``hidden @ head`` in the hidden
states' dtype, then float32, then divided by the temperature; log-softmax and entropy
in float32.

Shape letters (docs/glossary.md): B sequences, I prompt tokens, R response positions,
D model width, V vocabulary, C chunk length, L sparse layers, E experts.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rl_batch.models import transformer as model_lib


def _block(
    hidden_bcd: jax.Array, head_dv: jax.Array, targets_bc: jax.Array, temperature: float
) -> tuple[jax.Array, jax.Array]:
    """(log p(target) [B, C], entropy [B, C]) of one block, in float32."""
    logits_bcv = model_lib.dense(hidden_bcd, head_dv).astype(jnp.float32) / temperature
    logp_bcv = jax.nn.log_softmax(logits_bcv, axis=-1)
    logp_bc = jnp.take_along_axis(logp_bcv, targets_bc[..., None], axis=-1)[..., 0]
    entropy_bc = -jnp.sum(jnp.exp(logp_bcv) * logp_bcv, axis=-1)
    return logp_bc, entropy_bc


def logprobs_and_entropy(
    hidden_brd: jax.Array,
    head_dv: jax.Array,
    targets_br: jax.Array,
    *,
    temperature: float = 1.0,
    chunk: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Log-probs of ``targets`` and entropies under softmax((hidden @ head) / temperature).

    Args:
      hidden_brd: [B, R, D] final hidden states (their dtype is the matmul dtype).
      head_dv: [D, V] LM head (cast to the hidden states' dtype).
      targets_br: [B, R] int token ids.
      temperature: divides the logits.
      chunk: positions per block (C); 0 or >= R computes all R positions at once.
        R is padded up to a multiple of C (padded positions are dropped).

    Returns:
      (logp [B, R], entropy [B, R]) float32, both differentiable with respect to
      ``hidden_brd`` and ``head_dv``.
    """
    b, r, d = hidden_brd.shape
    head_dv = head_dv.astype(hidden_brd.dtype)
    if chunk <= 0 or chunk >= r:
        return _block(hidden_brd, head_dv, targets_br, temperature)
    n = -(-r // chunk)
    pad = n * chunk - r
    hidden_brd = jnp.pad(hidden_brd, ((0, 0), (0, pad), (0, 0)))
    targets_br = jnp.pad(targets_br, ((0, 0), (0, pad)))
    # [N, B, C, ...]: the chunk axis leads (scanned); B stays whole, so a batch sharded
    # along B stays sharded in every block.
    hidden_nbcd = jnp.moveaxis(hidden_brd.reshape(b, n, chunk, d), 1, 0)
    targets_nbc = jnp.moveaxis(targets_br.reshape(b, n, chunk), 1, 0)

    # Saves only the block's inputs; the backward pass recomputes its logits.
    @jax.checkpoint
    def body(head_dv, xs):
        hidden_bcd, targets_bc = xs
        return _block(hidden_bcd, head_dv, targets_bc, temperature)

    def step(carry, xs):
        return carry, body(head_dv, xs)

    _, (logp_nbc, entropy_nbc) = jax.lax.scan(step, None, (hidden_nbcd, targets_nbc))

    def unchunk(x_nbc):
        return jnp.moveaxis(x_nbc, 0, 1).reshape(b, n * chunk)[:, :r]

    return unchunk(logp_nbc), unchunk(entropy_nbc)


def response_hidden(model_config: model_lib.ModelConfig, params: Any, batch: Any) -> jax.Array:
    """[B, R, D] hidden states whose row j predicts response token j.

    Args:
      model_config: the policy's shape.
      params: its parameters.
      batch: anything with ``prompt_tokens`` / ``prompt_mask`` [B, I] (left-padded) and
        ``response_tokens`` / ``response_mask`` [B, R] (see ``rl_batch.algorithms.batch.Batch``).
    """
    p = batch.prompt_tokens.shape[1]
    r = batch.response_tokens.shape[1]
    tokens_bt = jnp.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
    mask_bt = jnp.concatenate(
        [batch.prompt_mask.astype(bool), batch.response_mask.astype(bool)], axis=1
    )
    hidden_btd = model_lib.forward_hidden(
        model_config,
        params,
        tokens_bt,
        input_mask_bt=mask_bt,
        positions_bt=model_lib.positions_from_mask(mask_bt),
    )
    return hidden_btd[:, p - 1 : p + r - 1]


def response_logprobs(
    model_config: model_lib.ModelConfig,
    params: Any,
    batch: Any,
    temperature: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """(log-probs [B, R], entropies [B, R]) of a batch's response tokens at
    ``temperature``, ``model_config.logits_chunk`` positions at a time. Padding
    positions hold unused values (mask them)."""
    return logprobs_and_entropy(
        response_hidden(model_config, params, batch),
        model_lib.lm_head(model_config, params),
        batch.response_tokens,
        temperature=temperature,
        chunk=model_config.logits_chunk,
    )


def response_logprobs_and_router(
    model_config: model_lib.ModelConfig,
    params: Any,
    batch: Any,
    temperature: float = 1.0,
    *,
    replay: bool = False,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``response_logprobs`` of a MoE policy, with its router logits.

    Args:
      model_config: a MoE policy's shape (``num_experts > 0``).
      params, batch, temperature: as ``response_logprobs``.
      replay: route by ``batch.routed_experts`` (routing replay) instead of the router's
        top-k (``transformer.forward_hidden_with_router``).

    Returns:
      (log-probs [B, R], entropies [B, R], router logits [L, B * (I + R), E] of every
      sparse layer, token mask [B * (I + R)] of the real prompt and response tokens).
    """
    replay_btlk = None
    if replay:
        replay_btlk = getattr(batch, "routed_experts", None)
        if replay_btlk is None:
            raise ValueError("routing replay needs the batch's routed_experts (None)")
    p = batch.prompt_tokens.shape[1]
    r = batch.response_tokens.shape[1]
    tokens_bt = jnp.concatenate([batch.prompt_tokens, batch.response_tokens], axis=1)
    mask_bt = jnp.concatenate(
        [batch.prompt_mask.astype(bool), batch.response_mask.astype(bool)], axis=1
    )
    hidden_btd, router_lte = model_lib.forward_hidden_with_router(
        model_config,
        params,
        tokens_bt,
        input_mask_bt=mask_bt,
        positions_bt=model_lib.positions_from_mask(mask_bt),
        replay_experts_btlk=replay_btlk,
    )
    logp_br, entropy_br = logprobs_and_entropy(
        hidden_btd[:, p - 1 : p + r - 1],
        model_lib.lm_head(model_config, params),
        batch.response_tokens,
        temperature=temperature,
        chunk=model_config.logits_chunk,
    )
    return logp_br, entropy_br, router_lte, mask_bt.reshape(-1)
