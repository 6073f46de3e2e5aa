"""Calibrated throughput: interleaved step timing, and the analysis that uses it."""

import json
import os

import analysis_fixtures as fx
import numpy as np
import pytest
from run_fixtures import tiny_run_config

from experiments.configs import base
from rl_batch import artifacts
from rl_batch.analysis import curves
from rl_batch.analysis import time_to_target as ttt
from rl_batch.runs import config as config_lib
from rl_batch.sweeps import calibrate, sweep


def test_rounds_interleave_and_rotate(monkeypatch):
    calls = []

    class FakeStepper:
        def __init__(self, spec, generate_only=False):
            self.key = spec.inputs.name

        def step(self):
            calls.append(self.key)
            step_s = {"a": 1.0, "b": 2.0, "c": 4.0}[self.key]
            return calibrate.StepTime(step_s, step_s / 4, int(100 * step_s))

        def close(self):
            pass

    monkeypatch.setattr(calibrate, "_Stepper", FakeStepper)
    configs = {
        k: config_lib.resolve(tiny_run_config("/unused", "/unused", name=k, prompts=p), 1)
        for k, p in (("a", 2), ("b", 4), ("c", 8))
    }
    record = calibrate.calibrate(configs, rounds=3, steps=2, log_fn=lambda s: None)
    warm, timed = calls[:3], calls[3:]
    assert warm == ["a", "b", "c"]  # one untimed (compiling) step each
    # In turn, one step each (B = 8, 16, 32: none below half the median, 2 steps each).
    assert timed == ["a", "b", "c"] * 2 + ["b", "c", "a"] * 2 + ["c", "a", "b"] * 2
    assert record["configs"]["b"]["steps_s"] == [[2.0, 2.0]] * 3
    calls.clear()
    record = calibrate.calibrate(configs, rounds=3, steps=2, log_fn=lambda s: None,
                                  interleave="visit")  # fmt: skip
    # The earlier scheme: each configuration's steps in a row.
    assert calls[3:] == (
        ["a"] * 2 + ["b"] * 2 + ["c"] * 2 + ["b"] * 2 + ["c"] * 2 + ["a"] * 2
        + ["c"] * 2 + ["a"] * 2 + ["b"] * 2
    )  # fmt: skip
    assert record["configs"]["b"]["step_s"] == [2.0, 2.0, 2.0]
    assert record["configs"]["c"]["step_s_median"] == 4.0
    assert record["configs"]["a"]["batch"] == 2 * 4
    # Generation: a quarter of each step, 100 tokens per step-second: 400 tokens/s.
    assert record["configs"]["c"]["generate_s"] == [1.0, 1.0, 1.0]
    assert record["configs"]["c"]["gen_tokens_per_s"] == [400.0, 400.0, 400.0]
    assert record["configs"]["b"]["gen_concurrency"] == 4 * 4


def test_a_small_batch_takes_more_steps_spread_over_the_round():
    # Median batch 48, half 24: B = 8 takes ceil(24 / 8) = 3x the steps, B = 16 2x.
    batches = {"1x8": 8, "2x8": 16, "4x8": 32, "8x8": 64, "16x8": 128, "32x8": 256}
    assert calibrate.visit_steps(batches, 2) == {
        "1x8": 6, "2x8": 4, "4x8": 2, "8x8": 2, "16x8": 2, "32x8": 2
    }  # fmt: skip
    assert calibrate.visit_steps({"a": 8, "b": 8}, 3) == {"a": 3, "b": 3}
    # Six passes in the order a, b, c: b steps in each, a's 2 steps and c's 3 spread
    # over them (passes 3, 6 and 2, 4, 6), not bunched at the start.
    order = calibrate.round_order(["a", "b", "c"], {"a": 2, "b": 6, "c": 3})
    passes = [["b"], ["b", "c"], ["a", "b"], ["b", "c"], ["b"], ["a", "b", "c"]]
    assert order == [k for p in passes for k in p]


def test_an_unknown_interleave_is_refused():
    with pytest.raises(ValueError, match="interleave='rows'"):
        calibrate.calibrate({}, rounds=1, steps=1, interleave="rows")


def test_the_calibration_records_which_engine_it_timed(monkeypatch):
    class FakeStepper:
        def __init__(self, spec, generate_only=False):
            pass

        def step(self):
            return calibrate.StepTime(1.0, 0.5, 10)

        def close(self):
            pass

    monkeypatch.setattr(calibrate, "_Stepper", FakeStepper)
    continuous = {"sampling.engine": "continuous", "sampling.slots": 4, "sampling.attn_block": 8}
    configs = {
        "a": config_lib.resolve(tiny_run_config("/unused", "/unused", name="a"), 1),
        "b": config_lib.resolve(tiny_run_config("/unused", "/unused", name="b", **continuous), 1),
    }
    record = calibrate.calibrate(configs, rounds=1, steps=1, gen_probe=(32,), log_fn=print)
    a, b = record["configs"]["a"], record["configs"]["b"]
    assert (a["engine"], a["slots"], a["attn_block"]) == ("static", 0, 0)
    assert (b["engine"], b["slots"], b["attn_block"]) == ("continuous", 4, 8)
    assert record["gen_probe"]["32"]["engine"] == "static"  # (the first configuration's)
    lines = calibrate.describe(record).splitlines()
    assert lines[0].endswith("engine static") and lines[1].endswith(
        "engine continuous 4 slots blk8"
    )
    assert lines[2].endswith("engine static")
    # A record written before the engine was recorded reads as the static engine.
    assert calibrate.engine_label({}) == "static"


def test_generation_probes_join_the_rotation(monkeypatch):
    calls = []

    class FakeStepper:
        def __init__(self, spec, generate_only=False):
            self.spec, self.generate_only = spec, generate_only
            self.key = f"gen{spec.batch}" if generate_only else spec.inputs.name

        def step(self):
            calls.append(self.key)
            seqs = self.spec.batch
            return calibrate.StepTime(1.0, 0.5, 10 * seqs)  # 20 tokens/s per sequence

        def close(self):
            pass

    monkeypatch.setattr(calibrate, "_Stepper", FakeStepper)
    configs = {
        "a": config_lib.resolve(
            tiny_run_config("/unused", "/unused", name="a", prompts=2, group_size=4), 1
        )
    }
    record = calibrate.calibrate(configs, rounds=2, steps=1, gen_probe=(16, 32), log_fn=print)
    assert calls == ["a", "gen16", "gen32"] + ["a", "gen16", "gen32"] + ["gen16", "gen32", "a"]
    probe = record["gen_probe"]
    assert set(probe) == {"16", "32"} and set(record["configs"]) == {"a"}
    assert probe["32"]["gen_concurrency"] == 32
    assert probe["32"]["gen_tokens_per_s"] == [640.0, 640.0]
    by_c = artifacts.calibration_generation(record)
    assert sorted(by_c) == [8.0, 16.0, 32.0] and by_c[16.0] == [320.0, 320.0]
    with pytest.raises(ValueError, match="not a multiple of the group size 4"):
        calibrate.calibrate(configs, rounds=1, steps=1, gen_probe=(18,), log_fn=print)


def test_configurations_of_equal_compute_are_timed_once(monkeypatch):
    calls, built = [], []

    class FakeStepper:
        def __init__(self, spec, generate_only=False):
            self.key = f"gen{spec.batch}" if generate_only else spec.inputs.name
            built.append(self.key)

        def step(self):
            calls.append(self.key)
            return calibrate.StepTime(1.0 + len(calls) / 100, 0.5, 100)

        def close(self):
            pass

    monkeypatch.setattr(calibrate, "_Stepper", FakeStepper)

    def spec(name, prompts, rule, **changes):
        c = tiny_run_config("/unused", "/unused", name=name, prompts=prompts, lr_rule=rule)
        c.batch_ref = 8  # (B = 16 and 32: two LR rules give two LRs)
        for k, v in changes.items():
            c[k] = v
        return config_lib.resolve(c, 1)

    configs = {
        "4x4:sqrt": spec("sqrt4", 4, "sqrt"),
        "4x4:fixed": spec("fixed4", 4, "fixed", seed=3),
        "8x4:sqrt": spec("sqrt8", 8, "sqrt"),
    }
    key = calibrate.compute_key
    assert key(configs["4x4:sqrt"]) == key(configs["4x4:fixed"])
    assert key(configs["4x4:sqrt"]) != key(configs["8x4:sqrt"])
    assert configs["4x4:sqrt"].optimizer.lr != configs["4x4:fixed"].optimizer.lr
    other_work = spec("sqrt4", 4, "sqrt", max_new_tokens=8)  # (a config that is not an LR)
    assert key(other_work) != key(configs["4x4:sqrt"])
    record = calibrate.calibrate(configs, rounds=2, steps=2, gen_probe=(16,), log_fn=print)
    # The fixed rule's steps are the sqrt rule's: it is never built nor stepped.
    assert built == ["sqrt4", "sqrt8", "gen16"] and "fixed4" not in calls
    # 2 steps a visit for each configuration, 1 call for the probe (PROBE_STEPS).
    assert calls[3:].count("sqrt4") == 4 and calls[3:].count("gen16") == 2
    sqrt4, fixed4 = record["configs"]["4x4:sqrt"], record["configs"]["4x4:fixed"]
    assert fixed4["timed_as"] == "4x4:sqrt" and "timed_as" not in sqrt4
    assert fixed4["steps_s"] == sqrt4["steps_s"] and fixed4["run"] == "fixed4"
    assert "timed as 4x4:sqrt" in calibrate.describe(record)


def test_a_bad_generation_probe_is_refused_before_any_run(tmp_path):
    c = base.sweep_config(tiny_run_config(str(tmp_path / "unused")))
    c.sweep.prompts, c.sweep.group_sizes, c.sweep.seeds = "2", "4", "0"
    c.sweep.calibrate_gen_probe = "16,30"
    with pytest.raises(ValueError, match=r"calibrate_gen_probe='16,30': \[30\] not a multiple"):
        sweep.plan(c, str(tmp_path / "sweep"), device_count=1)
    c.sweep.calibrate_gen_probe = "16,x"
    with pytest.raises(ValueError, match="expected comma-separated integers"):
        sweep.plan(c, str(tmp_path / "sweep"), device_count=1)


def test_analysis_takes_t_and_q_from_the_calibration(tmp_path):
    d = fx.write_sweep(str(tmp_path), configs=fx.STANDARD_CONFIGS[:2])
    measured = ttt.analyze_sweep(curves.load_sweep(d))
    steps = {"8x8:sqrt": 0.5, "16x8:sqrt": 0.75}
    artifacts.write_json_atomic(
        os.path.join(d, artifacts.CALIBRATION_FILE),
        {"configs": {k: {"step_s_median": v} for k, v in steps.items()}},
    )
    cal = ttt.analyze_sweep(curves.load_sweep(d))
    assert cal.calibrated and not measured.calibrated
    for name, rt in cal.targets.items():
        before = measured.targets[name]
        step = steps[rt.key.key]
        assert rt.calibrated and rt.n_star == before.n_star
        assert rt.time_to_target_s == pytest.approx(before.updates_to_target * step)
        assert rt.q == pytest.approx(before.n_star / (before.updates_to_target * step))
        assert rt.time_measured_s == before.time_to_target_s and rt.q_measured == before.q
    # Side by side, B = 128 does 128 responses in 0.75 s against 64 in 0.5 s: r_q = 4/3.
    r = cal.ratios[artifacts.Configuration("grpo", 16, 8, "sqrt")]
    assert r.r_q.mean == pytest.approx(4 / 3, rel=0.02)
    assert ttt.analyze_sweep(curves.load_sweep(d), calibrated=False).targets == measured.targets


def test_a_malformed_calibration_names_the_file(tmp_path):
    (tmp_path / artifacts.CALIBRATION_FILE).write_text(json.dumps({"configs": {"8x8:sqrt": 3}}))
    with pytest.raises(ValueError, match="calibration.json: malformed"):
        artifacts.read_calibration(str(tmp_path))


@pytest.mark.slow  # 27 s on a loaded 2-core machine
def test_concurrent_sweep_runs_every_point_and_calibrates(tmp_path):
    """Two points at a time in child processes, with the interleaved calibration's rounds
    before and after them."""
    c = tiny_run_config(str(tmp_path / "work"))
    c.budget_responses = 32
    c = base.sweep_config(c)
    c.sweep.prompts, c.sweep.group_sizes, c.sweep.seeds = "2,4", "4", "0"
    c.sweep.concurrent, c.sweep.calibrate_rounds, c.sweep.calibrate_steps = 2, 4, 1
    c.sweep.calibrate_rounds_before = 2  # (timed from the grid's specs: no run yet)
    c.sweep.calibrate_gen_probe = "32"  # generation alone past the grid's 16
    d = str(tmp_path / "sweep")
    lines = []
    record = sweep.run_sweep(c, d, log=lines.append)
    stages = [s for s in lines if s.startswith("[sweep] calibrating")]
    # The rounds after the runs in the child that timed those before (kept through them).
    assert [s.split(" rounds, ")[-1] for s in stages] == [
        "before the runs)",
        "after the runs, in the process that timed the rounds before them)",
    ], lines
    assert open(os.path.join(d, "calibration.log")).read().count("[calibrate] calibrating") == 1
    assert lines.index(stages[0]) < min(i for i, s in enumerate(lines) if "[sweep 1/2]" in s)
    assert artifacts.read_calibration_blocks(d) == (0, 0, 1, 1)
    assert not os.path.exists(os.path.join(d, "calibration_grid.json"))
    logs = {r["name"]: r["status"] for r in record["runs"]}
    assert set(logs.values()) == {"finished"}, logs
    for r in record["runs"]:
        assert len(artifacts.read_metrics(os.path.join(d, "runs", r["name"]), "update")) >= 1
    cal = artifacts.read_calibration(d)
    assert cal is not None and set(cal) == {"2x4:sqrt", "4x4:sqrt"}, open(
        os.path.join(d, "calibration.log")
    ).read()[-2000:]
    assert all(v > 0 for v in cal.values())
    record = artifacts.read_json(os.path.join(d, artifacts.CALIBRATION_FILE))
    raw = record["configs"]
    assert [raw[k]["gen_concurrency"] for k in ("2x4:sqrt", "4x4:sqrt")] == [8, 16]
    assert record["gen_probe"]["32"]["gen_concurrency"] == 32
    assert record["gen_probe"]["32"]["gen_tokens_per_s"][0] > 0
    for entry in raw.values():  # generation is a timed part of the step
        assert 0 < entry["generate_s"][0] < entry["step_s"][0]
        assert entry["gen_tokens_per_s"][0] > 0


def _fake_calibrate(calls):
    """Stands in for `calibrate.calibrate`: the n-th calibration times every step at n/2 s."""

    def block(configs, rounds, steps):
        calls.append(sorted(configs))
        step = 0.5 * len(calls)
        return {
            "version": artifacts.CALIBRATION_VERSION,
            "rounds": rounds,
            "steps": steps,
            "written_at": f"time {len(calls)}",
            "wall_s": 1.0,
            "configs": {k: {"step_s": [step] * rounds, "step_s_median": step} for k in configs},
        }

    def fake(configs, *, rounds, steps, gen_probe=(), log_fn=print, then=None):
        record = block(configs, rounds, steps)
        more = then(record) if then is not None else 0
        return calibrate.append_block(record, block(configs, more, steps)) if more else record

    return fake


def _calibrate_in_process(sweep_dir, s, stage, grid):
    """Stands in for `sweep._calibration_child` (the sweep runs a child process)."""
    calibrate.calibrate_sweep(sweep_dir, rounds=s.rounds, steps=s.steps, gen_probe=s.probe,
                              before=s.before, stage=stage, grid=grid)  # fmt: skip
    return 0


def _add_top_level_keys(sweep_dir):
    """The synthetic runs' config.json with the top-level fields a resolved config has."""
    for name in os.listdir(os.path.join(sweep_dir, artifacts.RUNS_DIR)):
        path = os.path.join(sweep_dir, artifacts.RUNS_DIR, name, artifacts.CONFIG_FILE)
        c = artifacts.read_json(path)
        c.update(prompts=c["batch"]["prompts"], group_size=c["batch"]["group_size"])
        artifacts.write_json_atomic(path, {**c, "lr_rule": c["optim"]["lr_rule"]})


def _faked_sweep(tmp_path, monkeypatch, calls):
    """A synthetic two-configuration sweep whose calibrations `_fake_calibrate` times."""
    monkeypatch.setattr(calibrate, "calibrate", _fake_calibrate(calls))
    # (the synthetic runs' config.json is not a whole run config: the fake reads keys only)
    monkeypatch.setattr(
        calibrate, "sweep_configs", lambda d, grid=None: artifacts.sweep_run_configs(d)
    )
    d = fx.write_sweep(str(tmp_path / "s"), configs=fx.STANDARD_CONFIGS[:2])
    _add_top_level_keys(d)
    return d


def test_a_calibration_is_kept_until_a_configuration_is_new(tmp_path, monkeypatch):
    from rl_batch.analysis import measurement

    calls = []
    d = _faked_sweep(tmp_path, monkeypatch, calls)
    first = calibrate.calibrate_sweep(d, rounds=2, steps=1, log_fn=lambda s: None)
    t_first = ttt.analyze_sweep(curves.load_sweep(d), n_boot=20).targets

    # A rerun with the same configurations keeps it: T does not change.
    assert artifacts.calibration_stale(d, 2, 1) == []
    again = calibrate.calibrate_sweep(d, rounds=2, steps=1, log_fn=lambda s: None)
    assert len(calls) == 1 and again == first
    assert ttt.analyze_sweep(curves.load_sweep(d), n_boot=20).targets == t_first
    assert not os.path.exists(os.path.join(d, artifacts.CALIBRATIONS_DIR))

    # Other settings, or a new configuration, calibrate again; the old one is kept.
    assert artifacts.calibration_stale(d, 3, 1) == ["rounds 2 -> 3"]
    fx.add_seed(d, prompts=32, group_size=8, seed=0, tau=fx.TAU0, budget=fx.BUDGET)
    _add_top_level_keys(d)
    assert artifacts.calibration_stale(d, 2, 1) == ["configurations not calibrated yet: 32x8:sqrt"]
    calibrate.calibrate_sweep(d, rounds=2, steps=1, log_fn=lambda s: None)
    assert calls[-1] == ["16x8:sqrt", "32x8:sqrt", "8x8:sqrt"]
    kept = os.path.join(d, artifacts.CALIBRATIONS_DIR, "calibration-1.json")
    assert artifacts.read_json(kept) == first
    # The report says which calibration its T and q come from.
    text = "\n".join(measurement.measurement_section(ttt.analyze_sweep(curves.load_sweep(d))))
    assert (
        "Calibration used: `calibration.json` (written time 2; 2 rounds of 1 steps; "
        "3 configurations; 1 earlier calibration(s) kept in `calibrations/`)."
    ) in text


def test_a_rerun_sweep_keeps_its_calibration(tmp_path, monkeypatch):
    from tests.test_collect_reference import _sweep_config, _synthetic_run

    calls = []
    monkeypatch.setattr(calibrate, "calibrate", _fake_calibrate(calls))

    monkeypatch.setattr(sweep, "_calibration_child", _calibrate_in_process)
    c = _sweep_config(str(tmp_path / "work"))
    c.sweep.calibrate_rounds, c.sweep.calibrate_steps = 2, 1
    d, lines = str(tmp_path / "sweep"), []
    for _ in range(2):
        sweep.run_sweep(c, d, run_fn=_synthetic_run, log=lines.append)
    assert len(calls) == 1, lines
    assert "[sweep] calibration.json kept: it times every configuration" in lines
    assert artifacts.read_json(os.path.join(d, artifacts.CALIBRATION_FILE))["written_at"] == (
        "time 1"
    )


def test_blocks_before_and_after_the_runs_make_one_calibration(tmp_path, monkeypatch):
    from tests.test_collect_reference import _sweep_config, _synthetic_run

    calls, runs_then = [], []
    fake = _fake_calibrate(calls)

    def calibrate_counting(configs, **kw):  # the runs finished when each block was timed
        runs_then.append(len(artifacts.sweep_run_configs(d)))
        return fake(configs, **kw)

    monkeypatch.setattr(calibrate, "calibrate", calibrate_counting)

    monkeypatch.setattr(sweep, "_calibration_child", _calibrate_in_process)
    c = _sweep_config(str(tmp_path / "work"))
    c.sweep.calibrate_rounds, c.sweep.calibrate_steps, c.sweep.calibrate_rounds_before = 4, 1, 2
    d, lines = str(tmp_path / "sweep"), []
    sweep.run_sweep(c, d, run_fn=_synthetic_run, log=lines.append)
    # Two rounds before any run (from the grid's specs), two after every run.
    assert runs_then == [0, 3] and calls == [["16x4:sqrt", "4x4:sqrt", "8x4:sqrt"]] * 2
    record = artifacts.read_json(os.path.join(d, artifacts.CALIBRATION_FILE))
    assert record["rounds"] == 4 and record["round_blocks"] == [0, 0, 1, 1]
    assert record["configs"]["8x4:sqrt"]["step_s"] == [0.5, 0.5, 1.0, 1.0]
    assert record["configs"]["8x4:sqrt"]["step_s_median"] == 0.75
    assert [b["written_at"] for b in record["blocks"]] == ["time 1", "time 2"]
    assert artifacts.read_calibration_blocks(d) == (0, 0, 1, 1)
    assert not os.path.exists(os.path.join(d, artifacts.CALIBRATIONS_DIR))  # joined, not replaced
    assert "in blocks of 2 + 2 rounds" in artifacts.calibration_note(d)
    # A rerun keeps it; other rounds per block redo it, starting before the runs.
    lines.clear()
    sweep.run_sweep(c, d, run_fn=_synthetic_run, log=lines.append)
    assert (
        len(calls) == 2
        and lines.count("[sweep] calibration.json kept: it times every configuration") == 2
    )
    assert artifacts.calibration_stale(d, 4, 1, (), 0) == ["rounds per block [2, 2] -> [4]"]
    assert artifacts.calibration_action(d, 6, 1, (), 3)[0] == "redo"
    # A block before the runs alone (a sweep stopped during its runs): the rounds after
    # them join it.
    first = {**fake(calls[0], rounds=2, steps=1), "round_blocks": [0, 0]}
    artifacts.write_json_atomic(os.path.join(d, artifacts.CALIBRATION_FILE), first)
    assert artifacts.calibration_action(d, 4, 1, (), 2)[0] == "append"
    assert artifacts.calibration_action(d, 4, 1, (), 2, ("2x4:sqrt",))[0] == "redo"  # new
    assert artifacts.calibration_action(d, 4, 2, (), 2)[0] == "redo"  # other steps


def test_a_held_calibration_times_its_rounds_after_the_runs_in_one_process(tmp_path, monkeypatch):
    calls = []
    d = _faked_sweep(tmp_path, monkeypatch, calls)
    on_disk = []

    def hold(go):  # the runs: the block before them is on disk while they train
        def wait():
            on_disk.append(artifacts.read_json(os.path.join(d, artifacts.CALIBRATION_FILE)))
            return go

        return wait

    kw = dict(rounds=4, steps=1, before=2, stage="before", log_fn=lambda s: None)
    record = calibrate.calibrate_sweep(d, hold=hold(True), **kw)
    assert on_disk[0]["rounds"] == 2 and len(calls) == 2
    assert record["round_blocks"] == [0, 0, 1, 1] and record == artifacts.read_json(
        os.path.join(d, artifacts.CALIBRATION_FILE)
    )
    assert artifacts.calibration_action(d, 4, 1, (), 2)[0] == "keep"
    # Not released to time them (the runs stopped): the block before stays for a rerun.
    os.remove(os.path.join(d, artifacts.CALIBRATION_FILE))
    record = calibrate.calibrate_sweep(d, hold=hold(False), **kw)
    assert record["rounds"] == 2 and len(calls) == 3
    assert artifacts.calibration_action(d, 4, 1, (), 2)[0] == "append"


def test_appending_a_block_joins_every_per_round_list():
    def record(step, rounds, when):
        entry = {"step_s": [step] * rounds, "steps_s": [[step]] * rounds,
                 "generate_s": [step / 2] * rounds, "gen_tokens_per_s": [1.0] * rounds,
                 "prompts_step_s": {"4": [step] * rounds}, "batch": 8}  # fmt: skip
        return {"rounds": rounds, "wall_s": 2.0, "written_at": when, "load_start": [when],
                "load_end": [when], "configs": {"a": entry},
                "gen_probe": {"64": {"generate_s": [step] * rounds,
                                     "gen_tokens_per_s": [9.0] * rounds}}}  # fmt: skip

    joined = calibrate.append_block(record(1.0, 2, "t1"), record(3.0, 1, "t2"))
    a = joined["configs"]["a"]
    assert a["step_s"] == [1.0, 1.0, 3.0] and a["step_s_median"] == 1.0
    assert a["steps_s"] == [[1.0], [1.0], [3.0]] and a["generate_s"] == [0.5, 0.5, 1.5]
    assert a["prompts_step_s"] == {"4": [1.0, 1.0, 3.0]}
    assert joined["gen_probe"]["64"]["generate_s"] == [1.0, 1.0, 3.0]
    assert joined["rounds"] == 3 and joined["round_blocks"] == [0, 0, 1]
    assert joined["wall_s"] == 4.0 and joined["load_start"] == ["t1"]
    assert joined["written_at"] == "t2" and joined["load_end"] == ["t2"]
    assert [(b["rounds"], b["written_at"]) for b in joined["blocks"]] == [(2, "t1"), (1, "t2")]
    other = record(3.0, 1, "t2")
    other["configs"] = {"b": other["configs"]["a"]}
    with pytest.raises(ValueError, match="different configurations"):
        calibrate.append_block(record(1.0, 2, "t1"), other)


def test_bad_rounds_before_the_runs_are_refused_before_any_run(tmp_path):
    c = base.sweep_config(tiny_run_config(str(tmp_path / "work")))
    c.sweep.calibrate_rounds, c.sweep.calibrate_rounds_before = 4, 3
    with pytest.raises(ValueError, match="sweep.calibrate_rounds_before=3: 3 of 4 calibration"):
        sweep.plan(c, str(tmp_path / "sweep"), device_count=1)
    # The same rule where a calibration is asked for directly (experiments.calibrate).
    with pytest.raises(ValueError, match="3 of 4 calibration rounds before the runs: each block"):
        calibrate.calibrate_sweep(str(tmp_path), rounds=4, steps=1, before=3, stage="before")
    c.sweep.calibrate_rounds = 0  # (no calibration: nothing to split)
    sweep.plan(c, str(tmp_path / "sweep"), device_count=1)


def test_drift_between_blocks_widens_t_intervals(tmp_path):
    d = fx.write_sweep(str(tmp_path), configs=fx.STANDARD_CONFIGS[:3])
    keys = ["8x8:sqrt", "16x8:sqrt", "32x8:sqrt"]
    # 16 x 8 is 10 % slower relative to the others after the runs than before them.
    rounds = {k: [0.5, 0.51, 0.5, 0.49] for k in keys}
    rounds["16x8:sqrt"] = [0.75, 0.76, 0.83, 0.82]
    path = os.path.join(d, artifacts.CALIBRATION_FILE)

    def ratio_with(blocks):
        configs = {
            k: {"step_s": v, "step_s_median": float(np.median(v))} for k, v in rounds.items()
        }
        artifacts.write_json_atomic(path, {"configs": configs, **blocks})
        a = ttt.analyze_sweep(curves.load_sweep(d))
        return a, a.ratios[artifacts.Configuration("grpo", 16, 8, "sqrt")].r_t

    one, r_one = ratio_with({})
    two, r_two = ratio_with({"round_blocks": [0, 0, 1, 1]})
    assert one.step_rounds.drift is None and two.step_rounds.drift[0] > 0
    assert r_two.mean == r_one.mean
    assert np.log(r_two.hi / r_two.lo) > 1.2 * np.log(r_one.hi / r_one.lo)
