r"""Times a sweep's configurations under two rollout engines side by side.

  python -m experiments.compare_engines --sweep_dir=sweeps/grpo_cpu [--rounds=5] \
      [--engine=continuous --slots=0 --attn_block=0]

Each configuration (its first run's ``config.json``, as ``experiments.calibrate`` takes
it) is built twice, once as its runs ran and once with the rollout engine of the flags,
and every training step is timed in one process, the two interleaved round by round
(``rl_batch.sweeps.calibrate.calibrate``). The table gives each engine's median step and
generation seconds and the per-round ratio new / as-run (median, with the range over
rounds; ``rl_batch.bench.ratio_summary``), beside the host load: the measurement behind
the choice of a study's engine. Nothing in the sweep directory is written.
"""

from __future__ import annotations

from absl import flags
from ml_collections import ConfigDict

from experiments import cli
from rl_batch import bench, provenance
from rl_batch.runs import config as config_lib
from rl_batch.sweeps import calibrate


# The command line, defined only when run as a program (``_define_flags``): tests import
# this module beside ``experiments.throughput``, whose flags share some of these names.
def _define_flags() -> None:
    flags.DEFINE_string("sweep_dir", None, "The sweep directory.", required=True)
    flags.DEFINE_integer("rounds", 5, "Interleaved visits per configuration and engine.")
    flags.DEFINE_integer("steps", 2, "Timed training steps per visit.")
    flags.DEFINE_string("engine", "continuous", "The engine to compare: sampling.engine.")
    flags.DEFINE_integer("slots", 0, "Its sampling.slots (0: every row of a call).")
    flags.DEFINE_integer("attn_block", 0, "Its sampling.attn_block.")


def with_engine(spec, engine: str, slots: int, attn_block: int):
    """The spec of the same run config with another rollout engine."""
    c = ConfigDict(spec.inputs.to_dict())
    c.sampling.engine, c.sampling.slots, c.sampling.attn_block = engine, slots, attn_block
    return config_lib.resolve(c)


def ratio_rows(record: dict, keys: list[str], new: str) -> list[dict]:
    """Per configuration: median step / generation seconds of both engines and the
    per-round ratios new / as-run (median, min, max)."""
    rows = []
    for key in keys:
        old_r, new_r = record["configs"][key], record["configs"][key + new]
        row = {"config": key, "engine": calibrate.engine_label(new_r)}
        for field in ("step_s", "generate_s"):
            row[field] = (bench.median(old_r[field]), bench.median(new_r[field]))
            row[field + "_ratio"] = bench.ratio_summary(old_r[field], new_r[field])
        rows.append(row)
    return rows


def format_rows(rows: list[dict], as_run: str) -> str:
    """The comparison as a markdown table."""
    columns = [
        "config", f"step s ({as_run})", "step s (new)", "step ratio [min, max]",
        f"gen s ({as_run})", "gen s (new)", "gen ratio [min, max]",
    ]  # fmt: skip

    def ratio(x: tuple[float, float, float]) -> str:
        return f"{x[0]:.2f} [{x[1]:.2f}, {x[2]:.2f}]"

    cells = []
    for r in rows:
        (s0, s1), (g0, g1) = r["step_s"], r["generate_s"]
        cells.append(
            [r["config"], f"{s0:.3f}", f"{s1:.3f}", ratio(r["step_s_ratio"])]
            + [f"{g0:.3f}", f"{g1:.3f}", ratio(r["generate_s_ratio"])]
        )
    return bench.markdown_table(columns, cells)


def main(argv):
    del argv
    f = flags.FLAGS
    configs = calibrate.sweep_configs(f.sweep_dir)
    new = f"@{f.engine}"
    specs = dict(configs)
    for key, spec in configs.items():
        specs[key + new] = with_engine(spec, f.engine, f.slots, f.attn_block)
    # One process, every configuration under both engines interleaved round by round.
    record = calibrate.calibrate(specs, rounds=f.rounds, steps=f.steps)
    first = record["configs"][next(iter(configs))]
    print(f"host: {provenance.hardware()}")
    print(f"load: {record['load_start']} at the start, {record['load_end']} at the end")
    print(f"new engine: {calibrate.engine_label(record['configs'][next(iter(configs)) + new])}")
    print(format_rows(ratio_rows(record, list(configs), new), calibrate.engine_label(first)))


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
