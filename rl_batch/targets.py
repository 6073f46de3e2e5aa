"""Time-to-target of one run: the single definition of N*, T, q and updates-to-target.

``summary.json`` (``rl_batch.runs.run``), ``experiments.train``'s printout and the analysis
(``rl_batch.analysis``: report, figures, planner) all compute these numbers here, from the
run's metric lines, so they agree exactly. The module reads records only (numpy, no JAX):
the run loop sits above it, the analysis beside it.

Definitions (docs/design.md section 2):

- The *actor axis*: update lines of PPO's critic warm-up (``phase`` = critic_warmup) are
  set aside and responses, training time and updates count from the first actor update.
  The offset is the counter on the last warm-up line, applied only when the counters run
  on through the warm-up (a run loop that already starts them at the actor needs none);
  the actor is unchanged during the warm-up, so the last evaluation made during it
  becomes the evaluation at zero responses.
- ``N*``: retained responses at the update after which validation accuracy first reaches
  the target. Accuracy is interpolated linearly between the two evaluations that bracket
  the first crossing, and N* is the first update line at or after that crossing: the
  policy changes only at updates, so a batch of B responses reaches a level at a
  multiple of B, never between. (The interpolated point alone sits on average half a
  batch early, a bias that grows with B: from the default study's runs R1 + R2 it put
  r_N at B = 256 at 1.28 where the update-aligned N* gives 1.33.) The first evaluation's
  responses when it already meets the target; ``None``, "not reached", when no
  evaluation does. ``crossing="linear"`` (a run config's ``target_crossing``; sweeps
  written before that field read as it) keeps the interpolated point itself.
- ``T``: training seconds when the run had consumed N* responses, interpolated on the
  update lines (every update records its cumulative responses and time, so this grid is
  exact at each update; the evaluation grid would spread a slow stretch of updates
  over a whole validation interval). ``updates_to_target``: actor updates at N*, on the
  same grid. ``q = N* / T``; a run that does not reach the target has ``T = None`` and q
  is its throughput over the whole run (final responses / final training time on the
  update lines).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from rl_batch import artifacts

# How N* is read off the evaluations (module docstring): at the update that realizes the
# interpolated crossing, or at the interpolated point itself.
CROSSINGS = ("update", "linear")


def first_crossing(x: Sequence[float], y: Sequence[float], target: float) -> float | None:
    """Interpolated x where y first reaches ``target``.

    Args:
      x: [E] increasing positions (retained responses at each evaluation).
      y: [E] values (accuracy at each evaluation).
      target: the level to reach (``y >= target`` counts as reached).

    Returns:
      x at the first crossing, linear between the bracketing points; ``x[0]`` when the
      first point already meets the target; ``None`` when no point does.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    hits = np.nonzero(y >= target)[0]
    if hits.size == 0:
        return None
    i = int(hits[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    # y0 < target <= y1, so y1 > y0.
    return float(x0 + (target - y0) * (x1 - x0) / (y1 - y0))


def update_crossing(n_cross: float | None, responses: np.ndarray) -> float | None:
    """The first update's retained responses at or after an interpolated crossing.

    Args:
      n_cross: the interpolated crossing (`first_crossing`), or ``None``.
      responses: [U] retained responses after each update (non-decreasing).

    Returns:
      ``responses[k]`` for the first ``k`` with ``responses[k] >= n_cross`` (a crossing at
      or before zero responses stays where it is); ``n_cross`` itself when no update
      reaches it (a run without update lines); ``None`` when ``n_cross`` is.
    """
    if n_cross is None or n_cross <= 0:
        return n_cross
    # (A relative tolerance: an interpolated point that lands on an update up to float
    # rounding is that update.)
    k = int(np.searchsorted(responses, n_cross * (1 - 1e-12), side="left"))
    return float(responses[k]) if k < len(responses) else float(n_cross)


def interp_first(xq: float, xp: np.ndarray, fp: np.ndarray) -> float:
    """Linear interpolation of f at ``xq`` on a non-decreasing ``xp``.

    Uses the first segment that reaches ``xq``, so repeated x values (an update whose
    responses were all filtered out still costs time) are handled: the value is taken
    where x first reaches ``xq``. Outside the data it clamps to the end values.

    Args:
      xq: query position.
      xp: [K] non-decreasing positions.
      fp: [K] values.

    Returns:
      The interpolated value.
    """
    k = int(np.searchsorted(xp, xq, side="left"))
    if k == 0:
        return float(fp[0])
    if k >= len(xp):
        return float(fp[-1])
    x0, x1 = xp[k - 1], xp[k]
    if x1 == x0:
        return float(fp[k])
    return float(fp[k - 1] + (xq - x0) * (fp[k] - fp[k - 1]) / (x1 - x0))


def _as_float(v: Any) -> float:
    if v is None or isinstance(v, str):
        return float("nan")
    return float(v)


@dataclasses.dataclass(frozen=True)
class ActorAxes:
    """A run's metric lines reduced to arrays on the actor axis.

    Attributes:
      warmup: critic warm-up update lines (set aside), file order.
      updates: actor update lines, file order.
      evals: evaluation lines on the actor axis, sorted by responses.
      responses: [U] retained responses after each actor update (shifted axis).
      time_train: [U] training seconds after each actor update (shifted axis).
      updates_done: [U] actor updates done after each update line (1, 2, ...).
      eval_responses: [E] retained responses at each evaluation (shifted axis).
      eval_accuracy: [E] mean@k validation accuracy at each evaluation.
    """

    warmup: tuple[dict[str, Any], ...]
    updates: tuple[dict[str, Any], ...]
    evals: tuple[dict[str, Any], ...]
    responses: np.ndarray
    time_train: np.ndarray
    updates_done: np.ndarray
    eval_responses: np.ndarray
    eval_accuracy: np.ndarray


def split_records(records: Iterable[dict[str, Any]]) -> tuple[list, list, list]:
    """Splits metric lines into (warm-up updates, actor updates, evals)."""
    warm, actor, evals = [], [], []
    for r in records:
        kind = r.get("kind")
        if kind == "eval" or (kind is None and "eval_accuracy" in r):
            evals.append(r)
        elif kind == "update" or kind is None:
            (warm if r.get("phase") == artifacts.PHASE_CRITIC_WARMUP else actor).append(r)
    return warm, actor, evals


def actor_axes(records: Iterable[dict[str, Any]]) -> ActorAxes:
    """The actor axes of a run's metric lines (``metrics.jsonl`` order)."""
    warm, actor, evals = split_records(records)
    # Offsets that make the axes start at the first actor update (PPO critic warm-up).
    off_n = off_t = 0.0
    if warm:
        off_n = float(np.nan_to_num(_as_float(warm[-1].get("responses_cum"))))
        off_t = float(np.nan_to_num(_as_float(warm[-1].get("time_train_cum_s"))))
        if actor and _as_float(actor[0].get("responses_cum")) < off_n:
            off_n = 0.0  # The run loop already starts the counter at the actor.
        if actor and _as_float(actor[0].get("time_train_cum_s")) < off_t:
            off_t = 0.0

    if actor:
        responses = np.array([_as_float(r.get("responses_cum")) for r in actor]) - off_n
        time_train = np.array([_as_float(r.get("time_train_cum_s")) for r in actor]) - off_t
        steps = [r.get("step") for r in actor]
        if all(s is not None for s in steps):
            # Counts updates whether the run numbers steps from 0 or from 1.
            updates_done = np.array(steps, dtype=np.float64) - float(steps[0]) + 1.0
        else:
            updates_done = np.arange(1, len(actor) + 1, dtype=np.float64)
    else:
        # No update lines: fall back on the counters carried by the eval lines.
        ev = sorted(evals, key=lambda r: _as_float(r.get("responses_cum")))
        responses = np.array([_as_float(r.get("responses_cum")) for r in ev]) - off_n
        time_train = np.array([_as_float(r.get("time_train_cum_s")) for r in ev]) - off_t
        updates_done = np.array([_as_float(r.get("step")) for r in ev])

    evals = sorted(evals, key=lambda r: _as_float(r.get("responses_cum")))
    ev_n = np.array([_as_float(r.get("responses_cum")) for r in evals]) - off_n
    ev_acc = np.array([_as_float(r.get("eval_accuracy")) for r in evals])
    keep = ev_n >= 0
    before = np.nonzero(~keep)[0]
    if before.size and not np.any(ev_n == 0):
        # The actor is unchanged during the warm-up: its last eval is the start point.
        keep[before[-1]] = True
        ev_n[before[-1]] = 0.0
    ok = keep & np.isfinite(ev_n) & np.isfinite(ev_acc)
    return ActorAxes(
        warmup=tuple(warm),
        updates=tuple(actor),
        evals=tuple(r for r, k in zip(evals, ok) if k),
        responses=responses,
        time_train=time_train,
        updates_done=updates_done,
        eval_responses=ev_n[ok],
        eval_accuracy=ev_acc[ok],
    )


@dataclasses.dataclass(frozen=True)
class Reach:
    """N*, T, q and updates-to-target of one run (``None`` where not reached)."""

    n_star: float | None
    time_to_target_s: float | None
    q: float | None
    updates_to_target: float | None
    responses_final: float  # retained responses at the last actor update
    time_train_final: float  # training seconds at the last actor update

    @property
    def reached(self) -> bool:
        return self.n_star is not None


def time_to_target(
    *,
    eval_responses: np.ndarray,
    eval_accuracy: np.ndarray,
    responses: np.ndarray,
    time_train: np.ndarray,
    updates_done: np.ndarray,
    target: float,
    crossing: str = "update",
) -> Reach:
    """N*, T, q and updates-to-target from a run's actor axes (see the module docstring).

    Args:
      eval_responses: [E] retained responses at each evaluation.
      eval_accuracy: [E] validation accuracy at each evaluation.
      responses: [U] retained responses after each actor update.
      time_train: [U] training seconds after each actor update.
      updates_done: [U] actor updates done after each update.
      target: validation accuracy to reach.
      crossing: one of `CROSSINGS`: N* at the update that realizes the interpolated
        crossing (``"update"``) or at the interpolated point (``"linear"``).

    Returns:
      The run's ``Reach``.

    Raises:
      ValueError: ``crossing`` is not one of `CROSSINGS`.
    """
    if crossing not in CROSSINGS:
        raise ValueError(f"target_crossing={crossing!r}: expected one of {CROSSINGS}")
    n_final = float(responses[-1]) if len(responses) else 0.0
    t_final = float(time_train[-1]) if len(time_train) else 0.0
    q_run = n_final / t_final if t_final > 0 else None
    n_star = first_crossing(eval_responses, eval_accuracy, target)
    if crossing == "update":
        n_star = update_crossing(n_star, responses)
    if n_star is None:
        return Reach(None, None, q_run, None, n_final, t_final)
    # Axes start at (0 responses, 0 s, 0 updates).
    xp = np.concatenate([[0.0], responses])
    t_star = interp_first(n_star, xp, np.concatenate([[0.0], time_train]))
    u_star = interp_first(n_star, xp, np.concatenate([[0.0], updates_done]))
    q = n_star / t_star if t_star > 0 else q_run
    return Reach(n_star, t_star, q, u_star, n_final, t_final)


BAND_LEVELS = 9  # accuracy levels of a target band, evenly spaced, both edges included


def band_levels(target: float, band_lo: float | None, n: int = BAND_LEVELS) -> np.ndarray:
    """The accuracy levels of the band ``[band_lo, target]`` (just ``[target]`` without one).

    Raises:
      ValueError: ``band_lo`` is not below the target.
    """
    if band_lo is None:
        return np.array([float(target)])
    if not band_lo < target:
        raise ValueError(f"target band lower edge {band_lo} must be below the target {target}")
    return np.linspace(float(band_lo), float(target), n)


def time_to_band(
    *,
    eval_responses: np.ndarray,
    eval_accuracy: np.ndarray,
    responses: np.ndarray,
    time_train: np.ndarray,
    updates_done: np.ndarray,
    levels: Sequence[float],
    crossing: str = "update",
) -> Reach:
    """`time_to_target` over a band of accuracy levels: the whole-curve estimator.

    N*, T and updates are the geometric means over ``levels`` of each level's
    `time_to_target` values, so the ratio of two runs' band N* is the mean horizontal
    distance between their learning curves on a log-responses axis across the band
    (a single level's crossing, as N* at the target, rides on one stretch of a noisy
    curve). ``q = N* / T`` of those means. The band is reached when every level is;
    otherwise N*, T and updates are ``None`` and q is the whole run's throughput.
    """
    reaches = [
        time_to_target(
            eval_responses=eval_responses,
            eval_accuracy=eval_accuracy,
            responses=responses,
            time_train=time_train,
            updates_done=updates_done,
            target=float(a),
            crossing=crossing,
        )
        for a in levels
    ]
    last = reaches[-1]
    if len(reaches) == 1 or not all(r.reached for r in reaches):
        return last

    def gmean(name: str) -> float:
        v = np.array([getattr(r, name) for r in reaches], float)
        return float(np.exp(np.mean(np.log(np.maximum(v, 1e-12)))))

    n_star, t_star = gmean("n_star"), gmean("time_to_target_s")
    q = n_star / t_star if t_star > 0 else last.q
    return Reach(
        n_star, t_star, q, gmean("updates_to_target"), last.responses_final, last.time_train_final
    )


def reach_of_records(
    records: Iterable[dict[str, Any]],
    target: float,
    band_lo: float | None = None,
    crossing: str = "update",
) -> Reach:
    """``time_to_target`` (with ``band_lo``: ``time_to_band`` over ``[band_lo, target]``)
    of a run's metric lines (``metrics.jsonl`` order), N* read by ``crossing``."""
    axes = actor_axes(records)
    return time_to_band(
        eval_responses=axes.eval_responses,
        eval_accuracy=axes.eval_accuracy,
        responses=axes.responses,
        time_train=axes.time_train,
        updates_done=axes.updates_done,
        levels=band_levels(target, band_lo),
        crossing=crossing,
    )
