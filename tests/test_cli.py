"""The command line's answers to bad input: one line naming the flag, before compute."""

import os
import subprocess
import sys

import pytest
from absl import app

from experiments import cli, sweep_main
from rl_batch.sweeps import sweep

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(*args):
    cmd = [sys.executable, "-m", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)


@pytest.mark.slow  # 20 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_an_unknown_config_field_is_one_line_naming_the_flag():
    out = _run("experiments.grpo_sweep", "--config.sweep.promts=32", "--list_runs")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line == (
        "error: --config.sweep.promts: the config has no field 'promts'; "
        'Did you mean "prompts" instead of "promts"?'
    )


@pytest.mark.slow  # 11 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_print_config_shows_the_overrides_and_a_bad_grid_is_one_error():
    out = _run("experiments.train", "--print_config", "--config.target=0.625")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "target: 0.625" in out.stdout
    out = _run("experiments.ppo_sweep", "--config.target=1.5", "--list_runs")
    assert out.returncode != 0 and "Traceback" not in out.stderr
    # Every point has the same problem: said once, not once per point.
    assert out.stderr.count("target=1.5") == 1 and "every point:" in out.stderr


def test_unknown_field_message_without_a_hint():
    try:
        raise AttributeError(KeyError("'foo'"))
    except AttributeError as e:
        msg = cli.unknown_field_message(e, ["prog", "--config.foo=1", "--config.lr=2"])
    assert msg == "--config.foo: the config has no field 'foo'"


def test_a_sweep_refuses_overrides_of_fields_it_sets_per_point():
    sweep_main.check_point_overrides(["prog", "--config.sweep.prompts=8", "--config.lr_ref=1"])
    with pytest.raises(app.UsageError, match="use --config.sweep.prompts"):
        sweep_main.check_point_overrides(["prog", "--config.prompts=32"])
    with pytest.raises(app.UsageError, match="sets seed at every grid point"):
        sweep_main.check_point_overrides(["prog", "--config.seed=3"])


def test_sweep_eta_leaves_out_the_first_point_once_others_finished():
    progress = sweep._Progress(total=5, log=lambda s: None)
    assert progress.eta() == ""
    progress.walls.append(120.0)  # the warm start and compiles ran inside it
    assert progress.eta() == ", sweep ETA 8.0 min"  # 4 left at 120 s: all it knows
    progress.walls += [30.0, 30.0]
    assert progress.eta() == ", sweep ETA 1.0 min"  # 2 left at 30 s, not at 60 s


def test_sweep_eta_of_an_extension_round_counts_only_its_new_points():
    """A grid extension re-lists the whole grid (84 finished + 12 new, two at a time):
    the ETA is the new points left, not the finished ones skipped."""
    progress = sweep._Progress(total=96, log=lambda s: None, concurrent=2)
    progress.skipped = 84
    progress.walls += [90.0, 60.0]  # (the first built the caches)
    assert progress.eta() == ", sweep ETA 5.0 min"  # (96 - 84 - 2) / 2 = 5 waves of 60 s


def test_list_runs_checks_the_reference_as_the_sweep_does(tmp_path):
    from experiments.configs import grpo_cpu

    c = grpo_cpu.get_config()
    c.sweep.prompts, c.sweep.extra_points = "32,64", ""
    with pytest.raises(ValueError, match="sweep.reference='8x8:sqrt' is not a point"):
        sweep.list_runs(c, str(tmp_path))


def test_help_config_lists_every_field_with_its_value_and_comment():
    out = _run("experiments.train", "--help_config", "--config.target=0.625")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    fields = [line.split("=", 1)[0] for line in lines if line.startswith("--config.")]
    from experiments.configs import base

    expected = {f"--config.{f}" for f, _ in cli._leaves(base.run_config())}
    assert set(fields) == expected
    i = lines.index("--config.target=0.625")  # the value after the override
    assert lines[i + 1] == "    the validation accuracy (``eval_metric``) to reach."
    # Every field a section class defines is explained (its docstring or its comment).
    explained = {
        lines[j].split("=", 1)[0]
        for j in range(len(lines) - 1)
        if lines[j].startswith("--config.") and lines[j + 1].startswith("    ")
    }
    documented = set()
    for prefix, cls in base.SECTIONS:
        documented |= {f"--config.{f}" for f in cli.section_docs(cls, prefix)}
    from_sections = documented & expected
    assert from_sections - explained == set()
    assert len(from_sections) > 100
    assert "--config.tracking='jsonl'" in lines and "--config.task.eval_fraction=0.0" in lines


def test_field_comments_take_the_lines_above_and_the_trailing_comment(tmp_path):
    path = tmp_path / "conf.py"
    path.write_text(
        "def get_config():\n"
        "    c = ConfigDict()\n"
        "    # Two lines\n"
        "    # above.\n"
        "    c.a.b = 1  # and after\n"
        "    c.d = 'x#y'\n"
        "    c.e = 2  # only after\n"
    )
    comments = cli.field_comments(str(path))
    assert comments == {"a.b": "Two lines above. and after", "e": "only after"}
