"""The analysis cross-checks each run (``curves.check_run``) and leaves out what does not add up.

Runs are synthetic (``tests.analysis_fixtures``) with the ``summary.json`` the run loop
writes (``rl_batch.runs.run._summary`` on the same metrics lines), then damaged the ways
issue 36 found: a deleted final or middle evaluation, duplicated lines, a summary that
says another status, and unreadable files. Each damaged run is excluded with a named
reason that report.md shows; the other runs are analysed as before.
"""

import json
import os
import subprocess
import sys

import analysis_fixtures as fx
import pytest
from ml_collections import ConfigDict

from rl_batch import artifacts
from rl_batch.analysis import curves, report
from rl_batch.analysis import time_to_target as ttt
from rl_batch.runs import run as run_lib
from rl_batch.runs.accounting import Counters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = ((8, 8, "sqrt", 1.0), (16, 8, "sqrt", 1.0))
DAMAGED = fx.run_name(16, 8, "sqrt", 1)


def _with_run_summaries(sweep_dir):
    """Gives each run the config.json fields and the summary.json a real run writes."""
    for name in os.listdir(os.path.join(sweep_dir, artifacts.RUNS_DIR)):
        run_dir = os.path.join(sweep_dir, artifacts.RUNS_DIR, name)
        config_path = os.path.join(run_dir, artifacts.CONFIG_FILE)
        config = artifacts.read_json(config_path)
        config.update(target=fx.TARGET, target_crossing="update", eval_every_responses=256)
        config["target_band_lo"] = 0.6
        artifacts.write_json_atomic(config_path, config)
        records = artifacts.read_metrics(run_dir)
        last = [r for r in records if r["kind"] == "update"][-1]
        counters = Counters(step=last["step"], responses_cum=last["responses_cum"])
        summary = run_lib._summary(
            ConfigDict(config | {"name": name}), counters, records, "finished"
        )
        artifacts.write_json_atomic(os.path.join(run_dir, artifacts.SUMMARY_FILE), summary)
    return sweep_dir


@pytest.fixture
def sweep_dir(tmp_path):
    return _with_run_summaries(fx.write_sweep(str(tmp_path / "s"), configs=CONFIGS))


def _metrics_path(sweep_dir, name=DAMAGED):
    return os.path.join(sweep_dir, artifacts.RUNS_DIR, name, artifacts.METRICS_FILE)


def _edit_lines(sweep_dir, edit, name=DAMAGED):
    path = _metrics_path(sweep_dir, name)
    lines = open(path).readlines()
    open(path, "w").writelines(edit(lines))


def _eval_indices(lines):
    return [i for i, line in enumerate(lines) if json.loads(line)["kind"] == "eval"]


def _excluded(sweep_dir):
    """(analysis, {run name: reason}, report text)."""
    analysis = ttt.analyze_sweep(curves.load_sweep(sweep_dir), n_boot=20)
    text = report.build_report(analysis, resamples=0)
    return analysis, dict(analysis.excluded), text


def _assert_excluded_in_report(sweep_dir, *reason_parts):
    analysis, excluded, text = _excluded(sweep_dir)
    assert list(excluded) == [DAMAGED]
    for part in reason_parts:
        assert part in excluded[DAMAGED]
    assert DAMAGED not in analysis.targets
    assert "3 runs used, 1 excluded." in text
    assert f"| {DAMAGED} | {excluded[DAMAGED]} |" in text
    return excluded[DAMAGED]


def test_whole_runs_with_their_summaries_pass_every_check(sweep_dir):
    sweep = curves.load_sweep(sweep_dir)
    assert sweep.excluded == () and len(sweep.runs) == 4
    assert all(r.problems == () and r.summary["reached"] for r in sweep.runs)
    assert ttt.analyze_sweep(sweep, n_boot=20).excluded == ()


@pytest.mark.slow  # 49 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_real_run_extended_by_a_resume_passes_every_check(tmp_path):
    from tests.run_fixtures import tiny_run_config

    work, run_dir = str(tmp_path / "work"), str(tmp_path / "run")
    for budget in (48, 112):  # the second call resumes the finished run with a longer runway
        config = tiny_run_config(work, run_dir, budget_responses=budget, eval_every_responses=24)
        summary = run_lib.run(config, progress=False)
    run = curves.load_run(run_dir)
    assert summary["status"] == "finished" and run.problems == ()
    evals = [e["responses_cum"] for e in artifacts.read_metrics(run_dir, "eval")]
    assert evals == [0, 32, 48, 80, 112]  # the cadence the check expects, across the resume


def test_a_deleted_final_evaluation_is_excluded(sweep_dir):
    _edit_lines(sweep_dir, lambda lines: lines[: _eval_indices(lines)[-1]])
    why = _assert_excluded_in_report(sweep_dir, "metrics disagree with summary.json")
    assert "final_eval_accuracy" in why


def test_a_deleted_middle_evaluation_is_excluded(sweep_dir):
    def drop_middle_eval(lines):
        i = _eval_indices(lines)[5]
        return lines[:i] + lines[i + 1 :]

    _edit_lines(sweep_dir, drop_middle_eval)
    why = _assert_excluded_in_report(sweep_dir, "evaluation missing: one was due at step")
    # The cadence alone tells, without a summary.json to compare with.
    os.remove(os.path.join(os.path.dirname(_metrics_path(sweep_dir)), artifacts.SUMMARY_FILE))
    assert _excluded(sweep_dir)[1] == {DAMAGED: why}


@pytest.mark.parametrize("kind", ["update", "eval"])
def test_a_duplicated_line_is_excluded(sweep_dir, kind):
    def double(lines):
        i = next(j for j, line in enumerate(lines) if j > 10 and json.loads(line)["kind"] == kind)
        return lines[: i + 1] + [lines[i]] + lines[i + 1 :]

    _edit_lines(sweep_dir, double)
    what = "update steps not consecutive" if kind == "update" else "evaluation steps not"
    _assert_excluded_in_report(sweep_dir, what, "comes twice")


def test_a_summary_with_another_status_or_answer_is_excluded(sweep_dir):
    path = os.path.join(os.path.dirname(_metrics_path(sweep_dir)), artifacts.SUMMARY_FILE)
    summary = artifacts.read_json(path)
    artifacts.write_json_atomic(path, {**summary, "n_star": summary["n_star"] + 64})
    _assert_excluded_in_report(sweep_dir, "metrics disagree with summary.json (reached True")
    artifacts.write_json_atomic(path, {**summary, "status": "running"})
    _assert_excluded_in_report(sweep_dir, "finished in sweep.json, but", "says 'running'")


@pytest.mark.parametrize(
    "file, text",
    [
        (artifacts.METRICS_FILE, None),  # a garbled line in the middle
        (artifacts.CONFIG_FILE, '{"algo": "grpo", '),
        (artifacts.SUMMARY_FILE, "[1, 2]"),
    ],
)
def test_an_unreadable_file_excludes_its_run_not_the_sweep(sweep_dir, file, text):
    if text is None:
        _edit_lines(sweep_dir, lambda lines: lines[:20] + ["{not json\n"] + lines[20:])
    else:
        with open(os.path.join(os.path.dirname(_metrics_path(sweep_dir)), file), "w") as f:
            f.write(text)
    why = _assert_excluded_in_report(sweep_dir, "unreadable: ", file)
    assert "\n" not in why


def test_no_usable_runs_names_the_excluded_ones(sweep_dir):
    for prompts in (8, 16):
        for seed in (0, 1):
            name = fx.run_name(prompts, 8, "sqrt", seed)
            _edit_lines(sweep_dir, lambda lines: lines[:-1], name=name)
    with pytest.raises(ValueError) as err:
        ttt.analyze_sweep(curves.load_sweep(sweep_dir), n_boot=20)
    message = str(err.value)
    assert "no usable runs (4 excluded: P8_G8_sqrt_s0 (evaluation missing" in message
    assert "\n" not in message


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_sweep_whose_points_all_fail_prints_two_lines(tmp_path):
    """experiments.grpo_sweep where every point fails (no compute): the analysis refuses
    in one line, and the failed-runs line still comes; no traceback from the analysis."""
    sweep_dir, work = str(tmp_path / "sweep"), str(tmp_path / "work")
    script = (
        "import sys\n"
        f"sys.argv = ['grpo_sweep', '--config=tests/crash_sweep_config.py', "
        f"'--config.work_dir={work}', '--sweep_dir={sweep_dir}', '--quiet']\n"
        "from absl import app\n"
        "from rl_batch.sweeps import sweep\n"
        "real = sweep.run_sweep\n"
        "def boom(config):\n"
        "    raise RuntimeError('no compute here')\n"
        "def run_sweep(config, sweep_dir, **kw):\n"
        "    return real(config, sweep_dir, **{**kw, 'run_fn': boom})\n"
        "sweep.run_sweep = run_sweep\n"
        "from experiments import grpo_sweep\n"
        "app.run(grpo_sweep.main)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert "ValueError" not in out.stderr.replace("RuntimeError", ""), out.stderr[-3000:]
    error, failed = out.stderr.strip().splitlines()[-2:]
    assert error.startswith("error: analysis not written: sweep ") and "no usable runs" in error
    assert failed.startswith("2 run(s) failed: ['p4_g4_sqrt_s0', 'p4_g4_fixed_s0']"), failed


def _cut_without_summary(sweep_dir, edit):
    """The damaged run's metrics edited and its summary.json removed; its config.json
    has the budget a real run's has."""
    _edit_lines(sweep_dir, edit)
    run_dir = os.path.dirname(_metrics_path(sweep_dir))
    os.remove(os.path.join(run_dir, artifacts.SUMMARY_FILE))
    config = artifacts.read_json(os.path.join(run_dir, artifacts.CONFIG_FILE))
    config["budget_responses"] = fx.BUDGET
    artifacts.write_json_atomic(os.path.join(run_dir, artifacts.CONFIG_FILE), config)


def _first_eval_at_target(lines):
    evals = _eval_indices(lines)
    return next(i for i in evals if json.loads(lines[i])["eval_accuracy"] >= fx.TARGET)


def test_a_run_cut_short_without_its_summary_is_incomplete_not_unreached(sweep_dir):
    # Without summary.json, a run whose metrics end (at an evaluation: the cadence holds)
    # before its budget (config.json) and below the target read as "not reached" and took
    # its configuration's N* away (issue 48 D9): it is excluded as incomplete.
    def before_the_target(lines):
        evals = _eval_indices(lines)
        return lines[: evals[evals.index(_first_eval_at_target(lines)) - 1] + 1]

    _cut_without_summary(sweep_dir, before_the_target)
    why = _assert_excluded_in_report(sweep_dir, "incomplete: no summary.json, and the metrics")
    assert "before the budget of" in why and "without reaching the target" in why


def test_a_run_without_its_summary_cut_after_the_target_keeps_its_n_star(sweep_dir):
    # Cut at an evaluation past the target: N* is in the file, the run is used.
    whole = ttt.analyze_sweep(curves.load_sweep(sweep_dir), n_boot=20).targets[DAMAGED]
    _cut_without_summary(sweep_dir, lambda lines: lines[: _first_eval_at_target(lines) + 1])
    analysis, excluded, _ = _excluded(sweep_dir)
    assert excluded == {} and analysis.targets[DAMAGED].n_star == whole.n_star
