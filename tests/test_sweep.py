"""Sweep harness: grid expansion, validation before start, failures, skipping, resuming."""

import json
import os
import subprocess
import sys

import pytest
from ml_collections import ConfigDict

from experiments.configs import base
from rl_batch import artifacts
from rl_batch.runs import config as config_lib
from rl_batch.sweeps import processes, sweep
from tests.run_fixtures import tiny_run_config


def _sweep_config(work_dir="/tmp/unused", **sweep_fields):
    c = base.sweep_config(tiny_run_config(work_dir))
    for key, value in sweep_fields.items():
        c.sweep[key] = value
    return c


def test_grid_expands_products_extra_points_and_seeds():
    c = _sweep_config(prompts="4,8", group_sizes="4", lr_rules="sqrt,fixed", seeds="0,1")
    c.sweep.extra_points = "2x8:sqrt,4x4:sqrt"  # the second is already in the product
    points = sweep.expand_grid(c)
    keys = [p.key for p in points]
    assert keys == [
        "2x8:sqrt", "2x8:sqrt",
        "4x4:sqrt", "4x4:sqrt", "4x4:fixed", "4x4:fixed",
        "8x4:sqrt", "8x4:sqrt", "8x4:fixed", "8x4:fixed",
    ]  # fmt: skip
    assert [p.seed for p in points[:2]] == [0, 1]
    assert points[2].name == "p4_g4_sqrt_s0"


def test_each_point_gets_its_lr_from_the_rule(tmp_path):
    c = _sweep_config(prompts="4,16", group_sizes="4", lr_rules="sqrt,fixed")
    _, resolved = sweep.plan(c, str(tmp_path))
    # lr_ref 1e-3 at B_ref = 16: B = 64 is 4x, so sqrt gives 2e-3 and fixed keeps 1e-3.
    assert resolved["p16_g4_sqrt_s0"].optimizer.lr == pytest.approx(2e-3)
    assert resolved["p16_g4_fixed_s0"].optimizer.lr == pytest.approx(1e-3)
    assert resolved["p4_g4_sqrt_s0"].optimizer.lr == pytest.approx(1e-3)
    assert all(r.inputs.lr is None for r in resolved.values())  # the input: unset


def test_a_fixed_base_lr_is_rejected_and_the_fixed_rule_is_the_fix(tmp_path):
    c = _sweep_config(prompts="4,16", group_sizes="4")
    c.lr = 3e-4
    started = []
    with pytest.raises(ValueError) as e:
        sweep.run_sweep(c, str(tmp_path), run_fn=started.append, log=lambda s: None)
    message = str(e.value)
    assert message.startswith("lr=0.0003: a sweep sets lr at each point from its rule")
    assert "--config.sweep.lr_rules=fixed --config.lr_ref=0.0003" in message
    assert not started and not os.path.exists(tmp_path / artifacts.SWEEP_FILE)
    # The suggested fix trains every point at that learning rate.
    c.lr, c.sweep.lr_rules, c.lr_ref = None, "fixed", 3e-4
    _, resolved = sweep.plan(c, str(tmp_path))
    assert [r.optimizer.lr for r in resolved.values()] == pytest.approx([3e-4, 3e-4])


def test_a_planned_point_resolves_to_itself_in_the_run(tmp_path):
    # A point's spec, through its JSON (what a worker reads), is the planned spec, and
    # resolving its inputs anew gives it again: PPO's malladi critic must not rescale.
    c = _sweep_config(prompts="8,32", group_sizes="1", lr_rules="malladi")
    c.algo = "ppo"
    _, resolved = sweep.plan(c, str(tmp_path))
    for name, point in resolved.items():
        as_json = json.loads(json.dumps(point.to_json()))
        assert config_lib.load_spec(as_json) == point, name
        assert config_lib.resolve(ConfigDict(as_json)).to_json() == point.to_json(), name
    critic = resolved["p32_g1_malladi_s0"].critic_rule  # k = 32 / 16 = 2
    assert (critic.b1, critic.b2) == pytest.approx((0.8, 0.998))


def test_invalid_grid_fails_before_anything_starts(tmp_path):
    c = _sweep_config(prompts="4", group_sizes="1,4", lr_rules="sqrt,bogus")
    started = []
    with pytest.raises(ValueError) as e:
        sweep.run_sweep(c, str(tmp_path), run_fn=started.append, log=lambda s: None)
    message = str(e.value)
    assert "p4_g1_sqrt_s0" in message and "GRPO needs >= 2" in message
    assert "bogus" in message
    assert not started and not os.path.exists(tmp_path / artifacts.SWEEP_FILE)


def _fake_run(fail=()):
    calls = []

    def run_fn(spec):
        config = spec.inputs
        calls.append(config.name)
        if config.name in fail:
            raise RuntimeError("boom")
        artifacts.write_json_atomic(
            os.path.join(config.run_dir, artifacts.SUMMARY_FILE), {"status": "finished"}
        )
        return {"status": "finished"}

    return run_fn, calls


def test_failed_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    c = _sweep_config(prompts="2,4,8", group_sizes="4")
    run_fn, calls = _fake_run(fail={"p4_g4_sqrt_s0"})
    record = sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, log=lambda s: None)
    assert calls == ["p2_g4_sqrt_s0", "p4_g4_sqrt_s0", "p8_g4_sqrt_s0"]
    status = {r["name"]: (r["status"], r["error"]) for r in record["runs"]}
    assert status["p4_g4_sqrt_s0"] == ("failed", "RuntimeError: boom")
    assert status["p8_g4_sqrt_s0"] == ("finished", None)
    on_disk = json.load(open(tmp_path / artifacts.SWEEP_FILE))
    assert on_disk["runs"] == record["runs"]
    assert on_disk["reference"] == "p2_g4_sqrt_s0"
    assert "boom" in open(tmp_path / "errors.log").read()

    # Re-running skips the finished points and retries the failed one.
    run_fn, calls = _fake_run()
    record = sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, log=lambda s: None)
    assert calls == ["p4_g4_sqrt_s0"]
    assert all(r["status"] == "finished" for r in record["runs"])


def test_a_point_another_program_trains_is_refused_not_recorded_failed(tmp_path):
    # --only on a point another sweep is training was a traceback and booked "failed"
    # for a healthy run (issue 48 D10).
    from rl_batch.locks import DirectoryLock, DirectoryLocked

    c = _sweep_config(prompts="2,4", group_sizes="4", seeds="0")
    run_fn, calls = _fake_run()
    busy = tmp_path / "runs" / "p4_g4_sqrt_s0"
    with DirectoryLock(str(busy), "run"):
        with pytest.raises(DirectoryLocked, match=f"--only=p4_g4_sqrt_s0: {busy} is in use"):
            sweep.run_sweep(c, str(tmp_path), only="p4_g4_sqrt_s0", run_fn=run_fn, log=print)
        assert not (busy / "sweep_point.json").exists()
        # A whole sweep stops there too, and its record does not call the point failed.
        with pytest.raises(DirectoryLocked, match=f"p4_g4_sqrt_s0: {busy} is in use"):
            sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, log=print)
    assert calls == ["p2_g4_sqrt_s0"] and not (tmp_path / "errors.log").exists()
    status = {r["name"]: r["status"] for r in artifacts.read_json(tmp_path / "sweep.json")["runs"]}
    assert status["p4_g4_sqrt_s0"] not in ("failed", "running"), status


def test_only_runs_one_point_and_unknown_names_are_errors(tmp_path):
    c = _sweep_config(prompts="2,4", group_sizes="4")
    run_fn, calls = _fake_run()
    sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, only="p4_g4_sqrt_s0", log=lambda s: None)
    assert calls == ["p4_g4_sqrt_s0"]
    # Concurrent jobs of an array leave the shared sweep.json alone.
    assert not os.path.exists(tmp_path / artifacts.SWEEP_FILE)
    point = json.load(open(tmp_path / "runs/p4_g4_sqrt_s0/sweep_point.json"))
    assert point["runs"][1]["status"] == "finished"
    with pytest.raises(ValueError, match="not a point of the grid"):
        sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, only="p3_g4_sqrt_s0")


def test_list_runs_is_json_with_overrides(tmp_path):
    c = _sweep_config(prompts="2,4", group_sizes="4")
    listed = json.loads(sweep.list_runs(c, str(tmp_path)))
    assert [r["name"] for r in listed] == ["p2_g4_sqrt_s0", "p4_g4_sqrt_s0"]
    assert listed[1]["overrides"]["prompts"] == 4
    # B = 16 = B_ref: lr_ref; B = 8: lr_ref * sqrt(1/2) (the effective LR, not the None input)
    assert [r["overrides"]["lr"] for r in listed] == pytest.approx([1e-3 * 0.5**0.5, 1e-3])


def test_a_points_effective_lr_is_in_derived_and_in_its_sweep_entry(tmp_path):
    c = _sweep_config(prompts="4,16", group_sizes="4", lr_rules="sqrt,malladi")
    run_fn, _ = _fake_run()
    record = sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, log=lambda s: None)
    _, resolved = sweep.plan(c, str(tmp_path))
    entries = {r["name"]: r for r in json.load(open(tmp_path / artifacts.SWEEP_FILE))["runs"]}
    assert entries == {r["name"]: r for r in record["runs"]}
    for name, point in resolved.items():
        assert point.inputs.lr is None and point.optimizer.lr > 0, name
        assert entries[name]["lr"] == point.optimizer.lr, name
    # B = 64 = 4 x B_ref (16): sqrt and malladi both double lr_ref.
    assert entries["p16_g4_malladi_s0"]["lr"] == pytest.approx(2e-3)
    assert resolved["p16_g4_malladi_s0"].optimizer.b1 == pytest.approx(1 - 4 * 0.1)


@pytest.mark.parametrize(
    "module, algo, group",
    [("experiments.grpo_sweep", "grpo", 8), ("experiments.ppo_sweep", "ppo", 1)],
)
def test_both_sweep_programs_take_config_overrides(tmp_path, module, algo, group):
    # One flag definition per program: --config.* overrides parse for GRPO and PPO alike.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [
        sys.executable, "-m", module, "--list_runs", "--config.sweep.seeds=0,1",
        "--config.sweep.prompts=32,64", f"--config.work_dir={tmp_path}",
        f"--config.sweep.reference=32x{group}:sqrt",  # (the default's is not in this grid)
    ]  # fmt: skip
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    names = [r["name"] for r in json.loads(out.stdout[out.stdout.index("[") :])]
    assert f"p32_g{group}_sqrt_s0" in names and f"p64_g{group}_sqrt_s1" in names, (algo, names)
    assert not os.listdir(tmp_path)  # listing the grid writes nothing


@pytest.mark.slow  # 12-38 s on a loaded 2-core machine
def test_isolated_point_runs_in_a_subprocess(tmp_path):
    c = _sweep_config(str(tmp_path / "work"), prompts="4", group_sizes="4")
    c.budget_responses = 16
    record = sweep.run_sweep(c, str(tmp_path / "sweep"), isolate=True, log=lambda s: None)
    assert [r["status"] for r in record["runs"]] == ["finished"], open(
        tmp_path / "sweep/runs/p4_g4_sqrt_s0/stdout.log"
    ).read()[-2000:]
    updates = artifacts.read_metrics(str(tmp_path / "sweep/runs/p4_g4_sqrt_s0"), "update")
    assert len(updates) == 1


def test_only_process_zero_writes_sweep_files(tmp_path, monkeypatch):
    class OtherProcess:  # stands in for jax inside process 1 of a multi-process run
        @staticmethod
        def process_index():
            return 1

        @staticmethod
        def device_count():
            return 1

    monkeypatch.setattr(processes, "jax", OtherProcess)
    c = _sweep_config(prompts="2", group_sizes="4")
    run_fn, calls = _fake_run(fail={"p2_g4_sqrt_s0"})
    printed = []
    sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, log=printed.append)
    assert calls == ["p2_g4_sqrt_s0"]  # it still computes its share
    assert not printed
    assert not (tmp_path / artifacts.SWEEP_FILE).exists()
    assert not (tmp_path / "errors.log").exists()


def test_a_rerun_with_other_settings_is_refused_before_any_point(tmp_path):
    c = _sweep_config(prompts="2,4", group_sizes="4")
    run_fn, calls = _fake_run()
    sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, log=lambda s: None)
    for r in ("p2_g4_sqrt_s0", "p4_g4_sqrt_s0"):  # what run.run would have written
        cfg = sweep.plan(c, str(tmp_path))[1][r]
        artifacts.write_json_atomic(
            os.path.join(str(tmp_path), "runs", r, artifacts.CONFIG_FILE), cfg.to_json()
        )
    before = open(tmp_path / artifacts.SWEEP_FILE).read()
    c.eval_k = 1
    with pytest.raises(ValueError, match=r"p2_g4_sqrt_s0: eval_k: 2 -> 1.*use a new --sweep_dir"):
        sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, log=lambda s: None)
    assert open(tmp_path / artifacts.SWEEP_FILE).read() == before
    assert calls == ["p2_g4_sqrt_s0", "p4_g4_sqrt_s0"]
    # A longer runway extends the finished points instead of skipping them.
    c.eval_k, c.budget_responses = 2, 2 * c.budget_responses
    sweep.run_sweep(c, str(tmp_path), run_fn=run_fn, log=lambda s: None)
    assert calls == ["p2_g4_sqrt_s0", "p4_g4_sqrt_s0"] * 2


def test_ppo_critic_axes_and_critic_points(tmp_path):
    c = _sweep_config(prompts="8,16", group_sizes="1", seeds="0")
    c.algo, c.group_size, c.ppo.warmup_updates = "ppo", 1, 0
    c.sweep.critic_batch_scales = "1,2"
    c.sweep.extra_points = "8x1:sqrt:k1-fixed,16x1:sqrt:k4"
    c.sweep.reference = "8x1:sqrt"
    points = sweep.expand_grid(c)
    assert [p.key for p in points] == [
        "8x1:sqrt", "8x1:sqrt:k2", "8x1:sqrt:k1-fixed",
        "16x1:sqrt", "16x1:sqrt:k2", "16x1:sqrt:k4",
    ]  # fmt: skip
    assert points[1].name == "p8_g1_sqrt_k2_s0"
    _, resolved = sweep.plan(c, str(tmp_path))
    k2, fixed = resolved["p8_g1_sqrt_k2_s0"], resolved["p8_g1_sqrt_k1-fixed_s0"]
    assert (k2.inputs.ppo.critic_batch_scale, k2.inputs.ppo.critic_lr_rule) == (2, "")
    assert (fixed.inputs.ppo.critic_batch_scale, fixed.inputs.ppo.critic_lr_rule) == (1, "fixed")
    # The critic's LR is resolved for its effective batch k x B (sqrt rule: x sqrt(2)).
    base_lr = resolved["p8_g1_sqrt_s0"].critic_optimizer.lr
    assert k2.critic_optimizer.lr == pytest.approx(base_lr * 2**0.5)
    assert fixed.critic_optimizer.lr == pytest.approx(c.ppo.critic_lr_ref)
    # Each run's key is read back from its own config the same way.
    assert artifacts.critic_variant_of(k2.inputs) == "k2"
    assert artifacts.critic_variant_of(fixed.inputs) == "k1-fixed"
    # A base critic setting is every point's default, the reference's included.
    c.ppo.critic_batch_scale, c.sweep.critic_batch_scales, c.sweep.extra_points = 2, "", ""
    assert {p.key for p in sweep.expand_grid(c)} == {"8x1:sqrt:k2", "16x1:sqrt:k2"}
    assert sweep.reference_key(c, sweep.expand_grid(c)) == "8x1:sqrt:k2"
    listed = {r["name"]: r["overrides"] for r in json.loads(sweep.list_runs(c, str(tmp_path)))}
    assert listed["p8_g1_sqrt_k2_s0"]["critic"] == "k2"


def test_critic_point_keys_are_checked():
    c = _sweep_config(prompts="4", group_sizes="4", seeds="0")
    c.sweep.extra_points = "4x4:sqrt:k2"
    with pytest.raises(ValueError, match="a critic part .* needs algo='ppo'"):
        sweep.expand_grid(c)
    for bad in ("4x1:sqrt:2", "4x1:sqrt:k0", "4x1:sqrt:k2:x"):
        with pytest.raises(ValueError, match="bad sweep point"):
            artifacts.parse_point_key(bad)
    assert artifacts.parse_point_key("64x1:sqrt:k1-sqrt") == (64, 1, "sqrt", "")


def test_variant_points_carry_their_settings_into_the_run(tmp_path):
    c = _sweep_config(prompts="2,4", group_sizes="4", seeds="0")
    c.sweep.variants = {
        "warmup": {"batch_schedule": {"kind": "warmup", "start_prompts": 2, "responses": 32}},
        "clip-wide": {"grpo": {"clip_high": 0.3}},
    }
    c.sweep.extra_points = "4x4:sqrt@warmup,4x4:sqrt@clip-wide"
    points = sweep.expand_grid(c)
    keys = ["2x4:sqrt", "4x4:sqrt", "4x4:sqrt@warmup", "4x4:sqrt@clip-wide"]
    assert [p.key for p in points] == keys
    assert points[2].name == "p4_g4_sqrt_warmup_s0"
    assert points[2].configuration.label == "P=4 G=4 sqrt warmup"
    _, resolved = sweep.plan(c, str(tmp_path))
    warm = resolved["p4_g4_sqrt_warmup_s0"].inputs
    assert (warm.variant, warm.batch_schedule.kind, warm.batch_schedule.start_prompts) == (
        "warmup",
        "warmup",
        2,
    )
    assert resolved["p4_g4_sqrt_clip-wide_s0"].inputs.grpo.clip_high == 0.3
    plain = resolved["p4_g4_sqrt_s0"].inputs
    assert (plain.variant, plain.batch_schedule.kind) == ("", "fixed")
    # The run config names its variant, and the key is read back from it.
    assert artifacts.variant_of(warm) == "warmup"
    assert artifacts.parse_key("4x4:sqrt@warmup") == (4, 4, "sqrt", None, "warmup")
    listed = {r["name"]: r["overrides"] for r in json.loads(sweep.list_runs(c, str(tmp_path)))}
    assert listed["p4_g4_sqrt_warmup_s0"]["variant"] == "warmup"


def test_variant_points_are_checked_before_anything_starts():
    c = _sweep_config(prompts="2", group_sizes="4", seeds="0")
    c.sweep.variants = {"wide": {"grpo": {"clip_epsilon_typo": 0.3}}, "big": {"prompts": 8}}
    for key, message in [
        ("2x4:sqrt@nope", "no variant 'nope' in sweep.variants"),
        ("2x4:sqrt@wide", "sweep.variants.wide.grpo.clip_epsilon_typo: no such field"),
        ("2x4:sqrt@big", "sweep.variants.big.prompts: the point's key sets this"),
        ("2x4:sqrt@Bad_Name", "bad variant name"),
    ]:
        c.sweep.extra_points = key
        with pytest.raises(ValueError, match=message):
            sweep.expand_grid(c)


def test_a_variant_named_like_a_critic_part_is_refused_not_trained_in_its_place():
    # 64x1:sqrt@k2 and 64x1:sqrt:k2 would both run in p8_g1_sqrt_k2_s0 (issue 48 D3).
    c = _sweep_config(prompts="8", group_sizes="1", seeds="0")
    c.algo, c.group_size, c.ppo.warmup_updates = "ppo", 1, 0
    c.sweep.variants = {"k2": {"grpo": {"clip_high": 0.3}}}
    c.sweep.extra_points = "8x1:sqrt:k2,8x1:sqrt@k2"
    with pytest.raises(ValueError, match="'8x1:sqrt:k2' and '8x1:sqrt@k2' share the run dir"):
        sweep.expand_grid(c)
    c.sweep.extra_points = "8x1:sqrt@k2"  # alone it has its own directory
    assert [p.name for p in sweep.expand_grid(c)] == ["p8_g1_sqrt_s0", "p8_g1_sqrt_k2_s0"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("target", 0.45),
        ("target_band_lo", 0.4),
        ("target_crossing", "eval"),
        ("eval_every_responses", 64),
        ("budget_responses", 512),
    ],
)
def test_a_variant_may_not_set_a_field_every_point_shares(field, value):
    # The analysis compares the points at the sweep's target and budget (issue 48 D4).
    c = _sweep_config(prompts="2", group_sizes="4", seeds="0")
    c.sweep.variants = {"lowtgt": {field: value}}
    c.sweep.extra_points = "2x4:sqrt@lowtgt"
    with pytest.raises(ValueError, match=f"sweep.variants.lowtgt.{field}: every point of a sweep"):
        sweep.expand_grid(c)


def test_the_failure_line_names_errors_log_only_when_it_exists(tmp_path):
    from experiments import sweep_main

    line = sweep_main.failed_message(["p2_g4_sqrt_s0"], str(tmp_path))
    assert "errors.log" not in line and f"{tmp_path}/sweep.json" in line
    (tmp_path / "errors.log").write_text("== p2_g4_sqrt_s0\n")
    assert f"see {tmp_path}/errors.log" in sweep_main.failed_message(["x"], str(tmp_path))


@pytest.mark.slow  # 23-29 s on a loaded 2-core machine
def test_each_point_is_resolved_once_on_its_way_to_the_run(tmp_path, monkeypatch):
    # In process: plan() resolves each point, run.run receives its spec and resolves
    # nothing; the runs' config.json files are those specs.
    c = _sweep_config(str(tmp_path / "work"), prompts="4,8", group_sizes="2")
    c.budget_responses = 16
    calls = []
    resolve = config_lib.resolve
    monkeypatch.setattr(config_lib, "resolve", lambda *a, **k: calls.append(1) or resolve(*a, **k))
    record = sweep.run_sweep(c, str(tmp_path / "sweep"), log=lambda s: None)
    assert [r["status"] for r in record["runs"]] == ["finished", "finished"]
    assert len(calls) == len(record["runs"])
    _, specs = sweep.plan(c, str(tmp_path / "sweep"))
    for name, spec in specs.items():
        saved = artifacts.read_json(os.path.join(spec.inputs.run_dir, artifacts.CONFIG_FILE))
        assert config_lib.load_spec(saved) == spec, name


def test_sweep_json_has_one_builder_and_one_writer(tmp_path):
    """artifacts.sweep_record / write_sweep: the fields in order, extras after, a record
    that is not one refused; and no other module writes a sweep.json itself."""
    entry = artifacts.sweep_entry("p2_g4_sqrt_s0", prompts=2, group_size=4, lr_rule="sqrt",
                                  lr=1e-3, seed=0, status="finished")  # fmt: skip
    settings = {"algo": "grpo", "target": 0.5}
    record = artifacts.sweep_record(
        "s", settings, [entry], reference="p2_g4_sqrt_s0", imported={"framework": "x"}
    )
    assert list(record) == ["name", "algo", "target", "target_band_lo", "target_crossing",
                            "budget_responses", "eval_every_responses", "reference", "runs",
                            "imported"]  # fmt: skip
    assert record["target_crossing"] is None and record["runs"][0]["batch"] == 8
    path = str(tmp_path / artifacts.SWEEP_FILE)
    artifacts.write_sweep(path, record)
    assert artifacts.read_json(path) == record
    with pytest.raises(ValueError, match="not a sweep record"):
        artifacts.write_sweep(path, {"name": "s", "runs": []})
    with pytest.raises(ValueError, match="without a name and status"):
        artifacts.write_sweep(path, {**record, "runs": [{"name": "a"}]})
    with pytest.raises(ValueError, match="own fields"):
        artifacts.sweep_record("s", {}, [], algo="ppo")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    writers = []
    for folder in ("rl_batch", "launch", "experiments"):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for f in files:
                text = open(os.path.join(dirpath, f)).read() if f.endswith(".py") else ""
                if "SWEEP_FILE" in text and "write_json_atomic(sweep" in text:
                    writers.append(f)
    assert writers == [], writers


_CHILD = """
import json, os, signal, sys, time
run_dir, seconds = sys.argv[1], float(sys.argv[2])
def write(status):
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({"status": status}, f)
def stop(signum, frame):
    write("interrupted")
    sys.exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
write("running")
time.sleep(seconds)
write("finished")
"""


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_ctrl_c_stops_a_concurrent_sweep_as_sigterm_does(tmp_path, monkeypatch):
    # SIGINT left the pool's points running to their end and started the next ones
    # (issue 48): now the running children get SIGTERM and no other point starts.
    import signal
    import threading
    import time

    def fake_point_process(spec, log_path, worker=None):
        seconds = 0 if spec.inputs.prompts == 2 else 30  # the first point, then slow ones
        cmd = [sys.executable, "-c", _CHILD, spec.inputs.run_dir, str(seconds)]
        processes.run_child(cmd, log_path)

    monkeypatch.setattr(processes, "run_point_process", fake_point_process)
    c = _sweep_config(prompts="2,4,8,16", group_sizes="4", seeds="0")
    c.sweep.concurrent, c.sweep.reuse_workers = 2, False
    # Ctrl-C as Python's default handler turns it into KeyboardInterrupt, whatever an
    # earlier test in this process (a library it imported) left installed for SIGINT.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # as Ctrl-C
    t0 = time.time()
    try:
        with pytest.raises(KeyboardInterrupt):
            sweep.run_sweep(c, str(tmp_path), log=lambda s: None)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert time.time() - t0 < 15  # not the 30 s the slow points sleep
    status = {r["name"]: r["status"] for r in artifacts.read_json(tmp_path / "sweep.json")["runs"]}
    assert status["p2_g4_sqrt_s0"] == "finished"
    assert status["p4_g4_sqrt_s0"] == status["p8_g4_sqrt_s0"] == "interrupted", status
    assert status["p16_g4_sqrt_s0"] == "pending", status  # never started
    assert not (tmp_path / "errors.log").exists()


def _run_with_checkpoints(stopped):
    """A fake run that leaves steps 1 and 2, the last one stopped for ``stopped``."""
    import jax.numpy as jnp

    from rl_batch.runs.checkpoint import Checkpointer

    def run_fn(spec):
        run_dir = spec.inputs.run_dir
        ckpt = Checkpointer(os.path.join(run_dir, artifacts.CHECKPOINT_DIR))
        for step in (1, 2):
            counters = {"step": step, "stopped": stopped if step == 2 else ""}
            ckpt.save(step, {"state": {"w": jnp.zeros(2)}}, {"counters": counters})
        ckpt.close()
        summary = {"status": "finished", "stopped": stopped}
        artifacts.write_json_atomic(os.path.join(run_dir, artifacts.SUMMARY_FILE), summary)
        return summary

    return run_fn


@pytest.mark.parametrize(
    "keep, stopped, left",
    [(None, "target", []), (None, "budget", ["2"]), ("all", "target", ["1", "2"])],
)
def test_a_finished_point_keeps_the_checkpoints_sweep_keep_checkpoints_says(
    tmp_path, keep, stopped, left
):
    c = _sweep_config(prompts="2", group_sizes="4")
    if keep is not None:
        c.sweep.keep_checkpoints = keep
    printed = []
    sweep.run_sweep(c, str(tmp_path), run_fn=_run_with_checkpoints(stopped), log=printed.append)
    ckpt_dir = tmp_path / "runs" / "p2_g4_sqrt_s0" / artifacts.CHECKPOINT_DIR
    assert sorted(n for n in os.listdir(ckpt_dir) if n.isdigit()) == left
    line = next(p for p in printed if "p2_g4_sqrt_s0: finished" in p)
    if keep is None:  # (the default: "extendable")
        kept = ", step 2 kept" if stopped == "budget" else ", 2"
        assert line.endswith(f"; checkpoints removed (steps 1{kept}; "
                             "sweep.keep_checkpoints=extendable)")  # fmt: skip
    else:
        assert "removed" not in line


@pytest.mark.parametrize("keep, prune", [(None, "extendable"), ("none", "none"), ("all", "")])
def test_a_point_prunes_its_own_final_step_where_the_policy_keeps_none_at_target(keep, prune):
    c = _sweep_config(prompts="2", group_sizes="4")
    if keep is not None:
        c.sweep.keep_checkpoints = keep
    point = sweep.expand_grid(c)[0]
    run_config = sweep.point_config(c, point, "/tmp/unused")
    assert run_config.prune_at_target == prune
    config_lib.resolve(run_config)  # (a valid run config)


def test_an_unknown_keep_checkpoints_is_refused_before_any_point(tmp_path):
    c = _sweep_config(prompts="2", group_sizes="4", keep_checkpoints="latest")
    started = []
    with pytest.raises(ValueError, match="^sweep.keep_checkpoints='latest': must be one of"):
        sweep.run_sweep(c, str(tmp_path), run_fn=started.append, log=lambda s: None)
    assert not started
