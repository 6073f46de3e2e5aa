r"""How noisy a sweep's calibrated step-time ratios are, under two interleaving schemes.

  python -m experiments.calibration_noise --sweep_dir=sweeps/grpo_cpu --pairs=2

Calibrates the sweep's configurations (``rl_batch.sweeps.calibrate.calibrate``, as the
sweep does, nothing written to the sweep) ``--pairs`` times under each scheme,
alternately (step, visit, step, visit, ...):

- **step**: the configurations in turn, one step each, a small batch's extra steps
  spread over the round (`calibrate.round_order`, `calibrate.visit_steps`);
- **visit**: each configuration's ``--steps`` steps in a row (the earlier scheme).

For every configuration it prints the spread over rounds of ``log(step_k / step_ref)``
(the quantity whose variance the T and q intervals carry, ``R - 1`` degrees of freedom)
and the half-width of its 95 % t interval on the mean, per calibration and as the
median over the pairs, with the host load and wall time of each calibration.
"""

from __future__ import annotations

import numpy as np
from absl import flags

from experiments import cli
from rl_batch import artifacts, provenance
from rl_batch.analysis import intervals
from rl_batch.sweeps import calibrate

SCHEMES = ("step", "visit")


def _define_flags() -> None:
    """The command's flags, defined only when it runs as one."""
    flags.DEFINE_string("sweep_dir", None, "A sweep with runs (their config.json).", required=True)
    flags.DEFINE_integer("pairs", 2, "Calibrations per scheme, alternated.")
    flags.DEFINE_integer("rounds", 10, "Rounds per calibration.")
    flags.DEFINE_integer("steps", 2, "Steps per visit (calibrate's ``steps``).")
    flags.DEFINE_string("reference", None, "Reference key (default: sweep.json's).")


def log_ratio_spread(record: dict, ref: str) -> dict[str, float]:
    """Each configuration's sample SD over rounds of log(step_s / the reference's)."""
    configs = record["configs"]
    r = np.log(np.asarray(configs[ref]["step_s"], float))
    return {
        k: float(np.std(np.log(np.asarray(v["step_s"], float)) - r, ddof=1))
        for k, v in configs.items()
        if k != ref
    }


def half_width(sd: float, rounds: int, level: float = 0.95) -> float:
    """Half-width (in log units) of the t interval on a mean of ``rounds`` log ratios."""
    return float(intervals.t_quantile(rounds - 1, level) * sd / np.sqrt(rounds))


def main(argv):
    del argv
    f = flags.FLAGS
    if f.pairs < 1 or f.rounds < 2:
        raise ValueError(f"--pairs={f.pairs} --rounds={f.rounds}: need pairs >= 1, rounds >= 2")
    specs = calibrate.sweep_configs(f.sweep_dir)
    ref = (
        f.reference or artifacts.read_json(f"{f.sweep_dir}/{artifacts.SWEEP_FILE}")["reference_key"]
    )
    if ref not in specs:
        raise ValueError(f"--reference={ref!r} is not a configuration of {sorted(specs)}")
    spreads: dict[str, list[dict[str, float]]] = {s: [] for s in SCHEMES}
    for i in range(f.pairs):
        for scheme in SCHEMES:
            rec = calibrate.calibrate(
                specs, rounds=f.rounds, steps=f.steps, log_fn=lambda _: None, interleave=scheme
            )
            spreads[scheme].append(log_ratio_spread(rec, ref))
            b = specs[ref].batch
            print(
                f"pair {i + 1} {scheme:5s}: {rec['wall_s']:.0f} s, load "
                f"{rec['load_start'][0]:.2f} -> {rec['load_end'][0]:.2f}, "
                f"q(B = {b}) {b / rec['configs'][ref]['step_s_median']:.1f}"
            )
    print(f"\nSD over rounds of log(step / step({ref})); 95 % half-width on the mean in ()")
    print(f"| config | B | {' | '.join(SCHEMES)} | step / visit |")
    print("|---|---|" + "---|" * (len(SCHEMES) + 1))
    for k in spreads["step"][0]:
        med = {s: float(np.median([d[k] for d in spreads[s]])) for s in SCHEMES}
        cells = [
            f"{med[s]:.3f} ({half_width(med[s], f.rounds):.3f}; each "
            f"{', '.join(f'{d[k]:.3f}' for d in spreads[s])})"
            for s in SCHEMES
        ]
        ratio = med["step"] / med["visit"]
        print(f"| {k} | {specs[k].batch} | {' | '.join(cells)} | {ratio:.2f} |")
    print(f"\nload now {provenance.load_average()}")


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
