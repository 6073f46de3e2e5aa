r"""The record of measured study runtimes: ``docs/runtimes.md``, generated from sweeps.

  python -m experiments.runtimes --sweeps=sweeps/grpo_cpu            # add or update its row
  python -m experiments.runtimes --sweeps=sweeps/a,sweeps/b --label="fresh clone"
  python -m experiments.runtimes                                     # rewrite the table only

Each finished sweep gives one record, read from its files only: the last finished
invocation in ``<sweep>/commands.jsonl`` (`rl_batch.provenance`: its ``python -m``
command, commit, start time, wall seconds, host load at both ends), the machine (CPU
model and cores, from ``calibration.json``'s ``host`` or else a run's
``provenance.json``), the number of finished runs (``sweep.json``) and the machine's
calibrated speed: ``q(B = 64) = 64 / step_s``, the calibrated median seconds of one
training step of the 64-response configuration (``calibration.json``, timed side by side
after the runs, or in blocks before and after them; the load at its ends is given beside
it). The records live in
``docs/runtimes.jsonl`` (this module owns that file); a record with the same sweep name
and start time is replaced. ``docs/runtimes.md`` is rewritten from all of them, oldest
first. The README and the notebook point to that page instead of quoting numbers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from experiments import cli
from rl_batch import artifacts, provenance

RECORDS_FILE = "runtimes.jsonl"
PAGE_FILE = "runtimes.md"
Q_BATCH = 64  # the batch whose calibrated throughput stands for the machine's speed


def q_at_batch(
    step_s: Mapping[str, float], batch: int = Q_BATCH, prefer: str | None = None
) -> tuple[str, float] | None:
    """(configuration key, ``batch / step_s``) of a calibrated configuration of
    ``batch`` responses per step (``prefer`` first, then a sqrt-rule one, then any), or
    None when the calibration timed none of that batch.

    Args:
      step_s: ``"PxG:rule"`` -> calibrated median seconds per training step
        (`artifacts.read_calibration`).
    """
    keys = [k for k in step_s if _batch(k) == batch]
    if not keys:
        return None
    keys.sort(key=lambda k: (k != prefer, artifacts.parse_key(k)[2] != "sqrt", k))
    return keys[0], batch / step_s[keys[0]]


def _batch(key: str) -> int:
    prompts, group, *_ = artifacts.parse_key(key)
    return prompts * group


def machine(sweep_dir: str) -> dict[str, Any]:
    """CPU model and core count of the sweep's host: calibration.json's ``host``, else
    the first run with a provenance record ({} when neither has one)."""
    path = os.path.join(sweep_dir, artifacts.CALIBRATION_FILE)
    host = artifacts.read_json(path).get("host") if os.path.exists(path) else None
    if not host:
        runs_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR)
        for name in sorted(os.listdir(runs_dir)) if os.path.isdir(runs_dir) else []:
            sessions = provenance.read(os.path.join(runs_dir, name))
            if sessions:
                host = sessions[0].get("hardware")
                break
    host = host or {}
    return {"cpu_model": host.get("cpu_model"), "cpu_count": host.get("cpu_count")}


def sweep_record(sweep_dir: str, label: str = "") -> dict[str, Any]:
    """The runtime record of one finished sweep (see the module docstring).

    Raises:
      ValueError: the sweep has no finished invocation in commands.jsonl.
    """
    done = [c for c in provenance.read_commands(sweep_dir) if c["status"] == "finished"]
    if not done:
        raise ValueError(
            f"{sweep_dir}: no finished invocation in {provenance.COMMANDS_FILE} (run the "
            "study to its end first)"
        )
    last = done[-1]
    command, _ = provenance.describe_last_command(sweep_dir)
    sweep = artifacts.read_json(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
    runs = sweep.get("runs", [])
    cal_path = os.path.join(sweep_dir, artifacts.CALIBRATION_FILE)
    cal = artifacts.read_json(cal_path) if os.path.exists(cal_path) else {}
    step_s = artifacts.read_calibration(sweep_dir) or {}
    q = q_at_batch(step_s, prefer=sweep.get("reference_key"))
    git = last.get("git") or {}
    return {
        "sweep": sweep.get("name") or os.path.basename(os.path.normpath(sweep_dir)),
        "label": label,
        "command": command,
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        **machine(sweep_dir),
        "started_at": last["started_at"],
        "wall_s": last["wall_s"],
        "invocations": len(provenance.read_commands(sweep_dir)),
        "load_start": last.get("load_start"),
        "load_end": last.get("load_end"),
        "runs_finished": sum(r.get("status") == "finished" for r in runs),
        "runs": len(runs),
        "q_key": q[0] if q else None,
        "q": q[1] if q else None,
        "calibration_load": [cal.get("load_start"), cal.get("load_end")],
    }


def merge(records: Sequence[dict[str, Any]], new: dict[str, Any]) -> list[dict[str, Any]]:
    """``records`` with ``new`` in place of any record of the same sweep name and start
    time, sorted by start time."""
    same = (new["sweep"], new["started_at"])
    kept = [r for r in records if (r["sweep"], r["started_at"]) != same]
    return sorted([*kept, new], key=lambda r: r["started_at"])


def _load(pair: Sequence[Any] | None) -> str:
    """``"8.0/1.9"``: the 1-minute loads at start and end ("-" where not recorded)."""
    pair = list(pair or [None, None])
    return "/".join("-" if x is None else f"{x[0]:.1f}" for x in pair)


def _load_over(r: Mapping[str, Any]) -> str:
    """The command's 1-minute loads at start/end, then the 15-minute load at its end
    (the load over most of a study's minutes)."""
    end = r.get("load_end")
    over = f" (15 min at end: {end[2]:.1f})" if end and len(end) > 2 else ""
    return _load([r.get("load_start"), end]) + over


def table_row(r: Mapping[str, Any]) -> str:
    """One markdown table row of a record."""
    commit = (r["commit"] or "?")[:7] + (" (dirty)" if r.get("dirty") else "")
    cpu = f"{r.get('cpu_model') or '?'}, {r.get('cpu_count') or '?'} cores"
    q = (
        "-"
        if r["q"] is None
        else f"{r['q']:.0f} ({r['q_key']}; load {_load(r['calibration_load'])})"
    )
    sweep = r["sweep"] + (f" ({r['label']})" if r.get("label") else "")
    wall = f"{r['wall_s'] / 60:.1f} min"
    if r.get("invocations", 1) > 1:
        wall += f" (last of {r['invocations']} invocations)"
    return (
        f"| {sweep} | `{r['command']}` | {commit} | {cpu} | {q}"
        f" | {_load_over(r)} | {wall} | {r['started_at']}"
        f" | {r['runs_finished']}/{r['runs']} |"
    )


def page(records: Sequence[Mapping[str, Any]]) -> str:
    """docs/runtimes.md: what the columns mean, then one row per record."""
    head = [
        "# Measured study runtimes",
        "",
        "Generated by `python -m experiments.runtimes --sweeps=DIR` from finished sweep",
        "directories (their `commands.jsonl`, `calibration.json`, `sweep.json`); do not edit",
        "by hand: the records are in `docs/runtimes.jsonl`. Quote this page, not numbers.",
        "",
        "- **wall**: the last finished invocation of the command, from its start to its",
        "  runs' and calibration's end (the report written after them not included).",
        f"- **q(B = {Q_BATCH})**: retained responses per second of the {Q_BATCH}-response",
        f"  configuration, {Q_BATCH} / its calibrated median step time (timed side by side",
        "  after the runs): the machine's speed as the study saw it. Beside it the",
        "  calibration's host load (1 min) at its start/end.",
        "- **load**: the host's 1-minute load average at the command's start/end, then the",
        "  15-minute one at its end. The machines are shared: a load above the core count",
        "  means other jobs took CPU time from the study.",
        "",
        "Studies whose sweep directories were not kept (R1-R28 and the schedule studies) are",
        "recorded by hand, with their loads, in docs/cpu_study.md.",
        "",
        f"| sweep | command | commit | machine | q(B = {Q_BATCH}), responses/s | load"
        " | wall | started (UTC) | runs finished |",
        "|---|---|---|---|---:|---|---:|---|---:|",
    ]
    return "\n".join([*head, *(table_row(r) for r in records)]) + "\n"


def read_records(docs_dir: str) -> list[dict[str, Any]]:
    """The records of ``<docs_dir>/runtimes.jsonl`` ([] when there is none)."""
    path = os.path.join(docs_dir, RECORDS_FILE)
    return list(artifacts.iter_jsonl(path)) if os.path.exists(path) else []


def update(docs_dir: str, sweep_dirs: Sequence[str], label: str = "") -> list[dict[str, Any]]:
    """Adds (or replaces) each sweep's record, rewrites runtimes.jsonl and runtimes.md,
    and returns the records."""
    records = read_records(docs_dir)
    for d in sweep_dirs:
        records = merge(records, sweep_record(d, label))
    os.makedirs(docs_dir, exist_ok=True)
    path = os.path.join(docs_dir, RECORDS_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, path)
    with open(os.path.join(docs_dir, PAGE_FILE), "w") as f:
        f.write(page(records))
    return records


def _define_flags() -> None:
    """The command's flags, defined only when it runs as one (``--sweeps`` is also
    `experiments.compare_studies`' flag: both modules import into one process)."""
    flags.DEFINE_list("sweeps", [], "Finished sweep directories to record.")
    flags.DEFINE_string(
        "label", "", "Words after the sweep's name in the table, e.g. 'fresh clone, new venv'."
    )
    flags.DEFINE_string(
        "docs",
        os.path.join(os.path.dirname(os.path.dirname(__file__)), "docs"),
        "Folder of runtimes.jsonl and runtimes.md.",
    )


def main(argv):
    del argv
    records = update(flags.FLAGS.docs, flags.FLAGS.sweeps, flags.FLAGS.label)
    for r in records:
        print(table_row(r))
    print(f"wrote {os.path.join(flags.FLAGS.docs, PAGE_FILE)} ({len(records)} records)")


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
