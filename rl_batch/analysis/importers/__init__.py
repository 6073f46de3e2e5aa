"""Runs this project did not train, as a sweep directory the analysis reads unchanged.

Readers (`sources`) for TensorBoard event files, W&B offline runs and exported history,
Hugging Face Trainer ``trainer_state.json`` (TRL) and verl's file logger; key maps
(`keymap`, data in ``keymaps/*.json``) that say which logged key and config entry is
which quantity; `convert` and `sweep` write ``config.json``, ``metrics.jsonl``,
``summary.json`` and ``sweep.json`` (``rl_batch/artifacts.py``). Imports no JAX.

    from rl_batch.analysis import importers
    importers.import_runs(["runs/a", "runs/b"], "sweeps/imported", "verl", target=0.6)

CLI: ``python -m experiments.import_runs``; docs: ``docs/import.md``.
"""

from rl_batch.analysis.importers.keymap import (
    ImportProblem,
    builtin_keymaps,
    keymap_path,
    load_keymap,
)
from rl_batch.analysis.importers.sources import SOURCES, Logged, detect_source, read_source
from rl_batch.analysis.importers.sweep import ImportReport, import_runs

__all__ = [
    "SOURCES",
    "ImportProblem",
    "ImportReport",
    "Logged",
    "builtin_keymaps",
    "detect_source",
    "import_runs",
    "keymap_path",
    "load_keymap",
    "read_source",
]
