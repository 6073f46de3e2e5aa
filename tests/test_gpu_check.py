"""The one-accelerator check (experiments/gpu_check.py) on a tiny model on CPU: every
column is filled, the roofline is the bytes arithmetic, and the table prints."""

from experiments import gpu_check
from rl_batch.models import flops
from rl_batch.models import transformer as model_lib
from tests.run_fixtures import TINY_MODEL


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
    table = capsys.readouterr().out
    assert "| B | prefill s | decode tok/s | roofline tok/s |" in table
    assert table.count("\n| 2 |") == 2 and table.count("\n| 4 |") == 2
    assert "| B | max/mean | static tok/s |" in table
