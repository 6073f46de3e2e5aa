"""Qwen3-MoE sparse mixture-of-experts block, its router statistics and auxiliary loss.

The block of Hugging Face's ``Qwen3MoeSparseMoeBlock``, as a pure function
(``sparse_moe``) and a thin NNX module (``MoeMLP``) that ``rl_batch.models.transformer`` puts in
place of the dense MLP of every sparse layer (``ModelConfig.is_moe_layer``):

    logits = x @ router                      [T, E]   (compute dtype, then float32)
    probs = softmax(logits)                  [T, E]   float32
    w, idx = top_k(probs, k)                 [T, k]   (w / sum(w) if norm_topk_prob)
    y_t = sum_j w_tj * expert_{idx_tj}(x_t)  [T, D]   expert = SwiGLU of width F

Routing is *dropless*: every token reaches its k experts, whatever the load. The T * k
(token, slot) pairs are sorted by expert and the experts run as grouped matmuls over the
contiguous groups, so the work is about T * k expert MLPs, not the T * E of a dense
all-experts einsum. Two implementations (``sparse_moe(impl=...)``):

- ``"ragged_dot"`` (default on GPU / TPU): ``jax.lax.ragged_dot``, the backends'
  grouped-matmul kernels. On the CPU backend (jax 0.10.2) it is lowered to one masked
  dense matmul over all E groups ([S, E * D] @ [E * D, F], see the compiled HLO).
- ``"tiled"`` (default on CPU): the groups cut into tiles of m rows, one batched einsum
  over at most ceil(S / m) + E tiles with each tile's expert weights (``_tiled_experts``).

Measured on the 2-core CPU, fwd + bwd of the block (T=2048, D=128, E=8, F=256, k=2,
best of 7 interleaved, as multiples of a dense SwiGLU of width k * F): ragged_dot 18.6x,
tiled 3.0x, all-experts einsum 20.8x (a loaded machine; an earlier run gave 12.4x /
13.8x for ragged_dot / all-experts). FLOP metrics (``rl_batch.models.flops``) count the active
work either way.

The router logits of every sparse layer are *sown* (``nnx.Intermediate``) only inside
``nnx.capture``; ``forward_with_router`` collects them for the load-balancing loss and
the expert-load metrics. Plain ``model.forward`` / the KV-cache sampler do not capture,
so for them the block is just another MLP.

Shape letters (docs/glossary.md): T tokens (B * T flattened), D model width, E experts,
F expert width, L sparse layers. Two local names predate the glossary: ``k`` is its A,
the experts per token (``experts_tk``, ``weights_tk``), and ``s`` is T * A routed
(token, expert) rows (``x_sd``), not cache slots.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def check_moe_config(config: Any) -> None:
    """Validates the MoE fields of a ``ModelConfig`` (called by its ``__post_init__``).

    Raises:
      ValueError: one message naming the bad field, e.g. top-k larger than the number of
        experts, a non-positive expert width, or an ``mlp_only_layers`` index outside
        the model.
    """
    e, k = config.num_experts, config.num_experts_per_tok
    for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"ModelConfig.{name} must be an int >= 0, got {value!r}")
    if e == 0:
        return
    if not 1 <= k <= e:
        raise ValueError(
            f"ModelConfig.num_experts_per_tok={k} must be in [1, num_experts={e}]: "
            "top-k routing cannot pick more experts than there are"
        )
    if config.moe_intermediate_size < 1:
        raise ValueError(
            f"ModelConfig.moe_intermediate_size={config.moe_intermediate_size} must be "
            f"positive when num_experts={e}"
        )
    step = config.decoder_sparse_step
    if not isinstance(step, int) or step < 1:
        raise ValueError(f"ModelConfig.decoder_sparse_step must be an int >= 1, got {step!r}")
    bad = [i for i in config.mlp_only_layers if not 0 <= i < config.num_layers]
    if bad:
        raise ValueError(
            f"ModelConfig.mlp_only_layers={config.mlp_only_layers} holds {bad}, outside "
            f"layers [0, {config.num_layers})"
        )


def route(
    logits_te: jax.Array,
    top_k: int,
    norm_topk_prob: bool,
    experts_tk: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Top-k routing of router logits (HF ``Qwen3MoeTopKRouter``).

    Args:
      logits_te: [T, E] float32 router logits.
      top_k: k.
      norm_topk_prob: divide the k weights by their sum.
      experts_tk: [T, k] int expert ids to use instead of the top-k (routing replay);
        their weights are still this router's probabilities. A row holding a negative id
        (no recorded choice) keeps the router's own top-k.

    Returns:
      (weights_tk float32, experts_tk int32), experts in decreasing probability order
      (in the replayed order when replaying).
    """
    probs_te = jax.nn.softmax(logits_te.astype(jnp.float32), axis=-1)
    weights_tk, own_tk = jax.lax.top_k(probs_te, top_k)
    if experts_tk is None:
        experts_tk = own_tk
    else:
        replay_t = jnp.all(experts_tk >= 0, axis=-1)
        experts_tk = jnp.where(replay_t[:, None], experts_tk.astype(jnp.int32), own_tk)
        weights_tk = jnp.take_along_axis(probs_te, experts_tk, axis=-1)
    if norm_topk_prob:
        weights_tk = weights_tk / jnp.sum(weights_tk, axis=-1, keepdims=True)
    return weights_tk, experts_tk.astype(jnp.int32)


def sparse_moe(
    x_td: jax.Array,
    router_de: jax.Array,
    gate_edf: jax.Array,
    up_edf: jax.Array,
    down_efd: jax.Array,
    *,
    top_k: int,
    norm_topk_prob: bool,
    experts_tk: jax.Array | None = None,
    impl: str | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The sparse MoE block on a flat batch of tokens (dropless, grouped matmuls).

    Args:
      x_td: [T, D] inputs in the compute dtype (weights are cast to it).
      router_de: [D, E] router weights.
      gate_edf, up_edf: [E, D, F] expert SwiGLU input projections.
      down_efd: [E, F, D] expert output projections.
      top_k: experts per token k.
      norm_topk_prob: renormalise the k routing weights.
      experts_tk: optional [T, k] expert choices to replay (see ``route``).
      impl: grouped-matmul implementation, ``"ragged_dot"`` or ``"tiled"``; None picks
        ``default_grouped_impl()`` (tiled on a CPU, ragged_dot elsewhere).

    Returns:
      (y_td [T, D] in the compute dtype, router logits [T, E] float32).
    """
    dt = x_td.dtype
    t, d = x_td.shape
    e = gate_edf.shape[0]
    # As HF: the router matmul runs in the compute dtype, the softmax in float32.
    logits_te = (x_td @ router_de.astype(dt)).astype(jnp.float32)
    weights_tk, experts_tk = route(logits_te, top_k, norm_topk_prob, experts_tk)

    # Slot j of the flat [S = T * k] list is token j // k's (j % k)-th expert. A stable
    # sort by expert makes each expert's slots contiguous (group e has group_sizes[e]).
    experts_s = experts_tk.reshape(-1)
    order_s = jnp.argsort(experts_s, stable=True)  # sorted position -> slot
    x_sd = jnp.take(x_td, order_s // top_k, axis=0)
    group_sizes_e = jnp.bincount(experts_s, length=e).astype(jnp.int32)
    weights = (gate_edf.astype(dt), up_edf.astype(dt), down_efd.astype(dt))
    if (impl or default_grouped_impl()) == "tiled":
        out_sd = _tiled_experts(x_sd, *weights, group_sizes_e)
    else:
        gate_sf = jax.lax.ragged_dot(x_sd, weights[0], group_sizes_e)
        up_sf = jax.lax.ragged_dot(x_sd, weights[1], group_sizes_e)
        out_sd = jax.lax.ragged_dot(jax.nn.silu(gate_sf) * up_sf, weights[2], group_sizes_e)
    # Back to slot order, then the weighted sum over each token's k slots.
    inverse_s = jnp.argsort(order_s)
    out_tkd = jnp.take(out_sd, inverse_s, axis=0).reshape(t, top_k, d)
    y_td = jnp.einsum("tkd,tk->td", out_tkd, weights_tk.astype(dt))
    return y_td, logits_te


GROUPED_IMPLS = ("ragged_dot", "tiled")


def default_grouped_impl() -> str:
    """``"tiled"`` on the CPU backend (whose ``ragged_dot`` computes every group densely,
    see the module docstring), ``"ragged_dot"`` on GPU / TPU (grouped-matmul kernels)."""
    return "tiled" if jax.default_backend() == "cpu" else "ragged_dot"


def _tiled_experts(x_sd, gate_edf, up_edf, down_efd, group_sizes_e):
    """The experts' SwiGLU on expert-sorted rows as a block-sparse batched matmul.

    Each expert's contiguous group of rows is cut into tiles of m rows (its last tile
    partly empty); tile n belongs to one expert and multiplies that expert's weights.
    At most ceil(S / m) + E tiles exist whatever the routing, so the shapes are static
    and nothing is dropped; the work is (S + E * m) rows, not the S * E of a masked
    dense matmul. (The MegaBlocks idea with a plain batched einsum.)

    Args:
      x_sd: [S, D] rows sorted by expert.
      gate_edf, up_edf: [E, D, F]; down_efd: [E, F, D].
      group_sizes_e: [E] rows per expert (sum S).

    Returns:
      [S, D] expert outputs, row for row.
    """
    s, _ = x_sd.shape
    e = gate_edf.shape[0]
    # Tile height: about one tile per expert on average, 8..128 rows.
    m = int(min(128, max(8, 1 << max(0, (s // e - 1)).bit_length())))
    n_tiles = -(-s // m) + e
    tiles_e = (group_sizes_e + m - 1) // m
    tile_end_e = jnp.cumsum(tiles_e)
    row_start_e = jnp.cumsum(group_sizes_e) - group_sizes_e
    tile_n = jnp.arange(n_tiles, dtype=jnp.int32)
    # The expert whose tiles cover tile n: how many experts' tiles end at or before n
    # (searchsorted, written as a count: jnp.searchsorted fails inside shard_map).
    ends_before_n = jnp.sum(tile_end_e[None, :] <= tile_n[:, None], axis=1, dtype=jnp.int32)
    expert_n = jnp.minimum(ends_before_n, e - 1)
    local_n = tile_n - (tile_end_e - tiles_e)[expert_n]  # tile index within its expert
    offset_nm = local_n[:, None] * m + jnp.arange(m, dtype=jnp.int32)[None, :]
    valid_nm = (offset_nm < group_sizes_e[expert_n][:, None]) & (tile_n < tile_end_e[-1])[:, None]
    row_nm = jnp.where(valid_nm, row_start_e[expert_n][:, None] + offset_nm, s)  # s = none
    x_nmd = jnp.take(x_sd, row_nm, axis=0, mode="fill", fill_value=0)
    gate_nmf = jnp.einsum("nmd,ndf->nmf", x_nmd, gate_edf[expert_n])
    up_nmf = jnp.einsum("nmd,ndf->nmf", x_nmd, up_edf[expert_n])
    out_nmd = jnp.einsum("nmf,nfd->nmd", jax.nn.silu(gate_nmf) * up_nmf, down_efd[expert_n])
    out_sd = jnp.zeros((s + 1, out_nmd.shape[-1]), out_nmd.dtype)
    return out_sd.at[row_nm.reshape(-1)].add(out_nmd.reshape(-1, out_nmd.shape[-1]))[:s]


class RoutingReplay(nnx.Variable):
    """Expert choices [T, k] a ``MoeMLP`` uses instead of its router's top-k (set by
    ``forward_with_router(..., replay_experts_btlk=...)`` on a transient module)."""


class MoeMLP(nnx.Module):
    """The sparse MoE block of one decoder layer (parameters and the call).

    Parameters: ``router_de`` [D, E], ``gate_edf`` / ``up_edf`` [E, D, F], ``down_efd``
    [E, F, D]; the expert dimension has logical axis ``expert`` (expert parallelism).
    """

    def __init__(self, config: Any, *, rngs: nnx.Rngs, param: Any):
        """``param(rngs, shape, logical_axes, config)`` makes one ``nnx.Param`` (the
        model's own parameter constructor, so that the two modules share one init)."""
        d, e, f = config.hidden_size, config.num_experts, config.moe_intermediate_size
        self.dtype = _DTYPES[config.dtype]
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        p = param
        self.router_de = p(rngs, (d, e), ("embed", "router_experts"), config)
        self.gate_edf = p(rngs, (e, d, f), ("expert", "embed", "expert_mlp"), config)
        self.up_edf = p(rngs, (e, d, f), ("expert", "embed", "expert_mlp"), config)
        self.down_efd = p(rngs, (e, f, d), ("expert", "expert_mlp", "embed"), config)

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        b, t, d = x_btd.shape
        replay = getattr(self, "replay", None)
        y_td, logits_te = sparse_moe(
            x_btd.reshape(b * t, d),
            self.router_de[...],
            self.gate_edf[...],
            self.up_edf[...],
            self.down_efd[...],
            top_k=self.top_k,
            norm_topk_prob=self.norm_topk_prob,
            experts_tk=None if replay is None else replay[...],
        )
        if hasattr(self, "__captures__"):  # only inside nnx.capture (forward_with_router)
            self.sow(nnx.Intermediate, "router_logits", logits_te)
        return y_td.reshape(b, t, d)


def top_experts(logits_lte: jax.Array, top_k: int, batch: int) -> jax.Array:
    """The router's choices as [B, T, L, k] int32 (from logits [L, B * T, E])."""
    _, experts_ltk = jax.lax.top_k(logits_lte, top_k)
    n_layers, bt, k = experts_ltk.shape
    return jnp.transpose(experts_ltk.reshape(n_layers, batch, bt // batch, k), (1, 2, 0, 3))


def routing_disagreement_sums(
    logits_lte: jax.Array, recorded_btlk: jax.Array, mask_bt: jax.Array, top_k: int
) -> dict[str, jax.Array]:
    """How often the router's top-k *set* differs from recorded choices (e.g. the
    sampler's), as additive sums over real tokens with a record and sparse layers.

    Returns:
      ``moe_route_diff`` (differing (token, layer) pairs) and ``moe_route_count``
      (compared pairs); ``finalize_router_metrics`` gives their ratio.
    """
    b = recorded_btlk.shape[0]
    own_btlk = jnp.sort(top_experts(jax.lax.stop_gradient(logits_lte), top_k, b), axis=-1)
    rec_btlk = jnp.sort(recorded_btlk.astype(jnp.int32), axis=-1)
    valid_btl = jnp.all(rec_btlk >= 0, axis=-1) & mask_bt.astype(bool)[:, :, None]
    diff_btl = jnp.any(own_btlk != rec_btlk, axis=-1) & valid_btl
    return {
        "moe_route_diff": jnp.sum(diff_btl.astype(jnp.float32)),
        "moe_route_count": jnp.sum(valid_btl.astype(jnp.float32)),
    }


def load_balancing_loss(logits_lte: jax.Array, mask_t: jax.Array, top_k: int) -> jax.Array:
    """Switch-Transformer load-balancing loss, exactly HF's ``load_balancing_loss_func``.

    Over the real tokens of all L layers together (N = L * real tokens):
    ``E * sum_e f_e * P_e`` with ``f_e`` = (token, slot) assignments to expert e / N and
    ``P_e`` = summed router probability of e / N. ``sum_e f_e = k``; with uniform routing
    the loss is k; it grows as load concentrates on experts the router also favours.

    Args:
      logits_lte: [L, T, E] router logits.
      mask_t: [T] True for real tokens (padding is left out).
      top_k: k.

    Returns:
      The scalar loss (float32).
    """
    e = logits_lte.shape[-1]
    counts_le, probs_le, rows = _assignments(logits_lte, mask_t, top_k)
    f_e = jnp.sum(counts_le, axis=0) / rows
    p_e = jnp.sum(probs_le, axis=0) / rows
    return e * jnp.sum(f_e * p_e)


def _assignments(logits_lte, mask_t, top_k):
    """(counts [L, E], summed probs [L, E], L * real tokens) over real tokens."""
    probs_lte = jax.nn.softmax(logits_lte.astype(jnp.float32), axis=-1)
    _, experts_ltk = jax.lax.top_k(probs_lte, top_k)
    m_t = mask_t.astype(jnp.float32)
    onehot_ltke = jax.nn.one_hot(experts_ltk, logits_lte.shape[-1], dtype=jnp.float32)
    counts_le = jnp.einsum("ltke,t->le", onehot_ltke, m_t)
    probs_le = jnp.einsum("lte,t->le", probs_lte, m_t)
    rows = logits_lte.shape[0] * jnp.maximum(jnp.sum(m_t), 1.0)
    return counts_le, probs_le, rows


def router_sums(logits_lte: jax.Array, mask_t: jax.Array, top_k: int) -> dict[str, jax.Array]:
    """Additive router statistics of one (micro-)batch (no gradient).

    Returns:
      ``moe_counts_le`` [L, E] assignments of real tokens per layer and expert,
      ``moe_tokens`` real tokens, ``moe_entropy_sum`` router entropy (nats) summed over
      layers and real tokens. Sums over micro-batches give the full batch's; turn them
      into metrics with ``finalize_router_metrics``.
    """
    logits_lte = jax.lax.stop_gradient(logits_lte.astype(jnp.float32))
    counts_le, _, _ = _assignments(logits_lte, mask_t, top_k)
    probs_lte = jax.nn.softmax(logits_lte, axis=-1)
    entropy_lt = -jnp.sum(jax.scipy.special.xlogy(probs_lte, probs_lte), axis=-1)
    m_t = mask_t.astype(bool)
    return {
        "moe_counts_le": counts_le,
        "moe_tokens": jnp.sum(m_t.astype(jnp.float32)),
        "moe_entropy_sum": jnp.sum(jnp.where(m_t, entropy_lt, 0.0)),
    }


def finalize_router_metrics(metrics: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Replaces the ``router_sums`` entries of ``metrics`` by scalar expert-load metrics.

    ``moe_load_max`` / ``moe_load_min``: the most / least loaded expert's share of its
    layer's routed slots over the mean share 1 / E (max / mean load; 1.0 = balanced),
    extremes over layers; ``moe_router_entropy``: mean router entropy per token and layer
    (nats; log E = uniform); ``moe_frac_e{i}``: expert i's share of routed slots,
    averaged over the sparse layers; with ``routing_disagreement_sums`` also
    ``moe_routing_disagreement``, the fraction of (token, layer) pairs whose top-k set
    differs from the recorded one. Metrics without router sums pass through unchanged.
    """
    if "moe_counts_le" not in metrics:
        return metrics
    metrics = dict(metrics)
    if "moe_route_count" in metrics:
        diff, count = metrics.pop("moe_route_diff"), metrics.pop("moe_route_count")
        metrics["moe_routing_disagreement"] = diff / jnp.maximum(count, 1.0)
    counts_le = metrics.pop("moe_counts_le")
    tokens = jnp.maximum(metrics.pop("moe_tokens"), 1.0)
    entropy_sum = metrics.pop("moe_entropy_sum")
    n_layers, e = counts_le.shape
    frac_le = counts_le / jnp.maximum(jnp.sum(counts_le, axis=1, keepdims=True), 1.0)
    metrics["moe_load_max"] = e * jnp.max(frac_le)
    metrics["moe_load_min"] = e * jnp.min(frac_le)
    metrics["moe_router_entropy"] = entropy_sum / (n_layers * tokens)
    frac_e = jnp.mean(frac_le, axis=0)
    for i in range(e):
        metrics[f"moe_frac_e{i}"] = frac_e[i]
    return metrics
