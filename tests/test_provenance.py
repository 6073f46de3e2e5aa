"""provenance.json: what produced a run, and the report's summary of a sweep's runs."""

import os

import jax
import pytest

from rl_batch import artifacts, provenance
from rl_batch.analysis import curves, report
from rl_batch.analysis import time_to_target as analysis
from rl_batch.runs import run as run_lib
from tests import analysis_fixtures as fx
from tests.run_fixtures import tiny_run_config


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


def _session(**changes):
    s = {
        "started_at": "2026-12-01T00:00:00+00:00",
        "ended_at": "2026-12-01T00:01:00+00:00",
        "status": "finished",
        "load_start": [1.5, 1.0, 0.5],
        "load_end": [2.5, 1.0, 0.5],
        "software": {"python": "3.11.7", "jax": "0.10.2", "numpy": "2.4.6"},
        "git": {"commit": "abc", "dirty": False},
        "hardware": {
            "platform": "cpu",
            "device_kind": "cpu",
            "device_count": 8,
            "process_count": 1,
            "cpu_model": "Some CPU",
            "cpu_count": 2,
        },
    }
    for key, value in changes.items():
        group, field = key.split(".")
        s[group] = {**s[group], field: value}
    return s


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_run_records_its_software_hardware_and_load_per_session(work_dir, tmp_path):
    run_dir = str(tmp_path / "run")
    run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=16), progress=False)
    run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=32), progress=False)
    sessions = provenance.read(run_dir)
    assert len(sessions) == 2  # a fresh start, then a resume
    s = sessions[-1]
    assert s["software"]["jax"] == jax.__version__
    assert set(provenance.PACKAGES) <= set(s["software"]) and s["software"]["python"]
    assert s["hardware"]["platform"] == "cpu"
    assert s["hardware"]["device_count"] == jax.device_count()
    assert s["hardware"]["cpu_count"] == os.cpu_count() and s["hardware"]["cpu_model"]
    assert len(s["load_start"]) == 3 and len(s["load_end"]) == 3
    assert s["status"] == "finished" and s["ended_at"] >= s["started_at"]
    git = provenance.imported_git_state()  # (read at import: the code that ran)
    if git is not None:  # (a checkout: the commit of the imported project)
        assert s["git"] == git and len(git["commit"]) == 40


def test_git_state_outside_a_checkout_is_none(tmp_path):
    assert provenance.git_state(str(tmp_path)) is None


def test_sweep_summary_prints_shared_fields_once_and_warns_on_differences():
    lines = provenance.describe_sweep(
        {
            "a": [_session()],
            "b": [_session(**{"software.jax": "0.9.0"})],
            "c": [_session(), _session(**{"hardware.cpu_model": "Other CPU"})],
            "d": [],
        }
    )
    text = "\n".join(lines)
    assert text.count("software.numpy: 2.4.6") == 1
    assert "git.commit: abc" in text
    assert "software.jax: 0.10.2" not in text.split("**Warning")[0]
    assert "differ in software.jax: 0.10.2 (a, c); 0.9.0 (b)" in text
    assert "differ in hardware.cpu_model: Some CPU (a, b, c); Other CPU (c)" in text
    assert "1.50 to 2.50" in text
    assert "No provenance recorded for: d" in text
    assert "differ in" not in "\n".join(provenance.describe_sweep({"a": [_session()]}))


def test_the_report_prints_the_sweeps_provenance_and_warns_on_a_mismatch(tmp_path):
    configs = [(p, 8, "sqrt", m) for p, m in ((8, 1.0), (16, 1.0))]
    d = fx.write_sweep(str(tmp_path / "s"), configs=configs, seed_factors=(1.0,))
    runs = sorted(os.listdir(os.path.join(d, artifacts.RUNS_DIR)))
    for name, jax_version in zip(runs, ["0.10.2", "0.9.0"]):
        run_dir = os.path.join(d, artifacts.RUNS_DIR, name)
        provenance._write(run_dir, [_session(**{"software.jax": jax_version})])
    text = report.build_report(analysis.analyze_sweep(curves.load_sweep(d), n_boot=20))
    section = text.split("## Software and hardware")[1].split("## Time to target")[0]
    assert "- software.numpy: 2.4.6" in section and "- git.commit: abc" in section
    assert f"differ in software.jax: 0.10.2 ({runs[0]}); 0.9.0 ({runs[1]})" in section
