"""A hyperparameter-rule variant in the analysis: the finding 'at 2x batch, the rule for X
keeps invariance better than fixed X' both ways, its absence without such a variant, and
the variant's row in the report's ratio table."""

import os

from rl_batch import artifacts
from rl_batch.analysis import curves, findings, report
from rl_batch.analysis import time_to_target as ttt
from tests import analysis_fixtures as fx

SEEDS = (0.97, 1.0, 1.03)  # tau factors of the seeds (the same for every configuration)
# Reference 8x8 (B = 64); 16x8 is at twice its batch.
FIXED = ((8, 8, "sqrt", 1.0), (16, 8, "sqrt", 1.0), (32, 8, "sqrt", 1.05))
DEFAULTS = {"adam": "fixed", "clip": "fixed", "warmup": "updates"}  # as every run records
SDE = {**DEFAULTS, "adam": "sde"}


def _sweep(tmp_path, mult, variant="adam-sde", rules=SDE, prompts=16):
    """The FIXED sweep plus ``variant`` at ``prompts`` x 8, its tau ``mult`` times the
    fixed configuration's (N* scales with tau in the synthetic curves)."""
    d = str(tmp_path / "sweep")
    fx.write_sweep(
        d, configs=FIXED, seed_factors=SEEDS, reference="P8_G8_sqrt_s0",
        config_extra={"hparam_rules": DEFAULTS},
    )  # fmt: skip
    raw = artifacts.read_json(os.path.join(d, artifacts.SWEEP_FILE))
    for seed, factor in enumerate(SEEDS):
        name = f"p{prompts}_g8_sqrt_{variant}_s{seed}"
        fx.write_run(
            os.path.join(d, artifacts.RUNS_DIR, name),
            prompts=prompts,
            group_size=8,
            seed=seed,
            tau=fx.TAU0 * mult * factor,
            config_extra={"variant": variant, "hparam_rules": rules},
        )
        raw["runs"].append(
            artifacts.sweep_entry(
                name, prompts=prompts, group_size=8, lr_rule="sqrt", lr=1e-4, seed=seed,
                status="finished", variant=variant,
            )
        )  # fmt: skip
    artifacts.write_json_atomic(os.path.join(d, artifacts.SWEEP_FILE), raw)
    return ttt.analyze_sweep(curves.load_sweep(d))


def test_the_rule_keeps_invariance_better_when_its_n_star_interval_lies_below_1(tmp_path):
    # tau 0.8 x the fixed configuration's, seed for seed: N*(rule) / N*(fixed) ~ 0.8 in
    # every seed (the same shape 16x8, so the seeds pair), an interval below 1.
    a = _sweep(tmp_path, 0.8)
    ((k, fixed),) = findings.hparam_rule_configurations(a)
    assert (k.variant, fixed.variant, k.batch, fixed.batch) == ("adam-sde", "", 128, 128)
    assert findings.hparam_rules_off_default(a, k) == {"adam": "sde"}
    assert findings.hparam_rules_off_default(a, fixed) == {}
    (f,) = findings.hparam_rule_findings(a)
    assert f.name == "at 2x batch, the rule adam=sde keeps invariance better than fixed"
    assert f.verdict == findings.HOLDS, f
    assert f.measured.startswith("N*(adam-sde) / N*(fixed) at B = 128 = 0.8")
    assert "(paired by seed)" in f.measured
    e = findings._n_star_ratio(a, k, fixed)
    assert e.paired and e.hi < 1.0 and abs(e.mean - 0.8) < 0.03
    # In the study's findings, once.
    names = [x.name for x in findings.study_findings(a, None, 0.2)]
    assert names.count(f.name) == 1


def test_the_rule_does_not_hold_when_its_interval_lies_above_1(tmp_path):
    a = _sweep(tmp_path, 1.3)
    (f,) = findings.hparam_rule_findings(a)
    assert f.verdict == findings.FAILS, f
    assert "= 1.3" in f.measured


def test_no_finding_without_a_rule_variant_at_twice_the_reference_batch(tmp_path):
    plain = fx.write_sweep(str(tmp_path / "plain"), configs=FIXED, seed_factors=SEEDS)
    a = ttt.analyze_sweep(curves.load_sweep(plain))
    assert findings.hparam_rule_findings(a) == []
    names = [x.name for x in findings.study_findings(a, None, 0.2)]
    assert not any("keeps invariance better than fixed" in n for n in names)
    # A variant at 2x batch that sets no rule off its default (another setting) is none.
    a = _sweep(tmp_path / "x", 0.8, variant="same", rules={"adam": "fixed"})
    assert findings.hparam_rule_findings(a) == []
    # Nor is a rule variant at 4x the reference batch.
    a = _sweep(tmp_path / "y", 0.8, prompts=32)
    assert findings.hparam_rule_findings(a) == []


def test_the_variant_configuration_has_its_row_in_the_ratio_table(tmp_path):
    a = _sweep(tmp_path, 0.8)
    (k, _), *_ = findings.hparam_rule_configurations(a)
    rows = [line for line in report.ratio_table(a) if line.startswith(f"| {k.name} |")]
    assert len(rows) == 1 and "| 128 |" in rows[0]
    assert "adam-sde" in k.name
    text = report.build_report(a, resamples=0)
    assert f"| {k.name} | 128 |" in text
    assert "the rule adam=sde keeps invariance better than fixed" in text
