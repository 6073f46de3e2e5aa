"""Flags a command would ignore, or a mistake it would end in a traceback, are one line.

Each command runs from a directory outside the checkout (as a new user's would), through
``experiments.cli.run``; every case fails before any compute, so each costs a start-up.
docs/errors.md lists the messages.
"""

import os
import subprocess
import sys

import pytest

from rl_batch import artifacts
from tests.run_fixtures import tiny_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_command(args, cwd, **env):
    """``python -m <args>`` from ``cwd`` with the checkout importable: (rc, stdout, stderr)."""
    env = dict(
        os.environ, JAX_PLATFORMS="cpu", **env,
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line(args, cwd, expected):
    """The command exits 1 with exactly one stderr line ``error: ...`` holding ``expected``."""
    rc, _, err = run_command(args, cwd)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1, (args, rc, lines[-20:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, lines[-20:])
    assert expected in lines[0], (args, lines[0])


CPU_CONFIG = "experiments/configs/grpo_cpu.py"


@pytest.mark.parametrize(
    "module", ["experiments.train", "experiments.grpo_sweep", "experiments.plan_memory"]
)
@pytest.mark.slow  # 10 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_an_unknown_field_with_an_explicit_config_is_one_line(tmp_path, module):
    args = [module, f"--config={CPU_CONFIG}", "--config.sampling.engin=continuous"]
    if module == "experiments.grpo_sweep":
        args.append("--list_runs")
    assert_one_line(
        args, tmp_path, "--config.sampling.engin: the config has no field 'engin'; Did you mean"
    )


def test_config_json_beside_config_is_refused(tmp_path):
    config_json = str(tmp_path / "config.json")
    artifacts.write_json_atomic(config_json, tiny_run_config(f"{tmp_path}/r").to_dict())
    args = ["experiments.train", f"--config_json={config_json}", "--config=ppo_cpu"]
    assert_one_line(args, tmp_path, "--config and --config_json both give the run config")


def test_a_sweep_field_given_to_train_is_refused(tmp_path):
    args = ["experiments.train", f"--config={CPU_CONFIG}", "--config.sweep.prompts=2,4"]
    args.append(f"--config.run_dir={tmp_path}/r")
    assert_one_line(args, tmp_path, "--config.sweep.prompts: train runs one configuration")


@pytest.mark.parametrize("value", ["grpo_cpu", "grpo_cpu.py", CPU_CONFIG])
@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_packaged_config_is_found_by_name_from_any_directory(tmp_path, value):
    rc, out, err = run_command(
        ["experiments.train", f"--config={value}", "--config.prompts=8", "--print_config"],
        tmp_path,
    )
    assert rc == 0, err[-2000:]
    assert "prompts: 8" in out.splitlines() and out.splitlines()[-1].startswith("# effective LR")


def test_a_missing_config_file_is_still_one_line(tmp_path):
    assert_one_line(
        ["experiments.train", "--config=nowhere/my_config.py", "--print_config"],
        tmp_path,
        "No such file or directory: 'nowhere/my_config.py'",
    )
