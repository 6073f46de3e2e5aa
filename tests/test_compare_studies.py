"""Two sweeps of one study side by side, and pooled (``experiments.compare_studies``)."""

import dataclasses
import os
import subprocess
import sys

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
