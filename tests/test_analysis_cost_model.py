"""Generation/update cost model, plateau batch, KV-cache bound and the throughput file."""

import json
import os

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.analysis import cost_model as cm
from rl_batch.analysis import curves


def test_fit_generation_recovers_known_a_b_and_plateau():
    c = np.array([1, 4, 16, 64, 256, 1024, 4096], dtype=float)
    a, b = 0.02, 0.0001
    fit = cm.fit_generation(c, c / (a + b * c))
    assert fit.a_s == pytest.approx(a) and fit.b_s == pytest.approx(b)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.asymptote == pytest.approx(1.0 / b)
    assert fit.plateau_batch(0.9) == pytest.approx(9 * a / b)  # 1800 sequences.
    assert fit.plateau_batch(0.5) == pytest.approx(a / b)
    # The plateau batch really reaches 90% of the asymptote.
    assert fit.predict(fit.plateau_batch(0.9)) == pytest.approx(0.9 / b)
    # Measured plateau: smallest measured c at >= 90% of the best measured (9534 at 4096).
    tps = c / (a + b * c)
    assert cm.measured_plateau_batch(c, tps) == 4096
    assert cm.measured_plateau_batch(c, tps, frac=0.5) == 256  # 5614 >= 0.5 x 9534.


def test_fit_generation_without_saturation_and_bad_input():
    c = np.array([1.0, 2.0, 4.0])
    fit = cm.fit_generation(c, 100.0 * c)  # Linear scaling: step time constant, b = 0.
    assert fit.b_s == pytest.approx(0.0, abs=1e-12)
    assert fit.plateau_batch() is None or fit.plateau_batch() > 1e6
    with pytest.raises(ValueError, match="distinct"):
        cm.fit_generation([8, 8], [1.0, 2.0])


def test_measured_plateau_with_a_throughput_drop():
    # The CPU notes' shape: peak at 32 then lower; the measured plateau is the peak.
    c = [8, 32, 128, 1024]
    assert cm.measured_plateau_batch(c, [11e3, 21e3, 13e3, 13e3]) == 32


def test_fit_update_linear_in_tokens():
    tokens = np.array([1000.0, 2000.0, 4000.0])
    fit = cm.fit_update(tokens, 0.5 + 2e-4 * tokens)
    assert fit.intercept_s == pytest.approx(0.5) and fit.s_per_token == pytest.approx(2e-4)
    assert fit.predict(3000.0) == pytest.approx(1.1)


def test_kv_cache_bound_hand_computed():
    shape = cm.ModelShape(
        layers=28, kv_heads=8, head_dim=128, max_seq_len=4096, dtype_bytes=2, n_params=1_000_000_000
    )
    per_seq = 2 * 28 * 8 * 128 * 4096 * 2  # K and V, every layer, bf16.
    assert cm.kv_cache_bytes_per_sequence(shape) == per_seq == 469_762_048
    assert cm.train_state_bytes(shape) == 16_000_000_000
    mem = 80 * 2**30
    expected = int((0.9 * mem - 16e9) // per_seq)  # (77.3e9 - 16e9) / 0.47e9 = 130.
    assert cm.max_kv_batch(shape, mem) == expected == 130
    assert cm.max_kv_batch(shape, 1e9) == 0  # Training state alone does not fit.


def test_throughput_file_round_trip_and_report(tmp_path):
    obj = fx.throughput_json()
    path = str(tmp_path / "throughput.json")
    model = cm.ModelShape(
        layers=4, kv_heads=2, head_dim=32, max_seq_len=128, dtype_bytes=4, n_params=1_000_000
    )
    written = cm.write_throughput(
        path, "synthetic", obj["generation"], obj["update"], device_memory_bytes=2**30, model=model
    )
    loaded = cm.load_throughput(path)
    assert loaded == written
    assert [p.batch for p in loaded.generation] == [2**i for i in range(13)]
    rep = cm.generation_report(loaded)
    assert rep.source == cm.THROUGHPUT_FILE and rep.device == "synthetic"
    assert rep.fit.a_s == pytest.approx(fx.GEN_A_S) and rep.fit.b_s == pytest.approx(fx.GEN_B_S)
    assert rep.plateau_batch_fit == pytest.approx(9 * fx.GEN_A_S / fx.GEN_B_S)  # 900.
    assert rep.plateau_batch_measured == 1024
    per_seq = 2 * 4 * 2 * 32 * 128 * 4
    assert rep.max_kv_batch == int((0.9 * 2**30 - 16e6) // per_seq)
    assert rep.critical_generation_batch == 1024  # The KV bound (13k) is not binding.
    assert rep.update_fit.s_per_token == pytest.approx(1e-5)


def test_throughput_validation_names_the_bad_entry(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"device": "x", "generation": [{"batch": 4, "time_s": 1.0}]}))
    with pytest.raises(ValueError, match=r"t.json: generation\[0\]: missing field 'new_tokens'"):
        cm.load_throughput(str(path))
    with pytest.raises(ValueError, match="must be > 0"):
        cm.parse_throughput({"generation": [{"batch": 0, "time_s": 1, "new_tokens": 5}]})
    # tokens_per_s is derived from batch * new_tokens / time_s when omitted.
    t = cm.parse_throughput({"generation": [{"batch": 4, "time_s": 2.0, "new_tokens": 80}]})
    assert t.generation[0].tokens_per_s == 160.0


def _runs_at_three_batches(tmp_path):
    """Synthetic runs at P = 8, 32, 128 (G = 8)."""
    runs = []
    for p in (8, 32, 128):
        d = str(tmp_path / f"p{p}")
        fx.write_run(d, prompts=p, group_size=8, tau=1000.0, budget=2048)
        runs.append(curves.load_run(d))
    return runs


def test_generation_report_from_run_metrics(tmp_path):
    runs = _runs_at_three_batches(tmp_path)
    rep = cm.generation_report(None, runs)
    assert rep.source == "run metrics"
    np.testing.assert_allclose(rep.fit.batches, [64, 256, 1024])
    assert rep.fit.a_s == pytest.approx(fx.GEN_A_S) and rep.fit.b_s == pytest.approx(fx.GEN_B_S)
    # Update time 0.001 s/response over 16 prompt + 32 response tokens: 0.001/48 s per
    # update token, 2.083e-5 (per generated token it would be 0.001/32 = 3.125e-5).
    # Points (3072, 0.064), (12288, 0.256), (49152, 1.024): intercept 0.
    assert rep.update_fit.s_per_token == pytest.approx(0.001 / 48)
    assert rep.update_fit.intercept_s == pytest.approx(0.0, abs=1e-12)
    assert rep.update_fit_note == ""
    assert cm.generation_report(None, runs[:1]) is None


def test_generation_report_prefers_the_interleaved_calibration(tmp_path):
    runs = _runs_at_three_batches(tmp_path)

    def entry(c, tokens_per_s):
        return {"step_s_median": 1.0, "gen_concurrency": c, "gen_tokens_per_s": tokens_per_s}

    # Side by side: 100 tokens/s at c = 32, 190 at 64 (one slow visit), 200 at 128.
    calibration = {
        "configs": {
            "4x8:sqrt": entry(32, [100.0, 100.0, 100.0]),
            "8x8:sqrt": entry(64, [190.0, 20.0, 190.0]),
            "16x8:sqrt": entry(128, [200.0, 200.0, 200.0]),
        }
    }
    rep = cm.generation_report(
        None, runs, calibration=artifacts.calibration_generation(calibration)
    )
    assert rep.source == cm.CALIBRATION_SOURCE
    np.testing.assert_allclose(rep.fit.batches, [32, 64, 128])
    np.testing.assert_allclose(rep.fit.tokens_per_s, [100, 190, 200])  # median over visits
    assert rep.plateau_batch_measured == 64  # 190 >= 0.9 * 200
    assert rep.update_fit is not None  # the update fit still comes from the runs
    # A calibration without generation timing (older file) leaves the run metrics.
    old = {"configs": {"8x8:sqrt": {"step_s_median": 1.0}}}
    assert artifacts.calibration_generation(old) is None
    one = {"configs": {"8x8:sqrt": entry(64, [1.0])}}
    one = artifacts.calibration_generation(one)
    assert cm.generation_report(None, runs, calibration=one).source == "run metrics"


def test_update_fit_uses_update_tokens_not_gen_tokens(tmp_path):
    # Hand-made lines: update_tokens 1000/2000/4000 in 0.5 + 2e-4 * tokens seconds, with
    # gen_tokens (generated only, dropped responses too) unrelated to the update size.
    runs = []
    for i, (tokens, gen) in enumerate([(1000, 900), (2000, 700), (4000, 3000)]):
        d = tmp_path / f"r{i}"
        d.mkdir()
        line = {
            "kind": "update",
            "step": 0,
            "responses_cum": 8,
            "time_train_cum_s": 1.0,
            "prompts": 2,
            "group_size": 4,
            "gen_tokens": gen,
            "time_generate_s": 1.0,
            "update_tokens": tokens,
            "time_update_s": 0.5 + 2e-4 * tokens,
        }
        (d / "metrics.jsonl").write_text(json.dumps(line) + "\n")
        runs.append(curves.load_run(str(d)))
    tokens, times, lacking = cm.run_update_points(runs)
    assert tokens == [1000.0, 2000.0, 4000.0] and lacking == []
    fit = cm.fit_update(tokens, times)
    assert fit.s_per_token == pytest.approx(2e-4) and fit.intercept_s == pytest.approx(0.5)


def test_old_metrics_without_update_tokens_say_so(tmp_path):
    runs = []
    for p in (8, 32):
        d = str(tmp_path / f"p{p}")
        fx.write_run(d, prompts=p, group_size=8, tau=1000.0, budget=1024, update_tokens=False)
        runs.append(curves.load_run(d))
    rep = cm.generation_report(None, runs)
    assert rep.fit is not None  # Generation still fits from gen_tokens / time_generate_s.
    assert rep.update_fit is None
    assert "2 of 2 runs log no update_tokens" in rep.update_fit_note
    assert "gen_tokens (generated tokens only) is not a substitute" in rep.update_fit_note
    # One new run beside them: still no fit (one size), and the note says why.
    d = str(tmp_path / "new")
    fx.write_run(d, prompts=16, group_size=8, tau=1000.0, budget=1024)
    rep = cm.generation_report(None, [*runs, curves.load_run(d)])
    assert rep.update_fit is None and "2 of 3 runs log no update_tokens" in rep.update_fit_note


def _runs_with_config(tmp_path, config_extra):
    runs = []
    for p in (8, 16):
        d = str(tmp_path / f"p{p}")
        fx.write_run(d, prompts=p, group_size=8, tau=1000.0, budget=512, config_extra=config_extra)
        runs.append(curves.load_run(d))
    return runs


SETTINGS = {"preset": "tiny-5m", "vocab_size": 512, "prompt_len": 16, "new_tokens": 32}
RUN_CONFIG = {
    "model": {"preset": "tiny-1m", "overrides": {}},
    "init": {"source": "pretrain", "path": "/ckpt"},
    "derived": {"max_prompt_len": 9, "max_new_tokens": 32, "model": {"vocab_size": 55}},
}


def test_throughput_file_model_mismatch_warns(tmp_path):
    obj = fx.throughput_json()
    tp = cm.parse_throughput(dict(obj, settings=SETTINGS))
    assert tp.settings == SETTINGS
    assert cm.throughput_to_json(tp)["settings"] == SETTINGS  # Round trip keeps it.
    rep = cm.generation_report(tp, _runs_with_config(tmp_path, RUN_CONFIG))
    assert rep.source == cm.THROUGHPUT_FILE
    assert rep.measured == "preset tiny-5m, vocab 512, 16 prompt tokens, 32 new tokens per sequence"
    assert rep.model_notes[0] == (
        "The runs: preset tiny-1m, vocab 55, prompts <= 9 tokens, responses <= 32 tokens."
    )
    (warning,) = rep.model_warnings
    assert "measured preset tiny-5m, but the runs use model.preset tiny-1m" in warning


def test_throughput_file_model_match_and_hf_runs(tmp_path):
    obj = fx.throughput_json()
    same = dict(RUN_CONFIG, model={"preset": "tiny-5m"})
    rep = cm.generation_report(
        cm.parse_throughput(dict(obj, settings=SETTINGS)), _runs_with_config(tmp_path, same)
    )
    assert rep.model_warnings == ()
    # init.source='hf': the shape comes from the checkpoint, no preset to match: a note.
    hf = dict(RUN_CONFIG, init={"source": "hf", "path": "/models/qwen"})
    rep = cm.generation_report(
        cm.parse_throughput(dict(obj, settings=SETTINGS)), _runs_with_config(tmp_path / "h", hf)
    )
    assert rep.model_warnings == ()
    assert any("init.source='hf': /models/qwen" in n and "no preset" in n for n in rep.model_notes)
    # A file without settings says it does not know its model.
    rep = cm.generation_report(cm.parse_throughput(obj), _runs_with_config(tmp_path / "n", same))
    assert rep.measured == "model not recorded (no settings.preset in the file)"
    assert rep.model_warnings == ()
    assert any("does not record its model" in n for n in rep.model_notes)


def test_generation_point_capped_by_gen_batch(tmp_path):
    d = str(tmp_path / "r")
    fx.write_run(d, prompts=32, group_size=8, tau=1000.0, budget=2048)
    c, tps = cm.run_generation_point(curves.load_run(d))
    assert c == 256 and tps == pytest.approx(256 / fx.step_time_s(256))
    # Generation in chunks of 64 sequences: the decode concurrency is 64.
    artifacts.write_json_atomic(os.path.join(d, "config.json"), {"rollout": {"gen_batch": 64}})
    c, _ = cm.run_generation_point(curves.load_run(d))
    assert c == 64
