r"""Times every configuration of a sweep side by side: ``<sweep>/calibration.json``.

  python -m experiments.calibrate --sweep_dir=sweeps/grpo_cpu [--rounds=3] [--steps=2] \
      [--gen_probe=512,1024]

Each configuration's training step (its first run's config, from the warm-start policy)
is timed in one process, interleaved over ``--rounds`` rounds (``rl_batch.sweeps.calibrate``);
the report and the planner then take T and q from these step times, not from the
host load each run happened to see. ``experiments.grpo_sweep`` runs this after its
points when ``--config.sweep.calibrate_rounds`` > 0. A calibration.json that already times
every configuration with these settings is kept (T and q stay as they were) unless
``--recalibrate``; one that is replaced moves to ``<sweep>/calibrations/``.

A calibration in two sittings (``--before=B``: B of the rounds in a first block,
``--stage=before``; later, ``--stage=after`` times the rest and joins them) lets the
intervals carry how far the host's relative step times moved between the sittings
(``rl_batch.analysis.intervals.block_drift``), as a sweep with
``sweep.calibrate_rounds_before`` does around its runs.
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
_BEFORE = flags.DEFINE_integer("before", 0, "Of the rounds, those in the first block (0: one).")
_STAGE = flags.DEFINE_enum(
    "stage", "after", ["before", "after"], "The first block, or the rest (joined to it)."
)
_RECALIBRATE = flags.DEFINE_bool(
    "recalibrate",
    False,
    "Calibrate again even when calibration.json times every configuration with these "
    "settings (the old one is kept in calibrations/).",
)


def main(argv):
    del argv
    probe = tuple(int(x) for x in _GEN_PROBE.value)
    record = calibrate.calibrate_sweep(
        _SWEEP_DIR.value,
        rounds=_ROUNDS.value,
        steps=_STEPS.value,
        gen_probe=probe,
        force=_RECALIBRATE.value,
        before=_BEFORE.value,
        stage=_STAGE.value,
    )
    print(calibrate.describe(record))


if __name__ == "__main__":
    cli.run(main)
