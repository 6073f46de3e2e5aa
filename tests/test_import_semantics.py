"""Importing verl, TRL, tunix and OpenRLHF runs: numbers worked by hand (N*, T, cost
shares) on `import_fixtures.EXAMPLE`, each framework's timing semantics by version, and
nothing silent (non-finite values, re-logged steps, mixed G, damaged inputs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import import_fixtures as fx
import pytest

from rl_batch import artifacts
from rl_batch.analysis import curves, findings, time_to_target
from rl_batch.analysis.importers import checks, convert, import_runs, load_keymap, sources

TARGET = 0.6
# By hand (import_fixtures.EXAMPLE): b32 crosses 0.6 at 85.33 responses, inside update 3
# (64..96], so N* = 96 (the update that realizes it, target_crossing "update") and
# T = 3 x 55 s = 165 s; b128 crosses at 170.67, inside update 2: N* = 256, T = 2 x 100 s.
WANT = {"b32_s0": (96.0, 165.0), "b128_s0": (256.0, 200.0)}
# b32's cost shares of its 55 s step: gen 30, reward 2, update_actor 12, the rest (11 s of
# old_log_prob, a timer of no phase of ours) idle/other.
SHARES_B32 = {
    "time_generate_s": 30 / 55,
    "time_score_s": 2 / 55,
    "time_update_s": 12 / 55,
    "time_idle_s": 11 / 55,
}


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", "experiments.import_runs", "--noreport", *args],
        capture_output=True,
        text=True,
        env=env,
    )


def _summary(sweep: str, run: str) -> dict:
    return artifacts.read_json(os.path.join(sweep, "runs", run, "summary.json"))


@pytest.mark.parametrize(
    "testing_in_step, config_extra, overrides, decided",
    [
        (False, None, {}, "by evidence"),  # verl >= 0.6, no version recorded
        (True, None, {}, "by evidence"),  # verl <= 0.5, no version recorded
        (True, {"verl_version": "0.5.0"}, {}, "by version: verl_version = 0.5.0"),
        (False, None, {"verl_version": "0.7.0"}, "by version: verl_version = 0.7.0"),
    ],
)
def test_verl_validation_time_by_version_or_evidence(
    tmp_path, testing_in_step, config_extra, overrides, decided
):
    """verl <= 0.5 times validation inside timing_s/step, >= 0.6 outside: both give the
    hand-worked N*, T and cost shares, and the import says how it decided."""
    root = str(tmp_path / "runs")
    paths = [
        fx.write_example(root, run, testing_in_step=testing_in_step, config_extra=config_extra)
        for run in ("b32", "b128")
    ]
    report = import_runs(paths, str(tmp_path / "sweep"), "verl", TARGET, overrides=overrides)
    for run, (n_star, t) in WANT.items():
        s = _summary(report.sweep_dir, run)
        assert (s["n_star"], s["time_to_target_s"]) == pytest.approx((n_star, t), rel=1e-12)
    where = "inside" if testing_in_step else "outside"
    (timing,) = [line for line in report.lines() if line.startswith("timing:")]
    assert f"timing_s/testing {where} timing_s/step" in timing and decided in timing
    assert timing.endswith("in 2 of 2 runs")
    a = time_to_target.analyze_sweep(curves.load_sweep(report.sweep_dir), None, None)
    shares = dict(findings.cost_structure(a))
    assert shares[32] == pytest.approx(SHARES_B32, rel=1e-12)
    assert sum(shares[128].values()) == pytest.approx(1.0)
    assert shares[128]["time_idle_s"] == pytest.approx(16 / 100)


def test_a_fixed_exclude_list_would_be_wrong(tmp_path):
    """Not vacuous: subtracting timing_s/testing from a verl >= 0.6 step (what a fixed
    exclude list does) gives T 10 s low, one validation before the target."""
    path = fx.write_example(str(tmp_path / "runs"), "b32")
    km = load_keymap("verl")
    km["time"] = {**km["time"], "exclude_in_step": True}
    run = convert.convert_run("b32_s0", path, sources.read_source(path), km)
    assert convert.run_summary(run, TARGET)["time_to_target_s"] == pytest.approx(155.0)


def test_lr_rule_inferred_from_b_and_lr_and_set_by_flag(tmp_path):
    root = str(tmp_path / "runs")
    paths = [fx.write_example(root, run) for run in ("b32", "b128")]
    report = import_runs(paths, str(tmp_path / "a"), "verl", TARGET)
    assert {r.lr_rule for r in report.runs} == {"sqrt"}  # 2e-6 = 1e-6 x sqrt(128 / 32)
    assert "lr_rule: inferred sqrt for 2 runs" in "\n".join(report.lines())
    report = import_runs(paths, str(tmp_path / "b"), "verl", TARGET, overrides={"lr_rule": "fixed"})
    assert {r.lr_rule for r in report.runs} == {"fixed"}
    assert not any(line.startswith("lr_rule:") for line in report.lines())
    raw = artifacts.read_json(os.path.join(report.sweep_dir, "sweep.json"))
    assert {e["lr_rule"] for e in raw["runs"]} == {"fixed"}
    assert checks.fitted_rule([(32, 1e-6), (128, 4e-6)]) == "linear"
    assert checks.fitted_rule([(32, 1e-6), (128, 1e-6)]) == "fixed"
    assert checks.fitted_rule([(32, 1e-6), (128, 3e-6)]) is None
    assert checks.fitted_rule([(32, 1e-6), (32, 1e-6)]) is None  # one batch: any rule fits


def test_set_prompts_and_group_size_replace_what_the_map_reads(tmp_path):
    path = fx.write_example(str(tmp_path / "runs"), "b32")
    km = load_keymap("verl")
    run = convert.convert_run(
        "b32_s0", path, sources.read_source(path), km, {"prompts": 16, "group_size": 2}
    )
    assert (run.prompts, run.group_size) == (16, 2)


def test_a_relogged_step_takes_the_later_value_and_says_so(tmp_path):
    """A resumed job logs steps 3 and 4 again; step 4's evaluation is now 0.9: the later
    values win, and one line names the run and the steps. By hand: 0.6 is crossed at
    64 + 64 x 0.1 / 0.4 = 80 responses, inside update 3: N* = 96, T = 165 s (b32)."""
    rows = fx.example_rows("b32")
    again = [(s, {**d}) for s, d in rows if s >= 3]
    again[-1][1][fx.EXAMPLE_KEY] = 0.9
    path = fx.write_example(str(tmp_path / "runs"), "b32", rows=rows + again)
    report = import_runs([path], str(tmp_path / "sweep"), "verl", TARGET)
    (line,) = [x for x in report.lines() if "logged twice" in x]
    assert line.startswith("b32_s0: steps 4 logged twice with different values")
    evals = [r for r in report.runs[0].records if r["kind"] == "eval"]
    assert [e["eval_accuracy"] for e in evals] == [0.2, 0.5, 0.9]
    same = [(s, {**d}) for s, d in rows if s >= 3]  # logged again, the same values: quiet
    path = fx.write_example(str(tmp_path / "runs2"), "b32", rows=rows + same)
    assert not any(
        "twice" in x for x in import_runs([path], str(tmp_path / "s2"), "verl", TARGET).lines()
    )


@pytest.mark.parametrize(
    "step, key, value, says",
    [
        (2, fx.EXAMPLE_KEY, float("nan"), "step 2: val-core/gsm8k/acc/mean@4 is null or NaN"),
        (1, "actor/grad_norm", float("inf"), "step 1: actor/grad_norm is null or NaN"),
        (3, "timing_s/step", -55.0, "step 3: timing_s/step = -55 s is negative"),
        (3, "timing_s/gen", 80.0, "step 3: phases timing_s/gen + timing_s/reward"),
        (2, "actor/lr", float("nan"), "step 2: actor/lr is null or NaN"),
    ],
)
@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_value_out_of_range_refuses_the_run_in_one_line(tmp_path, step, key, value, says):
    """verl's file logger writes NaN and inf as null: a null evaluation is refused (not
    dropped, which would move N*), as are a negative time and phases over their step."""
    rows = fx.example_rows("b32")
    rows[step][1][key] = value
    path = fx.write_example(str(tmp_path / "runs"), "b32", rows=rows)
    if not (value == value and abs(value) != float("inf")):
        assert '":null' in open(path).read()  # as orjson writes it
    out = tmp_path / "sweep"
    res = _cli(f"--runs={path}", f"--out={out}", "--keymap=verl", f"--target={TARGET}")
    assert res.returncode == 1
    (err,) = res.stderr.strip().splitlines()
    assert err.startswith(f"error: run b32_s0: {path}: ") and says in err, err
    assert not out.exists()


def test_mixed_group_size_in_one_configuration_is_an_error(tmp_path):
    root = str(tmp_path / "runs")
    a = fx.write_example(root, "b32", name="b32_s0")
    b = fx.write_example(root, "b32", name="b32_s1")
    config = json.load(open(os.path.join(os.path.dirname(b), "config.json")))
    config["actor_rollout_ref"]["rollout"]["n"] = 2  # a stray G
    json.dump(config, open(os.path.join(os.path.dirname(b), "config.json"), "w"))
    out = tmp_path / "sweep"
    res = _cli(f"--runs={a},{b}", f"--out={out}", "--keymap=verl", f"--target={TARGET}")
    assert res.returncode == 1
    (err,) = res.stderr.strip().splitlines()
    assert "mixed group size G [2, 4]" in err and "b32_s0 (G=4), b32_s1 (G=2)" in err
    assert not out.exists()


def test_a_flag_typo_is_one_line():
    res = _cli("--runz=x")
    assert res.returncode == 1
    assert res.stderr.strip().splitlines() == [res.stderr.strip()] and res.stderr.startswith(
        "error: "
    )


# ------------------------------------------------------------------ damaged inputs


def _tb_run(d):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(str(d / "tb"))
    for s in range(1, 40):
        w.add_scalar("eval/accuracy", 0.5, s)
    w.close()
    (d / "config.json").write_text(json.dumps({"prompts": 8, "group_size": 4}))
    return d


def _damage(kind: str, tmp_path) -> tuple[str, str]:
    """(a run path whose input is damaged, a part of the error line)."""
    d = tmp_path / "run_a"
    d.mkdir()
    if kind == "verl_jsonl":
        path = fx.write_example(str(tmp_path), "b32", name="run_a")
        text = open(path).read()
        open(path, "w").write(text[: len(text) // 2])
        return path, "malformed JSON line"
    if kind == "tensorboard":
        _tb_run(d)
        (f,) = list((d / "tb").iterdir())
        f.write_bytes(f.read_bytes()[:-7])
        return str(d), "damaged TensorBoard event file"
    if kind == "wandb":
        import wandb

        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
        made = tmp_path / "made"
        run = wandb.init(project="damaged", dir=str(made), config={"prompts": 8})
        run.log({"eval/accuracy": 0.5}, step=1)
        run.finish()
        (f,) = {p.resolve() for p in made.rglob("*.wandb")}
        data = _settled(f)  # a copy, away from the writer's directory
        # Cut inside the file's last record (the run's exit record), 3 bytes short: a cut
        # at a fixed fraction can land on a record boundary, which reads as a short file.
        (d / f.name).write_bytes(data.rstrip(b"\0")[:-3])
        return str(d), "truncated W&B record"
    if kind == "csv":
        (d / "history.csv").write_bytes(b"_step,acc\n1,\xff\xfe\n")
        return str(d / "history.csv"), "damaged or unreadable wandb_history input"
    if kind == "parquet":
        (d / "history.parquet").write_bytes(b"PAR1 not a parquet file")
        return str(d / "history.parquet"), "damaged or unreadable wandb_history input"
    if kind == "trainer_state":
        (d / "trainer_state.json").write_text('{"log_history": ["not a dict"]}')
        return str(d), "log_history[0] is not a JSON object"
    if kind == "trainer_state_truncated":
        (d / "trainer_state.json").write_text('{"log_history": [{"step": 1, "eval_re')
        return str(d), "malformed JSON"
    if kind in ("config_yaml", "config_json"):
        path = fx.write_example(str(tmp_path), "b32", name="run_a")
        os.remove(os.path.join(os.path.dirname(path), "config.json"))
        if kind == "config_yaml":
            (d / "config.yaml").write_text("data: {train_batch_size: [8\n")
        else:
            (d / "config.json").write_text('{"data": {"train_batch_size": 8')
        return path, "malformed config file"
    raise AssertionError(kind)


def _settled(path, timeout_s: float = 60.0) -> bytes:
    """The bytes of a file that W&B's service process may still be writing after
    ``run.finish()`` returns (on a loaded host the header had not reached the disk yet):
    read once it has its header and its size held still for half a second."""
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        data = path.read_bytes()
        if data.startswith(b":W&B") and data == last:
            return data
        last = data
        time.sleep(0.5)
    raise AssertionError(f"{path}: W&B did not finish writing it in {timeout_s} s")


@pytest.mark.parametrize(
    "kind",
    [
        "verl_jsonl",
        "tensorboard",
        "wandb",
        "csv",
        "parquet",
        "trainer_state",
        "trainer_state_truncated",
        "config_yaml",
        "config_json",
    ],
)
@pytest.mark.slow  # 29 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_every_damaged_input_is_one_line_and_nothing_written(tmp_path, kind):
    path, says = _damage(kind, tmp_path)
    keymap = "verl" if kind.startswith(("verl", "config")) else "generic"
    keymap = "trl" if kind.startswith("trainer_state") else keymap
    out = tmp_path / "sweep"
    res = _cli(f"--runs={path}", f"--out={out}", f"--keymap={keymap}", "--target=0.5")
    assert res.returncode == 1, res.stdout
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ") and says in lines[0], lines[0]
    assert not out.exists()


# ------------------------------------------------------------------ TRL, tunix, OpenRLHF


def test_trl_step_time_logged_every_two_steps_is_a_mean_over_them(tmp_path):
    """TRL logs step_time as the mean since the previous log: with logging_steps=2, the
    rows at steps 2 and 4 carry (50 + 60) / 2 and (70 + 80) / 2; the import gives each
    update its window's mean, so the cumulative time is 55, 110, 185, 260 s."""
    from transformers import TrainerState

    out = tmp_path / "grpo_s0"
    out.mkdir()
    args = fx.trl_args({"prompts": 8, "group_size": 4, "lr_rule": "sqrt", "seed": 0}, str(out))
    (out / "training_args.json").write_text(json.dumps(args))
    history = [
        {"eval_reward": 0.2, "step": 0},
        {"loss": 0.1, "step_time": 55.0, "step": 2},
        {"eval_reward": 0.5, "step": 2},
        {"loss": 0.1, "step_time": 75.0, "step": 4},
        {"eval_reward": 0.8, "step": 4},
    ]
    TrainerState(global_step=4, log_history=history).save_to_json(str(out / "trainer_state.json"))
    report = import_runs(
        [str(out)], str(tmp_path / "sweep"), "trl", TARGET, overrides={"world_size": 2}
    )
    (run,) = report.runs
    ups = [r for r in run.records if r["kind"] == "update"]
    assert [u["time_train_cum_s"] for u in ups] == pytest.approx([55, 110, 185, 260])
    # 0.6 crossed at 64 + 64 x 0.1 / 0.3 = 85.3 responses, inside update 3: N* = 96, T = 185.
    s = _summary(report.sweep_dir, "grpo_s0")
    assert (s["n_star"], s["time_to_target_s"]) == pytest.approx((96.0, 185.0))


def _write_tb(run_dir, rows: list[tuple[int, dict]], config: dict) -> str:
    from tensorboardX import SummaryWriter

    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(config, f)
    w = SummaryWriter(os.path.join(run_dir, "tb"))
    for s, d in rows:
        for k, v in d.items():
            w.add_scalar(k, v, s)
    w.close()
    return run_dir


def test_openrlhf_tensorboard_tags_give_the_hand_numbers(tmp_path):
    """OpenRLHF 0.11's tags (train/timing/*, eval/eval_<ds>_pass1) for the b32 example:
    step_total = generation 30 + make_experience 13 + ppo_train 12 = 55 s (make_experience
    is no phase of ours: idle/other), evaluation outside it."""
    rows = [(0, {"eval/eval_gsm8k_pass1": 0.2})]
    for s in range(1, 5):
        d = {
            "train/timing/generation": 30.0,
            "train/timing/make_experience": 13.0,
            "train/timing/ppo_train": 12.0,
            "train/timing/broadcast": 0.0,
            "train/timing/step_total": 55.0,
            "train/actor_lr": 1e-6,
        }
        d.update({2: {"eval/eval_gsm8k_pass1": 0.5}, 4: {"eval/eval_gsm8k_pass1": 0.8}}.get(s, {}))
        rows.append((s, d))
    config = {
        "rollout": {"batch_size": 8, "n_samples_per_prompt": 4},
        "actor": {"adam": {"lr": 1e-6}},
    }
    path = _write_tb(str(tmp_path / "orl_s0"), rows, config)
    report = import_runs([path], str(tmp_path / "sweep"), "openrlhf", TARGET)
    s = _summary(report.sweep_dir, "orl_s0")
    assert (s["n_star"], s["time_to_target_s"]) == pytest.approx((96.0, 165.0))
    up = [r for r in report.runs[0].records if r["kind"] == "update"][0]
    assert (up["time_generate_s"], up["time_update_s"], up["time_idle_s"]) == (30.0, 12.0, 13.0)


def test_tunix_tensorboard_tags_give_the_hand_numbers(tmp_path):
    """tunix's '<prefix>/<mode>/<name>' tags, its global steps from 0 (the first update
    logs at step 0), perf/train/global_step_time per step."""
    rows = [(0, {"rewards/eval/score/mean": 0.2})]
    for s in range(0, 4):
        d = {
            "perf/train/global_step_time": 55.0,
            "perf/train/sum/rollout_time": 30.0,
            "perf/train/sum/actor_train_time": 12.0,
            "actor/train/learning_rate": 1e-6,
        }
        d.update(
            {1: {"rewards/eval/score/mean": 0.5}, 3: {"rewards/eval/score/mean": 0.8}}.get(s, {})
        )
        rows.append((s, d))
    config = {"batch_size": 8, "grpo_config": {"num_generations": 4}}
    path = _write_tb(str(tmp_path / "tunix_s0"), rows, config)
    report = import_runs([path], str(tmp_path / "sweep"), "tunix", TARGET)
    s = _summary(report.sweep_dir, "tunix_s0")
    assert (s["n_star"], s["time_to_target_s"]) == pytest.approx((96.0, 165.0))


def test_every_shipped_map_names_the_versions_it_was_checked_against():
    for name in ("verl", "trl", "tunix", "openrlhf"):
        km = load_keymap(name)
        assert km["versions"]["checked"] and km["versions"]["timing"], name
