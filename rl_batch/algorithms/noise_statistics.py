"""The gradient-noise statistics an update logs: micro-batch layout and the sums.

With ``micro_batches`` M > 1, ``update_step.accumulate_gradients`` computes each
micro-batch's gradient anyway; these functions turn them into the statistics that
``rl_batch.gradient_noise`` (the McCandlish et al. 2018 estimator) and
``rl_batch.analysis.noise_scale`` (pooled over updates and runs; the run's adaptive
batch schedule reads the same) invert into ``|G|^2``, ``tr(Sigma)`` and the noise scale.
This module only measures; the estimator lives there. docs/noise_scale.md derives both.

Counted in real sequences: rows whose ``response_mask`` is all False (padding of
filtered groups) are not examples, and micro-batches holding none are left out.

- ``grad_sq_micro``: mean over the non-empty micro-batches of the squared norm of
  each one's own gradient ``|g_m|^2`` (the gradient of its own normalised loss:
  ``own_m`` times its share of the full-batch gradient, ``policy_loss.own_gradient_scale``);
- ``grad_sq_full``: the full batch's ``|g_B|^2``;
- ``gns_batch_micro``: the harmonic mean of the non-empty micro-batches' sequence
  counts ``b_m`` (B / M without padding), the size b for which
  ``E[grad_sq_micro] = |G|^2 + tr(Sigma) / b``; 0 when every row is padding;
- ``gns_batch_full``: real sequences in the batch.

The layout decides which noise scale these measure (``update_step.accumulate_gradients``):
with the whole-group layout (``grpo.micro_layout = "groups"``, ``whole_group_order``)
each measurement unit holds whole groups, so B_simple is the batch noise scale B_noise =
(G tr(Sigma_inter) + tr(Sigma_intra)) / |G|^2; with the strided one every group is cut
alike and B_simple sees the intra-prompt noise only (docs/noise_scale.md).

With the group split (``grpo.group_noise``: P prompts x G responses, rows reordered by
``group_pair_order`` so that micro-batches 2k and 2k + 1 hold the two halves of the same
whole groups) also (see ``rl_batch.analysis.noise_scale.group_noise_terms``):

- ``grad_dot_pair``: mean over the pairs whose micro-batches hold real sequences
  of ``<g_2k, g_2k+1>``, the inner product of the two halves' own gradients,
  ``E = |G|^2 + tr(Sigma_inter) / n_k`` with ``n_k`` the real prompts of pair k. By
  default (``pair_dot="direct"``) the first half's own gradient is kept through the
  scan (one parameter-sized float32 buffer; +0.6 % CPU per update on the CPU study's
  model, ``experiments/time_pair_dot.py``). ``"running"`` reads it off the running sum
  instead (no buffer): with ``d_m = <g_m, sum_{m' < m} grad_m'>`` (``grad_m'`` the
  full-batch-normalised gradient, ``g_m = own_m grad_m``), ``own_2k (d_2k+1 - d_2k) =
  <g_2k+1, g_2k> + own_2k <g_2k+1 - g_2k, sum_{m' < 2k} grad_m'>``, the last term of mean
  0 but 2.3x the per-update spread (tests/test_noise_layout.py);
- ``gns_prompts_pair``: the harmonic mean of those pairs' real prompts ``n_k``;
- ``gns_prompts_full``: real prompts in the batch (groups with a real sequence).

Shape letters (docs/glossary.md): B sequences, P prompts, G group size, R response
tokens, M micro-batches.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Metrics = dict[str, jax.Array]


def check_group_pairs(prompts: int, group_size: int, micro_batches: int) -> None:
    """Raises ValueError unless a batch of ``prompts`` x ``group_size`` rows splits into
    ``micro_batches`` half-group pairs (``group_pair_order``): M >= 4 and even (two pairs
    at least: one pair cannot tell the prompt means' spread from the mean gradient), G
    even, and P divisible by M / 2."""
    if micro_batches < 4 or micro_batches % 2:
        raise ValueError(
            f"the group noise split needs an even micro_batches >= 4, got {micro_batches}"
        )
    if group_size < 2 or group_size % 2:
        raise ValueError(f"the group noise split needs an even group_size, got {group_size}")
    if prompts % (micro_batches // 2):
        raise ValueError(
            f"the group noise split needs prompts ({prompts}) divisible by micro_batches / 2 "
            f"({micro_batches // 2})"
        )


def group_pair_order(prompts: int, group_size: int, micro_batches: int) -> np.ndarray:
    """[B] row order that makes ``split_batch``'s micro-batches half-group pairs.

    Rows are prompt-major (row ``p * G + g``). With K = M / 2 pairs, pair k holds the
    groups p = k, k + K, k + 2K, ... (P / K of them, whole); its micro-batch 2k holds
    their members g < G / 2 and micro-batch 2k + 1 their members g >= G / 2. So the two
    micro-batches of a pair share all their prompts and two micro-batches of different
    pairs share none (the layout ``rl_batch.analysis.noise_scale.group_noise_terms``
    assumes). ``batch[order]`` then ``split_batch(., M)`` gives that layout: micro-batch
    m, row i is reordered row ``i * M + m``.

    Raises:
      ValueError: from ``check_group_pairs``.
    """
    check_group_pairs(prompts, group_size, micro_batches)
    k_pairs, half = micro_batches // 2, group_size // 2
    rows = prompts * group_size // micro_batches  # per micro-batch
    i = np.arange(rows)[:, None]  # [rows, 1] row within a micro-batch
    m = np.arange(micro_batches)[None, :]  # [1, M]
    prompt = m // 2 + k_pairs * (i // half)  # [rows, M]
    member = (m % 2) * half + i % half  # [rows, M]
    return (prompt * group_size + member).reshape(-1)  # index i * M + m


def check_whole_groups(prompts: int, micro_batches: int) -> None:
    """Raises ValueError unless ``micro_batches`` M > 1 cut a batch of ``prompts`` P
    groups into measurement units of whole groups (``whole_group_order``): M divides P
    (P / M groups per micro-batch) or P >= 2 divides M (one group per M / P consecutive
    micro-batches)."""
    if micro_batches < 2 or prompts % micro_batches == 0:
        return
    if prompts >= 2 and micro_batches % prompts == 0:
        return
    raise ValueError(
        f"the whole-group micro-batch layout needs micro_batches ({micro_batches}) to divide "
        f"prompts ({prompts}), or prompts >= 2 to divide micro_batches; or set "
        "grpo.micro_layout='strided' (which measures the intra-prompt term only)"
    )


def whole_group_units(prompts: int, micro_batches: int) -> int:
    """r, the micro-batches per measurement unit of the whole-group layout: 1 when M
    divides P (each micro-batch is a unit of P / M groups), else M / P (a unit is the r
    consecutive micro-batches that hold one group)."""
    check_whole_groups(prompts, micro_batches)
    return 1 if prompts % micro_batches == 0 else micro_batches // prompts


def whole_group_order(prompts: int, group_size: int, micro_batches: int) -> np.ndarray:
    """[B] row order that makes ``split_batch``'s micro-batches contiguous blocks of the
    prompt-major rows (row ``p * G + g``): micro-batch m holds rows m B / M ... (m + 1) B
    / M - 1, so whole groups (M divides P) or one group's consecutive parts (P divides
    M). Micro-batch m, row i is reordered row ``i * M + m`` = original row ``m B / M + i``.

    Raises:
      ValueError: from ``check_whole_groups``.
    """
    check_whole_groups(prompts, micro_batches)
    rows = prompts * group_size // micro_batches  # per micro-batch
    i = np.arange(rows)[:, None]  # [rows, 1]
    m = np.arange(micro_batches)[None, :]  # [1, M]
    return (m * rows + i).reshape(-1)  # index i * M + m


def real_sequences(response_mask_mbr: jax.Array) -> jax.Array:
    """[M] float32 real sequences per micro-batch: rows with at least one response token
    (``response_mask_mbr`` [M, B / M, R], ``batch.split_batch``'s layout)."""
    seqs_m = jnp.sum(jnp.any(response_mask_mbr.astype(bool), axis=2), axis=1)
    return seqs_m.astype(jnp.float32)


def micro_batch_statistics(seqs_m: jax.Array, own_sq_m: jax.Array, grads: Any) -> Metrics:
    """``grad_sq_micro``, ``grad_sq_full``, ``gns_batch_micro``, ``gns_batch_full``
    (module docstring) from the [M] real sequences ``seqs_m``, the [M] ``|g_m|^2``
    ``own_sq_m`` and the full batch's gradient ``grads`` (with whole-group units of r
    micro-batches: their [M / r] sums and squared norms)."""
    # E|g_m|^2 = |G|^2 + tr(Sigma) / b_m, so the mean over non-empty micro-batches goes
    # with b = 1 / mean(1 / b_m), the harmonic mean (an empty one has no gradient).
    nonempty_m = seqs_m > 0
    n_nonempty = jnp.sum(nonempty_m.astype(jnp.float32))
    inv_seqs = jnp.sum(jnp.where(nonempty_m, 1.0 / jnp.maximum(seqs_m, 1.0), 0.0))
    grad_sq_micro = jnp.sum(jnp.where(nonempty_m, own_sq_m, 0.0)) / jnp.maximum(n_nonempty, 1.0)
    seqs_micro = jnp.where(n_nonempty > 0, n_nonempty / jnp.maximum(inv_seqs, 1e-30), 0.0)
    return {
        "grad_sq_micro": grad_sq_micro,
        "grad_sq_full": tree_sq_norm(grads),
        "gns_batch_micro": seqs_micro,
        "gns_batch_full": jnp.sum(seqs_m),
    }


def running_pair_cross(dot_m: jax.Array, own_m: jax.Array) -> jax.Array:
    """[M / 2] running-sum estimates of ``<g_2k, g_2k+1>`` (module docstring) from the
    [M] ``d_m = own_m <grad_m, sum_{m' < m} grad_m'>`` and the [M] ``own_m``."""
    return own_m[0::2] * (dot_m[1::2] - dot_m[0::2])


def pair_statistics(seqs_m: jax.Array, cross_k: jax.Array, group_size: int) -> Metrics:
    """``grad_dot_pair``, ``gns_prompts_pair``, ``gns_prompts_full`` (module docstring)
    from the half-group micro-batches' [M] real sequences ``seqs_m`` and the [M / 2]
    estimates ``cross_k`` of ``<g_2k, g_2k+1>`` (the direct inner products, or
    `running_pair_cross`)."""
    # A dropped group empties its rows in both halves; count a pair's real prompts by
    # its real sequences (a whole group is G of them).
    prompts_k = (seqs_m[0::2] + seqs_m[1::2]) / group_size  # [M / 2]
    real_k = (seqs_m[0::2] > 0) & (seqs_m[1::2] > 0)
    n_real = jnp.sum(real_k.astype(jnp.float32))
    inv_prompts = jnp.sum(jnp.where(real_k, 1.0 / jnp.maximum(prompts_k, 1e-30), 0.0))
    return {
        "grad_dot_pair": jnp.sum(jnp.where(real_k, cross_k, 0.0)) / jnp.maximum(n_real, 1.0),
        "gns_prompts_pair": jnp.where(n_real > 0, n_real / jnp.maximum(inv_prompts, 1e-30), 0.0),
        "gns_prompts_full": jnp.sum(seqs_m) / group_size,
    }


def tree_sq_norm(tree: Any) -> jax.Array:
    """Squared global norm of ``tree`` in float32."""
    return sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree))


def tree_dot(a: Any, b: Any) -> jax.Array:
    """Inner product of two trees of one structure, in float32."""
    return sum(
        jnp.sum(x.astype(jnp.float32) * y.astype(jnp.float32))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )
