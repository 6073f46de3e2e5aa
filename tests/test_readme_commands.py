"""Every command the README shows is run here or by CI (``.ci/run``).

The README's commands are its ``bash`` blocks and its inline spans that start with a
program (``python -m ...``, ``pip ...``). Each ``python -m`` command of the project is
parsed by the program's own flags in a child process (config overrides included: an
unknown field or a bad value fails there), without running it; the install and test
commands must be the ones ``.ci/run`` runs; the few others are checked for what they
rely on. A command of another kind fails the first test until it gets a check here.
"""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
PROGRAMS = ("python -m ", "pip ", "bash ", "ruff ", "tensorboard ", "JAX=")
CI_TEST = (
    'pip install -e ".[test]" -c requirements/lock.txt && '
    "python -m pytest -q -n 2 --dist loadfile tests"
)
# Placeholders the README writes for the user's own values, and what parses in their place.
PLACEHOLDERS = {"--config=...": "--config=experiments/configs/grpo_study.py", "=N": "=1"}


def readme_commands(text: str) -> list[str]:
    """The README's command lines: bash blocks (continuations joined, comments dropped)
    and inline code spans that start with a program."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(shlex.split(line, comments=True, posix=False))
            if line:
                commands.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for span in re.findall(r"`([^`]+)`", prose):
        span = " ".join(span.split())
        if span.startswith(PROGRAMS):
            commands.append(span)
    return commands


def split_and(command: str) -> list[str]:
    return [part.strip() for part in command.split("&&")]


def module_invocations(commands: list[str]) -> dict[str, list[list[str]]]:
    """``{module: [argv, ...]}`` of every ``python -m`` of this project's programs, one
    argv per alternative of ``a|b`` values and without ``[optional]`` brackets."""
    out: dict[str, list[list[str]]] = {}
    for command in commands:
        for part in split_and(command):
            if not part.startswith("python -m ") or part.split()[2] in ("pytest", "venv"):
                continue
            for old, new in PLACEHOLDERS.items():
                part = part.replace(old, new)
            words = shlex.split(part.replace("[", "").replace("]", ""))
            module, args = words[2], words[3:]
            # A value with alternatives (--part=sampler|update|all) is each of them.
            variants = [[]]
            for arg in args:
                name, _, value = arg.partition("=")
                alts = [f"{name}={v}" for v in value.split("|")] if "|" in value else [arg]
                variants = [v + [a] for v in variants for a in alts]
            out.setdefault(module, []).extend(variants)
    return out


def kind(command: str) -> str:
    """What checks a command (``test_every_command_is_checked``)."""
    parts = split_and(command)
    if command == CI_TEST:
        return "ci test command"
    if all(p.startswith("python -m ") for p in parts):
        return "flags"
    if parts[0] == "pip install -e . -c requirements/lock.txt" and len(parts) == 2:
        return "core install + flags"
    if re.fullmatch(
        r'pip install -e \. -c requirements/lock\.txt "jax\[(cuda12|tpu)\]==\$JAX"', command
    ):
        return "accelerator install"
    return {
        "JAX=$(sed -n 's/^jax==\\([^ ]*\\).*/\\1/p' requirements/lock.txt)": "jax version",
        "pip install tensorboardX tensorboard": "tracking backend",
        "pip install wandb": "tracking backend",
        "tensorboard --logdir runs": "tensorboard viewer",
        "tensorboard --logdir=<sweep_dir>": "tensorboard viewer",
        "pip install -e .": "loose install",
        "python -m venv .venv && source .venv/bin/activate": "venv",
        "bash requirements/lock.sh": "lock refresh",
        "ruff check . && ruff format --check .": "ci lint",
        # tests/test_gpu_check.py runs it at tiny shapes.
        "launch/gpu_check.sh out/": "gpu launcher",
    }.get(command, "unchecked")


COMMANDS = readme_commands(open(README).read())


def test_every_command_is_checked():
    assert len(COMMANDS) > 20, COMMANDS
    unchecked = [c for c in COMMANDS if kind(c) == "unchecked"]
    assert not unchecked, f"README commands with no check in this file: {unchecked}"


def test_the_install_and_test_commands_are_what_ci_runs():
    ci = open(os.path.join(ROOT, ".ci", "run")).read()
    assert CI_TEST in COMMANDS and CI_TEST + "\n" in ci  # byte-identical, as its own line
    assert "python -m ruff check .\n" in ci and "python -m ruff format --check .\n" in ci
    # The core install: .ci/run's core venv installs the same requirement set (+ pytest).
    core = [c for c in COMMANDS if kind(c) == "core install + flags"]
    assert core == ["pip install -e . -c requirements/lock.txt && python -m experiments.grpo_sweep"]
    assert '/bin/pip" install --quiet -e . pytest -c requirements/lock.txt' in ci
    assert os.path.exists(os.path.join(ROOT, "requirements", "lock.sh"))
    assert "install_requires" in open(os.path.join(ROOT, "setup.py")).read()  # pip install -e .


def test_the_accelerator_plugin_pins_the_locked_jax():
    (line,) = [c for c in COMMANDS if kind(c) == "jax version"]
    out = subprocess.run(
        ["bash", "-c", f'{line} && echo "$JAX"'], cwd=ROOT, capture_output=True, text=True
    )
    lock = open(os.path.join(ROOT, "requirements", "lock.txt")).read()
    (pinned,) = re.findall(r"^jax==(\S+)", lock, re.M)
    assert out.returncode == 0 and out.stdout.strip() == pinned
    assert len([c for c in COMMANDS if kind(c) == "accelerator install"]) == 2


def test_the_dashboard_commands_name_the_packages_tracking_imports():
    # tracking writes with tensorboardX and wandb (tests/test_tracking.py runs both); the
    # ``tensorboard`` viewer is the third-party program that reads what they write.
    src = open(os.path.join(ROOT, "rl_batch", "runs", "tracking.py")).read()
    assert "from tensorboardX import" in src and "import wandb" in src
    assert "tensorboard --logdir=<sweep_dir>" in src


# Parses one README command with its program's absl flags, as the program would: a forked
# child sets sys.argv, imports the module (its flags, config overrides included, are
# defined at import, or by ``_define_flags`` for the launch programs), parses, reads the
# config, and for a sweep applies its point-override check. The parent imports the heavy
# libraries once, so each command costs a fork and its module's own import.
_PARSE = r"""
import importlib, json, os, sys
import jax, flax.nnx, rl_batch.runs.run, rl_batch.sweeps.sweep, rl_batch.analysis  # once
errors = []
for module, argv in json.loads(sys.argv[1]):
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        try:
            sys.argv = [module, *argv]
            from absl import flags
            m = importlib.import_module(module)
            if hasattr(m, "_define_flags"):
                m._define_flags()
            flags.FLAGS(sys.argv)
            if "config" in flags.FLAGS:
                flags.FLAGS["config"].value
            if hasattr(m, "sweep_main"):
                m.sweep_main.check_point_overrides(argv)
            message = ""
        except BaseException as e:
            message = f"{type(e).__name__}: {e}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        message = f.read()
    os.wait()
    if message:
        errors.append(f"python -m {module} {' '.join(argv)}: {message}")
print(json.dumps(errors))
"""


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_each_python_command_parses_with_its_programs_flags():
    commands = [(m, argv) for m, argvs in module_invocations(COMMANDS).items() for argv in argvs]
    assert len(commands) > 20
    out = subprocess.run(
        [sys.executable, "-c", _PARSE, json.dumps(commands)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    errors = json.loads(out.stdout.strip().splitlines()[-1])
    assert not errors, "\n".join(errors)


def test_the_gpu_launcher_is_an_executable_script():
    assert "launch/gpu_check.sh out/" in COMMANDS
    assert os.access(os.path.join(ROOT, "launch", "gpu_check.sh"), os.X_OK)
