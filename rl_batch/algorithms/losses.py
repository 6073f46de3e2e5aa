"""The RL maths as small pure functions of arrays (GRPO family and PPO).

Every function here is shape-polymorphic, jittable and free of model or optimizer
state; the learners (``rl_batch.algorithms.learner``) combine them. Conventions:

- ``*_br`` arrays are per response token, ``[B, R]``, with a ``mask_br`` that is True
  (or 1.0) on real response tokens; padded positions never contribute.
- ``*_pg`` arrays are per prompt ``p`` and group member ``g``: ``[P, G]``.
- Log-probabilities are natural logs; "ref" is the frozen reference policy, "old" the
  behaviour policy that produced the tokens.

Shape letters (docs/glossary.md): B sequences, R response tokens, V vocabulary, P prompts,
G group size.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Clamp on log-ratios before ``exp`` so a wild token cannot overflow to inf; the
# value is far outside anything a healthy update produces (exp(20) ~ 5e8).
_LOG_RATIO_CLAMP = 20.0

ADVANTAGE_MODES = ("grpo", "drgrpo", "rloo")
LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
KL_ESTIMATORS = ("k1", "k2", "k3")
# Token-level clipped ratio (PPO / GRPO / DAPO) or GSPO's sequence-level one.
POLICY_LOSSES = ("token", "gspo")


# --------------------------------------------------------------------------- masking


def masked_sum(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Sum of ``x`` where ``mask`` is true."""
    return jnp.sum(jnp.where(mask.astype(bool), x, 0.0), axis=axis)


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Mean of ``x`` over positions where ``mask`` is true (0 when nothing is real)."""
    count = jnp.sum(mask.astype(jnp.float32), axis=axis)
    return masked_sum(x, mask, axis) / jnp.maximum(count, 1.0)


def masked_whiten(
    x: jax.Array, mask: jax.Array, *, shift_mean: bool = True, eps: float = 1e-8
) -> jax.Array:
    """Standardises ``x`` over the masked positions: ``(x - mean) / sqrt(var + eps)``.

    The variance is the biased (population) masked variance. Padded positions are
    returned as 0.

    Args:
      x: values, any shape.
      mask: same shape, true on real positions.
      shift_mean: if False the mean is added back (scale only), as some PPO
        implementations do for returns.
      eps: added to the variance.

    Returns:
      Whitened values, same shape as ``x``.
    """
    mean = masked_mean(x, mask)
    var = masked_mean(jnp.square(x - mean), mask)
    out = (x - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return jnp.where(mask.astype(bool), out, 0.0)


# ----------------------------------------------------------------- group advantages


def _check_group(rewards_pg: jax.Array, min_group: int, mode: str) -> None:
    if rewards_pg.ndim != 2:
        raise ValueError(f"rewards must be [P, G], got shape {rewards_pg.shape}")
    if rewards_pg.shape[1] < min_group:
        raise ValueError(
            f"advantage mode {mode!r} needs a group size G >= {min_group}, "
            f"got rewards of shape {rewards_pg.shape}"
        )


def grpo_advantages(rewards_pg: jax.Array, *, eps: float = 1e-6, std_ddof: int = 1) -> jax.Array:
    """GRPO: ``(r - mean_g r) / (std_g r + eps)`` within each group.

    The standard deviation is the *unbiased* one by default (``std_ddof=1``, divide by
    G - 1), as in the GRPO reference implementations (TRL, verl: ``torch.std``). A group
    whose rewards are all equal gets advantages exactly 0.

    Args:
      rewards_pg: [P, G] scalar rewards.
      eps: added to the standard deviation.
      std_ddof: 1 for the unbiased std, 0 for the population std.

    Returns:
      [P, G] advantages.
    """
    _check_group(rewards_pg, 1 + std_ddof, "grpo")
    r = rewards_pg.astype(jnp.float32)
    mean_p1 = jnp.mean(r, axis=1, keepdims=True)
    std_p1 = jnp.std(r, axis=1, keepdims=True, ddof=std_ddof)
    # An all-equal group has no signal, but its fp32 mean need not equal its members
    # (0.2 * 16 / 16 != 0.2): dividing that residue by std + eps ~ eps would blow it up
    # (-0.03 for sixteen 0.2s, -0.96 for 32 rewards of 100.1). Such groups get exactly 0.
    equal_p1 = jnp.all(r == r[:, :1], axis=1, keepdims=True)
    return jnp.where(equal_p1, 0.0, (r - mean_p1) / (std_p1 + eps))


def drgrpo_advantages(rewards_pg: jax.Array) -> jax.Array:
    """Dr.GRPO: ``r - mean_g r`` (no division by the group std)."""
    _check_group(rewards_pg, 1, "drgrpo")
    r = rewards_pg.astype(jnp.float32)
    return r - jnp.mean(r, axis=1, keepdims=True)


def rloo_advantages(rewards_pg: jax.Array) -> jax.Array:
    """RLOO: ``r_i - mean_{j != i} r_j`` (leave-one-out baseline, G >= 2).

    Equals ``G / (G - 1) * (r_i - mean_g r)``.
    """
    _check_group(rewards_pg, 2, "rloo")
    r = rewards_pg.astype(jnp.float32)
    g = r.shape[1]
    loo_mean_pg = (jnp.sum(r, axis=1, keepdims=True) - r) / (g - 1)
    return r - loo_mean_pg


def group_advantages(
    rewards_pg: jax.Array, mode: str = "grpo", *, eps: float = 1e-6, std_ddof: int = 1
) -> jax.Array:
    """Group-relative advantages by name: ``grpo``, ``drgrpo`` or ``rloo``.

    Args:
      rewards_pg: [P, G] scalar rewards, one row per prompt.
      mode: one of ``ADVANTAGE_MODES``.
      eps: ``grpo`` only, added to the std.
      std_ddof: ``grpo`` only, 1 = unbiased std.

    Returns:
      [P, G] advantages.
    """
    if mode == "grpo":
        return grpo_advantages(rewards_pg, eps=eps, std_ddof=std_ddof)
    if mode == "drgrpo":
        return drgrpo_advantages(rewards_pg)
    if mode == "rloo":
        return rloo_advantages(rewards_pg)
    raise ValueError(f"unknown advantage mode {mode!r}; expected one of {ADVANTAGE_MODES}")


# ------------------------------------------------------------------- policy losses


def clipped_policy_loss(
    logp_br: jax.Array,
    old_logp_br: jax.Array,
    advantages_br: jax.Array,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """PPO/GRPO clipped surrogate with asymmetric clipping (DAPO "clip-higher").

    ``ratio = exp(logp - old_logp)``, ``loss = max(-A * ratio, -A * clip(ratio,
    1 - clip_low, 1 + clip_high))``. With ``dual_clip = c > 1`` (off by default) the loss
    of negative-advantage tokens is further capped at ``-A * c`` (Ye et al. 2020), which
    bounds the push on tokens whose ratio has exploded.

    Args:
      logp_br: [B, R] log-probs under the current policy (differentiated).
      old_logp_br: [B, R] log-probs under the behaviour policy.
      advantages_br: advantages broadcastable to [B, R] (e.g. [B, 1] for GRPO).
      clip_low: ratio lower bound is ``1 - clip_low``.
      clip_high: ratio upper bound is ``1 + clip_high``.
      dual_clip: optional constant c > 1 for the dual clip.

    Returns:
      (loss_br, clipped_br): per-token loss (to be aggregated with a mask) and a float
      indicator, 1.0 where the loss is not the unclipped surrogate -A * ratio, i.e.
      where clipping removed the token's gradient.
    """
    log_ratio_br = jnp.clip(logp_br - old_logp_br, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio_br = jnp.exp(log_ratio_br)
    adv_br = jnp.broadcast_to(advantages_br, ratio_br.shape).astype(ratio_br.dtype)
    unclipped_br = -adv_br * ratio_br
    clipped_ratio_br = jnp.clip(ratio_br, 1.0 - clip_low, 1.0 + clip_high)
    loss_br = jnp.maximum(unclipped_br, -adv_br * clipped_ratio_br)
    clipped_br = loss_br > unclipped_br
    if dual_clip is not None:
        capped_br = jnp.minimum(loss_br, -adv_br * dual_clip)
        dual_br = (adv_br < 0) & (capped_br < loss_br)
        loss_br = jnp.where(adv_br < 0, capped_br, loss_br)
        clipped_br = clipped_br | dual_br
    return loss_br, clipped_br.astype(jnp.float32)


def gspo_policy_loss(
    logp_br: jax.Array,
    old_logp_br: jax.Array,
    advantages_b: jax.Array,
    mask_br: jax.Array,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """GSPO's sequence-level clipped surrogate (Zheng et al. 2025, Qwen).

    One importance ratio per sequence, the length-normalised (geometric-mean) likelihood
    ratio ``s_b = exp(mean_t (logp - old_logp))`` over its real tokens, clipped as a
    whole: ``loss_b = max(-A_b * s_b, -A_b * clip(s_b, 1 - clip_low, 1 + clip_high))``.
    A token whose probability moved a lot no longer gets its own ratio (which in MoE RL
    swings when its experts change between rollout and update); the sequence does. The
    paper's clip ranges are 3e-4 / 4e-4 (the defaults here), far narrower than
    token-level ones, since s_b averages the per-token log-ratios.

    Args:
      logp_br: [B, R] current log-probs (differentiated).
      old_logp_br: [B, R] behaviour log-probs.
      advantages_b: [B] sequence advantages.
      mask_br: [B, R] real response tokens.
      clip_low, clip_high: ratio bounds ``1 - clip_low``, ``1 + clip_high``.

    Returns:
      (loss_b, clipped_b, log_ratio_b): per-sequence loss (average it over sequences),
      1.0 where clipping removed the sequence's gradient, and the length-normalised
      log-ratio. All-padding rows have ratio 1.
    """
    m_br = mask_br.astype(bool)
    len_b = jnp.maximum(jnp.sum(m_br.astype(jnp.float32), axis=1), 1.0)
    log_ratio_b = jnp.sum(jnp.where(m_br, logp_br - old_logp_br, 0.0), axis=1) / len_b
    ratio_b = jnp.exp(jnp.clip(log_ratio_b, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    adv_b = advantages_b.astype(ratio_b.dtype)
    unclipped_b = -adv_b * ratio_b
    loss_b = jnp.maximum(unclipped_b, -adv_b * jnp.clip(ratio_b, 1.0 - clip_low, 1.0 + clip_high))
    return loss_b, (loss_b > unclipped_b).astype(jnp.float32), log_ratio_b


# ---------------------------------------------------------------------------- KL


def kl_k1(logp_br: jax.Array, ref_logp_br: jax.Array) -> jax.Array:
    """k1 estimator of KL(pi || ref) per token: ``logp - ref_logp`` (unbiased, can be <0)."""
    return logp_br - ref_logp_br


def kl_k2(logp_br: jax.Array, ref_logp_br: jax.Array) -> jax.Array:
    """k2 estimator per token: ``0.5 * (logp - ref_logp)**2``."""
    return 0.5 * jnp.square(logp_br - ref_logp_br)


def kl_k3(logp_br: jax.Array, ref_logp_br: jax.Array) -> jax.Array:
    """k3 estimator of KL(pi || ref) per token (Schulman): ``exp(d) - d - 1``, d = ref - logp.

    Unbiased for samples from pi, always >= 0, low variance. ``d`` is clamped to
    [-20, 20] before ``exp`` so that one runaway token cannot make the loss inf.
    """
    d_br = jnp.clip(ref_logp_br - logp_br, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return jnp.exp(d_br) - d_br - 1.0


def kl_estimate(logp_br: jax.Array, ref_logp_br: jax.Array, estimator: str = "k3") -> jax.Array:
    """Per-token KL estimate by name (``k1``, ``k2`` or ``k3``)."""
    fns = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}
    if estimator not in fns:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
    return fns[estimator](logp_br, ref_logp_br)


# --------------------------------------------------------------------- aggregation


def aggregation_weights(
    mask_br: jax.Array,
    mode: str,
    *,
    num_tokens: jax.Array | float | None = None,
    num_seqs: int | None = None,
    max_len: int | None = None,
) -> jax.Array:
    """Per-token weights w such that the aggregated loss is ``sum(w * loss_br)``.

    Modes:
      - ``token_mean``: every real token in the batch weighs the same,
        ``w = mask / num_tokens`` (DAPO).
      - ``seq_mean_token_mean``: mean over each sequence's tokens, then mean over
        sequences, ``w = mask / (len_b * num_seqs)`` (original GRPO).
      - ``seq_mean_token_sum_norm``: per-sequence token *sum* divided by a fixed
        length, then mean over sequences, ``w = mask / (max_len * num_seqs)`` (Dr.GRPO).

    The normalisers default to this batch's own (``num_tokens = sum(mask)``, ``num_seqs
    = B``, ``max_len = R``). Gradient accumulation passes the *full* batch's values so
    that the micro-batch losses add up exactly to the full-batch loss.

    Args:
      mask_br: [B, R] real-token mask.
      mode: one of ``LOSS_AGG_MODES``.
      num_tokens: total real tokens of the full batch (token_mean).
      num_seqs: number of sequences of the full batch (seq_mean_* modes).
      max_len: fixed length normaliser (seq_mean_token_sum_norm).

    Returns:
      [B, R] float32 weights, 0 on padding.
    """
    m_br = mask_br.astype(jnp.float32)
    if num_seqs is None:
        num_seqs = m_br.shape[0]
    if mode == "token_mean":
        if num_tokens is None:
            num_tokens = jnp.sum(m_br)
        return m_br / jnp.maximum(num_tokens, 1.0)
    if mode == "seq_mean_token_mean":
        len_b1 = jnp.sum(m_br, axis=1, keepdims=True)
        return m_br / (jnp.maximum(len_b1, 1.0) * num_seqs)
    if mode == "seq_mean_token_sum_norm":
        if max_len is None:
            max_len = m_br.shape[1]
        return m_br / (float(max_len) * num_seqs)
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {LOSS_AGG_MODES}")


def aggregate(
    values_br: jax.Array,
    mask_br: jax.Array,
    mode: str = "token_mean",
    *,
    num_tokens: jax.Array | float | None = None,
    num_seqs: int | None = None,
    max_len: int | None = None,
) -> jax.Array:
    """Masked aggregation of a per-token loss to a scalar (see ``aggregation_weights``)."""
    w_br = aggregation_weights(
        mask_br, mode, num_tokens=num_tokens, num_seqs=num_seqs, max_len=max_len
    )
    return jnp.sum(jnp.where(w_br > 0, values_br * w_br, 0.0))


# ------------------------------------------------------------------------ entropy


def token_entropy(logits_brv: jax.Array) -> jax.Array:
    """Entropy of softmax(logits) per position, [B, R], in float32 (nats)."""
    logp_brv = jax.nn.log_softmax(logits_brv.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp_brv) * logp_brv, axis=-1)


def entropy_from_logits(logits_brv: jax.Array, mask_br: jax.Array) -> jax.Array:
    """Masked mean token entropy (a metric; apply any temperature to the logits first)."""
    return masked_mean(token_entropy(logits_brv), mask_br)


# ---------------------------------------------------------------------------- PPO


def last_token_index(mask_br: jax.Array) -> jax.Array:
    """[B] index of the last real token of each row (0 for a row without real tokens)."""
    t = mask_br.shape[1]
    idx_br = jnp.where(mask_br.astype(bool), jnp.arange(t)[None, :], -1)
    return jnp.maximum(jnp.max(idx_br, axis=1), 0)


def token_level_rewards(
    scores_b: jax.Array,
    mask_br: jax.Array,
    *,
    kl_br: jax.Array | None = None,
    kl_coef: float = 0.0,
) -> jax.Array:
    """Per-token rewards for PPO: the sequence score at the last real token, minus an
    optional per-token KL penalty ``kl_coef * kl_br`` on every real token.

    Args:
      scores_b: [B] terminal (verifier) rewards.
      mask_br: [B, R] real response tokens.
      kl_br: optional [B, R] per-token KL to the reference (e.g. ``kl_k1``).
      kl_coef: penalty coefficient.

    Returns:
      [B, R] float32 rewards, 0 on padding (a row without real tokens gets nothing).
    """
    m_br = mask_br.astype(bool)
    t = m_br.shape[1]
    last_b = last_token_index(m_br)
    at_last_br = (jnp.arange(t)[None, :] == last_b[:, None]) & m_br
    rewards_br = jnp.where(at_last_br, scores_b.astype(jnp.float32)[:, None], 0.0)
    if kl_br is not None and kl_coef:
        rewards_br = rewards_br - kl_coef * jnp.where(m_br, kl_br, 0.0)
    return rewards_br


def gae_advantages(
    rewards_br: jax.Array,
    values_br: jax.Array,
    mask_br: jax.Array,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over response tokens (Schulman et al. 2016).

    Runs backwards in time with ``lax.scan``:
    ``delta_t = r_t + gamma * V_next - V_t``, ``A_t = delta_t + gamma * lam * A_next``,
    where "next" is the next *real* token: masked positions are skipped (the carry
    passes through them unchanged), so padding after the last token contributes
    nothing and the value after the last real token is 0 (episode end).

    Args:
      rewards_br: [B, R] per-token rewards (``token_level_rewards``).
      values_br: [B, R] critic values V(s_t).
      mask_br: [B, R] real response tokens.
      gamma: discount.
      lam: GAE lambda.

    Returns:
      (advantages_br, returns_br), both [B, R] float32 and 0 on padding;
      ``returns = advantages + values`` (the critic's regression target). Whiten the
      advantages separately (``masked_whiten``) if wanted.
    """
    m_rb = mask_br.astype(bool).T
    r_rb = rewards_br.astype(jnp.float32).T
    v_rb = values_br.astype(jnp.float32).T

    def step(carry, x):
        next_value_b, next_adv_b = carry
        r_b, v_b, m_b = x
        delta_b = r_b + gamma * next_value_b - v_b
        adv_b = delta_b + gamma * lam * next_adv_b
        carry = (jnp.where(m_b, v_b, next_value_b), jnp.where(m_b, adv_b, next_adv_b))
        return carry, jnp.where(m_b, adv_b, 0.0)

    zeros_b = jnp.zeros(r_rb.shape[1], jnp.float32)
    _, adv_rb = jax.lax.scan(step, (zeros_b, zeros_b), (r_rb, v_rb, m_rb), reverse=True)
    advantages_br = adv_rb.T
    returns_br = jnp.where(mask_br.astype(bool), advantages_br + values_br, 0.0)
    return advantages_br, returns_br


def clipped_value_loss(
    values_br: jax.Array,
    old_values_br: jax.Array,
    returns_br: jax.Array,
    *,
    clip_range: float | None = 0.2,
) -> tuple[jax.Array, jax.Array]:
    """PPO value loss ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``.

    Args:
      values_br: [B, R] current critic values (differentiated).
      old_values_br: [B, R] critic values when the rollout was scored.
      returns_br: [B, R] regression targets (``gae_advantages`` returns).
      clip_range: c; None disables clipping (plain 0.5 * squared error).

    Returns:
      (loss_br, clipped_br): per-token loss and a float indicator, 1.0 where the
      clipped branch is strictly larger (the token's value gradient is removed).
    """
    unclipped_br = jnp.square(values_br - returns_br)
    if clip_range is None:
        return 0.5 * unclipped_br, jnp.zeros_like(unclipped_br)
    v_clipped_br = jnp.clip(values_br, old_values_br - clip_range, old_values_br + clip_range)
    clipped_sq_br = jnp.square(v_clipped_br - returns_br)
    loss_br = 0.5 * jnp.maximum(unclipped_br, clipped_sq_br)
    return loss_br, (clipped_sq_br > unclipped_br).astype(jnp.float32)
