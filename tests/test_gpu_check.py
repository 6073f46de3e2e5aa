"""The one-accelerator check (experiments/gpu_check.py) on a tiny model on CPU: every
column is filled, the roofline is the bytes arithmetic, and the table prints."""

import json
import os
import subprocess
import sys

import pytest

from experiments import gpu_check
from rl_batch.models import flops
from rl_batch.models import transformer as model_lib
from tests.run_fixtures import TINY_MODEL


@pytest.mark.slow  # 61 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_gpu_check_tiny_rows(capsys):
    settings = gpu_check.Settings(
        preset="tiny-1m", batches=(4, 2), prompt_len=8, response_len=8, micro_batch_seqs=2,
        repeats=1, bandwidth=1e12, peak_flops=1e15, model_overrides=TINY_MODEL,
    )  # fmt: skip
    rows = gpu_check.run(settings)
    mc = gpu_check.model_config(settings)
    assert [row["batch"] for row in rows] == [2, 4]
    assert [row["micro_batches"] for row in rows] == [1, 2]
    for row in rows:
        b = row["batch"]
        # Params as stored (float32 here) + the whole [B, 16-slot] KV cache per step.
        step_bytes = 4 * mc.num_params + model_lib.kv_cache_bytes(mc, b, 16)
        assert row["decode_bytes_per_step"] == step_bytes
        assert abs(row["roofline_tokens_per_s"] - b * 1e12 / step_bytes) < 1e-6 * b * 1e12
        assert row["decode_tokens_per_s"] > 0 and row["update_tokens_per_s"] > 0
        model_flops = flops.update_flops(mc, tokens=b * 16, seq_len=16)
        assert abs(row["mfu"] - model_flops / row["update_s"] / 1e15) < 1e-9
        # Compiled estimates hold at least the params (and the update its Adam state).
        assert row["sample_estimate_bytes"] >= 4 * mc.num_params
        assert row["update_estimate_bytes"] >= 3 * 4 * mc.num_params
        assert row["sample_peak_bytes"] is None or row["sample_peak_bytes"] > 0
        # Both engines at long-tail lengths; the filled-cache roofline reads P + R / 2 slots.
        filled = 4 * mc.num_params + model_lib.kv_cache_bytes(mc, b, 8 + 4)
        assert abs(row["filled_roofline_tokens_per_s"] - b * 1e12 / filled) < 1e-6 * b * 1e12
        assert row["slots"] == max(b // 4, 1) and row["tail_max_over_mean"] >= 1
        assert row["static_tokens_per_s"] > 0 and row["continuous_tokens_per_s"] > 0
        assert 0 < row["static_useful"] <= row["continuous_useful"] <= 1
        # Each engine's roofline from its own work, by hand: the static engine's decode
        # steps each read the params and all 16 cache slots of its b rows.
        steps = row["static_decode_steps"]
        assert row["static_slots_read"] == b * 16 * steps
        static_bytes = steps * (4 * mc.num_params + model_lib.kv_cache_bytes(mc, b, 16))
        roof = row["static_decode_tokens"] * 1e12 / static_bytes
        assert abs(row["static_roofline_tokens_per_s"] - roof) < 1e-6 * roof
        slot_bytes = model_lib.kv_cache_bytes(mc, 1, 1)
        cont_bytes = row["continuous_decode_steps"] * 4 * mc.num_params
        cont_bytes += row["continuous_slots_read"] * slot_bytes
        roof = row["continuous_decode_tokens"] * 1e12 / cont_bytes
        assert abs(row["continuous_roofline_tokens_per_s"] - roof) < 1e-6 * roof
    table = capsys.readouterr().out
    assert "| B | prefill s | decode tok/s | roofline tok/s |" in table
    assert table.count("\n| 2 |") == 2 and table.count("\n| 4 |") == 2
    assert "| B | max/mean | static tok/s | static useful | static % roofline |" in table


@pytest.mark.slow  # 155 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_launch_gpu_check_writes_every_parts_tables_or_its_timeout(tmp_path):
    # The one-command GPU check at tiny shapes: a part that finishes gives its two
    # tables (and JSON), one past its limit is reported as timed out.
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHON=sys.executable, PART_SECONDS="300", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = repo + os.pathsep + env.get("PYTHONPATH", "")
    env["PARTS"], env["EXTRA_FLAGS"] = "tiny-1m:8:8:2", "--repeats=1 --vocab_size=64"
    cmd = ["bash", os.path.join(repo, "launch", "gpu_check.sh"), str(tmp_path / "ok")]
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "ok" / "gpu_check.md").read_text()
    assert "## tiny-1m, P + R = 8 + 8, batches 2" in md
    assert "| B | prefill s | decode tok/s |" in md and "\n\n| B | max/mean |" in md
    rows = json.loads((tmp_path / "ok" / "tiny-1m_16.json").read_text())["rows"]
    assert [r["batch"] for r in rows] == [2]
    # The mesh case: 2 methods x 2 engines x 2 meshes, each with the one-device tokens.
    assert "## mesh: both engines" in md
    assert md.count("mesh_check top_") == 8 and "mesh_check: 8 cases, tokens equal" in md
    env["PART_SECONDS"] = "1"
    cmd[-1] = str(tmp_path / "late")
    subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert "timed out after 1s" in (tmp_path / "late" / "gpu_check.md").read_text()
