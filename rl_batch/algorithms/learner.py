"""The learner as the run loop sees it, and a map of the learner's modules.

``Algorithm`` is the protocol ``rl_batch.runs.run`` drives; ``grpo.GRPO`` and ``ppo.PPO``
implement it, each around one pure, jitted ``update_fn(state, batch, rng, clip=None) ->
(state, metrics)`` (``clip``: the update's policy-ratio clip range, an argument of the
compiled program; ``update_step.JittedUpdate``). Callers outside ``algorithms/`` (the
run loop, memory plans, benchmarks) also take from here the names they need to build and
drive a learner: ``TrainState``, ``init_train_state``, ``Batch``, ``make_optimizer``,
``warmup_lr``, ``current_lr``, ``with_adam_hparams``, ``check_group_pairs`` and
``check_whole_groups`` (each defined in the module below that owns it).

Where the pieces live (each module one responsibility; grpo.py and ppo.py import them):

- ``batch``: ``Batch`` (the policy-gradient batch), shape checks, ``rollout_fields``,
  ``split_batch``, ``loss_normalisers``, ``sequence_metrics``;
- ``train_state``: ``TrainState``, ``init_train_state``, ``train_state_shardings``;
- ``optimizer``: ``make_optimizer`` (AdamW, hyperparameters in the state),
  ``warmup_lr``, ``current_lr``, ``with_adam_hparams``;
- ``forward``: ``response_outputs`` (logits or values aligned with the response tokens)
  and ``compute_logprobs`` (micro-batched and jitted variants);
- ``policy_loss``: the clipped policy-gradient loss ``policy_loss`` and its pure pieces,
  ``ClipRange`` (the clip range an update takes);
- ``update_step``: ``accumulate_gradients`` (micro-batches in ``lax.scan``),
  ``apply_update`` (skipped whole when non-finite), ``delta_norm``, ``jit_update``
  (``JittedUpdate``: the clip range an argument);
- ``noise_statistics``: the gradient-noise statistics an update logs with micro-batches
  (micro-batch layout, squared norms, half-group pair inner products).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from rl_batch.algorithms.batch import Batch
from rl_batch.algorithms.noise_statistics import check_group_pairs, check_whole_groups
from rl_batch.algorithms.optimizer import (
    current_lr,
    make_optimizer,
    warmup_lr,
    with_adam_hparams,
)
from rl_batch.algorithms.train_state import TrainState, init_train_state

__all__ = [
    "Algorithm",
    "Batch",
    "TrainState",
    "check_group_pairs",
    "check_whole_groups",
    "current_lr",
    "init_train_state",
    "make_optimizer",
    "warmup_lr",
    "with_adam_hparams",
]

Params = Any
Metrics = dict[str, jax.Array]


@runtime_checkable
class Algorithm(Protocol):
    """What ``rl_batch.runs.run`` needs of a learner (``grpo.GRPO``, ``ppo.PPO``).

    Attributes:
      filter_groups: drop groups whose rewards are all equal before the update.
      update_fn: the jitted ``update_fn(state, batch, rng, clip=None) -> (state,
        metrics)``; ``clip`` a ``(clip_low, clip_high)`` range, None for the config's.
    """

    filter_groups: bool
    update_fn: Callable[..., tuple[Any, Metrics]]

    def init_state(self, params: Params) -> Any:
        """The train state from the initial policy."""
        ...

    def policy_params(self, state: Any) -> Params:
        """The policy's params in ``state`` (what the sampler generates with)."""
        ...

    def make_batch(self, ro: Any, keep_p: np.ndarray) -> Any:
        """The update's sharded batch from a rollout and its [P] kept groups."""
        ...

    def trains_policy(self, metrics: dict) -> bool:
        """Whether the update with these metrics trained the policy (the sample axis)."""
        ...

    def extra_update_flops(self, costs: dict[str, float]) -> float:
        """FLOPs ``make_batch`` adds to an update besides forward + backward."""
        ...
