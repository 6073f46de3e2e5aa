r"""Wall time of one small sweep under several process settings, interleaved.

Each round runs the same sub-grid of a sweep config once per setting, the settings in
turn (A, B, C, A, B, C, ...), each into a fresh directory, and times the whole
``experiments.grpo_sweep`` command: its wall seconds, its children's user and system CPU
seconds, and the host's 1-minute load before it (``rl_batch.bench``). The table gives
each setting's median wall time and the per-round ratio to the first setting (median,
min, max: pairing by round cancels the load both saw)::

  python -m experiments.sweep_speed --rounds=2 \
      --settings="shared=--config.sweep.pin_workers=False,pinned=--config.sweep.pin_workers=True"

Settings are ``label=flags`` (several flags space-separated), comma-separated; the
sub-grid is ``--grid`` (flags given to every setting). The calibration and the grid
extension are off by default, so the time is the runs' own. The directories are kept
under ``--out`` (their metrics are the runs'; compare them with
``experiments.compare_studies`` if a setting could change results).
"""

import os
import resource
import shlex
import subprocess
import sys
import time

from absl import flags

from experiments import cli
from rl_batch import bench


def parse_settings(text: str) -> dict[str, list[str]]:
    """``"a=--x=1 --y=2,b=--x=2"`` -> ``{"a": ["--x=1", "--y=2"], "b": ["--x=2"]}``."""
    out: dict[str, list[str]] = {}
    for item in text.split(","):
        label, sep, args = item.partition("=")
        if not sep or not label.strip().isidentifier():
            raise ValueError(f"--settings: {item!r} is not label=flags")
        out[label.strip()] = shlex.split(args)
    return out


def _children_cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime, usage.ru_stime


def run_once(label: str, args: list[str], round_: int, cpu: dict[str, list]) -> None:
    """One sweep of the sub-grid with ``args``; its children's CPU seconds into ``cpu``."""
    sweep_dir = os.path.join(flags.FLAGS.out, f"{label}_r{round_}")
    grid = shlex.split(flags.FLAGS.grid)
    cmd = [sys.executable, "-m", "experiments.grpo_sweep", f"--config={flags.FLAGS.config}",
           f"--sweep_dir={sweep_dir}", "--quiet", *grid, *args]  # fmt: skip
    user0, sys0 = _children_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"error: {label} round {round_} failed: {proc.stderr[-600:]}")
    user1, sys1 = _children_cpu()
    cpu.setdefault(label, []).append((user1 - user0, sys1 - sys0))


def _define_flags() -> None:
    """The command's flags, defined only when it runs as one (names shared with other
    commands that tests import into one process)."""
    flags.DEFINE_string(
        "config", "experiments/configs/grpo_cpu.py", "Sweep config file of the sub-grid."
    )
    flags.DEFINE_string(
        "grid",
        "--config.sweep.prompts=8,16 --config.sweep.seeds=0,1 --config.sweep.extra_points= "
        "--config.sweep.extend_edges=False --config.sweep.calibrate_rounds=0",
        "Flags every setting gets (the sub-grid), space-separated.",
    )
    flags.DEFINE_string(
        "settings",
        "shared=--config.sweep.pin_workers=False,pinned=--config.sweep.pin_workers=True",
        "label=flags pairs, comma-separated; the first is the ratios' base.",
    )
    flags.DEFINE_integer("rounds", 2, "Rounds over the settings.")
    flags.DEFINE_string("out", "/tmp/sweep_speed", "Folder of the sweeps' directories.")


def main(argv):
    del argv
    settings = parse_settings(flags.FLAGS.settings)
    cpu: dict[str, list] = {}
    calls = {
        label: (lambda r, label=label, args=args: run_once(label, args, r, cpu))
        for label, args in settings.items()
    }
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')} grid: {flags.FLAGS.grid}", flush=True)
    timings = bench.time_interleaved(calls, min_repeats=flags.FLAGS.rounds, min_time_s=0.0)
    base = next(iter(settings))
    rows = []
    for label, t in timings.items():
        ratio = bench.ratio_summary(timings[base].time_s, t.time_s)
        user = bench.median([u for u, _ in cpu[label]])
        system = bench.median([s for _, s in cpu[label]])
        rows.append([
            label, " ".join(settings[label]), f"{t.median_s:.1f}",
            f"{min(t.time_s):.1f}-{max(t.time_s):.1f}",
            f"{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]",
            f"{user:.0f}", f"{system:.0f}",
            f"{min(t.load1):.1f}-{max(t.load1):.1f}",
        ])  # fmt: skip
    columns = ["setting", "flags", "wall s (median)", "wall s (min-max)",
               f"wall / {base} (median [min, max])", "user s", "sys s", "load before"]  # fmt: skip
    print(bench.markdown_table(columns, rows))
    print(f"# end {time.strftime('%Y-%m-%d %H:%M:%S')} load {bench.load_1min():.1f}")


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
