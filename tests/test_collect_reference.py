"""launch.collect after a job-array sweep: the configured reference and the grid's runs.json.

The jobs are real ``rl_batch.sweeps.sweep.run_sweep(only=...)`` calls (what ``--only`` runs), so
each run directory holds the ``sweep_point.json`` the sweep program writes; the training is
replaced by a synthetic run (``tests.analysis_fixtures.write_run``) whose ``config.json`` is
the resolved config, as ``rl_batch.runs.run`` writes it.
"""

import json
import os
import subprocess
import sys

import pytest

from experiments.configs import base
from launch import collect as collect_lib
from rl_batch import artifacts
from rl_batch.analysis import curves, time_to_target
from rl_batch.sweeps import sweep
from tests import analysis_fixtures as af
from tests.run_fixtures import tiny_run_config
from tests.test_launch import _write_exe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Time-to-target multipliers: the smallest batch (4x4) learns fastest per response, so a
# ratio against it differs from one against the configured 8x4.
TAU_MULT = {"4x4:sqrt": 0.8, "8x4:sqrt": 1.0, "16x4:sqrt": 1.5}
CONFIGURED = "8x4:sqrt"
ALL_POINTS = [f"p{p}_g4_sqrt_s{s}" for p in (4, 8, 16) for s in (0, 1)]


def _sweep_config(work_dir, reference=CONFIGURED):
    c = base.sweep_config(tiny_run_config(str(work_dir)))
    c.sweep.prompts, c.sweep.group_sizes, c.sweep.seeds = "4,8,16", "4", "0,1"
    c.sweep.reference = reference
    c.target, c.budget_responses, c.eval_every_responses = af.TARGET, af.BUDGET, af.EVAL_EVERY
    return c


def _synthetic_run(spec):
    """Stands in for rl_batch.runs.run.run: metrics with a known time to target."""
    config = spec.inputs
    point_key = f"{config.prompts}x{config.group_size}:{config.lr_rule}"
    af.write_run(
        config.run_dir,
        prompts=config.prompts,
        group_size=config.group_size,
        lr_rule=config.lr_rule,
        seed=config.seed,
        tau=af.TAU0 * TAU_MULT[point_key] * af.SEED_TAU_FACTORS[config.seed],
    )
    artifacts.write_json_atomic(os.path.join(config.run_dir, "config.json"), spec.to_json())
    return {"status": "finished"}


def _run_jobs(sweep_dir, names, reference=CONFIGURED):
    """Runs grid points as separate jobs of an array would (``--only``); returns the config."""
    c = _sweep_config(os.path.join(os.path.dirname(sweep_dir), "work"), reference)
    for name in names:
        sweep.run_sweep(c, sweep_dir, only=name, run_fn=_synthetic_run, log=lambda s: None)
    return c


def _analysis_reference(sweep_dir):
    return time_to_target.analyze_sweep(curves.load_sweep(sweep_dir), n_boot=20).reference


def test_job_array_sweep_keeps_the_configured_reference(tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    c = _run_jobs(sweep_dir, ALL_POINTS)
    assert not os.path.exists(os.path.join(sweep_dir, "sweep.json"))  # --only writes none.

    warnings = []
    result = collect_lib.collect(sweep_dir, log=warnings.append)  # Re-index in place.
    assert warnings == []
    on_disk = artifacts.read_json(os.path.join(sweep_dir, "sweep.json"))
    assert on_disk == result.sweep
    assert on_disk["reference"] == "p8_g4_sqrt_s0"
    assert on_disk["reference_key"] == CONFIGURED
    assert on_disk["grid"] == c.sweep.to_dict()
    # The job's own entry fields travel too, as in a plain sweep's sweep.json.
    entry = next(r for r in on_disk["runs"] if r["name"] == "p16_g4_sqrt_s1")
    assert entry["key"] == "16x4:sqrt" and isinstance(entry["wall_s"], float)

    analysis = time_to_target.analyze_sweep(curves.load_sweep(sweep_dir), n_boot=20)
    assert analysis.reference.key == CONFIGURED
    ratios = analysis.ratios[analysis.reference]
    assert ratios.r_n.mean == pytest.approx(1.0)
    big = next(k for k in analysis.stats if k.key == "16x4:sqrt")
    assert analysis.ratios[big].r_n.mean == pytest.approx(1.5, rel=0.05)

    # Without the recorded reference the analysis would measure against 4x4 (r_N ~ 1.9):
    # this is what the test guards against.
    artifacts.write_json_atomic(
        os.path.join(sweep_dir, "sweep.json"),
        {k: v for k, v in on_disk.items() if k not in ("reference_key", "grid")}
        | {"reference": None},
    )
    assert _analysis_reference(sweep_dir).key == "4x4:sqrt"
    # ...and collecting again over such a sweep.json (the old collect wrote it) repairs it.
    again = collect_lib.collect(sweep_dir, log=warnings.append).sweep
    assert (again["reference"], again["reference_key"]) == ("p8_g4_sqrt_s0", CONFIGURED)
    assert again["grid"] == c.sweep.to_dict()
    assert _analysis_reference(sweep_dir).key == CONFIGURED


def test_collect_from_job_directories_uses_their_sweep_points(tmp_path):
    # Each job wrote into its own directory (e.g. node-local disks); collect gathers them.
    for i, names in enumerate((ALL_POINTS[:3], ALL_POINTS[3:])):
        _run_jobs(str(tmp_path / f"job{i}"), names)
    merged = str(tmp_path / "merged")
    result = collect_lib.collect(merged, [str(tmp_path / "job0"), str(tmp_path / "job1")])
    assert (result.sweep["reference"], result.sweep["reference_key"]) == (
        "p8_g4_sqrt_s0",
        CONFIGURED,
    )
    assert _analysis_reference(merged).key == CONFIGURED


def test_explicit_reference_wins_and_is_recorded_consistently(tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    _run_jobs(sweep_dir, ALL_POINTS)
    warnings = []
    result = collect_lib.collect(sweep_dir, reference="p16_g4_sqrt_s0", log=warnings.append)
    assert (result.sweep["reference"], result.sweep["reference_key"]) == (
        "p16_g4_sqrt_s0",
        "16x4:sqrt",
    )
    assert any(
        "not the reference the jobs were launched with ('p8_g4_sqrt_s0'" in w for w in warnings
    )
    assert _analysis_reference(sweep_dir).key == "16x4:sqrt"
    # The choice is kept by a later collect without --reference (with a warning).
    warnings.clear()
    again = collect_lib.collect(sweep_dir, log=warnings.append).sweep
    assert again["reference"] == "p16_g4_sqrt_s0"
    assert any("pass --reference=p8_g4_sqrt_s0" in w for w in warnings)


def test_disagreeing_references_are_refused_naming_the_runs(tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    _run_jobs(sweep_dir, ALL_POINTS[:4])
    _run_jobs(sweep_dir, ALL_POINTS[4:], reference="16x4:sqrt")  # An edited sweep config.
    with pytest.raises(ValueError) as err:
        collect_lib.collect(sweep_dir, log=lambda s: None)
    message = str(err.value)
    assert "different reference configurations" in message
    assert "'p8_g4_sqrt_s0' (8x4:sqrt): run p4_g4_sqrt_s0, run p4_g4_sqrt_s1" in message
    assert "'p16_g4_sqrt_s0' (16x4:sqrt): run p16_g4_sqrt_s0, run p16_g4_sqrt_s1" in message
    assert "--reference=RUN_NAME" in message
    assert not os.path.exists(os.path.join(sweep_dir, "sweep.json"))  # Nothing written.
    cli = [sys.executable, "-m", "launch.collect", f"--sweep_dir={sweep_dir}"]
    proc = subprocess.run(cli, cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 1 and "different reference configurations" in proc.stderr
    assert not os.path.exists(os.path.join(sweep_dir, "sweep.json"))

    # Choosing one settles it; the grids differ (sweep.reference is part of them), so
    # sweep.json records none rather than one of them.
    warnings = []
    chosen = collect_lib.collect(sweep_dir, reference="8x4:sqrt", log=warnings.append).sweep
    assert (chosen["reference"], chosen["reference_key"]) == ("8x4:sqrt", CONFIGURED)
    assert "grid" not in chosen
    assert any("different reference configurations" in w for w in warnings)
    assert any("different sweep grids" in w for w in warnings)
    assert _analysis_reference(sweep_dir).key == CONFIGURED


def test_reference_run_that_never_ran_is_recorded_by_its_configuration(tmp_path):
    sweep_dir = str(tmp_path / "sweep")
    c = _run_jobs(sweep_dir, [n for n in ALL_POINTS if n != "p8_g4_sqrt_s0"])
    grid = json.loads(sweep.list_runs(c, sweep_dir))
    warnings = []
    result = collect_lib.collect(sweep_dir, grid=grid, log=warnings.append)
    assert (result.sweep["reference"], result.sweep["reference_key"]) == (CONFIGURED, CONFIGURED)
    assert any("'p8_g4_sqrt_s0'" in w and "no run directory" in w for w in warnings)
    status = {r["name"]: r["status"] for r in result.sweep["runs"]}
    assert status["p8_g4_sqrt_s0"] == "missing"
    # The other seed of 8x4 stands for it (a run name alone would not be found).
    assert _analysis_reference(sweep_dir).key == CONFIGURED


def test_runs_collected_without_a_sweep_json_keep_the_sweeps_estimator(tmp_path):
    """A folder of runs (no sweep.json, no sweep_point.json) merges into a sweep.json with
    the band and crossing the runs were configured with, so the analysis reads the same
    N* as the local sweep's (the old collect dropped them: single target, "linear")."""
    local, merged = str(tmp_path / "S"), str(tmp_path / "M")
    c = _sweep_config(str(tmp_path / "work"))
    c.target_band_lo, c.target_crossing = 0.6, "update"
    sweep.run_sweep(c, local, run_fn=_synthetic_run, log=lambda s: None)
    collect_lib.collect(merged, [os.path.join(local, "runs")], log=lambda s: None)
    ours, theirs = (artifacts.read_json(os.path.join(d, "sweep.json")) for d in (local, merged))
    keys = ("algo", "target", "target_band_lo", "target_crossing", "budget_responses")
    assert {k: theirs.get(k) for k in keys} == {k: ours[k] for k in keys}
    assert (theirs["target_band_lo"], theirs["target_crossing"]) == (0.6, "update")
    a, b = (time_to_target.analyze_sweep(curves.load_sweep(d), n_boot=20) for d in (local, merged))
    assert (b.band_lo, b.crossing) == (0.6, "update")
    assert {n: t.n_star for n, t in b.targets.items()} == {
        n: t.n_star for n, t in a.targets.items()
    }
    assert {k: s.n_star.mean for k, s in b.stats.items()} == {
        k: s.n_star.mean for k, s in a.stats.items()
    }


def test_runs_with_another_band_or_crossing_are_not_one_sweep():
    config = {"algo": "grpo", "target": 0.5, "target_band_lo": 0.4, "target_crossing": "update"}
    for key, value in (("target_band_lo", None), ("target_crossing", "linear")):
        with pytest.raises(ValueError, match=f"runs disagree on '{key}'"):
            collect_lib.sweep_fields({"a": config, "b": {**config, key: value}})


# ----------------------------------------------------------------------- make_jobs hint

# gcloud: `compute tpus tpu-vm scp --recurse TPU:PATH DEST` copies from the fake worker home.
FAKE_GCLOUD_SCP = r"""#!/usr/bin/env bash
printf '%s\n' "$@" >> "$FAKE_OUT/gcloud_calls.txt"
[[ "$1 $2 $3 $4" == "compute tpus tpu-vm scp" ]] || exit 7
shift 4
[[ "$1" == --recurse ]] && shift
src="${1#*:}"
[[ "$src" == /* ]] || src="$FAKE_HOME/$src"
cp -r "$src" "$2"
"""


def _hint_env(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "out").mkdir()
    _write_exe(bin_dir / "gcloud", FAKE_GCLOUD_SCP)
    _write_exe(bin_dir / "python", f'#!/usr/bin/env bash\nexec {sys.executable} "$@"\n')
    env = dict(os.environ)
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        PYTHONPATH=REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        FAKE_OUT=str(tmp_path / "out"),
        FAKE_HOME=str(tmp_path / "home"),
    )
    for var in ("TPU_NAME", "TPU_ZONE", "TPU_PROJECT", "TPU_REMOTE_DIR", "GCLOUD"):
        env.pop(var, None)
    return env


def _make_jobs_hint(args, cwd, env):
    cmd = [sys.executable, "-m", "launch.make_jobs", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    hints = [line for line in proc.stdout.splitlines() if line.startswith("collect: ")]
    assert len(hints) == 1, proc.stdout
    return hints[0].removeprefix("collect: ")


def test_tpu_hint_fetches_and_collects_with_runs_json(tmp_path):
    env = _hint_env(tmp_path)
    workstation = tmp_path / "workstation"
    workstation.mkdir()
    # The sweep directory on the workers, relative to their checkout (~/rl_batch).
    remote_sweep = "sweeps_remote/grpo_tpu"
    worker_sweep = str(tmp_path / "home" / "rl_batch" / remote_sweep)
    c = _sweep_config(tmp_path / "work")
    grid_file = workstation / "grid.json"
    grid_file.write_text(sweep.list_runs(c, worker_sweep))  # What --list_runs prints.
    hint = _make_jobs_hint(
        [
            "--scheduler=tpu",
            "--tpu=my-v5e",
            "--zone=us-west4-a",
            "--sweep_config=experiments/configs/grpo_tpu.py",
            f"--sweep_dir={remote_sweep}",
            f"--runs_json={grid_file}",
        ],
        workstation,
        env,
    )
    runs_json = workstation / "jobs" / "grpo_tpu" / "runs.json"
    assert runs_json.is_file()  # Not in the sweep directory: the hint must name it.
    assert f"--runs_json={runs_json}" in hint

    # Two points never ran on the slice.
    ran = [n for n in ALL_POINTS if n not in ("p16_g4_sqrt_s0", "p16_g4_sqrt_s1")]
    _run_jobs(worker_sweep, ran)
    proc = subprocess.run(["bash", "-c", hint], cwd=workstation, env=env, text=True,
                          capture_output=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    merged = json.loads((workstation / "sweeps" / "grpo_tpu" / "sweep.json").read_text())
    status = {r["name"]: r["status"] for r in merged["runs"]}
    assert status == {n: "finished" if n in ran else "missing" for n in ALL_POINTS}
    assert (merged["reference"], merged["reference_key"]) == ("p8_g4_sqrt_s0", CONFIGURED)
    calls = (tmp_path / "out" / "gcloud_calls.txt").read_text().splitlines()
    assert f"my-v5e:rl_batch/{remote_sweep}" in calls and "--worker=0" in calls


def test_local_hint_with_out_dir_elsewhere_still_finds_runs_json(tmp_path):
    env = _hint_env(tmp_path)
    sweep_dir = tmp_path / "sweep"
    c = _sweep_config(tmp_path / "work")
    grid_file = tmp_path / "grid.json"
    grid_file.write_text(sweep.list_runs(c, str(sweep_dir)))
    out_dir = tmp_path / "elsewhere"
    hint = _make_jobs_hint(
        [
            "--scheduler=local",
            "--sweep_config=experiments/configs/grpo_cpu.py",
            f"--sweep_dir={sweep_dir}",
            f"--runs_json={grid_file}",
            f"--out_dir={out_dir}",
        ],
        tmp_path,
        env,
    )
    assert f"--runs_json={out_dir / 'runs.json'}" in hint
    _run_jobs(str(sweep_dir), ALL_POINTS[:2])
    proc = subprocess.run(["bash", "-c", hint], cwd=tmp_path, env=env, text=True,
                          capture_output=True)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    merged = json.loads((sweep_dir / "sweep.json").read_text())
    assert [r["status"] for r in merged["runs"]].count("missing") == 4
