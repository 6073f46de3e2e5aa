"""GRPO: config, loss assembly, batch assembly and the run-loop adapter.

Protocol (the study's default): **one optimizer update per rollout batch**, no
mini-batches, no reuse. ``num_minibatches`` / ``num_epochs`` exist as options (off by
default) and then loop inside XLA with ``lax.scan``. ``micro_batches`` accumulates the
gradient of one update over micro-batches (``lax.scan``) with the *full* batch's loss
normalisers, so the accumulated gradient equals the single-batch gradient.

The maths of one update:

1. Advantages per group of G responses to one prompt (``losses.group_advantages``:
   ``grpo``, ``drgrpo`` or ``rloo``), one per sequence, in prompt-major row order
   (row p * G + g); groups dropped by the filter get advantage 0 and an all-False
   response mask (``batch.rollout_fields``), so every batch keeps one shape.
2. Loss: ``grpo_loss`` below, which is ``rl_batch.algorithms.policy_loss.policy_loss``
   (the clipped surrogate, its aggregation, KL and MoE terms, all in that one module)
   with those per-sequence advantages, plus ``kl_coef`` x k3-KL to a frozen reference
   (the initial policy) when ``kl_coef > 0``; the reference log-probs are computed before
   the update (``GRPO.make_batch``).

The update skeleton is shared with ``rl_batch.algorithms.ppo``: shape checks, masks and
splitting (``batch``), gradient accumulation, the non-finite guard and jit with shardings
and donation (``update_step``), the train state (``train_state``) and the optimizer
(``optimizer``); both implement ``learner.Algorithm`` for ``rl_batch.runs.run``.

Shape letters (docs/glossary.md): B sequences, P prompts, G group size, I prompt tokens,
R response tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from rl_batch.algorithms import batch as batch_lib
from rl_batch.algorithms import forward, losses, update_step
from rl_batch.algorithms import noise_statistics as noise_lib
from rl_batch.algorithms import optimizer as optimizer_lib
from rl_batch.algorithms import policy_loss as policy_loss_lib
from rl_batch.algorithms import train_state as train_state_lib
from rl_batch.models import flops
from rl_batch.models import sharding as sharding_lib
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import groups as rollout_lib

# ``GRPOConfig.micro_layout``'s choices (``group_noise`` selects the third, "pairs").
MICRO_LAYOUTS = ("groups", "strided")

Params = Any
Metrics = dict[str, jax.Array]
TrainState = train_state_lib.TrainState
Batch = batch_lib.Batch


# ---------------------------------------------------------------------------- config


@dataclasses.dataclass(frozen=True, kw_only=True)
class GRPOConfig:
    """GRPO hyperparameters: the run config's ``grpo`` section plus the sampling
    temperature (the optimizer's come from the run config, the LR from
    ``rl_batch.algorithms.lr_rules``).

    Attributes:
      clip_low: policy ratio lower bound is ``1 - clip_low``.
      clip_high: policy ratio upper bound is ``1 + clip_high`` (DAPO clip-higher).
      kl_coef: weight of the k3 KL-to-reference loss term (needs ``Batch.ref_logprobs``).
      loss_agg: one of ``losses.LOSS_AGG_MODES``.
      advantage: one of ``losses.ADVANTAGE_MODES``.
      micro_batches: gradient-accumulation micro-batches per optimizer update.
      num_minibatches: optimizer updates per epoch over the rollout batch.
      num_epochs: passes over the rollout batch.
      temperature: sampling temperature; log-probs use ``logits / temperature``.
      policy_loss: ``"token"``: the token-level clipped surrogate
        (``losses.clipped_policy_loss``); ``"gspo"``: GSPO's sequence-level ratio and
        clipping (``losses.gspo_policy_loss``, with ``clip_low`` / ``clip_high`` as its
        bounds: GSPO's paper uses 3e-4 / 4e-4). GSPO averages over sequences, so it needs
        ``loss_agg="seq_mean_token_mean"``.
      routing_replay: route a MoE policy's update forward by the sampler's recorded
        expert choices (``Batch.routed_experts``, required) instead of its router's
        top-k: the tokens meet the experts that generated them, so numerics that flip
        a near-tie between rollout and update cannot inflate the importance ratio; the
        routing weights still come from the current router (and get its gradient).
      router_aux_loss_coef: weight of a MoE policy's load-balancing loss
        (``moe.load_balancing_loss``, HF's) in the loss; 0 = off (Hugging Face's
        Qwen3-MoE configs carry 0.001 for pre-training). With micro-batches each one's
        loss counts 1 / micro_batches.
      group_noise: order each update's micro-batches as half-group pairs
        (``noise_statistics.group_pair_order``) and log the inter-/intra-prompt split of the
        gradient noise (``grad_dot_pair``, ``gns_prompts_pair``, ``gns_prompts_full``;
        ``rl_batch.analysis.noise_scale.group_noise_terms``). Needs ``micro_batches``
        even and >= 4, an even ``group_size``, prompts divisible by micro_batches / 2
        and one update per batch (minibatches reshuffle the rows).
      micro_layout: which rows each of the ``micro_batches`` holds, and so which noise
        scale the update's statistics measure (``update_step.accumulate_gradients``):
        ``"groups"`` (whole groups per measurement unit: B_simple is the batch noise
        scale B_noise = (G tr(Sigma_inter) + tr(Sigma_intra)) / |G|^2; needs
        micro_batches dividing prompts or prompts dividing micro_batches) or
        ``"strided"`` (rows m, m + M, ...: every group cut alike, B_simple sees the
        intra-prompt noise only; what a config.json written before the field had).
        ``group_noise`` overrides it with the half-group pairs. The gradient is the same.
      group_size: G, responses per prompt (from the run config's top-level
        ``group_size``, not its ``grpo`` section); ``group_noise`` and ``micro_layout``
        read it.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0
    loss_agg: str = "token_mean"
    advantage: str = "grpo"
    micro_batches: int = 1
    num_minibatches: int = 1
    num_epochs: int = 1
    temperature: float = 1.0
    policy_loss: str = "token"
    routing_replay: bool = False
    router_aux_loss_coef: float = 0.0
    group_noise: bool = False
    micro_layout: str = "groups"
    group_size: int = 0

    def __post_init__(self):
        def bad(name, expected):
            raise ValueError(
                f"GRPOConfig.{name}={getattr(self, name)!r} is invalid: expected {expected}"
            )

        policy_loss_lib.check_policy_loss_fields(self, bad)
        if not self.kl_coef >= 0.0:
            bad("kl_coef", ">= 0")
        if self.advantage not in losses.ADVANTAGE_MODES:
            bad("advantage", f"one of {losses.ADVANTAGE_MODES}")
        if not self.router_aux_loss_coef >= 0.0:
            bad("router_aux_loss_coef", ">= 0")
        if self.policy_loss not in losses.POLICY_LOSSES:
            bad("policy_loss", f"one of {losses.POLICY_LOSSES}")
        if self.policy_loss == "gspo" and self.loss_agg != "seq_mean_token_mean":
            bad("loss_agg", "'seq_mean_token_mean' with policy_loss='gspo' (a sequence mean)")
        for name in ("num_minibatches", "num_epochs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                bad(name, "a positive int")
        if self.micro_layout not in MICRO_LAYOUTS:
            bad("micro_layout", f"one of {MICRO_LAYOUTS}")
        if self.group_noise:
            if self.updates_per_batch != 1:
                bad("group_noise", "False with num_minibatches or num_epochs > 1")
            try:  # (the prompts' part is checked where P is known: resolve, the update)
                noise_lib.check_group_pairs(
                    self.micro_batches // 2, self.group_size, self.micro_batches
                )
            except ValueError as e:
                bad("group_noise", f"False: {e}")

    @classmethod
    def config_fields(cls) -> tuple[str, ...]:
        """The fields read from the run config's ``grpo`` section (all but temperature
        and group_size)."""
        others = ("temperature", "group_size")
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in others)

    @property
    def layout(self) -> str:
        """The update's micro-batch layout (``update_step.LAYOUTS``): ``"pairs"`` with
        ``group_noise``, else ``micro_layout`` (``"strided"`` when ``group_size`` is 0,
        unknown: a config built without the run's groups)."""
        if self.group_noise:
            return "pairs"
        return self.micro_layout if self.group_size else "strided"

    @property
    def updates_per_batch(self) -> int:
        """Optimizer updates made from one rollout batch."""
        return self.num_minibatches * self.num_epochs

    def replace(self, **changes) -> GRPOConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------ the loss


def grpo_loss(
    model_config: model_lib.ModelConfig,
    config: GRPOConfig,
    params: Params,
    batch: Batch,
    *,
    num_tokens: jax.Array,
    num_seqs: jax.Array | int,
    max_len: int,
    clip: policy_loss_lib.ClipRange | None = None,
) -> tuple[jax.Array, tuple[Metrics, Metrics, jax.Array]]:
    """GRPO loss of one (micro-)batch, normalised by the *full* batch's totals
    (``policy_loss.policy_loss`` with GRPO's clip, aggregation, KL weight, surrogate and,
    for a MoE policy, load-balancing weight and routing replay). ``clip``: the update's
    clip range (traced), None for the config's ``clip_low`` / ``clip_high``."""
    if clip is None:
        clip = policy_loss_lib.ClipRange(config.clip_low, config.clip_high)
    return policy_loss_lib.policy_loss(
        model_config,
        params,
        batch,
        clip_low=clip.low,
        clip_high=clip.high,
        loss_agg=config.loss_agg,
        temperature=config.temperature,
        kl_coef=config.kl_coef,
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        max_len=max_len,
        surrogate=config.policy_loss,
        router_aux_loss_coef=config.router_aux_loss_coef,
        routing_replay=config.routing_replay,
        micro_batches=config.micro_batches,
    )


# ------------------------------------------------------------------------ update_fn

# How per-update metrics combine when one rollout batch makes several updates.
_COMBINE_MAX = ("ratio_max",)
_COMBINE_SUM = ("skipped",)


def _combine(key: str) -> Callable[[jax.Array], jax.Array]:
    return jnp.max if key in _COMBINE_MAX else jnp.sum if key in _COMBINE_SUM else jnp.mean


def make_update_fn(
    model_config: model_lib.ModelConfig,
    config: GRPOConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    state_sharding: TrainState | None = None,
    *,
    shuffle_minibatches: bool = True,
) -> update_step.JittedUpdate:
    """Builds the jitted GRPO ``update_fn(state, batch, rng, clip=None) -> (state,
    metrics)``.

    The state is donated (do not reuse the state passed in); the batch is split along
    dimension 0 over the mesh's batch axes; metrics are replicated float32 scalars. One
    compilation per batch shape (and per set of present optional batch fields). ``rng``
    is only used to shuffle minibatches. ``clip`` (``policy_loss.ClipRange``) is the
    update's clip range, an argument of the compiled program (None: ``config``'s), so a
    batch schedule's range at each batch reuses it (``update_step.JittedUpdate``).

    Metrics: ``loss``, ``pg_loss``, ``kl`` (k3 to the reference when
    ``ref_logprobs`` is given, else k3 between behaviour and current policy),
    ``kl_old``, ``kl_loss`` (with a reference), ``clip_frac`` (fraction of response
    tokens clipped), ``entropy`` (token mean, at the temperature), ``ratio_mean``,
    ``ratio_max``, ``logprob_mean``, ``grad_norm`` (before clipping), ``update_norm``,
    ``param_norm``, ``lr``, ``clip_low`` and ``clip_high`` (the clip range it trained
    with), ``skipped`` (updates skipped as non-finite),
    ``num_updates``, ``response_len_mean``, ``response_tokens``, ``sequences``; with
    ``micro_batches > 1`` also ``grad_sq_micro``, ``grad_sq_full``, ``gns_batch_micro``,
    ``gns_batch_full`` (and with ``group_noise`` ``grad_dot_pair``, ``gns_prompts_pair``,
    ``gns_prompts_full``); for a MoE policy also ``moe_aux_loss`` (added to ``loss`` times
    ``router_aux_loss_coef``) and the expert-load metrics of
    ``moe.finalize_router_metrics`` (``moe_routing_disagreement`` when the batch carries
    ``routed_experts``). With several updates per batch, metrics are means over updates
    (``ratio_max``: max, ``skipped``: sum).

    Args:
      model_config: the policy's shape.
      config: GRPO hyperparameters.
      optimizer: from ``optimizer.make_optimizer`` (the one used for the train state).
      mesh: the device mesh.
      state_sharding: a ``TrainState`` of shardings (default
        ``train_state.train_state_shardings``).
      shuffle_minibatches: reshuffle the batch each epoch (only with minibatches or
        epochs; off to reproduce sequential updates in tests).

    Returns:
      The jitted update function.
    """
    if state_sharding is None:
        state_sharding = train_state_lib.train_state_shardings(model_config, optimizer, mesh)
    n_shards = sharding_lib.batch_shard_count(mesh)

    def one_update(
        state: TrainState, batch: Batch, clip: policy_loss_lib.ClipRange
    ) -> tuple[TrainState, Metrics]:
        r = batch.response_tokens.shape[1]
        num_tokens, num_seqs = batch_lib.loss_normalisers(batch.response_mask)
        loss_fn = functools.partial(
            grpo_loss,
            model_config,
            config,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            max_len=r,
            clip=clip,
        )
        grads, loss, metrics = update_step.accumulate_gradients(
            loss_fn,
            state.params,
            batch,
            config.micro_batches,
            mesh,
            group_size=config.group_size,
            layout=config.layout,
        )
        state, update_metrics = update_step.apply_update(state, grads, loss, optimizer)
        return state, {**metrics, **update_metrics}

    def several_updates(state: TrainState, batch: Batch, rng: jax.Array, clip):
        b = batch.size
        if batch.old_logprobs is None:
            # Later updates need the behaviour policy, i.e. the params before any.
            batch = batch.replace(
                old_logprobs=jax.lax.stop_gradient(
                    forward.compute_logprobs(
                        model_config,
                        state.params,
                        batch,
                        config.temperature,
                        replay=config.routing_replay,
                    )
                )
            )

        def epoch(state, rng_e):
            if shuffle_minibatches:
                perm = jax.random.permutation(rng_e, b)
                shuffled = jax.tree.map(lambda x: x[perm], batch)
            else:
                shuffled = batch
            minibatches = batch_lib.split_batch(shuffled, config.num_minibatches, mesh)
            return jax.lax.scan(functools.partial(one_update, clip=clip), state, minibatches)

        state, metrics = jax.lax.scan(epoch, state, jax.random.split(rng, config.num_epochs))
        return state, {k: _combine(k)(v) for k, v in metrics.items()}

    def update_fn(state: TrainState, batch: Batch, rng: jax.Array, clip):
        batch_lib.check_batch(batch)
        batch_lib.check_split(batch.size, config.num_minibatches, config.micro_batches, n_shards)
        old_params = state.params
        if config.updates_per_batch == 1:
            state, metrics = one_update(state, batch, clip)
        else:
            state, metrics = several_updates(state, batch, rng, clip)
        metrics.update(
            update_norm=update_step.delta_norm(state.params, old_params),
            param_norm=optax.tree.norm(state.params),
            lr=optimizer_lib.current_lr(state.opt_state),
            clip_low=clip.low,
            clip_high=clip.high,
            num_updates=jnp.asarray(config.updates_per_batch, jnp.float32),
            **batch_lib.sequence_metrics(batch.response_mask),
        )
        return state, {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

    clip = (config.clip_low, config.clip_high)
    return update_step.jit_update(update_fn, state_sharding, mesh, clip)


# ------------------------------------------------------------------ batch assembly


def rollout_batch(
    ro: rollout_lib.Rollout, advantages_b: np.ndarray, keep_p: np.ndarray, mesh
) -> Batch:
    """The learner's batch from a rollout (row p * G + g), sharded over the mesh.

    Responses of dropped groups (``keep_p`` False) get an all-False response mask, so
    they weigh nothing in the loss while every batch keeps one shape (no recompiles).
    """
    s = ro.samples
    batch = Batch(
        **batch_lib.rollout_fields(ro, keep_p),
        advantages=jnp.asarray(advantages_b, jnp.float32),
        # [B, I + R, L, A] the sampler's MoE expert choices, when it recorded them.
        routed_experts=None if s.routed_experts is None else jnp.asarray(s.routed_experts),
    )
    return sharding_lib.shard_batch(batch, mesh)


def batch_advantages(rewards_pg: np.ndarray, keep_p: np.ndarray, mode: str) -> np.ndarray:
    """[P * G] group-relative advantages, prompt-major (row p * G + g); 0 for dropped
    groups."""
    advantages_pg = np.asarray(losses.group_advantages(rewards_pg, mode=mode)) * keep_p[:, None]
    return advantages_pg.reshape(-1)


# -------------------------------------------------------------- run-loop adapter


class GRPO:
    """GRPO for the run loop (``learner.Algorithm``): state, batch and update."""

    def __init__(
        self,
        config: GRPOConfig,
        model_config: model_lib.ModelConfig,
        mesh: Mesh,
        *,
        optimizer: optax.GradientTransformation,
        prompt_len: int,
        filter_groups: bool,
    ):
        """Args:
        config: the algorithm's settings (``RunSpec.algorithm``).
        model_config, mesh: the policy's shape and the device mesh.
        optimizer: the policy's optimizer (``optimizer.make_optimizer`` at the run's batch).
        prompt_len: every batch's prompts are padded to this many tokens (the longest the
          run accepts): one update shape.
        filter_groups: drop groups whose rewards are all equal (dynamic sampling).
        """
        self.model_config, self.mesh = model_config, mesh
        self.filter_groups = filter_groups
        self.prompt_len = prompt_len
        self.grpo_config = config
        self.optimizer = optimizer
        self.update_fn = make_update_fn(model_config, self.grpo_config, self.optimizer, mesh)
        # KL to a reference (``grpo.kl_coef > 0``): the initial policy, kept frozen; its
        # log-probs join every batch (``Batch.ref_logprobs``). Computed as many rows at a
        # time as an update micro-batch holds (B / num_minibatches / micro_batches), so
        # its [rows, R, V] logits fit wherever the update's do.
        self.ref_params = None
        self._ref_logprobs_fn = None
        if self.grpo_config.kl_coef:
            self._ref_logprobs_fn = forward.make_logprobs_fn(
                model_config,
                mesh,
                self.grpo_config.temperature,
                micro_batches=self.grpo_config.num_minibatches * self.grpo_config.micro_batches,
            )

    def init_state(self, params) -> TrainState:
        """The train state from the initial policy (also the KL reference, if any).

        A resumed run calls this with the same initial policy before restoring its
        checkpoint, so its reference is the same as the uninterrupted run's.
        """
        state = train_state_lib.init_train_state(
            self.model_config, params, self.optimizer, mesh=self.mesh
        )
        if self._ref_logprobs_fn is not None:  # a copy: updates donate the state's buffers
            self.ref_params = jax.tree.map(lambda x: jnp.array(x, copy=True), state.params)
        return state

    @staticmethod
    def policy_params(state: TrainState):
        return state.params

    def extra_update_flops(self, costs: dict[str, float]) -> float:
        """FLOPs ``make_batch`` adds to an update (``costs``: ``flops.rollout_costs``):
        the reference policy's forward over the batch's tokens with a KL term, else 0."""
        if self._ref_logprobs_fn is None:
            return 0.0
        return costs["update_flops"] / flops.UPDATE_FLOPS_MULTIPLIER

    @staticmethod
    def trains_policy(metrics: dict) -> bool:
        del metrics
        return True

    def make_batch(self, ro: rollout_lib.Rollout, keep_p: np.ndarray) -> Batch:
        """Group-relative advantages; dropped groups get an all-False response mask;
        prompts padded to the run's longest (``rollout.pad_prompts``)."""
        ro = rollout_lib.pad_prompts(ro, self.prompt_len)
        advantages_b = batch_advantages(ro.rewards_pg, keep_p, self.grpo_config.advantage)
        batch = rollout_batch(ro, advantages_b, keep_p, self.mesh)
        if self.ref_params is not None:
            batch = batch.replace(ref_logprobs=self._ref_logprobs_fn(self.ref_params, batch))
        return batch
