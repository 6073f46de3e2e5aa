"""Importing other frameworks' runs: each source, written by its real writer, gives the
known answer of the same synthetic sweep in our own format (`import_fixtures`)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import import_fixtures as fx
import pytest

from rl_batch import artifacts
from rl_batch.analysis import curves, findings, importers, planner, time_to_target
from rl_batch.analysis.importers import sources

TARGET = 0.8
TOL = 0.2


def answer(sweep_dir: str) -> dict:
    """Per configuration (N*, T, r_N, r_q, T/T_ref) means, the findings' verdicts and
    the planner's recommendation set: what the known-answer comparison compares."""
    a = time_to_target.analyze_sweep(curves.load_sweep(sweep_dir), None, None)

    def mean(e):
        return None if e is None else e.mean

    per_key = {
        k.key: (
            mean(a.stats[k].n_star),
            mean(a.stats[k].time_to_target_s),
            mean(a.ratios[k].r_n),
            mean(a.ratios[k].r_q),
            mean(a.ratios[k].r_t),
        )
        for k in a.stats
    }
    verdicts = [(f.name, f.verdict) for f in findings.study_findings(a, None, TOL)]
    plan = planner.plan_full(a)
    chosen = sorted(k.key for k in plan.candidates)
    return {"keys": per_key, "verdicts": verdicts, "candidates": chosen}


def assert_same(got: dict, want: dict, timed: bool = True) -> None:
    assert sorted(got["keys"]) == sorted(want["keys"])
    for key, w in want["keys"].items():
        g = got["keys"][key]
        parts = range(5) if timed else (0, 2)  # N*, r_N only without timing
        for i in parts:
            assert (g[i] is None) == (w[i] is None), (key, i, g, w)
            if w[i] is not None:
                assert g[i] == pytest.approx(w[i], rel=1e-6), (key, i)
    if timed:
        assert got["verdicts"] == want["verdicts"]
        assert got["candidates"] == want["candidates"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("import"))
    ref = fx.write_reference(os.path.join(d, "ref"))
    return d, ref, answer(ref)


def test_verl_jsonl_gives_the_known_answer(reference):
    d, ref, want = reference
    paths = fx.write_verl_jsonl(ref, os.path.join(d, "verl"))
    report = importers.import_runs(paths, os.path.join(d, "imp_verl"), fx.verl_keymap(d), TARGET)
    assert not report.untimed
    got = answer(report.sweep_dir)
    assert_same(got, want)
    # Not a vacuous comparison: the sweep's N* differ across batches and T is measured.
    assert len({round(v[0]) for v in got["keys"].values()}) >= 4
    assert all(v[1] is not None and v[1] > 0 for v in got["keys"].values())
    # The phases land in our fields (the cost structure reads them).
    line = artifacts.read_metrics(os.path.join(report.sweep_dir, "runs", "P8_G8_sqrt_s0"))[1]
    assert line["time_generate_s"] > 0 and line["time_update_s"] > 0
    assert line["grad_norm"] > 0 and line["prompts"] == 8 and line["group_size"] == 8


def test_tensorboard_event_files_give_the_known_answer(reference):
    """tensorboardX events, time from the events' wall-clock stamps (generic key map)."""
    d, ref, want = reference
    paths = fx.write_tensorboard(ref, os.path.join(d, "tb"))
    assert sources.detect_source(paths[0]) == "tensorboard"
    out = os.path.join(d, "imp_tb")
    report = importers.import_runs(paths, out, fx.generic_keymap(d), TARGET)
    assert_same(answer(report.sweep_dir), want)


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_wandb_offline_runs_give_the_known_answer(reference):
    d, ref, want = reference
    paths = fx.write_wandb_offline(ref, os.path.join(d, "wandb"))
    assert sources.detect_source(paths[0]) == "wandb"
    logged = sources.read_source(paths[0])
    assert logged.config["data"]["train_batch_size"] == 8  # the run's config, from W&B
    out = os.path.join(d, "imp_wandb")
    report = importers.import_runs(paths, out, fx.verl_keymap(d), TARGET)
    assert_same(answer(report.sweep_dir), want)


def test_wandb_history_csv_and_parquet_read_as_the_run(reference, tmp_path):
    """An exported history (CSV, parquet) imports to the same lines as its run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d, ref, _ = reference
    name, entry, records = fx.reference_runs(ref)[0]
    rows = [{"_step": s, **data} for s, data in fx.verl_rows(records)]
    columns = sorted({k for r in rows for k in r})
    run_dir = tmp_path / name
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(fx.verl_config(entry)))
    with open(run_dir / "history.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    table = pa.table({c: [r.get(c) for r in rows] for c in columns})
    pq.write_table(table, run_dir / "history.parquet")
    km = importers.load_keymap(fx.verl_keymap(str(tmp_path)))
    from rl_batch.analysis.importers import convert

    lines = _jsonl(run_dir, rows)
    want = convert.convert_run(name, lines, sources.read_verl_jsonl(lines), km, {})
    for file in ("history.csv", "history.parquet"):
        path = str(run_dir / file)
        got = convert.convert_run(name, path, sources.read_source(path), km, {})
        assert _same_records(got.records, want.records)
        assert (got.prompts, got.group_size) == (8, 8)


def _jsonl(run_dir, rows) -> str:
    path = run_dir / "lines.jsonl"
    path.write_text("".join(json.dumps({"step": r["_step"], "data": r}) + "\n" for r in rows))
    return str(path)


def _same_records(a, b) -> bool:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], float):
                assert x[k] == pytest.approx(y[k], rel=1e-12), k
            else:
                assert x[k] == y[k], k
    return True


def test_trainer_state_gives_n_star_and_r_n_without_timing(reference):
    """A trainer_state.json without step_time (TRL before the metric): N* and r_N as the
    known answer, no T or r_q, and the import and the report say so."""
    d, ref, want = reference
    paths = fx.write_trainer_state(ref, os.path.join(d, "trl"), step_time=False)
    assert sources.detect_source(paths[0]) == "trainer_state"
    km = importers.load_keymap("trl")
    km["lr_rule"] = {"config": "lr_rule"}
    report = importers.import_runs(
        paths,
        os.path.join(d, "imp_trl"),
        km,
        TARGET,
        overrides={"world_size": fx.TRL_WORLD_SIZE},
    )
    assert len(report.untimed) == len(paths)
    assert any("N* and r_N only" in line for line in report.lines())
    got = answer(report.sweep_dir)
    assert_same(got, want, timed=False)
    assert all(v[1] is None and v[3] is None for v in got["keys"].values())
    raw = artifacts.read_json(os.path.join(report.sweep_dir, artifacts.SWEEP_FILE))
    assert len(raw["imported"]["untimed_runs"]) == len(paths)


def test_trl_step_time_gives_the_known_answer_timed(reference):
    """TRL 1.16 logs step_time: trainer_state.json (transformers' TrainerState) with TRL's
    own GRPOConfig arguments gives N*, T, r_N, r_q, the verdicts and the plan."""
    d, ref, want = reference
    paths = fx.write_trainer_state(ref, os.path.join(d, "trl_timed"))
    km = importers.load_keymap("trl")
    km["lr_rule"] = {"config": "lr_rule"}
    out = os.path.join(d, "imp_trl_timed")
    report = importers.import_runs(
        paths, out, km, TARGET, overrides={"world_size": fx.TRL_WORLD_SIZE}
    )
    assert not report.untimed
    assert_same(answer(report.sweep_dir), want)


@pytest.mark.slow  # 21 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_trl_batch_needs_the_process_count(reference, tmp_path):
    """Without world_size the TRL batch is per-device x accumulation (1 process): a
    whole-number check catches a G that does not divide it, naming run, file and key."""
    d, ref, _ = reference
    paths = fx.write_trainer_state(ref, os.path.join(d, "trl_b"))
    args_path = os.path.join(paths[0], "training_args.json")
    args = json.load(open(args_path))
    del args["num_generations"]
    json.dump(args, open(args_path, "w"))
    with pytest.raises(importers.ImportProblem) as e:
        importers.import_runs(paths[:1], str(tmp_path / "out"), "trl", TARGET)
    msg = str(e.value)
    assert "\n" not in msg
    assert os.path.basename(paths[0]) in msg and "training_args.json" in msg
    assert "num_generations" in msg


def _cli(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, cwd=cwd, env=env
    )


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_missing_accuracy_key_is_one_error_line(reference, tmp_path):
    d, ref, _ = reference
    paths = fx.write_verl_jsonl(ref, str(tmp_path / "verl"))
    lines = open(paths[0]).read().replace(fx.EVAL_KEY_VERL, "val-core/other").splitlines()
    open(paths[0], "w").write("\n".join(lines) + "\n")
    res = _cli(
        "experiments.import_runs",
        f"--runs={paths[0]}",
        f"--out={tmp_path / 'out'}",
        "--keymap=verl",
        "--target=0.8",
        "--noreport",
        cwd=os.getcwd(),
    )
    assert res.returncode == 1
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: run P8_G8_sqrt_s0: ")
    assert paths[0] in err[0] and "eval_accuracy" in err[0] and "val-core/" in err[0]
    assert not os.path.exists(tmp_path / "out" / "sweep.json")


@pytest.mark.slow  # 18 s on a loaded 2-core machine
def test_end_to_end_import_then_figures_and_plan(reference, tmp_path):
    """One command imports a folder of verl runs; figures and plan_batch run unchanged
    on it and recommend what they recommend on the reference sweep."""
    d, ref, want = reference
    fx.write_verl_jsonl(ref, str(tmp_path / "verl"))
    km = fx.verl_keymap(str(tmp_path))
    out = str(tmp_path / "sweep")
    res = _cli(
        "experiments.import_runs",
        f"--runs={tmp_path / 'verl' / '*' / 'metrics.jsonl'}",
        f"--out={out}",
        f"--keymap={km}",
        "--target=0.8",
        cwd=os.getcwd(),
    )
    assert res.returncode == 0, res.stderr
    assert f"wrote {out}" in res.stdout
    # One command: the import also wrote the report.
    assert os.path.join(out, "report.md") in res.stdout.splitlines()
    os.remove(os.path.join(out, "report.md"))
    res = _cli("experiments.figures", f"--sweep={out}", "--n_boot=50", cwd=os.getcwd())
    assert res.returncode == 0, res.stderr
    assert os.path.exists(os.path.join(out, "report.md"))
    assert os.path.exists(os.path.join(out, "figures", "time_to_target.png"))
    res = _cli("experiments.plan_batch", f"--sweep={out}", "--n_boot=50", cwd=os.getcwd())
    assert res.returncode == 0, res.stderr
    plan = json.load(open(os.path.join(out, "plan.json")))
    ref_plan = planner.plan_full(time_to_target.analyze_sweep(curves.load_sweep(ref), None, None))
    rec = ref_plan.recommendation
    assert plan["recommendation"] == (None if rec is None else rec.name)


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_print_keymap_is_the_shipped_file():
    res = _cli("experiments.import_runs", "--print_keymap=verl", cwd=os.getcwd())
    assert res.returncode == 0
    shipped = json.load(open(importers.keymap_path("verl")))
    assert json.loads(res.stdout) == shipped
    assert shipped["prompts"] == {"product": ["data.train_batch_size"]}


def test_keymap_pattern_matching_two_keys_is_an_error():
    from rl_batch.analysis.importers.keymap import match_key

    assert match_key(["val-core/*/acc/mean@*"], ["val-core/a/acc/mean@4", "x"]) == (
        "val-core/a/acc/mean@4"
    )
    with pytest.raises(importers.ImportProblem, match="matches 2 keys"):
        match_key(["val-core/*/acc/mean@*"], ["val-core/a/acc/mean@4", "val-core/b/acc/mean@4"])


def test_an_analysis_without_timing_says_n_star_and_r_n_only(reference):
    """Runs that logged no time: T, T/T_ref and the U-shape finding read "no timing"
    (not "not reached", not nan), the plan says why it cannot rank, the report says so."""
    from rl_batch.analysis import report

    d, ref, _ = reference
    paths = fx.write_trainer_state(ref, os.path.join(d, "trl_report"), step_time=False)
    km = importers.load_keymap("trl")
    km["lr_rule"] = {"config": "lr_rule"}
    out = os.path.join(d, "imp_trl_report")
    importers.import_runs(paths, out, km, TARGET, overrides={"world_size": fx.TRL_WORLD_SIZE})
    a = time_to_target.analyze_sweep(curves.load_sweep(out), None, None)
    assert not a.timed
    key = next(k for k in a.stats if k.key == "16x8:sqrt")
    assert a.stats[key].n_star is not None and a.stats[key].time_to_target_s is None
    assert a.ratios[key].r_n is not None and a.ratios[key].r_t is None
    assert a.ratios[key].time_missing_label == time_to_target.NO_TIMING
    ref_ratios = a.ratios[a.reference]
    assert ref_ratios.r_n.mean == 1.0 and ref_ratios.r_q is None  # no "1 (reference)" r_q
    u_shape = next(f for f in findings.study_findings(a, None, TOL) if "U-shaped" in f.name)
    assert (u_shape.verdict, u_shape.note) == (findings.NOT_MEASURED, "no timing in the runs")
    plan = planner.plan_full(a)
    assert plan.recommendation is None and "no timing" in plan.note
    assert plan.verdict == "none (no timing in the runs: no T to rank by (N* and r_N only))"
    from experiments import compare_studies

    text = compare_studies.study(out)[3]
    assert f"- target {TARGET:g}: no timing in the runs (N* and r_N only)" in text
    assert not re.search(r"\bnan\b", text)
    table = planner.format_plan_table(plan)
    assert "not reached" not in table and "| no timing |" in table
    text = report.build_report(a, None, TOL, resamples=0)
    assert "**No timing:** no run logged training time" in text
    assert not re.search(r"\bnan\b", text)
    tables = text.split("## Time to target per configuration")[1]
    assert "not reached" not in tables.split("## Measurement")[0]


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_real_transformers_trainer_run_imports(tmp_path):
    """A few steps of ``transformers.Trainer`` on a tiny random model: its checkpoint's
    trainer_state.json (the Trainer's own writer) imports with TRL's key map."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=1)
    model = transformers.GPT2LMHeadModel(config)
    ids = torch.randint(0, 16, (8, 8))
    data = [{"input_ids": x, "labels": x} for x in ids]
    out = tmp_path / "grpo_s0"
    args = transformers.TrainingArguments(
        output_dir=str(out),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=1,
        eval_on_start=True,
        save_steps=3,
        report_to=[],
        use_cpu=True,
        seed=5,
    )
    trainer = transformers.Trainer(
        model=model,
        args=args,
        train_dataset=data,
        eval_dataset=data[:4],
        compute_metrics=lambda p: {"accuracy": 0.25},
    )
    trainer.train()
    assert os.path.exists(out / "checkpoint-3" / "trainer_state.json")
    (out / "training_args.json").write_text(json.dumps({**args.to_dict(), "num_generations": 2}))

    report = importers.import_runs([str(out)], str(tmp_path / "sweep"), "trl", 0.2)
    (run,) = report.runs
    assert (run.prompts, run.group_size, run.seed) == (2, 2, 5)  # B = 4 x 1 x 1 completions
    updates = [r for r in run.records if r["kind"] == "update"]
    evals = sorted((r for r in run.records if r["kind"] == "eval"), key=lambda r: r["step"])
    assert [r["responses_cum"] for r in updates] == [4.0, 8.0, 12.0]
    assert [(r["step"], r["responses_cum"], r["eval_accuracy"]) for r in evals] == [
        (0, 0.0, 0.25),
        (1, 4.0, 0.25),
        (2, 8.0, 0.25),
        (3, 12.0, 0.25),
    ]
    assert all(r["grad_norm"] > 0 and r["lr"] > 0 for r in updates)
    assert not run.timed
    summary = artifacts.read_json(str(tmp_path / "sweep" / "runs" / "grpo_s0" / "summary.json"))
    assert summary["n_star"] == 0.0 and summary["q"] is None  # 0.25 >= 0.2 at the start


def test_the_importer_never_imports_jax():
    code = (
        "import sys, experiments.import_runs\n"
        "from rl_batch.analysis.importers import convert, sources, sweep\n"
        "bad = [m for m in ('jax', 'flax', 'optax') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_elapsed_seconds_less_validation_give_the_training_time(reference, tmp_path):
    """Time from a cumulative clock (W&B's ``_runtime``) that also counts start-up and
    validation: zeroed one mean update before the first, validation taken out, it gives
    the reference run's training seconds at every update."""
    from rl_batch.analysis.importers import convert

    d, ref, _ = reference
    name, entry, records = fx.reference_runs(ref)[0]
    startup_s, clock, rows = 5.0, 5.0, []
    for s, data in fx.verl_rows(records):
        clock += data.get("timing_s/step", 0.0) + data.get("timing_s/testing", 0.0)
        rows.append({"step": s, "data": {**data, "_runtime": clock}})
        rows[-1]["data"].pop("timing_s/step", None)  # no per-step key: the clock is used
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "config.json").write_text(json.dumps(fx.verl_config(entry)))
    km = importers.load_keymap("verl")
    km["time"] = {"elapsed": ["_runtime"], "exclude": ["timing_s/testing"]}
    run = convert.convert_run(name, str(path), sources.read_source(str(path)), km, {})
    got = [r["time_train_cum_s"] for r in run.records if r["kind"] == "update"]
    want = [r["time_train_cum_s"] for r in records if r["kind"] == "update"]
    assert got == pytest.approx(want, rel=1e-9)
    assert clock - got[-1] > startup_s  # start-up and validation were on the clock
