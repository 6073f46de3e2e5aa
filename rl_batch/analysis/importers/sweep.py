"""A sweep directory of our contract from a set of outside runs (`import_runs`)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from rl_batch import artifacts
from rl_batch.analysis.importers import checks, convert
from rl_batch.analysis.importers.keymap import ImportProblem, load_keymap
from rl_batch.analysis.importers.sources import read_source


@dataclasses.dataclass
class ImportReport:
    """What `import_runs` wrote: the sweep directory, its runs, and what they lacked."""

    sweep_dir: str
    runs: list[convert.ImportedRun]
    messages: list[str] = dataclasses.field(default_factory=list)  # across runs

    @property
    def untimed(self) -> list[str]:
        """Runs without timing (the analysis gives them N* and r_N only)."""
        return [r.name for r in self.runs if not r.timed]

    def lines(self) -> list[str]:
        """One line per run (P, G, seed, evaluations, timing), then the partial notes."""
        out = []
        for r in self.runs:
            n_eval = sum(x["kind"] == "eval" for x in r.records)
            n_upd = sum(x["kind"] == "update" for x in r.records)
            timing = "timed" if r.timed else "no timing"
            out.append(
                f"{r.name}: P={r.prompts} G={r.group_size} seed={r.seed} lr_rule={r.lr_rule} "
                f"{n_upd} updates, {n_eval} evaluations, {timing} ({r.source_path})"
            )
            if r.relogged:
                out.append(
                    f"{r.name}: steps {convert.step_ranges(r.relogged)} logged twice with "
                    "different values (a resumed run?): the later values are used"
                )
        rules: dict[str, list[str]] = {}
        for r in self.runs:
            if r.timing_rule:
                rules.setdefault(r.timing_rule, []).append(r.name)
        for rule, names in rules.items():
            out.append(f"timing: {rule} in {len(names)} of {len(self.runs)} runs")
        out.extend(self.messages)
        if self.untimed:
            out.append(
                f"partial: {len(self.untimed)} of {len(self.runs)} runs have no timing "
                f"({', '.join(self.untimed[:4])}{', ...' if len(self.untimed) > 4 else ''}): "
                "the analysis gives N* and r_N only for them (no q, T, r_q)"
            )
        return out


def run_names(paths: Sequence[str]) -> list[str]:
    """A unique directory name per run path: its base name (a file's directory's name),
    numbered when two agree."""
    names, seen = [], {}
    for p in paths:
        p = os.path.normpath(p)
        base = os.path.basename(os.path.dirname(p) if os.path.isfile(p) else p)
        base = base.replace(os.sep, "_") or "run"
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}_{seen[base]}")
    return names


def assign_seeds(runs: list[convert.ImportedRun]) -> None:
    """Runs of one configuration without distinct seeds get 0, 1, ... in input order."""
    groups: dict[tuple[int, int, str], list[convert.ImportedRun]] = {}
    for r in runs:
        groups.setdefault((r.prompts, r.group_size, r.lr_rule), []).append(r)
    for members in groups.values():
        seeds = [r.seed for r in members]
        if None in seeds or len(set(seeds)) < len(seeds):
            for i, r in enumerate(members):
                r.seed = i
                r.notes.append("seed assigned by input order (no distinct seed in config)")


def import_runs(
    paths: Sequence[str],
    out_dir: str,
    keymap: str | dict[str, Any],
    target: float,
    *,
    reference: str | None = None,
    overrides: dict[str, Any] | None = None,
    source: str | None = None,
    name: str | None = None,
    overwrite: bool = False,
) -> ImportReport:
    """Converts outside runs into the sweep directory ``out_dir``.

    Args:
      paths: one path per run: a run directory (TensorBoard events, a W&B offline run,
        a Trainer output with trainer_state.json) or a log file (verl JSON lines, W&B
        CSV / parquet history, an event file).
      out_dir: the sweep directory to write (``sweep.json`` and ``runs/``).
      keymap: a key map (a shipped name such as ``"verl"``, a JSON path, or loaded).
      target: validation accuracy target (sweep.json's ``target``).
      reference: the analysis's reference run or configuration (default: the smallest
        batch, as the analysis picks).
      overrides: config entries for every run (``{"world_size": 8}``).
      source: force a reader (`sources.SOURCES`); detected from file names otherwise.
      name: the sweep's name (default: ``out_dir``'s base name).
      overwrite: replace an existing sweep.json in ``out_dir``.

    Returns:
      The `ImportReport`.

    Raises:
      ImportProblem: bad input, one line naming the run, file and key; nothing written.
    """
    km = keymap if isinstance(keymap, dict) else load_keymap(keymap)
    if not paths:
        raise ImportProblem("no runs given")
    if not 0.0 < target <= 1.0:
        raise ImportProblem(f"target {target:g}: a validation accuracy in (0, 1]")
    sweep_file = os.path.join(out_dir, artifacts.SWEEP_FILE)
    if os.path.exists(sweep_file) and not overwrite:
        raise ImportProblem(f"{sweep_file} exists; choose another --out or pass --overwrite")
    runs = []
    for run_name, path in zip(run_names(paths), paths):
        logged = read_source(path, source)
        runs.append(convert.convert_run(run_name, path, logged, km, overrides))
    messages = [m for m in [checks.infer_lr_rule(runs)] if m]
    checks.check_group_sizes(runs)
    assign_seeds(runs)  # every run read and checked before anything is written
    entries = []
    for r in runs:
        convert.write_run_dir(os.path.join(out_dir, artifacts.RUNS_DIR, r.name), r, km, target)
        entries.append(
            artifacts.sweep_entry(
                r.name,
                prompts=r.prompts,
                group_size=r.group_size,
                lr_rule=r.lr_rule,
                lr=r.lr,
                seed=r.seed,
                status="finished",
            )
        )
    budget = max(
        (x["responses_cum"] for r in runs for x in r.records if x["kind"] == "update"), default=0
    )
    settings = {
        "algo": km.get("algo", "grpo"),
        "target": target,
        "budget_responses": budget,
        "eval_every_responses": None,
        "target_crossing": "update",
    }
    artifacts.write_sweep(
        sweep_file,
        artifacts.sweep_record(
            name or os.path.basename(os.path.normpath(out_dir)),
            settings,
            entries,
            reference=reference,
            imported={
                "framework": km.get("framework"),
                "keymap": km.get("_path"),
                "untimed_runs": [r.name for r in runs if not r.timed],
            },
        ),
    )
    return ImportReport(out_dir, runs, messages)
