"""Qwen3-MoE sparse mixture-of-experts block, its router statistics and auxiliary loss.

The block of Hugging Face's ``Qwen3MoeSparseMoeBlock``, as a pure function
(``sparse_moe``) and a thin NNX module (``MoeMLP``) that ``rl_batch.model`` puts in
place of the dense MLP of every sparse layer (``ModelConfig.is_moe_layer``):

    logits = x @ router                      [T, E]   (compute dtype, then float32)
    probs = softmax(logits)                  [T, E]   float32
    w, idx = top_k(probs, k)                 [T, k]   (w / sum(w) if norm_topk_prob)
    y_t = sum_j w_tj * expert_{idx_tj}(x_t)  [T, D]   expert = SwiGLU of width F

Routing is *dropless*: every token reaches its k experts, whatever the load. The T * k
(token, slot) pairs are sorted by expert and the experts run as grouped matmuls
(``jax.lax.ragged_dot`` over contiguous groups), so the work is T * k expert MLPs, not
the T * E of a dense all-experts einsum.

The router logits of every sparse layer are *sown* (``nnx.Intermediate``) only inside
``nnx.capture``; ``forward_with_router`` collects them for the load-balancing loss and
the expert-load metrics. Plain ``model.forward`` / the KV-cache sampler do not capture,
so for them the block is just another MLP.

Shape letters: T tokens (B * T flattened), D model width, E experts, k experts per
token, F expert width, S = T * k routed slots, L sparse layers.
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
        their weights are still this router's probabilities.

    Returns:
      (weights_tk float32, experts_tk int32), experts in decreasing probability order.
    """
    probs_te = jax.nn.softmax(logits_te.astype(jnp.float32), axis=-1)
    if experts_tk is None:
        weights_tk, experts_tk = jax.lax.top_k(probs_te, top_k)
    else:
        experts_tk = experts_tk.astype(jnp.int32)
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
    gate_sf = jax.lax.ragged_dot(x_sd, gate_edf.astype(dt), group_sizes_e)
    up_sf = jax.lax.ragged_dot(x_sd, up_edf.astype(dt), group_sizes_e)
    out_sd = jax.lax.ragged_dot(jax.nn.silu(gate_sf) * up_sf, down_efd.astype(dt), group_sizes_e)
    # Back to slot order, then the weighted sum over each token's k slots.
    inverse_s = jnp.argsort(order_s)
    out_tkd = jnp.take(out_sd, inverse_s, axis=0).reshape(t, top_k, d)
    y_td = jnp.einsum("tkd,tk->td", out_tkd, weights_tk.astype(dt))
    return y_td, logits_te


class MoeMLP(nnx.Module):
    """The sparse MoE block of one decoder layer (parameters and the call).

    Parameters: ``router_de`` [D, E], ``gate_edf`` / ``up_edf`` [E, D, F], ``down_efd``
    [E, F, D]; the expert dimension has logical axis ``expert`` (expert parallelism).
    """

    def __init__(self, config: Any, *, rngs: nnx.Rngs):
        from rl_batch import model as model_lib  # model imports this module

        d, e, f = config.hidden_size, config.num_experts, config.moe_intermediate_size
        self.dtype = _DTYPES[config.dtype]
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob
        p = model_lib._param
        self.router_de = p(rngs, (d, e), ("embed", "router_experts"), config)
        self.gate_edf = p(rngs, (e, d, f), ("expert", "embed", "expert_mlp"), config)
        self.up_edf = p(rngs, (e, d, f), ("expert", "embed", "expert_mlp"), config)
        self.down_efd = p(rngs, (e, f, d), ("expert", "expert_mlp", "embed"), config)

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        b, t, d = x_btd.shape
        y_td, logits_te = sparse_moe(
            x_btd.reshape(b * t, d),
            self.router_de[...],
            self.gate_edf[...],
            self.up_edf[...],
            self.down_efd[...],
            top_k=self.top_k,
            norm_topk_prob=self.norm_topk_prob,
        )
        if hasattr(self, "__captures__"):  # only inside nnx.capture (forward_with_router)
            self.sow(nnx.Intermediate, "router_logits", logits_te)
        return y_td.reshape(b, t, d)


# ------------------------------------------------------------------ router outputs


def forward_with_router(
    config: Any,
    params: Any,
    tokens_bt: jax.Array,
    *,
    input_mask_bt: jax.Array | None = None,
    positions_bt: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``model.forward`` that also returns every sparse layer's router logits.

    Args:
      config: a ``ModelConfig`` with ``num_experts > 0``.
      params, tokens_bt, input_mask_bt, positions_bt: as for ``model.forward``.

    Returns:
      (model output as ``model.forward``, router logits [L, B * T, E] float32 of the L
      sparse layers in layer order; token b * T + t is row (b, t)).
    """
    from rl_batch import model as model_lib

    if config.num_experts == 0:
        raise ValueError("forward_with_router needs a MoE config (num_experts > 0)")
    if input_mask_bt is None:
        input_mask_bt = jnp.ones(tokens_bt.shape, bool)
    if positions_bt is None:
        positions_bt = model_lib.positions_from_mask(input_mask_bt)
    module = model_lib.bind(config, params)
    (out, _), captured = nnx.capture(module, nnx.Intermediate)(
        tokens_bt, positions_bt, model_lib.causal_mask(input_mask_bt)
    )
    layers = nnx.to_pure_dict(captured)["layers"]
    logits_lte = jnp.stack(
        [
            layers[i]["mlp"]["router_logits"][0]
            for i in range(config.num_layers)
            if config.is_moe_layer(i)
        ]
    )
    return out, logits_lte


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
    averaged over the sparse layers. Metrics without router sums pass through unchanged.
    """
    if "moe_counts_le" not in metrics:
        return metrics
    metrics = dict(metrics)
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
