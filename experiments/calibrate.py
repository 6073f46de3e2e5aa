r"""Times every configuration of a sweep side by side: ``<sweep>/calibration.json``.

  python -m experiments.calibrate --sweep_dir=sweeps/grpo_cpu [--rounds=3] [--steps=2] \
      [--gen_probe=512,1024]

Each configuration's training step (its first run's config, from the warm-start policy)
is timed in one process, interleaved over ``--rounds`` rounds (``rl_batch.sweeps.calibrate``);
the report and the planner then take T and q from these step times, not from the
host load each run happened to see. ``experiments.grpo_sweep`` runs this after its
points when ``--config.sweep.calibrate_rounds`` > 0.
"""

from absl import flags

from experiments import cli
from rl_batch.sweeps import calibrate

_SWEEP_DIR = flags.DEFINE_string("sweep_dir", None, "The sweep directory.", required=True)
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Interleaved visits per configuration.")
_STEPS = flags.DEFINE_integer("steps", 2, "Timed training steps per visit.")
_GEN_PROBE = flags.DEFINE_list(
    "gen_probe", [], "Concurrencies whose generation alone is timed beside the steps."
)


def main(argv):
    del argv
    probe = tuple(int(x) for x in _GEN_PROBE.value)
    record = calibrate.calibrate_sweep(
        _SWEEP_DIR.value, rounds=_ROUNDS.value, steps=_STEPS.value, gen_probe=probe
    )
    for key, v in record["configs"].items():
        spread = ", ".join(f"{s:.3f}" for s in v["step_s"])
        print(f"{key:>12}  B={v['batch']:<5d} step {v['step_s_median']:.3f} s  [{spread}]")
    for c, v in record.get("gen_probe", {}).items():
        spread = ", ".join(f"{x:.0f}" for x in v["gen_tokens_per_s"])
        print(f"{'gen@' + c:>12}  generation alone, tokens/s [{spread}]")
    print(f"load {record['load_start']} -> {record['load_end']}, {record['wall_s']:.0f} s")


if __name__ == "__main__":
    cli.run(main)
