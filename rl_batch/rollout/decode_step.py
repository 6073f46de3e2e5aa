"""The decode step both engines share: one forward pass over the KV cache (with the MoE
routing record), then a sampled token and its log-prob per row.

Shape letters (docs/glossary.md): B rows, I prompt slots, R response slots, S = I + R
cache slots, T fed tokens, V vocabulary, L sparse layers, A experts per token.

The static engine (``rollout.static``) feeds all B rows at one slot per step; the
continuous engine (``rollout.continuous``) feeds its W decode slots each at its own
slot. Both call ``forward`` (every cache write is per row, ``cache_index`` [B], so both
round every log-prob alike) and ``sample_and_score``.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from rl_batch.models import moe as moe_lib
from rl_batch.models import transformer as model_lib
from rl_batch.rollout.sampling import SamplingConfig

ModelConfig = model_lib.ModelConfig
Params = model_lib.Params


@flax.struct.dataclass
class SampleOutput:
    """Sampled responses. Device arrays from ``sample_batch``; numpy from ``Sampler``."""

    prompt_tokens: Any  # [B, I] int32, left-padded with pad_id
    prompt_mask: Any  # [B, I] bool
    response_tokens: Any  # [B, R] int32, right-padded with pad_id, EOS included
    response_mask: Any  # [B, R] bool, True for generated tokens (EOS included)
    response_logprobs: Any  # [B, R] float32 log p(token) at logprob_temperature, 0 if masked
    lengths: Any  # [B] int32 generated tokens (EOS included)
    # [B, I + R, L, k] int16 expert choices per token and sparse layer in the sampler's
    # forward (prompt slots, then response slots; -1 where none: padding and the last
    # token, which is sampled but never fed), or None when routing is not recorded.
    routed_experts: Any = None


def sample_and_score(
    logits_bv: jax.Array, rng_b: jax.Array, sampling: SamplingConfig
) -> tuple[jax.Array, jax.Array]:
    """Draws tokens [B] and their log-probs [B] under softmax(logits / T), before filters."""
    tokens_b = sampling.method()(logits_bv, rng_b)
    scaled_bv = logits_bv / sampling.logprob_temperature
    chosen_b = jnp.take_along_axis(scaled_bv, tokens_b[:, None], axis=-1)[:, 0]
    return tokens_b, chosen_b - jax.nn.logsumexp(scaled_bv, axis=-1)


def prefill_prompts(config, params, prompt_tokens_bi, prompt_mask_bi, r, cache_dtype, record):
    """Runs [B, I] left-padded prompts through the model into a I-slot cache.

    Returns:
      (logits [B, 1, V] at slot I-1, the I-slot cache, the [B, I + R, L, k] routing
      record with the prompt part filled when ``record``, else None).
    """
    b, p = prompt_tokens_bi.shape
    positions_bi = model_lib.positions_from_mask(prompt_mask_bi)
    # Prefill attends over the I prompt slots only (a I-slot cache), then the cache is
    # padded to S = I + R: the prompt's attention over empty response slots would be
    # wasted work (about 3x the prefill attention cost for I=16, R=32).
    prompt_cache = model_lib.init_cache(config, b, p, cache_dtype)
    experts_bsla = None
    if record:
        shape = (b, p + r, config.num_moe_layers, config.num_experts_per_tok)
        experts_bsla = jnp.full(shape, -1, EXPERT_DTYPE)
    # Only the last prompt position's logits are used (prompts are left-padded, so it
    # is every row's last real token): [B, 1, V], not [B, I, V]. The routing record
    # still covers every prompt token (the router runs before the head).
    logits_b1v, prompt_cache, experts_bsla = forward(
        config,
        params,
        experts_bsla,
        prompt_tokens_bi.astype(jnp.int32),
        prompt_mask_bi,
        positions_bi,
        prompt_mask_bi,
        prompt_cache,
        0,
        last_only=True,
    )
    return logits_b1v, prompt_cache, experts_bsla


# Expert ids fit int16 (E < 32768), half the memory of int32 ([B, S, L, A] per rollout).
EXPERT_DTYPE = jnp.int16


def forward(
    config,
    params,
    experts_bsla,
    tokens_bt,
    real_bt,
    positions_bt,
    kv_mask_bs,
    cache,
    slot,
    *,
    last_only=False,
    kv_len=None,
    kv_block=0,
    cache_index=None,
    rows_b=None,
):
    """``forward_with_cache`` at slot ``slot`` (one slot for all rows, or [B] slots, one
    per row), writing the cache at ``cache_index`` (default ``slot``; ``last_only``,
    ``kv_len``, ``kv_block`` as there). The one writer of the MoE routing record: with
    ``experts_bsla`` (recording routing) it also writes the router's choices of the T
    fed tokens at slots [slot, slot + T) of their rows (-1 where not ``real_bt``), or,
    with ``rows_b`` (T = 1, the continuous engine), at row ``rows_b[b]`` and slot
    ``slot[b]`` of a record with more rows than are fed (rows not ``real_bt`` dropped)."""
    kwargs = dict(last_only=last_only, kv_len=kv_len, kv_block=kv_block)
    index = slot if cache_index is None else cache_index
    args = (config, params, tokens_bt, positions_bt, kv_mask_bs, cache, index)
    if experts_bsla is None:
        logits, cache = model_lib.forward_with_cache(*args, **kwargs)
        return logits, cache, None
    logits, cache, router_lte = model_lib.forward_with_cache_and_router(*args, **kwargs)
    experts_btla = moe_lib.top_experts(router_lte, config.num_experts_per_tok, tokens_bt.shape[0])
    experts_btla = jnp.where(real_bt[:, :, None, None], experts_btla, -1).astype(EXPERT_DTYPE)
    if rows_b is not None:
        at_row_b = jnp.where(real_bt[:, 0], rows_b, experts_bsla.shape[0])  # out of bounds
        experts_bsla = experts_bsla.at[at_row_b, slot].set(experts_btla[:, 0], mode="drop")
        return logits, cache, experts_bsla
    zero = jnp.zeros((), jnp.int32)
    at = (zero, jnp.asarray(slot, jnp.int32), zero, zero)
    return logits, cache, jax.lax.dynamic_update_slice(experts_bsla, experts_btla, at)
