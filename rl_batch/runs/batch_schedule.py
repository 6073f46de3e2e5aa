"""Batch-size schedules: how many prompts P each rollout batch draws (G stays fixed).

A run's ``batch_schedule`` config section (``experiments/configs/base.py``) chooses P per
rollout batch; every batch still makes one optimizer update, with the LR rule applied at
the batch it has (``RunSpec.optimizer_at``: ``rl_batch.runs.sections.BatchRules.at``, the
derivation ``resolve`` uses at the configured batch), and the sample axis (``responses_cum``)
counts its retained responses as before.

- ``fixed`` (the default; configs written before the section existed load as it):
  P = ``prompts`` at every batch.
- ``warmup``: P starts at P0 = ``start_prompts`` and doubles, P0, 2 P0, ..., ``prompts``,
  the K = log2(prompts / P0) doublings evenly spread over the first ``responses``
  cumulative retained responses: stage ``k = min(K, floor(responses_cum * K /
  responses))``, P = P0 * 2**k (so P = ``prompts`` from ``responses`` on).
- ``adaptive``: P starts at P0 and doubles (up to ``prompts``) when the gradient noise
  scale B_simple (`rl_batch.gradient_noise`), pooled over the last ``window``
  updates at the current P, exceeds the current batch P x G. Pooled: the unbiased
  ``|G|^2`` and ``tr(Sigma)`` terms of each update are averaged over the window and
  B_simple is the ratio of the means (a window whose mean ``|G|^2 <= 0`` while its
  mean ``tr(Sigma) > 0`` is noise-dominated: B_simple = inf, P grows). Each doubling waits
  for a full window of updates measured at the new P. The terms come from the update
  lines' ``grad_sq_micro``, ``grad_sq_full``, ``gns_batch_micro``, ``gns_batch_full``,
  which the learner logs with ``micro_batches >= 2``.

P takes only the doubling values (``BatchSchedule.buckets``), so the sampler and the
update compile at most log2(prompts / P0) + 1 batch shapes (the run compiles each of them
before its first step, outside training time). The schedule holds no state of its own:
P is a pure function of the run's counters and its metrics lines, which a checkpoint
restores exactly, so a resumed run continues the schedule where it stopped.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from rl_batch.gradient_noise import noise_scale_terms

KINDS = ("fixed", "warmup", "adaptive")
# The section a config.json written before batch schedules existed is read with.
FIXED = {"kind": "fixed", "start_prompts": 0, "responses": 0, "window": 4}
# The update-line fields of one noise measurement: |g_b|^2, |g_B|^2, b, B.
NOISE_FIELDS = ("grad_sq_micro", "grad_sq_full", "gns_batch_micro", "gns_batch_full")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchSchedule:
    """A run's batch-size schedule (see the module docstring).

    Attributes:
      kind: ``"fixed"``, ``"warmup"`` or ``"adaptive"``.
      prompts: the configured (largest) prompts per rollout batch P.
      group_size: G, responses per prompt (fixed).
      start_prompts: P0, the first batch's prompts (``fixed``: = ``prompts``).
      responses: ``warmup``: the cumulative retained responses over which P grows to
        ``prompts``.
      window: ``adaptive``: updates at the current P that B_simple is pooled over.
    """

    kind: str = "fixed"
    prompts: int
    group_size: int
    start_prompts: int
    responses: int = 0
    window: int = 4

    @classmethod
    def from_config(cls, c: Any) -> BatchSchedule:
        """The schedule of a (validated) run config; no ``batch_schedule`` section: fixed."""
        section = dict(FIXED)
        given = c.get("batch_schedule")
        if given is not None:
            section.update(given.to_dict() if hasattr(given, "to_dict") else dict(given))
        fixed = section["kind"] == "fixed"
        return cls(
            kind=section["kind"],
            prompts=int(c.prompts),
            group_size=int(c.group_size),
            start_prompts=int(c.prompts if fixed else section["start_prompts"]),
            responses=int(section["responses"]),
            window=int(section["window"]),
        )

    @property
    def buckets(self) -> tuple[int, ...]:
        """Every P the schedule can take, smallest first: P0, 2 P0, ..., ``prompts``."""
        out, p = [], self.start_prompts
        while p < self.prompts:
            out.append(p)
            p *= 2
        return (*out, self.prompts)

    @property
    def batches(self) -> tuple[int, ...]:
        """Every rollout batch P x G the schedule can take, smallest first."""
        return tuple(p * self.group_size for p in self.buckets)

    @property
    def doublings(self) -> int:
        """K = log2(prompts / P0)."""
        return len(self.buckets) - 1


class NoisePoint(NamedTuple):
    """One update's noise measurement: its prompts and ``|g_b|^2, |g_B|^2, b, B``."""

    prompts: int
    sq_small: float
    sq_big: float
    b_small: float
    b_big: float


def noise_history(records: Iterable[dict]) -> list[NoisePoint]:
    """The noise measurements of a run's update lines, in order (lines without all
    four `NOISE_FIELDS` finite, or with ``b >= B``, are left out)."""
    out = []
    for r in records:
        if r.get("kind") != "update":
            continue
        values = [r.get(name) for name in NOISE_FIELDS]
        if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            continue
        if not values[3] > values[2] > 0:
            continue
        out.append(NoisePoint(int(r["prompts"]), *map(float, values)))
    return out


def warmup_prompts(schedule: BatchSchedule, responses_cum: int) -> int:
    """P of the ``warmup`` schedule after ``responses_cum`` retained responses:
    P0 * 2**min(K, floor(responses_cum * K / responses))."""
    k = schedule.doublings
    if k == 0:
        return schedule.prompts
    stage = min(k, (responses_cum * k) // schedule.responses)
    return schedule.start_prompts * 2**stage


def pooled_noise_scale(points: Sequence[NoisePoint]) -> float:
    """B_simple = mean tr(Sigma) / mean |G|^2 over ``points`` (inf when the mean |G|^2
    is <= 0 and the mean tr(Sigma) > 0; 0 when the mean tr(Sigma) is <= 0)."""
    if not points:
        raise ValueError("pooled_noise_scale: no noise measurements")
    terms = [noise_scale_terms(p.sq_small, p.sq_big, p.b_small, p.b_big) for p in points]
    g2 = sum(t[0] for t in terms) / len(terms)
    trace = sum(t[1] for t in terms) / len(terms)
    if trace <= 0:
        return 0.0
    return trace / g2 if g2 > 0 else math.inf


def adaptive_prompts(schedule: BatchSchedule, history: Sequence[NoisePoint]) -> int:
    """P of the ``adaptive`` schedule for the next batch, given the noise measurements
    of the updates so far (`noise_history`).

    The current P is the last measured update's (P0 before any); it doubles, up to
    ``prompts``, when the last ``window`` measurements were all taken at it and their
    pooled B_simple exceeds the current batch P x G.
    """
    current = history[-1].prompts if history else schedule.start_prompts
    if current >= schedule.prompts:
        return schedule.prompts
    recent = history[-schedule.window :]
    if len(recent) < schedule.window or any(p.prompts != current for p in recent):
        return current
    if pooled_noise_scale(recent) > current * schedule.group_size:
        return min(2 * current, schedule.prompts)
    return current


def prompts_at(
    schedule: BatchSchedule, responses_cum: int, history: Sequence[NoisePoint] = ()
) -> int:
    """P of the next rollout batch: a pure function of the schedule, the run's retained
    responses so far and its noise measurements (``adaptive`` only)."""
    if schedule.kind == "warmup":
        return warmup_prompts(schedule, responses_cum)
    if schedule.kind == "adaptive":
        return adaptive_prompts(schedule, history)
    return schedule.prompts


def config_errors(c: Any) -> list[str]:
    """One message per invalid ``batch_schedule`` field of run config ``c`` (and per
    setting a non-fixed schedule does not support)."""
    section = c.get("batch_schedule")
    if section is None:
        return []
    s = {**FIXED, **(section.to_dict() if hasattr(section, "to_dict") else dict(section))}
    kind = s["kind"]
    if kind not in KINDS:
        return [f"batch_schedule.kind={kind!r}: expected one of {KINDS}"]
    unknown = sorted(set(s) - set(FIXED))
    if unknown:
        return [f"batch_schedule: unknown fields {unknown}; known are {sorted(FIXED)}"]
    if kind == "fixed":
        return []
    errors = []

    def check(ok: bool, message: str) -> None:
        if not ok:
            errors.append(message)

    p0, prompts = s["start_prompts"], c.prompts
    is_int = isinstance(p0, int) and not isinstance(p0, bool)
    check(
        is_int and 1 <= p0 <= prompts and _power_of_two(prompts / p0),
        f"batch_schedule.start_prompts={p0!r}: kind={kind!r} needs P0 >= 1 with prompts / P0 "
        f"a power of two (prompts={prompts}; P doubles from P0 up to prompts)",
    )
    if kind == "warmup":
        r = s["responses"]
        check(
            isinstance(r, int) and not isinstance(r, bool) and r >= 1,
            f"batch_schedule.responses={r!r}: kind='warmup' needs the cumulative retained "
            "responses over which P grows, an int >= 1",
        )
    if kind == "adaptive":
        w = s["window"]
        check(
            isinstance(w, int) and not isinstance(w, bool) and w >= 1,
            f"batch_schedule.window={w!r}: must be an int >= 1 (updates B_simple is pooled over)",
        )
        micro = c.grpo.micro_batches if "grpo" in c else 1
        check(
            micro >= 2,
            f"batch_schedule.kind='adaptive' needs grpo.micro_batches >= 2 (got {micro}): "
            "the noise scale B_simple is measured from micro-batch and full-batch gradients",
        )
    check(
        c.algo == "grpo",
        f"batch_schedule.kind={kind!r} needs algo='grpo' (got {c.algo!r})",
    )
    check(
        not c.async_rollout.enabled and not c.partial_rollout.enabled,
        f"batch_schedule.kind={kind!r} needs synchronous rollouts: disable "
        "async_rollout and partial_rollout",
    )
    check(
        c.algo != "grpo" or not c.grpo.get("micro_batch_seqs", 0),
        f"batch_schedule.kind={kind!r} takes a fixed micro-batch count: set "
        "grpo.micro_batch_seqs=0 and choose grpo.micro_batches",
    )
    return errors


def _power_of_two(x: float) -> bool:
    """Whether ``x`` is 2**k for an int k >= 0."""
    return x >= 1 and float(x).is_integer() and (int(x) & (int(x) - 1)) == 0
