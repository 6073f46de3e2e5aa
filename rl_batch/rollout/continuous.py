"""The continuous engine: B queued rows through W decode slots; a finished row's slot
takes the next waiting row, and the loop narrows as the queue drains.

Shape letters (docs/glossary.md): B the call's rows, W decode slots, I prompt slots,
R response slots, S = I + R, A experts per token.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib
from rl_batch.rollout.decode_step import SampleOutput, forward, sample_and_score
from rl_batch.rollout.sampling import SamplingConfig, row_keys
from rl_batch.rollout.static import prefill_state

ModelConfig = model_lib.ModelConfig
Params = model_lib.Params


@flax.struct.dataclass
class ContinuousState:
    """Carry of the continuous engine. B queued rows (the call's batch bucket), W decode
    slots, I prompt slots, R response slots, S = I + R.

    Row b's prompt K/V stay in ``prompt_cache`` ([B, K, I, H]) until a slot frees; its
    outputs are written by row ([B, R]), so they come out in the caller's row order.
    """

    iterations: jax.Array  # [] int32 decode steps run (each feeds every slot once)
    slot_steps: jax.Array  # [] int32 slots x decode steps, summed over the loop's widths
    next_q: jax.Array  # [] int32 position in ``queue_b`` of the next row to start
    num_queued: jax.Array  # [] int32 rows still to decode after prefill
    queue_b: jax.Array  # [B] int32 rows in start order (rows to decode first)
    max_new_b: jax.Array  # [B] int32 token limit of each row
    prompt_mask_bi: jax.Array  # [B, I] bool
    prompt_len_b: jax.Array  # [B] int32
    prompt_cache: model_lib.Cache  # per layer {"k", "v"}: [B, K, I, H]
    rng_b: jax.Array  # [B] row keys: row b draws its token i with fold_in(rng_b[n], i)
    tokens_br: jax.Array  # [B, R] int32
    logprobs_br: jax.Array  # [B, R] float32
    mask_br: jax.Array  # [B, R] bool
    row_w: jax.Array  # [W] int32 the row a slot decodes
    step_w: jax.Array  # [W] int32 response tokens that row has sampled so far
    done_w: jax.Array  # [W] bool: the slot is free
    kv_mask_ws: jax.Array  # [W, S] bool
    cache: model_lib.Cache  # per layer {"k", "v"}: [W, K, S, H]
    slots_read: jax.Array  # [] float32 cache slots attention read, summed over steps
    # [B, S, L, A] int16 expert choices of each row's fed tokens at their slots (as
    # ``SamplingState.experts_bsla``), or None when routing is not recorded.
    experts_bsla: Any
    eos_ids: tuple[int, ...] = flax.struct.field(pytree_node=False)
    sampling: SamplingConfig = flax.struct.field(pytree_node=False)


def _refill(state: ContinuousState) -> ContinuousState:
    """Starts the next queued rows in the free slots: copies each one's prompt K/V and
    mask into the slot (response slots masked) at step 1 (token 0 came from prefill)."""
    n, p = state.prompt_mask_bi.shape
    free_w = state.done_w
    queue_pos_w = state.next_q + jnp.cumsum(free_w, dtype=jnp.int32) - 1
    start_w = free_w & (queue_pos_w < state.num_queued)
    new_row_w = state.queue_b[jnp.clip(queue_pos_w, 0, n - 1)]
    s = state.kv_mask_ws.shape[1]
    mask_ws = jnp.pad(state.prompt_mask_bi[new_row_w], ((0, 0), (0, s - p)))
    cache = []
    for layer, prompt_layer in zip(state.cache, state.prompt_cache):
        new_layer = {}
        for name, x_wksh in layer.items():
            prompt_wkph = prompt_layer[name][new_row_w]
            old_wkph = x_wksh[:, :, :p]
            keep = jnp.where(start_w[:, None, None, None], prompt_wkph, old_wkph)
            new_layer[name] = jax.lax.dynamic_update_slice(x_wksh, keep, (0, 0, 0, 0))
        cache.append(new_layer)
    return state.replace(
        next_q=state.next_q + jnp.sum(start_w, dtype=jnp.int32),
        row_w=jnp.where(start_w, new_row_w, state.row_w),
        step_w=jnp.where(start_w, 1, state.step_w),
        done_w=free_w & ~start_w,
        kv_mask_ws=jnp.where(start_w[:, None], mask_ws, state.kv_mask_ws),
        cache=cache,
    )


def slot_widths(slots: int, min_slots: int, per_halving: int = 1) -> list[int]:
    """The continuous engine's loop widths, widest first: ``slots`` halved while >=
    ``min_slots``, with ``per_halving`` - 1 evenly spaced widths between each halving
    (per_halving 2: 64, 48, 32, 24, ..., 3, 2)."""
    halvings = [slots]
    while halvings[-1] // 2 >= min_slots:
        halvings.append(halvings[-1] // 2)
    widths = [slots]
    for wide, narrow in zip(halvings, halvings[1:]):
        for j in range(1, per_halving + 1):
            width = wide - (j * (wide - narrow)) // per_halving  # narrow at j = per_halving
            if width < widths[-1]:
                widths.append(width)
    return widths


def _compact(state: ContinuousState, width: int) -> ContinuousState:
    """Keeps ``width`` slots: the busy ones (at most ``width``), moved to the front."""
    keep_w = jnp.argsort(state.done_w, stable=True)[:width]  # busy slots first
    return state.replace(
        row_w=state.row_w[keep_w],
        step_w=state.step_w[keep_w],
        done_w=state.done_w[keep_w],
        kv_mask_ws=state.kv_mask_ws[keep_w],
        cache=jax.tree.map(lambda x_wksh: x_wksh[keep_w], state.cache),
    )


def _continuous_step(config: ModelConfig, params: Params, state: ContinuousState):
    """Feeds each live slot's last token at its own slot I + step - 1, samples the next
    with its row's key at its row's step and writes it to the row's outputs."""
    n, p = state.prompt_mask_bi.shape
    c = state.row_w.shape[0]
    live_w = ~state.done_w
    row_w = jnp.where(live_w, state.row_w, 0)
    prev_w = jnp.maximum(state.step_w - 1, 0)
    token_w = state.tokens_br[row_w, prev_w]
    slot_w = p + prev_w
    slots_w = jnp.arange(c)
    kv_mask_ws = state.kv_mask_ws.at[slots_w, slot_w].set(live_w)
    kv_len = jnp.max(jnp.where(live_w, slot_w + 1, 1))
    block = state.sampling.attn_block
    logits_w1v, cache, experts_bsla = forward(
        config,
        params,
        state.experts_bsla,
        token_w[:, None],
        live_w[:, None],  # a free slot feeds nothing: no routing recorded
        (state.prompt_len_b[row_w] + prev_w)[:, None],
        kv_mask_ws,
        state.cache,
        slot_w,
        kv_len=kv_len,
        kv_block=block,
        rows_b=row_w,
    )
    s = kv_mask_ws.shape[1]
    read = c * (s if block <= 0 else jnp.minimum(-(-kv_len // block) * block, s))
    rng_w = jax.vmap(jax.random.fold_in)(state.rng_b[row_w], state.step_w)
    tokens_w, logprobs_w = sample_and_score(logits_w1v[:, 0], rng_w, state.sampling)
    out_row_w = jnp.where(live_w, row_w, n)  # n: out of bounds, dropped
    at = (out_row_w, state.step_w)
    eos_w = functools.reduce(jnp.logical_or, [tokens_w == e for e in state.eos_ids])
    return state.replace(
        iterations=state.iterations + 1,
        slot_steps=state.slot_steps + c,
        tokens_br=state.tokens_br.at[at].set(tokens_w, mode="drop"),
        logprobs_br=state.logprobs_br.at[at].set(logprobs_w, mode="drop"),
        mask_br=state.mask_br.at[at].set(True, mode="drop"),
        step_w=state.step_w + live_w,
        done_w=state.done_w | eos_w | (state.step_w + 1 >= state.max_new_b[row_w]),
        kv_mask_ws=kv_mask_ws,
        cache=cache,
        slots_read=state.slots_read + jnp.asarray(read, jnp.float32),
        experts_bsla=experts_bsla,
    )


def sample_continuous(
    config: ModelConfig,
    params: Params,
    prompt_tokens_bi: jax.Array,
    prompt_mask_bi: jax.Array,
    rng: jax.Array,
    max_new_tokens: jax.Array | int,
    *,
    slots: int,
    response_len: int,
    eos_id: int | tuple[int, ...],
    pad_id: int,
    sampling: SamplingConfig = SamplingConfig(),
    cache_dtype: str | None = None,
    record_routing: bool = False,
) -> tuple[SampleOutput, dict[str, jax.Array]]:
    """Continuous batching: B rows through ``slots`` decode slots; pure and jittable.

    All B prompts are prefilled at once into an I-slot cache, which samples every row's
    token 0 (as ``prefill``). Rows not done then wait in a queue. Each iteration of one
    ``lax.while_loop`` first starts queued rows in the free slots (``_refill``), then
    runs one decode step for all slots, each at its own position. Once the queue is
    empty and no more slots are busy than the next width holds, the busy ones move into
    that narrower loop (``_compact``; ``slot_widths``: halvings down to
    ``sampling.min_slots``, ``sampling.widths_per_halving`` widths each), so the tail of
    long rows does not decode beside idle slots. The last loop ends when every
    slot is free. Row b draws its token i with ``fold_in(row_keys(rng, B)[b], i)``, its
    cache slots are laid out as in ``decode`` and both engines write a step's keys with
    the same per-row scatter, so its tokens are the static engine's and its log-probs
    agree to fp32 rounding (bit for bit only on tiny models: XLA rounds matmuls of
    other row counts differently; docs/rollout_engine.md gives the measured bound).

    Args:
      config, params: the model.
      prompt_tokens_bi, prompt_mask_bi: [B, I] left-padded prompts (as ``prefill``); an
        all-False row is padding, done from the start.
      rng: PRNG key or [B] row keys.
      max_new_tokens: token limit (traced), [] or [B] one per row; clipped to
        ``response_len``.
      slots: decode slots W (static, clipped to B; 0: B).
      response_len, eos_id, pad_id, sampling, cache_dtype, record_routing: as
        ``prefill`` (the expert choices of every row's fed tokens at their slots).

    Returns:
      (``SampleOutput`` with B rows, stats: ``decode_steps`` (loop iterations),
      ``slot_steps`` (width x iterations, summed over the widths), ``slots_read``
      (cache slots read by attention, summed over steps and slots)).
    """
    n, p = prompt_tokens_bi.shape
    r = response_len
    c = min(int(slots), n) if slots > 0 else n
    first = prefill_state(
        config,
        params,
        prompt_tokens_bi,
        prompt_mask_bi,
        rng,
        max_new_tokens,
        response_len=r,
        eos_id=eos_id,
        pad_id=pad_id,
        sampling=sampling,
        cache_dtype=cache_dtype,
        record_routing=record_routing,
        pad_cache=False,
    )
    waiting_b = ~first.done_b
    state = ContinuousState(
        iterations=jnp.zeros((), jnp.int32),
        slot_steps=jnp.zeros((), jnp.int32),
        next_q=jnp.zeros((), jnp.int32),
        num_queued=jnp.sum(waiting_b, dtype=jnp.int32),
        queue_b=jnp.argsort(~waiting_b, stable=True).astype(jnp.int32),
        max_new_b=jnp.broadcast_to(first.max_new_tokens, (n,)),
        prompt_mask_bi=first.kv_mask_bs[:, :p],
        prompt_len_b=first.prompt_len_b,
        prompt_cache=first.cache,
        rng_b=first.rng_b,
        tokens_br=first.tokens_br,
        logprobs_br=first.logprobs_br,
        mask_br=first.mask_br,
        row_w=jnp.zeros((c,), jnp.int32),
        step_w=jnp.zeros((c,), jnp.int32),
        done_w=jnp.ones((c,), bool),
        kv_mask_ws=jnp.zeros((c, p + r), bool),
        cache=model_lib.init_cache(config, c, p + r, cache_dtype),
        slots_read=jnp.zeros((), jnp.float32),
        experts_bsla=first.experts_bsla,
        eos_ids=first.eos_ids,
        sampling=sampling,
    )

    step = functools.partial(_continuous_step, config, params)

    def body(s: ContinuousState) -> ContinuousState:
        refill = jnp.any(s.done_w) & (s.next_q < s.num_queued)
        return step(jax.lax.cond(refill, _refill, lambda x: x, s))

    widths = slot_widths(c, sampling.min_slots, sampling.widths_per_halving)
    for i, width in enumerate(widths):
        if i:
            state = _compact(state, width)
        narrower = widths[i + 1] if i + 1 < len(widths) else 0

        def cond(s: ContinuousState, narrower=narrower) -> jax.Array:
            queued = s.next_q < s.num_queued
            busy_w = ~s.done_w
            # A narrower loop takes over once no row waits and its slots hold every busy
            # one (the last loop, narrower 0: once none is busy, when it ends anyway).
            narrow = ~queued & (jnp.sum(busy_w) <= narrower)
            return (queued | jnp.any(busy_w)) & ~narrow

        # A narrower loop starts once no row waits: it never refills.
        state = jax.lax.while_loop(cond, step if i else body, state)
    out = SampleOutput(
        prompt_tokens=first.prompt_tokens_bi,
        prompt_mask=state.prompt_mask_bi,
        response_tokens=state.tokens_br,
        response_mask=state.mask_br,
        response_logprobs=state.logprobs_br,
        lengths=jnp.sum(state.mask_br, axis=1, dtype=jnp.int32),
        routed_experts=state.experts_bsla,
    )
    stats = {
        "decode_steps": state.iterations,
        "slot_steps": state.slot_steps,
        "slots_read": state.slots_read,
    }
    return out, stats


def sample_continuous_sharded(
    config: ModelConfig,
    params: Params,
    prompt_tokens_bi: jax.Array,
    prompt_mask_bi: jax.Array,
    rng: jax.Array,
    max_new_tokens: jax.Array | int,
    *,
    mesh: jax.sharding.Mesh,
    slots: int,
    axis: str = sharding_lib.SAMPLER_BATCH_AXIS,
    **kwargs,
) -> tuple[SampleOutput, dict[str, jax.Array]]:
    """``sample_continuous`` with the B rows split over ``mesh`` axis ``axis``.

    Each of the D shards runs its own loop over its B / D rows with ``slots`` / D decode
    slots (at least 1; 0: all its rows). Row keys are taken for the whole batch first
    (``row_keys(rng, B)``), so every row draws the tokens it draws unsharded. Other mesh
    axes (fsdp, tensor) stay automatic, as in ``decode_sharded``.

    Returns:
      (``SampleOutput``, batch-sharded over ``axis``; stats: ``decode_steps`` the largest
      over shards, ``slot_steps`` and ``slots_read`` summed over them).
    """
    n = prompt_tokens_bi.shape[0]
    d = mesh.shape[axis]
    rng_b = row_keys(rng, n)
    limit_b = jnp.broadcast_to(jnp.asarray(max_new_tokens, jnp.int32), (n,))
    local_slots = max(1, slots // d) if slots > 0 else 0
    whole, split = sharding_lib.replicated_spec(), sharding_lib.sampler_shard_spec(axis)

    def local(params, tokens_bi, mask_bi, rng_b, limit_b):
        out, stats = sample_continuous(
            config, params, tokens_bi, mask_bi, rng_b, limit_b, slots=local_slots, **kwargs
        )
        stats = {
            "decode_steps": jax.lax.pmax(stats["decode_steps"], axis),
            "slot_steps": jax.lax.psum(stats["slot_steps"], axis),
            "slots_read": jax.lax.psum(stats["slots_read"], axis),
        }
        return out, stats

    return jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(whole, split, split, split, split),
        out_specs=(split, whole),
        axis_names={axis},
        # The loop state starts from constants (unvarying over ``axis``) and becomes
        # varying in the refill branch; every output is per shard or reduced above.
        check_vma=False,
    )(params, prompt_tokens_bi, prompt_mask_bi, rng_b, limit_b)


def decode_slots(sampling: SamplingConfig, rows: int, shards: int = 1) -> int:
    """Rows that decode at once in a call of ``rows`` (bucketed) rows: all of them with the
    static engine; ``sampling.slots`` clipped to ``rows`` (0: all) with the continuous,
    split evenly over ``shards`` data shards (at least one slot each)."""
    if sampling.engine == "continuous" and sampling.slots > 0:
        return max(1, min(sampling.slots, rows) // shards) * shards
    return rows


def kv_cache_slots(sampling: SamplingConfig, rows: int, prompt_len: int, response_len: int):
    """Cache slots (one K and one V vector per layer and KV head each) that a call of
    ``rows`` bucketed rows holds: static, the [B, K, I + R, H] decode cache (B x (I + R));
    continuous, every row's prompt cache [B, K, I, H] plus the [W, K, I + R, H] slot cache
    (B x I + W x (I + R), W = ``decode_slots``), and while the loop narrows to its next
    width W' (``_compact``) the narrower cache beside the wider one (+ W' x (I + R))."""
    s = prompt_len + response_len
    if sampling.engine != "continuous":
        return rows * s
    c = decode_slots(sampling, rows)
    return rows * prompt_len + (c + narrowed_slots(sampling, c)) * s


def narrowed_slots(sampling: SamplingConfig, slots: int) -> int:
    """Slots of the continuous engine's first narrower loop (``slot_widths``' second
    width), made while the W-slot cache still lives; 0 when ``slots`` never narrow."""
    widths = slot_widths(slots, sampling.min_slots, sampling.widths_per_halving)
    return widths[1] if len(widths) > 1 else 0
