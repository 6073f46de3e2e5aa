"""The static engine: prefill all B rows, then one ``lax.while_loop`` decodes them
together until every row is done.

Shape letters (docs/glossary.md): B rows, I prompt slots, R response slots, S = I + R.

Layout of one sampling batch::

    slot:   0 ........ I-1 | I ............ I+R-1
            pad pad p0 p1 p2 | r0 r1 r2 EOS pad pad
            <- left padded ->  <- right padded ->

Every prompt ends at slot I-1, so the first response token is sampled from the logits
of slot I-1 for all rows at once and response token r always sits at slot I + r. RoPE
positions skip padding (``model.positions_from_mask`` semantics), so a padded row
produces the same logits as the same prompt run alone.

``prefill`` and ``decode`` are the two halves of ``sample_batch`` (``SamplingState`` in
between), which ``Sampler`` jits separately so the decode state can be donated;
``decode_sharded`` splits the batch over a mesh axis, one loop per shard.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib
from rl_batch.rollout.decode_step import (
    SampleOutput,
    forward,
    prefill_prompts,
    sample_and_score,
)
from rl_batch.rollout.sampling import SamplingConfig, eos_ids_of, row_keys

ModelConfig = model_lib.ModelConfig
Params = model_lib.Params


@flax.struct.dataclass
class SamplingState:
    """Decode-loop carry. B rows, I prompt slots, R response slots, S = I + R."""

    step: jax.Array  # [] int32: response tokens sampled so far (next response slot)
    # [] int32, or [B] one per row: a row stops after this many tokens (<= R); traced
    max_new_tokens: jax.Array
    prompt_tokens_bi: jax.Array  # [B, I] int32, left-padded
    prompt_len_b: jax.Array  # [B] int32 real prompt tokens (first response position)
    tokens_br: jax.Array  # [B, R] int32 response buffer, pad where not generated
    logprobs_br: jax.Array  # [B, R] float32, 0 where not generated
    mask_br: jax.Array  # [B, R] bool, True for generated tokens (EOS included)
    kv_mask_bs: jax.Array  # [B, S] bool, True where a cache slot holds a real token
    cache: model_lib.Cache  # per layer {"k", "v"}: [B, K, S, H] (decode layout)
    done_b: jax.Array  # [B] bool: emitted EOS, reached max_new_tokens, or a pad row
    rng_b: jax.Array  # [B] PRNG keys, one per row; step i uses fold_in(rng_b[b], i)
    # [B, S, L, A] int16 expert choices of each fed token at its slot, per sparse layer
    # (MoE with routing recorded; -1 where no token was fed), else None.
    experts_bsla: Any
    eos_ids: tuple[int, ...] = flax.struct.field(pytree_node=False)  # any of them ends a row
    pad_id: int = flax.struct.field(pytree_node=False)
    sampling: SamplingConfig = flax.struct.field(pytree_node=False)


def _pad_slots(layer: model_lib.LayerCache, length: int) -> model_lib.LayerCache:
    """Zero-pads a prefill cache {"k", "v"}: [B, K, I, H] to ``length`` slots."""
    return {
        name: jnp.pad(x_bkih, ((0, 0), (0, 0), (0, length - x_bkih.shape[2]), (0, 0)))
        for name, x_bkih in layer.items()
    }


def _record(state: SamplingState, logits_bv: jax.Array) -> SamplingState:
    """Samples response token ``state.step`` from ``logits_bv`` and advances the state."""
    step = state.step
    step_rng_b = jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.rng_b, step)
    tokens_b, logprobs_b = sample_and_score(logits_bv, step_rng_b, state.sampling)
    live_b = ~state.done_b
    tokens_b = jnp.where(live_b, tokens_b, state.pad_id)
    logprobs_b = jnp.where(live_b, logprobs_b, 0.0)
    zero = jnp.zeros((), jnp.int32)
    at = (zero, step)
    eos_b = functools.reduce(jnp.logical_or, [tokens_b == e for e in state.eos_ids])
    done_b = state.done_b | eos_b | (step + 1 >= state.max_new_tokens)
    return state.replace(
        step=step + 1,
        tokens_br=jax.lax.dynamic_update_slice(state.tokens_br, tokens_b[:, None], at),
        logprobs_br=jax.lax.dynamic_update_slice(state.logprobs_br, logprobs_b[:, None], at),
        mask_br=jax.lax.dynamic_update_slice(state.mask_br, live_b[:, None], at),
        done_b=done_b,
    )


def prefill(
    config: ModelConfig,
    params: Params,
    prompt_tokens_bi: jax.Array,
    prompt_mask_bi: jax.Array,
    rng: jax.Array,
    max_new_tokens: jax.Array | int,
    *,
    response_len: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    cache_dtype: str | None = None,
    record_routing: bool = False,
) -> SamplingState:
    """Runs the prompts through the model, fills the cache and samples response token 0.

    Args:
      config: model shape.
      params: the parameter tree (the learner's, as is).
      prompt_tokens_bi: [B, I] int prompt ids, LEFT-padded (every prompt ends at I-1).
      prompt_mask_bi: [B, I] bool, True for real prompt tokens. A row with no real token
        is a padding row: it is done from the start and generates nothing.
      rng: PRNG key, row b drawing its tokens from ``fold_in(rng, b)``; or [B] typed
        keys, one per row.
      max_new_tokens: per-call token limit, traced, or [B] limits, one per row;
        clipped to ``response_len``.
      response_len: R, the static size of the response buffer.
      eos_id: end-of-sequence id, or a tuple of ids any of which ends a row (an id
        outside [0, V) never stops a row early).
      pad_id: id written to unused response slots.
      sampling: how tokens are drawn.
      cache_dtype: KV-cache dtype name (default: the model's compute dtype).
      record_routing: keep every fed token's expert choices (a MoE model;
        ``SamplingState.experts_bsla``), for routing replay and disagreement metrics.

    Returns:
      The decode state after one sampled token (``step == 1``).
    """
    return prefill_state(
        config,
        params,
        prompt_tokens_bi,
        prompt_mask_bi,
        rng,
        max_new_tokens,
        response_len=response_len,
        eos_id=eos_id,
        pad_id=pad_id,
        sampling=sampling,
        cache_dtype=cache_dtype,
        record_routing=record_routing,
        pad_cache=True,
    )


def prefill_state(
    config: ModelConfig,
    params: Params,
    prompt_tokens_bi: jax.Array,
    prompt_mask_bi: jax.Array,
    rng: jax.Array,
    max_new_tokens: jax.Array | int,
    *,
    response_len: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
    sampling: SamplingConfig,
    cache_dtype: str | None,
    record_routing: bool,
    pad_cache: bool,
) -> SamplingState:
    """``prefill``; ``pad_cache=False`` keeps the I-slot prompt cache as it is (the
    continuous engine copies each row's prompt slots into a decode slot later)."""
    if record_routing and not config.num_experts:
        raise ValueError("record_routing=True needs a MoE model (num_experts > 0)")
    if config.head != "lm":
        raise ValueError(f"sampling needs an LM head; got ModelConfig.head={config.head!r}")
    b, p = prompt_tokens_bi.shape
    r = response_len
    prompt_mask_bi = prompt_mask_bi.astype(bool)
    logits_b1v, prompt_cache, experts_bsla = prefill_prompts(
        config, params, prompt_tokens_bi, prompt_mask_bi, r, cache_dtype, record_routing
    )
    cache = prompt_cache
    if pad_cache:
        cache = [_pad_slots(layer, p + r) for layer in prompt_cache]
    kv_mask_bs = jnp.concatenate([prompt_mask_bi, jnp.zeros((b, r), bool)], axis=1)
    prompt_len_b = jnp.sum(prompt_mask_bi, axis=1, dtype=jnp.int32)
    state = SamplingState(
        step=jnp.zeros((), jnp.int32),
        max_new_tokens=jnp.minimum(jnp.asarray(max_new_tokens, jnp.int32), r),
        prompt_tokens_bi=prompt_tokens_bi.astype(jnp.int32),
        prompt_len_b=prompt_len_b,
        tokens_br=jnp.full((b, r), pad_id, jnp.int32),
        logprobs_br=jnp.zeros((b, r), jnp.float32),
        mask_br=jnp.zeros((b, r), bool),
        kv_mask_bs=kv_mask_bs,
        cache=cache,
        done_b=prompt_len_b == 0,
        rng_b=row_keys(rng, b),
        experts_bsla=experts_bsla,
        eos_ids=eos_ids_of(eos_id),
        pad_id=pad_id,
        sampling=sampling,
    )
    return _record(state, logits_b1v[:, -1])


def _decode_step(config: ModelConfig, params: Params, state: SamplingState) -> SamplingState:
    """Feeds response token ``step - 1`` at slot I + step - 1 and samples token ``step``."""
    p = state.prompt_tokens_bi.shape[1]
    prev = state.step - 1
    zero = jnp.zeros((), jnp.int32)
    token_b1 = jax.lax.dynamic_slice_in_dim(state.tokens_br, prev, 1, axis=1)
    real_b1 = jax.lax.dynamic_slice_in_dim(state.mask_br, prev, 1, axis=1)
    slot = p + prev
    kv_mask_bs = jax.lax.dynamic_update_slice(state.kv_mask_bs, real_b1, (zero, slot))
    positions_b = state.prompt_len_b + prev
    logits_b1v, cache, experts_bsla = forward(
        config,
        params,
        state.experts_bsla,
        token_b1,
        real_b1,  # a finished row feeds padding: no routing recorded
        positions_b[:, None],
        kv_mask_bs,
        state.cache,
        slot,
        kv_len=slot + 1,
        kv_block=state.sampling.attn_block,
        # The slot once per row: the per-row write of the continuous engine, so that
        # both engines round every log-prob alike (see ``sample_continuous``).
        cache_index=jnp.full(token_b1.shape[:1], slot, jnp.int32),
    )
    state = state.replace(kv_mask_bs=kv_mask_bs, cache=cache, experts_bsla=experts_bsla)
    return _record(state, logits_b1v[:, 0])


def decode(config: ModelConfig, params: Params, state: SamplingState) -> SamplingState:
    """Decodes with ``lax.while_loop`` until every row is done or ``max_new_tokens``.

    Args:
      config: model shape.
      params: the parameter tree.
      state: the state from ``prefill`` (or a partially decoded one).

    Returns:
      The final state.
    """

    def cond(s: SamplingState) -> jax.Array:
        return (s.step < jnp.max(s.max_new_tokens)) & ~jnp.all(s.done_b)

    return jax.lax.while_loop(cond, lambda s: _decode_step(config, params, s), state)


def decode_sharded(
    config: ModelConfig,
    params: Params,
    state: SamplingState,
    mesh: jax.sharding.Mesh,
    axis: str = sharding_lib.SAMPLER_BATCH_AXIS,
) -> SamplingState:
    """``decode`` with the batch split over ``mesh`` axis ``axis``, one loop per shard.

    Every shard decodes its own rows and stops when they are done: a single loop over
    the whole batch would test "all rows done" with an all-reduce at every token. Rows
    draw from their own keys (``SamplingState.rng_b``), so the tokens equal an
    unsharded ``decode``. Other mesh axes (fsdp, tensor) stay automatic.

    Args:
      config: model shape.
      params: the parameter tree (replicated over ``axis``; other axes as given).
      state: the state from ``prefill``; B must divide by the size of ``axis``.
      mesh: the device mesh.
      axis: the mesh axis the batch is split over.

    Returns:
      The final state, batch-sharded over ``axis``; ``step`` is the largest over shards.
    """
    state_specs = sharding_lib.sampler_state_specs(state, axis)

    def local(params: Params, state: SamplingState) -> SamplingState:
        state = decode(config, params, state)
        return state.replace(step=jax.lax.pmax(state.step, axis))

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(sharding_lib.replicated_spec(), state_specs),
        out_specs=state_specs,
        axis_names={axis},
    )(params, state)


def outputs(state: SamplingState) -> SampleOutput:
    """The ``SampleOutput`` of a finished state (device arrays)."""
    p = state.prompt_tokens_bi.shape[1]
    return SampleOutput(
        prompt_tokens=state.prompt_tokens_bi,
        prompt_mask=state.kv_mask_bs[:, :p],
        response_tokens=state.tokens_br,
        response_mask=state.mask_br,
        response_logprobs=state.logprobs_br,
        lengths=jnp.sum(state.mask_br, axis=1, dtype=jnp.int32),
        routed_experts=state.experts_bsla,
    )


def sample_batch(
    config: ModelConfig,
    params: Params,
    prompt_tokens_bi: jax.Array,
    prompt_mask_bi: jax.Array,
    rng: jax.Array,
    *,
    max_new_tokens: int | jax.Array,
    eos_id: int | tuple[int, ...],
    pad_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    response_len: int | None = None,
    cache_dtype: str | None = None,
    record_routing: bool = False,
) -> SampleOutput:
    """Samples responses for a left-padded prompt batch; pure and jittable.

    Args:
      config: model shape (static under jit).
      params: the parameter tree.
      prompt_tokens_bi: [B, I] int prompt ids, LEFT-padded so every prompt ends at I-1.
      prompt_mask_bi: [B, I] bool, True for real prompt tokens; an all-False row is a
        padding row and generates nothing.
      rng: PRNG key, or [B] typed keys (one per row, see ``prefill``).
      max_new_tokens: maximum tokens per row (an int, or a traced scalar when
        ``response_len`` is given).
      eos_id: end-of-sequence id (or a tuple of them); a row stops after emitting one.
      pad_id: id written after the end of each response.
      sampling: how tokens are drawn (static).
      response_len: R, size of the response buffer (default: ``max_new_tokens``).
      cache_dtype: KV-cache dtype name (default: the model's compute dtype).
      record_routing: return the MoE expert choices (``SampleOutput.routed_experts``).

    Returns:
      ``SampleOutput`` of device arrays with B rows and R response slots.
    """
    if response_len is None:
        response_len = int(max_new_tokens)
    state = prefill(
        config,
        params,
        prompt_tokens_bi,
        prompt_mask_bi,
        rng,
        max_new_tokens,
        response_len=response_len,
        eos_id=eos_id,
        pad_id=pad_id,
        sampling=sampling,
        cache_dtype=cache_dtype,
        record_routing=record_routing,
    )
    return outputs(decode(config, params, state))


def static_slots_read(batch: int, prompt_len: int, response_len: int, steps: int, block: int):
    """Cache slots the static engine's decode attention reads over ``steps`` decode steps
    of ``batch`` rows: all I + R per row and step, or (``block`` > 0) the filled I + i
    slots rounded up to whole blocks at step i = 1..steps."""
    s = prompt_len + response_len
    if block <= 0:
        return float(batch * s * steps)
    filled = prompt_len + np.arange(1, steps + 1)
    return float(batch * np.minimum(-(-filled // block) * block, s).sum())
