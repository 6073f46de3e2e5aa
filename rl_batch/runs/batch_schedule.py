"""Batch-size schedules: how many prompts P each rollout batch draws (G stays fixed).

A run's ``batch_schedule`` config section (``experiments/configs/base.py``) chooses P per
rollout batch; every batch still makes one optimizer update, with the LR and clip rules
applied at the batch it has (``RunSpec.optimizer_at``, ``RunSpec.clip_at``:
``rl_batch.runs.sections.BatchRules.at``, the derivation ``resolve`` uses at the
configured batch), and the sample axis (``responses_cum``) counts its retained responses
as before.

- ``fixed`` (the default; configs written before the section existed load as it):
  P = ``prompts`` at every batch.
- ``warmup``: P starts at P0 = ``start_prompts`` and doubles, P0, 2 P0, ..., ``prompts``,
  the K = log2(prompts / P0) doublings evenly spread over the first ``responses``
  cumulative retained responses: stage ``k = min(K, floor(responses_cum * K /
  responses))``, P = P0 * 2**k (so P = ``prompts`` from ``responses`` on).
- ``adaptive``: P starts at P0 and doubles (up to ``prompts``) while the predicted time
  to a result falls: McCandlish et al.'s samples to a result ``E = E_min (1 + B /
  B_noise)`` make the time per unit of progress ``(1 + B / B_noise) / q(B)``, so doubling
  pays when the throughput gain exceeds the sample cost,
  ``q(2B) / q(B) > (1 + 2B / B_n) / (1 + B / B_n)``. ``q(B)`` (responses per second of
  a training step) comes from a sweep's calibration (``calibration``: a
  ``calibration.json`` whose configurations of the run's G and LR rule, or its
  schedule's ``prompts_step_s``, time every bucket; `calibrated_step_times`), and B_n
  is the lower end of a one-sided 95 % Fieller bound (``gradient_noise.
  pooled_ratio_interval``) on B_noise pooled over every update at the current P (at
  least ``window`` of them): an uncertain B_noise keeps P, and a mean ``|G|^2 <= 0`` is
  no estimate, never an infinite noise scale. B_noise is B_simple measured with the
  whole-group micro-batch layout (``grpo.micro_layout = "groups"``), from the update
  lines' ``grad_sq_micro``, ``grad_sq_full``, ``gns_batch_micro``, ``gns_batch_full``.
  The window: the pooled ratio's per-update relative spread was 1.96 at B_noise / B = 3
  and 0.59 at B_noise / B = 0.4 in the synthetic check (tests/test_noise_layout.py, 16
  dimensions), so a lower end within a factor 2 of the estimate (relative error 0.3)
  takes (1.96 / 0.3)^2 ~ 43 and (0.59 / 0.3)^2 ~ 4 updates; every update at the current
  P counts, so the bound tightens as the run stays there, and ``window`` (the schedule
  study uses 8) is only the least it waits after each doubling.

P takes only the doubling values (``BatchSchedule.buckets``), so the sampler and the
update compile at most log2(prompts / P0) + 1 batch shapes (the run compiles each of them
before its first step, outside training time). The schedule holds no state of its own:
P is a pure function of the run's counters and its metrics lines, which a checkpoint
restores exactly, so a resumed run continues the schedule where it stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from rl_batch.gradient_noise import noise_scale_terms, pooled_ratio_interval

KINDS = ("fixed", "warmup", "adaptive")
# The section a config.json written before batch schedules existed is read with.
FIXED = {"kind": "fixed", "start_prompts": 0, "responses": 0, "window": 4, "calibration": ""}
# One-sided 95 % normal quantile: the adaptive schedule's lower bound on B_noise.
Z_LOWER = 1.644854
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
      window: ``adaptive``: the least updates at the current P it pools B_noise over
        before deciding (it pools every update at the current P).
      calibration: ``adaptive``: the ``calibration.json`` that gives q(B).
      step_s: ``adaptive``: ``((B, calibrated seconds per step), ...)`` at each bucket's
        batch, read from ``calibration`` (`calibrated_step_times`; empty when it has none).
    """

    kind: str = "fixed"
    prompts: int
    group_size: int
    start_prompts: int
    responses: int = 0
    window: int = 4
    calibration: str = ""
    step_s: tuple[tuple[int, float], ...] = ()

    @classmethod
    def from_config(cls, c: Any) -> BatchSchedule:
        """The schedule of a (validated) run config; no ``batch_schedule`` section: fixed."""
        section = dict(FIXED)
        given = c.get("batch_schedule")
        if given is not None:
            section.update(given.to_dict() if hasattr(given, "to_dict") else dict(given))
        fixed = section["kind"] == "fixed"
        out = cls(
            kind=section["kind"],
            prompts=int(c.prompts),
            group_size=int(c.group_size),
            start_prompts=int(c.prompts if fixed else section["start_prompts"]),
            responses=int(section["responses"]),
            window=int(section["window"]),
            calibration=str(section.get("calibration", "") or ""),
        )
        if out.kind != "adaptive" or not out.calibration:
            return out
        steps = calibrated_step_times(out.calibration, out.group_size, c.get("lr_rule", "sqrt"))
        return dataclasses.replace(
            out, step_s=tuple((b, steps[b]) for b in out.batches if b in steps)
        )

    def throughput(self, batch: int) -> float | None:
        """q(B): responses per second of a calibrated training step at ``batch`` (None
        when the calibration has no step time there)."""
        seconds = dict(self.step_s).get(batch)
        return None if seconds is None or seconds <= 0 else batch / seconds

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
    """B_simple = mean tr(Sigma) / mean |G|^2 over ``points`` (NaN, no estimate, when the
    mean |G|^2 is <= 0 and the mean tr(Sigma) > 0: not an infinite noise scale; 0 when
    the mean tr(Sigma) is <= 0)."""
    if not points:
        raise ValueError("pooled_noise_scale: no noise measurements")
    terms = [noise_scale_terms(p.sq_small, p.sq_big, p.b_small, p.b_big) for p in points]
    g2 = sum(t[0] for t in terms) / len(terms)
    trace = sum(t[1] for t in terms) / len(terms)
    if trace <= 0:
        return 0.0
    return trace / g2 if g2 > 0 else math.nan


def noise_scale_lower_bound(points: Sequence[NoisePoint], z: float = Z_LOWER) -> float:
    """The lower end of the Fieller interval on the pooled noise scale of ``points``
    (``gradient_noise.pooled_ratio_interval`` at ``z``; 0 with fewer than two)."""
    if len(points) < 2:
        return 0.0
    terms = [noise_scale_terms(p.sq_small, p.sq_big, p.b_small, p.b_big) for p in points]
    _, lo, _ = pooled_ratio_interval([t[1] for t in terms], [t[0] for t in terms], z)
    return float(lo)


def doubling_pays(q_ratio: float, batch: float, b_noise: float) -> bool:
    """Whether doubling the batch lowers the predicted time to a result: the throughput
    gain ``q(2B) / q(B)`` exceeds the sample cost ``(1 + 2B / B_n) / (1 + B / B_n)``
    (never with ``B_n <= 0``: no evidence of noise)."""
    if not b_noise > 0:
        return False
    cost = (1.0 + 2.0 * batch / b_noise) / (1.0 + batch / b_noise)
    return q_ratio > cost


def calibrated_step_times(path: str, group_size: int, lr_rule: str) -> dict[int, float]:
    """``{B: seconds per training step}`` from a sweep's ``calibration.json``
    (`rl_batch.sweeps.calibrate`): the median step time of each fixed configuration
    ``"PxG:rule"`` of this G and LR rule, then, for a batch none has, the median over a
    schedule configuration's ``prompts_step_s`` (same G and rule). Empty when the file
    is missing or unreadable."""
    try:
        with open(path) as f:
            configs = json.load(f)["configs"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    fixed: dict[int, float] = {}
    scheduled: dict[int, float] = {}
    for key, rec in configs.items():
        shape, _, rule = str(key).partition(":")
        rule, _, variant = rule.partition("@")
        p, _, g = shape.partition("x")
        if not (g.isdigit() and int(g) == group_size and rule == lr_rule):
            continue
        if not variant and rec.get("step_s_median"):
            fixed[int(p) * group_size] = float(rec["step_s_median"])
        for prompts, times in (rec.get("prompts_step_s") or {}).items():
            if times:
                scheduled.setdefault(int(prompts) * group_size, float(statistics.median(times)))
    return {**scheduled, **fixed}


def adaptive_prompts(schedule: BatchSchedule, history: Sequence[NoisePoint]) -> int:
    """P of the ``adaptive`` schedule for the next batch, given the noise measurements
    of the updates so far (`noise_history`).

    The current P is the last measured update's (P0 before any); it doubles, up to
    ``prompts``, when at least ``window`` measurements in a row were taken at it and
    `doubling_pays` with q from the calibration and the lower bound on B_noise pooled
    over all of them (`noise_scale_lower_bound`).
    """
    current = history[-1].prompts if history else schedule.start_prompts
    if current >= schedule.prompts:
        return schedule.prompts
    at_current = 0
    for point in reversed(history):
        if point.prompts != current:
            break
        at_current += 1
    if at_current < max(schedule.window, 2):
        return current
    batch = current * schedule.group_size
    q_now, q_next = schedule.throughput(batch), schedule.throughput(2 * batch)
    if q_now is None or q_next is None:
        return current  # (resolve refuses a schedule its calibration does not cover)
    b_noise_lo = noise_scale_lower_bound(history[-at_current:])
    if doubling_pays(q_next / q_now, batch, b_noise_lo):
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
        grpo_section = c.get("grpo") or {}
        check(
            grpo_section.get("micro_layout", "strided") == "groups"
            and not grpo_section.get("group_noise", False),
            "batch_schedule.kind='adaptive' decides on B_noise: it needs "
            "grpo.micro_layout='groups' and grpo.group_noise=False",
        )
        errors.extend(_calibration_errors(c, s))
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


def _calibration_errors(c: Any, s: dict) -> list[str]:
    """The adaptive schedule's calibration: a file that gives q(B) at every bucket."""
    path = s.get("calibration") or ""
    if not path:
        return [
            "batch_schedule.kind='adaptive' needs batch_schedule.calibration: a sweep's "
            "calibration.json that times every batch it can take (q(B) decides a doubling)"
        ]
    if not isinstance(path, str) or not os.path.exists(path):
        return [f"batch_schedule.calibration={path!r}: no such file"]
    p0 = s["start_prompts"]
    if not (isinstance(p0, int) and p0 >= 1):
        return []  # (named above)
    steps = calibrated_step_times(path, c.group_size, c.get("lr_rule", "sqrt"))
    missing, p = [], p0
    while p <= c.prompts:
        if p * c.group_size not in steps:
            missing.append(p * c.group_size)
        p *= 2
    if missing:
        return [
            f"batch_schedule.calibration={path!r} times no configuration of G = "
            f"{c.group_size}, lr_rule={c.get('lr_rule', 'sqrt')!r} at batches {missing}"
        ]
    return []


def _power_of_two(x: float) -> bool:
    """Whether ``x`` is 2**k for an int k >= 0."""
    return x >= 1 and float(x).is_integer() and (int(x) & (int(x) - 1)) == 0
