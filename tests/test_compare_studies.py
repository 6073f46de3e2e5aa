"""Two sweeps of one study side by side, and pooled (``experiments.compare_studies``)."""

import dataclasses
import os
import subprocess
import sys
import types

import analysis_fixtures as fx
import pytest

from experiments import compare_studies
from rl_batch.analysis import curves

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shifted(sweep, by):
    """``sweep`` with every seed moved up by ``by`` (another seed set of the study)."""
    runs = [dataclasses.replace(r, seed=r.seed + by, name=f"{r.name}+{by}") for r in sweep.runs]
    return dataclasses.replace(sweep, runs=tuple(runs))


def test_pool_takes_each_seed_once(tmp_path):
    a = curves.load_sweep(fx.write_sweep(str(tmp_path / "a"), seed_factors=(0.9, 1.1)))
    b = _shifted(a, 10)
    pooled = curves.pool_sweeps([a, b, a])  # a again: its seeds are already in
    assert len(pooled.runs) == 2 * len(a.runs)
    assert {r.seed for r in pooled.runs} == {0, 1, 10, 11}
    assert pooled.calibration == a.calibration and pooled.target == a.target
    other = dataclasses.replace(b, target=a.target + 0.1)
    with pytest.raises(ValueError, match="only sweeps of one study pool"):
        curves.pool_sweeps([a, other])


def test_compare_studies_prints_the_pooled_table(tmp_path):
    dirs = [fx.write_sweep(str(tmp_path / n), seed_factors=(0.9, 1.1)) for n in "ab"]
    out = subprocess.run(
        [sys.executable, "-m", "experiments.compare_studies", f"--sweeps={','.join(dirs)}",
         "--pool"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "findings verdicts agree: True" in out.stdout
    pooled = out.stdout.split("findings verdicts agree: True")[1]
    assert f"## {dirs[0]} + {dirs[1]}" in pooled
    assert f"pooled; T and q from {dirs[0]}'s calibration" in pooled
    assert "2 seeds per configuration" in pooled  # the same seeds twice count once
    assert "| fixed LR at 2x batch needs more samples |" in pooled


def test_agreeing_pairs():
    runs = [["holds", "undecided"], ["holds", "undecided"], ["holds", "holds"]]
    assert compare_studies.agreeing_pairs(runs) == (1, 3)
    assert compare_studies.agreeing_pairs(runs[:2]) == (1, 1)


def test_stop_time_by_hand():
    def run(final, evals):  # evals: (training s, accuracy, validation s)
        records = [
            {"time_train_cum_s": t, "eval_accuracy": a, "time_eval_s": v} for t, a, v in evals
        ]
        return types.SimpleNamespace(final_time_train=final, eval_records=records)

    reaches = run(25.0, [(0.0, 0.1, 1.0), (10.0, 0.5, 1.0), (20.0, 0.7, 1.0)])
    never = run(12.0, [(0.0, 0.1, 2.0), (10.0, 0.2, 2.0)])
    sweep = types.SimpleNamespace(runs=[reaches, never])
    # reaches: stops at its second validation, 10 s + 2 validations of 1 s, of 25 + 3;
    # never: counts whole, 12 + 4.
    assert compare_studies.stop_time(sweep, 0.5) == (12.0 + 16.0, 28.0 + 16.0)
    assert compare_studies.stop_time(sweep, 0.05) == (1.0 + 2.0, 44.0)


def test_compare_studies_rereads_at_another_target(tmp_path):
    d = fx.write_sweep(str(tmp_path / "a"), seed_factors=(0.9, 1.1))
    target = fx.TARGET - 0.1
    out = subprocess.run(
        [sys.executable, "-m", "experiments.compare_studies", f"--sweeps={d},{d}",
         f"--target={target}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"- target {target:g}: stopping at the first validation" in out.stdout
    sweep = curves.load_sweep(d)
    to_target, spent = compare_studies.stop_time(sweep, target)
    assert 0 < to_target < spent
    assert f"would take {to_target:.0f} s of the {spent:.0f} s" in out.stdout
