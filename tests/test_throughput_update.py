"""Smoke test of ``experiments.throughput --part=update`` / ``--part=all`` (no timing checks)."""

import json
import os
import subprocess
import sys

import pytest

from rl_batch.analysis import cost_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # 29 s in the fast tier at b3308b3 (2 cores, load 2-5)
@pytest.mark.parametrize("part", ["update", "all"])
def test_update_part_writes_the_json_the_analysis_reads(tmp_path, part):
    out = tmp_path / "throughput.json"
    out.write_text(json.dumps({"device": "x", "generation": [], "update": [], "other": 1}))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "experiments.throughput", f"--part={part}"]
    cmd += ["--preset=tiny-1m", "--batches=2,4", "--prompt_len=5", "--new_tokens=4"]
    cmd += ["--min_repeats=1", "--min_time_s=0", "--matmul_size=128", "--nohf", f"--out={out}"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "% matmul" in proc.stdout
    result = json.loads(out.read_text())
    assert result["other"] == 1  # keys of other parts survive
    parsed = cost_model.load_throughput(str(out))
    assert [(p.batch, p.tokens) for p in parsed.update] == [(2, 18), (4, 36)]
    for row in result["update"]:
        assert row["tokens_per_s"] == pytest.approx(row["tokens"] / row["time_s"])
        assert row["fraction_of_matmul_peak"] > 0
    expected_generation = [2, 4] if part == "all" else []
    assert [p.batch for p in parsed.generation] == expected_generation
