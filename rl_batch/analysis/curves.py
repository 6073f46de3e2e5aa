"""Loading run and sweep directories into arrays for the scaling analysis.

Reads only the files described in ``rl_batch/artifacts.py`` (numpy, no JAX). A run is
reduced to its *actor* update axis (retained responses, training seconds, updates done)
and its evaluation curve (accuracy against retained responses).

PPO critic warm-up: update lines with ``"phase": "critic_warmup"`` are set aside and the
axes are shifted so that responses, training time and updates count from the first actor
update (the study's sample axis starts when the actor starts): ``rl_batch.targets.actor_axes``,
which ``summary.json`` also uses.

Configurations: runs are grouped across seeds by ``Configuration = (algo, prompts,
group_size, lr_rule)``; the training batch is ``prompts * group_size`` responses.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from typing import Any

import numpy as np

from rl_batch import artifacts, targets
from rl_batch.artifacts import Configuration

WARMUP_PHASE = artifacts.PHASE_CRITIC_WARMUP


@dataclasses.dataclass(frozen=True)
class RunData:
    """One run, reduced to arrays on the actor axis.

    Attributes:
      name: run name (the directory name under ``<sweep>/runs``).
      run_dir: path of the run directory.
      key: the configuration the run belongs to.
      seed: the run's seed (``None`` when unknown).
      status: ``finished``, ``running``, ``failed`` or ``unknown``.
      config: the run's ``config.json`` (empty when absent).
      summary: the run's ``summary.json`` (empty when absent).
      update_records: actor update lines in file order (warm-up lines excluded).
      eval_records: eval lines sorted by responses.
      responses: [U] retained responses after each actor update (shifted axis).
      time_train: [U] training seconds after each actor update (shifted axis).
      updates_done: [U] actor updates done after each update line (1, 2, ...).
      eval_responses: [E] retained responses at each evaluation (shifted axis).
      eval_accuracy: [E] mean@k validation accuracy at each evaluation.
      warmup_updates: number of critic warm-up update lines set aside.
      warmup_records: the critic warm-up update lines.
      problems: why the run's files do not add up (`check_run`); a run with problems is
        left out of the analysis with them as its reason.
    """

    name: str
    run_dir: str
    key: Configuration
    seed: int | None
    status: str
    config: dict[str, Any]
    summary: dict[str, Any]
    update_records: tuple[dict[str, Any], ...]
    eval_records: tuple[dict[str, Any], ...]
    responses: np.ndarray
    time_train: np.ndarray
    updates_done: np.ndarray
    eval_responses: np.ndarray
    eval_accuracy: np.ndarray
    warmup_updates: int = 0
    warmup_records: tuple[dict[str, Any], ...] = ()  # PPO critic warm-up update lines
    # Why the run does not add up (``check_run``): damaged metrics; empty when whole.
    problems: tuple[str, ...] = ()

    @property
    def final_responses(self) -> float:
        """Retained responses at the last update (0 when there is none)."""
        return float(self.responses[-1]) if self.responses.size else 0.0

    @property
    def final_time_train(self) -> float:
        """Training seconds at the last update (0 when there is none)."""
        return float(self.time_train[-1]) if self.time_train.size else 0.0

    def field(self, name: str) -> np.ndarray:
        """Returns [U] float values of an update-line field, NaN where missing or null."""
        return np.array([_as_float(r.get(name)) for r in self.update_records], dtype=np.float64)

    def has_field(self, name: str) -> bool:
        """Whether any update line carries a non-null ``name``."""
        return any(r.get(name) is not None for r in self.update_records)


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A sweep directory: ``sweep.json`` plus its loaded runs."""

    sweep_dir: str
    name: str
    algo: str
    target: float | None
    reference: str | None
    budget_responses: float | None
    eval_every_responses: float | None
    runs: tuple[RunData, ...]
    raw: dict[str, Any]
    target_band_lo: float | None = None  # the whole-curve band's lower edge, if any
    # How N* is read off the evaluations (rl_batch.targets.CROSSINGS); a sweep.json
    # written before the field existed used the interpolated point ("linear").
    target_crossing: str = "linear"
    calibration: dict[str, float] | None = None  # "PxG:rule" -> calibrated step seconds
    calibration_rounds: dict[str, list[float]] | None = None  # ... per calibration round
    calibration_blocks: tuple[int, ...] | None = None  # each round's block (None: one)
    # A scheduled configuration's step seconds per round at each P it takes.
    calibration_prompts: dict[str, dict[int, list[float]]] = dataclasses.field(default_factory=dict)
    calibration_note: str | None = None  # which calibration.json (artifacts.calibration_note)
    # (run name, reason) of the run directories left out on loading: unreadable files or
    # metrics that do not add up (``check_run``); not in ``runs``.
    excluded: tuple[tuple[str, str], ...] = ()

    def run(self, name: str) -> RunData:
        """Returns the run called ``name``."""
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(f"sweep {self.sweep_dir}: no run named {name!r}")


def _as_float(v: Any) -> float:
    if v is None or isinstance(v, str):
        return float("nan")
    return float(v)


def find_config_value(tree: Any, key: str) -> Any:
    """Value of ``key`` in a nested config dict (shallowest level first; ``None`` if absent)."""
    if isinstance(tree, dict):
        if key in tree:
            return tree[key]
        for v in tree.values():
            found = find_config_value(v, key)
            if found is not None:
                return found
    return None


def _first(*values: Any) -> Any:
    for v in values:
        if v is not None:
            return v
    return None


def load_run(
    run_dir: str,
    entry: dict[str, Any] | None = None,
    algo: str | None = None,
    eval_every: float | None = None,
) -> RunData:
    """Loads one run directory and cross-checks its files (``check_run``).

    Args:
      run_dir: path of the run directory.
      entry: the run's entry in ``sweep.json`` (its prompts, group size, LR rule, seed
        and status take precedence over ``config.json``).
      algo: the sweep's algorithm, used when neither the entry nor the config names one.
      eval_every: the sweep's evaluation interval, used when ``config.json`` has none.

    Returns:
      The run as a ``RunData``; ``problems`` lists what does not add up.

    Raises:
      ValueError: a file that cannot be read as the format says (naming the file).
    """
    entry = entry or {}
    cfg_path = os.path.join(run_dir, artifacts.CONFIG_FILE)
    sum_path = os.path.join(run_dir, artifacts.SUMMARY_FILE)
    config = _read_object(cfg_path) if os.path.exists(cfg_path) else {}
    summary = _read_object(sum_path) if os.path.exists(sum_path) else {}
    records = artifacts.read_metrics(run_dir)
    for i, r in enumerate(records, start=1):
        if not isinstance(r, dict):
            raise ValueError(
                f"{os.path.join(run_dir, artifacts.METRICS_FILE)}: record {i} is not a JSON "
                f"object: {str(r)[:80]}"
            )
    axes = targets.actor_axes(records)
    actor, warm = axes.updates, axes.warmup

    first_update = actor[0] if actor else (warm[0] if warm else {})
    prompts = _first(
        entry.get("prompts"), find_config_value(config, "prompts"), first_update.get("prompts")
    )
    group = _first(
        entry.get("group_size"),
        find_config_value(config, "group_size"),
        first_update.get("group_size"),
    )
    if prompts is None or group is None:
        raise ValueError(
            f"{run_dir}: cannot tell prompts/group_size (not in sweep.json entry, "
            f"{artifacts.CONFIG_FILE} or the first update line of {artifacts.METRICS_FILE})"
        )
    key = Configuration(
        algo=str(_first(entry.get("algo"), algo, find_config_value(config, "algo"), "unknown")),
        prompts=int(prompts),
        group_size=int(group),
        lr_rule=str(_first(entry.get("lr_rule"), find_config_value(config, "lr_rule"), "unknown")),
        critic=str(_first(entry.get("critic"), artifacts.critic_variant_of(config or {}), "")),
        variant=str(_first(entry.get("variant"), artifacts.variant_of(config or {}), "")),
    )
    seed = _first(entry.get("seed"), find_config_value(config, "seed"))

    status = str(_first(entry.get("status"), summary.get("status"), "unknown"))
    every = _first(config.get("eval_every_responses"), eval_every)
    problems = check_run(records, status, summary, config, every, sum_path)
    return RunData(
        name=str(entry.get("name", os.path.basename(os.path.normpath(run_dir)))),
        run_dir=run_dir,
        key=key,
        seed=None if seed is None else int(seed),
        status=status,
        config=config,
        summary=summary,
        update_records=axes.updates,
        eval_records=axes.evals,
        responses=axes.responses,
        time_train=axes.time_train,
        updates_done=axes.updates_done,
        eval_responses=axes.eval_responses,
        eval_accuracy=axes.eval_accuracy,
        warmup_updates=len(warm),
        warmup_records=tuple(warm),
        problems=tuple(problems),
    )


def _read_object(path: str) -> dict[str, Any]:
    """A JSON file that must hold an object (ValueError naming the file otherwise)."""
    obj = artifacts.read_json(path)
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


# ------------------------------------------------------------------ cross-checks


def check_run(
    records: list[dict[str, Any]],
    status: str,
    summary: dict[str, Any],
    config: dict[str, Any],
    eval_every: float | None,
    summary_path: str = artifacts.SUMMARY_FILE,
) -> list[str]:
    """What does not add up in a run's metrics (empty when nothing): the cross-checks.

    - Step continuity: update lines number their steps one after another (no gap, no
      step twice); evaluations come at increasing steps (none twice).
    - Evaluation cadence: the run loop evaluates at the first update at least
      ``eval_every`` responses past the previous evaluation, and once before the first
      (actor) update; an update past that point before the next evaluation means one is
      missing (and, for a finished run, after the last one).
    - A finished run against its own ``summary.json`` (when it has one): the status, the
      last step, the responses, the final accuracy, whether and where the target was
      reached (N*, recomputed with ``rl_batch.targets`` as the run did, and the band's N*).

    Args:
      records: the run's metrics lines, in file order.
      status: the run's status as the sweep records it.
      summary: its ``summary.json`` (empty when absent).
      config: its ``config.json`` (empty when absent).
      eval_every: its evaluation interval in responses (None: cadence not checked).
      summary_path: ``summary.json``'s path, for messages.

    Returns:
      One message per problem found.
    """
    warm, actor, evals = targets.split_records(records)
    ids = {id(r) for r in warm + actor}
    updates = [r for r in records if id(r) in ids]  # file order
    problems = _step_problems(updates, evals)
    if not problems and eval_every and actor:
        actor_ids, eval_ids = {id(r) for r in actor}, {id(r) for r in evals}
        first = next(i for i, r in enumerate(records) if id(r) in actor_ids)
        if not any(id(r) in eval_ids for r in records[:first]):
            problems.append("evaluation missing: none before the first (actor) update")
        else:
            finished = status == "finished"
            problems += _cadence_problems(warm, actor, evals, float(eval_every), finished)
    if status == "finished":
        problems += _summary_problems(records, updates, evals, summary, config, summary_path)
        if not summary:
            problems += _cut_short_problems(records, updates, evals, config, summary_path)
    return problems


def _cut_short_problems(
    records: list[dict[str, Any]],
    updates: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    config: dict[str, Any],
    summary_path: str,
) -> list[str]:
    """A run "finished" without its ``summary.json`` whose metrics stop short of where its
    ``config.json`` says the run loop stops: before the budget without reaching the
    target, or without the final validation (the loop validates at its last update). Its
    "not reached" could be a cut file, so it is incomplete, not a finding."""
    budget, target = config.get("budget_responses"), config.get("target")
    if not updates or not isinstance(budget, (int, float)):
        return []
    last = max(_as_float(r.get("responses_cum")) for r in updates)
    missing = f"incomplete: no {os.path.basename(summary_path)}, and the metrics end at"
    if isinstance(target, (int, float)) and last < budget:
        reach = targets.reach_of_records(
            records, float(target), None, config.get("target_crossing", "update")
        )
        if not reach.reached:
            return [
                f"{missing} {last:g} responses, before the budget of {budget:g} "
                "(config.json), without reaching the target"
            ]
    final = max((_as_float(r.get("responses_cum")) for r in evals), default=-math.inf)
    if final < last:
        return [f"{missing} {last:g} responses without the final validation there"]
    return []


def _steps(lines: list[dict[str, Any]]) -> list[float] | None:
    steps = [r.get("step") for r in lines]
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in steps):
        return None  # (files written before steps were numbered: not checked)
    return [float(v) for v in steps]


def _step_problems(updates: list[dict[str, Any]], evals: list[dict[str, Any]]) -> list[str]:
    """Update steps one after another; evaluation steps increasing (metrics.jsonl order)."""
    problems = []
    steps = _steps(updates)
    for prev, step in zip(steps or [], (steps or [])[1:]):
        if step != prev + 1:
            what = "twice" if step <= prev else f"after step {prev:g} (a gap)"
            problems.append(f"update steps not consecutive: step {step:g} comes {what}")
            break
    steps = _steps(evals)
    for prev, step in zip(steps or [], (steps or [])[1:]):
        if step <= prev:
            what = "twice" if step == prev else f"after step {prev:g}"
            problems.append(f"evaluation steps not increasing: step {step:g} comes {what}")
            break
    return problems


def _cadence_problems(
    warm: list[dict[str, Any]],
    actor: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    every: float,
    finished: bool,
) -> list[str]:
    """Evaluations where the run loop makes them (``rl_batch.runs.run``: before the first
    actor update, then at the first update ``every`` responses past the last evaluation), on
    the actor's responses (a critic warm-up that counted responses is set aside, as in
    ``targets.actor_axes``: the last evaluation before the actor starts is its start).
    The evaluation before the first update is checked by the caller."""
    if _steps(warm + actor) is None or _steps(evals) is None:
        return []
    off = 0.0
    if warm and actor:
        last_warm = _as_float(warm[-1].get("responses_cum"))
        if _as_float(actor[0].get("responses_cum")) >= last_warm:
            off = last_warm
    u = [(float(r["step"]), _as_float(r.get("responses_cum")) - off) for r in actor]
    e = [(float(r["step"]), _as_float(r.get("responses_cum")) - off) for r in evals]
    start = max((i for i, (_, n) in enumerate(e) if n < 0), default=-1)
    e = [(step, max(n, 0.0)) for step, n in e[max(start, 0) :]]
    for i, (step, n) in enumerate(e):
        nxt = e[i + 1][0] if i + 1 < len(e) else None
        if nxt is None and not finished:
            break  # (a run still going, or stopped, may have died before its next one)
        due = next((us for us, un in u if us > step and un >= n + every), None)
        if due is not None and (nxt is None or due < nxt):
            after = f"; the next is at step {nxt:g}" if nxt is not None else ", none after it"
            return [
                f"evaluation missing: one was due at step {due:g} ({every:g} responses after "
                f"the one at step {step:g}){after}"
            ]
    return []


def _summary_problems(
    records: list[dict[str, Any]],
    updates: list[dict[str, Any]],
    evals: list[dict[str, Any]],
    summary: dict[str, Any],
    config: dict[str, Any],
    path: str,
) -> list[str]:
    """A finished run's metrics against its ``summary.json`` (none: nothing to check, as
    for runs written by hand; a field the summary lacks is not checked)."""
    if not summary:
        return []
    if summary.get("status") != "finished":
        return [f"finished in sweep.json, but {path} says {summary.get('status')!r}"]
    problems = []

    def differs(field: str, ours: Any, text: str | None = None) -> None:
        theirs = summary.get(field)
        if field in summary and not _same(theirs, ours):
            problems.append(
                f"metrics disagree with summary.json ({text or field} {theirs}, "
                f"{artifacts.METRICS_FILE}'s is {ours})"
            )

    last = max((r.get("step", 0) for r in updates), default=0)
    differs("steps", last, "its last update is step")
    responses = max((_as_float(r.get("responses_cum")) for r in updates), default=0.0)
    differs("responses_cum", responses)
    differs("final_eval_accuracy", evals[-1].get("eval_accuracy") if evals else None)
    target = summary.get("target")
    if isinstance(target, (int, float)) and ("n_star" in summary or "reached" in summary):
        crossing = config.get("target_crossing")
        # (a config.json without the field predates it: its summary may read either way)
        options = [crossing] if crossing else [artifacts.DEFAULT_TARGET_CROSSING, "linear"]
        reaches = [targets.reach_of_records(records, target, crossing=c) for c in options]
        if not any(
            _same(summary.get("reached"), r.reached) and _same(summary.get("n_star"), r.n_star)
            for r in reaches
        ):
            r = reaches[0]
            problems.append(
                f"metrics disagree with summary.json (reached {summary.get('reached')}, "
                f"N* = {summary.get('n_star')}; {artifacts.METRICS_FILE} gives reached "
                f"{r.reached}, N* = {r.n_star})"
            )
        band_lo = summary.get("target_band_lo")
        if band_lo is not None and "n_star_band" in summary:
            bands = [targets.reach_of_records(records, target, band_lo, c) for c in options]
            if not any(_same(summary["n_star_band"], b.n_star) for b in bands):
                problems.append(
                    f"metrics disagree with summary.json (band N* = {summary['n_star_band']}, "
                    f"{artifacts.METRICS_FILE} gives {bands[0].n_star})"
                )
    return problems


def _same(a: Any, b: Any) -> bool:
    """Equal, numbers to rounding (a JSON round trip of one computation)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return bool(np.isclose(float(a), float(b), rtol=1e-9, atol=1e-12, equal_nan=True))
    return a == b


def load_sweep(sweep_dir: str) -> Sweep:
    """Loads ``<sweep>/sweep.json`` and every run it lists that has a directory.

    Runs listed in ``sweep.json`` without a directory yet (pending) are skipped; when
    ``sweep.json`` lists no runs, every directory under ``<sweep>/runs`` is loaded. A run
    whose files cannot be read, or do not add up (``check_run``), is left out of ``runs``
    and listed in ``excluded`` with the reason.

    Args:
      sweep_dir: the sweep directory.

    Returns:
      The sweep with its runs.
    """
    path = os.path.join(sweep_dir, artifacts.SWEEP_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no sweep file (is {sweep_dir!r} a sweep directory?)")
    raw = artifacts.read_json(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    algo = raw.get("algo")
    runs_root = os.path.join(sweep_dir, artifacts.RUNS_DIR)
    entries = raw.get("runs") or []
    if not entries and os.path.isdir(runs_root):
        entries = [{"name": n} for n in sorted(os.listdir(runs_root))]
    every = raw.get("eval_every_responses")
    runs, excluded = [], []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "name" not in entry:
            raise ValueError(f"{path}: runs[{i}] has no 'name': {entry!r}")
        run_dir = os.path.join(runs_root, str(entry["name"]))
        if not os.path.isdir(run_dir):
            continue
        try:
            run = load_run(run_dir, entry=entry, algo=algo, eval_every=every)
        except (OSError, ValueError, TypeError) as e:  # one damaged run, not the sweep
            excluded.append((str(entry["name"]), f"unreadable: {e}"))
            continue
        if run.problems:
            excluded.append((run.name, "; ".join(run.problems)))
        else:
            runs.append(run)
    target = raw.get("target")
    budget = raw.get("budget_responses")
    return Sweep(
        sweep_dir=sweep_dir,
        name=str(raw.get("name", os.path.basename(os.path.normpath(sweep_dir)))),
        algo=str(algo) if algo is not None else "unknown",
        target=None if target is None else float(target),
        reference=raw.get("reference"),
        budget_responses=None if budget is None else float(budget),
        eval_every_responses=None if every is None else float(every),
        runs=tuple(runs),
        raw=raw,
        target_band_lo=None if raw.get("target_band_lo") is None else float(raw["target_band_lo"]),
        target_crossing=str(raw.get("target_crossing", "linear")),
        calibration=artifacts.read_calibration(sweep_dir),
        calibration_rounds=artifacts.read_calibration_rounds(sweep_dir),
        calibration_blocks=artifacts.read_calibration_blocks(sweep_dir),
        calibration_prompts=artifacts.read_calibration_prompts(sweep_dir),
        calibration_note=artifacts.calibration_note(sweep_dir),
        excluded=tuple(excluded),
    )


def pool_sweeps(sweeps: list[Sweep] | tuple[Sweep, ...]) -> Sweep:
    """One sweep of the runs of several sweeps of one study: more seeds for one answer.

    The first sweep's settings and calibration (its step times give T and q); a
    configuration's seed that several sweeps ran is taken from the first that has it
    (a seed's training is deterministic, so they agree where the code did). Sweeps with
    another target, band or crossing are refused (ValueError).
    """
    first = sweeps[0]
    for sw in sweeps[1:]:
        mine = (sw.target, sw.target_band_lo, sw.target_crossing)
        theirs = (first.target, first.target_band_lo, first.target_crossing)
        if mine != theirs:
            raise ValueError(
                f"sweep {sw.sweep_dir}: target, band and crossing {mine} differ from "
                f"{first.sweep_dir}'s {theirs}; only sweeps of one study pool"
            )
    seen: set[tuple[Configuration, int | None]] = set()
    runs = []
    for sw in sweeps:
        for run in sw.runs:
            if (run.key, run.seed) not in seen:
                seen.add((run.key, run.seed))
                runs.append(run)
    return dataclasses.replace(
        first,
        sweep_dir=" + ".join(sw.sweep_dir for sw in sweeps),
        runs=tuple(runs),
        excluded=tuple(e for sw in sweeps for e in sw.excluded),
    )


def group_runs(runs: list[RunData] | tuple[RunData, ...]) -> dict[Configuration, list[RunData]]:
    """Groups runs by configuration (across seeds), keys in (algo, batch, G, rule) order."""
    groups: dict[Configuration, list[RunData]] = {}
    for r in runs:
        groups.setdefault(r.key, []).append(r)
    return {k: groups[k] for k in sorted(groups, key=Configuration.sort_key)}


def truncate_run(run: RunData, max_responses: float) -> RunData:
    """Returns the run as if it had stopped at ``max_responses`` retained responses.

    Keeps the update lines and evaluations at or below ``max_responses`` (a pilot run).
    """
    u = run.responses <= max_responses
    e = run.eval_responses <= max_responses
    records = run.update_records
    return dataclasses.replace(
        run,
        update_records=tuple(r for r, k in zip(records, u) if k) if records else records,
        eval_records=tuple(r for r, k in zip(run.eval_records, e) if k),
        responses=run.responses[u],
        time_train=run.time_train[u],
        updates_done=run.updates_done[u],
        eval_responses=run.eval_responses[e],
        eval_accuracy=run.eval_accuracy[e],
        status="pilot",
    )


def mean_curve(
    runs: list[RunData], grid_n: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seed-mean accuracy curve on a responses grid, only where every seed has data.

    Each run's eval curve is linearly interpolated on ``grid_n``. A grid point outside
    any run's evaluations (past a seed that stopped at the target, say) is NaN in all
    three outputs: a mean over the seeds still running there would be a mean over the
    slow seeds only, and would fall as the fast ones stop (survivorship). Beyond it the
    figures draw the share of seeds at the target (``figures._plot_reach``), and each
    seed's own curve (this module's ``seed_curves``) in ``figures.figure_seed_curves``.

    Args:
      runs: runs of one configuration.
      grid_n: [K] responses grid.

    Returns:
      (mean [K], min [K], max [K]) over the runs with evaluations; NaN where one of
      them has no data.
    """
    rows = [y for _, y in seed_curves(runs, grid_n)]
    if not rows:
        nan = np.full(grid_n.shape, np.nan)
        return nan, nan, nan
    acc_rk = np.stack(rows)  # [R, K]
    covered_k = np.isfinite(acc_rk).all(axis=0)
    nan = np.full(grid_n.shape, np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # All-NaN columns stay NaN.
        return (
            np.where(covered_k, acc_rk.mean(0), nan),
            np.where(covered_k, acc_rk.min(0), nan),
            np.where(covered_k, acc_rk.max(0), nan),
        )


def seed_curves(runs: list[RunData], grid_n: np.ndarray) -> list[tuple[RunData, np.ndarray]]:
    """Each run's eval curve interpolated on ``grid_n`` ([K]; NaN outside its evaluations);
    runs without evaluations are left out."""
    out = []
    for r in runs:
        if r.eval_responses.size == 0:
            continue
        y = np.interp(grid_n, r.eval_responses, r.eval_accuracy)
        y[(grid_n > r.eval_responses[-1]) | (grid_n < r.eval_responses[0])] = np.nan
        out.append((r, y))
    return out
