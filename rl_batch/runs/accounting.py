"""Step accounting: a run's counters, and one step's timings and counts turned into its line.

The protocol (docs/design.md section 2): the sample axis counts responses the *policy* learned
from (retained after filtering, not PPO's critic warm-up, not a skipped update);
training time is generation + scoring + update + host-side glue, while compilation,
evaluation and checkpointing are timed but kept out of it. With asynchronous rollout,
generation overlaps the update: the learner-side idle time is its wait for a rollout.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from rl_batch import artifacts
from rl_batch.models import flops
from rl_batch.rollout import groups as rollout_lib
from rl_batch.rollout.filtering import dynamic_sampling_filter

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Counters:
    """Host-side progress, saved with every checkpoint."""

    step: int = 0  # optimizer updates done
    rollouts: int = 0  # rollout batches generated (>= step: all-filtered batches skip)
    data_position: int = 0  # prompts consumed from the training order
    responses_cum: int = 0  # retained responses used in updates
    responses_generated_cum: int = 0
    # Where the sample axis starts (PPO: after the critic warm-up; GRPO: at 0): the
    # optimizer updates and training time spent before the first policy update.
    policy_start_step: int = -1
    policy_start_time_s: float = -1.0
    next_eval: int = 0  # responses_cum at which the next validation runs
    time_train_cum_s: float = 0.0
    time_generate_s: float = 0.0
    time_score_s: float = 0.0
    time_update_s: float = 0.0
    time_idle_s: float = 0.0
    time_eval_s: float = 0.0
    time_compile_s: float = 0.0
    time_checkpoint_s: float = 0.0
    skipped_updates: int = 0
    consecutive_skips: int = 0
    consecutive_empty: int = 0  # rollouts in a row whose groups were all filtered out
    evals_at_target: int = 0
    evals: int = 0  # validations done (``eval_sampled_every`` counts them)
    # Tokens (and their FLOPs) of the generation timed in time_generate_s: the numerator
    # of the run's generation throughput. A token counts once (partial rollout: in the
    # iteration that decoded it); a rollout whose time was booked as compilation adds
    # neither tokens nor time.
    gen_tokens_cum: int = 0
    gen_flops_cum: float = 0.0
    update_tokens_cum: int = 0  # prompt + response tokens processed by updates
    update_flops_cum: float = 0.0
    time_learner_wait_s: float = 0.0  # learner waiting for a rollout (all of it when sync)
    time_generator_idle_s: float = 0.0  # generator not generating or scoring
    # Why the run stopped training (`stop_reason`): "" while it trains, STOP_TARGET (a
    # confirmed target with stop_at_target) or STOP_BUDGET. Saved with each checkpoint,
    # so a resumed run knows it had finished (summary.json need not be there).
    stopped: str = ""

    def add_learner_wait(self, seconds: float) -> None:
        """The learner waited for rollouts in flight (before validation or a save)."""
        self.time_train_cum_s += seconds
        self.time_learner_wait_s += seconds


STOP_TARGET = "target"
STOP_BUDGET = "budget"


def stop_reason(c, counters: Counters) -> str:
    """Why a run at ``counters`` trains no further under config ``c``, else ``""``.

    A run that stopped at its confirmed target (``counters.stopped``) stays stopped while
    ``c`` still stops there (``stop_at_target``, ``confirm_evals``); a run whose retained
    responses reach ``c.budget_responses`` stops there. So resuming a finished run with
    an unchanged config trains nothing, and only a setting of ``RESUME_ALLOWED`` (a larger
    budget, ``stop_at_target=False``, more ``confirm_evals``) extends it.
    """
    if (
        counters.stopped == STOP_TARGET
        and c.stop_at_target
        and counters.evals_at_target >= c.confirm_evals
    ):
        return STOP_TARGET
    if counters.responses_cum >= c.budget_responses:
        return STOP_BUDGET
    return ""


def restored_counters(c, saved: dict[str, Any]) -> Counters:
    """The counters of a checkpoint's metadata (``meta["counters"]``).

    Checkpoints written before ``Counters.stopped`` existed say nothing of a stop: a run
    saved past its first update with its target confirmed under ``c`` had stopped there
    (that run loop stopped at the first validation that confirmed it).
    """
    counters = Counters(**saved)
    if "stopped" not in saved and counters.step > 0:
        if c.stop_at_target and counters.evals_at_target >= c.confirm_evals:
            counters.stopped = STOP_TARGET
    return counters


def keep_mask(ro: rollout_lib.Rollout, filter_groups: bool) -> np.ndarray:
    """[P] groups that train: differing rewards (when filtering) and, partial, finished."""
    if filter_groups:
        keep_p = dynamic_sampling_filter(ro.rewards_pg).keep_p
    else:
        keep_p = np.ones(ro.rewards_pg.shape[0], bool)
    if ro.complete_p is not None:  # partial rollout: only finished groups train
        keep_p = keep_p & ro.complete_p
    return keep_p


@dataclasses.dataclass(frozen=True)
class Step:
    """What one loop iteration measured.

    Attributes:
      ro: the rollout batch it trained on.
      keep_p: [P] groups that trained.
      staleness: optimizer steps between the generating and the updated policy.
      metrics: the update's metrics (host values; empty when every group was dropped).
      trains_policy: whether the update trained the policy (PPO warm-up: False).
      learner_wait_s: seconds the learner waited for the rollout.
      update_s: seconds of the update (0 without one).
      wall_s: seconds of the whole iteration so far, compilation included.
      compilations: jit traces so far (sampler + update): constant after the warm-up.
    """

    ro: rollout_lib.Rollout
    keep_p: np.ndarray
    staleness: int
    metrics: dict[str, Any]
    trains_policy: bool
    learner_wait_s: float
    update_s: float
    wall_s: float
    compilations: int


class StepAccounting:
    """Books one step into the counters and builds its ``update`` metrics line.

    Args:
      c: the resolved run config.
      model_config: the policy's model config (token FLOPs).
      extra_update_flops: FLOPs the algorithm adds to an update besides forward and
        backward (``Algorithm.extra_update_flops``).
      matmul_flops_per_s: the process's measured matmul rate (the FLOP/s yardstick).
      overlapped: generation overlaps the update (async rollout).
    """

    def __init__(self, spec, extra_update_flops, matmul_flops_per_s, overlapped):
        self.c, self.model_config, self.lr = spec.config, spec.model, spec.optimizer.lr
        self.extra_update_flops = extra_update_flops
        self.matmul_rate, self.overlapped = matmul_flops_per_s, overlapped

    def book(self, counters: Counters, s: Step) -> dict[str, Any] | None:
        """Adds the step to ``counters``; returns its metrics line (None: no update)."""
        c, ro = self.c, s.ro
        retained = int(s.keep_p.sum()) * c.group_size
        prompts = int(ro.rewards_pg.shape[0])  # this batch's P (a batch schedule's)
        # Responses that ended in this rollout (partial rollout: finished groups only).
        done_p = prompts if ro.complete_p is None else int(ro.complete_p.sum())
        generated = c.group_size * done_p
        counters.responses_generated_cum += generated
        counters.time_generate_s += ro.time_generate_s
        counters.time_score_s += ro.time_score_s
        costs = flops.rollout_costs(self.model_config, ro.samples)
        # Work the algorithm does besides forward + backward (GRPO's reference pass).
        costs["update_flops"] += self.extra_update_flops(costs)
        if ro.gen_flops is not None:  # partial: the samples also hold earlier tokens
            costs["gen_tokens"], costs["gen_flops"] = ro.gen_tokens, ro.gen_flops
        if not ro.time_compile_s:  # (else its time is compilation, not generation)
            counters.gen_tokens_cum += costs["gen_tokens"]
            counters.gen_flops_cum += costs["gen_flops"]
        if retained > 0:
            self._book_update(counters, s, costs, retained)
        # Compilation met during the step is timed but not training time.
        step_time = s.wall_s - ro.time_compile_s
        counters.time_compile_s += ro.time_compile_s
        busy = s.learner_wait_s if self.overlapped else ro.time_generate_s + ro.time_score_s
        idle = max(step_time - busy - s.update_s, 0.0)
        counters.time_idle_s += idle
        counters.time_train_cum_s += step_time
        generator_idle = max(step_time - ro.time_generate_s - ro.time_score_s, 0.0)
        counters.time_learner_wait_s += s.learner_wait_s
        counters.time_generator_idle_s += generator_idle
        counters.consecutive_empty = 0 if retained else counters.consecutive_empty + 1
        if retained == 0:
            return None
        return {
            "kind": "update",
            "step": counters.step,
            "responses_cum": counters.responses_cum,
            "responses_generated_cum": counters.responses_generated_cum,
            "prompts": prompts,
            "group_size": c.group_size,
            "batch_responses": retained,
            "batch_generated": generated,
            "lr": self.lr,  # (the update's own ``lr`` metric, below, replaces it)
            "reward_mean": float(ro.rewards_pg.mean()),
            "reward_retained_mean": float(ro.rewards_pg[s.keep_p].mean()),
            **ro.score_counts,  # math: score_unverified_too_big, score_unverified_timeout
            "time_generate_s": ro.time_generate_s,
            "time_score_s": ro.time_score_s,
            "time_update_s": s.update_s,
            "time_idle_s": idle,
            "time_train_cum_s": counters.time_train_cum_s,
            "gen_tokens": costs["gen_tokens"],
            **rollout_lib.rollout_metrics(ro),
            **flops.step_throughput(
                gen_tokens=costs["gen_tokens"],
                gen_flops=costs["gen_flops"],
                time_generate_s=ro.time_generate_s,
                update_tokens=costs["update_tokens"],
                upd_flops=costs["update_flops"],
                time_update_s=s.update_s,
                responses=retained,
                step_time_s=step_time,
                matmul_flops_per_s=self.matmul_rate,
            ),
            "staleness": s.staleness,
            "time_learner_wait_s": s.learner_wait_s,
            "time_generator_idle_s": generator_idle,
            "compilations": s.compilations,
            **{k: float(np.asarray(v)) for k, v in s.metrics.items()},
            # PPO's critic warm-up lines are set aside by the analysis.
            "phase": artifacts.PHASE_TRAIN if s.trains_policy else artifacts.PHASE_CRITIC_WARMUP,
        }

    def _book_update(self, counters: Counters, s: Step, costs: dict, retained: int) -> None:
        counters.time_update_s += s.update_s
        counters.update_tokens_cum += costs["update_tokens"]
        counters.update_flops_cum += costs["update_flops"]
        skipped = bool(s.metrics.get("skipped", 0))
        counters.skipped_updates += int(skipped)
        counters.consecutive_skips = counters.consecutive_skips + 1 if skipped else 0
        counters.step += 1
        if skipped:
            log.warning(
                "update %d skipped: non-finite loss or gradients (%d in a row, the run "
                "stops at %d)",
                counters.step,
                counters.consecutive_skips,
                self.c.max_consecutive_skips,
            )
        # The sample axis counts responses the policy learned from (not PPO's critic
        # warm-up, not a skipped update).
        if not skipped and s.trains_policy:
            if counters.policy_start_step < 0:
                counters.policy_start_step = counters.step - 1
                counters.policy_start_time_s = counters.time_train_cum_s
            counters.responses_cum += retained


class RunStuckError(RuntimeError):
    """A run stopped because its rollouts give the policy nothing to learn from."""


def no_signal_advice(reward_mean: float, warm_start: dict | None = None) -> str:
    """What to do when no group of a rollout has differing rewards, by its mean reward:
    a policy that never succeeds needs a start that sometimes does; one that always
    succeeds, a harder task.

    Args:
      reward_mean: the rollout's mean reward.
      warm_start: for a run that already starts from the task's warm start
        (``init.source=pretrain``): ``pretrain.warm_start_info`` (its cache directory, its
        ``info.json`` or None, the ``pretrain`` settings). The advice then says what that
        warm start reached, instead of advising the setting the run has.
    """
    if reward_mean <= 0.5:
        if warm_start is not None:
            return "the policy never solves this task: " + warm_start_advice(warm_start)
        return (
            "the policy never solves this task: start from a warm start on it "
            "(--config.init.source=pretrain, a supervised warm start on the task's own "
            "examples) or make the task easier"
        )
    return (
        "the policy solves every prompt: make the task harder, or sample at a higher "
        "--config.sampling.temperature"
    )


def warm_start_advice(warm_start: dict) -> str:
    """What the warm start of a run that never succeeds reached, and what to change.

    ``warm_start``: ``{"dir": cache directory, "info": its info.json (None when absent),
    "pretrain": the pretrain settings}`` (``pretrain.warm_start_info``). The accuracy is
    the last value of ``pretrain.stop_metric`` that the warm start's training measured.
    """
    p, info, where = warm_start["pretrain"], warm_start.get("info"), warm_start["dir"]
    stop, metric = p.get("stop_accuracy"), p.get("stop_metric", "sampled")
    evals = (info or {}).get("evals") or []
    if not evals:
        return (
            f"its warm start ({where}, init.source=pretrain) records no accuracy: delete that "
            "directory to train it again, or make the task easier"
        )
    accuracy, steps = float(evals[-1][2]), int(info.get("steps", evals[-1][0]))
    reached = f"its warm start ({where}) reached {metric} accuracy {accuracy:.3f} in {steps} steps"
    if stop is not None and accuracy < stop:
        return (
            f"{reached}, below pretrain.stop_accuracy={stop} (pretrain.steps={p.get('steps')} "
            "ran out): raise --config.pretrain.steps or --config.pretrain.lr, or make the "
            "task easier"
        )
    return (
        f"{reached} (pretrain.stop_accuracy={stop}), yet no rollout is rewarded: check that "
        "the task's reward accepts its own examples' answers, or raise "
        "--config.pretrain.stop_accuracy"
    )


def stuck_error(
    c, counters: Counters, reward_mean: float, ckpt_dir: str, warm_start: dict | None = None
) -> Exception | None:
    """The error that stops a run making no progress (checkpoint it first), else None
    (``warm_start``: see `no_signal_advice`)."""
    if counters.consecutive_empty >= c.max_empty_rollouts:
        return RunStuckError(
            f"{counters.consecutive_empty} rollout batches in a row had no group with "
            f"differing rewards (mean reward {reward_mean:.3f}): "
            + no_signal_advice(reward_mean, warm_start)
        )
    if counters.consecutive_skips >= c.max_consecutive_skips:
        return FloatingPointError(
            f"{counters.consecutive_skips} consecutive updates had non-finite loss or "
            f"gradients (step {counters.step}); stopped with a checkpoint in {ckpt_dir}"
        )
    return None
