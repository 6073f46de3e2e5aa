"""Jitted KV-cache sampler: prefill, then a ``lax.while_loop`` decode until every row is done.

Layout of one sampling batch (B rows, prompt bucket P, response bucket R, S = P + R)::

    slot:   0 ........ P-1 | P ............ P+R-1
            pad pad p0 p1 p2 | r0 r1 r2 EOS pad pad
            <- left padded ->  <- right padded ->

Every prompt ends at slot P-1, so the first response token is sampled from the logits
of slot P-1 for all rows at once and response token r always sits at slot P + r. RoPE
positions skip padding (``model.positions_from_mask`` semantics: a token's position is
the number of real tokens before it), so a padded row produces the same logits as the
same prompt run alone.

Shapes are bucketed (prompt length, response length and batch rounded up) so that a
new batch size or prompt length within a bucket reuses the compiled program; the
response length limit ``max_new_tokens`` is a traced scalar and never recompiles.

Public API:
  * ``SamplingConfig``: temperature / top-k / top-p / greedy, built from a config dict
    with ``SamplingConfig.from_dict``; ``.method()`` returns the sampling method.
  * ``Greedy``, ``Temperature``, ``TopK``, ``TopP``: frozen ``(logits, rng) -> tokens``.
  * ``sample_batch(...)``: pure, jittable; prefill + decode + outputs, for callers that
    run it under their own ``jit`` / mesh.
  * ``prefill``, ``decode``: the two halves of ``sample_batch`` (``SamplingState`` in
    between), which ``Sampler`` jits separately so the decode state can be donated.
    Both run ``model.forward_with_cache``: prefill over the P prompt slots, then one
    token per decode step over the [B, K, S, H] cache.
  * ``decode_sharded``: ``decode`` with the batch split over a mesh axis, one loop per
    shard (each stops when its own rows are done; no per-token collective).
  * ``Sampler``: host-side wrapper: pads and buckets Python prompt lists, caches
    compiled programs, optionally shards the batch on a mesh, returns numpy arrays.

Randomness is per row: row b of a batch draws step i's token with
``fold_in(fold_in(rng, b), i)``, so a row's sample does not depend on the batch bucket,
the padding rows or the device shard it lands in. ``rng`` may instead be [B] typed keys,
one per row (row b then draws step i's token with ``fold_in(rng[b], i)``): a caller that
derives each row's key from what the row is (a prompt and a group member) gets the same
draws for that row in batches of any shape.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from rl_batch import distributed
from rl_batch.models import moe as moe_lib
from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib


def eos_ids_of(eos_id: int | Sequence[int]) -> tuple[int, ...]:
    """The end-of-sequence ids as a tuple: one id, or several in order (deduplicated)."""
    ids = (eos_id,) if isinstance(eos_id, (int, np.integer)) else tuple(eos_id)
    if not ids:
        raise ValueError("eos_id: at least one end-of-sequence id is needed")
    return tuple(dict.fromkeys(int(i) for i in ids))


ModelConfig = model_lib.ModelConfig
Params = model_lib.Params

# ----------------------------------------------------------------------- sampling methods


class SamplingMethod(Protocol):
    """Maps next-token logits [B, V] (float32) and one PRNG key per row [B] to tokens [B].

    Row ``b``'s token depends only on its logits and ``rng_b[b]``, so a row samples the
    same token whatever batch, bucket or device shard it sits in.
    """

    def __call__(self, logits_bv: jax.Array, rng_b: jax.Array) -> jax.Array: ...


def first_argmax(x_bv: jax.Array) -> jax.Array:
    """Index of the first maximum of each row, [B] int32 (``jnp.argmax`` semantics).

    Written as two plain reductions (max, then the smallest index holding it): XLA's CPU
    backend runs these about 5x faster than the single (value, index) reduction
    ``jnp.argmax`` lowers to, which matters once per decode step. A row holding NaN
    gives its last index.
    """
    v = x_bv.shape[-1]
    max_b1 = jnp.max(x_bv, axis=-1, keepdims=True)
    index_b = jnp.min(jnp.where(x_bv == max_b1, jnp.arange(v, dtype=jnp.int32), v), axis=-1)
    return jnp.minimum(index_b, v - 1)


def categorical(logits_bv: jax.Array, rng_b: jax.Array) -> jax.Array:
    """Draws one token per row from softmax(logits) with that row's key (Gumbel-max).

    Args:
      logits_bv: [B, V] logits; -inf excludes a token.
      rng_b: [B] PRNG keys, one per row.

    Returns:
      [B] int32 tokens.
    """
    v = logits_bv.shape[-1]
    gumbel_bv = jax.vmap(lambda key: jax.random.gumbel(key, (v,), jnp.float32))(rng_b)
    return first_argmax(logits_bv.astype(jnp.float32) + gumbel_bv)


def top_k_filter(logits_bv: jax.Array, k: int) -> jax.Array:
    """Keeps the ``k`` largest logits per row (ties at the k-th value are kept too).

    Args:
      logits_bv: [B, V] logits.
      k: number of tokens to keep (>= 1); k >= V keeps everything.

    Returns:
      [B, V] logits with the rest set to -inf.
    """
    if k >= logits_bv.shape[-1]:
        return logits_bv
    kth_b1 = jax.lax.top_k(logits_bv, k)[0][:, -1:]
    return jnp.where(logits_bv >= kth_b1, logits_bv, -jnp.inf)


def top_p_filter(logits_bv: jax.Array, p: float) -> jax.Array:
    """Nucleus filter: keeps the smallest set of top tokens whose probability reaches ``p``.

    A token is kept when the probability mass of the tokens ranked above it is < p, so
    the most likely token is always kept and ``p -> 0`` reduces to greedy.

    Args:
      logits_bv: [B, V] logits (already temperature-scaled and top-k filtered).
      p: nucleus mass in (0, 1]; 1 keeps everything.

    Returns:
      [B, V] logits with the rest set to -inf.
    """
    if p >= 1.0:
        return logits_bv
    # Descending by sorting the negated logits (exact), never by reversing the sorted
    # axis: on a vocab sharded over ``tensor`` a reverse is a collective-permute, which
    # inside a per-shard decode loop deadlocks shards that run different step counts.
    sorted_bv = -jnp.sort(-logits_bv, axis=-1)
    probs_bv = jax.nn.softmax(sorted_bv, axis=-1)
    mass_before_bv = jnp.cumsum(probs_bv, axis=-1) - probs_bv
    keep_bv = mass_before_bv < p
    threshold_b1 = jnp.min(jnp.where(keep_bv, sorted_bv, jnp.inf), axis=-1, keepdims=True)
    return jnp.where(logits_bv >= threshold_b1, logits_bv, -jnp.inf)


@dataclasses.dataclass(frozen=True)
class Greedy:
    """Argmax decoding."""

    def __call__(self, logits_bv: jax.Array, rng_b: jax.Array) -> jax.Array:
        del rng_b
        return first_argmax(logits_bv)


@dataclasses.dataclass(frozen=True)
class Temperature:
    """Samples from softmax(logits / temperature)."""

    temperature: float = 1.0

    def __call__(self, logits_bv: jax.Array, rng_b: jax.Array) -> jax.Array:
        return categorical(logits_bv / self.temperature, rng_b)


@dataclasses.dataclass(frozen=True)
class TopK:
    """Temperature, then sampling among the ``k`` most likely tokens."""

    k: int
    temperature: float = 1.0

    def __call__(self, logits_bv: jax.Array, rng_b: jax.Array) -> jax.Array:
        return categorical(top_k_filter(logits_bv / self.temperature, self.k), rng_b)


@dataclasses.dataclass(frozen=True)
class TopP:
    """Temperature, then optional top-k, then nucleus (top-p) sampling."""

    p: float
    temperature: float = 1.0
    top_k: int = 0

    def __call__(self, logits_bv: jax.Array, rng_b: jax.Array) -> jax.Array:
        logits_bv = logits_bv / self.temperature
        if self.top_k:
            logits_bv = top_k_filter(logits_bv, self.top_k)
        return categorical(top_p_filter(logits_bv, self.p), rng_b)


ENGINES = ("static", "continuous")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """How next tokens are drawn. Filters apply in order: temperature, top-k, top-p.

    Attributes:
      temperature: softmax temperature (> 0); ignored when ``greedy``.
      top_k: keep the k most likely tokens; 0 turns the filter off.
      top_p: nucleus mass in (0, 1]; 1.0 turns the filter off.
      greedy: argmax decoding; the other fields are then ignored and log-probs are
        reported at temperature 1.
      engine: ``"static"``: one batch of all rows decodes until every row is done;
        ``"continuous"``: ``slots`` rows decode at a time and a finished row's slot is
        refilled with the next waiting row (``sample_continuous``). Both give the same
        tokens and log-probs per row key.
      slots: decode slots of the continuous engine (more than the call's batch bucket is
        clipped to it; 0: the call's batch bucket, every row starts at once); unused by
        the static engine.
      attn_block: decode attention reads only the filled cache slots, in blocks of this
        many slots (flash-decoding; ``model.forward_with_cache``'s ``kv_block``); 0 reads
        all P + R slots with the einsum reference.
      min_slots: the continuous engine halves its slots once no row waits and at most
        half of them are busy, down to this many (>= 2; ``slots`` or more: never), so
        that the last long rows do not decode beside idle slots. Each width is its own
        loop in the program (compile time grows with log2(slots / min_slots)); the
        tokens and log-probs do not change.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    engine: str = "static"
    slots: int = 0
    attn_block: int = 0
    min_slots: int = 2

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ValueError(f"SamplingConfig.temperature must be > 0, got {self.temperature!r}")
        if not (isinstance(self.top_k, int) and self.top_k >= 0):
            raise ValueError(f"SamplingConfig.top_k must be an int >= 0, got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"SamplingConfig.engine must be one of {ENGINES}, got {self.engine!r}")
        if not (isinstance(self.slots, int) and self.slots >= 0):
            raise ValueError(f"SamplingConfig.slots must be an int >= 0, got {self.slots!r}")
        if not (isinstance(self.min_slots, int) and self.min_slots >= 2):
            raise ValueError(
                f"SamplingConfig.min_slots must be an int >= 2, got {self.min_slots!r}"
            )
        if not (isinstance(self.attn_block, int) and self.attn_block >= 0):
            raise ValueError(
                f"SamplingConfig.attn_block must be an int >= 0, got {self.attn_block!r}"
            )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> SamplingConfig:
        """Builds a config from a dict / ``ConfigDict`` (unknown keys raise ``ValueError``)."""
        d = dict(d or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown SamplingConfig keys {unknown}; known keys: {sorted(known)}")
        return cls(**d)

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the distribution whose log-probs the sampler reports."""
        return 1.0 if self.greedy else float(self.temperature)

    def method(self) -> SamplingMethod:
        """The ``(logits, rng) -> tokens`` method for this config."""
        if self.greedy:
            return Greedy()
        if self.top_p < 1.0:
            return TopP(p=self.top_p, temperature=self.temperature, top_k=self.top_k)
        if self.top_k:
            return TopK(k=self.top_k, temperature=self.temperature)
        return Temperature(temperature=self.temperature)


# ---------------------------------------------------------------------------- state/output


@flax.struct.dataclass
class SamplingState:
    """Decode-loop carry. B rows, P prompt slots, R response slots, S = P + R."""

    step: jax.Array  # [] int32: response tokens sampled so far (next response slot)
    # [] int32, or [B] one per row: a row stops after this many tokens (<= R); traced
    max_new_tokens: jax.Array
    prompt_tokens_bp: jax.Array  # [B, P] int32, left-padded
    prompt_len_b: jax.Array  # [B] int32 real prompt tokens (first response position)
    tokens_br: jax.Array  # [B, R] int32 response buffer, pad where not generated
    logprobs_br: jax.Array  # [B, R] float32, 0 where not generated
    mask_br: jax.Array  # [B, R] bool, True for generated tokens (EOS included)
    kv_mask_bs: jax.Array  # [B, S] bool, True where a cache slot holds a real token
    cache: model_lib.Cache  # per layer {"k", "v"}: [B, K, S, H] (decode layout)
    done_b: jax.Array  # [B] bool: emitted EOS, reached max_new_tokens, or a pad row
    rng_b: jax.Array  # [B] PRNG keys, one per row; step i uses fold_in(rng_b[b], i)
    # [B, S, L, k] int16 expert choices of each fed token at its slot, per sparse layer
    # (MoE with routing recorded; -1 where no token was fed), else None.
    experts_bslk: Any
    eos_ids: tuple[int, ...] = flax.struct.field(pytree_node=False)  # any of them ends a row
    pad_id: int = flax.struct.field(pytree_node=False)
    sampling: SamplingConfig = flax.struct.field(pytree_node=False)


@flax.struct.dataclass
class SampleOutput:
    """Sampled responses. Device arrays from ``sample_batch``; numpy from ``Sampler``."""

    prompt_tokens: Any  # [B, P] int32, left-padded with pad_id
    prompt_mask: Any  # [B, P] bool
    response_tokens: Any  # [B, R] int32, right-padded with pad_id, EOS included
    response_mask: Any  # [B, R] bool, True for generated tokens (EOS included)
    response_logprobs: Any  # [B, R] float32 log p(token) at logprob_temperature, 0 if masked
    lengths: Any  # [B] int32 generated tokens (EOS included)
    # [B, P + R, L, k] int16 expert choices per token and sparse layer in the sampler's
    # forward (prompt slots, then response slots; -1 where none: padding and the last
    # token, which is sampled but never fed), or None when routing is not recorded.
    routed_experts: Any = None


def _pad_slots(layer: model_lib.LayerCache, length: int) -> model_lib.LayerCache:
    """Zero-pads a prefill cache {"k", "v"}: [B, K, P, H] to ``length`` slots."""
    return {
        name: jnp.pad(x_bkph, ((0, 0), (0, 0), (0, length - x_bkph.shape[2]), (0, 0)))
        for name, x_bkph in layer.items()
    }


# ---------------------------------------------------------------------------- pure functions


def row_keys(rng: jax.Array, batch: int) -> jax.Array:
    """[batch] PRNG keys: row b draws its tokens from ``fold_in(rng, b)``; ``rng`` that
    already is [batch] typed keys (one per row, `is_row_keys`) is returned as it is."""
    if is_row_keys(rng):
        if rng.shape[0] != batch:
            raise ValueError(f"{rng.shape[0]} row keys for a batch of {batch} rows")
        return rng
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(rng, jnp.arange(batch))


def is_row_keys(rng: Any) -> bool:
    """Whether ``rng`` is a [B] array of typed PRNG keys (one per row) rather than one key."""
    return jnp.ndim(rng) == 1 and jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key)


def _sample_and_score(
    logits_bv: jax.Array, rng_b: jax.Array, sampling: SamplingConfig
) -> tuple[jax.Array, jax.Array]:
    """Draws tokens [B] and their log-probs [B] under softmax(logits / T), before filters."""
    tokens_b = sampling.method()(logits_bv, rng_b)
    scaled_bv = logits_bv / sampling.logprob_temperature
    chosen_b = jnp.take_along_axis(scaled_bv, tokens_b[:, None], axis=-1)[:, 0]
    return tokens_b, chosen_b - jax.nn.logsumexp(scaled_bv, axis=-1)


def _record(state: SamplingState, logits_bv: jax.Array) -> SamplingState:
    """Samples response token ``state.step`` from ``logits_bv`` and advances the state."""
    step = state.step
    step_rng_b = jax.vmap(jax.random.fold_in, in_axes=(0, None))(state.rng_b, step)
    tokens_b, logprobs_b = _sample_and_score(logits_bv, step_rng_b, state.sampling)
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
    prompt_tokens_bp: jax.Array,
    prompt_mask_bp: jax.Array,
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
      prompt_tokens_bp: [B, P] int prompt ids, LEFT-padded (every prompt ends at P-1).
      prompt_mask_bp: [B, P] bool, True for real prompt tokens. A row with no real token
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
        ``SamplingState.experts_bslk``), for routing replay and disagreement metrics.

    Returns:
      The decode state after one sampled token (``step == 1``).
    """
    return _prefill_state(
        config,
        params,
        prompt_tokens_bp,
        prompt_mask_bp,
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


def _prefill_state(
    config: ModelConfig,
    params: Params,
    prompt_tokens_bp: jax.Array,
    prompt_mask_bp: jax.Array,
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
    """``prefill``; ``pad_cache=False`` keeps the P-slot prompt cache as it is (the
    continuous engine copies each row's prompt slots into a decode slot later)."""
    if record_routing and not config.num_experts:
        raise ValueError("record_routing=True needs a MoE model (num_experts > 0)")
    if config.head != "lm":
        raise ValueError(f"sampling needs an LM head; got ModelConfig.head={config.head!r}")
    b, p = prompt_tokens_bp.shape
    r = response_len
    prompt_mask_bp = prompt_mask_bp.astype(bool)
    logits_b1v, prompt_cache, experts_bslk = _prefill_prompts(
        config, params, prompt_tokens_bp, prompt_mask_bp, r, cache_dtype, record_routing
    )
    cache = prompt_cache
    if pad_cache:
        cache = [_pad_slots(layer, p + r) for layer in prompt_cache]
    kv_mask_bs = jnp.concatenate([prompt_mask_bp, jnp.zeros((b, r), bool)], axis=1)
    prompt_len_b = jnp.sum(prompt_mask_bp, axis=1, dtype=jnp.int32)
    state = SamplingState(
        step=jnp.zeros((), jnp.int32),
        max_new_tokens=jnp.minimum(jnp.asarray(max_new_tokens, jnp.int32), r),
        prompt_tokens_bp=prompt_tokens_bp.astype(jnp.int32),
        prompt_len_b=prompt_len_b,
        tokens_br=jnp.full((b, r), pad_id, jnp.int32),
        logprobs_br=jnp.zeros((b, r), jnp.float32),
        mask_br=jnp.zeros((b, r), bool),
        kv_mask_bs=kv_mask_bs,
        cache=cache,
        done_b=prompt_len_b == 0,
        rng_b=row_keys(rng, b),
        experts_bslk=experts_bslk,
        eos_ids=eos_ids_of(eos_id),
        pad_id=pad_id,
        sampling=sampling,
    )
    return _record(state, logits_b1v[:, -1])


def _prefill_prompts(config, params, prompt_tokens_bp, prompt_mask_bp, r, cache_dtype, record):
    """Runs [B, P] left-padded prompts through the model into a P-slot cache.

    Returns:
      (logits [B, 1, V] at slot P-1, the P-slot cache, the [B, P + R, L, k] routing
      record with the prompt part filled when ``record``, else None).
    """
    b, p = prompt_tokens_bp.shape
    positions_bp = model_lib.positions_from_mask(prompt_mask_bp)
    # Prefill attends over the P prompt slots only (a P-slot cache), then the cache is
    # padded to S = P + R: the prompt's attention over empty response slots would be
    # wasted work (about 3x the prefill attention cost for P=16, R=32).
    prompt_cache = model_lib.init_cache(config, b, p, cache_dtype)
    experts_bslk = None
    if record:
        shape = (b, p + r, config.num_moe_layers, config.num_experts_per_tok)
        experts_bslk = jnp.full(shape, -1, _EXPERT_DTYPE)
    # Only the last prompt position's logits are used (prompts are left-padded, so it
    # is every row's last real token): [B, 1, V], not [B, P, V]. The routing record
    # still covers every prompt token (the router runs before the head).
    logits_b1v, prompt_cache, experts_bslk = _forward(
        config,
        params,
        experts_bslk,
        prompt_tokens_bp.astype(jnp.int32),
        prompt_mask_bp,
        positions_bp,
        prompt_mask_bp,
        prompt_cache,
        0,
        last_only=True,
    )
    return logits_b1v, prompt_cache, experts_bslk


# Expert ids fit int16 (E < 32768), half the memory of int32 ([B, S, L, k] per rollout).
_EXPERT_DTYPE = jnp.int16


def _forward(
    config,
    params,
    experts_bslk,
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
):
    """``forward_with_cache`` at slot ``slot`` (or ``cache_index``: [B] slots, one per
    row, all equal to ``slot``; ``last_only``, ``kv_len``, ``kv_block`` as there); with
    ``experts_bslk`` (recording routing) also writes the router's choices for the T fed
    tokens at slots [slot, slot + T) (-1 where not ``real_bt``)."""
    kwargs = dict(last_only=last_only, kv_len=kv_len, kv_block=kv_block)
    index = slot if cache_index is None else cache_index
    args = (config, params, tokens_bt, positions_bt, kv_mask_bs, cache, index)
    if experts_bslk is None:
        logits, cache = model_lib.forward_with_cache(*args, **kwargs)
        return logits, cache, None
    logits, cache, router_lte = model_lib.forward_with_cache_and_router(*args, **kwargs)
    experts_btlk = moe_lib.top_experts(router_lte, config.num_experts_per_tok, tokens_bt.shape[0])
    experts_btlk = jnp.where(real_bt[:, :, None, None], experts_btlk, -1).astype(_EXPERT_DTYPE)
    zero = jnp.zeros((), jnp.int32)
    at = (zero, jnp.asarray(slot, jnp.int32), zero, zero)
    return logits, cache, jax.lax.dynamic_update_slice(experts_bslk, experts_btlk, at)


def _decode_step(config: ModelConfig, params: Params, state: SamplingState) -> SamplingState:
    """Feeds response token ``step - 1`` at slot P + step - 1 and samples token ``step``."""
    p = state.prompt_tokens_bp.shape[1]
    prev = state.step - 1
    zero = jnp.zeros((), jnp.int32)
    token_b1 = jax.lax.dynamic_slice_in_dim(state.tokens_br, prev, 1, axis=1)
    real_b1 = jax.lax.dynamic_slice_in_dim(state.mask_br, prev, 1, axis=1)
    slot = p + prev
    kv_mask_bs = jax.lax.dynamic_update_slice(state.kv_mask_bs, real_b1, (zero, slot))
    positions_b = state.prompt_len_b + prev
    logits_b1v, cache, experts_bslk = _forward(
        config,
        params,
        state.experts_bslk,
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
    state = state.replace(kv_mask_bs=kv_mask_bs, cache=cache, experts_bslk=experts_bslk)
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
    P = jax.sharding.PartitionSpec
    state_specs = jax.tree.map(lambda x: P(axis) if x.ndim else P(), state)

    def local(params: Params, state: SamplingState) -> SamplingState:
        state = decode(config, params, state)
        return state.replace(step=jax.lax.pmax(state.step, axis))

    return jax.shard_map(
        local, mesh=mesh, in_specs=(P(), state_specs), out_specs=state_specs, axis_names={axis}
    )(params, state)


def outputs(state: SamplingState) -> SampleOutput:
    """The ``SampleOutput`` of a finished state (device arrays)."""
    p = state.prompt_tokens_bp.shape[1]
    return SampleOutput(
        prompt_tokens=state.prompt_tokens_bp,
        prompt_mask=state.kv_mask_bs[:, :p],
        response_tokens=state.tokens_br,
        response_mask=state.mask_br,
        response_logprobs=state.logprobs_br,
        lengths=jnp.sum(state.mask_br, axis=1, dtype=jnp.int32),
        routed_experts=state.experts_bslk,
    )


def sample_batch(
    config: ModelConfig,
    params: Params,
    prompt_tokens_bp: jax.Array,
    prompt_mask_bp: jax.Array,
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
      prompt_tokens_bp: [B, P] int prompt ids, LEFT-padded so every prompt ends at P-1.
      prompt_mask_bp: [B, P] bool, True for real prompt tokens; an all-False row is a
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
        prompt_tokens_bp,
        prompt_mask_bp,
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


# ------------------------------------------------------------------- continuous batching


@flax.struct.dataclass
class ContinuousState:
    """Carry of the continuous engine. N queued rows (the call's batch bucket), C decode
    slots, P prompt slots, R response slots, S = P + R.

    Row n's prompt K/V stay in ``prompt_cache`` ([N, K, P, H]) until a slot frees; its
    outputs are written by row ([N, R]), so they come out in the caller's row order.
    """

    iterations: jax.Array  # [] int32 decode steps run (each feeds every slot once)
    slot_steps: jax.Array  # [] int32 slots x decode steps, summed over the loop's widths
    next_q: jax.Array  # [] int32 position in ``queue_n`` of the next row to start
    num_queued: jax.Array  # [] int32 rows still to decode after prefill
    queue_n: jax.Array  # [N] int32 rows in start order (rows to decode first)
    max_new_n: jax.Array  # [N] int32 token limit of each row
    prompt_mask_np: jax.Array  # [N, P] bool
    prompt_len_n: jax.Array  # [N] int32
    prompt_cache: model_lib.Cache  # per layer {"k", "v"}: [N, K, P, H]
    rng_n: jax.Array  # [N] row keys: row n draws its token i with fold_in(rng_n[n], i)
    tokens_nr: jax.Array  # [N, R] int32
    logprobs_nr: jax.Array  # [N, R] float32
    mask_nr: jax.Array  # [N, R] bool
    row_c: jax.Array  # [C] int32 the row a slot decodes
    step_c: jax.Array  # [C] int32 response tokens that row has sampled so far
    done_c: jax.Array  # [C] bool: the slot is free
    kv_mask_cs: jax.Array  # [C, S] bool
    cache: model_lib.Cache  # per layer {"k", "v"}: [C, K, S, H]
    slots_read: jax.Array  # [] float32 cache slots attention read, summed over steps
    # [N, S, L, k] int16 expert choices of each row's fed tokens at their slots (as
    # ``SamplingState.experts_bslk``), or None when routing is not recorded.
    experts_nslk: Any
    eos_ids: tuple[int, ...] = flax.struct.field(pytree_node=False)
    sampling: SamplingConfig = flax.struct.field(pytree_node=False)


def _refill(state: ContinuousState) -> ContinuousState:
    """Starts the next queued rows in the free slots: copies each one's prompt K/V and
    mask into the slot (response slots masked) at step 1 (token 0 came from prefill)."""
    n, p = state.prompt_mask_np.shape
    free_c = state.done_c
    queue_pos_c = state.next_q + jnp.cumsum(free_c, dtype=jnp.int32) - 1
    start_c = free_c & (queue_pos_c < state.num_queued)
    new_row_c = state.queue_n[jnp.clip(queue_pos_c, 0, n - 1)]
    s = state.kv_mask_cs.shape[1]
    mask_cs = jnp.pad(state.prompt_mask_np[new_row_c], ((0, 0), (0, s - p)))
    cache = []
    for layer, prompt_layer in zip(state.cache, state.prompt_cache):
        new_layer = {}
        for name, x_cksh in layer.items():
            prompt_ckph = prompt_layer[name][new_row_c]
            old_ckph = x_cksh[:, :, :p]
            keep = jnp.where(start_c[:, None, None, None], prompt_ckph, old_ckph)
            new_layer[name] = jax.lax.dynamic_update_slice(x_cksh, keep, (0, 0, 0, 0))
        cache.append(new_layer)
    return state.replace(
        next_q=state.next_q + jnp.sum(start_c, dtype=jnp.int32),
        row_c=jnp.where(start_c, new_row_c, state.row_c),
        step_c=jnp.where(start_c, 1, state.step_c),
        done_c=free_c & ~start_c,
        kv_mask_cs=jnp.where(start_c[:, None], mask_cs, state.kv_mask_cs),
        cache=cache,
    )


def slot_widths(slots: int, min_slots: int) -> list[int]:
    """The continuous engine's loop widths: ``slots``, then halved while >= ``min_slots``."""
    widths = [slots]
    while widths[-1] // 2 >= min_slots:
        widths.append(widths[-1] // 2)
    return widths


def _compact(state: ContinuousState, width: int) -> ContinuousState:
    """Keeps ``width`` slots: the busy ones (at most ``width``), moved to the front."""
    keep_w = jnp.argsort(state.done_c, stable=True)[:width]  # busy slots first
    return state.replace(
        row_c=state.row_c[keep_w],
        step_c=state.step_c[keep_w],
        done_c=state.done_c[keep_w],
        kv_mask_cs=state.kv_mask_cs[keep_w],
        cache=jax.tree.map(lambda x_cksh: x_cksh[keep_w], state.cache),
    )


def _continuous_step(config: ModelConfig, params: Params, state: ContinuousState):
    """Feeds each live slot's last token at its own slot P + step - 1, samples the next
    with its row's key at its row's step and writes it to the row's outputs."""
    n, p = state.prompt_mask_np.shape
    c = state.row_c.shape[0]
    live_c = ~state.done_c
    row_c = jnp.where(live_c, state.row_c, 0)
    prev_c = jnp.maximum(state.step_c - 1, 0)
    token_c = state.tokens_nr[row_c, prev_c]
    slot_c = p + prev_c
    slots_c = jnp.arange(c)
    kv_mask_cs = state.kv_mask_cs.at[slots_c, slot_c].set(live_c)
    kv_len = jnp.max(jnp.where(live_c, slot_c + 1, 1))
    block = state.sampling.attn_block
    args = (
        config,
        params,
        token_c[:, None],
        (state.prompt_len_n[row_c] + prev_c)[:, None],
        kv_mask_cs,
        state.cache,
        slot_c,
    )
    experts_nslk = state.experts_nslk
    if experts_nslk is None:
        logits_c1v, cache = model_lib.forward_with_cache(*args, kv_len=kv_len, kv_block=block)
    else:  # each live slot's fed token's experts, at its row and slot
        logits_c1v, cache, router_lte = model_lib.forward_with_cache_and_router(
            *args, kv_len=kv_len, kv_block=block
        )
        experts_clk = moe_lib.top_experts(router_lte, config.num_experts_per_tok, c)[:, 0]
        at_row_c = jnp.where(live_c, row_c, n)  # n: out of bounds, dropped
        experts_nslk = experts_nslk.at[at_row_c, slot_c].set(
            experts_clk.astype(_EXPERT_DTYPE), mode="drop"
        )
    s = kv_mask_cs.shape[1]
    read = c * (s if block <= 0 else jnp.minimum(-(-kv_len // block) * block, s))
    rng_c = jax.vmap(jax.random.fold_in)(state.rng_n[row_c], state.step_c)
    tokens_c, logprobs_c = _sample_and_score(logits_c1v[:, 0], rng_c, state.sampling)
    out_row_c = jnp.where(live_c, row_c, n)  # n: out of bounds, dropped
    at = (out_row_c, state.step_c)
    eos_c = functools.reduce(jnp.logical_or, [tokens_c == e for e in state.eos_ids])
    return state.replace(
        iterations=state.iterations + 1,
        slot_steps=state.slot_steps + c,
        tokens_nr=state.tokens_nr.at[at].set(tokens_c, mode="drop"),
        logprobs_nr=state.logprobs_nr.at[at].set(logprobs_c, mode="drop"),
        mask_nr=state.mask_nr.at[at].set(True, mode="drop"),
        step_c=state.step_c + live_c,
        done_c=state.done_c | eos_c | (state.step_c + 1 >= state.max_new_n[row_c]),
        kv_mask_cs=kv_mask_cs,
        cache=cache,
        slots_read=state.slots_read + jnp.asarray(read, jnp.float32),
        experts_nslk=experts_nslk,
    )


def sample_continuous(
    config: ModelConfig,
    params: Params,
    prompt_tokens_np: jax.Array,
    prompt_mask_np: jax.Array,
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
    """Continuous batching: N rows through ``slots`` decode slots; pure and jittable.

    All N prompts are prefilled at once into a P-slot cache, which samples every row's
    token 0 (as ``prefill``). Rows not done then wait in a queue. Each iteration of one
    ``lax.while_loop`` first starts queued rows in the free slots (``_refill``), then
    runs one decode step for all slots, each at its own position. Once the queue is
    empty and at most half the slots are busy, the busy ones move into a loop of half
    the width (``_compact``; ``slot_widths`` down to ``sampling.min_slots``), so the
    tail of long rows does not decode beside idle slots. The last loop ends when every
    slot is free. Row n draws its token i with ``fold_in(row_keys(rng, N)[n], i)``, its
    cache slots are laid out as in ``decode`` and both engines write a step's keys with
    the same per-row scatter, so its tokens and log-probs are the static engine's bit
    for bit (with >= 2 slots: XLA's CPU backend runs one-row matmuls with other kernels).

    Args:
      config, params: the model.
      prompt_tokens_np, prompt_mask_np: [N, P] left-padded prompts (as ``prefill``); an
        all-False row is padding, done from the start.
      rng: PRNG key or [N] row keys.
      max_new_tokens: token limit (traced), [] or [N] one per row; clipped to
        ``response_len``.
      slots: decode slots C (static, clipped to N; 0: N).
      response_len, eos_id, pad_id, sampling, cache_dtype, record_routing: as
        ``prefill`` (the expert choices of every row's fed tokens at their slots).

    Returns:
      (``SampleOutput`` with N rows, stats: ``decode_steps`` (loop iterations),
      ``slot_steps`` (width x iterations, summed over the widths), ``slots_read``
      (cache slots read by attention, summed over steps and slots)).
    """
    n, p = prompt_tokens_np.shape
    r = response_len
    c = min(int(slots), n) if slots > 0 else n
    first = _prefill_state(
        config,
        params,
        prompt_tokens_np,
        prompt_mask_np,
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
    waiting_n = ~first.done_b
    state = ContinuousState(
        iterations=jnp.zeros((), jnp.int32),
        slot_steps=jnp.zeros((), jnp.int32),
        next_q=jnp.zeros((), jnp.int32),
        num_queued=jnp.sum(waiting_n, dtype=jnp.int32),
        queue_n=jnp.argsort(~waiting_n, stable=True).astype(jnp.int32),
        max_new_n=jnp.broadcast_to(first.max_new_tokens, (n,)),
        prompt_mask_np=first.kv_mask_bs[:, :p],
        prompt_len_n=first.prompt_len_b,
        prompt_cache=first.cache,
        rng_n=first.rng_b,
        tokens_nr=first.tokens_br,
        logprobs_nr=first.logprobs_br,
        mask_nr=first.mask_br,
        row_c=jnp.zeros((c,), jnp.int32),
        step_c=jnp.zeros((c,), jnp.int32),
        done_c=jnp.ones((c,), bool),
        kv_mask_cs=jnp.zeros((c, p + r), bool),
        cache=model_lib.init_cache(config, c, p + r, cache_dtype),
        slots_read=jnp.zeros((), jnp.float32),
        experts_nslk=first.experts_bslk,
        eos_ids=first.eos_ids,
        sampling=sampling,
    )

    def body(s: ContinuousState) -> ContinuousState:
        refill = jnp.any(s.done_c) & (s.next_q < s.num_queued)
        s = jax.lax.cond(refill, _refill, lambda x: x, s)
        return _continuous_step(config, params, s)

    widths = slot_widths(c, sampling.min_slots)
    for i, width in enumerate(widths):
        if i:
            state = _compact(state, width)
        last = i == len(widths) - 1

        def cond(s: ContinuousState, width=width, last=last) -> jax.Array:
            queued = s.next_q < s.num_queued
            busy_c = ~s.done_c
            # A narrower loop takes over once no row waits and half the slots hold all.
            narrow = ~queued & (jnp.sum(busy_c) <= width // 2) & (not last)
            return (queued | jnp.any(busy_c)) & ~narrow

        state = jax.lax.while_loop(cond, body, state)
    out = SampleOutput(
        prompt_tokens=first.prompt_tokens_bp,
        prompt_mask=state.prompt_mask_np,
        response_tokens=state.tokens_nr,
        response_mask=state.mask_nr,
        response_logprobs=state.logprobs_nr,
        lengths=jnp.sum(state.mask_nr, axis=1, dtype=jnp.int32),
        routed_experts=state.experts_nslk,
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
    prompt_tokens_np: jax.Array,
    prompt_mask_np: jax.Array,
    rng: jax.Array,
    max_new_tokens: jax.Array | int,
    *,
    mesh: jax.sharding.Mesh,
    slots: int,
    axis: str = sharding_lib.SAMPLER_BATCH_AXIS,
    **kwargs,
) -> tuple[SampleOutput, dict[str, jax.Array]]:
    """``sample_continuous`` with the N rows split over ``mesh`` axis ``axis``.

    Each of the D shards runs its own loop over its N / D rows with ``slots`` / D decode
    slots (at least 1; 0: all its rows). Row keys are taken for the whole batch first
    (``row_keys(rng, N)``), so every row draws the tokens it draws unsharded. Other mesh
    axes (fsdp, tensor) stay automatic, as in ``decode_sharded``.

    Returns:
      (``SampleOutput``, batch-sharded over ``axis``; stats: ``decode_steps`` the largest
      over shards, ``slot_steps`` and ``slots_read`` summed over them).
    """
    n = prompt_tokens_np.shape[0]
    d = mesh.shape[axis]
    rng_n = row_keys(rng, n)
    limit_n = jnp.broadcast_to(jnp.asarray(max_new_tokens, jnp.int32), (n,))
    local_slots = max(1, slots // d) if slots > 0 else 0
    P = jax.sharding.PartitionSpec

    def local(params, tokens_np, mask_np, rng_n, limit_n):
        out, stats = sample_continuous(
            config, params, tokens_np, mask_np, rng_n, limit_n, slots=local_slots, **kwargs
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
        in_specs=(P(), P(axis), P(axis), P(axis), P(axis)),
        out_specs=(P(axis), P()),
        axis_names={axis},
        # The loop state starts from constants (unvarying over ``axis``) and becomes
        # varying in the refill branch; every output is per shard or reduced above.
        check_vma=False,
    )(params, prompt_tokens_np, prompt_mask_np, rng_n, limit_n)


# ---------------------------------------------------------------------------------- buckets


def bucket(n: int, *, minimum: int = 1, granule: int | None = None, cap: int | None = None) -> int:
    """Rounds ``n`` up to a bucket size.

    Args:
      n: the size to cover (>= 1).
      minimum: smallest bucket.
      granule: round up to a multiple of this; None rounds up to a power of two.
      cap: largest bucket (used when the rounded size would exceed it; must be >= n).

    Returns:
      The bucket size, >= n.
    """
    n = max(n, minimum)
    size = -(-n // granule) * granule if granule else 1 << (n - 1).bit_length()
    return min(size, cap) if cap is not None else size


# ---------------------------------------------------------------------------------- Sampler


class Sampler:
    """Samples from Python token lists with bucketed shapes and cached compiled programs.

    ``__call__`` returns a ``SampleOutput`` of **numpy** arrays on the host whose first
    dimension is the number of prompts (bucket rows dropped); P and R are the bucket
    sizes. ``last_stats`` holds the wall time of the last call split into prefill and
    decode (seconds) and the number of decode-loop iterations.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        eos_id: int | tuple[int, ...],
        pad_id: int,
        max_prompt_len: int,
        max_new_tokens: int,
        prompt_bucket_min: int = 8,
        response_bucket_min: int = 8,
        batch_bucket_min: int = 1,
        batch_granule: int | None = None,
        mesh: jax.sharding.Mesh | None = None,
        cache_dtype: str | None = None,
        record_routing: bool = False,
    ):
        """Creates a sampler.

        Args:
          config: model shape.
          eos_id: end-of-sequence id, or a tuple of ids any of which ends a row (an id
        outside [0, V) never stops a row early).
          pad_id: padding id, in [0, V).
          max_prompt_len: longest prompt accepted; the largest prompt bucket.
          max_new_tokens: default and largest response length; the largest response
            bucket.
          prompt_bucket_min: smallest prompt bucket; prompts round up to powers of two.
          response_bucket_min: smallest response bucket (powers of two).
          batch_bucket_min: smallest batch bucket.
          batch_granule: batch buckets are multiples of this; None: powers of two.
          mesh: if given, the batch is sharded over its ``data`` axis (batch buckets
            are rounded to a multiple of its size) and each shard runs its own decode
            loop (``decode_sharded``); params are used as given.
          cache_dtype: KV-cache dtype name (default: the model's compute dtype).
          record_routing: return every token's MoE expert choices per sparse layer
            (``SampleOutput.routed_experts``), for routing replay in the update and the
            rollout-vs-update disagreement metric.
        """
        if record_routing and not config.num_experts:
            raise ValueError("record_routing=True needs a MoE model (num_experts > 0)")
        if not 0 <= pad_id < config.vocab_size:
            raise ValueError(f"pad_id={pad_id} is outside the vocabulary [0, {config.vocab_size})")
        if max_prompt_len < 1 or max_new_tokens < 1:
            raise ValueError(
                f"max_prompt_len={max_prompt_len} and max_new_tokens={max_new_tokens} must be >= 1"
            )
        if max_prompt_len + max_new_tokens > config.max_seq_len:
            raise ValueError(
                f"max_prompt_len + max_new_tokens = {max_prompt_len + max_new_tokens} exceeds "
                f"ModelConfig.max_seq_len={config.max_seq_len}"
            )
        if mesh is not None and "data" not in mesh.axis_names:
            raise ValueError(f"mesh axes {mesh.axis_names} have no 'data' axis")
        self.config = config
        self.eos_ids = eos_ids_of(eos_id)
        self.eos_id = self.eos_ids[0]
        self.pad_id = int(pad_id)
        self.max_prompt_len = max_prompt_len
        self.max_new_tokens = max_new_tokens
        self.prompt_bucket_min = prompt_bucket_min
        self.response_bucket_min = response_bucket_min
        self.batch_bucket_min = batch_bucket_min
        self.batch_granule = batch_granule
        self.mesh = mesh
        self._shards = 1 if mesh is None else mesh.shape[sharding_lib.SAMPLER_BATCH_AXIS]
        self.cache_dtype = cache_dtype
        self.record_routing = record_routing
        self.last_stats: dict[str, float] = {}
        self._num_traces = 0

        def counted_prefill(*args, **kwargs):
            self._num_traces += 1  # runs once per trace, i.e. per compiled shape
            return prefill(*args, **kwargs)

        def counted_decode(config, params, state):
            self._num_traces += 1
            if mesh is None:
                return decode(config, params, state)
            return decode_sharded(config, params, state, mesh)

        self._prefill = jax.jit(
            counted_prefill,
            static_argnums=0,
            static_argnames=(
                "response_len",
                "eos_id",
                "pad_id",
                "sampling",
                "cache_dtype",
                "record_routing",
            ),
        )
        # The state (cache included) is donated so the loop updates it in place.
        self._decode = jax.jit(counted_decode, static_argnums=0, donate_argnums=2)

        def counted_continuous(*args, **kwargs):
            self._num_traces += 1
            if mesh is None:
                return sample_continuous(*args, **kwargs)
            return sample_continuous_sharded(*args, mesh=mesh, **kwargs)

        self._continuous = jax.jit(
            counted_continuous,
            static_argnums=0,
            static_argnames=(
                "slots",
                "response_len",
                "eos_id",
                "pad_id",
                "sampling",
                "cache_dtype",
                "record_routing",
            ),
        )

    @property
    def num_compilations(self) -> int:
        """Jit traces so far: two (prefill + decode) per new (B, P, R, sampling) bucket."""
        return self._num_traces

    def buckets(self, num_prompts: int, prompt_len: int, max_new_tokens: int) -> tuple[int, ...]:
        """(B, P, R) bucket sizes for a call."""
        b = bucket(num_prompts, minimum=self.batch_bucket_min, granule=self.batch_granule)
        if self.mesh is not None:  # every device gets the same number of rows
            data = self.mesh.shape["data"]
            b = -(-b // data) * data
        p = bucket(prompt_len, minimum=self.prompt_bucket_min, cap=self.max_prompt_len)
        r = bucket(max_new_tokens, minimum=self.response_bucket_min, cap=self.max_new_tokens)
        return b, p, r

    def pad_prompts(self, prompts: Sequence[Sequence[int]], batch: int, length: int):
        """Left-pads ``prompts`` into [batch, length] numpy tokens and mask."""
        tokens_bp = np.full((batch, length), self.pad_id, np.int32)
        mask_bp = np.zeros((batch, length), bool)
        for i, prompt in enumerate(prompts):
            if len(prompt):
                tokens_bp[i, length - len(prompt) :] = prompt
                mask_bp[i, length - len(prompt) :] = True
        return tokens_bp, mask_bp

    def _validate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> None:
        if not len(prompts):
            raise ValueError("Sampler got no prompts")
        if not 1 <= max_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} must be in [1, {self.max_new_tokens}] "
                "(the Sampler's max_new_tokens)"
            )
        v = self.config.vocab_size
        for i, prompt in enumerate(prompts):
            if not 1 <= len(prompt) <= self.max_prompt_len:
                raise ValueError(
                    f"prompt {i} has {len(prompt)} tokens; expected 1..{self.max_prompt_len}"
                )
            if min(prompt) < 0 or max(prompt) >= v:
                raise ValueError(f"prompt {i} has a token id outside [0, {v}): {list(prompt)}")

    def __call__(
        self,
        params: Params,
        prompts: Sequence[Sequence[int]],
        *,
        rng: jax.Array,
        sampling: SamplingConfig = SamplingConfig(),
        max_new_tokens: int | Sequence[int] | None = None,
    ) -> SampleOutput:
        """Samples one response per prompt.

        Args:
          params: the parameter tree (the learner's own, possibly sharded).
          prompts: token id lists, 1..max_prompt_len tokens each.
          rng: PRNG key, or one typed key per prompt ([len(prompts)]).
          sampling: how tokens are drawn.
          max_new_tokens: token limit for this call (default: the Sampler's), or one
            limit per prompt (a row ends after its own limit; e.g. forced lengths).

        Returns:
          ``SampleOutput`` of numpy arrays, one row per prompt.
        """
        if max_new_tokens is None:
            max_new_tokens = self.max_new_tokens
        per_row = np.ndim(max_new_tokens) == 1
        if per_row and len(max_new_tokens) != len(prompts):
            raise ValueError(f"{len(max_new_tokens)} max_new_tokens for {len(prompts)} prompts")
        if per_row and min(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens={list(max_new_tokens)} has a limit < 1")
        max_new = int(np.max(max_new_tokens))
        self._validate(prompts, max_new)
        n = len(prompts)
        b, p, r = self.buckets(n, max(len(x) for x in prompts), max_new)
        tokens_bp, mask_bp = self.pad_prompts(prompts, b, p)
        limit = np.int32(max_new)  # [] or [B] (padding rows: 1)
        if per_row:
            limit = np.ones(b, np.int32)
            limit[:n] = max_new_tokens
        if is_row_keys(rng):  # padding rows take the first row's key (they draw nothing)
            if rng.shape[0] != n:
                raise ValueError(f"{rng.shape[0]} row keys for {n} prompts")
            rng = jnp.concatenate([rng, jnp.broadcast_to(rng[:1], (b - n,))])
        if self.mesh is not None:
            batch_sharding = sharding_lib.sampler_batch_sharding(self.mesh)
            tokens_bp, mask_bp = jax.device_put((tokens_bp, mask_bp), batch_sharding)
        if sampling.engine == "continuous":
            return self._call_continuous(params, tokens_bp, mask_bp, rng, n, limit, r, sampling)
        start = time.perf_counter()
        state = self._prefill(
            self.config,
            params,
            tokens_bp,
            mask_bp,
            rng,
            limit,
            response_len=r,
            eos_id=self.eos_ids,
            pad_id=self.pad_id,
            sampling=sampling,
            cache_dtype=self.cache_dtype,
            record_routing=self.record_routing,
        )
        jax.block_until_ready(state)
        prefilled = time.perf_counter()
        state = self._decode(self.config, params, state)
        # Every process gets all rows (a gather when the mesh spans several processes).
        host = distributed.to_host(
            (state.prompt_tokens_bp, state.kv_mask_bs, state.tokens_br, state.mask_br)
            + (state.logprobs_br, state.step, state.experts_bslk)
        )
        end = time.perf_counter()
        prompt_tokens_bp, kv_mask_bs, tokens_br, mask_br, logprobs_br, steps, experts = host
        decode_steps = int(steps) - 1
        self.last_stats = {
            "prefill_s": prefilled - start,
            "decode_s": end - prefilled,
            "time_s": end - start,
            "decode_steps": decode_steps,
            "batch_bucket": b,
            "prompt_bucket": p,
            "response_bucket": r,
            "engine": "static",
            "slots": b,
            "slot_steps": b * decode_steps,
            "decode_tokens": int(mask_br[:n].sum()) - sum(1 for x in prompts if len(x)),
            "slots_read": static_slots_read(b, p, r, decode_steps, sampling.attn_block),
        }
        return SampleOutput(
            prompt_tokens=prompt_tokens_bp[:n],
            prompt_mask=kv_mask_bs[:n, :p],
            response_tokens=tokens_br[:n],
            response_mask=mask_br[:n],
            response_logprobs=logprobs_br[:n],
            lengths=mask_br[:n].sum(axis=1, dtype=np.int32),
            routed_experts=None if experts is None else experts[:n],
        )

    def _call_continuous(self, params, tokens_bp, mask_bp, rng, n, limit, r, sampling):
        """``__call__`` with the continuous engine (``sample_continuous``), one program."""
        start = time.perf_counter()
        out, stats = self._continuous(
            self.config,
            params,
            tokens_bp,
            mask_bp,
            rng,
            limit,
            slots=decode_slots(sampling, tokens_bp.shape[0], self._shards),
            response_len=r,
            eos_id=self.eos_ids,
            pad_id=self.pad_id,
            sampling=sampling,
            cache_dtype=self.cache_dtype,
            record_routing=self.record_routing,
        )
        # Every process gets all rows (a gather when the mesh spans several processes).
        out, stats = distributed.to_host((out, stats))
        end = time.perf_counter()
        b, p = tokens_bp.shape
        real = int(out.prompt_mask[:n].any(axis=1).sum())
        self.last_stats = {
            "prefill_s": 0.0,  # one program: prefill and decode are not timed apart
            "decode_s": end - start,
            "time_s": end - start,
            "decode_steps": int(stats["decode_steps"]),
            "batch_bucket": b,
            "prompt_bucket": p,
            "response_bucket": r,
            "engine": "continuous",
            "slots": decode_slots(sampling, b, self._shards),
            "slot_steps": int(stats["slot_steps"]),
            "decode_tokens": int(out.response_mask[:n].sum()) - real,
            "slots_read": float(stats["slots_read"]),
        }
        return SampleOutput(
            prompt_tokens=out.prompt_tokens[:n],
            prompt_mask=out.prompt_mask[:n],
            response_tokens=out.response_tokens[:n],
            response_mask=out.response_mask[:n],
            response_logprobs=out.response_logprobs[:n],
            lengths=out.lengths[:n],
            routed_experts=None if out.routed_experts is None else out.routed_experts[:n],
        )


def decode_slots(sampling: SamplingConfig, rows: int, shards: int = 1) -> int:
    """Rows that decode at once in a call of ``rows`` (bucketed) rows: all of them with the
    static engine; ``sampling.slots`` clipped to ``rows`` (0: all) with the continuous,
    split evenly over ``shards`` data shards (at least one slot each)."""
    if sampling.engine == "continuous" and sampling.slots > 0:
        return max(1, min(sampling.slots, rows) // shards) * shards
    return rows


def kv_cache_slots(sampling: SamplingConfig, rows: int, prompt_len: int, response_len: int):
    """Cache slots (one K and one V vector per layer and KV head each) that a call of
    ``rows`` bucketed rows holds: static, the [B, K, P + R, H] decode cache (B x (P + R));
    continuous, every row's prompt cache [N, K, P, H] plus the [C, K, P + R, H] slot cache
    (N x P + C x (P + R), C = ``decode_slots``), and while the loop narrows to C / 2
    slots (``_compact``) the narrower cache beside the wider one (+ C / 2 x (P + R))."""
    s = prompt_len + response_len
    if sampling.engine != "continuous":
        return rows * s
    c = decode_slots(sampling, rows)
    return rows * prompt_len + (c + narrowed_slots(sampling, c)) * s


def narrowed_slots(sampling: SamplingConfig, slots: int) -> int:
    """Slots of the continuous engine's first narrower loop (C / 2), made while the
    C-slot cache still lives; 0 when ``slots`` never narrow (``slot_widths``)."""
    return slots // 2 if len(slot_widths(slots, sampling.min_slots)) > 1 else 0


def static_slots_read(batch: int, prompt_len: int, response_len: int, steps: int, block: int):
    """Cache slots the static engine's decode attention reads over ``steps`` decode steps
    of ``batch`` rows: all P + R per row and step, or (``block`` > 0) the filled P + i
    slots rounded up to whole blocks at step i = 1..steps."""
    s = prompt_len + response_len
    if block <= 0:
        return float(batch * s * steps)
    filled = prompt_len + np.arange(1, steps + 1)
    return float(batch * np.minimum(-(-filled // block) * block, s).sum())


def long_tail_lengths(rows: int, max_len: int, sigma: float, seed: int) -> np.ndarray:
    """[rows] response lengths in [1, max_len], log-normal with ``sigma``, the largest at
    ``max_len``: the long tail of math RL responses, for benchmarks that force them as
    per-row ``max_new_tokens`` (sigma 1 gives max / mean of about 4-7 for 32-256 rows)."""
    z = np.random.default_rng(seed).standard_normal(rows)
    lengths = np.exp(sigma * (z - z.max())) * max_len
    return np.clip(np.round(lengths), 1, max_len).astype(np.int32)
