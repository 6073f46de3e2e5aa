r"""Merges run directories written by separate jobs into one sweep directory.

Each job of a scaled-out sweep writes one or more run directories (``<jobdir>/runs/<name>/``,
or a bare run directory). This tool gathers them into ``SWEEP_DIR/runs/<name>/`` (copies by
default, symlinks with ``--symlink``) and rebuilds ``SWEEP_DIR/sweep.json`` from each run's
``config.json`` and ``summary.json`` (see ``rl_batch/artifacts.py``)::

    python -m launch.collect --sweep_dir=sweeps/grpo --from=jobs/job1 --from='jobs/*'
    python -m launch.collect --sweep_dir=sweeps/grpo          # re-index runs already there

A source is a run directory (it holds ``config.json``), a directory with a ``runs/``
subdirectory, or a directory of run directories; shell-style globs are expanded.

The same run name found twice with different content (``config.json``, ``summary.json``
and ``metrics.jsonl`` are compared; checkpoints are not) is an error that names both
directories, unless ``--prefer=newest`` picks the one most recently written. A run without
``summary.json`` gets status ``"incomplete"``; a grid point (from ``--runs_json``, or the
``SWEEP_DIR/jobs/runs.json`` that ``launch.make_jobs`` writes) with no run directory gets
status ``"missing"`` (``"incomplete"`` if its directory exists without ``config.json``).
``--analyze`` then calls ``rl_batch.analysis.write_all(sweep_dir)``.

A source sweep's ``calibration.json`` (the step times the analysis takes T and q from)
comes along when the sweep directory has none and the sources hold one calibration; a
line on stderr says it was carried, or why not (`carry_calibration`).

The reference configuration (what every ratio of the analysis is relative to) is
``--reference``, else the existing ``sweep.json``'s, else the one the sweep config set
(``sweep.reference``) as the jobs recorded it: a source's ``sweep.json`` or, for the jobs
of an array (``--only``), each run's ``sweep_point.json``. Runs or sources that record
different references are refused unless ``--reference`` chooses one.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rl_batch import artifacts

INCOMPLETE = "incomplete"
MISSING = "missing"
PREFER_CHOICES = ("error", "newest")
NAME_FROM_CHOICES = ("config", "dir")

# Sweep-level fields read from every run's config.json (``artifacts.sweep_settings``). Runs
# that disagree on the algorithm or the estimator (target, band, crossing) cannot belong to
# one sweep; the runway fields may differ (largest is recorded).
MUST_AGREE_KEYS = artifacts.SWEEP_ESTIMATOR_KEYS
RUNWAY_KEYS = artifacts.SWEEP_RUNWAY_KEYS
ENTRY_CONFIG_KEYS = artifacts.SWEEP_ENTRY_CONFIG_KEYS
ENTRY_FIELDS = artifacts.SWEEP_ENTRY_FIELDS + artifacts.OLD_SWEEP_ENTRY_FIELDS
_FINGERPRINT_FILES = (artifacts.CONFIG_FILE, artifacts.SUMMARY_FILE, artifacts.METRICS_FILE)
# What ``rl_batch.sweeps.sweep.run_sweep(only=...)`` writes into its run directory: the sweep record
# (``reference`` run name, ``reference_key``, ``grid``, ``runs``) the shared sweep.json would
# have held. A job-array sweep has no sweep.json, so this is where its reference is kept.
SWEEP_POINT_FILE = "sweep_point.json"
_MAX_NAMES = 6  # Run names listed per group in a message.

Log = Callable[[str], None]


def _stderr_log(msg: str) -> None:
    print(msg, file=sys.stderr)


@dataclasses.dataclass(frozen=True)
class FoundRun:
    """A run directory found in a source (or already in the sweep directory).

    Attributes:
      name: the run name it will have in the sweep.
      path: the directory as found.
      real_path: ``path`` with symlinks resolved.
      fingerprint: hash of config.json, summary.json and metrics.jsonl.
      mtime: newest modification time of those files (seconds since the epoch).
      in_sweep: whether it already sits at ``SWEEP_DIR/runs/<name>``.
    """

    name: str
    path: str
    real_path: str
    fingerprint: str
    mtime: float
    in_sweep: bool = False


@dataclasses.dataclass(frozen=True)
class CollectResult:
    """What `collect` did.

    Attributes:
      sweep: the sweep.json record written.
      actions: ``(run name, action)`` with action one of ``"copied"``, ``"linked"``,
        ``"replaced"``, ``"unchanged"``.
    """

    sweep: dict[str, Any]
    actions: list[tuple[str, str]]


def is_run_dir(path: str) -> bool:
    """Whether ``path`` is a run directory (a directory holding ``config.json``)."""
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, artifacts.CONFIG_FILE))


def expand_sources(patterns: Iterable[str]) -> list[str]:
    """Expands shell-style globs; each pattern must match at least one directory.

    Args:
      patterns: paths or glob patterns.

    Returns:
      The matching directories, in order, without repeats.
    """
    out: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        matches = [m for m in matches if os.path.isdir(m)]
        if not matches:
            raise FileNotFoundError(f"--from {pattern!r}: no such directory")
        out += [m for m in matches if m not in out]
    return out


def find_run_dirs(path: str, log: Log = _stderr_log) -> list[str]:
    """Returns the run directories a source holds.

    Args:
      path: a run directory, a directory with a ``runs/`` subdirectory (a job's or a
        sweep's directory), or a directory of run directories.
      log: where warnings go.

    Returns:
      Run directory paths, sorted.
    """
    if is_run_dir(path):
        return [path]
    runs_dir = os.path.join(path, artifacts.RUNS_DIR)
    if os.path.isdir(runs_dir):
        return runs_in(runs_dir, log)
    found = runs_in(path, log=None)
    if not found:
        raise ValueError(
            f"{path}: no run directories (a run directory holds {artifacts.CONFIG_FILE}; "
            f"looked at {path}, {runs_dir} and the directories in {path})"
        )
    return found


def runs_in(directory: str, log: Log | None = _stderr_log) -> list[str]:
    """Returns the run directories directly inside ``directory``, sorted.

    Args:
      directory: e.g. a sweep's or a job's ``runs/``.
      log: where to warn about subdirectories that are not runs (no config.json yet);
        None for silence.
    """
    found = []
    for child in sorted(os.listdir(directory)):
        child_path = os.path.join(directory, child)
        if child.startswith(".") or not os.path.isdir(child_path):
            continue
        if is_run_dir(child_path):
            found.append(child_path)
        elif log is not None:
            log(f"warning: {child_path}: no {artifacts.CONFIG_FILE}; not a run, skipped")
    return found


def run_fingerprint(run_dir: str) -> tuple[str, float]:
    """Hashes a run's config.json, summary.json and metrics.jsonl.

    Returns:
      ``(hex digest, newest mtime of those files)``.
    """
    digest = hashlib.sha256()
    mtime = 0.0
    for name in _FINGERPRINT_FILES:
        path = os.path.join(run_dir, name)
        digest.update(name.encode() + b"\0")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                digest.update(f.read())
            mtime = max(mtime, os.path.getmtime(path))
        else:
            digest.update(b"<absent>")
        digest.update(b"\0")
    return digest.hexdigest(), mtime


def run_name(run_dir: str, name_from: str = "config", log: Log = _stderr_log) -> str:
    """The name a run directory gets in the sweep.

    Args:
      run_dir: the run directory.
      name_from: ``"config"`` (config.json's ``name``, falling back to the directory name)
        or ``"dir"`` (the directory name).
      log: where warnings go.
    """
    dir_name = os.path.basename(os.path.normpath(run_dir))
    if name_from == "dir":
        return dir_name
    config = artifacts.read_json(os.path.join(run_dir, artifacts.CONFIG_FILE))
    name = config.get("name") if isinstance(config, dict) else None
    if not isinstance(name, str) or not name:
        return dir_name
    if name != dir_name and os.path.basename(os.path.dirname(os.path.normpath(run_dir))) == (
        artifacts.RUNS_DIR
    ):
        log(f"warning: {run_dir}: config.json names the run {name!r}; using that name")
    if "/" in name or name in (".", ".."):
        raise ValueError(
            f"{run_dir}/{artifacts.CONFIG_FILE}: run name {name!r} is not a valid directory name"
        )
    return name


def _found(path: str, name: str, in_sweep: bool = False) -> FoundRun:
    fingerprint, mtime = run_fingerprint(path)
    return FoundRun(name, path, os.path.realpath(path), fingerprint, mtime, in_sweep)


def choose_runs(
    candidates: Sequence[FoundRun], prefer: str = "error"
) -> tuple[dict[str, FoundRun], list[str]]:
    """Picks one run per name.

    Copies with the same content are one run (a copy already in the sweep wins, else the
    first found). Different content under one name is a conflict: reported, or with
    ``prefer="newest"`` settled by the newest mtime (a tie goes to the one found last).

    Args:
      candidates: every run found, the sweep's own first.
      prefer: ``"error"`` or ``"newest"``.

    Returns:
      ``(name -> chosen run, conflict messages)``; the messages are empty unless
      ``prefer="error"``.
    """
    if prefer not in PREFER_CHOICES:
        raise ValueError(f"prefer must be one of {PREFER_CHOICES}, got {prefer!r}")
    by_name: dict[str, list[FoundRun]] = {}
    for run in candidates:
        by_name.setdefault(run.name, []).append(run)
    chosen: dict[str, FoundRun] = {}
    conflicts: list[str] = []
    for name, runs in by_name.items():
        distinct: dict[str, FoundRun] = {}
        for run in runs:
            distinct.setdefault(run.fingerprint, run)
        if len(distinct) == 1:
            chosen[name] = next(iter(distinct.values()))
        elif prefer == "newest":
            newest = max(reversed(runs), key=lambda r: r.mtime)
            # Among same-content copies of the newest, keep the one already in place.
            same = [r for r in runs if r.fingerprint == newest.fingerprint]
            chosen[name] = next((r for r in same if r.in_sweep), newest)
        else:
            paths = "\n".join(
                f"    {r.path}  (status {_status_of(r.path)}, written {_fmt_time(r.mtime)})"
                for r in distinct.values()
            )
            conflicts.append(f"  run {name!r} differs between:\n{paths}")
    return chosen, conflicts


def _status_of(run_dir: str) -> str:
    path = os.path.join(run_dir, artifacts.SUMMARY_FILE)
    if not os.path.isfile(path):
        return INCOMPLETE
    summary = artifacts.read_json(path)
    return str(summary.get("status") or INCOMPLETE) if isinstance(summary, dict) else INCOMPLETE


def _fmt_time(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t).isoformat(timespec="seconds")


def run_entry(run_dir: str, name: str, log: Log = _stderr_log) -> dict[str, Any]:
    """The sweep.json entry of one run.

    Args:
      run_dir: the run directory.
      name: its run name.
      log: where warnings go.

    Returns:
      ``{"name", "prompts", "group_size", "lr_rule", "lr", "seed", "batch", "status",
      "error"}`` (``artifacts.sweep_entry``: ``lr`` is the effective LR,
      ``artifacts.config_lr``); ``status`` is ``"incomplete"`` without summary.json.
    """
    config_path = os.path.join(run_dir, artifacts.CONFIG_FILE)
    config = artifacts.read_json(config_path)
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: expected a JSON object, got {type(config).__name__}")
    missing = [k for k in ENTRY_CONFIG_KEYS if k not in config]
    if missing:
        log(f"warning: {config_path}: no {', '.join(missing)}; recorded as null")
    status, error = INCOMPLETE, None
    summary_path = os.path.join(run_dir, artifacts.SUMMARY_FILE)
    if os.path.isfile(summary_path):
        summary = artifacts.read_json(summary_path)
        if not isinstance(summary, dict):
            raise ValueError(f"{summary_path}: expected a JSON object")
        status, error = summary.get("status") or INCOMPLETE, summary.get("error")
    return artifacts.sweep_entry(
        name,
        **{k: config.get(k) for k in ENTRY_CONFIG_KEYS if k != "lr"},
        lr=artifacts.config_lr(config),
        batch=artifacts.entry_batch(config.get("derived") or {}),
        critic=artifacts.critic_variant_of(config),
        variant=artifacts.variant_of(config),
        status=status,
        error=error,
    )


def missing_entry(point: dict[str, Any], status: str = MISSING) -> dict[str, Any]:
    """The sweep.json entry of a grid point that has no run (taken from its overrides)."""
    overrides = point.get("overrides", {})
    return artifacts.sweep_entry(
        point["name"],
        **{k: overrides.get(k) for k in ENTRY_CONFIG_KEYS},
        batch=overrides.get("batch"),
        critic=overrides.get("critic") or "",
        variant=overrides.get("variant") or "",
        status=status,
    )


def sweep_fields(configs: dict[str, dict[str, Any]], log: Log = _stderr_log) -> dict[str, Any]:
    """The sweep-level settings (``artifacts.sweep_settings``) that the runs' configs share.

    Args:
      configs: run name -> its config.json.
      log: where warnings go.

    Returns:
      ``{key: value}`` for each of ``artifacts.SWEEP_SETTING_KEYS``; a runway field the
      runs disagree on gets the largest value (with a warning).

    Raises:
      ValueError: the runs disagree on the algorithm, the target, the band's lower edge
        (no band, None, is a value here) or the crossing: they are not one sweep.
    """
    settings = {name: artifacts.sweep_settings(config) for name, config in configs.items()}
    fields: dict[str, Any] = {}
    for key in artifacts.SWEEP_SETTING_KEYS:
        values: dict[str, list[str]] = {}
        for name, s in settings.items():
            values.setdefault(repr(s[key]), []).append(name)
        # An absent algo, target or runway field is unknown; an absent band is no band.
        present = {v: n for v, n in values.items() if v != "None" or key == "target_band_lo"}
        if len(present) > 1:
            detail = "; ".join(f"{v} in {', '.join(sorted(n)[:3])}" for v, n in present.items())
            if key in MUST_AGREE_KEYS:
                raise ValueError(f"runs disagree on {key!r}, so they are not one sweep: {detail}")
            log(f"warning: runs disagree on {key!r} ({detail}); recording the largest")
        nums = [s[key] for s in settings.values() if s[key] is not None]
        if key in RUNWAY_KEYS and len(present) > 1:
            fields[key] = max(nums)
        else:
            fields[key] = nums[0] if nums else None
    return fields


def _sort_key(entry: dict[str, Any]) -> tuple:
    def num(x: Any) -> float:
        return float(x) if isinstance(x, (int, float)) else float("inf")

    return (
        num(artifacts.entry_batch(entry)),
        num(entry["prompts"]),
        num(entry["group_size"]),
        str(entry["lr_rule"]),
        num(entry["lr"]),
        num(entry["seed"]),
        entry["name"],
    )


def order_entries(
    entries: dict[str, dict[str, Any]], grid: Sequence[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    """Grid order for the grid's points, then the other runs by batch, LR rule, LR, seed."""
    grid_names = [p["name"] for p in grid or ()]
    out = [entries[n] for n in grid_names if n in entries]
    rest = [e for n, e in entries.items() if n not in set(grid_names)]
    return out + sorted(rest, key=_sort_key)


def _place(run: FoundRun, dest: str, *, symlink: bool, exclude_checkpoints: bool) -> None:
    """Puts ``run`` at ``dest`` (replacing what is there) without a half-copied state."""
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".incoming-{run.name}-{os.getpid()}")
    if symlink:
        os.symlink(run.real_path, tmp)
    else:

        def ignore(directory: str, names: list[str]) -> list[str]:
            if exclude_checkpoints and os.path.realpath(directory) == run.real_path:
                return [n for n in names if n == artifacts.CHECKPOINT_DIR]
            return []

        shutil.copytree(run.real_path, tmp, symlinks=True, ignore=ignore)
    if os.path.lexists(dest):
        old = os.path.join(parent, f".replaced-{run.name}-{os.getpid()}")
        os.rename(dest, old)
        os.rename(tmp, dest)
        # Never follow a symlink into another job's directory when removing.
        if os.path.islink(old):
            os.unlink(old)
        else:
            shutil.rmtree(old)
    else:
        os.rename(tmp, dest)


def load_grid(path: str) -> list[dict[str, Any]]:
    """Reads a grid: a ``--list_runs`` JSON list or a ``runs.json`` index."""
    from launch import make_jobs

    with open(path) as f:
        return make_jobs.parse_runs(f.read(), path)


@dataclasses.dataclass(frozen=True)
class SweepRecord:
    """The sweep-level fields one job recorded (a source's sweep.json, a run's sweep_point.json).

    Attributes:
      where: who recorded it, for messages: ``"run NAME"`` or the sweep.json path.
      reference: the reference run name the sweep program chose (``sweep.reference``, or its
        default: the smallest batch's first rule).
      reference_key: that run's configuration, ``"PxG:rule"``; None if not recorded.
      grid: the sweep config's ``sweep`` section; None if not recorded.
    """

    where: str
    reference: str
    reference_key: str | None = None
    grid: dict[str, Any] | None = None


def sweep_record(obj: Any, where: str) -> SweepRecord | None:
    """The `SweepRecord` of a sweep.json / sweep_point.json object; None without a reference."""
    if not isinstance(obj, dict) or not isinstance(obj.get("reference"), str):
        return None
    if not obj["reference"]:
        return None
    key, grid = obj.get("reference_key"), obj.get("grid")
    return SweepRecord(
        where,
        obj["reference"],
        key if isinstance(key, str) and key else None,
        grid if isinstance(grid, dict) else None,
    )


def read_sweep_point(
    run_dir: str, name: str, log: Log = _stderr_log
) -> tuple[SweepRecord | None, dict[str, Any]]:
    """Reads the ``sweep_point.json`` a job-array run (``--only``) wrote into its directory.

    Args:
      run_dir: the run directory.
      name: its run name.
      log: where warnings go.

    Returns:
      ``(its SweepRecord or None, the extra fields of its own entry, e.g. "key", "wall_s")``;
      ``(None, {})`` when the run has no sweep_point.json (it was not an array job).
    """
    path = os.path.join(run_dir, SWEEP_POINT_FILE)
    if not os.path.isfile(path):
        return None, {}
    obj = artifacts.read_json(path)
    record = sweep_record(obj, f"run {name}")
    if record is None:
        log(f"warning: {path}: no 'reference' recorded; not used to find the reference")
        return None, {}
    return record, _entry_extras(obj).get(name, {})


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_MAX_NAMES])
    return shown + (f" and {len(names) - _MAX_NAMES} more" if len(names) > _MAX_NAMES else "")


def agreed_reference(records: Sequence[SweepRecord]) -> tuple[SweepRecord | None, str | None]:
    """The reference the records agree on.

    Args:
      records: what the jobs recorded (sources' sweep.json, runs' sweep_point.json).

    Returns:
      ``(a record of the agreed reference, None)``; ``(None, None)`` without records; or
      ``(None, message)`` naming who recorded which reference when they disagree.
    """
    groups: dict[str, list[SweepRecord]] = {}
    for r in records:
        groups.setdefault(r.reference, []).append(r)
    if len(groups) <= 1:
        for same in groups.values():
            # A record with the configuration key, if any has one.
            return next((r for r in same if r.reference_key), same[0]), None
        return None, None
    lines = []
    for ref, rs in groups.items():
        key = next((r.reference_key for r in rs if r.reference_key), None)
        lines.append(f"    {ref!r}{f' ({key})' if key else ''}: {_names([r.where for r in rs])}")
    return None, (
        "the runs were launched with different reference configurations (sweep.reference, "
        f"as each job recorded it in {SWEEP_POINT_FILE} or sweep.json), so they share no one "
        "reference batch:\n" + "\n".join(lines)
    )


def agreed_grid(records: Sequence[SweepRecord], log: Log = _stderr_log) -> dict[str, Any] | None:
    """The ``grid`` the records agree on; None (with a warning) if they differ or have none."""
    groups: dict[str, list[SweepRecord]] = {}
    for r in records:
        if r.grid is not None:
            groups.setdefault(json.dumps(r.grid, sort_keys=True), []).append(r)
    if len(groups) > 1:
        detail = "; ".join(f"{g} in {_names([r.where for r in rs])}" for g, rs in groups.items())
        log(
            f"warning: the runs were launched from different sweep grids ({detail}); "
            "sweep.json gets no 'grid'"
        )
        return None
    return next((rs[0].grid for rs in groups.values()), None)


def _key_of(reference: str, entries: dict[str, dict[str, Any]]) -> str | None:
    """The configuration ``"PxG:rule"`` a reference names (a run name or a key), if known."""
    entry = entries.get(reference)
    if entry is not None:
        if all(entry.get(k) is not None for k in ("prompts", "group_size", "lr_rule")):
            return _point_key(entry)
        return None
    try:
        prompts, group, rule, critic, variant = artifacts.parse_key(reference)
        return artifacts.point_key(prompts, group, rule, critic or "", variant)
    except ValueError:
        return None


def collect(
    sweep_dir: str,
    sources: Sequence[str] = (),
    *,
    symlink: bool = False,
    prefer: str = "error",
    name_from: str = "config",
    sweep_name: str | None = None,
    reference: str | None = None,
    grid: Sequence[dict[str, Any]] | None = None,
    exclude_checkpoints: bool = False,
    log: Log = _stderr_log,
) -> CollectResult:
    """Merges run directories into ``sweep_dir`` and rewrites its sweep.json.

    Nothing in ``sweep_dir`` changes when a conflict or an inconsistent sweep is found.

    Args:
      sweep_dir: the sweep directory (created if absent). Runs already in
        ``sweep_dir/runs`` stay and are indexed too.
      sources: directories (already glob-expanded) to take runs from; see `find_run_dirs`.
      symlink: link runs into the sweep instead of copying them.
      prefer: ``"error"`` (conflicting runs are an error) or ``"newest"``.
      name_from: ``"config"`` or ``"dir"``; see `run_name`.
      sweep_name: sweep.json ``name``; default: the old sweep.json's, else the directory's.
      reference: run name (or ``"PxG:rule"`` key) of the reference configuration; default:
        the old sweep.json's, else the one the jobs recorded (sources' sweep.json, runs'
        sweep_point.json), which must agree.
      grid: the sweep's grid points; points with no run directory get status "missing".
      exclude_checkpoints: copy runs without their ``checkpoints/`` directory.
      log: where progress and warnings go.

    Returns:
      What was written and done.

    Raises:
      ValueError: conflicting runs, runs of different algorithms or targets, or (without
        ``reference`` or an old sweep.json reference) jobs that recorded different references.
    """
    if name_from not in NAME_FROM_CHOICES:
        raise ValueError(f"name_from must be one of {NAME_FROM_CHOICES}, got {name_from!r}")
    runs_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR)
    sweep_path = os.path.join(sweep_dir, artifacts.SWEEP_FILE)
    old_sweep = artifacts.read_json(sweep_path) if os.path.isfile(sweep_path) else {}

    # The sweep's own runs first: a same-content copy elsewhere then needs no copying.
    candidates: list[FoundRun] = []
    # Fields a sweep program added to a run's entry (e.g. "key", "wall_s") travel with it.
    extras: dict[FoundRun, dict[str, Any]] = {}
    in_place = set()
    old_extras = _entry_extras(old_sweep)
    if os.path.isdir(runs_dir):
        for path in runs_in(runs_dir, log):
            run = _found(path, os.path.basename(path), in_sweep=True)
            candidates.append(run)
            extras[run] = old_extras.get(run.name, {})
            in_place.add(os.path.realpath(path))
    source_sweeps = []
    records: list[SweepRecord] = []  # What the jobs recorded about the sweep's reference.
    for source in sources:
        source_sweep_path = os.path.join(source, artifacts.SWEEP_FILE)
        source_sweep = {}
        if os.path.isfile(source_sweep_path):
            source_sweep = artifacts.read_json(source_sweep_path)
            source_sweeps.append(source_sweep)
            record = sweep_record(source_sweep, source_sweep_path)
            if record is not None:
                records.append(record)
        source_extras = _entry_extras(source_sweep)
        for path in find_run_dirs(source, log):
            if os.path.realpath(path) in in_place:
                continue  # The sweep's own run, reached through the source list.
            run = _found(path, run_name(path, name_from, log))
            candidates.append(run)
            extras[run] = source_extras.get(run.name, {})

    chosen, conflicts = choose_runs(candidates, prefer)
    if conflicts:
        raise ValueError(
            "conflicting runs (same name, different config/summary/metrics); rerun with "
            "--prefer=newest to keep the most recently written, or remove one:\n"
            + "\n".join(conflicts)
        )
    if not chosen and not grid:
        raise ValueError(f"no runs found in {sweep_dir} or in {list(sources)}")

    configs = {
        name: artifacts.read_json(os.path.join(run.path, artifacts.CONFIG_FILE))
        for name, run in chosen.items()
    }
    fields = sweep_fields(configs, log)
    # Jobs of an array (--only) left the sweep record in each run's sweep_point.json.
    point_extras: dict[str, dict[str, Any]] = {}
    for name, run in sorted(chosen.items()):
        record, point_extras[name] = read_sweep_point(run.path, name, log)
        if record is not None:
            records.append(record)
    entries = {
        name: {**point_extras[name], **extras.get(run, {}), **run_entry(run.path, name, log)}
        for name, run in chosen.items()
    }
    for point in grid or ():
        if point["name"] not in entries:
            # A directory without config.json: the job started but wrote nothing yet.
            started = os.path.isdir(os.path.join(runs_dir, point["name"]))
            entries[point["name"]] = {
                **old_extras.get(point["name"], {}),
                **missing_entry(point, INCOMPLETE if started else MISSING),
            }

    reference, reference_key = _choose_reference(
        reference, old_sweep, records, entries, chosen, log
    )
    _check_reference_runs(reference, reference_key, chosen, entries, log)

    # Every check passed: now change the sweep directory.
    actions = []
    for name, run in sorted(chosen.items()):
        dest = os.path.join(runs_dir, name)
        if run.in_sweep:
            actions.append((name, "unchanged"))
            continue
        replacing = os.path.lexists(dest)
        _place(run, dest, symlink=symlink, exclude_checkpoints=exclude_checkpoints)
        actions.append((name, "replaced" if replacing else "linked" if symlink else "copied"))

    # Top-level fields a sweep program added are kept; a reference_key would describe
    # another reference than this one.
    prior = dict(old_sweep or (source_sweeps[0] if source_sweeps else {}))
    sweep = artifacts.sweep_record(
        sweep_name
        or old_sweep.get("name")
        or os.path.basename(os.path.normpath(os.path.abspath(sweep_dir))),
        {**prior, **fields},
        order_entries(entries, grid),
        reference=reference,
        reference_key=reference_key,
        grid=prior["grid"] if prior.get("grid") is not None else agreed_grid(records, log),
        **{k: v for k, v in prior.items() if k not in artifacts.SWEEP_RECORD_KEYS},
    )
    artifacts.write_sweep(sweep_path, sweep)
    carry_calibration(sweep_dir, sources, log)
    return CollectResult(sweep=sweep, actions=actions)


def carry_calibration(sweep_dir: str, sources: Sequence[str], log: Log = _stderr_log) -> None:
    """Carries a source sweep's ``calibration.json`` (the step times T and q come from)
    into ``sweep_dir``, and says what it did.

    The sweep's own calibration is kept; a source's that differs from it, or sources whose
    calibrations differ from each other, are not carried, and the line says so.
    """
    own = os.path.join(sweep_dir, artifacts.CALIBRATION_FILE)
    found = {
        source: artifacts.read_json(path)
        for source in sources
        if os.path.isfile(path := os.path.join(source, artifacts.CALIBRATION_FILE))
    }
    if not found:
        return
    if os.path.isfile(own):
        mine = artifacts.read_json(own)
        differ = sorted(source for source, record in found.items() if record != mine)
        if differ:
            log(f"kept {own}; the calibration.json of {_names(differ)} differs and was not carried")
        return
    if any(record != next(iter(found.values())) for record in found.values()):
        log(
            f"calibration.json not carried: {_names(sorted(found))} hold different ones "
            f"(copy the one to use to {own})"
        )
        return
    source = sorted(found)[0]
    artifacts.write_json_atomic(own, found[source])
    log(f"calibration.json carried from {source} (T and q use its step times)")


def _choose_reference(
    reference: str | None,
    old_sweep: dict[str, Any],
    records: Sequence[SweepRecord],
    entries: dict[str, dict[str, Any]],
    chosen: dict[str, FoundRun],
    log: Log,
) -> tuple[str | None, str | None]:
    """The sweep's reference: ``reference``, else the old sweep.json's, else the recorded one.

    Returns:
      ``(reference, its configuration "PxG:rule" or None)``.

    Raises:
      ValueError: neither ``reference`` nor an old one is given and the records disagree.
    """
    agreed, disagreement = agreed_reference(records)
    recorded = (agreed.reference, agreed.reference_key) if agreed else ()
    if reference is not None or old_sweep.get("reference"):
        how = "--reference" if reference is not None else "the existing sweep.json's reference"
        reference = reference if reference is not None else old_sweep["reference"]
        if disagreement:
            log(f"warning: {disagreement}\nusing {how} {reference!r}")
        elif agreed and reference not in recorded:
            log(
                f"warning: using {how} {reference!r}, not the reference the jobs were launched "
                f"with ({agreed.reference!r} from {agreed.where})"
                + ("" if how == "--reference" else f"; pass --reference={agreed.reference}")
            )
        key = _key_of(reference, entries)
        if key is None and agreed and reference in recorded:
            key = agreed.reference_key
        if key is None and reference == old_sweep.get("reference"):
            key = old_sweep.get("reference_key")
        return reference, key
    if disagreement:
        raise ValueError(
            f"{disagreement}\npass --reference=RUN_NAME (or a PxG:rule key) to choose the "
            "reference, or collect these runs into separate sweeps"
        )
    if agreed is None:
        log(
            "warning: no reference run known (no --reference, no sweep.json reference, no "
            f"{SWEEP_POINT_FILE} in the runs): the analysis will use the smallest-batch sqrt "
            "configuration; pass --reference=RUN_NAME"
        )
        return None, None
    key = agreed.reference_key or _key_of(agreed.reference, entries)
    if key is not None and agreed.reference not in chosen:
        # The analysis matches a run name only among run directories: name the
        # configuration, so its other seeds stand for it.
        log(
            f"reference run {agreed.reference!r} (from {agreed.where}) has no run directory; "
            f"recording its configuration {key!r} as the reference"
        )
        return key, key
    return agreed.reference, key


def _check_reference_runs(
    reference: str | None,
    reference_key: str | None,
    chosen: dict[str, FoundRun],
    entries: dict[str, dict[str, Any]],
    log: Log,
) -> None:
    """Warns when the analysis could not find the reference among the runs."""
    if reference is None:
        return
    keys = {_point_key(e) for e in entries.values()}
    if reference not in entries and reference not in keys and reference_key not in keys:
        log(f"warning: reference {reference!r} is neither a run nor a grid key (PxG:rule)")
        return
    same = [n for n in chosen if _point_key(entries[n]) == reference_key]
    if reference_key is not None and not any(entries[n]["status"] != "failed" for n in same):
        log(
            f"warning: no run of the reference configuration {reference_key!r} is here "
            f"({'all failed' if same else 'none collected'}); the analysis cannot compare "
            "against it and falls back to the smallest-batch sqrt configuration"
        )
    elif reference_key is not None and reference not in chosen and reference != reference_key:
        log(
            f"warning: reference run {reference!r} has no run directory; the analysis looks "
            f"the reference up by run name and falls back to the smallest-batch sqrt "
            f"configuration; pass --reference={reference_key} to use its other seeds"
        )


def _entry_extras(sweep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Run name -> the non-contract fields of its sweep.json entry (an old entry's
    ``batch_responses`` is the contract's ``batch`` and is not carried over)."""
    out = {}
    for entry in sweep.get("runs") or []:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            out[entry["name"]] = {k: v for k, v in entry.items() if k not in ENTRY_FIELDS}
    return out


def _point_key(entry: dict[str, Any]) -> str:
    """The sweep programs' configuration key, e.g. ``"64x8:sqrt"``."""
    prompts, group, rule = entry.get("prompts"), entry.get("group_size"), entry.get("lr_rule")
    return artifacts.point_key(
        prompts, group, rule, entry.get("critic") or "", entry.get("variant") or ""
    )


def run_analysis(sweep_dir: str) -> str | None:
    """Calls ``rl_batch.analysis.write_all(sweep_dir)`` if that module provides it.

    Returns:
      None on success, else why the analysis could not run.
    """
    import importlib

    try:
        analysis = importlib.import_module("rl_batch.analysis")
    except ModuleNotFoundError as e:
        if e.name not in ("rl_batch.analysis", "rl_batch"):
            raise  # The module exists but one of its own imports is missing.
        return f"rl_batch.analysis is not available ({e}); sweep.json was written, no figures"
    write_all = getattr(analysis, "write_all", None)
    if write_all is None:
        return "rl_batch.analysis has no write_all(); sweep.json was written, no figures"
    write_all(sweep_dir)
    return None


def main(argv: Sequence[str]) -> int:
    """Command-line entry point (absl). Extra positional arguments are sources too."""
    from absl import flags

    f = flags.FLAGS
    grid_path = f.runs_json
    default_index = os.path.join(f.sweep_dir, "jobs", "runs.json")
    if grid_path is None and os.path.isfile(default_index):
        grid_path = default_index
        _stderr_log(f"grid from {grid_path}")
    try:
        sources = expand_sources(list(f["from"].value or []) + list(argv[1:]))
        grid = load_grid(grid_path) if grid_path else None
        result = collect(
            f.sweep_dir,
            sources,
            symlink=f.symlink,
            prefer=f.prefer,
            name_from=f.name_from,
            sweep_name=f.name,
            reference=f.reference,
            grid=grid,
            exclude_checkpoints=f.exclude_checkpoints,
        )
    except (ValueError, OSError) as e:
        from experiments import cli

        cli.fail(e)  # the shared error path: one line
    counts: dict[str, int] = {}
    for _, action in result.actions:
        counts[action] = counts.get(action, 0) + 1
    statuses: dict[str, int] = {}
    for entry in result.sweep["runs"]:
        statuses[entry["status"]] = statuses.get(entry["status"], 0) + 1
    print(
        f"{os.path.join(f.sweep_dir, artifacts.SWEEP_FILE)}: {len(result.sweep['runs'])} runs "
        f"({', '.join(f'{n} {s}' for s, n in sorted(statuses.items()))}); "
        f"{', '.join(f'{n} {a}' for a, n in sorted(counts.items())) or 'nothing moved'}"
    )
    if f.analyze:
        try:
            problem = run_analysis(f.sweep_dir)
        except Exception as e:  # The merge is done; say why the figures are not.
            problem = f"rl_batch.analysis.write_all failed: {type(e).__name__}: {e}"
        if problem:
            _stderr_log(f"launch.collect: --analyze: {problem}")
            return 1
        print(f"analysis written under {f.sweep_dir}")
    return 0


def _define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("sweep_dir", None, "Sweep directory to merge into (created if absent).")
    flags.DEFINE_multi_string(
        "from",
        None,
        "Source: a job directory, a run directory or a "
        "directory of runs; globs allowed (repeatable).",
    )
    flags.DEFINE_boolean("symlink", False, "Symlink runs into the sweep instead of copying.")
    flags.DEFINE_enum(
        "prefer",
        "error",
        list(PREFER_CHOICES),
        "Same run name with different content: fail, or keep the newest.",
    )
    flags.DEFINE_enum(
        "name_from",
        "config",
        list(NAME_FROM_CHOICES),
        "Run name from config.json's 'name' or from the directory name.",
    )
    flags.DEFINE_string("name", None, "sweep.json name (default: kept, else the directory's).")
    flags.DEFINE_string(
        "reference",
        None,
        "Run name (or PxG:rule key) of the reference configuration; default: the existing "
        "sweep.json's, else the one the jobs recorded (sweep.json, runs' sweep_point.json).",
    )
    flags.DEFINE_string(
        "runs_json",
        None,
        "Grid (runs.json or --list_runs output); default SWEEP_DIR/jobs/runs.json when present "
        "(make_jobs' OUT_DIR/runs.json: for --scheduler=tpu, ./jobs/<sweep name>/runs.json).",
    )
    flags.DEFINE_boolean("exclude_checkpoints", False, "Copy runs without checkpoints/.")
    flags.DEFINE_boolean("analyze", False, "Then call rl_batch.analysis.write_all(sweep_dir).")
    flags.mark_flag_as_required("sweep_dir")


if __name__ == "__main__":
    from experiments import cli  # the shared error path: one line for every mistake

    _define_flags()
    cli.run(main)  # app.run exits with main's return value.
