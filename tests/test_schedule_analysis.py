"""A batch-size schedule in the analysis: its T books each update at the calibrated step
time of the P it had, and the finding compares it with the best fixed batch."""

import json
import math
import os

import pytest

from rl_batch import artifacts
from rl_batch.analysis import curves, figures, findings
from rl_batch.analysis import time_to_target as ttt
from tests import analysis_fixtures as fx

SEEDS = (0.97, 1.0, 1.03)  # tau factors of the seeds
FIXED = ((8, 8, "sqrt", 1.0), (16, 8, "sqrt", 1.0), (32, 8, "sqrt", 1.05))
# Calibrated step seconds per round (3 rounds) at each P (G = 8).
STEP = {8: [0.29, 0.30, 0.31], 16: [0.39, 0.40, 0.41], 32: [0.78, 0.80, 0.82]}
WARMUP_P = (8, 8, 8, 8)  # the scheduled runs' first updates; then P = 16


def test_calibrated_seconds_by_hand():
    assert ttt.calibrated_seconds(0.5, 3.0) == 1.5
    # Per-update step times: 1 + 2 + half of 4.
    assert ttt.calibrated_seconds(ttt.np.array([1.0, 2.0, 4.0]), 2.5) == 5.0


def _scheduled_sweep(tmp_path, step_at_p8=STEP[8], seeds=SEEDS):
    d = str(tmp_path / "sweep")
    fx.write_sweep(d, configs=FIXED, seed_factors=seeds, reference="P8_G8_sqrt_s0")
    raw = artifacts.read_json(os.path.join(d, artifacts.SWEEP_FILE))
    schedule = {"kind": "warmup", "start_prompts": 8, "responses": 512}
    for seed, factor in enumerate(seeds):
        name = f"p16_g8_sqrt_warmup_s{seed}"
        fx.write_run(
            os.path.join(d, artifacts.RUNS_DIR, name),
            prompts=16,
            group_size=8,
            seed=seed,
            tau=fx.TAU0 * factor,
            prompts_per_update=(*WARMUP_P, 16),
            config_extra={"variant": "warmup", "batch_schedule": schedule},
        )
        raw["runs"].append(
            artifacts.sweep_entry(
                name, prompts=16, group_size=8, lr_rule="sqrt", lr=1e-4, seed=seed,
                status="finished", variant="warmup",
            )
        )  # fmt: skip
    artifacts.write_json_atomic(os.path.join(d, artifacts.SWEEP_FILE), raw)

    def entry(p, per_prompts=None):
        e = {"batch": p * 8, "step_s": STEP[p], "step_s_median": STEP[p][1]}
        return {**e, "prompts_step_s": per_prompts} if per_prompts else e

    configs = {f"{p}x8:sqrt": entry(p) for p in STEP}
    configs["16x8:sqrt@warmup"] = entry(16, {"8": step_at_p8, "16": STEP[16]})
    calibration = {"version": 1, "rounds": 3, "steps": 2, "written_at": "x", "configs": configs}
    with open(os.path.join(d, artifacts.CALIBRATION_FILE), "w") as f:
        json.dump(calibration, f)
    return d


def test_a_schedules_T_books_each_update_at_its_P(tmp_path):
    a = ttt.analyze_sweep(curves.load_sweep(_scheduled_sweep(tmp_path)))
    assert a.calibrated
    for seed in range(len(SEEDS)):
        t = a.targets[f"p16_g8_sqrt_warmup_s{seed}"]
        u = t.updates_to_target
        assert u > len(WARMUP_P)  # reached after the warm-up
        # By hand: 4 updates at P = 8's median, the rest at P = 16's.
        by_hand = len(WARMUP_P) * STEP[8][1] + (u - len(WARMUP_P)) * STEP[16][1]
        assert t.time_to_target_s == pytest.approx(by_hand)
        fixed = a.targets[f"P16_G8_sqrt_s{seed}"]  # a fixed batch: updates x step
        assert fixed.time_to_target_s == pytest.approx(fixed.updates_to_target * STEP[16][1])
    # The scheduled configuration's per-round step time mixes its P values by its updates.
    rounds = a.step_rounds.seconds["16x8:sqrt@warmup"]
    assert all(STEP[8][r] < rounds[r] < STEP[16][r] for r in range(3))


def test_the_schedule_finding_against_the_best_fixed_batch(tmp_path):
    # P = 8 updates of 64 responses at 0.15 s: the warm-up's first 256 responses cost
    # 0.6 s against 0.8 s at 16x8 (2 updates), the rest the same.
    cheap = [0.14, 0.15, 0.16]
    a = ttt.analyze_sweep(curves.load_sweep(_scheduled_sweep(tmp_path, step_at_p8=cheap)))
    best = findings.best_fixed_batch(a)
    # T(8x8) = N*/64 x 0.30, T(16x8) = N*/128 x 0.40, T(32x8) = 1.05 N*/256 x 0.80.
    assert (best.prompts, best.group_size, best.variant) == (16, 8, "")
    assert [k.variant for k in findings.scheduled_configurations(a)] == ["warmup"]
    f = findings.schedule_finding(a)
    # Same curves as 16x8 (same responses per seed), cheaper first responses: T ratio < 1.
    assert f.verdict == findings.HOLDS, f
    ((k, r),) = findings.schedule_ratios(a)
    assert r.hi < 1.0 and r.paired
    # Its P = 8 updates at 1 s (0.8 s for 128 responses at P = 16): slower, decided.
    d2 = tmp_path / "dear"
    a2 = ttt.analyze_sweep(curves.load_sweep(_scheduled_sweep(d2, step_at_p8=[0.9, 1.0, 1.1])))
    assert findings.schedule_finding(a2).verdict == findings.FAILS
    # The finding is in the study's list only where a schedule was run.
    assert f.name in [x.name for x in findings.study_findings(a, None, 0.2)]
    plain = fx.write_sweep(str(tmp_path / "plain"), configs=FIXED, seed_factors=SEEDS)
    a3 = ttt.analyze_sweep(curves.load_sweep(plain))
    assert f.name not in [x.name for x in findings.study_findings(a3, None, 0.2)]


def test_the_schedule_figure_is_written(tmp_path):
    a = ttt.analyze_sweep(curves.load_sweep(_scheduled_sweep(tmp_path)))
    written, skipped = figures.write_figures(a, str(tmp_path / "fig"))
    assert any(p.endswith("schedule.png") for p in written), (written, skipped)
    scheduled = a.runs_by_key[findings.scheduled_configurations(a)[0]]
    _, _, batch = figures._batch_steps(scheduled[0], None)
    assert list(batch[:6]) == [64.0] * 5 + [128.0]
    assert math.isfinite(a.stats[findings.best_fixed_batch(a)].time_to_target_s.mean)


def test_with_four_seeds_the_best_fixed_batch_is_picked_on_half_and_judged_on_the_rest(
    tmp_path,
):
    cheap = [0.14, 0.15, 0.16]
    seeds = (0.97, 1.0, 1.03, 0.99)
    d = _scheduled_sweep(tmp_path, step_at_p8=cheap, seeds=seeds)
    a = ttt.analyze_sweep(curves.load_sweep(d))
    f = findings.schedule_finding(a)
    assert "picked on seeds [0, 2] and compared on seeds [1, 3]" in f.note, f
    assert f.verdict == findings.HOLDS, f
    # The comparison's interval is over the two held-out seeds only.
    held = findings._on_seeds(a, [1, 3])
    assert {r.seed for rs in held.runs_by_key.values() for r in rs} == {1, 3}


def test_under_four_seeds_every_fixed_batch_the_best_could_be_is_compared(tmp_path):
    a = ttt.analyze_sweep(
        curves.load_sweep(_scheduled_sweep(tmp_path, step_at_p8=[0.14, 0.15, 0.16]))
    )
    f = findings.schedule_finding(a)
    # 8x8 is decidedly slower than 16x8 (T 0.0047 N against 0.0031 N); 32x8 (0.0033 N)
    # is not, with the calibration rounds' spread: the set is 16x8 and 32x8, and the
    # cheap warm-up must beat both.
    best_could_be = "(grpo-P16-G8-sqrt, grpo-P32-G8-sqrt; under 4 seeds, none held out)"
    assert best_could_be in f.note, f
    assert f.measured.count("T / T(B = ") == 2, f
    assert f.verdict == findings.HOLDS


def test_a_schedule_shown_to_gain_at_most_the_margin_does_not_beat_the_best(tmp_path):
    # P = 8 updates at 0.19-0.205 s (P = 16's 0.39-0.41 s for twice the responses): the
    # warm-up costs about what 16x8 costs per response, on the same curves: T ratio 1
    # [0.997, 1]. Not decidedly faster or slower: it does not beat the best fixed batch by
    # more than the sweep's equivalence margin (5 %), a decided "does not hold".
    same = [0.19, 0.20, 0.205]
    d = _scheduled_sweep(tmp_path, step_at_p8=same, seeds=(0.97, 1.0, 1.03, 0.99))
    a = ttt.analyze_sweep(curves.load_sweep(d))
    f = findings.schedule_finding(a)
    assert f.verdict == findings.FAILS, f
    assert "gain at most 5% (90% lower end" in f.measured, f
    assert "does not hold when each is slower or gains at most 5%" in f.note
    # Neither faster nor slower at 95 %: before the margin this was "undecided".
    ((_, r),) = findings.schedule_ratios(a)
    assert r.lo <= 1.0 <= r.hi, r
