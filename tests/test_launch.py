"""Tests for launch/: job-script generators, the shell launchers and the sweep collector.

The schedulers are simulated: fake ``scontrol``/``srun``/``gcloud``/``python`` executables
record what they were asked to run, so the generated scripts run end to end here.
"""

import json
import os
import stat
import subprocess
import sys
import types

import pytest

from launch import collect as collect_lib
from launch import make_jobs
from rl_batch import artifacts

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, "launch")

GRID = [
    {
        "name": "p64_g8_sqrt_s0",
        "overrides": {"prompts": 64, "group_size": 8, "lr_rule": "sqrt", "lr": 1e-6, "seed": 0},
    },
    {
        "name": "p128_g8_sqrt_s0",
        "overrides": {"prompts": 128, "group_size": 8, "lr_rule": "sqrt", "lr": 1.4e-6, "seed": 0},
    },
    {
        "name": "p128_g16_fixed_s1",
        "overrides": {"prompts": 128, "group_size": 16, "lr_rule": "fixed", "lr": 1e-6, "seed": 1},
    },
]

# Records argv (one per line) and the distributed environment, waits until a file matching
# $FAKE_AFTER_<process id> exists in $FAKE_OUT (if set), sleeps $FAKE_SLEEP_<process id>
# seconds, then exits with $FAKE_EXIT_<process id> (default 0).
FAKE_PYTHON = r"""#!/usr/bin/env bash
pid="${SLURM_PROCID:-${RL_BATCH_PROCESS_ID:-x}}"
for a in "$@"; do case "$a" in --process_id=*) pid="${a#*=}";; esac; done
out="$FAKE_OUT/call_${pid}_$$.txt"
{
  printf '%s\n' "$@"
  echo "ENV RL_BATCH_COORDINATOR=${RL_BATCH_COORDINATOR:-}"
  echo "ENV RL_BATCH_NUM_PROCESSES=${RL_BATCH_NUM_PROCESSES:-}"
  echo "ENV RL_BATCH_PROCESS_ID=${RL_BATCH_PROCESS_ID:-}"
  echo "ENV RL_BATCH_DISTRIBUTED=${RL_BATCH_DISTRIBUTED:-}"
  echo "ENV PWD=$PWD"
} > "$out.tmp"
mv "$out.tmp" "$out"
sleep_var="FAKE_SLEEP_${pid}"; exit_var="FAKE_EXIT_${pid}"; after_var="FAKE_AFTER_${pid}"
if [[ -n "${!after_var:-}" ]]; then
  for _ in $(seq 200); do
    compgen -G "$FAKE_OUT/${!after_var}" > /dev/null && break
    sleep 0.05
  done
fi
# Like python, die on SIGTERM (bash would otherwise wait for its sleep to finish first).
trap 'kill $! 2>/dev/null; exit 143' TERM
sleep "${!sleep_var:-0}" &
wait $!
exit "${!exit_var:-0}"
"""

# srun: skip options up to the command, then start $--ntasks copies with SLURM_PROCID set.
FAKE_SRUN = r"""#!/usr/bin/env bash
echo "$@" > "$FAKE_OUT/srun_args.txt"
n=1
while [[ "$1" == --* ]]; do
  case "$1" in --ntasks=*) n="${1#*=}";; esac
  shift
done
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURM_NTASKS=$n "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""

FAKE_SCONTROL = r"""#!/usr/bin/env bash
[[ "$1 $2" == "show hostnames" ]] || exit 9
echo "$3" > "$FAKE_OUT/scontrol_nodelist.txt"
printf 'gpu-node-07\ngpu-node-08\n'
"""

# gcloud: records its argv; for `ssh`, runs --command in a fake worker home with bash.
FAKE_GCLOUD = r"""#!/usr/bin/env bash
printf '%s\n' "$@" >> "$FAKE_OUT/gcloud_calls.txt"
echo "---" >> "$FAKE_OUT/gcloud_calls.txt"
cmd=""
for a in "$@"; do case "$a" in --command=*) cmd="${a#--command=}";; esac; done
for a in "$@"; do
  if [[ "$a" == *"$FAKE_FAIL_ON"* && -n "${FAKE_FAIL_ON:-}" ]]; then exit 4; fi
done
if [[ -n "$cmd" ]]; then cd "$FAKE_HOME" && bash -c "$cmd"; fi
"""


def _write_exe(path, text):
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(path)


@pytest.fixture
def fakes(tmp_path):
    """A bin dir with the fake executables and an env that puts it first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    home = tmp_path / "home"
    (home / "rl_batch").mkdir(parents=True)
    python = _write_exe(bin_dir / "fake_python", FAKE_PYTHON)
    _write_exe(bin_dir / "srun", FAKE_SRUN)
    _write_exe(bin_dir / "scontrol", FAKE_SCONTROL)
    gcloud = _write_exe(bin_dir / "gcloud", FAKE_GCLOUD)
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        FAKE_OUT=str(out),
        FAKE_HOME=str(home),
        PYTHON=python,
        REMOTE_PYTHON=python,
        GCLOUD=gcloud,
    )
    return types.SimpleNamespace(env=env, out=out, python=python, home=home, bin=bin_dir)


def _calls(out_dir):
    """Each fake-python call as (argv list, env dict), sorted by process id then argv."""
    calls = []
    for name in sorted(os.listdir(out_dir)):
        if not (name.startswith("call_") and name.endswith(".txt")):
            continue
        lines = (out_dir / name).read_text().splitlines()
        argv = [line for line in lines if not line.startswith("ENV ")]
        env = dict(line[4:].split("=", 1) for line in lines if line.startswith("ENV "))
        calls.append((argv, env))
    return calls


def _bash_syntax_ok(path):
    proc = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, f"{path}: {proc.stderr}"


# ----------------------------------------------------------------------------- make_jobs


def test_parse_runs_accepts_log_noise_and_index_and_rejects_bad_grids():
    noisy = "I1129 loading config\nWARNING something\n" + json.dumps(GRID, indent=1) + "\n"
    assert make_jobs.parse_runs(noisy, "x") == GRID
    index = {"runs": [dict(index=i, **p) for i, p in enumerate(GRID)]}
    assert [r["name"] for r in make_jobs.parse_runs(json.dumps(index), "x")] == [
        p["name"] for p in GRID
    ]
    with pytest.raises(ValueError, match="appears twice"):
        make_jobs.parse_runs(json.dumps(GRID + GRID[:1]), "grid.json")
    with pytest.raises(ValueError, match="'a b'"):
        make_jobs.parse_runs(json.dumps([{"name": "a b"}]), "grid.json")
    with pytest.raises(ValueError, match="empty"):
        make_jobs.parse_runs("[]", "grid.json")
    with pytest.raises(ValueError, match="no JSON list"):
        make_jobs.parse_runs("only logs here", "cmd")


def test_sweep_module_for():
    assert make_jobs.sweep_module_for("experiments/configs/grpo_sweep.py") == (
        "experiments.grpo_sweep"
    )
    assert make_jobs.sweep_module_for("configs/ppo_cpu_sweep.py") == "experiments.ppo_sweep"
    assert make_jobs.sweep_module_for("configs/x.py", "ppo") == "experiments.ppo_sweep"
    with pytest.raises(ValueError, match="'dqn'"):
        make_jobs.sweep_module_for("x.py", "dqn")


def _slurm(**kw):
    args = dict(
        sweep_module="experiments.grpo_sweep",
        sweep_config="experiments/configs/grpo_sweep.py",
        sweep_dir="/shared/sweeps/grpo",
        nodes=2,
        gpus_per_node=8,
        time="08:00:00",
        partition="gpu",
        account="proj42",
        log_dir="/shared/sweeps/grpo/jobs/logs",
        repo_dir="/shared/rl_batch",
        max_parallel=2,
    )
    args.update(kw)
    return make_jobs.slurm_script(GRID, **args)


def test_slurm_script_text():
    text = _slurm()
    lines = text.splitlines()
    for option in [
        "--array=0-2%2",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=8",
        "--time=08:00:00",
        "--partition=gpu",
        "--account=proj42",
        "--output=/shared/sweeps/grpo/jobs/logs/%x-%A_%a.out",
    ]:
        assert f"#SBATCH {option}" in lines, option
    # Every #SBATCH line precedes the first command, or sbatch ignores it.
    first_cmd = next(i for i, l in enumerate(lines) if l and not l.startswith("#"))
    assert all(i < first_cmd for i, l in enumerate(lines) if l.startswith("#SBATCH"))
    # Array index i -> grid point i.
    start = lines.index("RUN_NAMES=(")
    assert [l.split()[0] for l in lines[start + 1 : start + 4]] == [p["name"] for p in GRID]
    assert 'RUN_NAME="${RUN_NAMES[$SLURM_ARRAY_TASK_ID]}"' in lines
    assert 'COORDINATOR_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"' in (
        lines
    )
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 \\" in lines
    # Default: the coordinator through the environment, which the sweep programs read.
    assert (
        """  bash -c 'RL_BATCH_NUM_PROCESSES="$SLURM_NTASKS" RL_BATCH_PROCESS_ID="$SLURM_PROCID" """
        """exec "$@"' bash \\"""
    ) in lines
    assert 'export RL_BATCH_COORDINATOR="$COORDINATOR_HOST:$COORDINATOR_PORT"' in lines
    assert (
        "python -m experiments.grpo_sweep --config=experiments/configs/grpo_sweep.py "
        '--sweep_dir=/shared/sweeps/grpo --only="$RUN_NAME"'
    ) in text
    assert "cd /shared/rl_batch" in lines

    unlimited = _slurm(max_parallel=0, partition=None, account=None)
    assert "#SBATCH --array=0-2" in unlimited.splitlines()
    assert "--partition" not in unlimited and "--account" not in unlimited
    assert "--process_id" not in text
    flag_mode = _slurm(distributed="flags")
    assert (
        '--coordinator_address="$RL_BATCH_COORDINATOR" '
        '--num_processes="$SLURM_NTASKS" --process_id="$SLURM_PROCID"'
    ) in flag_mode
    assert 'RL_BATCH_PROCESS_ID="$SLURM_PROCID"' not in flag_mode
    auto = _slurm(distributed="auto")
    assert "bash -c 'RL_BATCH_DISTRIBUTED=auto exec \"$@\"' bash" in auto
    assert "--process_id" not in auto and "RL_BATCH_PROCESS_ID" not in auto
    with pytest.raises(ValueError, match="whitespace"):
        _slurm(sbatch_options=["--constraint=a b"])
    with pytest.raises(ValueError, match="distributed"):
        _slurm(distributed="mpi")
    two_per_node = _slurm(tasks_per_node=2).splitlines()
    assert "#SBATCH --ntasks-per-node=2" in two_per_node
    assert "srun --nodes=2 --ntasks=4 --ntasks-per-node=2 --kill-on-bad-exit=1 \\" in two_per_node
    with pytest.raises(ValueError, match="tasks_per_node"):
        _slurm(tasks_per_node=0)


def test_generated_and_launch_scripts_pass_bash_syntax_check(tmp_path):
    scripts = {
        "slurm.sbatch": _slurm(setup=["source ~/venv/bin/activate", "module load cuda"]),
        "slurm_flags.sbatch": _slurm(distributed="flags", extra_flags=["--config.x=a b"]),
        "slurm_auto.sbatch": _slurm(distributed="auto", sbatch_options=["--exclusive"]),
        "tpu.sh": make_jobs.tpu_script(
            GRID,
            sweep_module="experiments.ppo_sweep",
            sweep_config="experiments/configs/ppo_sweep.py",
            sweep_dir="/mnt/shared/sweep",
            tpu="v5e-16",
            zone="us-west4-a",
            project="p",
            extra_flags=["--config.eval_k=4"],
        ),
        "local.sh": make_jobs.local_script(
            GRID, sweep_module="experiments.grpo_sweep", sweep_config="c.py", sweep_dir="/s"
        ),
        "local_multi.sh": make_jobs.local_script(
            GRID,
            sweep_module="experiments.grpo_sweep",
            sweep_config="c.py",
            sweep_dir="/s w",
            num_processes=2,
        ),
    }
    for name, text in scripts.items():
        path = tmp_path / name
        path.write_text(text)
        _bash_syntax_ok(path)
    shell_files = [f for f in os.listdir(LAUNCH) if f.endswith(".sh")]
    assert sorted(shell_files) == ["gpu_check.sh", "local.sh", "slurm_single_node.sh", "tpu_vm.sh"]
    for f in shell_files:
        _bash_syntax_ok(os.path.join(LAUNCH, f))
        assert os.access(os.path.join(LAUNCH, f), os.X_OK), f"{f} is not executable"


@pytest.mark.parametrize("mode", ["env", "flags"])
def test_slurm_script_runs_each_process_with_its_rank(tmp_path, fakes, mode):
    script = tmp_path / "sweep.sbatch"
    script.write_text(
        _slurm(
            distributed=mode,
            repo_dir=str(tmp_path),
            python=fakes.python,
            sweep_dir="/shared/my sweep",
            extra_flags=["--config.note=two words"],
        )
    )
    env = dict(fakes.env, SLURM_ARRAY_TASK_ID="1", SLURM_JOB_NODELIST="gpu-node-[07-08]")
    env["SLURM_JOB_NUM_NODES"] = "2"
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (fakes.out / "scontrol_nodelist.txt").read_text().strip() == "gpu-node-[07-08]"
    calls = _calls(fakes.out)
    assert len(calls) == 2
    point = [
        "-m",
        "experiments.grpo_sweep",
        "--config=experiments/configs/grpo_sweep.py",
        "--sweep_dir=/shared/my sweep",
        "--config.note=two words",
        "--only=p128_g8_sqrt_s0",  # array index 1
    ]
    by_rank = sorted(calls, key=lambda c: (c[1]["RL_BATCH_PROCESS_ID"], c[0][-1]))
    for rank, (argv, env_seen) in enumerate(by_rank):
        # Coordinator on the first node, port base + array index.
        if mode == "flags":
            assert argv == point + [
                "--coordinator_address=gpu-node-07:12322",
                "--num_processes=2",
                f"--process_id={rank}",
            ]
        else:
            assert argv == point
            assert env_seen["RL_BATCH_PROCESS_ID"] == str(rank)
            assert env_seen["RL_BATCH_NUM_PROCESSES"] == "2"
        assert env_seen["RL_BATCH_COORDINATOR"] == "gpu-node-07:12322"
        assert env_seen["PWD"] == str(tmp_path)

    # Run by hand instead of through sbatch: a clear error, not an empty run name.
    env.pop("SLURM_ARRAY_TASK_ID")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "submit it with sbatch" in proc.stderr


def test_list_runs_calls_the_sweep_program(tmp_path):
    fake = _write_exe(
        tmp_path / "fake_sweep_python",
        "#!/usr/bin/env bash\n"
        'echo "args: $*" >&2\n'
        'echo "I1129 some log line"\n'
        f"echo '{json.dumps(GRID)}'\n",
    )
    runs = make_jobs.list_runs("experiments.ppo_sweep", "configs/ppo.py", python=fake)
    assert runs == GRID
    failing = _write_exe(
        tmp_path / "failing", "#!/usr/bin/env bash\necho log >&2\necho 'error: boom' >&2\nexit 3\n"
    )
    with pytest.raises(ValueError, match=r"exited with status 3\): boom$"):
        make_jobs.list_runs("experiments.grpo_sweep", "c.py", python=failing)


def test_a_points_config_overrides_list_the_grid_it_runs(tmp_path):
    # --extra_flag=--config.sweep.prompts=2,4 changes the grid: the listing gets it too.
    seen = tmp_path / "argv.txt"
    fake = _write_exe(
        tmp_path / "fake_sweep_python",
        f"#!/usr/bin/env bash\necho \"$*\" > {seen}\necho '{json.dumps(GRID)}'\n",
    )
    extra = ["--config.sweep.prompts=2,4", "--quiet", "--config.eval_k=4"]
    overrides = make_jobs.config_overrides(extra)
    assert overrides == ["--config.sweep.prompts=2,4", "--config.eval_k=4"]
    make_jobs.list_runs("experiments.grpo_sweep", "c.py", python=fake, overrides=overrides,
                        sweep_dir="/s/grid")  # fmt: skip
    # The sweep directory too: an extension recorded there is the points' grid.
    assert seen.read_text().split() == [
        "-m", "experiments.grpo_sweep", "--config=c.py", *overrides, "--sweep_dir=/s/grid",
        "--list_runs",
    ]  # fmt: skip


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_make_jobs_lists_the_grid_with_the_sweep_overrides_it_is_given(tmp_path):
    # The real sweep program: 2 prompts values x the config's other axes, not its default grid.
    out = subprocess.run(
        [sys.executable, "-m", "launch.make_jobs", "--sweep_config=experiments/configs/grpo_cpu.py",
         f"--sweep_dir={tmp_path / 's'}", "--scheduler=local",
         "--extra_flag=--config.sweep.prompts=2,4", "--extra_flag=--config.sweep.group_sizes=4",
         "--extra_flag=--config.sweep.lr_rules=sqrt", "--extra_flag=--config.sweep.seeds=0",
         "--extra_flag=--config.sweep.reference=4x4:sqrt",
         "--extra_flag=--config.sweep.extra_points="],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    index = json.load(open(tmp_path / "s" / "jobs" / "runs.json"))
    assert [r["overrides"]["prompts"] for r in index["runs"]] == [2, 4]


def test_make_jobs_cli_writes_script_and_index(tmp_path):
    grid_file = tmp_path / "grid.json"
    grid_file.write_text(json.dumps(GRID))
    sweep_dir = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "launch.make_jobs",
        "--sweep_config=experiments/configs/grpo_sweep.py",
        f"--sweep_dir={sweep_dir}",
        f"--runs_json={grid_file}",
        "--scheduler=slurm",
        "--nodes=4",
        "--gpus_per_node=8",
        "--time=01:00:00",
        "--partition=a100",
        "--account=acct",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    script = sweep_dir / "jobs" / "sweep.sbatch"
    text = script.read_text()
    assert "#SBATCH --array=0-2" in text and "#SBATCH --nodes=4" in text
    assert os.access(script, os.X_OK)
    assert (sweep_dir / "jobs" / "logs").is_dir()
    index = json.loads((sweep_dir / "jobs" / "runs.json").read_text())
    assert [(r["index"], r["name"]) for r in index["runs"]] == [
        (i, p["name"]) for i, p in enumerate(GRID)
    ]
    assert index["runs"][2]["overrides"]["group_size"] == 16
    assert index["sweep_module"] == "experiments.grpo_sweep"


def test_local_script_runs_points_and_continues_after_a_failure(tmp_path, fakes):
    script = tmp_path / "local_sweep.sh"
    script.write_text(
        make_jobs.local_script(
            GRID,
            sweep_module="experiments.grpo_sweep",
            sweep_config="c.py",
            sweep_dir="/s",
            repo_dir=str(tmp_path),
            python=fakes.python,
        )
    )
    # The fake fails every call (no process id: key "x"), so all three are tried and reported.
    env = dict(fakes.env, FAKE_EXIT_x="5")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "failed points: 0:p64_g8_sqrt_s0 1:p128_g8_sqrt_s0 2:p128_g16_fixed_s1" in proc.stderr
    assert sorted(argv[-1] for argv, _ in _calls(fakes.out)) == sorted(
        f"--only={p['name']}" for p in GRID
    )
    # Selecting points by index.
    for f in fakes.out.iterdir():
        f.unlink()
    proc = subprocess.run(["bash", str(script), "2"], env=fakes.env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert [argv[-1] for argv, _ in _calls(fakes.out)] == ["--only=p128_g16_fixed_s1"]


# --------------------------------------------------------------------------- local.sh


def test_local_sh_starts_n_processes_with_coordinator_flags(tmp_path, fakes):
    proc = subprocess.run(
        [
            os.path.join(LAUNCH, "local.sh"),
            "-n",
            "3",
            "--port=23456",
            f"--log_dir={tmp_path / 'logs'}",
            "train",
            "experiments/configs/grpo_cpu.py",
            str(tmp_path / "run dir"),
            "--resume",
        ],
        env=fakes.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    calls = sorted(_calls(fakes.out), key=lambda c: c[0][-1])
    assert [argv for argv, _ in calls] == [
        [
            "-m",
            "experiments.train",
            "--config=experiments/configs/grpo_cpu.py",
            f"--config.run_dir={tmp_path / 'run dir'}",
            "--resume",
            "--coordinator_address=localhost:23456",
            "--num_processes=3",
            f"--process_id={i}",
        ]
        for i in range(3)
    ]
    assert sorted(os.listdir(tmp_path / "logs")) == ["process_1.log", "process_2.log"]


def test_local_sh_point_uses_env_and_failure_stops_the_others(tmp_path, fakes):
    # Process 1 fails once process 0 has started; process 0 would sleep 60 s unless the
    # launcher stops it.
    env = dict(fakes.env, FAKE_EXIT_1="3", FAKE_SLEEP_0="60", FAKE_AFTER_1="call_0_*.txt")
    proc = subprocess.run(
        [os.path.join(LAUNCH, "local.sh"), "--num_processes=2", "point"]
        + ["experiments/configs/ppo_sweep.py", str(tmp_path / "s"), "p64_g1_sqrt_s0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 3, proc.stderr
    assert "exited with status 3" in proc.stderr
    calls = {e["RL_BATCH_PROCESS_ID"]: (argv, e) for argv, e in _calls(fakes.out)}
    assert sorted(calls) == ["0", "1"]
    argv, env_seen = calls["1"]
    assert argv[:2] == ["-m", "experiments.ppo_sweep"] and argv[-1] == "--only=p64_g1_sqrt_s0"
    assert env_seen["RL_BATCH_COORDINATOR"] == "localhost:12321"
    assert env_seen["RL_BATCH_NUM_PROCESSES"] == "2"


def test_local_sh_single_process_and_usage_errors(fakes):
    local_sh = os.path.join(LAUNCH, "local.sh")
    proc = subprocess.run(
        [local_sh, "list", "experiments/configs/grpo_sweep.py"],
        env=fakes.env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    [(argv, env_seen)] = _calls(fakes.out)
    assert argv == [
        "-m",
        "experiments.grpo_sweep",
        "--config=experiments/configs/grpo_sweep.py",
        "--list_runs",
    ]
    assert env_seen["RL_BATCH_PROCESS_ID"] == ""  # One process: no coordinator at all.
    # With its sweep directory: the grid the points of that directory run.
    proc = subprocess.run(
        [local_sh, "list", "experiments/configs/grpo_sweep.py", "/s", "--config.seed=1"],
        env=fakes.env, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert [
        "--config=experiments/configs/grpo_sweep.py", "--sweep_dir=/s", "--list_runs",
        "--config.seed=1",
    ] in [argv[2:] for argv, _ in _calls(fakes.out)]  # fmt: skip
    for bad, msg in [(["-n", "0", "train", "a", "b"], "positive integer"), (["fly"], "'fly'")]:
        proc = subprocess.run([local_sh] + bad, env=fakes.env, capture_output=True, text=True)
        assert proc.returncode == 2 and msg in proc.stderr


# --------------------------------------------------------------------------- tpu_vm.sh


def test_tpu_vm_sh_runs_the_point_on_all_workers(tmp_path, fakes):
    proc = subprocess.run(
        [
            os.path.join(LAUNCH, "tpu_vm.sh"),
            "--tpu=my-v5e",
            "--zone=us-west4-a",
            "--project=proj",
            "point",
            "experiments/configs/grpo_sweep.py",
            "/mnt/shared/my sweep",
            "p64_g8_sqrt_s0",
            "--config.note=a b",
        ],
        env=fakes.env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    gcloud_argv = (fakes.out / "gcloud_calls.txt").read_text().split("\n---\n")[0].splitlines()
    assert gcloud_argv[:5] == ["compute", "tpus", "tpu-vm", "ssh", "my-v5e"]
    assert "--zone=us-west4-a" in gcloud_argv and "--project=proj" in gcloud_argv
    assert "--worker=all" in gcloud_argv
    # The remote command, run by bash on the fake worker, delivers every word intact.
    [(argv, env_seen)] = _calls(fakes.out)
    assert argv == [
        "-m",
        "experiments.grpo_sweep",
        "--config=experiments/configs/grpo_sweep.py",
        "--sweep_dir=/mnt/shared/my sweep",
        "--only=p64_g8_sqrt_s0",
        "--config.note=a b",
    ]
    assert env_seen["PWD"] == str(fakes.home / "rl_batch")
    assert env_seen["RL_BATCH_DISTRIBUTED"] == "auto"  # jax finds the slice's workers itself.

    proc = subprocess.run(
        [os.path.join(LAUNCH, "tpu_vm.sh"), "train", "c.py", "r"],
        env={k: v for k, v in fakes.env.items() if k not in ("TPU_NAME", "TPU_ZONE")},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "--tpu=NAME" in proc.stderr


def test_tpu_script_loops_over_points_and_reports_failures(tmp_path, fakes):
    script = tmp_path / "tpu_sweep.sh"
    script.write_text(
        make_jobs.tpu_script(
            GRID,
            sweep_module="experiments.ppo_sweep",
            sweep_config="experiments/configs/ppo_sweep.py",
            sweep_dir="sweeps/ppo",
            tpu="v4-16",
            zone="us-central2-b",
        )
    )
    env = dict(fakes.env, FAKE_FAIL_ON="p128_g8_sqrt_s0")
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert "failed points: 1:p128_g8_sqrt_s0" in proc.stderr
    ran = sorted(argv[-1] for argv, _ in _calls(fakes.out))
    assert ran == ["--only=p128_g16_fixed_s1", "--only=p64_g8_sqrt_s0"]
    assert all(argv[1] == "experiments.ppo_sweep" for argv, _ in _calls(fakes.out))


# ----------------------------------------------------------------------------- collect


def _fake_run(
    run_dir, name, *, prompts=64, group_size=8, lr=1e-6, seed=0, status="finished", **config
):
    """Writes a small run directory; status=None leaves out summary.json."""
    os.makedirs(os.path.join(run_dir, artifacts.CHECKPOINT_DIR, "3"), exist_ok=True)
    with open(os.path.join(run_dir, artifacts.CHECKPOINT_DIR, "3", "state"), "w") as f:
        f.write("weights")
    cfg = dict(
        name=name,
        algo="grpo",
        target=0.5,
        budget_responses=4096,
        eval_every_responses=512,
        prompts=prompts,
        group_size=group_size,
        lr_rule="sqrt",
        lr=lr,
        seed=seed,
    )
    cfg.update(config)
    artifacts.write_json_atomic(os.path.join(run_dir, artifacts.CONFIG_FILE), cfg)
    metrics = os.path.join(run_dir, artifacts.METRICS_FILE)
    artifacts.append_jsonl(metrics, {"kind": "update", "step": 1, "responses_cum": 512})
    artifacts.append_jsonl(metrics, {"kind": "eval", "step": 1, "eval_accuracy": 0.25})
    if status is not None:
        summary = {"status": status, "reached": False, "n_star": None}
        if status == "failed":
            summary["error"] = "NaN loss at step 7"
        artifacts.write_json_atomic(os.path.join(run_dir, artifacts.SUMMARY_FILE), summary)
    return str(run_dir)


@pytest.fixture
def two_jobs(tmp_path):
    """Two jobs' directories as separate SLURM tasks would leave them, plus a bare run."""
    job1 = tmp_path / "jobs" / "job1"
    job2 = tmp_path / "jobs" / "job2"
    _fake_run(job1 / "runs" / "p64_g8_sqrt_s0", "p64_g8_sqrt_s0")
    # Written by the current resolve (the effective LR in derived.lr); the others as older
    # code wrote them (the effective LR in lr).
    _fake_run(
        job1 / "runs" / "p128_g8_sqrt_s0",
        "p128_g8_sqrt_s0",
        prompts=128,
        lr=None,
        derived={"lr": 1.4e-6, "batch": 1024},
    )
    _fake_run(
        job2 / "runs" / "p128_g16_fixed_s1",
        "p128_g16_fixed_s1",
        prompts=128,
        group_size=16,
        lr_rule="fixed",
        seed=1,
        status="failed",
    )
    bare = _fake_run(tmp_path / "elsewhere" / "run", "p256_g8_sqrt_s0", prompts=256, status=None)
    return types.SimpleNamespace(job1=str(job1), job2=str(job2), bare=bare, root=tmp_path)


def test_collect_merges_jobs_into_a_sweep(two_jobs):
    sweep_dir = str(two_jobs.root / "sweep")
    result = collect_lib.collect(
        sweep_dir, [two_jobs.job1, two_jobs.job2, two_jobs.bare], reference="p64_g8_sqrt_s0"
    )
    on_disk = artifacts.read_json(os.path.join(sweep_dir, "sweep.json"))
    assert on_disk == result.sweep
    assert {k: on_disk[k] for k in ("algo", "target", "budget_responses")} == {
        "algo": "grpo",
        "target": 0.5,
        "budget_responses": 4096,
    }
    assert on_disk["eval_every_responses"] == 512
    assert on_disk["name"] == "sweep" and on_disk["reference"] == "p64_g8_sqrt_s0"
    # Ordered by batch B = P x G: 512, 1024, 2048 (two), names break the tie.
    assert on_disk["runs"] == [
        dict(name="p64_g8_sqrt_s0", prompts=64, group_size=8, batch=512,
             lr_rule="sqrt", lr=1e-6, seed=0, critic="", variant="", status="finished", error=None),
        dict(name="p128_g8_sqrt_s0", prompts=128, group_size=8, batch=1024,
             lr_rule="sqrt", lr=1.4e-6, seed=0, critic="", variant="", status="finished",
             error=None),
        dict(name="p128_g16_fixed_s1", prompts=128, group_size=16, batch=2048,
             lr_rule="fixed", lr=1e-6, seed=1, critic="", variant="", status="failed",
             error="NaN loss at step 7"),
        dict(name="p256_g8_sqrt_s0", prompts=256, group_size=8, batch=2048,
             lr_rule="sqrt", lr=1e-6, seed=0, critic="", variant="", status="incomplete",
             error=None),
    ]  # fmt: skip
    assert sorted(result.actions) == sorted((r["name"], "copied") for r in on_disk["runs"])
    copied = os.path.join(sweep_dir, "runs", "p256_g8_sqrt_s0")
    assert not os.path.islink(copied)
    assert len(artifacts.read_metrics(copied)) == 2
    assert os.path.isfile(os.path.join(copied, "checkpoints", "3", "state"))

    # Collecting again changes nothing and keeps the reference; the old sweep.json is read.
    again = collect_lib.collect(sweep_dir, [two_jobs.job1, two_jobs.job2, two_jobs.bare])
    assert again.sweep == on_disk
    assert {a for _, a in again.actions} == {"unchanged"}


def test_collect_keeps_what_a_sweep_program_added(two_jobs):
    # job1 ran as a sweep whose sweep.json still says "running" (its job was cut off while
    # the summaries were written) and carries extra fields.
    job_sweep = {
        "name": "grpo_gpu",
        "algo": "grpo",
        "target": 0.5,
        "reference": "p64_g8_sqrt_s0",
        "grid": {"prompts": "64,128"},
        "runs": [
            # (An entry written before the configured batch was renamed to "batch".)
            {
                "name": "p64_g8_sqrt_s0",
                "key": "64x8:sqrt",
                "wall_s": 12.5,
                "status": "running",
                "batch_responses": 512,
            },  # fmt: skip
            {"name": "p128_g8_sqrt_s0", "key": "128x8:sqrt", "status": "pending"},
        ],
    }
    artifacts.write_json_atomic(os.path.join(two_jobs.job1, "sweep.json"), job_sweep)
    warnings = []
    sweep = collect_lib.collect(
        str(two_jobs.root / "merged"), [two_jobs.job1], log=warnings.append
    ).sweep
    assert warnings == []
    assert sweep["reference"] == "p64_g8_sqrt_s0" and sweep["grid"] == {"prompts": "64,128"}
    assert sweep["name"] == "merged"  # Like rl_batch.sweeps.sweep: the sweep directory's name.
    first = sweep["runs"][0]
    assert (first["name"], first["key"], first["wall_s"], first["status"]) == (
        "p64_g8_sqrt_s0",
        "64x8:sqrt",
        12.5,
        "finished",  # From summary.json, not the stale sweep.json.
    )
    assert sweep["runs"][1]["status"] == "finished"
    assert first["batch"] == 512 and "batch_responses" not in first


def test_old_sweep_entries_with_batch_responses_are_still_read():
    old = {"name": "p64_g8_sqrt_s0", "prompts": 64, "group_size": 8, "batch_responses": 512}
    assert artifacts.entry_batch(old) == 512
    assert artifacts.entry_batch({**old, "batch_responses": None}) == 512  # from P x G
    new = artifacts.sweep_entry(
        "p64_g8_sqrt_s0", prompts=64, group_size=8, lr_rule="sqrt", lr=1e-6, seed=0,
        status="finished",
    )  # fmt: skip
    assert new["batch"] == artifacts.entry_batch(new) == 512 and "batch_responses" not in new
    assert artifacts.entry_batch({"name": "x"}) is None
    # The effective LR of a run: derived.lr now, lr in a config.json of older code.
    assert artifacts.config_lr({"lr": None, "derived": {"lr": 2e-6}}) == 2e-6
    assert artifacts.config_lr({"lr": 3e-6, "derived": {"batch_responses": 512}}) == 3e-6


def test_collect_detects_conflicts_and_prefer_newest(two_jobs):
    sweep_dir = str(two_jobs.root / "sweep")
    collect_lib.collect(sweep_dir, [two_jobs.job1])
    before = open(os.path.join(sweep_dir, "sweep.json")).read()
    # A rerun of p64 in another job, with a longer metrics log and a later mtime.
    rerun = _fake_run(two_jobs.root / "job3" / "runs" / "p64_g8_sqrt_s0", "p64_g8_sqrt_s0")
    artifacts.append_jsonl(os.path.join(rerun, "metrics.jsonl"), {"kind": "update", "step": 2})
    for f in ("config.json", "summary.json", "metrics.jsonl"):
        os.utime(os.path.join(rerun, f), (2e9, 2e9))
    with pytest.raises(ValueError, match="run 'p64_g8_sqrt_s0' differs between") as err:
        collect_lib.collect(sweep_dir, [str(two_jobs.root / "job3"), two_jobs.job2])
    assert rerun in str(err.value)
    assert os.path.join(sweep_dir, "runs", "p64_g8_sqrt_s0") in str(err.value)
    # Nothing was touched: job2's run was not copied in, sweep.json is as before.
    assert open(os.path.join(sweep_dir, "sweep.json")).read() == before
    assert not os.path.exists(os.path.join(sweep_dir, "runs", "p128_g16_fixed_s1"))

    result = collect_lib.collect(
        sweep_dir, [str(two_jobs.root / "job3"), two_jobs.job2], prefer="newest"
    )
    assert dict(result.actions)["p64_g8_sqrt_s0"] == "replaced"
    kept = os.path.join(sweep_dir, "runs", "p64_g8_sqrt_s0")
    assert [r["step"] for r in artifacts.read_metrics(kept, "update")] == [1, 2]
    # The old copy is now the older one: prefer=newest keeps the one in place.
    old = _fake_run(two_jobs.root / "job4" / "p64_g8_sqrt_s0", "p64_g8_sqrt_s0", seed=9)
    for f in ("config.json", "summary.json", "metrics.jsonl"):
        os.utime(os.path.join(old, f), (1e9, 1e9))
    result = collect_lib.collect(sweep_dir, [old], prefer="newest")
    assert dict(result.actions)["p64_g8_sqrt_s0"] == "unchanged"
    assert artifacts.read_json(os.path.join(kept, "config.json"))["seed"] == 0


def test_collect_symlinks_grid_missing_and_inconsistent_sweeps(two_jobs):
    sweep_dir = str(two_jobs.root / "sweep")
    grid = GRID + [{"name": "p512_g8_sqrt_s0", "overrides": {"prompts": 512, "group_size": 8}}]
    # A task that started but wrote no config.json yet.
    os.makedirs(os.path.join(sweep_dir, "runs", "p128_g16_fixed_s1"))
    warnings = []
    result = collect_lib.collect(
        sweep_dir, [two_jobs.job1], symlink=True, grid=grid, log=warnings.append
    )
    assert any("p128_g16_fixed_s1: no config.json" in w for w in warnings)
    result = collect_lib.collect(
        sweep_dir, [two_jobs.job1], symlink=True, grid=grid, exclude_checkpoints=True
    )
    link = os.path.join(sweep_dir, "runs", "p64_g8_sqrt_s0")
    assert os.path.islink(link)
    assert os.path.realpath(link) == os.path.realpath(
        os.path.join(two_jobs.job1, "runs", "p64_g8_sqrt_s0")
    )
    # Grid order; points with no run directory are "missing".
    assert [(r["name"], r["status"], r["batch"]) for r in result.sweep["runs"]] == [
        ("p64_g8_sqrt_s0", "finished", 512),
        ("p128_g8_sqrt_s0", "finished", 1024),
        ("p128_g16_fixed_s1", "incomplete", 2048),
        ("p512_g8_sqrt_s0", "missing", 4096),
    ]
    # Replacing a symlinked run removes the link, never the job's own files.
    rerun = _fake_run(two_jobs.root / "job5" / "p64_g8_sqrt_s0", "p64_g8_sqrt_s0", seed=3)
    os.utime(os.path.join(rerun, "config.json"), (3e9, 3e9))
    collect_lib.collect(sweep_dir, [rerun], prefer="newest", exclude_checkpoints=True)
    assert not os.path.islink(link)
    assert not os.path.exists(os.path.join(link, "checkpoints"))
    assert os.path.isfile(os.path.join(two_jobs.job1, "runs", "p64_g8_sqrt_s0", "config.json"))

    other = _fake_run(two_jobs.root / "ppo" / "p64_g1", "p64_g1", algo="ppo", group_size=1)
    with pytest.raises(ValueError, match="disagree on 'algo'"):
        collect_lib.collect(str(two_jobs.root / "mixed"), [two_jobs.job1, other])
    assert not os.path.exists(two_jobs.root / "mixed" / "runs")
    with pytest.raises(ValueError, match="no run directories"):
        collect_lib.collect(sweep_dir, [str(two_jobs.root / "ppo" / "p64_g1" / "checkpoints")])


def test_collect_cli_with_glob(two_jobs):
    sweep_dir = two_jobs.root / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "launch.collect",
        f"--sweep_dir={sweep_dir}",
        f"--from={two_jobs.root / 'jobs' / '*'}",
        "--reference=p64_g8_sqrt_s0",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "3 runs (1 failed, 2 finished); 3 copied" in proc.stdout
    sweep = json.loads((sweep_dir / "sweep.json").read_text())
    assert [r["name"] for r in sweep["runs"]] == [
        "p64_g8_sqrt_s0",
        "p128_g8_sqrt_s0",
        "p128_g16_fixed_s1",
    ]
    proc = subprocess.run(
        cmd[:4] + [f"--from={two_jobs.root / 'nope*'}"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "nope*" in proc.stderr


def test_run_analysis_reports_absence_and_calls_write_all(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "rl_batch.analysis", None)
    assert "not available" in collect_lib.run_analysis(str(tmp_path))
    monkeypatch.setitem(sys.modules, "rl_batch.analysis", types.ModuleType("rl_batch.analysis"))
    assert "no write_all" in collect_lib.run_analysis(str(tmp_path))
    calls = []
    fake = types.ModuleType("rl_batch.analysis")
    fake.write_all = calls.append
    monkeypatch.setitem(sys.modules, "rl_batch.analysis", fake)
    assert collect_lib.run_analysis(str(tmp_path)) is None
    assert calls == [str(tmp_path)]


def test_collect_carries_a_calibrated_sweeps_calibration_or_says_why_not(two_jobs):
    # T and q come from calibration.json: a merged sweep without it moved T/T_ref and
    # said nothing (issue 48 D8).
    calibration = {"configurations": {"64x8:sqrt": {"step_s": 1.5}}, "rounds": 3}
    artifacts.write_json_atomic(os.path.join(two_jobs.job1, "calibration.json"), calibration)
    sweep_dir = str(two_jobs.root / "sweep")
    said = []
    collect_lib.collect(sweep_dir, [two_jobs.job1, two_jobs.job2], log=said.append)
    assert artifacts.read_json(os.path.join(sweep_dir, "calibration.json")) == calibration
    assert f"calibration.json carried from {two_jobs.job1} (T and q use its step times)" in said
    # Another source with another calibration: the sweep keeps its own and says so.
    other = {**calibration, "rounds": 5}
    artifacts.write_json_atomic(os.path.join(two_jobs.job2, "calibration.json"), other)
    said.clear()
    collect_lib.collect(sweep_dir, [two_jobs.job1, two_jobs.job2], log=said.append)
    assert artifacts.read_json(os.path.join(sweep_dir, "calibration.json")) == calibration
    assert any("differs and was not carried" in s and two_jobs.job2 in s for s in said), said
    # Two sources that disagree, no calibration in the sweep yet: none is carried.
    fresh = str(two_jobs.root / "fresh")
    said.clear()
    collect_lib.collect(fresh, [two_jobs.job1, two_jobs.job2], log=said.append)
    assert not os.path.exists(os.path.join(fresh, "calibration.json"))
    assert any(s.startswith("calibration.json not carried:") for s in said), said
