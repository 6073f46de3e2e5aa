"""A batch-size / learning-rate sweep: expand the grid, validate it, run each point.

The grid is prompts x group sizes x LR rules x seeds plus explicit extra points. Every
point is a full run config (the sweep's base config with ``prompts``, ``group_size``,
``lr_rule``, ``seed``, ``name`` and ``run_dir`` set) resolved and validated before
anything starts, so a bad grid fails at once with one message.

All points share the base config's ``budget_responses`` and ``eval_every_responses``,
so their curves are on the same runway of cumulative responses. Each point's ``lr``
comes from its rule and ``lr_ref``: a base config with a fixed ``lr`` is rejected (the
``fixed`` rule trains every point at ``lr_ref``).

State lives in ``<sweep>/sweep.json`` (rewritten atomically after each change): a
re-run skips finished points and resumes interrupted ones from their checkpoints; a
failed point is recorded with its error and the sweep goes on (``failed_points`` lists
them, for the exit status of the sweep programs).

A sweep launched as several processes (``launch/local.sh -n N``, SLURM, TPU VM pods)
joins ``jax.distributed`` before anything else (``processes.join_processes``); process 0
alone writes the sweep's files. The processes a sweep starts (a point's child, a worker
that runs points one after another, their protocol and signals) live in
``rl_batch.sweeps.processes``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import threading
import time
import traceback
from collections.abc import Callable
from concurrent import futures as concurrent_futures
from typing import Any

from ml_collections import ConfigDict

from rl_batch import artifacts, distributed, locks
from rl_batch.runs import config as config_lib
from rl_batch.runs import retention
from rl_batch.runs.spec import RunSpec
from rl_batch.sweeps import dispatch
from rl_batch.sweeps import processes as procs
from rl_batch.sweeps.processes import Processes

FINISHED = "finished"


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point."""

    prompts: int
    group_size: int
    lr_rule: str
    seed: int
    critic: str = ""  # PPO critic settings off their defaults (artifacts.critic_variant)
    variant: str = ""  # a named set of settings from sweep.variants ("" = the base config)

    @property
    def configuration(self) -> artifacts.Configuration:
        """The configuration this point is a seed of (the algorithm is the sweep's)."""
        return artifacts.Configuration(
            "", self.prompts, self.group_size, self.lr_rule, self.critic, self.variant
        )

    @property
    def key(self) -> str:
        """The configuration's grid key, e.g. ``16x8:sqrt`` or ``64x1:sqrt:k2``."""
        return self.configuration.key

    @property
    def name(self) -> str:
        """The run's name, e.g. ``p16_g8_sqrt_s0``."""
        return self.configuration.run_name(self.seed)


def _ints(text: str, field: str) -> list[int]:
    try:
        values = [int(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"sweep.{field}={text!r}: expected comma-separated integers") from None
    if not values:
        raise ValueError(f"sweep.{field} is empty")
    return values


def _strs(text: str) -> list[str]:
    return [v.strip() for v in str(text).split(",") if v.strip()]


def _critic_axis(base: ConfigDict) -> list[tuple[int, str]]:
    """PPO's (critic_batch_scale, critic_lr_rule) pairs: the product of
    ``sweep.critic_batch_scales`` and ``sweep.critic_lr_rules`` (each empty = the base
    config's ``ppo`` value); one pair of defaults for GRPO."""
    if base.get("algo") != "ppo":
        return [(1, "")]
    sweep, ppo = base.sweep, base.ppo
    scales_text = sweep.get("critic_batch_scales", "")
    scales = _ints(scales_text, "critic_batch_scales") if scales_text else []
    rules = _strs(sweep.get("critic_lr_rules", ""))
    if any(k < 1 for k in scales):
        raise ValueError(f"sweep.critic_batch_scales={scales_text!r}: each must be >= 1")
    return [
        (k, "" if r == "actor" else r)
        for k in scales or [int(ppo.critic_batch_scale)]
        for r in rules or [ppo.critic_lr_rule]
    ]


def expand_grid(base: ConfigDict) -> list[Point]:
    """All grid points (duplicates removed), ordered by batch size, then prompts, then
    their order in the config; the seeds of a configuration are adjacent.

    ``base`` is the sweep config; for PPO the critic axes (``sweep.critic_batch_scales``
    x ``sweep.critic_lr_rules``) multiply the grid, and an extra point or the reference
    without a critic part has the base config's critic settings."""
    sweep = base.sweep
    seeds = _ints(sweep.seeds, "seeds")
    critics = _critic_axis(base)
    keys = [
        (p, g, r, artifacts.critic_variant(k, cr, r), "")
        for p in _ints(sweep.prompts, "prompts")
        for g in _ints(sweep.group_sizes, "group_sizes")
        for r in _strs(sweep.lr_rules)
        for k, cr in critics
    ]
    keys += [_full_key(base, k) for k in _strs(sweep.extra_points)]
    unique = sorted(set(keys), key=lambda k: (k[0] * k[1], k[0], keys.index(k)))
    points = [Point(p, g, r, s, critic, v) for p, g, r, critic, v in unique for s in seeds]
    check_distinct_run_dirs(points)
    return points


def check_distinct_run_dirs(points: list[Point]) -> None:
    """Refuses two configurations whose runs would share a directory (a variant named
    like a PPO critic part: ``64x1:sqrt@k2`` and ``64x1:sqrt:k2`` are both
    ``p64_g1_sqrt_k2_s0``), which would train one of them only."""
    seen: dict[str, str] = {}
    for point in points:
        other = seen.setdefault(point.name, point.key)
        if other != point.key:
            raise ValueError(
                f"sweep points {other!r} and {point.key!r} share the run directory "
                f"{point.name}: rename the variant (a variant may not read as a critic part "
                "'k<scale>[-<rule>]')"
            )


def _full_key(base: ConfigDict, text: str) -> tuple[int, int, str, str, str]:
    """A point key's (prompts, group_size, rule, critic, variant), the critic part filled
    in from the base config when absent; a critic part on a GRPO sweep, or a variant that
    ``sweep.variants`` does not define, is refused."""
    p, g, r, critic, variant = artifacts.parse_key(text)
    if critic is None:
        critic = artifacts.critic_variant_of({**base.to_dict(), "lr_rule": r})
    elif critic and base.get("algo") != "ppo":
        raise ValueError(f"sweep point {text!r}: a critic part (':{critic}') needs algo='ppo'")
    if variant:
        variant_settings(base, variant, text)
    return p, g, r, critic, variant


# The run config's fields a sweep sets at every point (its key and run), and where a
# sweep takes each instead: a variant may not set them, nor a sweep program's
# --config.<field> override (experiments.sweep_main.check_point_overrides).
POINT_FIELDS = {
    "prompts": "--config.sweep.prompts",
    "group_size": "--config.sweep.group_sizes",
    "lr_rule": "--config.sweep.lr_rules",
    "seed": "--config.sweep.seeds",
    "name": "--sweep_dir (points are named from the grid)",
    "run_dir": "--sweep_dir",
    "lr": "--config.lr_ref with --config.sweep.lr_rules (fixed: lr = lr_ref at every batch)",
    "variant": "--config.sweep.variants and a point key's @variant",
}


# The run config's fields every point of a sweep shares: the analysis (N*, T, r_N, the
# plan) and launch.collect read them once per sweep, so a variant may not set them.
SWEEP_LEVEL_FIELDS = frozenset(
    {"target", "target_band_lo", "target_crossing", "eval_every_responses", "budget_responses"}
)


def _leaves(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as ``{"a.b": leaf}``."""
    out = {}
    for k, v in settings.items():
        path = f"{prefix}{k}"
        out.update(_leaves(v, f"{path}.") if isinstance(v, dict) else {path: v})
    return out


def variant_settings(base: ConfigDict, name: str, where: str = "") -> dict[str, Any]:
    """The settings ``sweep.variants[name]`` puts on a point's run config (nested like
    it); a ValueError that names the problem when the variant is not defined, or sets a
    field the base config lacks or a field the point owns."""
    variants = base.sweep.get("variants") or {}
    variants = variants.to_dict() if hasattr(variants, "to_dict") else dict(variants)
    at = f"sweep point {where!r}: " if where else ""
    if name not in variants:
        raise ValueError(
            f"{at}no variant {name!r} in sweep.variants (defined: {sorted(variants) or 'none'})"
        )
    settings = variants[name] or {}
    flat = _leaves(base.to_dict())
    for path in _leaves(settings):
        if path.split(".")[0] in POINT_FIELDS or path.startswith(("sweep.", "ppo.critic_")):
            raise ValueError(
                f"sweep.variants.{name}.{path}: the point's key sets this, not a variant"
            )
        if path in SWEEP_LEVEL_FIELDS:
            raise ValueError(
                f"sweep.variants.{name}.{path}: every point of a sweep shares it (the "
                "analysis compares the points at one target and budget); set "
                f"--config.{path} for the whole sweep"
            )
        if path not in flat:
            raise ValueError(f"sweep.variants.{name}.{path}: no such field in the run config")
    return settings


def reference_key(base: ConfigDict, points: list[Point]) -> str:
    """The reference configuration: ``sweep.reference`` or the smallest batch's first rule."""
    if base.sweep.reference:
        key = artifacts.point_key(*_full_key(base, base.sweep.reference))
        if key not in {pt.key for pt in points}:
            raise ValueError(f"sweep.reference={base.sweep.reference!r} is not a point of the grid")
        return key
    return points[0].key


def point_config(base: ConfigDict, point: Point, sweep_dir: str) -> ConfigDict:
    """The run config of one grid point."""
    c = ConfigDict(base.to_dict())
    if "sweep" in c:
        del c["sweep"]
    c.prompts, c.group_size, c.lr_rule, c.seed = (
        point.prompts,
        point.group_size,
        point.lr_rule,
        point.seed,
    )
    if c.algo == "ppo":
        c.ppo.critic_batch_scale, c.ppo.critic_lr_rule = artifacts.parse_critic_variant(
            point.critic
        )
    if point.variant:
        c.update(variant_settings(base, point.variant))  # (recursive: the named fields only)
    c.variant = point.variant
    c.name = point.name
    c.run_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR, point.name)
    c.lr = None  # Always derived from the rule for sweep points (derived.lr).
    # A policy that keeps no step of a run stopped at its target is applied by the run
    # itself: it skips the final save that `prune_finished` would remove (retention).
    c.prune_at_target = retention.prune_at_target(retention.sweep_policy(base.sweep))
    return c


def check_base_lr(base: ConfigDict) -> None:
    """Rejects a fixed ``lr`` in a sweep's base config, which the points would ignore.

    Raises:
      ValueError: naming ``lr`` and its value, and how to train every point at one LR.
    """
    if base.get("lr") is not None:
        raise ValueError(
            f"lr={base.lr}: a sweep sets lr at each point from its rule in "
            f"sweep.lr_rules={base.sweep.lr_rules!r} and lr_ref, so a fixed base lr would "
            "be ignored; leave lr unset (None), or train every point at one learning rate with "
            f"--config.sweep.lr_rules=fixed --config.lr_ref={base.lr} "
            "(the fixed rule keeps lr = lr_ref at every batch size)"
        )


def gen_probe(base: ConfigDict, points: list[Point]) -> tuple[int, ...]:
    """``sweep.calibrate_gen_probe`` as concurrencies (empty: none), each checked to be a
    multiple of the first point's group size (the calibration probes its rollout)."""
    text = str(base.sweep.get("calibrate_gen_probe", "") or "")
    if not text.strip():
        return ()
    values = tuple(_ints(text, "calibrate_gen_probe"))
    g = points[0].group_size if points else 1
    bad = [c for c in values if c < g or c % g]
    if bad:
        raise ValueError(
            f"sweep.calibrate_gen_probe={text!r}: {bad} not a multiple of the group size {g} "
            f"of the first point {points[0].name}"
        )
    return values


@dataclasses.dataclass(frozen=True)
class CalibrationSettings:
    """A sweep's calibration (``sweep.calibrate_*``): ``rounds`` (0: none), ``steps`` per
    visit, ``before`` of the rounds timed before the runs, generation ``probe``s."""

    rounds: int
    steps: int
    before: int
    probe: tuple[int, ...]


def calibration_settings(base: ConfigDict, points: list[Point]) -> CalibrationSettings:
    """``sweep.calibrate_*`` checked: a ValueError names a bad value."""
    rounds = int(base.sweep.get("calibrate_rounds", 0))
    steps = int(base.sweep.get("calibrate_steps", 2))
    before = int(base.sweep.get("calibrate_rounds_before", 0))
    if rounds < 0 or (rounds and steps < 1):
        raise ValueError(
            f"sweep.calibrate_rounds={rounds}, calibrate_steps={steps}: need >= 0, >= 1"
        )
    try:
        artifacts.calibration_block_sizes(rounds, before if rounds else 0)
    except ValueError as e:
        raise ValueError(f"sweep.calibrate_rounds_before={before}: {e}") from e
    return CalibrationSettings(rounds, steps, before if rounds else 0, gen_probe(base, points))


def plan(
    base: ConfigDict, sweep_dir: str, device_count: int | None = None
) -> tuple[list[Point], dict[str, RunSpec]]:
    """Expands and validates the whole grid; nothing is started.

    Args:
      base: the sweep config (a run config with a ``sweep`` section).
      sweep_dir: output directory (it sets each point's ``run_dir``).
      device_count: devices each run will span (default ``jax.device_count()``, which
        starts the JAX backend: a multi-process program joins ``jax.distributed`` first).

    Returns:
      (points, the ``RunSpec`` of each point by name): each point resolved once.

    Raises:
      ValueError: for a fixed base ``lr`` (see ``check_base_lr``), a reference that is
        not a grid point, or listing each reason the grid is invalid once, with the
        points it applies to.
    """
    check_base_lr(base)
    artifacts.check_equivalence_delta(
        base.sweep.get("equivalence_delta", artifacts.DEFAULT_EQUIVALENCE_DELTA), "sweep"
    )
    points = expand_grid(base)
    reference_key(base, points)
    calibration_settings(base, points)
    resolved, errors = {}, {}  # error message -> the points it is about
    for point in points:
        try:
            resolved[point.name] = config_lib.resolve(
                point_config(base, point, sweep_dir), device_count
            )
        except ValueError as e:
            errors.setdefault(str(e), []).append(point.name)
    if errors:
        lines = [
            f"{'every point' if len(names) == len(points) else ', '.join(names)}: {message}"
            for message, names in errors.items()
        ]
        raise ValueError("invalid sweep grid:\n  " + "\n  ".join(lines))
    return points, resolved


def check_memory(resolved: dict[str, RunSpec], device_memory: float, work_dir: str) -> list[str]:
    """Runs the worker's ``memory`` check (``rl_batch.sweeps.worker``) in a CPU-only child
    process (this one keeps its hands off the accelerators) on the points' own shapes;
    returns one message per point whose update or sampler would not fit
    ``device_memory`` bytes."""
    os.makedirs(work_dir, exist_ok=True)
    path = os.path.join(work_dir, "memory_check.json")
    artifacts.write_json_atomic(path, {k: spec.to_json() for k, spec in resolved.items()})
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [*procs.WORKER, "memory", path, f"--device_memory={device_memory}"],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory check failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _sweep_record(base: ConfigDict, points, resolved, ref_key, old: dict | None) -> dict:
    old_runs = {r["name"]: r for r in (old or {}).get("runs", [])}
    runs = []
    for point in points:
        spec = resolved[point.name]
        prev = old_runs.get(point.name, {})
        entry = artifacts.sweep_entry(
            point.name,
            prompts=point.prompts,
            group_size=point.group_size,
            lr_rule=point.lr_rule,
            critic=point.critic,
            variant=point.variant,
            lr=spec.optimizer.lr,
            seed=point.seed,
            status=prev.get("status", "pending"),
            error=prev.get("error"),
        )
        runs.append({**entry, "key": point.key, "wall_s": prev.get("wall_s")})
    ref_name = next(p.name for p in points if p.key == ref_key)
    return artifacts.sweep_record(
        os.path.basename(os.path.normpath(base.get("sweep_dir", "") or "sweep")),
        artifacts.sweep_settings(base),
        runs,
        reference=ref_name,
        reference_key=ref_key,
        grid=base.sweep.to_dict(),
    )


def _changed_settings(resolved: dict[str, RunSpec]) -> list[str]:
    """``"run: field: old -> new"`` for each point whose run directory holds a run
    (``summary.json``: started, finished or not) whose config differs outside
    `config.RESUME_ALLOWED`, checked before any point starts, in every process. (A
    directory with a config.json alone is refused by ``run.run`` at its point.)"""
    out = []
    for name, spec in resolved.items():
        run_dir = spec.inputs.run_dir
        path = os.path.join(run_dir, artifacts.CONFIG_FILE)
        if os.path.exists(path) and os.path.exists(os.path.join(run_dir, artifacts.SUMMARY_FILE)):
            diffs = config_lib.resume_diffs(artifacts.read_json(path), spec.to_json())
            out += [f"{name}: {d}" for d in diffs]
    return out


def _run_status(run_dir: str) -> str | None:
    path = os.path.join(run_dir, artifacts.SUMMARY_FILE)
    if not os.path.exists(path):
        return None
    try:
        return artifacts.read_json(path).get("status")
    except ValueError:
        return None


def failed_points(record: dict[str, Any], only: str | None = None) -> list[str]:
    """The names of the requested points of a sweep record that did not finish.

    Args:
      record: what ``run_sweep`` returned.
      only: the ``only`` point it was asked to run, or None for the whole grid (with
        ``only``, the other points' statuses are not this run's doing).
    """
    return [
        r["name"]
        for r in record["runs"]
        if (only is None or r["name"] == only) and r["status"] != FINISHED
    ]


def run_sweep(
    base: ConfigDict,
    sweep_dir: str,
    *,
    isolate: bool = False,
    only: str | None = None,
    run_fn: Callable[[RunSpec], dict[str, Any]] | None = None,
    log: Callable[[str], None] = print,
    processes: Processes | None = None,
) -> dict[str, Any]:
    """Runs every point of the grid that has not finished; returns the sweep record.

    Args:
      base: the sweep config (a run config with a ``sweep`` section).
      sweep_dir: output directory.
      isolate: run each point in its own process (``rl_batch.sweeps.worker run``).
      only: run just this point name (for job arrays); its record goes to
        ``<run>/sweep_point.json`` and the shared ``sweep.json`` is left alone.
      run_fn: runs one point's ``RunSpec`` in-process (default ``rl_batch.runs.run.run``).
      log: where progress lines go.
      processes: this process's place, if the caller has already joined
        (`procs.join_processes`); else this joins first.

    Returns:
      The sweep record (also in ``sweep.json``, or ``sweep_point.json`` with ``only``);
      ``failed_points`` lists the points that did not finish. A failed point is
      recorded (its traceback goes to ``<sweep>/errors.log``) and the others still run.

    Raises:
      ValueError: for an invalid grid or ``only`` name, before any point starts.
    """
    # Before any JAX call: plan() counts the devices (with isolate, in a child process:
    # this one never starts JAX's backend, which would hold its children's accelerators).
    processes = processes or procs.join_processes(base, isolate=isolate)
    procs.stopping.clear()
    os.makedirs(sweep_dir, exist_ok=True)
    # One sweep program per sweep directory (the jobs of an array write only their points).
    lock = locks.DirectoryLock(sweep_dir, "sweep") if processes.writer and only is None else None
    if lock is not None:
        lock.acquire()
    try:
        return _run_points(base, sweep_dir, isolate, only, run_fn, log, processes)
    finally:
        if lock is not None:
            lock.release()


def _run_points(base, sweep_dir, isolate, only, run_fn, log, processes) -> dict[str, Any]:
    """`run_sweep` once it holds the sweep directory."""
    base = ConfigDict(base.to_dict())
    points, resolved = plan(base, sweep_dir, processes.device_count)
    if only is not None and only not in resolved:
        raise ValueError(f"--only={only!r} is not a point of the grid: {sorted(resolved)}")
    device_memory = base.sweep.get("device_memory", 0)
    if device_memory:
        check = {only: resolved[only]} if only is not None else resolved
        too_big = check_memory(check, device_memory, sweep_dir)
        if too_big:
            raise ValueError("sweep points do not fit in memory:\n  " + "\n  ".join(too_big))
    keep = retention.sweep_policy(base.sweep)
    retention.check_policy(keep)
    ref_key = reference_key(base, points)
    changed = _changed_settings(resolved if only is None else {only: resolved[only]})
    if changed:
        raise ValueError(
            f"{sweep_dir} holds runs with a different config ({'; '.join(changed)}); only "
            f"{', '.join(config_lib.RESUME_ALLOWED)} may change: use a new --sweep_dir"
        )
    # With --only (one job of an array), the jobs run concurrently: none of them owns
    # sweep.json, which ``launch.collect`` rebuilds from the run directories.
    sweep_path = os.path.join(sweep_dir, artifacts.SWEEP_FILE)
    old = artifacts.read_json(sweep_path) if os.path.exists(sweep_path) else None
    record = _sweep_record(base, points, resolved, ref_key, old)
    record["name"] = os.path.basename(os.path.normpath(sweep_dir))
    if only is not None:
        # A point another program is training is refused before its directory is touched
        # (by the writer: the processes of one multi-process run share the directory).
        if processes.writer:
            check_not_in_use(resolved[only].inputs.run_dir, f"--only={only}")
        sweep_path = os.path.join(resolved[only].inputs.run_dir, "sweep_point.json")
    # Other processes of a multi-process run compute but write and print nothing.
    writer = processes.writer
    save = artifacts.write_sweep if writer else _discard
    log = log if writer else _discard
    save(sweep_path, record)

    if run_fn is None and not isolate:
        from rl_batch.runs import run as run_lib  # Imported late: analysis-only users skip jax.

        run_fn = run_lib.run

    todo = [p for p in points if only is None or p.name == only]
    calibration = calibration_settings(base, points)
    calibrating = only is None and writer and calibration.rounds > 0
    held = None  # (a calibration child holding its compiled programs through the runs)
    if calibrating and calibration.before:  # (the rounds before the runs: fresh XLA caches)
        held = _calibrate(sweep_dir, calibration, points, resolved, log, "before")
    try:
        record = _run_todo(base, sweep_dir, todo, resolved, record, isolate, run_fn, processes,
                           log, save, sweep_path, keep, only)  # fmt: skip
        if calibrating:
            _calibrate(sweep_dir, calibration, points, resolved, log, "after", held)
            held = None
    finally:
        if held is not None:  # (the runs stopped: the rounds after them are left to a rerun)
            held.release(go=False)
    return record


def _run_todo(base, sweep_dir, todo, resolved, record, isolate, run_fn, processes, log, save,
              sweep_path, keep, only) -> dict[str, Any]:  # fmt: skip
    """`_run_points`' runs: one after another, or ``sweep.concurrent`` at a time."""
    concurrent = max(1, int(base.sweep.get("concurrent", 1))) if only is None else 1
    isolate = isolate or concurrent > 1
    progress = _Progress(len(todo), log, concurrent)
    guard = threading.Lock()  # the record and its file, from concurrent points
    workers = procs.Workers(
        os.path.join(sweep_dir, "workers.log"),
        enabled=concurrent > 1 and bool(base.sweep.get("reuse_workers", False))
        and distributed.settings(base) is None,
        keep_programs=int(base.sweep.get("keep_programs", 0)),
        cpu_slices=procs.cpu_slices(concurrent) if base.sweep.get("pin_workers") else None,
    )  # fmt: skip

    def run_one(i: int, point: Point) -> None:
        _run_point(i, point, resolved[point.name], record, isolate, run_fn, processes, progress,
                   lambda: save(sweep_path, record), guard, workers.mine(), keep)  # fmt: skip

    if concurrent == 1 or len(todo) < 2:
        for i, point in enumerate(todo):
            run_one(i, point)
    else:
        # ``concurrent`` child processes at a time (with ``sweep.reuse_workers``,
        # ``concurrent`` workers that each run one point after another), each staying on
        # one configuration while it has seeds left (``dispatch``: compiled once). The
        # shared caches (task data, a warm start to train) are built under a file lock:
        # the first point to need one builds it while the others wait for it.
        queue = dispatch.PointQueue(list(enumerate(todo)), lambda item: item[1].key)

        def work(worker: int) -> None:
            errors = []  # (every point is still tried; the first error is raised after)
            while (handed := queue.next(worker)) is not None:
                try:
                    run_one(*handed)  # (index in todo, point)
                except Exception as e:  # noqa: BLE001 (re-raised once the queue is empty)
                    errors.append(e)
            if errors:
                raise errors[0]

        with concurrent_futures.ThreadPoolExecutor(concurrent) as pool:
            try:
                futures = [pool.submit(work, w) for w in range(concurrent)]
                pending = set(futures)
                while pending:  # (a timed wait: the main thread takes Ctrl-C while it waits)
                    _, pending = concurrent_futures.wait(pending, timeout=0.5)
                for f in futures:
                    f.result()
            except KeyboardInterrupt:
                # Ctrl-C stops the sweep as SIGTERM does: no further point starts, and the
                # running ones stop (each records "interrupted") before this one exits.
                queue.close()
                pool.shutdown(wait=False, cancel_futures=True)
                procs.terminate_children()
                raise
            finally:  # (before the pool's threads end: a worker stops with its thread)
                workers.close()
    log(f"sweep finished in {(time.time() - progress.t_start) / 60:.1f} min: {sweep_path}")
    return record


class _Progress:
    """``[sweep i/n]`` lines with an ETA from the finished points' wall times."""

    def __init__(self, total: int, log: Callable[[str], None], concurrent: int = 1):
        self.total, self.log, self.t_start, self.walls = total, log, time.time(), []
        self.concurrent = concurrent
        self.skipped = 0  # points found finished: no wall time, and nothing left to run

    def eta(self) -> str:
        """The points left to run at the mean wall time of those run by this invocation
        (none: no ETA).

        Points skipped as finished count as done: a grid extension's round re-lists the
        whole grid and runs only its new points. The first point to finish also built
        shared caches (the warm start, task data, compiled programs), so its wall time is
        left out once another point has finished.
        """
        if not self.walls:
            return ""
        walls = self.walls[1:] or self.walls
        remaining = (self.total - self.skipped - len(self.walls)) / self.concurrent
        return f", sweep ETA {remaining * sum(walls) / len(walls) / 60:.1f} min"


def _run_point(
    i, point, spec, record, isolate, run_fn, processes, progress, save, guard, worker=None,
    keep=retention.DEFAULT_POLICY,
):  # fmt: skip
    """Runs one point of ``_run_points`` (skips it when finished) and books its status;
    a point it ran to the end keeps the checkpoints ``keep`` (``sweep.keep_checkpoints``)
    says (``rl_batch.runs.retention``; a skipped point keeps what it has)."""
    n, log = progress.total, progress.log
    config = spec.inputs
    entry = next(r for r in record["runs"] if r["name"] == point.name)
    status = _run_status(config.run_dir)
    if status == FINISHED and _budget_of(config.run_dir) >= config.budget_responses:
        with guard:
            entry["status"], entry["error"] = FINISHED, None
            progress.skipped += 1
            save()
        log(f"[sweep {i + 1}/{n}] {point.name}: already finished, skipped")
        return
    resume = status is not None or os.path.isdir(os.path.join(config.run_dir, "checkpoints"))
    log(
        f"[sweep {i + 1}/{n}] {point.name}: B={point.prompts}x{point.group_size}"
        f"={spec.batch}, lr={spec.optimizer.lr:.3g} ({point.lr_rule})"
        f"{' (resuming)' if resume else ''}{progress.eta()}"
    )
    if processes.writer:
        check_not_in_use(config.run_dir, point.name)
    with guard:
        before, entry["status"] = entry["status"], "running"
        save()
    t0 = time.time()
    try:
        if isolate:
            os.makedirs(config.run_dir, exist_ok=True)
            # (Each process of a multi-process sweep has its own child and log.)
            log_name = (
                "stdout.log" if processes.writer else f"stdout.process_{processes.process_id}.log"
            )
            procs.run_point_process(spec, os.path.join(config.run_dir, log_name), worker)
            status = _run_status(config.run_dir) or "failed"
        else:
            status = run_fn(spec).get("status", FINISHED)
        error = None
    except KeyboardInterrupt:
        with guard:
            entry["status"] = "interrupted"
            save()
        raise
    except locks.DirectoryLocked:
        # Another program trains this point: its run is not this sweep's to call failed.
        with guard:
            entry["status"] = before
            save()
        raise
    except Exception as e:  # A failed point is recorded; the sweep goes on.
        if procs.stopping.is_set() and _run_status(config.run_dir) == "interrupted":
            with guard:
                entry["status"], entry["error"] = "interrupted", None
                save()
            return
        logging.exception("run %s failed", point.name)
        status, error = "failed", f"{type(e).__name__}: {e}"
        if processes.writer:
            sweep_dir = os.path.dirname(os.path.dirname(os.path.abspath(config.run_dir)))
            with guard, open(os.path.join(sweep_dir, "errors.log"), "a") as f:
                f.write(f"== {point.name}\n{traceback.format_exc()}\n")
    with guard:
        entry["status"], entry["error"], entry["wall_s"] = status, error, time.time() - t0
        progress.walls.append(entry["wall_s"])
        save()
    pruned = ""
    if status == FINISHED and processes.writer:
        try:
            note = retention.prune_finished(config.run_dir, keep)
        except OSError as e:  # (the run is finished: a removal that fails keeps them)
            note = f"checkpoints kept: {e}"
        pruned = f"; {note}" if note else ""
    log(f"[sweep {i + 1}/{n}] {point.name}: {entry['status']} in {entry['wall_s']:.0f}s{pruned}")


def check_not_in_use(run_dir: str, what: str) -> None:
    """Raises `locks.DirectoryLocked` (``what: <dir> is in use by ...``) when another
    process holds ``run_dir``'s lock; takes and gives it back otherwise."""
    if not os.path.isdir(run_dir):
        return
    try:
        locks.DirectoryLock(run_dir, "sweep").acquire().release()
    except locks.DirectoryLocked as e:
        raise locks.DirectoryLocked(f"{what}: {e}") from None


def _budget_of(run_dir: str) -> float:
    """The runway a finished run was given (a longer one now extends it)."""
    path = os.path.join(run_dir, artifacts.CONFIG_FILE)
    if not os.path.exists(path):
        return float("inf")
    return float(artifacts.read_json(path)["budget_responses"])


def _calibrate(
    sweep_dir: str,
    settings: CalibrationSettings,
    points: list[Point],
    resolved: dict[str, RunSpec],
    log: Callable[[str], None],
    stage: str,
    held: procs.HeldChild | None = None,
) -> procs.HeldChild | None:
    """One stage (``"before"`` or ``"after"`` the runs) of the sweep's calibration: the
    worker's ``calibrate`` in a child process (a clean, JAX-free parent; every
    configuration timed in one process), unless ``calibration.json`` already serves it
    (T and q do not change without a new configuration). A failure is logged, not raised.

    The child of stage ``"before"`` holds its compiled programs through the runs on a CPU
    host (returned; None where it ended); ``"after"`` times the other rounds in it
    (``held``) when its block is the one on disk, else in a new child."""
    grid = {}  # configuration -> its first point (timed as that before it has a run)
    for point in points:
        grid.setdefault(point.key, resolved[point.name])
    s = settings
    action, why = artifacts.calibration_action(
        sweep_dir, s.rounds, s.steps, s.probe, s.before, tuple(grid)
    )
    if held is not None and action != "append":
        held.release(go=False)
        held = None
    if action == "keep" or (stage == "before" and action == "append"):
        what = "every configuration" if action == "keep" else "its rounds before the runs"
        log(f"[sweep] {artifacts.CALIBRATION_FILE} kept: it times {what}")
        return None
    n = s.before if stage == "before" else s.rounds - (s.before if action == "append" else 0)
    log(f"[sweep] calibration: {'; '.join(why)}")
    where = ", in the process that timed the rounds before them" if held else ""
    log(f"[sweep] calibrating the configurations' step times ({n} interleaved rounds, {stage} "
        f"the runs{where})")  # fmt: skip
    if held is not None:
        code = held.release(go=True)
    else:
        child = _calibration_child(sweep_dir, s, stage, {k: v.to_json() for k, v in grid.items()})
        if isinstance(child, procs.HeldChild):
            return child
        code = child
    if code != 0:
        log(f"[sweep] calibration failed (exit {code}); see {sweep_dir}/calibration.log")
    return None


def _calibration_child(
    sweep_dir: str, s: CalibrationSettings, stage: str, grid: dict[str, Any]
) -> int | procs.HeldChild:
    """``python -m rl_batch.sweeps.worker calibrate`` (``calibrate.calibrate_sweep``) of one
    stage; ``grid``: configuration -> spec JSON. Returns the exit status, or, for stage
    ``"before"``, the child holding its programs (`procs.HeldChild`) where it does."""
    grid_path = os.path.join(sweep_dir, "calibration_grid.json")  # (the child's input only)
    artifacts.write_json_atomic(grid_path, grid)
    cmd = [*procs.WORKER, "calibrate", sweep_dir, f"--rounds={s.rounds}", f"--steps={s.steps}",
           "--gen_probe=" + ",".join(map(str, s.probe)), f"--before={s.before}",
           f"--stage={stage}", f"--grid={grid_path}"]  # fmt: skip
    log_path = os.path.join(sweep_dir, "calibration.log")
    try:
        if stage == "before":
            return procs.HeldChild.start([*cmd, "--hold"], log_path)
        return procs.run_child(cmd, log_path)
    finally:
        os.remove(grid_path)  # (read by the child before it times anything)


def _discard(*args) -> None:
    del args


def list_runs(base: ConfigDict, sweep_dir: str) -> str:
    """JSON list of the grid points with their config overrides (for job launchers; a
    PPO point off the critic defaults also names its ``critic`` variant)."""
    points, resolved = plan(ConfigDict(base.to_dict()), sweep_dir)
    return json.dumps(
        [
            {
                "name": p.name,
                "overrides": {
                    "prompts": p.prompts,
                    "group_size": p.group_size,
                    "lr_rule": p.lr_rule,
                    "lr": resolved[p.name].optimizer.lr,
                    "seed": p.seed,
                    **({"critic": p.critic} if p.critic else {}),
                    **({"variant": p.variant} if p.variant else {}),
                },
            }
            for p in points
        ],
        indent=2,
    )
