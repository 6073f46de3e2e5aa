r"""Writes the job script that runs every point of a sweep grid, one job per point.

The grid comes from the sweep program itself (``python -m experiments.grpo_sweep
--config=... --list_runs``) or from a JSON file (``--runs_json``). Each point is run with
``--only=RUN_NAME``, which writes ``SWEEP_DIR/runs/RUN_NAME/`` and nothing else, so the jobs
never race on a shared file; ``python -m launch.collect`` rebuilds ``sweep.json`` afterwards.

Schedulers:

- ``slurm``: one ``sbatch`` job array, one array task per grid point. Each task gets its own
  allocation of ``--nodes`` nodes and runs one JAX process per node with ``srun``; process 0
  (the coordinator) is on the allocation's first node.
- ``tpu``: a bash script for a workstation that runs the points one after another on a
  Cloud TPU VM slice through ``launch/tpu_vm.sh``.
- ``local``: a bash script that runs the points one after another on this machine.

Usage::

    python -m launch.make_jobs --sweep_config=experiments/configs/grpo_gpu.py \
        --sweep_dir=/shared/sweeps/grpo --scheduler=slurm --nodes=2 --gpus_per_node=8 \
        --time=08:00:00 --partition=gpu --account=myproj
    sbatch /shared/sweeps/grpo/jobs/sweep.sbatch

Besides the script, ``OUT_DIR/runs.json`` maps each array index (or loop index) to its run
name and overrides; the printed ``collect:`` command passes it to ``launch.collect
--runs_json`` so that grid points without a run are reported as missing. The reference
configuration needs no index: each job records it in ``runs/RUN_NAME/sweep_point.json``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHEDULERS = ("slurm", "tpu", "local")
DISTRIBUTED_MODES = ("flags", "env", "auto")
SCRIPT_NAMES = {"slurm": "sweep.sbatch", "tpu": "tpu_sweep.sh", "local": "local_sweep.sh"}
RUNS_INDEX_FILE = "runs.json"

# Run names become directory names and bash words; keep them to a safe alphabet.
_RUN_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._,=+-]*$")
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def sweep_module_for(sweep_config: str, algo: str | None = None) -> str:
    """Returns the sweep program's module for a config file.

    Args:
      sweep_config: path of the sweep config file.
      algo: ``"grpo"`` or ``"ppo"``; when None, ``"ppo"`` if the config file's name
        contains "ppo", else ``"grpo"``.

    Returns:
      ``"experiments.grpo_sweep"`` or ``"experiments.ppo_sweep"``.
    """
    if algo is None:
        algo = "ppo" if "ppo" in os.path.basename(sweep_config) else "grpo"
    if algo not in ("grpo", "ppo"):
        raise ValueError(f"algo must be 'grpo' or 'ppo', got {algo!r}")
    return f"experiments.{algo}_sweep"


def parse_runs(text: str, source: str) -> list[dict[str, Any]]:
    """Parses and validates a grid: a JSON list of ``{"name", "overrides"}``.

    Accepts the ``--list_runs`` output (the list may follow log lines, on a line of its
    own or spread over several lines) or a ``runs.json`` index written by this module
    (``{"runs": [...]}``).

    Args:
      text: the JSON text.
      source: where the text came from, for error messages.

    Returns:
      The grid points, each ``{"name": str, "overrides": dict}``, in grid order.
    """
    obj = _parse_json_list_or_index(text, source)
    if isinstance(obj, dict):
        obj = obj.get("runs")
    if not isinstance(obj, list):
        raise ValueError(f"{source}: expected a JSON list of runs, got {type(obj).__name__}")
    runs = []
    seen = set()
    for i, point in enumerate(obj):
        if not isinstance(point, dict) or not isinstance(point.get("name"), str):
            raise ValueError(f"{source}: run #{i} is not an object with a string 'name': {point!r}")
        name = point["name"]
        if not _RUN_NAME_RE.match(name):
            raise ValueError(
                f"{source}: run #{i} has name {name!r}; run names must match "
                f"{_RUN_NAME_RE.pattern} (they become directory names and shell words)"
            )
        if name in seen:
            raise ValueError(f"{source}: run name {name!r} appears twice")
        seen.add(name)
        overrides = point.get("overrides", {})
        if not isinstance(overrides, dict):
            raise ValueError(f"{source}: run {name!r} has non-object overrides {overrides!r}")
        runs.append({"name": name, "overrides": overrides})
    if not runs:
        raise ValueError(f"{source}: the grid is empty")
    return runs


def _parse_json_list_or_index(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    # Log lines before the JSON: parse from the first line that starts a list or object.
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("[", "{")):
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    raise ValueError(f"{source}: no JSON list of runs found in:\n{text[-2000:]}")


def config_overrides(extra_flags: Sequence[str]) -> list[str]:
    """The ``--config.*`` overrides among a point's extra flags (they may change the grid:
    ``--config.sweep.prompts=2,4``), in order."""
    return [f for f in extra_flags if f.startswith("--config.")]


def list_runs(
    sweep_module: str,
    sweep_config: str,
    python: str = sys.executable,
    overrides: Sequence[str] = (),
    sweep_dir: str | None = None,
) -> list[dict[str, Any]]:
    """Asks the sweep program for its grid (``--list_runs``), without running anything.

    Args:
      sweep_module: e.g. ``"experiments.grpo_sweep"``.
      sweep_config: the sweep config file.
      python: the interpreter to run it with.
      overrides: ``--config.*`` flags every point runs with (`config_overrides`): the
        grid listed is the one the points see.
      sweep_dir: the sweep directory the points run in (``--sweep_dir``): a grid
        extension recorded there for this grid is listed, as the points will run it;
        None: the sweep program's default directory.

    Returns:
      The grid points (see `parse_runs`).

    Raises:
      ValueError: the sweep program refused the config (its one-line error, or the last
        line of what it wrote).
    """
    cmd = [python, "-m", sweep_module, f"--config={sweep_config}", *overrides]
    cmd += [f"--sweep_dir={sweep_dir}"] if sweep_dir else []
    cmd += ["--list_runs"]
    env = dict(os.environ)
    # Listing needs no accelerator; keep it from grabbing one a running job may hold.
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = REPO_DIR + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        last = lines[-1].removeprefix("error: ") if lines else "no output"
        raise ValueError(
            f"listing the grid failed ({shlex.join(cmd)} exited with status "
            f"{proc.returncode}): {last}"
        )
    return parse_runs(proc.stdout, shlex.join(cmd))


def _bash_array(name: str, words: Sequence[str]) -> str:
    lines = [f"{name}=("]
    lines += [f"  {shlex.quote(w)}  # {i}" for i, w in enumerate(words)]
    lines.append(")")
    return "\n".join(lines)


def _point_args(
    sweep_module: str, sweep_config: str, sweep_dir: str, extra_flags: Sequence[str]
) -> list[str]:
    """Everything after the interpreter in a grid point's command line, less --only."""
    if not _MODULE_RE.match(sweep_module):
        raise ValueError(f"sweep_module {sweep_module!r} is not a dotted Python module name")
    return ["-m", sweep_module, f"--config={sweep_config}", f"--sweep_dir={sweep_dir}"] + list(
        extra_flags
    )


def slurm_script(
    runs: Sequence[dict[str, Any]],
    *,
    sweep_module: str,
    sweep_config: str,
    sweep_dir: str,
    nodes: int,
    gpus_per_node: int,
    time: str,
    tasks_per_node: int = 1,
    partition: str | None = None,
    account: str | None = None,
    job_name: str = "rl_batch",
    log_dir: str,
    repo_dir: str = REPO_DIR,
    python: str = "python",
    max_parallel: int = 0,
    port: int = 12321,
    distributed: str = "env",
    cpus_per_task: int = 0,
    sbatch_options: Sequence[str] = (),
    setup: Sequence[str] = (),
    extra_flags: Sequence[str] = (),
) -> str:
    """Returns an ``sbatch`` job-array script with one array task per grid point.

    Array task ``i`` runs ``runs[i]`` on its own allocation of ``nodes`` nodes: ``srun``
    starts one process per node, and process 0 (on the first node of the allocation, from
    ``scontrol show hostnames``) hosts the JAX coordinator.

    Args:
      runs: the grid points, each with a ``"name"``.
      sweep_module: the sweep program, e.g. ``"experiments.grpo_sweep"``.
      sweep_config: its config file (absolute, or relative to ``repo_dir``).
      sweep_dir: the shared sweep directory every task writes its run into.
      nodes: nodes per grid point (JAX processes per run).
      gpus_per_node: GPUs per node; each process drives all of its node's GPUs.
      time: SLURM time limit per array task, e.g. ``"04:00:00"``.
      tasks_per_node: JAX processes per node (``--ntasks-per-node``); 1 (the default) for
        one process driving all of a node's GPUs, more for CPU-only runs or tests (all
        processes of a node then share its devices).
      partition: SLURM partition, or None for the cluster default.
      account: SLURM account, or None.
      job_name: SLURM job name.
      log_dir: directory for the per-task logs (must exist before ``sbatch``).
      repo_dir: the checkout on the cluster; the tasks start there.
      python: the interpreter on the compute nodes.
      max_parallel: at most this many array tasks at once (``%N``); 0 for no limit.
      port: coordinator port base; task ``i`` uses ``port + i % 1000``, so tasks that share
        a node do not collide.
      distributed: how each process learns the coordinator: ``"env"``
        (``RL_BATCH_COORDINATOR``, ``RL_BATCH_NUM_PROCESSES``, ``RL_BATCH_PROCESS_ID``; the
        default, as the sweep programs take no coordinator flags and pass the environment
        on to isolated subprocesses), ``"flags"`` (``--coordinator_address
        --num_processes --process_id``, for programs that define them, e.g.
        ``experiments.train``) or ``"auto"`` (``RL_BATCH_DISTRIBUTED=auto``:
        ``jax.distributed.initialize()`` reads the SLURM environment itself).
      cpus_per_task: ``--cpus-per-task``, 0 to leave it out.
      sbatch_options: further ``#SBATCH`` options, e.g. ``"--exclusive"``.
      setup: shell lines run before the job step (e.g. ``"source ~/venv/bin/activate"``).
      extra_flags: flags appended to every point's command line.

    Returns:
      The script text.
    """
    if nodes < 1 or gpus_per_node < 0:
        raise ValueError(f"need nodes >= 1 and gpus_per_node >= 0, got {nodes}, {gpus_per_node}")
    if tasks_per_node < 1:
        raise ValueError(f"need tasks_per_node >= 1, got {tasks_per_node}")
    if distributed not in DISTRIBUTED_MODES:
        raise ValueError(f"distributed must be one of {DISTRIBUTED_MODES}, got {distributed!r}")
    if not runs:
        raise ValueError("no grid points to launch")
    names = [r["name"] for r in runs]
    array = f"0-{len(names) - 1}" + (f"%{max_parallel}" if max_parallel > 0 else "")
    sbatch = [
        f"--job-name={job_name}",
        f"--array={array}",
        f"--nodes={nodes}",
        f"--ntasks-per-node={tasks_per_node}",
    ]
    if gpus_per_node:
        sbatch.append(f"--gpus-per-node={gpus_per_node}")
    if cpus_per_task:
        sbatch.append(f"--cpus-per-task={cpus_per_task}")
    sbatch.append(f"--time={time}")
    if partition:
        sbatch.append(f"--partition={partition}")
    if account:
        sbatch.append(f"--account={account}")
    sbatch.append(f"--output={os.path.join(log_dir, '%x-%A_%a.out')}")
    sbatch += list(sbatch_options)
    for opt in sbatch:
        if any(c.isspace() for c in opt):
            raise ValueError(f"#SBATCH option {opt!r} contains whitespace")

    # Per-process values ($SLURM_PROCID, $SLURM_NTASKS) must be expanded by each task's own
    # shell, hence the single-quoted `bash -c`; everything fixed is passed to it as "$@".
    if distributed == "flags":
        inner = (
            'exec "$@" --coordinator_address="$RL_BATCH_COORDINATOR" '
            '--num_processes="$SLURM_NTASKS" --process_id="$SLURM_PROCID"'
        )
    elif distributed == "env":
        inner = (
            'RL_BATCH_NUM_PROCESSES="$SLURM_NTASKS" RL_BATCH_PROCESS_ID="$SLURM_PROCID" exec "$@"'
        )
    else:
        inner = 'RL_BATCH_DISTRIBUTED=auto exec "$@"'
    point_args = _point_args(sweep_module, sweep_config, sweep_dir, extra_flags)
    command = " ".join(
        [shlex.quote(python)] + [shlex.quote(a) for a in point_args] + ['--only="$RUN_NAME"']
    )

    lines = [
        "#!/bin/bash",
        f"# Generated by launch/make_jobs.py: {len(names)} grid point(s) of {sweep_config},",
        f"# one array task each, {nodes} node(s) x {gpus_per_node} GPU(s) per point.",
        "# Submit: sbatch THIS_FILE   Rerun some points: sbatch --array=3,7 THIS_FILE",
    ]
    lines += [f"#SBATCH {opt}" for opt in sbatch]
    lines += [
        "set -euo pipefail",
        "",
        _bash_array("RUN_NAMES", names),
        ': "${SLURM_ARRAY_TASK_ID:?this is a job-array script: submit it with sbatch}"',
        'RUN_NAME="${RUN_NAMES[$SLURM_ARRAY_TASK_ID]}"',
        "",
        f"cd {shlex.quote(repo_dir)}",
        'export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"',
    ]
    if setup:
        # Environment scripts (venv activate, module load) often read unset variables.
        lines += ["set +u", *setup, "set -u"]
    lines += [
        "",
        "# Process 0 runs on the first node of this allocation and hosts the JAX coordinator.",
        "# (sed, not head: head can exit before scontrol is done writing, and under pipefail",
        "# the resulting SIGPIPE would fail the job.)",
        'COORDINATOR_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"',
        f"COORDINATOR_PORT=$(({port} + SLURM_ARRAY_TASK_ID % 1000))",
        'export RL_BATCH_COORDINATOR="$COORDINATOR_HOST:$COORDINATOR_PORT"',
        'echo "array task $SLURM_ARRAY_TASK_ID: run $RUN_NAME on $SLURM_JOB_NUM_NODES node(s),'
        ' coordinator $RL_BATCH_COORDINATOR"',
        "",
        f"srun --nodes={nodes} --ntasks={nodes * tasks_per_node}"
        f" --ntasks-per-node={tasks_per_node} --kill-on-bad-exit=1 \\",
        f"  bash -c '{inner}' bash \\",
        f"  {command}",
        "",
    ]
    return "\n".join(lines)


def tpu_options(tpu: str, zone: str, remote_dir: str, project: str = "") -> list[str]:
    """``launch/tpu_vm.sh`` options that name the TPU slice and its remote checkout."""
    options = [f"--tpu={tpu}", f"--zone={zone}", f"--remote_dir={remote_dir}"]
    return options + ([f"--project={project}"] if project else [])


def tpu_script(
    runs: Sequence[dict[str, Any]],
    *,
    sweep_module: str,
    sweep_config: str,
    sweep_dir: str,
    tpu: str,
    zone: str,
    project: str | None = None,
    remote_dir: str = "rl_batch",
    tpu_vm_sh: str = os.path.join(REPO_DIR, "launch", "tpu_vm.sh"),
    extra_flags: Sequence[str] = (),
) -> str:
    """Returns a bash script that runs the grid points one after another on a TPU VM slice.

    The script runs on a workstation with ``gcloud``; each point runs on every worker of
    the slice through ``launch/tpu_vm.sh point``. Arguments to the script select points by
    index (``bash tpu_sweep.sh 3 7``); without arguments it runs them all. A failed point
    is reported and the loop goes on; the script exits non-zero if any point failed.

    Args:
      runs: the grid points, each with a ``"name"``.
      sweep_module: the sweep program, e.g. ``"experiments.grpo_sweep"``.
      sweep_config: its config file, relative to ``remote_dir`` on the workers.
      sweep_dir: the sweep directory on the workers (shared by all hosts of the slice).
      tpu: TPU VM name.
      zone: its zone.
      project: GCP project, or None for gcloud's default.
      remote_dir: the checkout on each worker (see ``launch/tpu_vm.sh setup``).
      tpu_vm_sh: path of ``launch/tpu_vm.sh`` on the workstation.
      extra_flags: flags appended to every point's command line.

    Returns:
      The script text.
    """
    if not runs:
        raise ValueError("no grid points to launch")
    algo = sweep_module.rsplit(".", 1)[-1].removesuffix("_sweep")
    options = tpu_options(tpu, zone, remote_dir, project) + [f"--algo={algo}"]
    point = [tpu_vm_sh] + options + ["point", sweep_config, sweep_dir]
    lines = [
        "#!/usr/bin/env bash",
        f"# Generated by launch/make_jobs.py: {len(runs)} grid point(s) of {sweep_config},",
        f"# one after another on every worker of TPU slice {tpu} ({zone}).",
        "# Usage: bash THIS_FILE [INDEX ...]   (no INDEX: every point; indices in runs.json)",
        "set -uo pipefail",
        "",
        _bash_array("RUN_NAMES", [r["name"] for r in runs]),
        *_point_loop(
            " ".join(shlex.quote(w) for w in point)
            + ' "$name"'
            + "".join(" " + shlex.quote(f) for f in extra_flags)
        ),
    ]
    return "\n".join(lines)


def _point_loop(command: str) -> list[str]:
    """Bash lines running ``command`` (which reads ``$name``) for each selected grid point.

    The points are the script's arguments (indices into ``RUN_NAMES``) or all of them;
    a failed point is reported and the loop goes on; the exit status says if any failed.
    """
    return [
        'if (($#)); then INDICES=("$@"); else INDICES=("${!RUN_NAMES[@]}"); fi',
        "FAILED=()",
        'for i in "${INDICES[@]}"; do',
        '  name="${RUN_NAMES[$i]:?no grid point with index $i}"',
        '  echo "=== [$i] $name"',
        f"  if ! {command}; then",
        '    echo "=== [$i] $name FAILED" >&2',
        '    FAILED+=("$i:$name")',
        "  fi",
        "done",
        'if ((${#FAILED[@]})); then echo "failed points: ${FAILED[*]}" >&2; exit 1; fi',
        "",
    ]


def local_script(
    runs: Sequence[dict[str, Any]],
    *,
    sweep_module: str,
    sweep_config: str,
    sweep_dir: str,
    repo_dir: str = REPO_DIR,
    python: str = "python",
    num_processes: int = 1,
    extra_flags: Sequence[str] = (),
) -> str:
    """Returns a bash script that runs the grid points one after another on this machine.

    Arguments to the script select points by index; without arguments it runs them all.
    A failed point is reported and the loop goes on; the script exits non-zero if any
    point failed.

    Args:
      runs: the grid points, each with a ``"name"``.
      sweep_module: the sweep program, e.g. ``"experiments.grpo_sweep"``.
      sweep_config: its config file.
      sweep_dir: the sweep directory.
      repo_dir: the checkout (for ``launch/local.sh`` and the package).
      python: the interpreter.
      num_processes: processes per point (``launch/local.sh -n``); 1 runs the program
        directly.
      extra_flags: flags appended to every point's command line.

    Returns:
      The script text.
    """
    if not runs:
        raise ValueError("no grid points to launch")
    if num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    extra = "".join(" " + shlex.quote(f) for f in extra_flags)
    if num_processes == 1:
        args = _point_args(sweep_module, sweep_config, sweep_dir, extra_flags)
        point = " ".join([shlex.quote(python)] + [shlex.quote(a) for a in args]) + ' --only="$name"'
    else:
        algo = sweep_module.rsplit(".", 1)[-1].removesuffix("_sweep")
        local_sh = os.path.join(repo_dir, "launch", "local.sh")
        words = [local_sh, f"--num_processes={num_processes}", f"--algo={algo}", "point"]
        words += [sweep_config, sweep_dir]
        point = " ".join(shlex.quote(w) for w in words) + ' "$name"' + extra
    lines = [
        "#!/usr/bin/env bash",
        f"# Generated by launch/make_jobs.py: {len(runs)} grid point(s) of {sweep_config},",
        "# one after another on this machine.",
        "# Usage: bash THIS_FILE [INDEX ...]   (no INDEX: every point; indices in runs.json)",
        "set -uo pipefail",
        "",
        _bash_array("RUN_NAMES", [r["name"] for r in runs]),
        f"cd {shlex.quote(repo_dir)}",
        'export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"',
        f"export PYTHON={shlex.quote(python)}",
        *_point_loop(point),
    ]
    return "\n".join(lines)


def runs_index(
    runs: Sequence[dict[str, Any]],
    *,
    scheduler: str,
    sweep_module: str,
    sweep_config: str,
    sweep_dir: str,
    script: str,
) -> dict[str, Any]:
    """Returns the ``runs.json`` index: array/loop index -> run name and overrides."""
    return {
        "scheduler": scheduler,
        "script": script,
        "sweep_module": sweep_module,
        "sweep_config": sweep_config,
        "sweep_dir": sweep_dir,
        "runs": [
            {"index": i, "name": r["name"], "overrides": r.get("overrides", {})}
            for i, r in enumerate(runs)
        ],
    }


def write_jobs(out_dir: str, scheduler: str, script_text: str, index: dict[str, Any]) -> str:
    """Writes the script (executable) and ``runs.json`` into ``out_dir``.

    Returns:
      The script's path.
    """
    os.makedirs(out_dir, exist_ok=True)
    script_path = os.path.join(out_dir, SCRIPT_NAMES[scheduler])
    with open(script_path, "w") as f:
        f.write(script_text)
    os.chmod(script_path, 0o755)
    with open(os.path.join(out_dir, RUNS_INDEX_FILE), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    return script_path


def collect_command(
    *,
    scheduler: str,
    sweep_dir: str,
    runs_json: str,
    tpu_vm_sh: str,
    tpu_flags: Sequence[str] = (),
) -> str:
    """The shell command that gathers the jobs' runs into a sweep with ``launch.collect``.

    It passes ``--runs_json`` so that grid points without a run are reported as missing,
    wherever ``runs.json`` was written (``--out_dir``; for TPU, ``./jobs/<sweep name>``).

    Args:
      scheduler: one of ``SCHEDULERS``.
      sweep_dir: the sweep directory the jobs write into (for TPU: on the workers).
      runs_json: the ``runs.json`` this module wrote.
      tpu_vm_sh: TPU: ``launch/tpu_vm.sh`` on the workstation.
      tpu_flags: TPU: its options (``tpu_options``).

    Returns:
      The command line; for TPU, a fetch from worker 0 into ``fetched/`` and then the
      collect into ``sweeps/<sweep name>`` (both relative to the current directory).
    """
    collect = ["python", "-m", "launch.collect"]
    if scheduler != "tpu":
        collect += [f"--sweep_dir={sweep_dir}", f"--runs_json={runs_json}"]
        return shlex.join(collect)
    base = os.path.basename(sweep_dir.rstrip("/"))
    fetch = [tpu_vm_sh, *tpu_flags, "fetch", sweep_dir, "fetched/"]
    collect += [f"--sweep_dir=sweeps/{base}", f"--from=fetched/{base}", f"--runs_json={runs_json}"]
    return f"{shlex.join(fetch)} && {shlex.join(collect)}"


def main(argv: Sequence[str]) -> None:
    """Command-line entry point (absl)."""
    from absl import app, flags

    del argv
    f = flags.FLAGS
    sweep_module = f.sweep_module or sweep_module_for(f.sweep_config, f.algo)
    overrides = config_overrides(f.extra_flag or ())
    if f.runs_json:
        grid_flags = [x for x in overrides if x.startswith("--config.sweep.")]
        if grid_flags:
            raise app.UsageError(
                f"--extra_flag={grid_flags[0]} changes the grid, which --runs_json fixes: drop "
                "--runs_json (the grid is then listed with the flag) or the flag"
            )
        with open(f.runs_json) as fh:
            runs = parse_runs(fh.read(), f.runs_json)
    else:
        python = f.list_python or sys.executable
        runs = list_runs(
            sweep_module, f.sweep_config, python=python, overrides=overrides,
            sweep_dir=f.sweep_dir,
        )  # fmt: skip

    scheduler = f.scheduler
    # SLURM and local jobs see this filesystem: an absolute sweep directory lets the scripts
    # run from anywhere. TPU paths are on the workers, relative to their checkout. The
    # config path is used as given (relative paths are relative to --repo_dir).
    sweep_config = f.sweep_config
    sweep_dir = f.sweep_dir if scheduler == "tpu" else os.path.abspath(f.sweep_dir)
    if f.out_dir:
        out_dir = os.path.abspath(f.out_dir)
    elif scheduler == "tpu":
        out_dir = os.path.abspath(os.path.join("jobs", os.path.basename(sweep_dir.rstrip("/"))))
    else:
        out_dir = os.path.join(sweep_dir, "jobs")

    tpu_flags: list[str] = []
    tpu_vm_sh = os.path.join(f.repo_dir, "launch", "tpu_vm.sh")
    if scheduler == "slurm":
        log_dir = os.path.join(out_dir, "logs")
        os.makedirs(log_dir, exist_ok=True)  # SLURM does not create --output directories.
        text = slurm_script(
            runs,
            sweep_module=sweep_module,
            sweep_config=sweep_config,
            sweep_dir=sweep_dir,
            nodes=f.nodes,
            gpus_per_node=f.gpus_per_node,
            time=f.time,
            tasks_per_node=f.tasks_per_node,
            partition=f.partition,
            account=f.account,
            job_name=f.job_name,
            log_dir=log_dir,
            repo_dir=f.repo_dir,
            python=f.python,
            max_parallel=f.max_parallel,
            port=f.port,
            distributed=f.distributed,
            cpus_per_task=f.cpus_per_task,
            sbatch_options=f.sbatch_option or (),
            setup=f.setup or (),
            extra_flags=f.extra_flag or (),
        )
    elif scheduler == "tpu":
        if not f.tpu or not f.zone:
            raise app.UsageError("--scheduler=tpu needs --tpu and --zone")
        tpu_flags = tpu_options(f.tpu, f.zone, f.remote_dir, f.project)
        text = tpu_script(
            runs,
            sweep_module=sweep_module,
            sweep_config=sweep_config,
            sweep_dir=sweep_dir,
            tpu=f.tpu,
            zone=f.zone,
            project=f.project,
            remote_dir=f.remote_dir,
            tpu_vm_sh=tpu_vm_sh,
            extra_flags=f.extra_flag or (),
        )
    else:
        text = local_script(
            runs,
            sweep_module=sweep_module,
            sweep_config=sweep_config,
            sweep_dir=sweep_dir,
            repo_dir=f.repo_dir,
            python=f.python,
            num_processes=f.num_processes,
            extra_flags=f.extra_flag or (),
        )
    script_path = os.path.join(out_dir, SCRIPT_NAMES[scheduler])
    index = runs_index(
        runs,
        scheduler=scheduler,
        sweep_module=sweep_module,
        sweep_config=sweep_config,
        sweep_dir=sweep_dir,
        script=script_path,
    )
    write_jobs(out_dir, scheduler, text, index)
    runs_json = os.path.join(out_dir, RUNS_INDEX_FILE)
    print(f"wrote {script_path} ({len(runs)} grid points) and {runs_json}")
    if scheduler == "slurm":
        print(f"submit:  sbatch {shlex.quote(script_path)}")
    else:
        print(f"run:     bash {shlex.quote(script_path)}")
    hint = collect_command(
        scheduler=scheduler,
        sweep_dir=sweep_dir,
        runs_json=runs_json,
        tpu_vm_sh=tpu_vm_sh,
        tpu_flags=tpu_flags,
    )
    print(f"collect: {hint}")


def _define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("sweep_config", None, "Sweep config file (experiments/configs/*.py).")
    flags.DEFINE_string("sweep_dir", None, "Sweep directory the jobs write their runs into.")
    flags.DEFINE_enum("scheduler", "slurm", list(SCHEDULERS), "Which job script to write.")
    flags.DEFINE_string(
        "out_dir",
        None,
        "Where to write the script and runs.json "
        "(default SWEEP_DIR/jobs; for tpu ./jobs/<sweep name>).",
    )
    flags.DEFINE_string(
        "runs_json",
        None,
        "Read the grid from this JSON file (a --list_runs "
        "list or a runs.json index) instead of running --list_runs.",
    )
    flags.DEFINE_enum(
        "algo", None, ["grpo", "ppo"], "Sweep program (default: from the config file's name)."
    )
    flags.DEFINE_string("sweep_module", None, "Sweep program module; overrides --algo.")
    flags.DEFINE_string("list_python", None, "Interpreter for --list_runs (default: this one).")
    flags.DEFINE_string("python", "python", "Interpreter on the machines that run the points.")
    flags.DEFINE_string("repo_dir", REPO_DIR, "The checkout on the machines that run the jobs.")
    flags.DEFINE_multi_string(
        "extra_flag",
        None,
        "Flag appended to every point's command "
        "line, e.g. --extra_flag=--config.eval_k=4 (repeatable).",
    )
    # SLURM.
    flags.DEFINE_integer("nodes", 1, "SLURM: nodes (JAX processes) per grid point.")
    flags.DEFINE_integer("gpus_per_node", 1, "SLURM: GPUs per node.")
    flags.DEFINE_string("time", "04:00:00", "SLURM: time limit per grid point.")
    flags.DEFINE_integer(
        "tasks_per_node", 1, "SLURM: JAX processes per node (1: each drives all its GPUs)."
    )
    flags.DEFINE_string("partition", None, "SLURM: partition.")
    flags.DEFINE_string("account", None, "SLURM: account.")
    flags.DEFINE_string("job_name", "rl_batch", "SLURM: job name.")
    flags.DEFINE_integer("max_parallel", 0, "SLURM: at most this many points at once (0: any).")
    flags.DEFINE_integer("port", 12321, "SLURM: coordinator port base (+ array index % 1000).")
    flags.DEFINE_enum(
        "distributed",
        "env",
        list(DISTRIBUTED_MODES),
        "SLURM: give each process the coordinator as RL_BATCH_* env vars (works for the sweep "
        "programs), as flags (experiments.train only), or let JAX read SLURM's (auto).",
    )
    flags.DEFINE_integer("cpus_per_task", 0, "SLURM: --cpus-per-task (0: leave out).")
    flags.DEFINE_multi_string(
        "sbatch_option",
        None,
        "SLURM: extra #SBATCH option, e.g. --sbatch_option=--exclusive (repeatable).",
    )
    flags.DEFINE_multi_string(
        "setup",
        None,
        "SLURM: shell line run before srun, e.g. 'source ~/venv/bin/activate' (repeatable).",
    )
    # TPU.
    flags.DEFINE_string("tpu", None, "TPU: VM (slice) name.")
    flags.DEFINE_string("zone", None, "TPU: zone.")
    flags.DEFINE_string("project", None, "TPU: GCP project (default: gcloud's).")
    flags.DEFINE_string("remote_dir", "rl_batch", "TPU: checkout on each worker.")
    # Local.
    flags.DEFINE_integer("num_processes", 1, "local: processes per point (launch/local.sh -n).")
    flags.mark_flags_as_required(["sweep_config", "sweep_dir"])


if __name__ == "__main__":
    from experiments import cli  # the shared error path: one line for every mistake

    _define_flags()
    cli.run(main)
