"""ScaleRL's saturating fit: hand-worked curves with known ceiling A and midpoint C_mid."""

import dataclasses
import math

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.analysis import curves, findings, report, saturation
from rl_batch.analysis import time_to_target as ttt

C = np.arange(0.0, 8193.0, 256.0)  # evaluations every 256 responses, the first at 0


def _curve(a, c_mid, b=1.5, r0=0.3, c=C):
    """R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B), R0 at C = 0."""
    return saturation.SigmoidFit(a, c_mid, b, r0, 0.0, float(c[-1])).predict(c)


def test_exact_curve_recovers_its_parameters():
    # R(1500) = 0.3 + 0.3 / 2 = 0.45 by hand: half the rise at the midpoint.
    assert _curve(0.6, 1500.0, c=np.array([1500.0]))[0] == pytest.approx(0.45)
    f = saturation.fit_sigmoid(C, _curve(0.6, 1500.0))
    assert (f.A, f.c_mid, f.B, f.R0) == pytest.approx((0.6, 1500.0, 1.5, 0.3), rel=1e-5)
    # Without an evaluation at C = 0, R0 is fitted too.
    g = saturation.fit_sigmoid(C[1:], _curve(0.6, 1500.0)[1:])
    assert (g.A, g.c_mid, g.R0) == pytest.approx((0.6, 1500.0, 0.3), rel=1e-4)


def test_one_bad_evaluation_does_not_move_the_fit():
    y = _curve(0.6, 1500.0)
    y[10] -= 0.2  # one evaluation 0.2 low (a plain least squares would pull A and C_mid)
    f = saturation.fit_sigmoid(C, y)
    assert f.A == pytest.approx(0.6, abs=0.005) and f.c_mid == pytest.approx(1500.0, rel=0.03)


def test_reach_of_a_curve_stopped_early():
    c = C[:8]  # last evaluation at 1792 responses
    f = saturation.fit_sigmoid(c, _curve(0.6, 1500.0, c=c))
    # by hand: 1 / (1 + (1500 / 1792)^1.5) = 0.566
    assert f.reach == pytest.approx(1.0 / (1.0 + (1500.0 / 1792.0) ** 1.5), rel=1e-4)
    assert f.reach < saturation.MIN_REACH  # such a fit does not count for the ceiling


def _sweep(tmp_path, ceilings_by_prompts, jitter=(0.0, 0.0, 0.0)):
    """A 3-seed sqrt family (P = 8, 16, 32; G = 8) whose eval curves are the saturating
    form with the given ceilings (plus a per-seed offset ``jitter``), C_mid 1500."""
    configs = [(p, 8, "sqrt", 1.0) for p in ceilings_by_prompts]
    d = fx.write_sweep(str(tmp_path), configs=configs, seed_factors=(1.0, 1.0, 1.0))
    a = ttt.analyze_sweep(curves.load_sweep(d), n_boot=100)
    new = {}
    for k, runs in a.runs_by_key.items():
        new[k] = [
            dataclasses.replace(
                r,
                eval_responses=C,
                eval_accuracy=_curve(ceilings_by_prompts[k.prompts] + jitter[r.seed], 1500.0),
            )
            for r in runs
        ]
    return dataclasses.replace(a, runs_by_key=new)


def test_config_ceiling_intervals_over_seeds_by_hand(tmp_path):
    a = _sweep(tmp_path, {8: 0.6, 16: 0.6, 32: 0.6}, jitter=(-0.01, 0.0, 0.01))
    k = artifacts.Configuration("grpo", 8, 8, "sqrt")
    cc = saturation.config_ceiling(k, a.runs_by_key[k], 0.95)
    # A = 0.59, 0.60, 0.61: mean 0.6, sd 0.01, t(2, 0.975) = 4.303 -> 0.6 -+ 0.02484
    half = 4.302653 * 0.01 / math.sqrt(3)
    assert (cc.A.mean, cc.A.lo, cc.A.hi) == pytest.approx((0.6, 0.6 - half, 0.6 + half), rel=1e-4)
    assert cc.c_mid.mean == pytest.approx(1500.0, rel=1e-4) and cc.n_used == 3


@pytest.mark.parametrize(
    "ceil,jitter,verdict",
    [
        ({8: 0.6, 16: 0.6, 32: 0.6}, (-0.001, 0.0, 0.001), findings.FAILS),
        ({8: 0.6, 16: 0.6, 32: 0.7}, (-0.001, 0.0, 0.001), findings.HOLDS),
        ({8: 0.6, 16: 0.6, 32: 0.6}, (-0.05, 0.0, 0.05), findings.UNDECIDED),
    ],
)
def test_ceiling_verdict(tmp_path, ceil, jitter, verdict):
    a = _sweep(tmp_path, ceil, jitter)
    f = saturation.ceiling_finding(a)
    assert f.verdict == verdict, f
    assert f.measured.startswith("A / A(B=64): B=128: ")


def test_report_has_the_section(tmp_path):
    a = _sweep(tmp_path, {8: 0.6, 16: 0.6, 32: 0.7}, (-0.001, 0.0, 0.001))
    text = report.build_report(a, resamples=0)
    assert "## Saturating fit: ceiling and midpoint (ScaleRL form)" in text
    row = next(
        line for line in text.splitlines() if line.startswith("| grpo-P32-G8-sqrt | 256 | 3/3/3")
    )
    assert "| 0.7 [" in row
    assert "larger batches change the ceiling A: **holds**" in text
