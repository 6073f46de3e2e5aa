"""Verdict shares over seed resamples (``rl_batch.analysis.stability``)."""

import dataclasses

import analysis_fixtures as fx
import pytest

from rl_batch.analysis import curves, findings, planner, report, stability
from rl_batch.analysis import time_to_target as ttt
from rl_batch.analysis.findings import Finding

FACTORS = (0.8, 1.0, 1.25)  # three seeds


def _analysis(path):
    return ttt.analyze_sweep(curves.load_sweep(fx.write_sweep(str(path), seed_factors=FACTORS)))


def test_a_drawn_seed_brings_its_runs_of_every_configuration(tmp_path):
    a = _analysis(tmp_path / "s")
    resampled = stability.resample_seeds(a.sweep, [2, 2, 0])
    b = stability.reanalyze(a, resampled)
    assert b.reference == a.reference
    assert len({r.name for r in resampled.runs}) == len(resampled.runs)
    for key, runs in a.runs_by_key.items():
        own = {r.seed: a.targets[r.name].n_star for r in runs}
        new = {r.seed: b.targets[r.name].n_star for r in b.runs_by_key[key]}
        assert new == {0: own[2], 1: own[2], 2: own[0]}, key


@pytest.mark.slow  # 35 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_shares_are_the_resampling_probabilities(tmp_path):
    a = _analysis(tmp_path / "s")

    def decide(b):
        # "holds" when seed 0 was drawn at least once: P = 1 - (2/3)^3 = 0.7037.
        drawn = {r.name.split("@")[0] for r in b.runs_by_key[b.reference]}
        verdict = findings.HOLDS if any(n.endswith("_s0") for n in drawn) else findings.FAILS
        return [Finding("seed 0 drawn", "", "", verdict)]

    shares = stability.seed_shares(a, decide, resamples=1000, seed=1).verdicts["seed 0 drawn"]
    assert shares[findings.HOLDS] == pytest.approx(1 - (2 / 3) ** 3, abs=0.05)
    assert shares[findings.HOLDS] + shares[findings.FAILS] == pytest.approx(1.0)


def test_one_seed_has_no_shares(tmp_path):
    d = fx.write_sweep(str(tmp_path / "one"), seed_factors=(1.0,))
    a = ttt.analyze_sweep(curves.load_sweep(d))
    assert stability.seed_shares(a, lambda b: [], resamples=10) is None
    assert report.study_shares(a, None, 0.2) is None
    assert stability.recommendation_sentence(None) == ""


def test_fmt_shares():
    shares = {findings.FAILS: 0.78, findings.UNDECIDED: 0.2195, findings.HOLDS: 0.0005}
    text = stability.fmt_shares(findings.FAILS, shares)
    assert text == "78% (undecided at this power 22%, holds <1%)"
    assert stability.fmt_shares(findings.HOLDS, {findings.HOLDS: 1.0}) == "100%"


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_the_findings_table_has_the_shares(tmp_path):
    # The fixed-LR finding (1.67x, paired: the seed factor cancels) holds in every resample.
    a = _analysis(tmp_path / "s")
    table = report.findings_section(a, None, 0.2, report.study_shares(a, None, 0.2, 50))
    assert "same verdict on resampled seeds" in table[2]
    fixed = next(r for r in table if r.startswith("| fixed LR at 2x batch"))
    assert fixed.endswith("| **holds** | N* ratio interval against 1 | 100% |")
    assert "50 resamples of the seeds" in "\n".join(table)
    assert "resampled" not in "\n".join(report.findings_section(a, None, 0.2))


@pytest.mark.slow  # 7 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_recommendation_shares(tmp_path):
    # The standard sweep's T is smallest at B = 256 by far: best in every resample.
    a = _analysis(tmp_path / "s")
    plan = planner.plan_full(a)
    shares = stability.seed_shares(a, resamples=20)
    assert (shares.resamples, shares.used, shares.verdicts) == (20, 20, {})
    assert shares.best == {plan.best: 1.0}
    assert shares.in_set[plan.best] == 1.0
    assert set(shares.in_set) >= set(plan.candidates)
    sentence = stability.recommendation_sentence(shares)
    assert sentence.startswith("Over 20 resamples of the seeds")
    assert f"{plan.best.name} (batch {plan.best.batch}) 100%" in sentence
    text = report.build_report(a, None, resamples=20)
    assert sentence in text and "20 resamples of the seeds (with replacement" in text
    assert "resamples" not in report.build_report(a, None, resamples=0)


@pytest.mark.slow  # 9 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_draws_without_the_reference_are_left_out(tmp_path):
    # The reference ran seed 0 only: (2/3)^3 of the draws have no reference run.
    a = _analysis(tmp_path / "s")
    runs = tuple(r for r in a.sweep.runs if r.key != a.reference or r.seed == 0)
    a = stability.reanalyze(a, dataclasses.replace(a.sweep, runs=runs))
    kept = list(stability.resampled(a, 300, seed=2))
    assert len(kept) == pytest.approx(300 * (1 - (2 / 3) ** 3), abs=30)
    shares = stability.seed_shares(a, lambda b: [Finding("x", "", "", findings.HOLDS)], 300, seed=2)
    assert shares.verdicts == {"x": {findings.HOLDS: 1.0}}
    assert (shares.resamples, shares.used) == (300, len(kept))
