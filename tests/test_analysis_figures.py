"""Figures and report.md: written, non-empty, with the known answers; missing data skipped."""

import json
import os
import subprocess
import sys

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.analysis import curves, figures, planner
from rl_batch.analysis import time_to_target as ttt

NAMES = (
    "invariance",
    "group_size",
    "lr_rule",
    "throughput_ratio",
    "critical_batches",
    "time_to_target",
    "accuracy_vs_time",
    "seed_curves",
    "ratios",
    "time_breakdown",
    "training_signals",
)


def _check_files(paths):
    for p in paths:
        assert os.path.getsize(p) > 1000, p
        with open(p, "rb") as f:
            head = f.read(5)
        assert head in (b"\x89PNG\r", b"%PDF-"), (p, head)


@pytest.mark.slow  # 35 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_write_all_full_sweep(tmp_path):
    d = fx.write_sweep(str(tmp_path / "s"))
    with open(os.path.join(d, "throughput.json"), "w") as f:
        json.dump(fx.throughput_json(), f)
    paths = figures.write_all(d, n_boot=100)
    expected = [os.path.join(d, "figures", f"{n}.{ext}") for n in NAMES for ext in ("png", "pdf")]
    assert paths == [*expected, os.path.join(d, artifacts.REPORT_FILE)]
    _check_files(expected)
    report = open(paths[-1]).read()
    assert "critical training batch: **256** responses" in report
    assert "plateau (90% of best measured): c = **1024**" in report
    rec = (
        "Recommendation: Use B = 256 (grpo-P32-G8-sqrt): faster than the next, "
        "grpo-P16-G8-sqrt, which takes 21 % longer"
    )
    assert rec in report
    assert "Median actor B_simple over runs: 256 responses (layout strided)." in report
    # The never-reaching configuration reads "not reached", never a number.
    row = next(line for line in report.splitlines() if line.startswith("| grpo-P64-G8-fixed"))
    assert row.count("not reached") >= 3
    assert "Skipped" not in report


@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_write_all_skips_figures_without_data(tmp_path):
    # Only a sqrt family, no throughput file, no gradient fields: no group-size pair and no
    # fixed-LR point; generation throughput still comes from the run metrics.
    configs = [(p, 8, "sqrt", m) for p, m in ((8, 1.0), (16, 1.0), (32, 1.4))]
    d = fx.write_sweep(
        str(tmp_path / "s"), configs=configs, seed_factors=(1.0,), noise_fields=False
    )
    paths = figures.write_all(d, n_boot=50)
    names = {os.path.splitext(os.path.basename(p))[0] for p in paths}
    assert names == {
        "invariance",
        "throughput_ratio",
        "critical_batches",
        "time_to_target",
        "accuracy_vs_time",
        "seed_curves",
        "ratios",
        "time_breakdown",
        "training_signals",
        "report",
    }
    _check_files([p for p in paths if not p.endswith(".md")])
    report = open(os.path.join(d, "report.md")).read()
    assert "Skipped (no data): group_size, lr_rule." in report
    assert "Source: run metrics" in report
    # r_N(256) = 1.4 > 1.2, but one seed gives no interval: no verdict, only the means.
    assert "critical training batch: undecided at this power (128 by the means)" in report


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_write_all_when_the_reference_never_reaches(tmp_path):
    configs = [(p, 8, "sqrt", 1.0) for p in (8, 16)]
    d = fx.write_sweep(str(tmp_path / "s"), configs=configs, seed_factors=(1.0,))
    paths = figures.write_all(d, target=1.5, n_boot=20)  # Nobody reaches accuracy 1.5.
    assert not any("time_to_target" in p for p in paths)
    report = open(paths[-1]).read()
    assert "| grpo-P8-G8-sqrt | 64 | 8 | 8 | sqrt | 0/1 | not reached |" in report
    assert "Recommendation: none (no configuration reached the target" in report


@pytest.mark.slow  # 8 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_figures_cli(tmp_path):
    d = fx.write_sweep(str(tmp_path / "s"), configs=fx.STANDARD_CONFIGS[:2], seed_factors=(1.0,))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run(
        [sys.executable, "-m", "experiments.figures", f"--sweep={d}", "--n_boot=20", "--tol=0.5"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    assert out.returncode == 0, out.stderr
    assert os.path.join(d, "report.md") in out.stdout.splitlines()
    assert os.path.getsize(os.path.join(d, "figures", "invariance.png")) > 1000


def test_analysis_never_imports_jax():
    code = (
        "import sys, rl_batch.analysis, rl_batch.analysis.figures, rl_batch.analysis.report\n"
        "bad = [m for m in ('jax', 'flax', 'optax') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def _errorbar_containers(fig):
    from matplotlib.container import ErrorbarContainer

    return [c for ax in fig.axes for c in ax.containers if isinstance(c, ErrorbarContainer)]


def test_no_error_bars_from_one_seed(tmp_path):
    from rl_batch.analysis import curves
    from rl_batch.analysis import time_to_target as ttt

    configs = [(p, 8, "sqrt", m) for p, m in ((8, 1.0), (16, 1.0), (32, 1.05))]
    one = fx.write_sweep(str(tmp_path / "one"), configs=configs, seed_factors=(1.0,))
    a = ttt.analyze_sweep(curves.load_sweep(one), n_boot=50)
    for fig in (figures.figure_critical_batches(a, None), figures.figure_time_to_target(a)):
        assert _errorbar_containers(fig) == []  # Hollow markers only, no zero-length bars.
        labels = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().texts]
        assert any("no CI" in t for t in labels), labels
    two = fx.write_sweep(str(tmp_path / "two"), configs=configs)
    a = ttt.analyze_sweep(curves.load_sweep(two), n_boot=50)
    assert _errorbar_containers(figures.figure_critical_batches(a, None))
    assert _errorbar_containers(figures.figure_time_to_target(a))


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_report_warns_when_throughput_measured_another_preset(tmp_path):
    d = fx.write_sweep(
        str(tmp_path / "s"),
        configs=fx.STANDARD_CONFIGS[:3],
        seed_factors=(1.0,),
        config_extra={"model": {"preset": "tiny-1m"}, "init": {"source": "pretrain"}},
    )
    obj = dict(
        fx.throughput_json(),
        settings={"preset": "tiny-5m", "vocab_size": 512, "prompt_len": 16, "new_tokens": 32},
    )
    with open(os.path.join(d, "throughput.json"), "w") as f:
        json.dump(obj, f)
    report = open(figures.write_all(d, n_boot=20)[-1]).read()
    assert (
        "The throughput file measured: preset tiny-5m, vocab 512, 16 prompt tokens, "
        "32 new tokens per sequence." in report
    )
    warn = "**Warning:** throughput.json measured preset tiny-5m, but the runs use model.preset"
    assert report.count(warn) == 2  # At the top and in its section.


def test_every_figure_names_sweep_target_and_seeds_and_rings_the_candidates(tmp_path):
    d = fx.write_sweep(str(tmp_path / "s"), seed_factors=(0.9, 1.0, 1.1))
    a = ttt.analyze_sweep(curves.load_sweep(d))
    for name in NAMES:
        fig = getattr(figures, f"figure_{name}")(
            *((a, None) if name == "critical_batches" else (a,))
        )
        if fig is None:  # (critical_batches without throughput data still has r_N)
            continue
        title = fig._suptitle.get_text()
        assert "sweep synthetic" in title and "target 0.8" in title and "3 seed(s)" in title
    # T/T_ref intervals overlap at 10% seed spread: the candidates are ringed, not a star.
    plan = planner.plan_full(a)
    assert not plan.decided and len(plan.candidates) > 1
    ax = figures.figure_time_to_target(a).axes[0]
    rings = [ln for ln in ax.lines if ln.get_markersize() == 15]
    assert len(rings) == len(plan.candidates)
    # Another group size at the same batch sits beside the reference's, not on top of it.
    xs = sorted(float(ln.get_xdata()[0]) for ln in rings)
    assert len(set(xs)) == len(xs)


def test_eval_times_interpolate_on_the_update_lines(tmp_path):
    d = fx.write_sweep(str(tmp_path / "s"), configs=[(8, 8, "sqrt", 1.0)], seed_factors=(1.0,))
    run = curves.load_sweep(d).runs[0]
    t = figures.eval_times(run)
    # Every update takes time_per_update_s(64) for 64 responses.
    expected = run.eval_responses / 64 * fx.time_per_update_s(64)
    np.testing.assert_allclose(t, expected, rtol=1e-6)
