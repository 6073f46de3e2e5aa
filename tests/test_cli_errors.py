"""Every command prints one line ``error: ...`` for a mistake, and exits non-zero.

Each command of the README runs on a bad flag, value, file or directory through
``experiments.cli.run`` (the shared error path; docs/errors.md). The errors fire before
any compute, so the whole file costs the commands' start-up.
"""

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from rl_batch import artifacts
from rl_batch.locks import DirectoryLock
from rl_batch.runs.checkpoint import Checkpointer
from tests.run_fixtures import tiny_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cases(tmp):
    """name -> (module and flags, what the one line must say)."""
    config_json = os.path.join(tmp, "config.json")
    artifacts.write_json_atomic(config_json, tiny_run_config(f"{tmp}/work").to_dict())
    train = ["experiments.train", "--quiet", f"--config_json={config_json}"]
    runs_json = os.path.join(tmp, "runs.json")
    artifacts.write_json_atomic(runs_json, [{"name": "p4_g4_sqrt_s0", "overrides": {}}])
    return {
        "lr_rule": (
            [*train, f"--config.run_dir={tmp}/r1", "--config.lr_rule=cube"],
            "lr_rule='cube': unknown LR rule 'cube'",
        ),
        "unknown_field": (
            ["experiments.train", f"--config.run_dir={tmp}/r2", "--config.foo=1"],
            "--config.foo: the config has no field 'foo'",
        ),
        "unknown_nested_field": (
            ["experiments.train", f"--config.run_dir={tmp}/r2", "--config.task.foo=1"],
            "--config.task.foo: the config has no field 'foo'",
        ),
        "not_an_int": (
            ["experiments.train", "--config.prompts=abc"],
            "--config.prompts=abc: invalid literal for int()",
        ),
        "missing_reward_file": (
            [*train, f"--config.run_dir={tmp}/r3", f"--config.task.reward_fn={tmp}/no.py:f"],
            f"task.reward_fn='{tmp}/no.py:f': no such file",
        ),
        "print_config_validates": (
            ["experiments.train", "--print_config", "--config.prompts=-3"],
            "prompts=-3: must be >= 1",
        ),
        "json_override_of_a_missing_field": (
            [*train, "--config.sweep.prompts=2"],
            f"--config.sweep.prompts: the config of {config_json} has no field 'sweep'",
        ),
        "locked_run_dir": (
            [*train, f"--config.run_dir={tmp}/locked"],
            f"{tmp}/locked is in use by",
        ),
        "checkpoint_of_another_model": (
            [*train, f"--config.run_dir={tmp}/other", "--resume"],
            f"checkpoint {tmp}/other/checkpoints/1 does not match the model",
        ),
        "sweep_bad_grid": (
            ["experiments.grpo_sweep", "--config.target=1.5", "--list_runs"],
            "target=1.5: must be an accuracy in (0, 1]",
        ),
        "figures_no_sweep": (
            ["experiments.figures", f"--sweep={tmp}/nothing"],
            f"{tmp}/nothing/sweep.json: no sweep file",
        ),
        "plan_batch_no_sweep": (
            ["experiments.plan_batch", f"--sweep={tmp}/nothing"],
            f"{tmp}/nothing/sweep.json: no sweep file",
        ),
        "collect_no_source": (
            ["launch.collect", f"--sweep_dir={tmp}/merged", f"--from={tmp}/nothing"],
            f"--from '{tmp}/nothing': no such directory",
        ),
        "make_jobs_bad_scheduler": (
            ["launch.make_jobs", "--sweep_config=c.py", f"--sweep_dir={tmp}/s", "--scheduler=pbs"],
            "flag --scheduler=pbs: value should be one of",
        ),
        "make_jobs_grid_flag_with_runs_json": (
            [
                "launch.make_jobs",
                "--sweep_config=c.py",
                f"--sweep_dir={tmp}/s",
                f"--runs_json={runs_json}",
                "--extra_flag=--config.sweep.prompts=2,4",
            ],
            "--extra_flag=--config.sweep.prompts=2,4 changes the grid, which --runs_json fixes",
        ),  # fmt: skip
        "export_hf_no_run": (
            ["experiments.export_hf", f"--run_dir={tmp}/nothing", f"--out={tmp}/hf"],
            f"{tmp}/nothing is not a run directory",
        ),
        "pretrain_unknown_task": (
            ["experiments.pretrain", f"--config.work_dir={tmp}/work", "--config.task.name=sudoku"],
            "task.name='sudoku': known tasks are",
        ),
    }


@pytest.mark.slow  # 48 s on a loaded 2-core machine
def test_every_command_says_a_mistake_in_one_line(tmp_path):
    tmp = str(tmp_path)
    cases = _cases(tmp)
    lock = DirectoryLock(f"{tmp}/locked", "run").acquire()  # another writer holds it
    other = Checkpointer(f"{tmp}/other/checkpoints")  # a checkpoint of something else
    other.save(1, {"state": {"w": jnp.zeros(3)}}, {"counters": {}})
    other.close()
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", *args],
            cwd=tmp,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        for name, (args, _) in cases.items()
    }
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=300)
            lines = [line for line in err.splitlines() if line.strip()]
            assert proc.returncode == 1, (name, proc.returncode, lines[-20:])
            assert len(lines) == 1 and lines[0].startswith("error: "), (name, lines[-20:])
            assert cases[name][1] in lines[0], (name, lines[0])
            assert "error" not in out.lower(), (name, out[-2000:])  # (stdout: progress only)
    finally:
        lock.release()
        for proc in procs.values():
            proc.kill()


def test_a_config_json_takes_the_config_flags_and_print_config_shows_the_effective_lr(tmp_path):
    config_json = str(tmp_path / "config.json")
    artifacts.write_json_atomic(config_json, tiny_run_config(str(tmp_path / "work"), "a").to_dict())
    cmd = [sys.executable, "-m", "experiments.train", f"--config_json={config_json}"]
    cmd += [f"--config.run_dir={tmp_path}/b", "--config.seed=7", "--config.prompts=8"]
    out = subprocess.run(
        [*cmd, "--print_config"], cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert f"run_dir: {tmp_path}/b" in lines and "seed: 7" in lines and "prompts: 8" in lines
    # lr_ref 1e-3 at B_ref 16 under the sqrt rule: B = 8 x 4 = 32 trains at 1e-3 * sqrt(2).
    assert lines[-1].startswith("# effective LR: 0.00141421 (rule=sqrt")
    assert "  lr: 0.0014142135623730952" in lines  # derived.lr
    assert json.load(open(config_json))["seed"] == 0  # the file is only read
