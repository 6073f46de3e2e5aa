r"""Algorithm 1: rank candidate batches by ``r_N / r_q`` and recommend the fastest.

Full mode uses every run's whole curve and opens with one sentence: the set to use, how
far apart its members are and how much faster than the next configuration, or how many
more seeds would decide it (`rl_batch.analysis.equivalence`); pilot mode predicts r_N from the first
``--pilot_fraction`` of each run (simulated on a finished sweep by truncating the
curves) and reports how its pick compares with the full sweep's best, and at what
fraction of the sweep's training time. Full mode also prints how often each
configuration is in the recommendation set over resamples of the seeds
(``rl_batch.analysis.stability``).

  python -m experiments.plan_batch --sweep=sweeps/grpo_cpu
  python -m experiments.plan_batch --sweep=sweeps/grpo_cpu --pilot_fraction=0.3
  python -m experiments.plan_batch --sweep=sweeps/grpo_cpu --pilot_fraction=0.3 \
      --pilot_method=fit --target=0.3 --reference=grpo-P16-G8-sqrt

Writes ``<sweep>/plan.json`` (``plan_pilot.json`` in pilot mode) unless ``--out`` is given.
"""

import os

from absl import flags

from experiments import cli
from rl_batch import artifacts

_SWEEP = flags.DEFINE_string("sweep", None, "Sweep directory (holds sweep.json).", required=True)
_TARGET = flags.DEFINE_float("target", None, "Validation target (default: sweep.json's).")
_REFERENCE = flags.DEFINE_string(
    "reference", None, "Reference: run name or configuration name (default: sweep.json's)."
)
_PILOT = flags.DEFINE_float(
    "pilot_fraction", None, "Pilot mode: use only this fraction of each run's runway."
)
_METHOD = flags.DEFINE_enum(
    "pilot_method", "intermediate", ["intermediate", "fit"], "How the pilot predicts r_N."
)
_LEVEL_FRAC = flags.DEFINE_float(
    "level_frac", 0.8, "Pilot 'intermediate': position of the intermediate accuracy level."
)
_DELTA = flags.DEFINE_float(
    "delta",
    None,
    "Equivalence margin: T ratios shown inside 1 +- delta are equivalent (default: the "
    "sweep's equivalence_delta, else 0.05).",
)
_N_BOOT = flags.DEFINE_integer("n_boot", 2000, "Bootstrap replicates.")
_OUT = flags.DEFINE_string("out", None, "Output JSON (default <sweep>/plan.json).")


def main(argv):
    del argv
    from rl_batch.analysis import curves, planner, stability, time_to_target

    sweep = curves.load_sweep(_SWEEP.value)
    delta = "sweep" if _DELTA.value is None else _DELTA.value
    full = time_to_target.analyze_sweep(
        sweep, _TARGET.value, _REFERENCE.value, n_boot=_N_BOOT.value, delta=delta
    )
    if _PILOT.value is None:
        plan = planner.plan_full(full)
        default_name = "plan.json"
    else:
        plan = planner.plan_pilot(
            sweep,
            _PILOT.value,
            method=_METHOD.value,
            level_frac=_LEVEL_FRAC.value,
            n_boot=_N_BOOT.value,
            full=full,
        )
        default_name = "plan_pilot.json"
    print(plan.verdict)  # the plain recommendation first, then the table behind it
    print()
    print(planner.format_plan_table(plan))
    if plan.mode == "full":  # how often other seeds would name the same set
        print(stability.recommendation_sentence(stability.seed_shares(full)))
    out = _OUT.value or os.path.join(_SWEEP.value, default_name)
    artifacts.write_json_atomic(out, planner.plan_to_json(plan))
    print(f"wrote {out}")


if __name__ == "__main__":
    cli.run(main)
