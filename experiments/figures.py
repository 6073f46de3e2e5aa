r"""Figures and report of a sweep: ``<sweep>/figures/*.png|pdf`` and ``<sweep>/report.md``.

python -m experiments.figures --sweep=sweeps/grpo_cpu
python -m experiments.figures --sweep=sweeps/grpo_cpu --target=0.3 --reference=grpo-P16-G8-sqrt
"""

from absl import flags

from experiments import cli

_SWEEP = flags.DEFINE_string("sweep", None, "Sweep directory (holds sweep.json).", required=True)
_TARGET = flags.DEFINE_float("target", None, "Validation target (default: sweep.json's).")
_REFERENCE = flags.DEFINE_string(
    "reference", None, "Reference: run name or configuration name (default: sweep.json's)."
)
_TOL = flags.DEFINE_float("tol", 0.2, "Critical training batch: largest B with r_N <= 1 + tol.")
_THROUGHPUT = flags.DEFINE_string(
    "throughput", None, "Throughput file (default <sweep>/throughput.json when present)."
)
_N_BOOT = flags.DEFINE_integer("n_boot", 2000, "Bootstrap replicates.")


def main(argv):
    del argv
    from rl_batch.analysis import figures

    written = figures.write_all(
        _SWEEP.value,
        target=_TARGET.value,
        reference=_REFERENCE.value,
        tol=_TOL.value,
        throughput_path=_THROUGHPUT.value,
        n_boot=_N_BOOT.value,
    )
    for path in written:
        print(path)


if __name__ == "__main__":
    cli.run(main)
