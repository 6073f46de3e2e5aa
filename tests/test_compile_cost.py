"""Smoke test of experiments/compile_cost.py at tiny shapes (no timing assertions)."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # 24 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_table_has_a_row_per_layout_and_program():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    cmd = [
        sys.executable,
        "-m",
        "experiments.compile_cost",
        "--preset=tiny-1m",
        "--num_layers=2",
        "--prompt_len=4",
        "--response_len=4",
        "--gen_batch=2",
        "--parts=sampler",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines() if line.startswith("| ")]
    body = [[cell.strip() for cell in row] for row in rows[2:]]  # (header, rule)
    assert [row[:3] for row in body] == [
        ["loop", "prefill", "1"],
        ["loop", "decode", "1"],
        ["scan", "prefill", "1"],
        ["scan", "decode", "1"],
    ]
    for row in body:
        assert float(row[3]) > 0 and float(row[4]) > 0  # program sizes were measured
    bad = subprocess.run(
        cmd + ["--layouts=loop,stacked"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0 and "'stacked' is not one of loop, scan" in bad.stderr
