"""Outside runs -> run and sweep directories of our contract (``rl_batch/artifacts.py``).

A run's rows (`sources.Logged`) are merged by update step, its keys resolved through a
key map (`keymap`), and written as ``config.json``, ``metrics.jsonl`` (update and eval
lines) and ``summary.json`` (N*, T, q from ``rl_batch.targets``, as our own runs); the
runs then make a sweep directory (``sweep.json`` + ``runs/``) that
``experiments.figures``, ``plan_batch`` and ``compare_studies`` read unchanged.

Axes: a row at step s comes after ``s - first_update_step + 1`` updates; update u
retained B = P x G responses (or the key map's logged count), so ``responses_cum`` is
their running sum and an evaluation at step s sits at the responses after its updates.
Time (the key map's ``time``): per-step seconds (a step key, else the phases' sum) minus
the excluded keys where the framework times them inside the step (`excluded_inside_step`:
by the key map, by the run's framework version, or by evidence in the log), summed; the
step's seconds that are no phase are idle/other (``time_idle_s``), so the cost shares add
up to the logged step. Or cumulative seconds (``elapsed``, or the rows' wall-clock
``timestamps``), zeroed one mean update before the first update (start-up and model
loading are not training) and interpolated over updates without a row. Without timing
the run has no ``time_train_cum_s``: the analysis gives N* and r_N only.

Nothing silent: every value written is finite and in range (accuracy in [0, 1],
seconds >= 0, phases within their step, LR and counts > 0), or the run is refused with
one line naming run, file, step and key (verl's file logger writes NaN as ``null``,
which reads as NaN here and is refused the same way). A step logged twice with
different values (a resumed job logs the steps after its checkpoint again) takes the
later value, and the run says which steps (`ImportedRun.relogged`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import numpy as np

from rl_batch import artifacts, targets
from rl_batch.analysis.importers import keymap as km_lib
from rl_batch.analysis.importers.keymap import ImportProblem
from rl_batch.analysis.importers.sources import WALL, Logged

ROLLOUT_KEYS = "independent"  # not "rollout" / "prompt": time_to_target.matched_pair
NO_TIMING_NOTE = "no timing: N* and r_N only (no q, T, r_q)"
IDLE_TOLERANCE_S = 1e-3  # timer rounding: phases may exceed their step by this much


@dataclasses.dataclass
class ImportedRun:
    """One run converted: what its directory will hold, and what it lacked."""

    name: str
    source_path: str
    prompts: int
    group_size: int
    seed: int | None
    lr: float | None
    lr_rule: str
    config: dict[str, Any]
    records: list[dict[str, Any]]
    notes: list[str]
    relogged: list[int] = dataclasses.field(default_factory=list)  # source steps
    timing_rule: str | None = None  # how excluded time was decided (printed)

    @property
    def timed(self) -> bool:
        return any("time_train_cum_s" in r for r in self.records if r["kind"] == "update")


def _where(name: str, path: str) -> str:
    return f"run {name}: {path}"


def read_run_config(
    run_path: str, logged: Logged, km: dict[str, Any], overrides: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """The run's config: the source's own (W&B), then the key map's ``config_files`` in
    the run directory, then ``overrides`` (flat dotted keys). Returns (config, the file it
    came from or a description of where it was looked for)."""
    config = dict(logged.config)
    where = logged.path if config else ""
    run_dir = run_path if os.path.isdir(run_path) else os.path.dirname(run_path)
    for rel in km.get("config_files") or []:
        path = os.path.join(run_dir, rel)
        if os.path.isfile(path):
            config.update(_read_config_file(path))
            where = path
            break
    if not where:
        names = ", ".join(km.get("config_files") or []) or "none named"
        where = f"{run_dir} (no config file: {names})"
    config.update(overrides)
    return config, where


def _read_config_file(path: str) -> dict[str, Any]:
    """A run's config file (YAML or JSON) as a mapping; a damaged one is one line."""
    try:
        if path.endswith((".yaml", ".yml")):
            import yaml

            with open(path) as f:
                data = yaml.safe_load(f)
        else:
            with open(path) as f:
                data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:  # json.JSONDecodeError is a ValueError
        raise ImportProblem(f"{path}: malformed config file: {_first_line(e)}") from None
    except Exception as e:  # yaml.YAMLError and its kin (PyYAML's, not a ValueError)
        if type(e).__module__.startswith("yaml"):
            raise ImportProblem(f"{path}: malformed config file: {_first_line(e)}") from None
        raise
    if not isinstance(data, dict):
        raise ImportProblem(f"{path}: a config file holds a mapping")
    return data


def _first_line(e: BaseException) -> str:
    """An exception's message on one line (its lines joined)."""
    return " ".join(str(e).split()) or type(e).__name__


def _finite(value: float, key: str, step: int, name: str, path: str) -> float:
    """``value`` when finite, else the run is refused naming run, file, step and key."""
    if not math.isfinite(value):
        what = "null or NaN" if math.isnan(value) else f"{value:g}"
        raise ImportProblem(
            f"{_where(name, path)}: step {step}: {key} is {what} (not a number the analysis "
            "can use; verl's file logger writes NaN and inf as null)"
        )
    return value


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def merge_by_step(
    logged: Logged, km: dict[str, Any], name: str
) -> tuple[dict[int, dict[str, float]], dict[int, float], list[int]]:
    """Rows merged per step, each step's first wall time, and the re-logged steps.

    The rule for a step logged twice: the later value wins (a resumed job logs again the
    steps after its last checkpoint, and what it logs then is what the run continued
    from). Steps where a key got a different value are returned, so the import says so.

    Raises:
      ImportProblem: no row carries a step key, or a step is not a whole number.
    """
    step_keys = km_lib.alternatives(km["step"])
    by_step: dict[int, dict[str, float]] = {}
    wall: dict[int, float] = {}
    relogged: set[int] = set()
    for row in logged.rows:
        key = next((k for k in step_keys if k in row), None)
        if key is None:
            continue
        raw = row[key]
        if not math.isfinite(raw) or raw != round(raw) or raw < 0:
            raise ImportProblem(
                f"{_where(name, logged.path)}: step key {key} = {raw:g}: not a whole number "
                ">= 0 (null and NaN included)"
            )
        s = int(raw)
        merged = by_step.setdefault(s, {})
        for k, v in row.items():
            if k == WALL:
                continue
            if k in merged and not _same(merged[k], v):
                relogged.add(s)
            merged[k] = v
        if WALL in row:
            wall[s] = min(wall.get(s, row[WALL]), row[WALL])
    if not by_step:
        raise ImportProblem(
            f"{_where(name, logged.path)}: no row carries a step key (key map 'step': {step_keys})"
        )
    return by_step, wall, sorted(relogged)


def step_ranges(steps: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5, 9"``."""
    out, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        out.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ", ".join(out)


def _resolve(field: str, patterns: Any, keys: set[str], name: str, path: str) -> str | None:
    try:
        return km_lib.match_key(km_lib.alternatives(patterns), keys)
    except ImportProblem as e:
        raise ImportProblem(f"{_where(name, path)}: key map '{field}': {e}") from None


def batch_shape(
    km: dict[str, Any], config: dict[str, Any], name: str, where: str
) -> tuple[int, int]:
    """(P, G) from the key map's ``prompts``, ``group_size`` and ``batch`` specs.

    Raises:
      ImportProblem: fewer than two of them resolve, or they disagree with integers.
    """
    defaults = km.get("config_defaults") or {}
    values, missing = {}, {}
    for field in ("prompts", "group_size", "batch"):
        v, miss = km_lib.resolve_value(km.get(field), config, defaults)
        values[field] = v
        if miss is not None:
            missing[field] = miss
    p, g, b = values["prompts"], values["group_size"], values["batch"]
    if p is None and g is not None and b is not None:
        p = b / g
    elif g is None and p is not None and b is not None:
        g = b / p
    if p is None or g is None:
        field, key = next(iter(missing.items()), ("group_size", "(no spec)"))
        raise ImportProblem(
            f"run {name}: {where}: no config key {key!r} (key map '{field}'); set it with "
            f"--set {key}=N"
        )
    if abs(p - round(p)) > 1e-9 or abs(g - round(g)) > 1e-9 or p < 1 or g < 1:
        raise ImportProblem(
            f"run {name}: {where}: prompts {p:g} and group size {g:g} are not whole numbers "
            "(check the key map's prompts, group_size and batch)"
        )
    return int(round(p)), int(round(g))


@dataclasses.dataclass
class Timing:
    """A run's training time per update (None: untimed), with its phases and notes.

    Attributes:
      cum_s: cumulative training seconds after each update, or None.
      phases: per update, our field (``time_generate_s`` ... ``time_idle_s``) -> seconds.
      note: why the run is untimed (None when timed).
      rule: how the excluded keys were treated (one line for the import's output).
    """

    cum_s: np.ndarray | None
    phases: list[dict[str, float]]
    note: str | None
    rule: str | None = None


def excluded_inside_step(
    tm: dict[str, Any],
    config: dict[str, Any],
    rows: dict[int, dict[str, float]],
    keys: set[str],
    step_key: str | None,
    phase_keys: dict[str, str],
    exclude: list[str],
) -> tuple[bool, str]:
    """Whether the excluded keys (validation, checkpoints) are timed inside ``step_key``.

    The key map's ``time.exclude_in_step`` is true, false, or a rule
    ``{"version_config": [config keys], "inside_before": "0.6.0"}``: the run's framework
    version (a config entry, or ``--set``) decides when recorded; else the log does. On
    the steps that logged excluded time, the step less every timer inside it (the key
    map's ``time.step_timers``, else its phases) leaves the excluded time when the step
    holds it, and about nothing when it does not: inside when the median of that rest
    over the excluded time is at least one half.

    Returns:
      (inside, how it was decided: one phrase for the import's output).
    """
    rule = tm.get("exclude_in_step", True)
    if not exclude:
        return False, "nothing to exclude"
    if isinstance(rule, bool):
        return rule, "as the key map says"
    for key in km_lib.alternatives(rule.get("version_config")):
        v = km_lib.config_get(config, key, {})
        version = km_lib.version_tuple(v) if v is not None else None
        if version is not None:
            inside = version < km_lib.version_tuple(rule["inside_before"])
            return inside, f"by version: {key} = {v}"
    if step_key is None:
        return False, "no step timer"
    timers = [k for k in (km_lib.alternatives(tm.get("step_timers"))) if k in keys]
    timers = timers or list(phase_keys.values())
    fractions = []
    for r in rows.values():
        excl = sum(r.get(k, 0.0) for k in exclude)
        if step_key in r and excl > 0:
            rest = r[step_key] - sum(r.get(k, 0.0) for k in timers)
            fractions.append(rest / excl)
    if not fractions:
        return False, "no step logged excluded time"
    inside = float(np.median(fractions)) >= 0.5
    return inside, (
        "by evidence: on steps that logged it, the step less its timers "
        + ("holds it" if inside else "does not hold it")
    )


def _per_update_values(
    updates: list[int], rows: dict[int, dict[str, float]], key: str, window: str
) -> list[float | None]:
    """``key``'s value for each update: its own row's, or (``since_last_row``) the next
    row's that logged it (a mean over the updates since the previous log)."""
    out: list[float | None] = []
    pending = 0  # updates waiting for the next row that logs the key (since_last_row)
    for s in updates:
        row = rows.get(s, {})
        if key in row:
            out.extend([row[key]] * (pending + 1 if window == "since_last_row" else 1))
            pending = 0
        elif window == "since_last_row":
            pending += 1
        else:
            out.append(None)
    return out + [None] * pending


def train_time(
    updates: list[int],
    rows: dict[int, dict[str, float]],
    wall: dict[int, float],
    km: dict[str, Any],
    config: dict[str, Any],
    keys: set[str],
    name: str,
    path: str,
) -> Timing:
    """Training seconds per update from the key map's ``time`` (see the module doc).

    Raises:
      ImportProblem: a time is not finite, negative, or phases exceed their step (one
        line: run, file, step, key).
    """
    tm = km.get("time") or {}
    step_key = _resolve("time.step", tm.get("step"), keys, name, path)
    phase_keys = {
        ph: k
        for ph, pat in (tm.get("phases") or {}).items()
        if (k := _resolve(f"time.phases.{ph}", pat, keys, name, path)) is not None
    }
    exclude = [
        k
        for pat in tm.get("exclude") or []
        if (k := _resolve("time.exclude", pat, keys, name, path))
    ]
    timed_keys = [k for k in (step_key, *phase_keys.values(), *exclude) if k]
    for s in updates:
        for k in timed_keys:
            if k in rows.get(s, {}):
                _finite(rows[s][k], k, s, name, path)
                if rows[s][k] < 0:
                    raise ImportProblem(
                        f"{_where(name, path)}: step {s}: {k} = {rows[s][k]:g} s is negative"
                    )
    if step_key is not None or phase_keys:
        return _per_step_time(
            updates, rows, tm, config, keys, step_key, phase_keys, exclude, name, path
        )
    elapsed_key = _resolve("time.elapsed", tm.get("elapsed"), keys, name, path)
    if elapsed_key is not None:
        clock = {
            s: _finite(r[elapsed_key], elapsed_key, s, name, path)
            for s, r in rows.items()
            if elapsed_key in r
        }
    elif tm.get("timestamps") and wall:
        clock = dict(wall)
    else:
        return Timing(None, [], "the key map names no timing the run logs")
    excl = np.cumsum([sum(rows.get(s, {}).get(k, 0.0) for k in exclude) for s in updates])
    timed = [(i, clock[s]) for i, s in enumerate(updates) if s in clock]
    if len(timed) < 2:
        return Timing(None, [], "fewer than two updates carry a time")
    (i0, c0), (i1, c1) = timed[0], timed[-1]
    zero = c0 - (c1 - c0 - (excl[i1] - excl[i0])) / (i1 - i0) * (i0 + 1)
    idx = np.array([i for i, _ in timed], dtype=np.float64)
    cum = np.interp(np.arange(len(updates)), idx, np.array([c for _, c in timed])) - zero - excl
    steps = np.diff(np.concatenate([[0.0], cum]))
    bad = np.flatnonzero(steps < -IDLE_TOLERANCE_S)
    if bad.size:
        s = updates[int(bad[0])]
        clock_name = elapsed_key or "the rows' wall-clock times"
        raise ImportProblem(
            f"{_where(name, path)}: step {s}: {clock_name} goes back in time "
            f"({steps[bad[0]]:g} s for the update, after exclusions)"
        )
    how = "excluded keys taken off the clock" if exclude else None
    return Timing(cum, [{} for _ in updates], None, how)


def _per_step_time(
    updates: list[int],
    rows: dict[int, dict[str, float]],
    tm: dict[str, Any],
    config: dict[str, Any],
    keys: set[str],
    step_key: str | None,
    phase_keys: dict[str, str],
    exclude: list[str],
    name: str,
    path: str,
) -> Timing:
    """`train_time` from per-step seconds (a step key, else the phases' sum)."""
    inside, how = excluded_inside_step(tm, config, rows, keys, step_key, phase_keys, exclude)
    rule = None
    if exclude:
        where = "inside" if inside else "outside"
        what = f"{', '.join(exclude)} {where} {step_key or 'the phases'}"
        rule = f"{what}, {'subtracted' if inside else 'nothing subtracted'} ({how})"
    window = tm.get("step_window", "row")
    if step_key is not None:
        totals = _per_update_values(updates, rows, step_key, window)
    else:
        totals = [
            sum(rows[s].get(k, 0.0) for k in phase_keys.values())
            if any(k in rows.get(s, {}) for k in phase_keys.values())
            else None
            for s in updates
        ]
    missing = sum(x is None for x in totals)
    if missing:
        note = f"timing keys missing at {missing} of {len(totals)} updates"
        return Timing(None, [], note, rule)
    secs, phases = [], []
    for s, total in zip(updates, totals):
        row = rows.get(s, {})
        excluded = sum(row.get(k, 0.0) for k in exclude) if inside else 0.0
        train = total - excluded
        if train < 0:
            raise ImportProblem(
                f"{_where(name, path)}: step {s}: {step_key} = {total:g} s less excluded "
                f"{excluded:g} s ({', '.join(exclude)}) is negative"
            )
        parts = {f"time_{ph}_s": row[k] for ph, k in phase_keys.items() if k in row}
        if step_key is not None and phase_keys:
            idle = train - sum(parts.values())
            if idle < -IDLE_TOLERANCE_S:
                raise ImportProblem(
                    f"{_where(name, path)}: step {s}: phases "
                    f"{' + '.join(k for k in phase_keys.values() if k in row)} = "
                    f"{sum(parts.values()):g} s exceed {step_key} = {train:g} s"
                    f"{' less excluded time' if excluded else ''}"
                )
            parts["time_idle_s"] = max(idle, 0.0)
        secs.append(train)
        phases.append(parts)
    return Timing(np.cumsum(np.array(secs, dtype=np.float64)), phases, None, rule)


def with_field_overrides(km: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The key map with ``--set`` values of our own fields (`keymap.FIELD_OVERRIDES`:
    prompts, group_size, batch, seed, lr, lr_rule) in place of what it reads."""
    km = dict(km)
    for field in km_lib.FIELD_OVERRIDES:
        if field not in overrides:
            continue
        value = overrides[field]
        if field == "lr_rule":
            km["lr_rule"] = str(value)
        elif field == "lr":
            km["lr_config"] = None
            km["_lr_value"] = value
        else:
            km[field] = {"product": [value]}
    if "prompts" in overrides and "group_size" in overrides:
        km["batch"] = None  # P and G given: B = P x G, whatever the map's batch reads
    return km


def convert_run(
    name: str,
    run_path: str,
    logged: Logged,
    km: dict[str, Any],
    overrides: dict[str, Any] | None = None,
) -> ImportedRun:
    """One outside run as our metric lines and config.

    ``overrides`` (``--set``) are config entries of every run; those named as our own
    fields (prompts, group_size, batch, seed, lr, lr_rule) replace what the key map reads.

    Raises:
      ImportProblem: a required key is missing, or a value the analysis uses is not
        finite or out of range (one line: run, file, step, key).
    """
    overrides = dict(overrides or {})
    km = with_field_overrides(km, overrides)
    config, where = read_run_config(run_path, logged, km, overrides)
    by_step, wall, relogged = merge_by_step(logged, km, name)
    keys = logged.keys()
    path = logged.path
    acc_key = _resolve("eval_accuracy", km["eval_accuracy"], keys, name, path)
    if acc_key is None:
        raise ImportProblem(
            f"{_where(name, path)}: no validation accuracy key (key map "
            f"'eval_accuracy': {km_lib.alternatives(km['eval_accuracy'])})"
        )
    prompts, group = batch_shape(km, config, name, where)
    first = int(km.get("first_update_step", 1))
    eval_only = {acc_key, km_lib.NATIVE_STEP, *km_lib.alternatives(km["step"])}
    eval_only |= {k for k in keys if k.startswith(("val", "eval"))}
    train_steps = [s for s, r in by_step.items() if set(r) - eval_only]
    if not train_steps:
        raise ImportProblem(f"{_where(name, path)}: no training rows (only evaluations)")
    updates = list(range(first, max(train_steps) + 1))
    count_key = _resolve("batch_metric", km.get("batch_metric"), keys, name, path)
    batch = prompts * group
    per_update, last = [], float(batch)
    for s in updates:
        if count_key and count_key in by_step.get(s, {}):
            last = _finite(by_step[s][count_key], count_key, s, name, path)
            if last <= 0:
                raise ImportProblem(f"{_where(name, path)}: step {s}: {count_key} = {last:g} <= 0")
        per_update.append(last)
    responses = np.cumsum(per_update)
    timing = train_time(updates, by_step, wall, km, config, keys, name, path)
    notes = [] if timing.note is None else [f"{timing.note}: {NO_TIMING_NOTE}"]

    lr_key = _resolve("lr", km.get("lr"), keys, name, path)
    lr_config = km.get("lr_config")
    lr0 = km_lib.config_get(config, lr_config, {}) if lr_config else km.get("_lr_value")
    if isinstance(lr0, str):
        try:
            lr0 = float(lr0)  # YAML reads 1e-6 (no dot) as text
        except ValueError:
            lr0 = None
    if not isinstance(lr0, (int, float)) or isinstance(lr0, bool):
        lr0 = None  # absent, or not a number (a schedule's name): unknown
    if lr0 is not None and not (math.isfinite(lr0) and lr0 > 0):
        raise ImportProblem(f"run {name}: {where}: config LR {lr_config} = {lr0!r}: not > 0")
    metric_keys = {
        f: k
        for f, pats in (km.get("metrics") or {}).items()
        if (k := _resolve(f"metrics.{f}", pats, keys, name, path)) is not None
    }
    records = []  # in the run loop's order: the evaluation before the first update first
    for s in sorted(by_step):  # evaluations before the first update (step 0)
        if s < first and acc_key in by_step[s]:
            zero = {
                "responses_cum": 0.0,
                **({"time_train_cum_s": 0.0} if timing.cum_s is not None else {}),
            }
            _add_eval(records, by_step[s], acc_key, 0, zero, name, path, s)
    for i, s in enumerate(updates):
        row = by_step.get(s, {})
        lr = _finite(row[lr_key], lr_key, s, name, path) if lr_key in row else lr0
        rec: dict[str, Any] = {
            "kind": "update",
            "step": i + 1,
            "responses_cum": float(responses[i]),
            "responses_generated_cum": float(responses[i]),
            "prompts": prompts,
            "group_size": group,
            "batch_responses": per_update[i],
            "lr": lr,
        }
        if timing.cum_s is not None:
            rec["time_train_cum_s"] = float(timing.cum_s[i])
            rec.update(timing.phases[i])
        rec.update(
            {f: _finite(row[k], k, s, name, path) for f, k in metric_keys.items() if k in row}
        )
        records.append(rec)
        _add_eval(records, row, acc_key, i + 1, rec, name, path, s)
    seed, _ = km_lib.resolve_value(km.get("seed"), config, km.get("config_defaults") or {})
    lr_rule = km.get("lr_rule") or "unknown"
    if isinstance(lr_rule, dict):  # {"config": "dotted.key"}: each run's own rule
        lr_rule = km_lib.config_get(config, lr_rule.get("config", ""), {}) or "unknown"
    return ImportedRun(
        name=name,
        source_path=path,
        prompts=prompts,
        group_size=group,
        seed=None if seed is None else int(seed),
        lr=None if lr0 is None else float(lr0),
        lr_rule=str(lr_rule),
        config=config,
        records=records,
        notes=notes,
        relogged=relogged,
        timing_rule=timing.rule,
    )


def _add_eval(
    records: list[dict[str, Any]],
    row: dict[str, float],
    acc_key: str,
    step: int,
    at: dict[str, Any],
    name: str,
    path: str,
    source_step: int,
) -> None:
    """Appends an eval line when ``row`` carries the accuracy (checked finite, in [0, 1]);
    a null or NaN evaluation refuses the run (dropping it would move N*)."""
    if acc_key not in row:
        return
    acc = _finite(row[acc_key], acc_key, source_step, name, path)
    if not 0.0 <= acc <= 1.0:
        raise ImportProblem(
            f"{_where(name, path)}: {acc_key} = {acc:g} at step {source_step} is outside "
            "[0, 1]; name an accuracy in [0, 1] in the key map's 'eval_accuracy'"
        )
    rec = {"kind": "eval", "step": step, "responses_cum": at["responses_cum"], "eval_accuracy": acc}
    if "time_train_cum_s" in at:
        rec["time_train_cum_s"] = at["time_train_cum_s"]
    records.append(rec)


def run_config_json(run: ImportedRun, km: dict[str, Any]) -> dict[str, Any]:
    """The config.json of an imported run (our names first; the source's under
    ``imported.source_config``)."""
    return {
        "algo": km.get("algo", "grpo"),
        "seed": run.seed,
        "batch": {"prompts": run.prompts, "group_size": run.group_size},
        "optim": {"lr_rule": run.lr_rule, "lr": run.lr},
        "derived": {"batch": run.prompts * run.group_size, "lr": run.lr},
        # Outside runs share no random numbers: never compared seed by seed (paired).
        "rollout_keys": ROLLOUT_KEYS,
        "imported": {
            "framework": km.get("framework"),
            "keymap": km.get("_path"),
            "source": run.source_path,
            "notes": run.notes,
            "source_config": run.config,
        },
    }


def run_summary(run: ImportedRun, target: float) -> dict[str, Any]:
    """summary.json of an imported run: N*, T, q from ``rl_batch.targets``."""
    reach = targets.reach_of_records(run.records, target)
    updates = [r for r in run.records if r["kind"] == "update"]
    evals = sorted(
        (r for r in run.records if r["kind"] == "eval"), key=lambda r: r["responses_cum"]
    )
    return {
        "status": "finished",
        "target": target,
        "reached": reach.reached,
        "n_star": reach.n_star,
        "updates_to_target": reach.updates_to_target,
        "q": reach.q if run.timed else None,
        "time_to_target_s": reach.time_to_target_s if run.timed else None,
        "time_train_s": updates[-1].get("time_train_cum_s") if updates else None,
        "responses_cum": updates[-1]["responses_cum"] if updates else 0.0,
        "steps": len(updates),
        "final_eval_accuracy": evals[-1]["eval_accuracy"] if evals else None,
        "imported": True,
    }


def write_run_dir(run_dir: str, run: ImportedRun, km: dict[str, Any], target: float) -> None:
    """Writes config.json, metrics.jsonl and summary.json of one imported run."""
    os.makedirs(run_dir, exist_ok=True)
    artifacts.write_json_atomic(
        os.path.join(run_dir, artifacts.CONFIG_FILE), run_config_json(run, km)
    )
    with open(os.path.join(run_dir, artifacts.METRICS_FILE), "w") as f:
        f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in run.records)
    artifacts.write_json_atomic(
        os.path.join(run_dir, artifacts.SUMMARY_FILE), run_summary(run, target)
    )
