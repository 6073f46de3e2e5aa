"""The reproduction notebook: stored clean, and executed end to end at its smallest setting.

The notebook runs in a fresh kernel of this interpreter (a kernelspec written to a temp
dir, so no installed ``python3`` kernelspec is needed) with its own environment: one CPU
device (``tests/conftest.py`` gives this process eight fake ones), the smallest setting,
and a temp output directory.
"""

import json
import os
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

from rl_batch import artifacts  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "colabs", "reproduce_batch_scaling.ipynb")
KERNEL = "rl_batch_colab_test"
CELL_TIMEOUT_S = 300


def _read():
    return nbformat.read(NOTEBOOK, as_version=4)


def test_notebook_is_stored_valid_and_without_outputs():
    nb = _read()
    nbformat.validate(nb)
    assert nb.nbformat == 4
    code = [c for c in nb.cells if c.cell_type == "code"]
    for i, cell in enumerate(code):
        assert cell.outputs == [] and cell.execution_count is None, f"code cell {i} has outputs"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters' (papermill)"
    assert "RL_BATCH_COLAB_SMALLEST" in tagged[0].source
    assert "RL_BATCH_COLAB_DIR" in tagged[0].source
    assert "image/png" not in json.dumps(nb)


def _write_kernelspec(jupyter_dir, env):
    spec_dir = os.path.join(jupyter_dir, "kernels", KERNEL)
    os.makedirs(spec_dir)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "rl_batch test",
        "language": "python",
        "env": env,
    }
    with open(os.path.join(spec_dir, "kernel.json"), "w") as f:
        json.dump(spec, f)


def _outputs_text(nb, cell_id=None):
    """Text of the outputs of every cell, or of the cell with id ``cell_id``."""
    parts = []
    for cell in nb.cells:
        if cell_id is not None and cell.get("id") != cell_id:
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif out.output_type in ("display_data", "execute_result"):
                for mime in ("text/markdown", "text/plain"):
                    if mime in out.data:
                        parts.append(out.data[mime])
                        break
    return "\n".join(parts)


@pytest.mark.slow
def test_notebook_runs_end_to_end_at_the_smallest_setting(tmp_path, monkeypatch):
    out_dir = str(tmp_path / "out")
    pythonpath = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    _write_kernelspec(
        str(tmp_path / "jupyter"),
        {
            "JAX_PLATFORMS": "cpu",
            # One device: every batch of the grid divides it.
            "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
            "RL_BATCH_COLAB_SMALLEST": "1",
            "RL_BATCH_COLAB_DIR": out_dir,
            "PYTHONPATH": pythonpath,
            "MPLBACKEND": "Agg",
        },
    )
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))  # connection files
    nb = _read()
    client = nbclient.NotebookClient(
        nb,
        kernel_name=KERNEL,
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's working directory
    )
    client.execute()  # Raises CellExecutionError, naming the cell, on any error.

    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.execution_count is not None, f"code cell {i} did not run"
            assert all(o.output_type != "error" for o in cell.outputs), f"code cell {i}"

    # On CPU the accelerator cell installs nothing and lists the device; Drive stays off.
    text = _outputs_text(nb, "accelerator")
    assert "accelerator: none (CPU)" in text and "devices: [CpuDevice(id=0)]" in text, text
    assert "installing" not in text
    assert f"outputs in {out_dir}" in _outputs_text(nb, "drive")

    sweep_dir = os.path.join(out_dir, "sweeps", "smallest")
    record = artifacts.read_json(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
    names = sorted(r["name"] for r in record["runs"])
    assert names == [f"p{p}_g8_sqrt_s{s}" for p in (16, 4, 8) for s in (0, 1)], names
    assert [r["status"] for r in record["runs"]] == ["finished"] * 6, record["runs"]
    for name in names:  # Each run learned: from the base policy (~0.37) to the target.
        summary = artifacts.read_json(
            os.path.join(sweep_dir, artifacts.RUNS_DIR, name, artifacts.SUMMARY_FILE)
        )
        assert summary["status"] == "finished" and summary["reached"], summary

    figures = os.listdir(os.path.join(sweep_dir, artifacts.FIGURES_DIR))
    assert "invariance.png" in figures, figures
    report = open(os.path.join(sweep_dir, artifacts.REPORT_FILE)).read()
    assert "grpo-P4-G8-sqrt" in report

    text = _outputs_text(nb)
    for name in names:  # The status table lists every run.
        assert f"| {name} |" in text
    # Both planner tables, each with its recommendation line, and the plan files.
    text = _outputs_text(nb, "planner")
    assert text.count("Recommendation:") == 2, text
    assert "Pilot (intermediate" in text
    plan = artifacts.read_json(os.path.join(sweep_dir, "plan.json"))
    pilot = artifacts.read_json(os.path.join(sweep_dir, "plan_pilot.json"))
    assert plan["mode"] == "full" and pilot["mode"] == "pilot"
    assert pilot["pilot"]["fraction"] == pytest.approx(0.3)
    assert sorted(r["config"] for r in plan["rows"]) == [
        "grpo-P16-G8-sqrt",
        "grpo-P4-G8-sqrt",
        "grpo-P8-G8-sqrt",
    ]
    # The printed verdict is the plan's, and agrees with the runs: a best configuration
    # iff one reached the target; one recommendation, or the candidates it cannot separate.
    reached = [r["config"] for r in plan["rows"] if r["reached"]]
    assert plan["best"] is not None and reached, plan  # a demo that learns recommends
    assert plan["best"] in plan["candidates"] and set(plan["candidates"]) <= set(reached)
    assert plan["sentence"] in text
    if plan["recommended_set"]:
        assert plan["sentence"].startswith("Use B = ") or plan["sentence"].startswith("Use grpo")
    else:
        assert plan["sentence"].startswith("Undecided at this power:")
