"""PPO with a separate critic: one pure, jitted ``update_fn(state, batch, rng)``.

The study's PPO: one response per prompt (G = 1, B = P), a value
model as large as the policy, **critic warm-up** (the first ``warmup_updates`` rollout
batches train only the critic; the sample axis starts when the actor starts), then one
actor and one critic optimizer update per rollout batch, no mini-batches, no reuse.

The maths of one update (every piece from ``rl_batch.algorithms.losses``):

1. Per-token rewards: the sequence's verifier score at its last real response token
   (``token_level_rewards``), minus ``kl_coef * KL`` on every real token when a
   reference policy is kept (``kl_coef > 0``; the reference is the initial policy,
   frozen, and the per-token KL is ``kl_estimator`` (default k1, ``logp_old - logp_ref``)
   of the behaviour log-probs).
2. Values: the critic is the same transformer with a scalar head
   (``model_config.replace(head="value")``). **Alignment**: the value of response token
   ``j`` is read from the hidden state at index ``I - 1 + j`` of the ``[prompt |
   response]`` sequence, i.e. the state *before* token ``j`` (prompt and ``y_<j``), the
   same slice ``[I - 1 : I + R - 1]`` that gives the logits predicting token ``j``
   (``forward.response_outputs``). ``V_j = V(s_j)`` is the value of the state in which
   the policy chose ``y_j``; the state after the last real token (after EOS) is
   terminal with value 0.
3. GAE (``gae_advantages``, gamma and lambda default 1.0): with the terminal reward and
   gamma = lambda = 1, ``A_j = score - V_j`` and every return is the score.
4. Advantages are whitened over the batch's real response tokens (``masked_whiten``).
5. Actor: the clipped surrogate ``policy_loss.policy_loss`` with per-token advantages.
   Critic: ``clipped_value_loss`` (``value_clip``; 0/None = off), token mean over the
   batch. With one update per batch both ratios are 1 at the update point, so neither
   clip changes the gradient; they matter only with reuse (not offered here).

An update is applied whole or not at all: if the actor's or the critic's loss or
gradient norm is non-finite, neither network changes (``skipped = 1``). The phase clock
``PPOState.updates`` counts every call, skipped or not, like the run loop's step.

**Critic batch scale** ``k`` (``critic_batch_scale``): the critic averages its gradient
over ``k`` rollout batches before stepping (``optax.MultiSteps``); its learning rate is
resolved for its effective batch ``k * B`` (``rl_batch.runs.config.resolve``).

Batch: a ``PPOBatch`` holding the per-sequence reward ``rewards [B]`` (not advantages:
those need the critic and are computed inside the update). Rows whose response mask is
all False are padding and weigh nothing.

Shape letters (docs/glossary.md): B sequences, I prompt tokens, R response tokens,
M micro-batches.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from rl_batch import artifacts
from rl_batch.algorithms import batch as batch_lib
from rl_batch.algorithms import forward, losses, update_step
from rl_batch.algorithms import optimizer as optimizer_lib
from rl_batch.algorithms import policy_loss as policy_loss_lib
from rl_batch.algorithms import train_state as train_state_lib
from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import groups as rollout_lib

Params = Any
Metrics = dict[str, jax.Array]

WARMUP_PHASE = artifacts.PHASE_CRITIC_WARMUP
TRAIN_PHASE = artifacts.PHASE_TRAIN


# ---------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True, kw_only=True)
class PPOConfig:
    """PPO algorithm hyperparameters (learning rates come from ``rl_batch.algorithms.lr_rules``).

    Attributes:
      gamma: GAE discount.
      lam: GAE lambda.
      whiten_advantages: standardise the advantages over the batch's response tokens.
      value_clip: clip range of the value loss around the rollout-time values (None or
        0 = plain squared error).
      kl_coef: per-token KL-to-reference penalty subtracted from the rewards (needs a
        reference policy: ``PPOState.ref_params``).
      kl_estimator: ``k1``, ``k2`` or ``k3`` for that penalty.
      warmup_updates: the first W updates train only the critic.
      critic_batch_scale: the critic steps once per k rollout batches (gradient mean).
      clip_low, clip_high: policy ratio bounds ``1 - clip_low``, ``1 + clip_high``.
      loss_agg: actor loss aggregation (``losses.LOSS_AGG_MODES``); the critic's value
        loss is always a token mean.
      temperature: sampling temperature (log-probs use ``logits / temperature``).
      micro_batches: gradient-accumulation micro-batches for both networks.
    """

    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True
    value_clip: float | None = 0.2
    kl_coef: float = 0.0
    kl_estimator: str = "k1"
    warmup_updates: int = 0
    critic_batch_scale: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: str = "token_mean"
    temperature: float = 1.0
    micro_batches: int = 1

    def __post_init__(self):
        def bad(name, expected):
            raise ValueError(
                f"PPOConfig.{name}={getattr(self, name)!r} is invalid: expected {expected}"
            )

        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                bad(name, "a float in [0, 1]")
        if self.value_clip is not None and not self.value_clip >= 0.0:
            bad("value_clip", "None or >= 0")
        if not self.kl_coef >= 0.0:
            bad("kl_coef", ">= 0")
        if self.kl_estimator not in losses.KL_ESTIMATORS:
            bad("kl_estimator", f"one of {losses.KL_ESTIMATORS}")
        for name, low in (("warmup_updates", 0), ("critic_batch_scale", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                bad(name, f"an int >= {low}")
        policy_loss_lib.check_policy_loss_fields(self, bad)  # the actor's clip, aggregation, ...

    def replace(self, **changes) -> PPOConfig:
        return dataclasses.replace(self, **changes)


# ----------------------------------------------------------------------- containers


@flax.struct.dataclass
class PPOState:
    """Everything a PPO update changes.

    Attributes:
      actor: the policy's ``TrainState`` (its params are the sampler's).
      critic: the value model's ``TrainState``.
      ref_params: the frozen reference policy (the initial policy), or None when
        ``kl_coef == 0``.
      updates: [] int32, update calls so far (skipped ones included): the phase clock,
        actor training starts at ``updates == warmup_updates``.
    """

    actor: train_state_lib.TrainState
    critic: train_state_lib.TrainState
    ref_params: Params | None
    updates: jax.Array


@flax.struct.dataclass
class PPOBatch:
    """One rollout batch of B responses (row p * G + g).

    Attributes:
      prompt_tokens: [B, I] int32, left-padded.
      prompt_mask: [B, I] bool.
      response_tokens: [B, R] int32, right-padded.
      response_mask: [B, R] bool, True on generated tokens up to and including EOS; an
        all-False row is padding.
      rewards: [B] float32 terminal (verifier) reward of each sequence.
      old_logprobs: [B, R] behaviour log-probs (the sampler's, at the temperature), or
        None to use the current policy's (exact with one update per batch).
    """

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    response_tokens: jax.Array
    response_mask: jax.Array
    rewards: jax.Array
    old_logprobs: jax.Array | None = None

    @property
    def size(self) -> int:
        return self.response_tokens.shape[0]


@flax.struct.dataclass
class ValueBatch:
    """The critic's regression batch: the sequences plus targets (all [B, ...])."""

    prompt_tokens: jax.Array
    prompt_mask: jax.Array
    response_tokens: jax.Array
    response_mask: jax.Array
    returns: jax.Array  # [B, R]
    old_values: jax.Array  # [B, R]


def check_batch(batch: PPOBatch) -> None:
    """Shape check of a ``PPOBatch`` (see ``batch.check_rollout_shapes``)."""
    batch_lib.check_rollout_shapes(batch, ("rewards",), ("old_logprobs",), "PPOBatch")


# ------------------------------------------------------------------------- critic


def critic_model_config(model_config: model_lib.ModelConfig) -> model_lib.ModelConfig:
    """The critic's shape: the policy's transformer with a scalar value head."""
    return model_config.replace(head="value")


def critic_params_from_policy(
    model_config: model_lib.ModelConfig, policy_params: Params, rng: jax.Array
) -> Params:
    """Critic parameters whose body (embedding, blocks, final norm) is a *copy* of the
    policy's, with a new value head (weights normal(0.02), bias 0).

    Args:
      model_config: the policy's shape.
      policy_params: the policy's parameters (not aliased: every leaf is copied).
      rng: PRNG key for the value head.

    Returns:
      A parameter tree for ``critic_model_config(model_config)``.
    """
    critic_config = critic_model_config(model_config)
    abstract = model_lib.abstract_params(critic_config)
    body = {k: v for k, v in policy_params.items() if k in abstract and not k.startswith("value")}
    body = jax.tree.map(lambda x: jnp.array(x, copy=True), body)
    head_d = abstract["value_d"]
    return {
        **body,
        "value_d": (0.02 * jax.random.normal(rng, head_d.shape, jnp.float32)).astype(head_d.dtype),
        "value_bias": jnp.zeros((), abstract["value_bias"].dtype),
    }


def make_critic_optimizer(
    lr: float,
    *,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    batch_scale: int = 1,
) -> optax.GradientTransformation:
    """``optimizer.make_optimizer`` for the critic, stepping once every ``batch_scale``
    calls on the mean of the accumulated gradients (``optax.MultiSteps``)."""
    opt = optimizer_lib.make_optimizer(
        lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm
    )
    if batch_scale == 1:
        return opt
    return optax.MultiSteps(opt, every_k_schedule=batch_scale).gradient_transformation()


current_lr = optimizer_lib.current_lr  # (it looks inside an ``optax.MultiSteps`` state)


# ---------------------------------------------------------------------- train state


def ppo_state_shardings(
    model_config: model_lib.ModelConfig,
    actor_optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation,
    mesh: Mesh,
    with_ref: bool,
) -> PPOState:
    """A ``PPOState`` of ``NamedSharding`` (each network by the rule table)."""
    return PPOState(
        actor=train_state_lib.train_state_shardings(model_config, actor_optimizer, mesh),
        critic=train_state_lib.train_state_shardings(
            critic_model_config(model_config), critic_optimizer, mesh
        ),
        ref_params=sharding_lib.param_shardings(model_config, mesh) if with_ref else None,
        updates=sharding_lib.replicated(mesh),
    )


def init_ppo_state(
    model_config: model_lib.ModelConfig,
    policy_params: Params,
    critic_params: Params,
    actor_optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation,
    *,
    with_ref: bool,
    mesh: Mesh | None = None,
) -> PPOState:
    """Builds the initial state (placed on ``mesh`` when given).

    Args:
      model_config: the policy's shape.
      policy_params: the initial policy (donated with the state: use ``state.actor.params``
        afterwards).
      critic_params: the critic's parameters (``critic_params_from_policy`` or
        ``model.init_params(critic_model_config(...))``).
      actor_optimizer, critic_optimizer: the two optimizers.
      with_ref: keep a frozen copy of the initial policy as the KL reference.
      mesh: optional mesh.

    Returns:
      A ``PPOState`` with ``updates = 0``.
    """
    ref = jax.tree.map(lambda x: jnp.array(x, copy=True), policy_params) if with_ref else None
    actor = train_state_lib.init_train_state(
        model_config, policy_params, actor_optimizer, mesh=mesh
    )
    critic = train_state_lib.init_train_state(
        critic_model_config(model_config), critic_params, critic_optimizer, mesh=mesh
    )
    updates = jnp.zeros((), jnp.int32)
    if mesh is not None:
        if ref is not None:
            ref = jax.device_put(ref, sharding_lib.param_shardings(model_config, mesh))
        updates = jax.device_put(updates, sharding_lib.replicated(mesh))
    return PPOState(actor=actor, critic=critic, ref_params=ref, updates=updates)


# ------------------------------------------------------------------------ the maths


def token_advantages(
    config: PPOConfig,
    scores_b: jax.Array,
    values_br: jax.Array,
    mask_br: jax.Array,
    *,
    old_logp_br: jax.Array | None = None,
    ref_logp_br: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-token rewards -> GAE -> (optionally whitened) advantages.

    Args:
      config: PPO hyperparameters.
      scores_b: [B] terminal rewards.
      values_br: [B, R] critic values, ``values_br[:, j] = V(state before token j)``.
      mask_br: [B, R] real response tokens.
      old_logp_br, ref_logp_br: [B, R] behaviour and reference log-probs (both needed
        for the KL penalty; ignored when ``kl_coef == 0``).

    Returns:
      (advantages_br, returns_br, rewards_br): advantages for the actor (whitened if
      configured), the critic's targets, and the per-token rewards; all 0 on padding.
    """
    kl_br = None
    if config.kl_coef:
        if old_logp_br is None or ref_logp_br is None:
            raise ValueError(f"PPOConfig.kl_coef={config.kl_coef} needs reference log-probs")
        kl_br = losses.kl_estimate(old_logp_br, ref_logp_br, config.kl_estimator)
    rewards_br = losses.token_level_rewards(scores_b, mask_br, kl_br=kl_br, kl_coef=config.kl_coef)
    adv_br, returns_br = losses.gae_advantages(
        rewards_br, values_br, mask_br, gamma=config.gamma, lam=config.lam
    )
    if config.whiten_advantages:
        adv_br = losses.masked_whiten(adv_br, mask_br)
    return adv_br, returns_br, rewards_br


def value_loss(
    critic_config: model_lib.ModelConfig,
    config: PPOConfig,
    params: Params,
    batch: ValueBatch,
    *,
    num_tokens: jax.Array,
) -> tuple[jax.Array, tuple[Metrics, Metrics, jax.Array]]:
    """Clipped value loss of one (micro-)batch, a token mean over the *full* batch.

    Returns:
      (loss, (sums, maxes, own_scale)) in the form ``update_step.accumulate_gradients`` takes.
    """
    mask_br = batch.response_mask.astype(bool)
    values_br = forward.response_outputs(critic_config, params, batch)
    clip = config.value_clip if config.value_clip else None
    loss_br, clipped_br = losses.clipped_value_loss(
        values_br, batch.old_values, batch.returns, clip_range=clip
    )

    def token_mean(x_br):
        return losses.masked_sum(x_br, mask_br) / num_tokens

    loss = token_mean(loss_br)
    sums = {
        "loss": loss,
        "value_clip_frac": token_mean(clipped_br),
        "value_mean": token_mean(jax.lax.stop_gradient(values_br)),
    }
    own_scale = num_tokens / jnp.maximum(jnp.sum(mask_br.astype(jnp.float32)), 1.0)
    return loss, (sums, {}, own_scale)


def explained_variance(values_br: jax.Array, returns_br: jax.Array, mask_br: jax.Array):
    """``1 - Var(returns - values) / Var(returns)`` over real tokens (0 if Var(returns)=0)."""

    def var(x):
        return losses.masked_mean(jnp.square(x - losses.masked_mean(x, mask_br)), mask_br)

    var_ret = var(returns_br)
    return jnp.where(var_ret > 0, 1.0 - var(returns_br - values_br) / var_ret, 0.0)


def _critic_metric_name(key: str) -> str:
    """The critic's loss is ``value_loss``; its noise-scale statistics get a prefix."""
    if key == "loss":
        return "value_loss"
    return f"critic_{key}" if key.startswith(("grad_sq", "gns")) else key


# ------------------------------------------------------------------------ update_fn


def _train_actor(
    model_config: model_lib.ModelConfig,
    config: PPOConfig,
    actor_optimizer: optax.GradientTransformation,
    mesh: Mesh,
    actor: train_state_lib.TrainState,
    batch: batch_lib.Batch,
    critic_ok: jax.Array,
    counts: tuple[jax.Array, jax.Array, int],
    clip: policy_loss_lib.ClipRange,
):
    """The actor's clipped-surrogate gradient and update: ``(new actor, metrics, ok)``.

    ``counts``: (tokens, sequences, R) of the batch; ``critic_ok``: an update is applied
    whole, so a non-finite critic also stops the actor; ``clip``: the update's clip range.
    """
    num_tokens, num_seqs, r = counts
    m = config.micro_batches
    # The clipped surrogate with per-token advantages; its own KL term is off (PPO puts
    # the KL into the rewards), the KL to the reference is still reported.
    loss_fn = functools.partial(
        policy_loss_lib.policy_loss,
        model_config,
        clip_low=clip.low,
        clip_high=clip.high,
        loss_agg=config.loss_agg,
        temperature=config.temperature,
        kl_coef=0.0,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        max_len=r,
        micro_batches=m,  # a MoE actor's load-balancing loss metric, per micro-batch
    )
    grads, loss, metrics = update_step.accumulate_gradients(loss_fn, actor.params, batch, m, mesh)
    grad_norm = optax.tree.norm(grads)
    actor_ok = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    new, update_metrics = update_step.apply_update(
        actor, grads, jnp.where(critic_ok, loss, jnp.nan), actor_optimizer
    )
    metrics = {**metrics, "grad_norm": update_metrics["grad_norm"]}
    metrics["update_norm"] = update_step.delta_norm(new.params, actor.params)
    metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
    return new, metrics, actor_ok


def _rollout_outputs(model_config, critic_config, config: PPOConfig, state, batch, mask_br, mesh):
    """Rollout-time quantities (no gradient): behaviour and reference log-probs and the
    critic's values, each [B, R] (0 off the response mask; reference None without one).
    The log-probs run in the update's micro-batches: [B / M, R, V] logits at a time."""

    def logprobs(params):
        return forward.compute_logprobs_micro(
            model_config,
            params,
            batch,
            config.temperature,
            micro_batches=config.micro_batches,
            mesh=mesh,
        )

    if batch.old_logprobs is None:
        old_logp_br = logprobs(state.actor.params)
    else:
        old_logp_br = jnp.where(mask_br, batch.old_logprobs.astype(jnp.float32), 0.0)
    ref_logp_br = None if state.ref_params is None else logprobs(state.ref_params)
    values_br = forward.response_outputs(critic_config, state.critic.params, batch)
    values_br = jnp.where(mask_br, jax.lax.stop_gradient(values_br), 0.0)
    return old_logp_br, ref_logp_br, values_br


def _target_metrics(batch: PPOBatch, mask_br, real_b, num_seqs, num_tokens, targets) -> Metrics:
    """Scores, returns, advantages (before whitening) and the KL penalty of a batch."""
    raw_adv_br, returns_br, rewards_br = targets
    return dict(
        score_mean=jnp.sum(batch.rewards.astype(jnp.float32) * real_b) / num_seqs,
        return_mean=losses.masked_sum(returns_br, mask_br) / num_tokens,
        advantage_mean=losses.masked_sum(raw_adv_br, mask_br) / num_tokens,
        advantage_std=jnp.sqrt(
            losses.masked_mean(
                jnp.square(raw_adv_br - losses.masked_mean(raw_adv_br, mask_br)), mask_br
            )
        ),
        kl_penalty=-losses.masked_sum(
            rewards_br - losses.token_level_rewards(batch.rewards, mask_br), mask_br
        )
        / num_tokens,
    )


def make_update_fn(
    model_config: model_lib.ModelConfig,
    config: PPOConfig,
    actor_optimizer: optax.GradientTransformation,
    critic_optimizer: optax.GradientTransformation,
    mesh: Mesh,
    *,
    with_ref: bool,
) -> update_step.JittedUpdate:
    """Builds the jitted PPO ``update_fn(state, batch, rng, clip=None) -> (state,
    metrics)`` (``clip``: the actor's clip range, an argument of the compiled program,
    None for ``config``'s; ``update_step.JittedUpdate``).

    The state is donated; the batch is split along dimension 0 over ``('data', 'fsdp')``;
    metrics are replicated float32 scalars. During the warm-up (``state.updates <
    warmup_updates``) the actor is left untouched (``lax.cond``: its forward/backward
    is not run) and its metrics are 0.

    Metrics: ``actor_trained`` (1.0 in the train phase, 0.0 in the warm-up),
    ``updates`` (the phase clock after this call); actor: ``loss``, ``pg_loss``,
    ``clip_frac``, ``kl`` (k3 to the reference when there is one, else to the behaviour
    policy), ``kl_old``, ``entropy``, ``ratio_mean``, ``ratio_max``, ``logprob_mean``,
    ``grad_norm``, ``update_norm``, ``param_norm``, ``lr``, ``clip_low`` and
    ``clip_high`` (the clip range it trains with); critic: ``value_loss``,
    ``value_clip_frac``, ``value_mean`` (at the update), ``critic_grad_norm``,
    ``critic_update_norm``, ``critic_param_norm``, ``critic_lr``,
    ``explained_variance`` (rollout-time values against returns); targets:
    ``score_mean``, ``return_mean``, ``advantage_mean`` and ``advantage_std`` (before
    whitening), ``kl_penalty`` (mean per-token ``kl_coef * KL``); ``skipped``;
    ``response_len_mean``, ``response_tokens``, ``sequences``. With ``micro_batches >
    1`` the gradient-noise statistics of ``accumulate_gradients`` (critic's prefixed
    ``critic_``).

    Args:
      model_config: the policy's shape.
      config: PPO hyperparameters.
      actor_optimizer: ``optimizer.make_optimizer(...)``.
      critic_optimizer: ``make_critic_optimizer(...)``.
      mesh: the device mesh.
      with_ref: whether states carry ``ref_params`` (``kl_coef > 0``).

    Returns:
      The jitted update function.
    """
    if config.kl_coef and not with_ref:
        raise ValueError(f"PPOConfig.kl_coef={config.kl_coef} needs with_ref=True")
    critic_config = critic_model_config(model_config)
    n_shards = sharding_lib.batch_shard_count(mesh)
    m = config.micro_batches
    train_actor = functools.partial(_train_actor, model_config, config, actor_optimizer, mesh)

    def update_fn(state: PPOState, batch: PPOBatch, rng: jax.Array, clip):
        del rng  # One full-batch update: nothing is sampled.
        check_batch(batch)
        b, r = batch.response_tokens.shape
        if b % m or (b // m) % n_shards:
            raise ValueError(
                f"batch of {b} sequences cannot be split into micro_batches={m} of a size "
                f"divisible by the {n_shards} batch shards of the mesh"
            )
        mask_br = batch.response_mask.astype(bool)
        num_tokens = jnp.maximum(jnp.sum(mask_br.astype(jnp.float32)), 1.0)
        real_b = jnp.any(mask_br, axis=1).astype(jnp.float32)
        num_seqs = jnp.maximum(jnp.sum(real_b), 1.0)

        old_logp_br, ref_logp_br, values_br = _rollout_outputs(
            model_config, critic_config, config, state, batch, mask_br, mesh
        )
        raw_adv_br, returns_br, rewards_br = token_advantages(
            config.replace(whiten_advantages=False),
            batch.rewards,
            values_br,
            mask_br,
            old_logp_br=old_logp_br,
            ref_logp_br=ref_logp_br,
        )
        adv_br = raw_adv_br
        if config.whiten_advantages:
            adv_br = losses.masked_whiten(raw_adv_br, mask_br)
        seqs = dict(
            prompt_tokens=batch.prompt_tokens,
            prompt_mask=batch.prompt_mask,
            response_tokens=batch.response_tokens,
            response_mask=batch.response_mask,
        )

        # Critic gradient.
        critic_loss_fn = functools.partial(value_loss, critic_config, config, num_tokens=num_tokens)
        value_batch = ValueBatch(**seqs, returns=returns_br, old_values=values_br)
        c_grads, c_loss, c_metrics = update_step.accumulate_gradients(
            critic_loss_fn, state.critic.params, value_batch, m, mesh
        )
        critic_ok = jnp.isfinite(c_loss) & jnp.isfinite(optax.tree.norm(c_grads))

        # Actor gradient and update, only after the warm-up.
        actor_batch = batch_lib.Batch(
            **seqs, advantages=adv_br, old_logprobs=old_logp_br, ref_logprobs=ref_logp_br
        )
        args = (state.actor, actor_batch, critic_ok, (num_tokens, num_seqs, r), clip)
        _, actor_shapes, _ = jax.eval_shape(train_actor, *args)

        def skip_actor(actor, *_):
            zeros = {k: jnp.zeros(s.shape, s.dtype) for k, s in actor_shapes.items()}
            return actor, zeros, jnp.asarray(True)

        actor_on = state.updates >= config.warmup_updates
        actor, a_metrics, actor_ok = jax.lax.cond(actor_on, train_actor, skip_actor, *args)
        critic, c_update = update_step.apply_update(
            state.critic, c_grads, jnp.where(actor_ok, c_loss, jnp.nan), critic_optimizer
        )
        new_state = PPOState(
            actor=actor, critic=critic, ref_params=state.ref_params, updates=state.updates + 1
        )

        metrics = dict(a_metrics)
        metrics.update({_critic_metric_name(k): v for k, v in c_metrics.items()})
        metrics.update(
            actor_trained=actor_on.astype(jnp.float32),
            updates=new_state.updates.astype(jnp.float32),
            skipped=c_update["skipped"],
            param_norm=optax.tree.norm(actor.params),
            lr=optimizer_lib.current_lr(actor.opt_state),
            clip_low=clip.low,
            clip_high=clip.high,
            critic_grad_norm=c_update["grad_norm"],
            critic_update_norm=update_step.delta_norm(critic.params, state.critic.params),
            critic_param_norm=optax.tree.norm(critic.params),
            critic_lr=current_lr(critic.opt_state),
            explained_variance=explained_variance(values_br, returns_br, mask_br),
            **_target_metrics(
                batch, mask_br, real_b, num_seqs, num_tokens, (raw_adv_br, returns_br, rewards_br)
            ),
            **batch_lib.sequence_metrics(mask_br),
        )
        return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    state_sharding = ppo_state_shardings(
        model_config, actor_optimizer, critic_optimizer, mesh, with_ref
    )
    clip = (config.clip_low, config.clip_high)
    return update_step.jit_update(update_fn, state_sharding, mesh, clip)


# -------------------------------------------------------------- run-loop adapter


class PPO:
    """PPO for the run loop (``learner.Algorithm``, as ``grpo.GRPO``): state, batch, update."""

    filter_groups = False  # A critic learns from every response (validated in resolve).

    def __init__(
        self,
        config: PPOConfig,
        model_config: model_lib.ModelConfig,
        mesh: Mesh,
        *,
        actor_optimizer: optax.GradientTransformation,
        critic_optimizer: optax.GradientTransformation,
        prompt_len: int,
        seed: int,
        critic_from_policy: bool,
    ):
        """Args:
        config: the algorithm's settings (``RunSpec.algorithm``).
        model_config, mesh: the policy's shape and the device mesh.
        actor_optimizer: the policy's optimizer at the run's batch.
        critic_optimizer: the critic's (``make_critic_optimizer`` at k x B).
        prompt_len: every batch's prompts are padded to this many tokens.
        seed: the run's seed (a fresh critic's initialisation).
        critic_from_policy: the critic starts from the policy's body (else fresh).
        """
        self.model_config, self.mesh = model_config, mesh
        self.ppo_config = config
        self.prompt_len, self.seed, self.critic_from_policy = prompt_len, seed, critic_from_policy
        self.with_ref = bool(config.kl_coef)
        self.actor_optimizer = actor_optimizer
        self.critic_optimizer = critic_optimizer
        self.update_fn = make_update_fn(
            model_config,
            self.ppo_config,
            self.actor_optimizer,
            self.critic_optimizer,
            mesh,
            with_ref=self.with_ref,
        )

    def init_state(self, params: Params) -> PPOState:
        """Actor from ``params``; critic from the policy's body or fresh.

        ``ppo.critic_from_policy`` chooses.
        """
        rng = jax.random.fold_in(jax.random.key(self.seed), 7)
        if self.critic_from_policy:
            critic = critic_params_from_policy(self.model_config, params, rng)
        else:
            critic = model_lib.init_params(critic_model_config(self.model_config), rng)
        return init_ppo_state(
            self.model_config,
            params,
            critic,
            self.actor_optimizer,
            self.critic_optimizer,
            with_ref=self.with_ref,
            mesh=self.mesh,
        )

    @staticmethod
    def policy_params(state: PPOState) -> Params:
        return state.actor.params

    @staticmethod
    def extra_update_flops(costs: dict[str, float]) -> float:
        """FLOPs ``make_batch`` adds to an update besides forward + backward: none."""
        del costs
        return 0.0

    @staticmethod
    def trains_policy(metrics: dict) -> bool:
        """False for critic warm-up updates (their responses are not on the sample axis)."""
        return bool(float(np.asarray(metrics.get("actor_trained", 1.0))) > 0)

    def make_batch(self, ro, keep_p: np.ndarray) -> PPOBatch:
        """The rollout as a sharded ``PPOBatch`` (rewards per sequence; dropped groups,
        if any, get an all-False response mask; prompts padded to the run's longest,
        ``rollout.pad_prompts``, so the update compiles once)."""
        ro = rollout_lib.pad_prompts(ro, self.prompt_len)
        g = ro.rewards_pg.shape[1]
        keep_b = np.repeat(np.asarray(keep_p, bool), g)
        rewards_b = np.asarray(ro.rewards_pg, np.float32).reshape(-1) * keep_b
        batch = PPOBatch(**batch_lib.rollout_fields(ro, keep_p), rewards=jnp.asarray(rewards_b))
        return sharding_lib.shard_batch(batch, self.mesh)
