"""experiments.value_bound: the ceiling of a critic's explained variance, by hand."""

import os
import subprocess
import sys

import pytest

from experiments import value_bound

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bound_by_hand():
    # m = 0.5: Var p = 0.125 of m (1 - m) = 0.25.
    assert value_bound.explained_variance_bound([1.0, 0.5, 0.0, 0.5])["bound"] == 0.5
    # Two groups at 0.9 and 0.1: the group explains all of Var p = 0.16 (0.64).
    b = value_bound.explained_variance_bound([0.9, 0.1, 0.9, 0.1], ["a", "b", "a", "b"])
    assert b["bound"] == pytest.approx(0.64) and b["group_bound"] == pytest.approx(0.64)
    assert b["groups"] == {"a": (2, pytest.approx(0.9)), "b": (2, pytest.approx(0.1))}
    # A group label that says nothing explains nothing.
    b = value_bound.explained_variance_bound([0.9, 0.1, 0.9, 0.1], ["a", "a", "b", "b"])
    assert b["group_bound"] == pytest.approx(0.0) and b["bound"] == pytest.approx(0.64)


def test_the_command_on_a_tiny_random_policy(tmp_path):
    args = [
        "--config=experiments/configs/grpo_cpu.py",
        f"--config.work_dir={tmp_path}",
        "--config.init.source=scratch",
        "--config.task.kwargs.n_digits=2",
        "--config.task.n_train=64",
        "--config.task.n_validation=16",
        "--config.eval_prompts=16",
        "--config.eval_ref_prompts=16",
        "--config.model.overrides.num_layers=1",
        "--config.model.overrides.hidden_size=32",
    ]
    cmd = [sys.executable, "-m", "experiments.value_bound", *args]
    out = subprocess.run(cmd + ["--group_by="], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "task addition: 16 validation prompts, mean p_ref 0.0" in out.stdout
    assert "explained-variance ceiling" in out.stdout
    bad = subprocess.run(cmd + ["--group_by=op"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert bad.returncode != 0 and "--group_by='op': not a key of every example's meta" in (
        bad.stderr
    )
