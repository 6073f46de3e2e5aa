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


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
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


@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
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


def _compare(*dirs):
    return subprocess.run(
        [sys.executable, "-m", "experiments.compare_studies", f"--sweeps={','.join(dirs)}"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


PPO_CONFIGS = [(8, 1, "sqrt", 1.0), (16, 1, "sqrt", 1.0), (32, 1, "sqrt", 1.1)]
PPO_CONFIGS += [(16, 1, "fixed", 1.3)]


@pytest.mark.slow  # 11 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_findings_are_paired_by_name_whichever_sweep_comes_first(tmp_path):
    # A PPO study's table has a finding (the critic's batch scale) a GRPO study's lacks:
    # paired by position, one order was an IndexError and the other mislabelled the
    # findings after it (issue 48 D5).
    grpo = fx.write_sweep(str(tmp_path / "grpo"), seed_factors=(0.9, 1.1))
    ppo = fx.write_sweep(
        str(tmp_path / "ppo"), configs=PPO_CONFIGS, reference="P8_G1_sqrt_s0",
        seed_factors=(0.9, 1.1), algo="ppo",
    )  # fmt: skip
    own = {d: {f.name: f.verdict for f in compare_studies.study(d)[0]} for d in (grpo, ppo)}
    critic = "PPO: the critic's batch scale is the actor's"
    assert critic in own[ppo] and critic not in own[grpo]
    for first, second in [(grpo, ppo), (ppo, grpo)]:
        out = _compare(first, second)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
        across = out.stdout.split("## Across sweeps")[1]
        for name in own[grpo]:
            verdicts = f"{own[first][name]} / {own[second][name]}"
            assert f"- {name}: {verdicts} (" in across, (name, across)
        absent = [own[first].get(critic, "-"), own[second].get(critic, "-")]
        assert f"- {critic}: {' / '.join(absent)} (not in every sweep: not compared)" in across


@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_different_targets_are_said(tmp_path):
    a = fx.write_sweep(str(tmp_path / "a"), seed_factors=(0.9, 1.1))
    b = fx.write_sweep(str(tmp_path / "b"), seed_factors=(0.9, 1.1), target=fx.TARGET - 0.1)
    out = _compare(a, b)
    expected = f"- targets differ: {fx.TARGET:g} / {fx.TARGET - 0.1:g}"
    assert expected in out.stdout, out.stdout[-3000:]
    assert "targets differ" not in _compare(a, a).stdout


def test_compare_findings_by_hand():
    def found(**verdicts):
        return [types.SimpleNamespace(name=n, verdict=v) for n, v in verdicts.items()]

    lines, agree, verdicts = compare_studies.compare_findings(
        [found(a="holds", c="holds", b="undecided"), found(a="holds", b="undecided")]
    )
    assert lines == [
        "- a: holds / holds (same)",
        "- c: holds / - (not in every sweep: not compared)",
        "- b: undecided / undecided (same)",
    ]
    assert agree and verdicts == [["holds", "undecided"], ["holds", "undecided"]]
    _, agree, _ = compare_studies.compare_findings([found(a="holds"), found(b="holds")])
    assert not agree  # nothing in common: nothing agrees
