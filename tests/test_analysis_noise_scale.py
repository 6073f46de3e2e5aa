"""Gradient noise scale estimators (McCandlish et al. 2018) on a known Gaussian problem."""

import analysis_fixtures as fx
import numpy as np
import pytest

from rl_batch import gradient_noise
from rl_batch.analysis import curves
from rl_batch.analysis import noise_scale as ns


def test_terms_invert_the_expectations_exactly():
    g2, tr, b, B = 2.0, 96.0, 8, 64  # noqa: N806
    sq_b, sq_B = g2 + tr / b, g2 + tr / B  # noqa: N806
    got_g2, got_tr = gradient_noise.noise_scale_terms(sq_b, sq_B, b, B)
    assert got_g2 == pytest.approx(g2) and got_tr == pytest.approx(tr)
    assert gradient_noise.simple_noise_scale(sq_b, sq_B, b, B) == pytest.approx(48.0)
    # Array-generic: elementwise on numpy arrays.
    g2s, trs = gradient_noise.noise_scale_terms(
        np.array([sq_b, sq_b]), np.array([sq_B, sq_B]), b, B
    )
    np.testing.assert_allclose(g2s, [g2, g2])
    np.testing.assert_allclose(trs, [tr, tr])


def _gaussian_problem(steps, b, big, d=40, seed=0):
    """Per-example gradients ~ N(G, Sigma); returns (sq_small [S], sq_big [S], B_simple)."""
    rng = np.random.default_rng(seed)
    g_d = rng.normal(size=d) * 0.3  # [D]
    a_dd = rng.normal(size=(d, d)) / np.sqrt(d)
    sigma_dd = a_dd @ a_dd.T + 0.5 * np.eye(d)  # [D, D] positive definite
    chol = np.linalg.cholesky(sigma_dd)
    eps = rng.normal(size=(steps, big, d))  # [S, B, D]
    grads = g_d + eps @ chol.T  # [S, B, D]
    mean_small = grads[:, :b].mean(axis=1)  # The small batch is a sub-batch of the big one.
    mean_big = grads.mean(axis=1)
    sq_small = np.sum(mean_small**2, axis=-1)
    sq_big = np.sum(mean_big**2, axis=-1)
    return sq_small, sq_big, float(np.trace(sigma_dd) / np.dot(g_d, g_d))


def test_estimates_converge_to_trace_over_g2():
    b, big = 8, 64
    sq_small, sq_big, truth = _gaussian_problem(4000, b, big)
    assert 5.0 < truth < 200.0  # A noise scale between the two batch sizes' regimes.
    g2, tr = gradient_noise.noise_scale_terms(sq_small, sq_big, b, big)
    pooled = tr.mean() / g2.mean()
    assert pooled == pytest.approx(truth, rel=0.04)
    ema = ns.NoiseScaleEMA(decay=0.999)
    trail = [ema.update(s, t, b, big) for s, t in zip(sq_small, sq_big)]
    assert trail[-1] == pytest.approx(truth, rel=0.05)
    assert ema.count == 4000


def test_ema_first_value_and_validation():
    ema = ns.NoiseScaleEMA(decay=0.9)
    assert np.isnan(ema.value)
    # One measurement: both EMAs carry the same (1 - decay) factor, so the ratio is exact.
    assert ema.update(2.0 + 96.0 / 8, 2.0 + 96.0 / 64, 8, 64) == pytest.approx(48.0)
    with pytest.raises(ValueError, match="B > b"):
        ema.update(1.0, 1.0, 64, 8)
    with pytest.raises(ValueError, match="decay"):
        ns.NoiseScaleEMA(decay=1.0)


def test_terms_work_inside_jit():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    @jax.jit
    def step(sq_small, sq_big):
        g2, tr = gradient_noise.noise_scale_terms(sq_small, sq_big, 8, 64)
        return tr / g2

    got = step(jnp.float32(2.0 + 96.0 / 8), jnp.float32(2.0 + 96.0 / 64))
    assert float(got) == pytest.approx(48.0, rel=1e-5)


@pytest.mark.parametrize("names", ns.FIELD_SCHEMES)
def test_run_noise_scale_from_metrics(tmp_path, names):
    fx.write_run(
        str(tmp_path / "r"), prompts=16, group_size=8, tau=1000.0, budget=4096, noise_names=names
    )
    s = ns.run_noise_scale(curves.load_run(str(tmp_path / "r")))
    assert s.source == names[0] and s.n_updates == 32
    expected = fx.TRACE_SIGMA / fx.G2
    assert s.final == pytest.approx(expected)
    assert s.median_second_half == pytest.approx(expected)
    assert s.pooled == pytest.approx(expected)
    assert ns.run_noise_scale(curves.load_run(str(tmp_path / "r")), prefix="critic_") is None
    fx.write_run(str(tmp_path / "n"), prompts=16, group_size=8, tau=1000.0, noise_fields=False)
    assert ns.run_noise_scale(curves.load_run(str(tmp_path / "n"))) is None


def test_run_noise_scale_from_per_update_field(tmp_path):
    import json

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    with open(run_dir / "metrics.jsonl", "w") as f:
        for i, v in enumerate([10.0, 30.0, 20.0, 40.0]):
            rec = {
                "kind": "update",
                "step": i,
                "responses_cum": 8 * (i + 1),
                "time_train_cum_s": i + 1.0,
                "prompts": 2,
                "group_size": 4,
                "noise_scale": v,
            }
            f.write(json.dumps(rec) + "\n")
    s = ns.run_noise_scale(curves.load_run(str(run_dir)))
    assert s.source == "noise_scale" and s.final == 40.0
    assert s.median_second_half == pytest.approx(30.0) and s.pooled is None


def test_group_split_in_the_summary_and_the_report(tmp_path):
    """Update lines with the group split's fields (values of the hand-worked case in
    tests/test_group_noise.py: |G|^2 = 2, traces 40 and 96): B_inter = 20, B_intra = 48."""
    import json
    import types

    from rl_batch.analysis import report

    run_dir = tmp_path / "r"
    run_dir.mkdir()
    fields = dict(zip(ns.GROUP_FIELDS, (10.0, 7.0, 5.25, 32.0, 8.0, 128.0, 16.0)))
    with open(run_dir / "metrics.jsonl", "w") as f:
        for i in range(6):
            rec = {"kind": "update", "step": i, "responses_cum": 128 * (i + 1)}
            rec.update(time_train_cum_s=i + 1.0, prompts=16, group_size=8, **fields)
            f.write(json.dumps(rec) + "\n")
    run = curves.load_run(str(run_dir))
    s = ns.run_noise_scale(run)
    assert (s.inter, s.intra) == (pytest.approx(20.0), pytest.approx(48.0))
    assert (s.inter_final, s.intra_final) == (pytest.approx(20.0), pytest.approx(48.0))
    # B_simple from the same half-group micro-batches: trace 96 + 40 * 8 * 2 / 6 over
    # |G|^2 = (128 * 5.25 - 32 * 10) / 96.
    assert s.pooled == pytest.approx((96 + 40 * 8 * 2 / 6) / ((128 * 5.25 - 32 * 10) / 96))
    analysis = types.SimpleNamespace(runs_by_key={run.key: [run]}, stats={}, reference=None)
    text = "\n".join(report._noise_section(analysis))
    assert "B_inter, pooled | B_intra, pooled" in text and "| 20 | 48 |" in text
    # Without the split's fields: no split, and the columns say so.
    for k in ("grad_dot_pair", "gns_prompts_pair"):
        fields.pop(k)
    with open(run_dir / "metrics.jsonl", "w") as f:
        rec = {"kind": "update", "step": 0, "responses_cum": 128, "time_train_cum_s": 1.0}
        f.write(json.dumps({**rec, "prompts": 16, "group_size": 8, **fields}) + "\n")
    s = ns.run_noise_scale(curves.load_run(str(run_dir)))
    assert s.inter is None and s.intra is None


def _estimate(mean, rel):
    from rl_batch.analysis.time_to_target import Estimate

    return Estimate(mean=mean, lo=mean / (1 + rel), hi=mean * (1 + rel), n=4)


def test_implied_noise_scale_recovers_the_b_n_of_exact_sample_costs():
    # B_n = 100, B_ref = 64: r_N(B) = (1 + B / 100) / 1.64, e.g. r_N(256) = 3.56 / 1.64
    # = 2.171; each with a +-10 % interval.
    batches = [16, 32, 64, 128, 256]
    r_n = [_estimate((1 + b / 100) / 1.64, 0.1) for b in batches]
    fit = ns.implied_noise_scale(batches, r_n, 64)
    assert fit.b_noise == pytest.approx(100.0, rel=0.01) and fit.points == 5
    assert fit.lo < 100.0 < fit.hi and fit.chi2 == pytest.approx(0.0, abs=1e-3)
    # Flat r_N (invariance over the whole family): B_n is bounded below only.
    flat = ns.implied_noise_scale(batches, [_estimate(1.0, 0.1) for _ in batches], 64)
    assert flat.hi == np.inf and flat.lo > 64
    assert ns.implied_noise_scale([16, 32], [None, _estimate(1.0, 0.1)], 64) is None


def test_measured_b_noise_against_the_implied(tmp_path):
    # The fixture's noise fields: |g_b|^2 = 1 + 256 / b exactly, so a run measured with
    # whole groups has B_noise = 256 (an interval of one point); a strided run, none.
    fx.write_run(
        str(tmp_path / "g"), prompts=16, group_size=8, tau=1000.0,
        config_extra={"grpo": {"micro_layout": "groups"}},
    )  # fmt: skip
    fx.write_run(str(tmp_path / "s"), prompts=16, group_size=8, tau=1000.0)
    groups, strided = (curves.load_run(str(tmp_path / n)) for n in ("g", "s"))
    s = ns.run_noise_scale(groups)
    assert s.layout == "groups" and s.b_noise == pytest.approx(256.0)
    assert (s.b_noise_lo, s.b_noise_hi) == (pytest.approx(256.0), pytest.approx(256.0))
    assert ns.run_noise_scale(strided).layout == "strided"
    assert ns.run_noise_scale(strided).b_noise is None
    batches = [16, 32, 64, 128, 256]
    for b_n, agree in ((256.0, True), (40.0, False)):
        r_n = [_estimate((1 + b / b_n) / (1 + 64 / b_n), 0.05) for b in batches]
        cmp = ns.compare_noise_scales([groups, strided], batches, r_n, 64)
        assert cmp.runs == 1 and cmp.measured[0] == pytest.approx(256.0)
        assert cmp.agree is agree


def test_measurement_layout_of_a_config():
    assert ns.measurement_layout({"grpo": {"micro_layout": "groups"}}) == "groups"
    assert ns.measurement_layout({"grpo": {}}) == "strided"  # (older config.json)
    assert ns.measurement_layout({"grpo": {"group_noise": True}}) == "pairs"
    assert ns.measurement_layout({"algo": "ppo"}) == "groups"
