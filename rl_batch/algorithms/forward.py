"""The model on a batch: outputs aligned with the response tokens, and their log-probs.

``response_outputs`` runs the transformer over ``concat(prompt, response)`` and keeps the
positions that predict the response tokens: the logits at index ``I - 1 + j`` predict
response token ``j``, so the response logits are ``logits[:, I - 1 : I + R - 1]`` (the
PPO critic reads its values from the same slice). ``compute_logprobs`` gives [B, R]
log-probs under softmax(logits / temperature) (the sampler reports log-probs at the
sampling temperature), ``compute_logprobs_micro`` the same a micro-batch at a time, and
``make_logprobs_fn`` a jitted, sharded version (reference-policy log-probs). The policy
loss's own log-probs and entropies are chunked over response positions
(``rl_batch.models.logprobs``; see ``policy_loss._policy_logprobs``).

Shape letters (docs/glossary.md): B sequences, I prompt tokens, R response tokens,
T = I + R, V vocabulary, L layers, E experts, A experts per token, M micro-batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rl_batch.algorithms.batch import Batch, split_batch
from rl_batch.models import logprobs as logprobs_lib
from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib

Params = Any


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
