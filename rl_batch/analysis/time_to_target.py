"""Time-to-target: N*, q, T per run, seed means with bootstrap CIs, ratios to a reference.

Definitions (the measurement protocol):

- ``N*``: retained responses when validation accuracy first reaches the target, linearly
  interpolated between the two evaluations that bracket the first crossing. When the
  first evaluation already meets the target, N* is that evaluation's responses. A run
  that never crosses has ``N* = None`` ("not reached" in tables), never a number.
- ``T``: training seconds (generation + scoring + update + idle; no eval, no compile)
  at N*, interpolated on the update lines (``rl_batch.targets``, the one definition that
  ``summary.json`` and ``experiments.train`` use too). ``q = N* / T`` (responses per second up to
  the target); for a run that does not reach the target, q is its throughput over the
  whole run and T is ``None``.
- ``updates_to_target``: actor updates done at N*, interpolated the same way.

Per configuration (seeds): the mean and an interval (``method="t"``, the default: Student's
t for means and a log-scale delta-method t interval for ratios, `rl_batch.analysis.intervals`,
meaningful at 3-5 seeds; ``method="bootstrap"``: a percentile bootstrap over seeds, for
many seeds); with fewer than two seeds there is no interval (``lo``/``hi`` are NaN,
printed "1 seed, no CI"), never a zero-width one. Every seed that did not fail counts,
finished or not. A configuration's N*, T and updates are reported only when *every* seed
reached the target (a mean over the seeds that happened to reach it would be biased low): a
finished seed that never reached makes the configuration "not reached"; a seed still
running (or of unknown status) that has not reached yet makes it "incomplete" until it
reaches or finishes.

Ratios against a reference configuration: ``r_N = mean N*(B) / mean N*(B_ref)``,
``r_q = mean q(B) / mean q(B_ref)``, ``T/T_ref = r_N / r_q`` (equal to the ratio of
times for single seeds), ``r_updates`` (ideal ``B_ref / B``, e.g. 0.5 at twice the
batch). Both methods treat the two configurations' seeds as independent samples and
keep each run's (N*, q) together. The exception is a matched pair (`matched_pair`: the
same seeds, and one seed draws the same prompts with the same random numbers in both,
i.e. common random numbers: every two configurations with ``rollout_keys="prompt"``, or
two of one shape P x G with per-rollout keys, such as fixed against sqrt LR at one
batch). Such pairs are compared seed by seed (``ratio_estimate(..., paired=True)``),
which removes the noise the two runs share.

Length: over 800 lines because the measurement protocol is one unit: per run (N*, T, q),
per configuration (every seed reached, untimed, incomplete), the ratios and their
intervals, and the `Analysis` every other analysis module reads.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rl_batch import artifacts, targets
from rl_batch.analysis import intervals, memo
from rl_batch.analysis.curves import RunData, Sweep, group_runs
from rl_batch.artifacts import Configuration

NOT_REACHED = artifacts.NOT_REACHED
INCOMPLETE = "incomplete"
# What a missing q, T, r_q or T/T_ref reads when the runs logged no training time (runs
# imported from a framework that keeps none): the analysis is N* and r_N only.
NO_TIMING = "no timing"

log = logging.getLogger(__name__)

DEFAULT_N_BOOT = 2000
DEFAULT_LEVEL = 0.95
DEFAULT_SEED = 0
INTERVAL_METHODS = ("t", "bootstrap")
DEFAULT_METHOD = "t"
# Two configurations whose T ratio is shown inside 1 +- DEFAULT_DELTA are equivalent
# (the sweep's `sweep.equivalence_delta`; rl_batch.analysis.equivalence).
DEFAULT_DELTA = artifacts.DEFAULT_EQUIVALENCE_DELTA
check_delta = artifacts.check_equivalence_delta


def sweep_delta(sweep: Sweep) -> float:
    """The equivalence margin a sweep was run with (its grid's ``equivalence_delta``, as
    sweep.json records the grid), `DEFAULT_DELTA` when it names none (e.g. imported runs)."""
    grid = sweep.raw.get("grid") if isinstance(sweep.raw, dict) else None
    value = grid.get("equivalence_delta") if isinstance(grid, dict) else None
    return DEFAULT_DELTA if value is None else value


def check_method(method: str) -> str:
    """``method`` when it is one of `INTERVAL_METHODS`, else a ValueError naming them."""
    if method not in INTERVAL_METHODS:
        raise ValueError(f"interval method must be one of {INTERVAL_METHODS}, got {method!r}")
    return method


# The one definition of N*, T and q lives below the analysis (summary.json uses it too).
first_crossing = targets.first_crossing
update_crossing = targets.update_crossing
interp_first = targets.interp_first


@dataclasses.dataclass(frozen=True)
class RunTarget:
    """Time-to-target of one run (``None`` fields mean "not reached")."""

    name: str
    key: Configuration
    seed: int | None
    target: float
    n_star: float | None
    time_to_target_s: float | None
    q: float | None
    updates_to_target: float | None
    responses_final: float
    time_train_s: float
    finished: bool = True
    # With a calibration (``rl_batch.sweeps.calibrate``), ``time_to_target_s`` and ``q`` are the
    # calibrated ones and these keep the run's own measurement.
    time_measured_s: float | None = None
    q_measured: float | None = None
    calibrated: bool = False
    rollout_keys: str = "rollout"  # how its rollouts drew their keys (config rollout_keys)

    @property
    def reached(self) -> bool:
        return self.n_star is not None

    @property
    def pending(self) -> bool:
        """Still running (or of unknown status) and not at the target yet: undecided."""
        return not self.reached and not self.finished


FINISHED_STATUSES = ("finished", "pilot")


def calibrated_seconds(step_s: float | np.ndarray, updates: Any) -> Any:
    """Calibrated training seconds of the first ``updates`` updates (fractional: the
    last one in part; a float, or an array of counts): ``updates x step_s``, or with
    per-update step times [U] (a batch schedule's), their running sum interpolated at
    ``updates``."""
    if np.ndim(step_s) == 0:
        out = np.asarray(updates, dtype=np.float64) * float(step_s)
    else:
        cum = np.concatenate([[0.0], np.cumsum(step_s)])  # [U + 1]
        out = np.interp(updates, np.arange(cum.size), cum)
    return float(out) if np.ndim(out) == 0 else out


def update_step_times(
    run: RunData, step_s: float, per_prompts: dict[int, list[float]] | None
) -> float | np.ndarray:
    """Calibrated seconds of each of a run's updates: its configuration's step time, or,
    for a batch schedule timed at each P (``per_prompts``: P -> seconds per calibration
    round), [U] the median step time of the P each update had (its update line's
    ``prompts``). A P the calibration did not time: the configuration's step time, with
    a warning."""
    if not per_prompts:
        return step_s
    medians = {p: float(np.median(v)) for p, v in per_prompts.items()}
    prompts = [int(r.get("prompts", -1)) for r in run.update_records]
    missing = sorted(set(prompts) - set(medians))
    if missing:
        log.warning("%s: no calibrated step time at P = %s; uses the configuration's", run.name,
                    missing)  # fmt: skip
        return step_s
    return np.array([medians[p] for p in prompts])


def schedule_step_rounds(
    runs: Sequence[RunData], targets: dict[str, RunTarget], per_prompts: dict[int, list[float]]
) -> list[float]:
    """A scheduled configuration's effective step seconds in each calibration round: the
    step times of its P values weighted by the share of updates its runs made at each P
    up to the target (all their updates where no run reached)."""
    reached = [(r, targets[r.name]) for r in runs if r.name in targets]
    spans = [(r, t.updates_to_target) for r, t in reached if t.reached] or [
        (r, float(len(r.update_records))) for r in runs
    ]
    weights: dict[int, float] = {}  # P -> updates made at it (the last one in part)
    for run, u in spans:
        for i, r in enumerate(run.update_records[: math.ceil(u)]):
            p = int(r.get("prompts", -1))
            weights[p] = weights.get(p, 0.0) + min(1.0, u - i)
    total = sum(w for p, w in weights.items() if p in per_prompts)
    n = len(next(iter(per_prompts.values())))
    if total <= 0:
        return [float(np.mean([v[r] for v in per_prompts.values()])) for r in range(n)]
    return [
        sum(w * per_prompts[p][r] for p, w in weights.items() if p in per_prompts) / total
        for r in range(n)
    ]


@memo.by_content(max_bytes=64 << 20)
def band_reach(
    eval_responses: np.ndarray,
    eval_accuracy: np.ndarray,
    responses: np.ndarray,
    time_train: np.ndarray,
    updates_done: np.ndarray,
    levels: np.ndarray,
    crossing: str,
) -> targets.Reach:
    """`targets.time_to_band` of a run's axes, remembered by their content
    (`memo.by_content`): a report's seed resamples (`rl_batch.analysis.stability`) analyse
    the same runs some hundred times over, each time as a new `RunData` holding the same
    arrays (a D9 sweep's 96 runs hold 100 kB of them). ``Reach`` is immutable."""
    return targets.time_to_band(
        eval_responses=eval_responses,
        eval_accuracy=eval_accuracy,
        responses=responses,
        time_train=time_train,
        updates_done=updates_done,
        levels=levels,
        crossing=crossing,
    )


def run_time_to_target(
    run: RunData,
    target: float,
    band_lo: float | None = None,
    step_s: float | np.ndarray | None = None,
    crossing: str = "update",
) -> RunTarget:
    """Computes N*, T, q and updates-to-target of one run.

    Args:
      run: the run.
      target: validation accuracy target.
      band_lo: with a value, the whole-curve estimator over ``[band_lo, target]``
        (``targets.time_to_band``) instead of the single target.
      step_s: the configuration's calibrated seconds per training step: T becomes
        ``updates_to_target x step_s`` and q follows (the measured ones are kept); [U]
        per update (a batch schedule's, `update_step_times`): their running sum.
      crossing: how N* is read off the evaluations (`targets.CROSSINGS`).

    Returns:
      The run's ``RunTarget`` (``finished`` is False unless the status is ``finished``
      or ``pilot``).
    """
    finished = run.status in FINISHED_STATUSES
    r = band_reach(
        run.eval_responses,
        run.eval_accuracy,
        run.responses,
        run.time_train,
        run.updates_done,
        targets.band_levels(target, band_lo),
        crossing,
    )
    t, q = r.time_to_target_s, r.q
    if step_s is not None:
        updates_final = float(run.updates_done[-1]) if len(run.updates_done) else 0.0
        if r.reached:
            t = calibrated_seconds(step_s, r.updates_to_target)
            q = r.n_star / t if t > 0 else None
        else:
            total = calibrated_seconds(step_s, updates_final)
            q = r.responses_final / total if updates_final > 0 else None
    return RunTarget(
        run.name,
        run.key,
        run.seed,
        target,
        r.n_star,
        t,
        q,
        r.updates_to_target,
        r.responses_final,
        r.time_train_final,
        finished,
        r.time_to_target_s,
        r.q,
        step_s is not None,
        run.config.get("rollout_keys", "rollout"),
    )


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A mean over seeds (or a ratio) with its confidence interval.

    ``lo`` and ``hi`` are NaN when there is no interval (fewer than two seeds in a
    sample, or no finite bootstrap replicate). ``n`` is the number of seeds (of the
    first sample, for a ratio). ``exact`` marks a value that is not estimated (the
    reference's ratio to itself, 1 by definition): printed ``1 (reference)``. ``paired``
    marks a ratio whose interval treats the two configurations' seeds as matched pairs
    (`matched_pair`).
    """

    mean: float
    lo: float
    hi: float
    n: int
    exact: bool = False
    paired: bool = False

    @property
    def has_interval(self) -> bool:
        """Whether ``lo`` and ``hi`` are a real interval (both finite)."""
        return bool(np.isfinite(self.lo) and np.isfinite(self.hi))

    def fmt(self, spec: str = ".3g") -> str:
        """E.g. ``1.23 [1.10, 1.35]``; without an interval ``1234 (1 seed, no CI)`` (or
        ``(no CI)`` when the single seed is on the other side of a ratio)."""
        if self.exact:
            return f"{self.mean:{spec}} (reference)"
        if self.has_interval:
            return f"{self.mean:{spec}} [{self.lo:{spec}}, {self.hi:{spec}}]"
        if self.n < 2:
            return f"{self.mean:{spec}} ({self.n} seed{'' if self.n == 1 else 's'}, no CI)"
        return f"{self.mean:{spec}} (no CI)"

    def to_json(self) -> dict[str, float | None]:
        """``{"mean", "lo", "hi", "n"}``; ``lo``/``hi`` are null without an interval."""
        lo, hi = (self.lo, self.hi) if self.has_interval else (None, None)
        return {"mean": self.mean, "lo": lo, "hi": hi, "n": self.n}


def fmt_estimate(e: Estimate | None, spec: str = ".3g", missing: str = NOT_REACHED) -> str:
    """Formats an estimate, or ``missing`` (default "not reached") when it is ``None``."""
    return missing if e is None else e.fmt(spec)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """The lines of a markdown table (cells formatted with ``str``)."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def bootstrap(
    samples: Sequence[np.ndarray],
    statistic: Callable[[list[np.ndarray]], np.ndarray],
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> Estimate:
    """Percentile bootstrap of a statistic of one or more independent samples.

    Args:
      samples: arrays [n_i, ...]; each is resampled (rows with replacement) on its own.
      statistic: maps a list of arrays [R, n_i, ...] (R replicates) to [R] values.
      n_boot: bootstrap replicates.
      level: interval coverage (0.95 gives the 2.5th and 97.5th percentiles).
      seed: rng seed (fixed, so reports are reproducible).

    Returns:
      ``Estimate`` with the statistic on the original samples and the interval; the
      interval is NaN (unavailable) when any sample has fewer than two rows, since
      resampling one value cannot show its spread.
    """
    samples = [np.asarray(s, dtype=np.float64) for s in samples]
    for s in samples:
        if len(s) == 0:
            raise ValueError("bootstrap: empty sample")
    point = float(statistic([s[None] for s in samples])[0])
    if min(len(s) for s in samples) < 2:
        return Estimate(point, float("nan"), float("nan"), len(samples[0]))
    rng = np.random.default_rng(seed)
    boot = [s[rng.integers(0, len(s), size=(n_boot, len(s)))] for s in samples]
    with np.errstate(divide="ignore", invalid="ignore"):
        dist = np.asarray(statistic(boot), dtype=np.float64)
    dist = dist[np.isfinite(dist)]
    if dist.size == 0:
        return Estimate(point, float("nan"), float("nan"), len(samples[0]))
    alpha = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(dist, [alpha, 100.0 - alpha])
    return Estimate(point, float(lo), float(hi), len(samples[0]))


def bootstrap_mean(
    values: Sequence[float],
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
) -> Estimate:
    """Mean of ``values`` with a percentile bootstrap interval."""
    return bootstrap([np.asarray(values)], lambda s: s[0].mean(axis=1), n_boot, level, seed)


def mean_estimate(
    values: Sequence[float],
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
    method: str = DEFAULT_METHOD,
) -> Estimate:
    """Mean of ``values`` with a t (default) or percentile bootstrap interval."""
    if check_method(method) == "bootstrap":
        return bootstrap_mean(values, n_boot, level, seed)
    return Estimate(*intervals.t_mean(values, level), len(values))


def ratio_estimate(
    a: Sequence,
    ref: Sequence,
    weights: Sequence[float],
    n_boot,
    level,
    seed,
    method,
    paired: bool = False,
    timing: intervals.Timing | None = None,
) -> Estimate:
    """``prod_j (mean a_j / mean ref_j)^w_j`` over seeds; a, ref are [n, d] (or [n]).

    ``paired``: row i of ``a`` and of ``ref`` ran the same seed with shared randomness
    (`matched_pair`); the t interval is then `intervals.t_log_ratio_paired`, the bootstrap
    resamples seeds, each with both of its rows. ``timing``: the log step-time ratio of
    the two configurations per calibration round (`StepRounds.timing`), for a ratio that
    holds calibrated step times (t intervals add its parts; the bootstrap carries seed
    noise only).
    """
    a2 = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    r2 = np.asarray(ref, dtype=np.float64).reshape(len(ref), -1)
    w = np.asarray(weights, dtype=np.float64)
    if check_method(method) == "t":
        fn = intervals.t_log_ratio_paired if paired else intervals.t_log_ratio
        e = Estimate(*fn(a2, r2, weights, level, timing), len(a2))
        return dataclasses.replace(e, paired=paired)
    if paired:
        d = a2.shape[1]

        def statistic_paired(s):  # [R, n, 2d] replicates -> [R]
            m = s[0].mean(axis=1)
            return np.prod((m[:, :d] / m[:, d:]) ** w, axis=-1)

        e = bootstrap([np.concatenate([a2, r2], axis=1)], statistic_paired, n_boot, level, seed)
        return dataclasses.replace(e, paired=True)

    def statistic(s):  # [R, n, d] replicates -> [R]
        return np.prod((s[0].mean(axis=1) / s[1].mean(axis=1)) ** w, axis=-1)

    return bootstrap([a2, r2], statistic, n_boot, level, seed)


def by_seed(runs: Sequence[RunTarget]) -> list[RunTarget]:
    """``runs`` in seed order (the row order of a matched pair; unknown seeds last)."""
    return sorted(runs, key=lambda r: (r.seed is None, r.seed or 0))


def matched_pair(a: Sequence[RunTarget], b: Sequence[RunTarget]) -> bool:
    """Whether two configurations' runs form matched pairs by seed (common random
    numbers): the same seeds, and one seed's runs draw the same random numbers for the
    same prompt in both. With ``rollout_keys="prompt"`` every run keys each response by its
    prompt's position in the training stream and its member index
    (``rollout_source.prompt_row_keys``), so any two configurations match. With
    ``"rollout"`` (rollout i keyed ``fold_in(seed key, i)``) only configurations of one
    shape P x G do (those that differ in the learning rule alone, e.g. fixed against sqrt
    LR); others share only the data order and are compared as independent samples."""
    seeds_a, seeds_b = [r.seed for r in a], [r.seed for r in b]
    if not a or None in seeds_a or None in seeds_b or len(set(seeds_a)) != len(seeds_a):
        return False
    if sorted(seeds_a) != sorted(seeds_b):
        return False
    if all(r.rollout_keys == "prompt" for r in (*a, *b)):
        return True
    shapes = {(r.key.prompts, r.key.group_size) for r in (*a, *b)}
    return len(shapes) == 1 and all(r.rollout_keys == "rollout" for r in (*a, *b))


@dataclasses.dataclass(frozen=True)
class ConfigStats:
    """Seed statistics of one configuration.

    ``runs`` holds every seed that did not fail, finished or not. ``n_star``,
    ``time_to_target_s`` and ``updates_to_target`` are ``None`` unless every seed
    reached the target: ``incomplete`` when a seed is still running without having
    reached it, else "not reached". ``q`` uses every seed (throughput to the target, or
    over the run so far for seeds that did not reach it); ``q`` and ``time_to_target_s``
    are ``None`` when any seed logged no training time (the configuration is untimed).
    """

    key: Configuration
    runs: tuple[RunTarget, ...]
    n_star: Estimate | None
    q: Estimate | None
    time_to_target_s: Estimate | None
    updates_to_target: Estimate | None

    @property
    def n_seeds(self) -> int:
        return len(self.runs)

    @property
    def n_reached(self) -> int:
        return sum(r.reached for r in self.runs)

    @property
    def n_pending(self) -> int:
        """Seeds still running (or of unknown status) that have not reached yet."""
        return sum(r.pending for r in self.runs)

    @property
    def reached(self) -> bool:
        return self.n_seeds > 0 and self.n_reached == self.n_seeds

    @property
    def incomplete(self) -> bool:
        """Not every seed reached, and some seed still might: N*, T are withheld."""
        return self.n_pending > 0

    @property
    def missing_label(self) -> str:
        """What a withheld N*/T reads: ``incomplete`` or "not reached"."""
        return INCOMPLETE if self.incomplete else NOT_REACHED

    @property
    def time_missing_label(self) -> str:
        """What a missing T reads: `NO_TIMING` when the runs logged no time, else
        `missing_label`."""
        return NO_TIMING if self.q is None else self.missing_label


def config_stats(
    runs: Sequence[RunTarget],
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
    method: str = DEFAULT_METHOD,
) -> ConfigStats:
    """Mean and interval of N*, q, T and updates over the seeds of one configuration."""
    if not runs:
        raise ValueError("config_stats: no runs")
    key = runs[0].key

    def boot(v):
        return mean_estimate(v, n_boot, level, seed, method)

    # One untimed seed makes the configuration untimed (N* and r_N only): a q or T over
    # the timed seeds alone would rank it on a subset the other configurations do not share.
    qs = [r.q for r in runs]
    q = boot(qs) if all(v is not None and np.isfinite(v) for v in qs) else None
    if not all(r.reached for r in runs):
        return ConfigStats(key, tuple(runs), None, q, None, None)
    ts = [r.time_to_target_s for r in runs]
    timed = q is not None and all(t is not None and np.isfinite(t) for t in ts)

    return ConfigStats(
        key=key,
        runs=tuple(runs),
        n_star=boot([r.n_star for r in runs]),
        q=q,
        time_to_target_s=boot(ts) if timed else None,
        updates_to_target=boot([r.updates_to_target for r in runs]),
    )


@dataclasses.dataclass(frozen=True)
class Ratios:
    """Ratios of a configuration against the reference (``None``: not reached).

    ``incomplete``: a missing r_N (T, updates) waits for seeds still running, of this
    configuration or (when this one reached) of the reference: shown "incomplete"
    rather than "not reached".
    """

    key: Configuration
    reference: Configuration
    r_n: Estimate | None
    r_q: Estimate | None
    r_t: Estimate | None
    r_updates: Estimate | None
    incomplete: bool = False

    @property
    def missing_label(self) -> str:
        """What a missing r_N/T/updates ratio reads: ``incomplete`` or "not reached"."""
        return INCOMPLETE if self.incomplete else NOT_REACHED

    @property
    def time_missing_label(self) -> str:
        """What a missing T/T_ref reads: `NO_TIMING` when r_N is there but r_q is not."""
        return NO_TIMING if self.r_n is not None and self.r_q is None else self.missing_label

    @property
    def ideal_updates(self) -> float:
        """Updates ratio under perfect batch-size invariance, ``B_ref / B``."""
        return self.reference.batch / self.key.batch


def ratio_estimates(
    n_a: Sequence[float] | None,
    q_a: Sequence[float] | None,
    n_ref: Sequence[float] | None,
    q_ref: Sequence[float] | None,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
    method: str = DEFAULT_METHOD,
    timing: intervals.Timing | None = None,
    paired: bool = False,
) -> tuple[Estimate | None, Estimate | None, Estimate | None]:
    """``(r_N, r_q, r_N / r_q)`` of configuration a against the reference.

    Args:
      n_a, q_a: per-seed N* and q of configuration a (paired by seed; ``None``/empty
        when unavailable).
      n_ref, q_ref: the same for the reference.
      n_boot, level, seed: bootstrap settings (``method="bootstrap"``).
      method: ``t`` (default) or ``bootstrap`` (see the module docstring).
      timing: with calibrated q, ``log(step_a / step_ref)`` per calibration round
        (`StepRounds.timing`); r_q and r_N / r_q then carry the step times' noise too
        (``ratio_estimate``).
      paired: row i of a and of the reference ran the same seed with common random
        numbers (`matched_pair`; the rows sorted by seed): seed-by-seed intervals.

    Returns:
      The three ratios with intervals; an entry is ``None`` when its inputs are missing.
    """

    def ok(v):
        return v is not None and len(v) > 0

    def ratio(a, ref, weights, timed=False):
        t = timing if timed else None
        return ratio_estimate(a, ref, weights, n_boot, level, seed, method, paired, t)

    r_n = ratio(n_a, n_ref, [1.0]) if ok(n_a) and ok(n_ref) else None
    r_q = ratio(q_a, q_ref, [1.0], timed=True) if ok(q_a) and ok(q_ref) else None
    r_t = None
    if ok(n_a) and ok(n_ref) and ok(q_a) and ok(q_ref) and len(n_a) == len(q_a):
        a_k2 = np.stack([np.asarray(n_a, float), np.asarray(q_a, float)], axis=1)  # [n_a, 2]
        r_k2 = np.stack([np.asarray(n_ref, float), np.asarray(q_ref, float)], axis=1)
        r_t = ratio(a_k2, r_k2, [1.0, -1.0], timed=True)
    return r_n, r_q, r_t


_ONE = Estimate(1.0, 1.0, 1.0, 0, exact=True)


def exact_one(n: int) -> Estimate:
    """The reference's ratio to itself (1 by definition, ``exact``) over ``n`` seeds."""
    return dataclasses.replace(_ONE, n=n)


def seed_values(stats: ConfigStats, name: str, paired: bool) -> list[float] | None:
    """Per-seed values of a `RunTarget` field (``n_star``, ``q``, ...) of one
    configuration, in seed order when ``paired`` (the rows of a matched pair); ``None``
    when a seed has none, or, for a field at the target (all but ``q``), when not every
    seed reached."""
    if name != "q" and not stats.reached:
        return None
    runs = by_seed(stats.runs) if paired else stats.runs
    v = [getattr(r, name) for r in runs]
    return None if any(x is None for x in v) else v


def config_ratios(
    stats: ConfigStats,
    ref: ConfigStats,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
    method: str = DEFAULT_METHOD,
    step_rounds: StepRounds | None = None,
) -> Ratios:
    """Ratios of one configuration against the reference configuration.

    ``step_rounds``: the calibrated step seconds per round (the q of both configurations
    is calibrated): r_q and T/T_ref then carry the step times' spread over rounds and the
    drift between calibration blocks (`StepRounds.timing`)."""
    if stats.key == ref.key:
        one = exact_one(stats.n_seeds)
        reached = stats.reached
        timed = stats.q is not None  # runs without logged time have no q: no r_q
        return Ratios(
            stats.key,
            ref.key,
            one if reached else None,
            one if timed else None,
            one if reached and timed else None,
            one if reached else None,
            incomplete=stats.incomplete,
        )

    paired = matched_pair(stats.runs, ref.runs)
    n_a, n_r = seed_values(stats, "n_star", paired), seed_values(ref, "n_star", paired)
    q_a, q_r = seed_values(stats, "q", paired), seed_values(ref, "q", paired)
    timing = step_time_log_ratios(step_rounds, stats.key.key, ref.key.key)
    r_n, r_q, r_t = ratio_estimates(n_a, q_a, n_r, q_r, n_boot, level, seed, method, timing, paired)
    u_a = seed_values(stats, "updates_to_target", paired)
    u_r = seed_values(ref, "updates_to_target", paired)
    r_u = None
    if u_a and u_r:
        r_u = ratio_estimate(u_a, u_r, [1.0], n_boot, level, seed, method, paired=paired)
    incomplete = stats.incomplete or (stats.reached and ref.incomplete)
    return Ratios(stats.key, ref.key, r_n, r_q, r_t, r_u, incomplete)


@dataclasses.dataclass(frozen=True)
class StepRounds:
    """A sweep's calibrated step seconds per round, and how its rounds fall into blocks.

    Attributes:
      seconds: ``"PxG:rule"`` -> step seconds in each calibration round (a schedule's: its
        P values' mixed as its runs ran, `schedule_step_rounds`).
      blocks: each round's block (``calibration.json``'s ``round_blocks``: rounds timed
        before the runs, then after them); ``None``: one block.
      drift: `intervals.block_drift` of the calibration's own configurations (None with
        one block).
    """

    seconds: dict[str, list[float]]
    blocks: tuple[int, ...] | None = None
    drift: tuple[float, float] | None = None

    @property
    def rounds(self) -> int:
        """Calibration rounds per configuration."""
        return len(next(iter(self.seconds.values()))) if self.seconds else 0

    def timing(self, key: str, ref_key: str) -> intervals.Timing | None:
        """``log(step_key / step_ref)`` in each calibration round (both timed side by side
        in one round), with the blocks and their drift; None without per-round step times
        for both."""
        if key not in self.seconds or ref_key not in self.seconds:
            return None
        a, r = self.seconds[key], self.seconds[ref_key]
        if len(a) != len(r) or not a:
            return None
        log_ratios = tuple(float(np.log(x / y)) for x, y in zip(a, r))
        blocks = self.blocks if self.blocks is not None and len(self.blocks) == len(a) else None
        return intervals.Timing(log_ratios, blocks, self.drift if blocks else None)


def step_time_log_ratios(
    step_rounds: StepRounds | None, key: str, ref_key: str
) -> intervals.Timing | None:
    """`StepRounds.timing` of two configurations (None without a calibration)."""
    return step_rounds.timing(key, ref_key) if step_rounds else None


@dataclasses.dataclass(frozen=True)
class Analysis:
    """Everything the tables, figures and planner need from one sweep.

    Attributes:
      sweep: the loaded sweep.
      target: validation accuracy target used.
      reference: the reference configuration.
      runs_by_key: runs used (every run that did not fail), grouped by configuration.
      excluded: (run name, reason) of runs left out: failed runs, and runs whose files
        cannot be read or do not add up (``curves.check_run``).
      targets: per-run time-to-target by run name.
      stats: per-configuration seed statistics.
      ratios: per-configuration ratios against ``reference``.
      n_boot, level, seed: bootstrap settings (``method="bootstrap"``).
      method: interval method, ``t`` or ``bootstrap``.
    """

    sweep: Sweep
    target: float
    reference: Configuration
    runs_by_key: dict[Configuration, list[RunData]]
    excluded: tuple[tuple[str, str], ...]
    targets: dict[str, RunTarget]
    stats: dict[Configuration, ConfigStats]
    ratios: dict[Configuration, Ratios]
    n_boot: int = DEFAULT_N_BOOT
    level: float = DEFAULT_LEVEL
    seed: int = DEFAULT_SEED
    method: str = DEFAULT_METHOD
    band_lo: float | None = None  # set: N*, T, q are band means over [band_lo, target]
    calibrated: bool = False  # T and q from the sweep's calibration.json
    crossing: str = "update"  # how N* is read off the evaluations (targets.CROSSINGS)
    step_rounds: StepRounds | None = None  # calibrated step s per round, in blocks
    # Run name -> its calibrated step seconds (a batch schedule's: [U] per update).
    run_step_s: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Equivalence margin of T ratios (planner: T(k) / T(best) within 1 +- delta).
    delta: float = DEFAULT_DELTA

    @property
    def timed(self) -> bool:
        """Whether any configuration has a q: False when no run logged training time (the
        analysis is then N* and r_N only)."""
        return any(s.q is not None for s in self.stats.values())

    def ratio(
        self, key: Configuration, reference: Configuration, level: float | None = None
    ) -> Ratios:
        """Ratios of configuration ``key`` against ``reference`` (any configuration), with
        this analysis' interval settings and calibration rounds (``level``: another
        coverage, e.g. a two-one-sided-tests 90 % or a multiplicity-adjusted one)."""
        level = self.level if level is None else level
        args = (self.n_boot, level, self.seed, self.method, self.step_rounds)
        return config_ratios(self.stats[key], self.stats[reference], *args)

    def ratios_against(self, reference: Configuration) -> dict[Configuration, Ratios]:
        """Ratios of every configuration against another reference."""
        return {k: self.ratio(k, reference) for k in self.stats}


def resolve_reference(
    reference: str | None, sweep: Sweep, keys: Sequence[Configuration]
) -> Configuration:
    """Finds the reference configuration.

    Args:
      reference: a run name, a configuration name (``grpo-P128-G8-sqrt``), label
        (``P=128 G=8 sqrt``) or grid key (``128x8:sqrt``); ``None`` uses
        ``sweep.json``'s ``reference`` and then the smallest-batch ``sqrt``
        configuration (smallest batch overall without one).
      sweep: the sweep.
      keys: configurations that have usable runs.

    Returns:
      The reference configuration key.
    """
    if not keys:
        raise ValueError(f"sweep {sweep.sweep_dir}: no usable runs{_excluded_text(sweep)}")
    for candidate in (reference, None if reference else sweep.reference):
        if not candidate:
            continue
        for k in keys:
            if candidate in (k.name, k.label, k.key):
                return k
        for r in sweep.runs:
            if r.name == candidate and r.key in keys:
                return r.key
        if candidate == reference:
            options = sorted({k.name for k in keys})
            raise ValueError(
                f"reference {reference!r} is neither a run nor a configuration of sweep "
                f"{sweep.sweep_dir}; configurations: {options}"
            )
    sqrt = [k for k in keys if k.lr_rule == "sqrt"]
    fallback = min(sqrt or list(keys), key=lambda k: (k.batch, k.group_size))
    if sweep.reference and not reference:
        log.warning(
            "sweep %s: its reference %r has no usable run; ratios are against %s instead",
            sweep.sweep_dir,
            sweep.reference,
            fallback.name,
        )
    return fallback


def _excluded_text(sweep: Sweep) -> str:
    """`` (N excluded: name (reason), ...)`` for the no-usable-runs message ("" for none)."""
    out = list(sweep.excluded) + [(r.name, run_is_usable(r)[1]) for r in sweep.runs]
    out = [(n, why) for n, why in out if why]
    if not out:
        return ""
    shown = "; ".join(f"{n} ({why})" for n, why in out[:3])
    return f" ({len(out)} excluded: {shown}{'; ...' if len(out) > 3 else ''})"


def run_is_usable(run: RunData) -> tuple[bool, str]:
    """Whether a run enters the statistics, and why not.

    Failed runs are left out (a crash says nothing about learning), and so are runs whose
    files do not add up (``run.problems``, ``curves.check_run``: e.g. a finished run whose
    metrics end at another step than its ``summary.json`` says). Every other run is
    one of its configuration's seeds, finished or not: dropping the seeds that have not
    reached the target yet would average the lucky seeds only. A run still going (or
    of unknown status, or without evaluations yet) that has not reached the target
    keeps its configuration "incomplete" (``RunTarget.pending``).
    """
    if run.status == "failed":
        return False, "failed"
    if run.problems:
        return False, "; ".join(run.problems)
    return True, ""


def analyze_sweep(
    sweep: Sweep,
    target: float | None = None,
    reference: str | None = None,
    n_boot: int = DEFAULT_N_BOOT,
    level: float = DEFAULT_LEVEL,
    seed: int = DEFAULT_SEED,
    method: str = DEFAULT_METHOD,
    band_lo: float | None | str = "sweep",
    calibrated: bool = True,
    crossing: str = "sweep",
    delta: float | str = "sweep",
) -> Analysis:
    """Time-to-target analysis of a sweep.

    Args:
      sweep: a loaded sweep (``curves.load_sweep``).
      target: validation accuracy target; ``None`` uses ``sweep.json``'s.
      reference: reference configuration (see ``resolve_reference``).
      n_boot, level, seed: bootstrap settings (``method="bootstrap"``).
      method: interval method, ``t`` (default) or ``bootstrap``.
      band_lo: lower edge of the whole-curve band (``run_time_to_target``); ``"sweep"``
        (default) takes ``sweep.json``'s ``target_band_lo``, ``None`` the single target.
      calibrated: use the sweep's calibrated step times (``calibration.json``) for T and q
        where it has them (every configuration, or none is used).
      crossing: how N* is read off the evaluations (`targets.CROSSINGS`); ``"sweep"``
        (default) takes ``sweep.json``'s ``target_crossing``.
      delta: the equivalence margin of T ratios (`Analysis.delta`); ``"sweep"`` (default)
        takes the grid's ``equivalence_delta`` in ``sweep.json`` (`DEFAULT_DELTA` without).

    Returns:
      The ``Analysis``.

    Raises:
      ValueError: no target, or a margin outside (0, 1).
    """
    check_method(method)
    if delta == "sweep":
        delta = sweep_delta(sweep)
    check_delta(delta, sweep.sweep_dir)
    if target is None:
        target = sweep.target
    if target is None:
        raise ValueError(f"sweep {sweep.sweep_dir}: no target in sweep.json; pass target=")
    if band_lo == "sweep":
        band_lo = sweep.target_band_lo
    if crossing == "sweep":
        crossing = sweep.target_crossing
    step_s = sweep.calibration if calibrated else None
    if step_s and not all(run.key.key in step_s for run in sweep.runs):
        log.warning("sweep %s: calibration.json misses configurations; not used", sweep.sweep_dir)
        step_s = None
    per_prompts = sweep.calibration_prompts if step_s else {}
    targets, used, excluded, run_step_s = {}, [], list(sweep.excluded), {}
    for run in sweep.runs:
        ok, why = run_is_usable(run)
        if ok:
            step = step_s[run.key.key] if step_s else None
            if step is not None:
                step = update_step_times(run, step, per_prompts.get(run.key.key))
                run_step_s[run.name] = step
            targets[run.name] = run_time_to_target(run, target, band_lo, step, crossing)
            used.append(run)
        else:
            excluded.append((run.name, why))
    runs_by_key = group_runs(used)
    stats = {
        k: config_stats([targets[r.name] for r in rs], n_boot, level, seed, method)
        for k, rs in runs_by_key.items()
    }
    ref_key = resolve_reference(reference, sweep, list(stats))
    ref = stats[ref_key]
    rounds = None
    if step_s and sweep.calibration_rounds:
        seconds = sweep.calibration_rounds
        blocks = sweep.calibration_blocks
        drift = intervals.block_drift(seconds, blocks) if blocks else None
        if per_prompts:  # a schedule's rounds: its P values' mixed as its runs ran
            seconds = {
                **seconds,
                **{
                    k.key: schedule_step_rounds(rs, targets, per_prompts[k.key])
                    for k, rs in runs_by_key.items()
                    if k.key in per_prompts
                },
            }
        rounds = StepRounds(seconds, blocks, drift)
    ratios = {
        k: config_ratios(s, ref, n_boot, level, seed, method, rounds) for k, s in stats.items()
    }
    return Analysis(
        sweep,
        float(target),
        ref_key,
        runs_by_key,
        tuple(excluded),
        targets,
        stats,
        ratios,
        n_boot,
        level,
        seed,
        method,
        band_lo,
        bool(step_s),
        crossing,
        rounds,
        run_step_s,
        float(delta),
    )


def reanalyze(analysis: Analysis, sweep: Sweep) -> Analysis:
    """``sweep`` (e.g. a resample or a subset of the seeds of ``analysis.sweep``) analysed
    with ``analysis``' settings (target, reference, band, crossing, interval method,
    calibration, equivalence margin)."""
    return analyze_sweep(
        sweep,
        target=analysis.target,
        reference=analysis.reference.key,
        n_boot=analysis.n_boot,
        level=analysis.level,
        seed=analysis.seed,
        method=analysis.method,
        band_lo=analysis.band_lo,
        calibrated=analysis.calibrated,
        crossing=analysis.crossing,
        delta=analysis.delta,
    )
