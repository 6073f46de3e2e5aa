"""Smoke test of experiments/throughput.py at tiny settings (no timing assertions)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import throughput
from rl_batch.models import flops
from rl_batch.models import transformer as model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # 26 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sampler_part_runs_and_writes_json(tmp_path):
    out = tmp_path / "throughput.json"
    # Another part's results already in the file must survive.
    out.write_text(json.dumps({"device": "x", "generation": [], "update": [{"batch": 2}]}))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    cmd = [
        sys.executable,
        "-m",
        "experiments.throughput",
        "--part=sampler",
        "--preset=tiny-1m",
        "--batches=1,3",
        "--prompt_len=5",
        "--new_tokens=4",
        "--min_repeats=1",
        "--min_time_s=0",
        "--matmul_size=128",
        "--hf_threads=1",
        "--cpu_devices=2",
        f"--out={out}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "HF parity" in proc.stdout and "% matmul" in proc.stdout
    assert "data-parallel over 2 device(s)" in proc.stdout and "1-dev tok/s" in proc.stdout
    assert "matmuls tok/s" in proc.stdout and "dec ratio" in proc.stdout
    # The table says which engine it timed.
    assert "engine static (attn_block 0)" in proc.stdout
    assert "sampler engine: static (attn_block 0)" in proc.stdout
    result = json.loads(out.read_text())
    assert result["update"] == [{"batch": 2}]
    assert result["device"].startswith("cpu")
    assert [row["batch"] for row in result["generation"]] == [1, 3]
    assert [row["batch"] for row in result["hf_generation"]] == [1, 3]
    for row in result["generation"] + result["hf_generation"]:
        assert row["new_tokens"] == 4 and row["time_s"] > 0
        assert row["tokens_per_s"] == pytest.approx(row["batch"] * 4 / row["time_s"])
    for row in result["hf_generation"]:  # HF's decode phase: the call less its prefill
        assert 0 < row["prefill_s"] and row["threads"] == 1
        assert row["decode_s"] == pytest.approx(row["time_s"] - row["prefill_s"])
        assert row["decode_tokens_per_s"] == pytest.approx(row["batch"] * 3 / row["decode_s"])
    for row in result["sampler_details"]:
        assert 0 < row["decode_s"] and 0 < row["fraction_of_matmul_peak"]
        assert row["data_devices"] == 2 and row["single_device_time_s"] > 0
        assert 0 < row["matmul_floor_s"]
        # (static: every row of the batch bucket decodes at once: 1 -> 2 rows on 2
        # devices, 3 -> 4)
        assert (row["engine"], row["attn_block"]) == ("static", 0)
        assert row["slots"] == {1: 2, 3: 4}[row["batch"]]


def test_unknown_part_is_rejected():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "experiments.throughput", "--part=nope"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert (
        proc.returncode != 0
        and "expected one of ['all', 'engine', 'sampler', 'update', 'widths']" in proc.stderr
    )


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_hf_conversion_matches_our_logits():
    config = model.get_preset("tiny-1m")
    params = model.init_params(config, 3)
    hf_model = throughput.hf_qwen3(config, params)
    tokens_bt = np.random.RandomState(0).randint(0, config.vocab_size, (2, 9))
    assert throughput.hf_max_logit_error(config, params, hf_model, tokens_bt) < 1e-4


def test_flop_count_by_hand():
    config = model.get_preset("tiny-1m")  # D=128, N=4, K=2, H=32, F=512, L=4, V=64
    per_layer = 128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 512
    assert flops.matmul_weights(config) == 4 * per_layer + 128 * 64
    # The matmul weights are all parameters except the norm scales (embedding reused).
    norms = 4 * (2 * 128 + 2 * 32) + 128
    assert flops.matmul_weights(config) == config.num_params - norms
    attention = 4 * 4 * 10 * 4 * 32
    assert flops.model_flops_per_token(config, 10) == 2 * flops.matmul_weights(config) + attention


def test_ideal_speedup_is_the_count_of_work_ratio():
    # static: 4 rows x 8 steps = 32 row-steps; continuous: 8 + 2 + 1 + 1 = 12 tokens.
    assert throughput.ideal_speedup(np.array([8, 2, 1, 1])) == pytest.approx(32 / 12)
    assert throughput.ideal_speedup(np.array([5, 5, 5])) == 1.0


@pytest.mark.slow  # about 40 s on 2 cores (six engines compiled)
def test_engine_part_compares_every_engine_in_every_attention_mode(capsys):
    settings = throughput.Settings(
        preset="tiny-1m",
        prompt_len=4,
        new_tokens=16,
        engine_rows=8,
        slots=(2, 4),
        attn_blocks=(0, 8),
        min_slots=(2,),  # (the default is 1)
        min_repeats=1,
        min_time_s=0,
    )
    result = throughput.run_engine(settings)
    labels = [row["engine"] for row in result["engine"]]
    assert labels == [
        "static", "static blk8", "continuous 2", "continuous 2 blk8",
        "continuous 4", "continuous 4 blk8",
    ]  # fmt: skip
    lengths = throughput.sampler_lib.long_tail_lengths(8, 16, 1.0, 0)
    ideal = result["engine_settings"]["ideal_speedup"]
    assert ideal == pytest.approx(8 * lengths.max() / lengths.sum())
    for row in result["engine"]:
        assert row["compile_s"] >= 0 and row["time_s"] > 0
        assert 0 < row["useful_fraction"] <= 1
        assert row["min_slots"] == 2 or row["engine"].startswith("static")
    # The table's ratios are against the fastest static mode, and its share of the ideal.
    table = capsys.readouterr().out
    best = max(r["tokens_per_s"] for r in result["engine"][:2])
    last = result["engine"][-1]
    ratio = last["tokens_per_s"] / best
    assert f"| {ratio:.2f} | {ratio / ideal:.2f} |" in table
    assert "| x best static | of ideal | rounds |" in table
    # One round: its range is that round's share, the median's.
    assert f"| {ratio / ideal:.2f} | {ratio / ideal:.2f}-{ratio / ideal:.2f} |" in table


def test_widths_part_times_a_decode_step_at_each_width(capsys):
    settings = throughput.Settings(
        preset="tiny-1m", prompt_len=4, new_tokens=9, batches=(1, 4), attn_blocks=(8,),
        min_repeats=2, min_time_s=0,
    )  # fmt: skip
    result = throughput.run_widths(settings)
    rows = {(r["engine"], r["width"]): r for r in result["widths"]}
    assert sorted(rows) == [("continuous", 1), ("continuous", 4), ("static", 1), ("static", 4)]
    for (_, width), row in rows.items():
        assert row["repeats"] == 2 and row["attn_block"] == 8
        assert row["row_step_s"] == pytest.approx(row["step_s"] / width) and row["step_s"] > 0
    # The table's last column: a row-step's cost against the widest width's, per engine.
    table = capsys.readouterr().out
    wide = rows[("static", 4)]["row_step_s"]
    one = rows[("static", 1)]
    assert f"| static | 1 | {one['step_s'] * 1e3:.2f} |" in table
    assert f"| {one['row_step_s'] / wide:.2f} |" in table and "| x W = 4 |" in table


def test_compile_seconds_counts_a_new_program_and_not_a_cached_one():
    import jax
    import jax.numpy as jnp

    from rl_batch import bench

    f = jax.jit(lambda x: jnp.sin(x) * 3 + 1)
    with bench.compile_seconds() as first:
        f(jnp.ones(7)).block_until_ready()
    with bench.compile_seconds() as again:
        f(jnp.ones(7)).block_until_ready()
    assert first["s"] > 0 and again["s"] == 0


def test_an_empty_attention_mode_list_is_rejected():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "experiments.throughput", "--part=engine", "--attn_blocks="]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "--attn_blocks is empty" in proc.stderr


@pytest.mark.parametrize(
    "flag,message",
    [
        ("--attn_blocks=abc", "--attn_blocks=abc: expected integers"),
        ("--attn_blocks=-1", "attn_block must be an int >= 0"),
        ("--min_slots=0", "min_slots must be an int >= 1"),
        ("--widths_per_halving=", "--widths_per_halving is empty"),
    ],
)
def test_a_bad_engine_flag_is_one_line(flag, message):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | {"JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, "-m", "experiments.throughput", "--part=engine", flag]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr
    assert "Traceback" not in proc.stderr
