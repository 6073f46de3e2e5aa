"""The policy-gradient batch: its container, shape checks, and how it is cut up.

``Batch`` is the batch of both learners' policy loss (GRPO's, and the PPO actor's with
per-token advantages); ``check_rollout_shapes`` checks any rollout batch (``ppo.PPOBatch``
too). ``rollout_fields`` turns a rollout into batch fields on the host (dropped groups
masked), ``split_batch`` cuts a batch into minibatches or micro-batches (``check_split``
says whether it can), ``loss_normalisers`` gives the full batch's token and sequence
counts every micro-batch's loss divides by, and ``sequence_metrics`` the length metrics.

Sequence layout of a ``Batch``: ``tokens = concat(prompt, response)`` [B, T] with
T = I + R, mask likewise, positions ``model.positions_from_mask(mask)``. Prompts are
left-padded (the last prompt column is a real token), responses right-padded.

Shape letters (docs/glossary.md): B sequences, P prompts, G group size, I prompt tokens,
R response tokens, T = I + R, L layers, A experts per token.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from rl_batch.models import sharding as sharding_lib

Metrics = dict[str, jax.Array]


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
