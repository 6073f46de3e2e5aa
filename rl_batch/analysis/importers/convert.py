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
excluded keys, summed; or cumulative seconds (``elapsed``, or the rows' wall-clock
``timestamps``), zeroed one mean update before the first update (start-up and model
loading are not training) and interpolated over updates without a row. Without timing
the run has no ``time_train_cum_s``: the analysis gives N* and r_N only.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from rl_batch import artifacts, targets
from rl_batch.analysis.importers import keymap as km_lib
from rl_batch.analysis.importers.keymap import ImportProblem
from rl_batch.analysis.importers.sources import WALL, Logged

ROLLOUT_KEYS = "independent"  # not "rollout" / "prompt": time_to_target.matched_pair
NO_TIMING_NOTE = "no timing: N* and r_N only (no q, T, r_q)"


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
    if path.endswith((".yaml", ".yml")):
        import yaml

        with open(path) as f:
            data = yaml.safe_load(f)
    else:
        data = artifacts.read_json(path)
    if not isinstance(data, dict):
        raise ImportProblem(f"{path}: a config file holds a mapping")
    return data


def merge_by_step(
    logged: Logged, km: dict[str, Any], name: str
) -> tuple[dict[int, dict[str, float]], dict[int, float]]:
    """Rows merged per step (later values win) and each step's first wall time."""
    step_keys = km_lib.alternatives(km["step"])
    by_step: dict[int, dict[str, float]] = {}
    wall: dict[int, float] = {}
    for row in logged.rows:
        key = next((k for k in step_keys if k in row), None)
        if key is None:
            continue
        s = int(round(row[key]))
        by_step.setdefault(s, {}).update({k: v for k, v in row.items() if k != WALL})
        if WALL in row:
            wall[s] = min(wall.get(s, row[WALL]), row[WALL])
    if not by_step:
        raise ImportProblem(
            f"{_where(name, logged.path)}: no row carries a step key (key map 'step': {step_keys})"
        )
    return by_step, wall


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


def _step_seconds(
    row: dict[str, float], step_key: str | None, phase_keys: dict[str, str], exclude: list[str]
) -> float | None:
    """Training seconds of one update row (step key, else phases' sum, minus exclusions)."""
    if step_key is not None and step_key in row:
        total = row[step_key]
    elif phase_keys and any(k in row for k in phase_keys.values()):
        total = sum(row.get(k, 0.0) for k in phase_keys.values())
    else:
        return None
    return total - sum(row.get(k, 0.0) for k in exclude)


def train_time(
    updates: list[int],
    rows: dict[int, dict[str, float]],
    wall: dict[int, float],
    km: dict[str, Any],
    keys: set[str],
    name: str,
    path: str,
) -> tuple[np.ndarray | None, dict[str, str], str | None]:
    """Cumulative training seconds after each update step, the resolved phase keys and a
    note when there is no timing (the array is then None)."""
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
    if step_key is not None or phase_keys:
        secs = [_step_seconds(rows.get(s, {}), step_key, phase_keys, exclude) for s in updates]
        missing = sum(x is None for x in secs)
        if missing:
            return None, phase_keys, f"timing keys missing at {missing} of {len(secs)} updates"
        return np.cumsum(np.array(secs, dtype=np.float64)), phase_keys, None
    elapsed_key = _resolve("time.elapsed", tm.get("elapsed"), keys, name, path)
    if elapsed_key is not None:
        clock = {s: r[elapsed_key] for s, r in rows.items() if elapsed_key in r}
    elif tm.get("timestamps") and wall:
        clock = dict(wall)
    else:
        return None, {}, "the key map names no timing the run logs"
    excl = np.cumsum([sum(rows.get(s, {}).get(k, 0.0) for k in exclude) for s in updates])
    timed = [(i, clock[s]) for i, s in enumerate(updates) if s in clock]
    if len(timed) < 2:
        return None, {}, "fewer than two updates carry a time"
    (i0, c0), (i1, c1) = timed[0], timed[-1]
    zero = c0 - (c1 - c0 - (excl[i1] - excl[i0])) / (i1 - i0) * (i0 + 1)
    idx = np.array([i for i, _ in timed], dtype=np.float64)
    cum = np.interp(np.arange(len(updates)), idx, np.array([c for _, c in timed])) - zero - excl
    return cum, {}, None


def convert_run(
    name: str,
    run_path: str,
    logged: Logged,
    km: dict[str, Any],
    overrides: dict[str, Any] | None = None,
) -> ImportedRun:
    """One outside run as our metric lines and config.

    Raises:
      ImportProblem: a required key is missing (one line: run, file, key).
    """
    config, where = read_run_config(run_path, logged, km, dict(overrides or {}))
    by_step, wall = merge_by_step(logged, km, name)
    keys = logged.keys()
    acc_key = _resolve("eval_accuracy", km["eval_accuracy"], keys, name, logged.path)
    if acc_key is None:
        raise ImportProblem(
            f"{_where(name, logged.path)}: no validation accuracy key (key map "
            f"'eval_accuracy': {km_lib.alternatives(km['eval_accuracy'])})"
        )
    prompts, group = batch_shape(km, config, name, where)
    first = int(km.get("first_update_step", 1))
    eval_only = {acc_key, km_lib.NATIVE_STEP, *km_lib.alternatives(km["step"])}
    eval_only |= {k for k in keys if k.startswith(("val", "eval"))}
    train_steps = [s for s, r in by_step.items() if set(r) - eval_only]
    if not train_steps:
        raise ImportProblem(f"{_where(name, logged.path)}: no training rows (only evaluations)")
    updates = list(range(first, max(train_steps) + 1))
    count_key = _resolve("batch_metric", km.get("batch_metric"), keys, name, logged.path)
    batch = prompts * group
    per_update, last = [], float(batch)
    for s in updates:
        last = by_step.get(s, {}).get(count_key, last) if count_key else float(batch)
        per_update.append(last)
    responses = np.cumsum(per_update)
    time_cum, phase_keys, no_time = train_time(updates, by_step, wall, km, keys, name, logged.path)
    notes = [] if no_time is None else [f"{no_time}: {NO_TIMING_NOTE}"]

    lr_key = _resolve("lr", km.get("lr"), keys, name, logged.path)
    lr_config = km.get("lr_config")
    lr0 = km_lib.config_get(config, lr_config, {}) if lr_config else None
    if not isinstance(lr0, (int, float)) or isinstance(lr0, bool):
        lr0 = None  # absent, or not a number (a schedule's name): unknown
    metric_keys = {
        f: k
        for f, pats in (km.get("metrics") or {}).items()
        if (k := _resolve(f"metrics.{f}", pats, keys, name, logged.path)) is not None
    }
    records = []  # in the run loop's order: the evaluation before the first update first
    for s in sorted(by_step):  # evaluations before the first update (step 0)
        if s < first and acc_key in by_step[s]:
            zero = {
                "responses_cum": 0.0,
                **({"time_train_cum_s": 0.0} if time_cum is not None else {}),
            }
            _add_eval(records, by_step[s], acc_key, 0, zero, name, logged.path, s)
    for i, s in enumerate(updates):
        row = by_step.get(s, {})
        rec: dict[str, Any] = {
            "kind": "update",
            "step": i + 1,
            "responses_cum": float(responses[i]),
            "responses_generated_cum": float(responses[i]),
            "prompts": prompts,
            "group_size": group,
            "batch_responses": per_update[i],
            "lr": row.get(lr_key, lr0) if lr_key else lr0,
        }
        if time_cum is not None:
            rec["time_train_cum_s"] = float(time_cum[i])
            for ph, k in phase_keys.items():
                if k in row:
                    rec[f"time_{ph}_s"] = row[k]
        rec.update({f: row[k] for f, k in metric_keys.items() if k in row})
        records.append(rec)
        _add_eval(records, row, acc_key, i + 1, rec, name, logged.path, s)
    seed, _ = km_lib.resolve_value(km.get("seed"), config, km.get("config_defaults") or {})
    lr_rule = km.get("lr_rule") or "unknown"
    if isinstance(lr_rule, dict):  # {"config": "dotted.key"}: each run's own rule
        lr_rule = km_lib.config_get(config, lr_rule.get("config", ""), {}) or "unknown"
    lr_rule = str(lr_rule)
    return ImportedRun(
        name=name,
        source_path=logged.path,
        prompts=prompts,
        group_size=group,
        seed=None if seed is None else int(seed),
        lr=None if lr0 is None else float(lr0),
        lr_rule=lr_rule,
        config=config,
        records=records,
        notes=notes,
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
    """Appends an eval line when ``row`` carries the accuracy (checked to lie in [0, 1])."""
    if acc_key not in row:
        return
    acc = row[acc_key]
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
