"""How next tokens are drawn: sampling methods, ``SamplingConfig`` and per-row keys.

Shape letters (docs/glossary.md): B rows, V vocabulary.

Every method maps next-token logits [B, V] and one PRNG key per row [B] to tokens [B]
with row-local operations only, so a row samples the same token in any batch, bucket
or device shard, and no method needs a collective across rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np


def eos_ids_of(eos_id: int | Sequence[int]) -> tuple[int, ...]:
    """The end-of-sequence ids as a tuple: one id, or several in order (deduplicated)."""
    ids = (eos_id,) if isinstance(eos_id, (int, np.integer)) else tuple(eos_id)
    if not ids:
        raise ValueError("eos_id: at least one end-of-sequence id is needed")
    return tuple(dict.fromkeys(int(i) for i in ids))


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
        all I + R slots with the einsum reference.
      min_slots: the continuous engine narrows its loop once no row waits and the next
        width holds every busy slot, down to this many slots (>= 1; ``slots`` or more:
        never), so that the last long rows do not decode beside idle slots. Each width is
        its own loop in the program (compile time grows with log2(slots / min_slots)).
        Tokens do not change; log-probs within fp32 rounding (a one-slot loop's one-row
        matmuls round differently on XLA's CPU backend).
      widths_per_halving: loop widths per halving of the continuous engine's slots (>= 1):
        1 steps W, W / 2, W / 4, ...; 2 adds 3/4 between (W, 3W / 4, W / 2, 3W / 8, ...),
        so a narrower loop takes over once a quarter of the slots idle instead of half,
        for about twice the loops to compile (``continuous.slot_widths``). On a CPU a
        narrow step costs more per row than a wide one, so 2 was not measurably faster
        (docs/rollout_engine.md).
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    greedy: bool = False
    engine: str = "static"
    slots: int = 0
    attn_block: int = 0
    min_slots: int = 1
    widths_per_halving: int = 1

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
        if not (isinstance(self.min_slots, int) and self.min_slots >= 1):
            raise ValueError(
                f"SamplingConfig.min_slots must be an int >= 1, got {self.min_slots!r}"
            )
        if not (isinstance(self.widths_per_halving, int) and self.widths_per_halving >= 1):
            raise ValueError(
                "SamplingConfig.widths_per_halving must be an int >= 1, got "
                f"{self.widths_per_halving!r}"
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


# ------------------------------------------------------------------------------- row keys


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
