"""experiments.runtimes: the generated record of measured study runtimes."""

import json
import os

import pytest

from experiments import runtimes


def _sweep(root, name="grpo_cpu", finished=True):
    """A sweep directory with the files the record reads: two invocations (the first
    interrupted), three finished runs and a calibration of three configurations."""
    d = os.path.join(root, name)
    os.makedirs(d)
    commands = [
        {
            "argv": ["x.py"],
            "module": "experiments.grpo_sweep",
            "started_at": "2026-01-01T10:00:00+00:00",
            "wall_s": 60.0,
            "load_start": [1.0, 1.0, 1.0],
            "load_end": [2.0, 2.0, 2.0],
            "status": "interrupted",
            "git": {"commit": "a" * 40, "dirty": False},
        },
        {
            "argv": ["x.py", "--config.sweep.seeds=0,1"],
            "module": "experiments.grpo_sweep",
            "started_at": "2026-01-01T11:00:00+00:00",
            "wall_s": 750.0,
            "load_start": [3.04, 2.0, 1.0],
            "load_end": [1.96, 4.0, 5.66],
            "status": "finished" if finished else "interrupted",
            "git": {"commit": "b" * 40, "dirty": True},
        },
    ]
    with open(os.path.join(d, "commands.jsonl"), "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in commands)
    runs = [{"name": f"r{i}", "status": s} for i, s in enumerate(["finished"] * 3 + ["failed"])]
    with open(os.path.join(d, "sweep.json"), "w") as f:
        json.dump({"name": name, "reference_key": "8x8:sqrt", "runs": runs}, f)
    configs = {"4x8:sqrt": 0.1, "8x8:fixed": 0.2, "8x8:sqrt": 0.25, "16x4:sqrt": 0.3}
    cal = {
        "configs": {k: {"step_s_median": v, "step_s": [v]} for k, v in configs.items()},
        "host": {"cpu_model": "Test CPU", "cpu_count": 2},
        "load_start": [0.5, 0.5, 0.5],
        "load_end": [1.25, 1.0, 1.0],
    }
    with open(os.path.join(d, "calibration.json"), "w") as f:
        json.dump(cal, f)
    return d


def test_q_at_batch_prefers_the_reference_then_sqrt():
    steps = {"4x8:sqrt": 0.1, "8x8:fixed": 0.2, "16x4:sqrt": 0.32, "8x8:sqrt": 0.25}
    assert runtimes.q_at_batch(steps, prefer="8x8:sqrt") == ("8x8:sqrt", 256.0)
    assert runtimes.q_at_batch(steps, prefer="8x8:fixed") == ("8x8:fixed", 320.0)
    assert runtimes.q_at_batch(steps) == ("16x4:sqrt", 200.0)  # sqrt first, then by key
    assert runtimes.q_at_batch({"4x8:sqrt": 0.1}) is None


def test_record_and_page_from_a_sweep(tmp_path):
    d = _sweep(str(tmp_path))
    r = runtimes.sweep_record(d, label="fresh clone")
    assert r["command"] == "python -m experiments.grpo_sweep --config.sweep.seeds=0,1"
    assert (r["commit"], r["dirty"], r["wall_s"], r["invocations"]) == ("b" * 40, True, 750.0, 2)
    assert (r["runs_finished"], r["runs"], r["q_key"], r["q"]) == (3, 4, "8x8:sqrt", 256.0)
    row = runtimes.table_row(r)
    assert row == (
        "| grpo_cpu (fresh clone) | `python -m experiments.grpo_sweep --config.sweep.seeds=0,1`"
        " | bbbbbbb (dirty) | Test CPU, 2 cores | 256 (8x8:sqrt; load 0.5/1.2)"
        " | 3.0/2.0 (15 min at end: 5.7) | 12.5 min (last of 2 invocations)"
        " | 2026-01-01T11:00:00+00:00 | 3/4 |"
    )


def test_update_replaces_the_same_sweep_and_keeps_others(tmp_path):
    docs = str(tmp_path / "docs")
    a = _sweep(str(tmp_path), "a")
    b = _sweep(str(tmp_path), "b")
    runtimes.update(docs, [a])
    runtimes.update(docs, [b, a], label="again")
    records = runtimes.read_records(docs)
    assert [(r["sweep"], r["label"]) for r in records] == [("b", "again"), ("a", "again")]
    with open(os.path.join(docs, "runtimes.md")) as f:
        lines = f.read().splitlines()
    rows = [x for x in lines if x.startswith("| a ") or x.startswith("| b ")]
    assert rows == [runtimes.table_row(r) for r in records]


def test_a_sweep_without_a_finished_command_is_refused(tmp_path):
    d = _sweep(str(tmp_path), finished=False)
    with pytest.raises(ValueError, match="no finished invocation"):
        runtimes.sweep_record(d)


def test_the_shipped_page_is_generated_and_quoted():
    """docs/runtimes.md is `page` of docs/runtimes.jsonl (not edited by hand), and the
    README, the notebook and colabs/README point to it."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    docs = os.path.join(root, "docs")
    records = runtimes.read_records(docs)
    assert records, "docs/runtimes.jsonl has no record"
    with open(os.path.join(docs, "runtimes.md")) as f:
        assert f.read() == runtimes.page(records)
    for path in ("README.md", "colabs/README.md", "colabs/reproduce_batch_scaling.ipynb"):
        with open(os.path.join(root, path)) as f:
            assert "docs/runtimes.md" in f.read(), path
