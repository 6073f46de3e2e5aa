"""Batch-size schedules (``batch_schedule``): the schedule functions against sequences
worked by hand, config validation, and tiny runs (P and LR per update, compiled shapes,
an exact resume mid-schedule)."""

import dataclasses
import json
import math
import re

import pytest
from ml_collections import ConfigDict

from experiments.configs import base
from rl_batch import artifacts
from rl_batch.models import flops
from rl_batch.runs import batch_schedule as bs
from rl_batch.runs import config as config_lib
from rl_batch.runs import programs as programs_lib
from rl_batch.runs import run as run_lib
from rl_batch.runs.spec import RunSpec
from tests.run_fixtures import assert_same_records, deterministic, set_fields, tiny_run_config


def _schedule(kind="warmup", prompts=8, group_size=2, start_prompts=2, responses=64, window=2):
    return bs.BatchSchedule(
        kind=kind,
        prompts=prompts,
        group_size=group_size,
        start_prompts=start_prompts,
        responses=responses,
        window=window,
    )


# ------------------------------------------------------------------ the schedule functions


def test_buckets_are_the_doublings_from_p0_to_prompts():
    assert _schedule(start_prompts=2, prompts=8).buckets == (2, 4, 8)
    assert _schedule(start_prompts=1, prompts=16).buckets == (1, 2, 4, 8, 16)
    assert _schedule(start_prompts=8, prompts=8).buckets == (8,)
    assert _schedule(start_prompts=1, prompts=16).doublings == 4


def test_warmup_doubles_evenly_over_its_responses():
    # P0=2 -> P=8 over 64 responses: K=2 doublings, stage floor(r * 2 / 64).
    s = _schedule(start_prompts=2, prompts=8, responses=64)
    got = [bs.prompts_at(s, r) for r in (0, 8, 31, 32, 63, 64, 65, 1000)]
    assert got == [2, 2, 2, 4, 4, 8, 8, 8]
    # P0=1 -> P=8 over 90: K=3, stage floor(r / 30): 1 up to 29, 2 up to 59, 4 up to 89.
    s = _schedule(start_prompts=1, prompts=8, responses=90)
    got = [bs.prompts_at(s, r) for r in (0, 29, 30, 59, 60, 89, 90)]
    assert got == [1, 1, 2, 2, 4, 4, 8]


def test_fixed_is_always_the_configured_prompts():
    s = bs.BatchSchedule.from_config(ConfigDict({"prompts": 16, "group_size": 8}))
    assert s.kind == "fixed" and s.buckets == (16,)
    assert [bs.prompts_at(s, r) for r in (0, 10_000)] == [16, 16]


def _point(prompts, g2, trace, b=2.0, big=8.0):
    """A measurement whose unbiased terms are exactly |G|^2 = g2, tr(Sigma) = trace:
    E|g_b|^2 = g2 + trace / b."""
    return bs.NoisePoint(prompts, g2 + trace / b, g2 + trace / big, b, big)


def test_pooled_noise_scale_is_the_ratio_of_the_mean_terms():
    # By hand: |g_2|^2 = 5, |g_8|^2 = 2 -> |G|^2 = (16 - 10) / 6 = 1, tr = 3 / 0.375 = 8.
    assert bs.pooled_noise_scale([bs.NoisePoint(2, 5.0, 2.0, 2.0, 8.0)]) == pytest.approx(8.0)
    # (8 + 4) / 2 over (1 + 3) / 2 = 3, not the mean of the ratios (8 + 4/3) / 2.
    pooled = bs.pooled_noise_scale([_point(2, 1.0, 8.0), _point(2, 3.0, 4.0)])
    assert pooled == pytest.approx(3.0)
    # |G|^2 <= 0 with noise: no estimate (NaN), not an infinite noise scale; no noise: 0.
    assert math.isnan(bs.pooled_noise_scale([bs.NoisePoint(2, 5.0, 1.0, 2.0, 8.0)]))
    assert bs.pooled_noise_scale([bs.NoisePoint(2, 1.0, 1.0, 2.0, 8.0)]) == 0.0
    with pytest.raises(ValueError, match="no noise measurements"):
        bs.pooled_noise_scale([])


def _adaptive(step_s, window=2):
    """P0 = 2 up to 8 at G = 2 (B = 4, 8, 16), with calibrated step seconds ``step_s``."""
    s = _schedule(kind="adaptive", start_prompts=2, prompts=8, group_size=2, window=window)
    return dataclasses.replace(s, step_s=tuple(zip((4, 8, 16), step_s)))


def test_doubling_pays_when_the_throughput_gain_exceeds_the_sample_cost():
    # B = 4, B_n = 16: cost (1 + 8 / 16) / (1 + 4 / 16) = 1.5 / 1.25 = 1.2.
    assert bs.doubling_pays(1.21, 4, 16.0) and not bs.doubling_pays(1.19, 4, 16.0)
    # No evidence of noise (a lower bound of 0): never.
    assert not bs.doubling_pays(10.0, 4, 0.0)


def test_adaptive_doubles_by_predicted_time():
    # q(B) = B / step_s: 4 / 1, 8 / (8 / 4.8) = 4.8, 16 / (16 / 5.76) = 5.76: each doubling
    # gains 1.2x, which pays while (1 + 2B / B_n) / (1 + B / B_n) < 1.2, i.e. B_n > 4 B.
    s = _adaptive((1.0, 8 / 4.8, 16 / 5.76))
    assert s.throughput(8) / s.throughput(4) == pytest.approx(1.2)
    # Identical measurements: the Fieller bound is the pooled value itself.
    hot, cold = _point(2, 1.0, 20.0), _point(2, 1.0, 8.0)  # B_noise 20 and 8; B = 4
    assert bs.noise_scale_lower_bound([hot, hot]) == pytest.approx(20.0)
    assert bs.prompts_at(s, 0, []) == 2  # P0 before any measurement
    assert bs.prompts_at(s, 0, [hot]) == 2  # the window (2) is not full yet
    assert bs.prompts_at(s, 0, [hot, hot]) == 4  # 20 > 4 x 4
    # B_noise 8 > B = 4 (the old rule would grow) but < 16: the 1.2x gain does not pay.
    assert bs.prompts_at(s, 0, [cold, cold]) == 2
    # At P = 4 (B = 8) it pools the updates there only, and needs B_n > 32.
    at4 = [hot, hot, _point(4, 1.0, 40.0)]
    assert bs.prompts_at(s, 0, at4) == 4
    assert bs.prompts_at(s, 0, [*at4, _point(4, 1.0, 40.0)]) == 8
    assert bs.prompts_at(s, 0, [hot, hot, _point(4, 1.0, 30.0), _point(4, 1.0, 30.0)]) == 4
    # A flat q (no throughput gain) never doubles, whatever the noise.
    assert bs.prompts_at(_adaptive((1.0, 2.0, 4.0)), 0, [_point(2, 1.0, 1e6)] * 2) == 2
    # A mean |G|^2 <= 0 is no estimate: it keeps P (the old rule read it as infinite).
    assert bs.prompts_at(s, 0, [bs.NoisePoint(2, 5.0, 1.0, 2.0, 8.0)] * 4) == 2
    # Never past the configured prompts.
    assert bs.prompts_at(s, 0, [_point(8, 1.0, 1e6)] * 2) == 8


def test_calibrated_step_times_read_the_fixed_configurations_then_the_schedules(tmp_path):
    path = tmp_path / "calibration.json"
    configs = {
        "2x8:sqrt": {"batch": 16, "step_s_median": 0.1},
        "4x8:sqrt": {"batch": 32, "step_s_median": 0.2},
        "4x8:fixed": {"batch": 32, "step_s_median": 9.0},  # another rule
        "4x16:sqrt": {"batch": 64, "step_s_median": 9.0},  # another G
        "16x8:sqrt@adaptive": {
            "batch": 128,
            "step_s_median": 9.0,  # (a schedule's own step time: its largest P)
            "prompts_step_s": {"2": [7.0], "8": [0.3, 0.5, 0.4], "16": [0.6]},
        },
    }
    path.write_text(json.dumps({"configs": configs}))
    got = bs.calibrated_step_times(str(path), 8, "sqrt")
    assert got == {16: 0.1, 32: 0.2, 64: 0.4, 128: 0.6}
    assert bs.calibrated_step_times(str(tmp_path / "none.json"), 8, "sqrt") == {}


def test_noise_history_reads_the_update_lines_that_measured_the_noise():
    fields = dict(grad_sq_micro=5.0, grad_sq_full=2.0, gns_batch_micro=2.0, gns_batch_full=8.0)
    records = [
        {"kind": "eval", "step": 0, **fields},
        {"kind": "update", "step": 1, "prompts": 2, **fields},
        {"kind": "update", "step": 2, "prompts": 2},  # micro_batches = 1: no measurement
        {"kind": "update", "step": 3, "prompts": 4, **fields, "grad_sq_full": float("nan")},
        {"kind": "update", "step": 4, "prompts": 4, **fields},
    ]
    assert bs.noise_history(records) == [
        bs.NoisePoint(2, 5.0, 2.0, 2.0, 8.0),
        bs.NoisePoint(4, 5.0, 2.0, 2.0, 8.0),
    ]


# ------------------------------------------------------------------------- the config


def _config(**changes):
    c = base.run_config()
    c.run_dir = "/tmp/unused"
    return set_fields(c, changes)


def _warmup(**changes):
    return _config(
        **{
            "batch_schedule.kind": "warmup",
            "batch_schedule.start_prompts": 2,
            "batch_schedule.responses": 512,
            **changes,
        }
    )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"batch_schedule.kind": "cosine"}, "batch_schedule.kind='cosine': expected one of"),
        ({"batch_schedule.start_prompts": 3}, "batch_schedule.start_prompts=3: kind='warmup'"),
        ({"batch_schedule.start_prompts": 0}, "batch_schedule.start_prompts=0: kind='warmup'"),
        ({"batch_schedule.start_prompts": 32}, "batch_schedule.start_prompts=32: kind='warmup'"),
        ({"batch_schedule.responses": 0}, "batch_schedule.responses=0: kind='warmup' needs"),
        (
            {"batch_schedule.kind": "adaptive"},
            "batch_schedule.kind='adaptive' needs grpo.micro_batches >= 2 (got 1)",
        ),
        (
            {
                "batch_schedule.kind": "adaptive",
                "batch_schedule.window": 0,
                "grpo.micro_batches": 2,
            },
            "batch_schedule.window=0: must be an int >= 1",
        ),
        (
            {"batch_schedule.kind": "adaptive", "grpo.micro_batches": 2},
            "batch_schedule.kind='adaptive' needs batch_schedule.calibration",
        ),
        (
            {
                "batch_schedule.kind": "adaptive",
                "grpo.micro_batches": 2,
                "grpo.micro_layout": "strided",
            },
            "kind='adaptive' decides on B_noise: it needs grpo.micro_layout='groups'",
        ),
        (
            {
                "batch_schedule.kind": "adaptive",
                "grpo.micro_batches": 2,
                "batch_schedule.calibration": "/nonexistent/calibration.json",
            },
            "batch_schedule.calibration='/nonexistent/calibration.json': no such file",
        ),
        ({"async_rollout.enabled": True}, "kind='warmup' needs synchronous rollouts"),
        ({"partial_rollout.enabled": True}, "kind='warmup' needs synchronous rollouts"),
        ({"grpo.micro_batch_seqs": 16}, "kind='warmup' takes a fixed micro-batch count"),
        (
            {"algo": "ppo", "group_size": 1, "filter_groups": False},
            "batch_schedule.kind='warmup' needs algo='grpo'",
        ),
    ],
)
def test_bad_schedules_are_named_in_one_line(changes, message):
    with pytest.raises(ValueError, match="invalid config: .*" + re.escape(message)) as e:
        config_lib.resolve(_warmup(**changes), 1)
    assert "\n" not in str(e.value)


def test_the_schedules_first_batch_must_split_like_the_last():
    # P0 x G = 2 x 8 = 16 rows into 4 micro-batches x 8 shards = 32 pieces: no.
    c = _warmup(**{"grpo.micro_batches": 4})
    with pytest.raises(ValueError, match="start_prompts=2: its batch 2 x 8 = 16 does not split"):
        config_lib.resolve(c, 8)
    assert config_lib.resolve(c, 2).batch_schedule.buckets == (2, 4, 8, 16)


def test_the_schedule_is_in_the_spec_and_reads_back_from_config_json():
    spec = config_lib.resolve(_warmup(), 1)
    assert spec.batch_schedule == bs.BatchSchedule(
        kind="warmup", prompts=16, group_size=8, start_prompts=2, responses=512, window=4
    )
    data = json.loads(json.dumps(spec.to_json()))
    assert data["batch_schedule"]["kind"] == "warmup"
    assert RunSpec.from_json(data).batch_schedule == spec.batch_schedule


def test_a_config_json_from_before_batch_schedules_is_fixed_and_resumes():
    new = config_lib.resolve(_config(), 1).to_json()
    old = json.loads(json.dumps(new))
    del old["batch_schedule"]
    assert config_lib.resume_diffs(old, new) == []
    spec = RunSpec.from_json(old)
    assert spec.batch_schedule.kind == "fixed" and spec.batch_schedule.buckets == (16,)
    # A schedule is a different run: it does not resume a fixed one.
    warm = config_lib.resolve(_warmup(), 1).to_json()
    assert "batch_schedule.kind: 'fixed' -> 'warmup'" in config_lib.resume_diffs(old, warm)


def test_the_lr_rule_is_applied_at_the_current_batch():
    # sqrt rule, lr_ref 5e-5 at batch_ref 128; prompts 16 x G 8 = 128.
    spec = config_lib.resolve(_warmup(), 1)
    assert spec.optimizer_at(128) == spec.optimizer
    assert spec.optimizer_at(32).lr == pytest.approx(5e-5 * math.sqrt(32 / 128))
    malladi = config_lib.resolve(_warmup(lr_rule="malladi"), 1)
    at32 = malladi.optimizer_at(32)  # k = 1/4: 1 - b -> (1 - b) / 4, eps -> 2 eps
    assert (at32.b1, at32.b2, at32.eps) == pytest.approx((0.975, 0.99975, 2e-8))
    fixed_lr = config_lib.resolve(_warmup(lr=1e-4), 1)
    assert fixed_lr.optimizer_at(32).lr == 1e-4  # an explicit lr overrides the rule


def test_surge_with_a_schedule_derives_its_lr_at_every_scheduled_batch():
    # lr_ref 5e-5 at B_ref 128, B_noise 32: f(x) = sqrt(32 / x) + sqrt(x / 32);
    # f(128) = 0.5 + 2 = 2.5, f(32) = 1 + 1 = 2, f(64) = sqrt(1/2) + sqrt(2) = 2.12132.
    spec = config_lib.resolve(_warmup(lr_rule="surge", lr_rule_noise_scale=32.0), 1)
    assert spec.optimizer.lr == pytest.approx(5e-5)  # B = 16 x 8 = 128 = B_ref
    assert spec.optimizer_at(32).lr == pytest.approx(5e-5 * 2.5 / 2)  # 6.25e-5, the peak
    assert spec.optimizer_at(64).lr == pytest.approx(5e-5 * 2.5 / 2.1213203)
    # Without its noise scale surge is refused at resolve, in one line, before compute.
    with pytest.raises(ValueError, match="invalid config: lr_rule='surge': rule 'surge' needs"):
        config_lib.resolve(_warmup(lr_rule="surge"), 1)


def test_the_clip_rule_follows_the_scheduled_batch():
    # clip 0.2 / 0.28 x sqrt(B / 128) at the buckets B = 2, 4, 8, 16 prompts x 8:
    # sqrt(1/8) = 0.353553, sqrt(1/4) = 0.5, sqrt(1/2) = 0.707107, sqrt(1) = 1.
    spec = config_lib.resolve(_warmup(**{"hparam_rules.clip": "sqrt"}), 1)
    want = {
        16: (0.0707107, 0.0989949),
        32: (0.1, 0.14),
        64: (0.1414214, 0.1979899),
        128: (0.2, 0.28),
    }
    for batch, (low, high) in want.items():
        assert spec.clip_at(batch) == (pytest.approx(low, rel=1e-6), pytest.approx(high, rel=1e-6))
    assert (spec.clip_low, spec.clip_high) == (0.2, 0.28)  # derived at B = 128 = B_ref
    # Past batch_ref the caps hold: B = 128 x 8 = 1024, k = 8, sqrt(8) = 2.828427:
    # clip_low 0.565685 -> 0.5 (capped), clip_high 0.791960; at B = 256, k = 2: 0.282843 /
    # 0.395980 (not capped).
    big = config_lib.resolve(_warmup(prompts=128, **{"hparam_rules.clip": "sqrt"}), 1)
    assert big.clip_at(1024) == (0.5, pytest.approx(0.7919596, rel=1e-6))
    assert big.clip_at(256) == (pytest.approx(0.2828427), pytest.approx(0.3959798))
    # No clip range the rule gives is one the algorithm refuses (clip_low < 1 at the cap).
    for prompts in big.batch_schedule.buckets:
        big.algorithm.replace(**dict(zip(("clip_low", "clip_high"), big.clip_at(prompts * 8))))


def test_what_a_schedule_cannot_serve_is_refused_in_one_line_before_compute():
    # surge without its noise scale at any bucket: one line, naming the field.
    with pytest.raises(ValueError, match="invalid config: .*lr_rule='surge'") as e:
        config_lib.resolve(_warmup(lr_rule="surge", **{"hparam_rules.clip": "sqrt"}), 1)
    assert "\n" not in str(e.value)
    # Warm-up without a schedule still derives at B (the rules' "responses" form: by hand
    # round(4 * 128 / 128) = 4).
    fixed = config_lib.resolve(
        _config(lr_warmup_updates=4, **{"hparam_rules.warmup": "responses"}), 1
    )
    assert fixed.hparams_at(128).warmup_updates == fixed.lr_warmup_updates == 4
    assert fixed.hparams_at(32).warmup_updates == 16  # round(4 * 128 / 32)


def test_the_warmup_follows_the_scheduled_batch():
    # lr_warmup_updates = 4 at B_ref = 128 under warmup="responses": at a scheduled B = 32
    # (P = 4) W = round(4 * 128 / 32) = 16 updates; the sqrt LR there is 5e-5 x sqrt(1/4).
    spec = config_lib.resolve(
        _warmup(lr_warmup_updates=4, **{"hparam_rules.warmup": "responses"}), 1
    )
    assert spec.optimizer_at(32, update=3).lr == pytest.approx(2.5e-5 * 4 / 16)
    assert spec.optimizer_at(32, update=15).lr == pytest.approx(2.5e-5)
    assert spec.optimizer_at(128, update=1).lr == pytest.approx(5e-5 * 2 / 4)  # W = 4
    assert spec.optimizer_at(128).lr == pytest.approx(5e-5)  # (no update: the peak)


@pytest.mark.parametrize(
    "changes",
    [
        {"lr_rule": "sqrt"},
        {"lr_rule": "linear"},
        {"lr_rule": "fixed"},
        {"lr_rule": "malladi"},
        {"lr_rule": "surge", "lr_rule_noise_scale": 48.0},
        {"lr_rule": "sqrt", "hparam_rules.adam": "sde"},
        {"lr": 3e-4},
        {"hparam_rules.clip": "sqrt"},
    ],
)
def test_every_batch_dependent_value_at_a_scheduled_batch_is_the_resolved_one(changes):
    """At each batch of a schedule the run trains with what ``resolve`` derives for a fixed
    run of that batch: LR, betas, eps, clip range and warm-up (one derivation)."""
    spec = config_lib.resolve(_warmup(**changes), 1)
    for prompts in spec.batch_schedule.buckets:  # 2, 4, 8, 16 (x G = 8)
        alone = config_lib.resolve(_config(prompts=prompts, **changes), 1)
        at = spec.hparams_at(prompts * 8)
        assert spec.optimizer_at(prompts * 8) == alone.optimizer == at.adam
        assert (at.clip.clip_low, at.clip.clip_high) == (alone.clip_low, alone.clip_high)
        assert spec.clip_at(prompts * 8) == (alone.clip_low, alone.clip_high)
        assert at.warmup_updates == alone.lr_warmup_updates == 0
        assert at.lr_arithmetic == alone.lr_arithmetic


# --------------------------------------------------------------------------- tiny runs

# P0 = 2 -> P = 8, G = 4, over 64 responses: stage floor(r / 32); the clip range follows
# the batch (sqrt rule).
WARMUP = {
    "prompts": 8,
    "batch_schedule.kind": "warmup",
    "batch_schedule.start_prompts": 2,
    "batch_schedule.responses": 64,
    "hparam_rules.clip": "sqrt",
}


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


@pytest.fixture(scope="module")
def warmup_run(work_dir, tmp_path_factory):
    """An uninterrupted warmup run to 128 responses, and its update program's cache size."""
    run_dir = str(tmp_path_factory.mktemp("warmup") / "full")
    programs_lib.keep(1)  # (to look at the compiled update afterwards)
    try:
        run_lib.run(
            tiny_run_config(work_dir, run_dir, budget_responses=128, **WARMUP), progress=False
        )
        (programs,) = programs_lib._kept.values()
        update_programs = flops.jit_cache_size(programs.algo.update_fn)
    finally:
        programs_lib.keep(0)
    return run_dir, update_programs


@pytest.mark.slow  # 51 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_warmup_run_follows_the_schedule_with_the_lr_rule_at_each_batch(warmup_run):
    run_dir, _ = warmup_run
    updates = artifacts.read_metrics(run_dir, "update")
    # By hand: 8 responses per update at P=2 until 32, 16 at P=4 until 64, then 32 at P=8.
    assert [u["prompts"] for u in updates] == [2, 2, 2, 2, 4, 4, 8, 8]
    assert [u["batch_responses"] for u in updates] == [8, 8, 8, 8, 16, 16, 32, 32]
    assert [u["responses_cum"] for u in updates] == [8, 16, 24, 32, 48, 64, 96, 128]
    # sqrt rule from lr_ref 1e-3 at batch_ref 16.
    for u in updates:
        assert u["lr"] == pytest.approx(1e-3 * math.sqrt(u["batch_responses"] / 16), rel=1e-6)
    assert len(updates) == 8  # one optimizer update per rollout batch
    # The clip range each update trained with: 0.2 / 0.28 x sqrt(B / 16) at B = 8, 16, 32:
    # sqrt(1/2) = 0.707107 -> 0.141421 / 0.197990; 1 -> 0.2 / 0.28; sqrt(2) = 1.414214 ->
    # 0.282843 / 0.395980 (float32 in the metrics).
    want = {8: (0.1414214, 0.1979899), 16: (0.2, 0.28), 32: (0.2828427, 0.3959798)}
    for u in updates:
        low, high = want[u["batch_responses"]]
        assert u["clip_low"] == pytest.approx(low, rel=1e-6)
        assert u["clip_high"] == pytest.approx(high, rel=1e-6)


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_surge_with_a_schedule_runs_with_its_lr_at_each_batch(work_dir, tmp_path):
    # B_noise = 16 = B_ref: f(16) = 2, f(8) = sqrt(2) + sqrt(1/2) = 2.12132; lr_ref 1e-3.
    config = tiny_run_config(
        work_dir, str(tmp_path / "surge"), budget_responses=48, lr_rule="surge",
        lr_rule_noise_scale=16.0, **WARMUP,
    )  # fmt: skip
    run_lib.run(config, progress=False)
    updates = artifacts.read_metrics(str(tmp_path / "surge"), "update")
    assert [u["batch_responses"] for u in updates] == [8, 8, 8, 8, 16]
    want = {8: 1e-3 * 2 / 2.1213203, 16: 1e-3}
    for u in updates:
        assert u["lr"] == pytest.approx(want[u["batch_responses"]], rel=1e-6)


def test_a_schedule_compiles_each_batch_shape_once_before_training(warmup_run):
    run_dir, update_programs = warmup_run
    # P = 2, 4, 8: one update program each, never per step (nor per clip range: three)
    assert update_programs == 3
    compilations = {u["compilations"] for u in artifacts.read_metrics(run_dir, "update")}
    assert len(compilations) == 1  # nothing compiled during training


@pytest.mark.slow  # 14 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_warmup_resumed_mid_schedule_matches_the_uninterrupted_run(warmup_run, work_dir, tmp_path):
    full_dir, _ = warmup_run
    split_dir = str(tmp_path / "split")
    # Stop at 24 responses (P = 2, three updates before the first doubling), then resume.
    first = run_lib.run(
        tiny_run_config(work_dir, split_dir, budget_responses=24, **WARMUP), progress=False
    )
    assert first["responses_cum"] == 24
    resumed = tiny_run_config(work_dir, split_dir, budget_responses=128, **WARMUP)
    run_lib.run(resumed, progress=False)
    full = deterministic(artifacts.read_metrics(full_dir), "update")
    split = deterministic(artifacts.read_metrics(split_dir), "update")
    assert len(full) == 8
    assert_same_records(full, split, rel=1e-5, abs=1e-7)


# Adaptive: P0 = 2 -> P = 8 at G = 8, B_noise pooled over >= 2 updates from 2 whole-group
# micro-batches; a calibration whose step time is the same at every batch (q doubles
# with B: doubling pays once the lower bound on B_noise is > 0).
# A random model's responses rarely solve the task (zero advantages, zero gradients):
# they are rewarded by their length, which varies, so the noise scale is measurable.
ADAPTIVE = {
    "prompts": 8,
    "group_size": 8,
    "batch_schedule.kind": "adaptive",
    "batch_schedule.start_prompts": 2,
    "batch_schedule.window": 2,
    "grpo.micro_batches": 2,
    "grpo.micro_layout": "groups",
}


@pytest.fixture(scope="module")
def adaptive_config(work_dir, tmp_path_factory):
    """``adaptive_config(run_dir, budget)``: a tiny adaptive run config."""
    reward = tmp_path_factory.mktemp("reward") / "length_reward.py"
    reward.write_text(
        "def length(prompt, response, answer, meta):\n    return float(len(response))\n"
    )

    calibration = tmp_path_factory.mktemp("calibration") / "calibration.json"
    configs = {
        f"{p}x8:{rule}": {"batch": 8 * p, "step_s_median": 0.5}
        for p in (2, 4, 8)
        for rule in ("sqrt", "surge")
    }
    calibration.write_text(json.dumps({"configs": configs}))

    def make(run_dir, budget, **extra):
        return tiny_run_config(
            work_dir,
            run_dir,
            budget_responses=budget,
            **{
                **ADAPTIVE,
                "task.reward_fn": f"{reward}:length",
                "batch_schedule.calibration": str(calibration),
                **extra,
            },
        )

    return make


@pytest.mark.slow  # 49 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_adaptive_run_grows_p_by_the_pooled_noise_scale_and_resumes_exactly(
    adaptive_config, tmp_path
):
    full_dir, split_dir = str(tmp_path / "full"), str(tmp_path / "split")
    run_lib.run(adaptive_config(full_dir, 160), progress=False)
    updates = artifacts.read_metrics(full_dir, "update")
    schedule = config_lib.resolve(adaptive_config(full_dir, 160)).batch_schedule
    # Each update's P is the schedule's function of the lines before it ...
    for i, u in enumerate(updates):
        expected = bs.prompts_at(schedule, u["responses_cum"], bs.noise_history(updates[:i]))
        assert u["prompts"] == expected, i
        assert u["batch_responses"] == 8 * u["prompts"]
        assert u["lr"] == pytest.approx(1e-3 * math.sqrt(8 * u["prompts"] / 16), rel=1e-6)
    # ... and it grew: every update measured the noise, and P took more than one value.
    assert len(bs.noise_history(updates)) == len(updates)
    prompts = [u["prompts"] for u in updates]
    assert prompts == sorted(prompts) and prompts[0] == 2 and prompts[-1] > 2
    # Stopped with a full window at P0 (its doubling decided by the saved lines), resumed.
    run_lib.run(adaptive_config(split_dir, 32), progress=False)
    run_lib.run(adaptive_config(split_dir, 160), progress=False)
    full = deterministic(updates)
    split = deterministic(artifacts.read_metrics(split_dir, "update"))
    assert_same_records(full, split, rel=1e-5, abs=1e-7)


@pytest.mark.slow  # 13 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_surge_with_a_warmup_and_the_adaptive_schedule_runs(adaptive_config, tmp_path):
    # surge at B_noise = 50 from lr_ref = 1e-3 at B_ref = 16: lr(B) = 1e-3 f(16) / f(B),
    # f(x) = sqrt(50 / x) + sqrt(x / 50); the warm-up of 4 updates at B_ref by responses:
    # W(B) = round(4 x 16 / B) = 4, 2, 1 at B = 16, 32, 64; update i at factor
    # min(1, (i + 1) / W(B)).
    run_dir = str(tmp_path / "surge")
    extra = {
        "lr_rule": "surge",
        "lr_rule_noise_scale": 50.0,
        "lr_warmup_updates": 4,
        "hparam_rules.warmup": "responses",
    }
    run_lib.run(adaptive_config(run_dir, 128, **extra), progress=False)
    updates = artifacts.read_metrics(run_dir, "update")

    def f(x):
        return math.sqrt(50 / x) + math.sqrt(x / 50)

    assert len(updates) >= 4
    for i, u in enumerate(updates):
        b = 8 * u["prompts"]
        warmup = round(4 * 16 / b)
        want = 1e-3 * f(16) / f(b) * min(1.0, (i + 1) / warmup)
        assert u["lr"] == pytest.approx(want, rel=1e-5), (i, b)
