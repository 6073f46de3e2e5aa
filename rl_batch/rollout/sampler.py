"""Jitted KV-cache sampler: prefill, then a ``lax.while_loop`` decode until every row is done.

Layout of one sampling batch (B rows, prompt bucket I, response bucket R, S = I + R;
shape letters as in docs/glossary.md)::

    slot:   0 ........ I-1 | I ............ I+R-1
            pad pad p0 p1 p2 | r0 r1 r2 EOS pad pad
            <- left padded ->  <- right padded ->

Every prompt ends at slot I-1, so the first response token is sampled from the logits
of slot I-1 for all rows at once and response token r always sits at slot I + r. RoPE
positions skip padding (``model.positions_from_mask`` semantics: a token's position is
the number of real tokens before it), so a padded row produces the same logits as the
same prompt run alone.

Shapes are bucketed (prompt length, response length and batch rounded up) so that a
new batch size or prompt length within a bucket reuses the compiled program; the
response length limit ``max_new_tokens`` is a traced scalar and never recompiles.

Modules (this one re-exports every public name, so ``from rl_batch.rollout.sampler
import ...`` is the one import the rest of the project needs):

  * ``rollout.sampling``: ``SamplingConfig`` (temperature / top-k / top-p / greedy, the
    engine and its slots; ``SamplingConfig.from_dict``; ``.method()``), the methods
    ``Greedy``, ``Temperature``, ``TopK``, ``TopP`` (frozen ``(logits, rng) -> tokens``),
    ``row_keys`` / ``is_row_keys``.
  * ``rollout.decode_step``: the step both engines share: ``forward`` (one pass of
    ``model.forward_with_cache``, the one writer of the MoE routing record) and
    ``sample_and_score``; ``SampleOutput``.
  * ``rollout.static``: the static engine. ``sample_batch(...)`` (pure, jittable;
    prefill + decode + outputs), its halves ``prefill`` and ``decode`` (``SamplingState``
    in between; ``Sampler`` jits them apart so the decode state can be donated) and
    ``decode_sharded`` (the batch split over a mesh axis, one loop per shard; no
    per-token collective).
  * ``rollout.continuous``: the continuous engine. ``sample_continuous`` (B rows
    through W decode slots, a finished row's slot refilled, the loop narrowing as the
    queue drains), ``sample_continuous_sharded`` (one such loop per ``data`` shard),
    ``decode_slots`` and ``kv_cache_slots`` (its sizes).
  * here: ``Sampler``, the host-side wrapper: pads and buckets Python prompt lists,
    caches compiled programs, runs either engine (``SamplingConfig.engine``), optionally
    shards the batch on a mesh, returns numpy arrays and ``last_stats``.

Randomness is per row: row b of a batch draws step i's token with
``fold_in(fold_in(rng, b), i)``, so a row's sample does not depend on the batch bucket,
the padding rows or the device shard it lands in. ``rng`` may instead be [B] typed keys,
one per row (row b then draws step i's token with ``fold_in(rng[b], i)``): a caller that
derives each row's key from what the row is (a prompt and a group member) gets the same
draws for that row in batches of any shape.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_batch import distributed
from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib
from rl_batch.rollout.continuous import (
    ContinuousState,
    decode_slots,
    kv_cache_slots,
    narrowed_slots,
    sample_continuous,
    sample_continuous_sharded,
    slot_widths,
)
from rl_batch.rollout.decode_step import EXPERT_DTYPE, SampleOutput, sample_and_score
from rl_batch.rollout.sampling import (
    ENGINES,
    Greedy,
    SamplingConfig,
    SamplingMethod,
    Temperature,
    TopK,
    TopP,
    categorical,
    eos_ids_of,
    first_argmax,
    is_row_keys,
    row_keys,
    top_k_filter,
    top_p_filter,
)
from rl_batch.rollout.static import (
    SamplingState,
    decode,
    decode_sharded,
    outputs,
    prefill,
    sample_batch,
    static_slots_read,
)

# Every name the rest of the project imports from ``rl_batch.rollout.sampler``.
__all__ = [
    "ENGINES",
    "EXPERT_DTYPE",
    "ContinuousState",
    "Greedy",
    "SampleOutput",
    "Sampler",
    "SamplingConfig",
    "SamplingMethod",
    "SamplingState",
    "Temperature",
    "TopK",
    "TopP",
    "bucket",
    "categorical",
    "decode",
    "decode_sharded",
    "decode_slots",
    "eos_ids_of",
    "first_argmax",
    "is_row_keys",
    "kv_cache_slots",
    "long_tail_lengths",
    "narrowed_slots",
    "outputs",
    "prefill",
    "row_keys",
    "sample_and_score",
    "sample_batch",
    "sample_continuous",
    "sample_continuous_sharded",
    "slot_widths",
    "static_slots_read",
    "top_k_filter",
    "top_p_filter",
]

ModelConfig = model_lib.ModelConfig
Params = model_lib.Params


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
    dimension is the number of prompts (bucket rows dropped); I and R are the bucket
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
        """Jit traces so far: two (prefill + decode) per new (B, I, R, sampling) bucket."""
        return self._num_traces

    def buckets(self, num_prompts: int, prompt_len: int, max_new_tokens: int) -> tuple[int, ...]:
        """(B, I, R) bucket sizes for a call."""
        b = bucket(num_prompts, minimum=self.batch_bucket_min, granule=self.batch_granule)
        if self.mesh is not None:  # every device gets the same number of rows
            data = self.mesh.shape["data"]
            b = -(-b // data) * data
        p = bucket(prompt_len, minimum=self.prompt_bucket_min, cap=self.max_prompt_len)
        r = bucket(max_new_tokens, minimum=self.response_bucket_min, cap=self.max_new_tokens)
        return b, p, r

    def pad_prompts(self, prompts: Sequence[Sequence[int]], batch: int, length: int):
        """Left-pads ``prompts`` into [batch, length] numpy tokens and mask."""
        tokens_bi = np.full((batch, length), self.pad_id, np.int32)
        mask_bi = np.zeros((batch, length), bool)
        for i, prompt in enumerate(prompts):
            if len(prompt):
                tokens_bi[i, length - len(prompt) :] = prompt
                mask_bi[i, length - len(prompt) :] = True
        return tokens_bi, mask_bi

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
        tokens_bi, mask_bi = self.pad_prompts(prompts, b, p)
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
            tokens_bi, mask_bi = jax.device_put((tokens_bi, mask_bi), batch_sharding)
        if sampling.engine == "continuous":
            return self._call_continuous(params, tokens_bi, mask_bi, rng, n, limit, r, sampling)
        start = time.perf_counter()
        state = self._prefill(
            self.config,
            params,
            tokens_bi,
            mask_bi,
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
            (state.prompt_tokens_bi, state.kv_mask_bs, state.tokens_br, state.mask_br)
            + (state.logprobs_br, state.step, state.experts_bsla)
        )
        end = time.perf_counter()
        prompt_tokens_bi, kv_mask_bs, tokens_br, mask_br, logprobs_br, steps, experts = host
        decode_steps = int(steps) - 1
        self.last_stats = call_stats(
            "static",
            (start, prefilled, end),
            (b, p, r),
            decode_steps=decode_steps,
            slots=b,
            slot_steps=b * decode_steps,
            decode_tokens=int(mask_br[:n].sum()) - sum(1 for x in prompts if len(x)),
            slots_read=static_slots_read(b, p, r, decode_steps, sampling.attn_block),
        )
        return SampleOutput(
            prompt_tokens=prompt_tokens_bi[:n],
            prompt_mask=kv_mask_bs[:n, :p],
            response_tokens=tokens_br[:n],
            response_mask=mask_br[:n],
            response_logprobs=logprobs_br[:n],
            lengths=mask_br[:n].sum(axis=1, dtype=np.int32),
            routed_experts=None if experts is None else experts[:n],
        )

    def _call_continuous(self, params, tokens_bi, mask_bi, rng, n, limit, r, sampling):
        """``__call__`` with the continuous engine (``sample_continuous``), one program."""
        start = time.perf_counter()
        out, stats = self._continuous(
            self.config,
            params,
            tokens_bi,
            mask_bi,
            rng,
            limit,
            slots=decode_slots(sampling, tokens_bi.shape[0], self._shards),
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
        b, p = tokens_bi.shape
        real = int(out.prompt_mask[:n].any(axis=1).sum())
        self.last_stats = call_stats(
            "continuous",
            (start, start, end),  # one program: prefill and decode are not timed apart
            (b, p, r),
            decode_steps=int(stats["decode_steps"]),
            slots=decode_slots(sampling, b, self._shards),
            slot_steps=int(stats["slot_steps"]),
            decode_tokens=int(out.response_mask[:n].sum()) - real,
            slots_read=float(stats["slots_read"]),
        )
        return SampleOutput(
            prompt_tokens=out.prompt_tokens[:n],
            prompt_mask=out.prompt_mask[:n],
            response_tokens=out.response_tokens[:n],
            response_mask=out.response_mask[:n],
            response_logprobs=out.response_logprobs[:n],
            lengths=out.lengths[:n],
            routed_experts=None if out.routed_experts is None else out.routed_experts[:n],
        )


def call_stats(
    engine: str,
    times: tuple[float, float, float],
    buckets: tuple[int, int, int],
    *,
    decode_steps: int,
    slots: int,
    slot_steps: int,
    decode_tokens: int,
    slots_read: float,
) -> dict[str, Any]:
    """``Sampler.last_stats`` of one call, the one place its keys are written.

    Args:
      engine: ``"static"`` or ``"continuous"``.
      times: perf-counter readings (start, prefill done, end); the continuous engine
        runs one program, so its prefill reading is its start (``prefill_s`` 0).
      buckets: the call's (B, I, R) bucket sizes.
      decode_steps: decode-loop iterations (the largest over data shards).
      slots: rows that decode at once (``decode_slots``).
      slot_steps: slots x iterations, summed over loop widths and shards.
      decode_tokens: tokens generated by decode steps (prefill's token 0 excluded).
      slots_read: cache slots decode attention read.
    """
    start, prefilled, end = times
    b, p, r = buckets
    return {
        "prefill_s": prefilled - start,
        "decode_s": end - prefilled,
        "time_s": end - start,
        "decode_steps": decode_steps,
        "batch_bucket": b,
        "prompt_bucket": p,
        "response_bucket": r,
        "engine": engine,
        "slots": slots,
        "slot_steps": slot_steps,
        "decode_tokens": decode_tokens,
        "slots_read": slots_read,
    }


def long_tail_lengths(rows: int, max_len: int, sigma: float, seed: int) -> np.ndarray:
    """[rows] response lengths in [1, max_len], log-normal with ``sigma``, the largest at
    ``max_len``: the long tail of math RL responses, for benchmarks that force them as
    per-row ``max_new_tokens`` (sigma 1 gives max / mean of about 4-7 for 32-256 rows)."""
    z = np.random.default_rng(seed).standard_normal(rows)
    lengths = np.exp(sigma * (z - z.max())) * max_len
    return np.clip(np.round(lengths), 1, max_len).astype(np.int32)
