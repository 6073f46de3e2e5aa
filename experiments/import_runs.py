r"""Runs from another framework -> a sweep directory the analysis reads unchanged.

  python -m experiments.import_runs --keymap=verl --target=0.6 --out=sweeps/verl_grid \
      --runs=verl_logs/b256_s0/metrics.jsonl,verl_logs/b512_s0/metrics.jsonl
  python -m experiments.import_runs --keymap=trl --set=world_size=8 --target=0.5 \
      --out=sweeps/trl_grid --runs='outputs/grpo_*'
  python -m experiments.plan_batch --sweep=sweeps/trl_grid

The import then writes the sweep's figures and report.md (as ``experiments.figures``
does; ``--noreport`` skips them), so one command gives the report.

``--runs`` takes one path per run (shell-style globs expand): a run directory
(TensorBoard event files, a W&B offline run, a Trainer output with trainer_state.json)
or a log file (verl JSON lines, W&B history CSV / parquet). ``--keymap`` names a shipped
key map (``--print_keymap=verl`` prints one to copy and edit) or a JSON file. Bad input
(and a mistyped flag) is one ``error:`` line naming the run, the file and the key (exit
status 1; ``experiments.cli.run``, as every command). See docs/import.md.
"""

import glob
import json

from absl import flags

from experiments import cli

_RUNS = flags.DEFINE_list("runs", None, "Run directories or log files (globs expand).")
_OUT = flags.DEFINE_string("out", None, "Sweep directory to write.")
_KEYMAP = flags.DEFINE_string(
    "keymap", None, "Key map: verl, trl, tunix, openrlhf, generic, or a JSON file."
)
_TARGET = flags.DEFINE_float("target", None, "Validation accuracy target (sweep.json's).")
_REFERENCE = flags.DEFINE_string("reference", None, "Reference run or configuration name.")
_SET = flags.DEFINE_multi_string(
    "set",
    [],
    "key=value for every run: a config entry, or one of our fields (prompts, group_size, "
    "batch, seed, lr, lr_rule) in place of what the key map reads.",
)
_SOURCE = flags.DEFINE_enum(
    "source",
    None,
    ["tensorboard", "wandb", "wandb_history", "trainer_state", "verl_jsonl"],
    "Reader (default: from the file names).",
)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace an existing sweep.json.")
_PRINT = flags.DEFINE_string("print_keymap", None, "Print a shipped key map and exit.")
_REPORT = flags.DEFINE_bool(
    "report", True, "Then write figures/ and report.md (experiments.figures); --noreport: not."
)


def parse_sets(items: list[str]) -> dict:
    """``["a.b=8", "x=sqrt"]`` -> ``{"a.b": 8, "x": "sqrt"}`` (JSON values, else text)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def expand(paths: list[str]) -> list[str]:
    """Each path, or the sorted matches of a glob (a glob without matches is an error)."""
    out = []
    for p in paths:
        if any(c in p for c in "*?["):
            hits = sorted(glob.glob(p))
            if not hits:
                raise ValueError(f"--runs {p!r}: no path matches")
            out.extend(hits)
        else:
            out.append(p)
    return out


def main(argv):
    del argv
    from rl_batch.analysis import importers

    if _PRINT.value:
        with open(importers.keymap_path(_PRINT.value)) as f:
            print(f.read(), end="")
        return
    for name, flag in (("runs", _RUNS), ("out", _OUT), ("keymap", _KEYMAP), ("target", _TARGET)):
        if flag.value is None:
            raise ValueError(f"--{name} is required")
    # ImportProblem is a ValueError: cli.run makes it one line, exit status 1.
    report = importers.import_runs(
        expand(_RUNS.value),
        _OUT.value,
        _KEYMAP.value,
        _TARGET.value,
        reference=_REFERENCE.value,
        overrides=parse_sets(_SET.value),
        source=_SOURCE.value,
        overwrite=_OVERWRITE.value,
    )
    for line in report.lines():
        print(line)
    print(f"wrote {report.sweep_dir}")
    if _REPORT.value:  # the analysis of the imported sweep, as experiments.figures writes it
        from rl_batch.analysis import figures

        for path in figures.write_all(report.sweep_dir):
            print(path)


if __name__ == "__main__":
    cli.run(main)
