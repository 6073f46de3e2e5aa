r"""The refactor check: five short runs whose every non-timing metric must not change.

A refactor (moving code, typing the config, splitting an engine into modules) is checked
against the exact metrics of the commit before it::

  # at the old commit (a worktree), once:
  python -m experiments.behaviour_check --out=/tmp/behaviour_old
  # at the new commit:
  python -m experiments.behaviour_check --out=/tmp/behaviour_new --against=/tmp/behaviour_old

The runs: grpo_cpu's reference point (8 x 8, sqrt), the fixed LR rule at 2x the reference
batch (16 x 8), asynchronous rollout, partial rollout, and ppo_cpu's default point, each
with a short budget. ``--against`` compares every metric two runs share, line by line
(timing, compile and memory fields excepted), and exits 1 on any difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import flags

from experiments import cli, configs

_OUT = flags.DEFINE_string("out", "", "Directory for the five runs.")
_AGAINST = flags.DEFINE_string("against", "", "An earlier --out to compare with.")
_BUDGET = flags.DEFINE_integer("budget", 1024, "Responses per run.")
_ONLY = flags.DEFINE_list("only", [], "Run only these checks (names below).")

# name -> (config file, overrides)
CHECKS = {
    "reference": ("grpo_cpu.py", ["prompts=8", "group_size=8", "lr_rule=sqrt"]),
    "fixed_2x": ("grpo_cpu.py", ["prompts=16", "group_size=8", "lr_rule=fixed"]),
    "async": ("grpo_cpu.py", ["prompts=8", "group_size=8", "async_rollout.enabled=True"]),
    "partial": (
        "grpo_cpu.py",
        ["prompts=8", "group_size=8", "partial_rollout.enabled=True", "rollout_keys=rollout"],
    ),
    "ppo": ("ppo_cpu.py", []),
}

# Fields that measure the machine, not the behaviour.
_TIMING = ("time", "compile", "memory", "rss", "_per_s", "throughput", "wall", "_frac")


def _is_timing(key: str) -> bool:
    return any(part in key for part in _TIMING) or key in ("q", "eta_s")


def run_check(name: str, out: str, budget: int) -> None:
    """Trains one check's run into ``out/name`` (a fresh directory)."""
    config_file, overrides = CHECKS[name]
    run_dir = os.path.join(out, name)
    if os.path.isdir(run_dir):
        raise ValueError(f"{run_dir} exists: choose a new --out")
    cmd = [
        sys.executable, "-m", "experiments.train", f"--config={configs.path(config_file)}",
        f"--config.run_dir={run_dir}", f"--config.budget_responses={budget}",
        "--config.stop_at_target=False", "--quiet",
    ] + [f"--config.{o}" for o in overrides]  # fmt: skip
    print(f"{name}: {' '.join(cmd[2:])}", flush=True)
    subprocess.run(cmd, check=True)


def read_lines(run_dir: str) -> list[dict]:
    """metrics.jsonl of one run, its timing fields dropped."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [{k: v for k, v in row.items() if not _is_timing(k)} for row in rows]


def compare(old_dir: str, new_dir: str) -> list[str]:
    """Every difference between two runs' non-timing metrics, one line each."""
    old, new = read_lines(old_dir), read_lines(new_dir)
    diffs = []
    if len(old) != len(new):
        diffs.append(f"{len(old)} lines against {len(new)}")
    for i, (a, b) in enumerate(zip(old, new)):
        for key in sorted(set(a) & set(b)):
            if a[key] != b[key]:
                diffs.append(f"line {i} {key}: {a[key]!r} -> {b[key]!r}")
    return diffs


def main(argv):
    del argv
    if not _OUT.value:
        raise ValueError("set --out=DIR")
    names = _ONLY.value or list(CHECKS)
    unknown = sorted(set(names) - set(CHECKS))
    if unknown:
        raise ValueError(f"--only: unknown checks {unknown} (known: {sorted(CHECKS)})")
    for name in names:
        run_check(name, _OUT.value, _BUDGET.value)
    if not _AGAINST.value:
        return
    failed = False
    for name in names:
        diffs = compare(os.path.join(_AGAINST.value, name), os.path.join(_OUT.value, name))
        shared = len(read_lines(os.path.join(_OUT.value, name)))
        print(f"{name}: {len(diffs)} differences over {shared} lines")
        for line in diffs[:20]:
            print(f"  {line}")
        failed |= bool(diffs)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    cli.run(main)
