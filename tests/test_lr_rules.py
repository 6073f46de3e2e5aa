"""Hand-checked LR scaling rules."""

import math

import pytest

from rl_batch.algorithms import lr_rules

# Reference: P=128, G=8 -> B_ref = 1024 responses, lr_ref = 1e-6.
REF = dict(ref_batch=1024, ref_lr=1e-6)


def test_sqrt_rule():
    # B = 512 * 8 = 4096 -> k = 4, lr = 1e-6 * sqrt(4) = 2e-6; betas/eps untouched.
    h = lr_rules.scale_hparams(rule="sqrt", batch=4096, **REF)
    assert h.k == 4.0
    assert h.lr == pytest.approx(2e-6, rel=1e-12)
    assert (h.b1, h.b2, h.eps) == (0.9, 0.999, 1e-8)
    assert h.describe() == (
        "rule=sqrt: k = B / B_ref = 4096 / 1024 = 4; lr = lr_ref * sqrt(k) = 1e-06 * 2 = 2e-06"
    )
    # Default rule is sqrt; B = 256 * 8 = 2048 -> k = 2, lr = 1e-6 * 1.4142136.
    h = lr_rules.scale_hparams(batch=2048, **REF)
    assert h.rule == "sqrt"
    assert h.lr == pytest.approx(1.41421356e-6, rel=1e-8)


def test_linear_and_fixed():
    # k = 2048 / 1024 = 2: linear -> 2e-6; fixed -> 1e-6.
    assert lr_rules.scale_hparams(rule="linear", batch=2048, **REF).lr == pytest.approx(2e-6)
    h = lr_rules.scale_hparams(rule="fixed", batch=2048, **REF)
    assert h.lr == 1e-6 and h.k == 2.0
    assert h.describe() == "rule=fixed: k = B / B_ref = 2048 / 1024 = 2; lr = lr_ref = 1e-06"
    # Smaller batch: k = 512 / 1024 = 0.5, linear -> 5e-7.
    assert lr_rules.scale_hparams(rule="linear", batch=512, **REF).lr == pytest.approx(5e-7)


def test_malladi_rule():
    # k = 4: lr = 1e-6 * 2 = 2e-6; b1 = 1 - 4 * 0.1 = 0.6; b2 = 1 - 4 * 0.001 = 0.996;
    # eps = 1e-8 / 2 = 5e-9.
    h = lr_rules.scale_hparams(rule="malladi", batch=4096, **REF)
    assert h.lr == pytest.approx(2e-6)
    assert h.b1 == pytest.approx(0.6)
    assert h.b2 == pytest.approx(0.996)
    assert h.eps == pytest.approx(5e-9)
    assert h.clamped == ()
    text = h.describe()
    assert "b1 = 1 - k * (1 - 0.9) = 1 - 4 * 0.1 = 0.6" in text
    assert "eps = eps_ref / sqrt(k) = 1e-08 / 2 = 5e-09" in text
    # k = 0.5: b1 = 1 - 0.5 * 0.1 = 0.95, b2 = 0.9995, eps = 1e-8 / 0.7071068 = 1.4142e-8.
    h = lr_rules.scale_hparams(rule="malladi", batch=512, **REF)
    assert (h.b1, h.b2) == (pytest.approx(0.95), pytest.approx(0.9995))
    assert h.eps == pytest.approx(1e-8 * math.sqrt(2))


def test_malladi_clamp():
    # k = 16: b1 -> 1 - 16 * 0.1 = -0.6 is clamped to 0 (1 - b capped at 1); b2 = 0.984.
    h = lr_rules.scale_hparams(rule="malladi", batch=16 * 1024, **REF)
    assert h.b1 == 0.0
    assert h.b2 == pytest.approx(0.984)
    assert h.clamped == ("b1",)
    assert "(clamped" in h.describe()
    d = h.to_dict()
    assert d["clamped"] == ["b1"] and d["describe"] == h.describe() and d["lr"] == h.lr


def test_surge_rule_by_hand():
    # B_noise = 256, B_ref = 64, lr_ref = 1e-4. f(x) = sqrt(256 / x) + sqrt(x / 256):
    # f(64) = 2 + 0.5 = 2.5, f(256) = 2 (the peak), f(1024) = 0.5 + 2 = 2.5,
    # f(16) = 4 + 0.25 = 4.25. lr = 1e-4 * 2.5 / f(B); lr_peak = 1e-4 * 2.5 / 2 = 1.25e-4.
    ref = dict(ref_batch=64, ref_lr=1e-4, noise_scale=256)
    lr = {b: lr_rules.scale_hparams(rule="surge", batch=b, **ref).lr for b in (16, 64, 256, 1024)}
    assert lr[64] == pytest.approx(1e-4)
    assert lr[256] == pytest.approx(1.25e-4)
    assert lr[1024] == pytest.approx(1e-4)  # as far above the peak as B_ref is below
    assert lr[16] == pytest.approx(1e-4 * 2.5 / 4.25)  # 5.882e-5
    h = lr_rules.scale_hparams(rule="surge", batch=1024, **ref)
    assert (h.b1, h.b2, h.eps, h.noise_scale) == (0.9, 0.999, 1e-8, 256.0)
    assert h.describe() == (
        "rule=surge: k = B / B_ref = 1024 / 64 = 16; B_noise = 256; lr = lr_ref * f(B_ref) "
        "/ f(B), f(x) = sqrt(B_noise / x) + sqrt(x / B_noise) = 0.0001 * 2.5 / 2.5 = 0.0001 "
        "(peak lr 0.000125 at B = B_noise)"
    )
    # Other rules ignore and do not record it.
    assert lr_rules.scale_hparams(rule="sqrt", batch=256, **ref).noise_scale is None
    for bad in (None, 0.0, -5.0, float("nan")):
        with pytest.raises(ValueError, match="rule 'surge' needs the noise scale B_noise > 0"):
            lr_rules.scale_hparams(
                rule="surge", batch=64, ref_batch=64, ref_lr=1e-4, noise_scale=bad
            )


def test_errors():
    with pytest.raises(ValueError, match=r"unknown LR rule 'cubic'.*'sqrt', 'linear', 'fixed'"):
        lr_rules.scale_hparams(rule="cubic", batch=8, **REF)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        lr_rules.scale_hparams(batch=0, **REF)
    with pytest.raises(ValueError, match="b2 must be in"):
        lr_rules.scale_hparams(batch=8, b2=1.0, **REF)


def test_surge_matches_the_papers_theorem_3_at_its_peak_and_eq_23():
    # Li et al. 2024, Eq. 13: eps_opt(B) = eps_max / (0.5 (sqrt(Bn / B) + sqrt(B / Bn))).
    # Bn = 100, eps_max = 3e-4: at B = 25, 0.5 (2 + 0.5) = 1.25 -> eps_opt = 2.4e-4; at
    # B = 400, 0.5 (0.5 + 2) = 1.25 -> 2.4e-4; at B = 100 the peak 3e-4 (Eq. 15).
    # Our rule anchored at (B_ref = 25, lr_ref = 2.4e-4) must give the same curve.
    ref = dict(ref_batch=25, ref_lr=2.4e-4, noise_scale=100)
    lr = {b: lr_rules.scale_hparams(rule="surge", batch=b, **ref).lr for b in (25, 100, 400)}
    assert lr == {25: pytest.approx(2.4e-4), 100: pytest.approx(3e-4), 400: pytest.approx(2.4e-4)}


def test_the_sde_adam_rule_beside_another_lr_rule_by_hand():
    # k = 2: b1 = 1 - 2 * 0.1 = 0.8, b2 = 1 - 2 * 0.001 = 0.998, eps = 1e-8 / 1.4142 =
    # 7.0711e-9; the LR still follows sqrt (1e-6 * 1.4142) or linear (2e-6).
    h = lr_rules.scale_hparams(rule="sqrt", batch=2048, adam_rule="sde", **REF)
    assert (h.b1, h.b2) == (pytest.approx(0.8), pytest.approx(0.998))
    assert h.eps == pytest.approx(7.0710678e-9)
    assert h.lr == pytest.approx(1.41421356e-6)
    assert h.describe().startswith("rule=sqrt, adam=sde: k = B / B_ref = 2048 / 1024 = 2; ")
    assert "b1 = 1 - k * (1 - 0.9) = 1 - 2 * 0.1 = 0.8" in h.describe()
    h = lr_rules.scale_hparams(rule="linear", batch=2048, adam_rule="sde", **REF)
    assert (h.lr, h.b1) == (pytest.approx(2e-6), pytest.approx(0.8))
    # The same numbers as malladi's (one function computes both).
    m = lr_rules.scale_hparams(rule="malladi", batch=2048, **REF)
    assert (m.b1, m.b2, m.eps) == (h.b1, h.b2, h.eps)
    assert lr_rules.sde_adam(0.9, 0.999, 1e-8, 16.0)[3] == ("b1",)  # 16 * 0.1 > 1
    # Default: betas untouched, the describe text as before the rule existed.
    assert lr_rules.scale_hparams(rule="sqrt", batch=2048, **REF).b1 == 0.9
    with pytest.raises(ValueError, match="malladi already scales the betas and eps"):
        lr_rules.scale_hparams(rule="malladi", batch=2048, adam_rule="sde", **REF)
    with pytest.raises(ValueError, match="unknown Adam rule 'sgd'"):
        lr_rules.scale_hparams(batch=2048, adam_rule="sgd", **REF)


def test_the_sqrt_clip_rule_by_hand_and_its_caps():
    # k = 2: 0.2 * 1.41421 = 0.282843, 0.28 * 1.41421 = 0.395980.
    c = lr_rules.scale_clip("sqrt", 0.2, 0.28, 2.0)
    assert (c.clip_low, c.clip_high, c.capped) == (
        pytest.approx(0.2828427),
        pytest.approx(0.3959798),
        (),
    )
    assert c.describe() == (
        "clip=sqrt: clip * sqrt(k): clip_low = 0.2 * 1.41421 = 0.282843, "
        "clip_high = 0.28 * 1.41421 = 0.39598"
    )
    # k = 0.25: halved, 0.1 and 0.14.
    c = lr_rules.scale_clip("sqrt", 0.2, 0.28, 0.25)
    assert (c.clip_low, c.clip_high) == (pytest.approx(0.1), pytest.approx(0.14))
    # k = 16: 0.2 * 4 = 0.8 -> capped at 0.5; 0.28 * 4 = 1.12 -> capped at 1.
    c = lr_rules.scale_clip("sqrt", 0.2, 0.28, 16.0)
    assert (c.clip_low, c.clip_high, c.capped) == (0.5, 1.0, ("clip_low", "clip_high"))
    assert "(capped at 0.5)" in c.describe()
    # fixed keeps them at any k.
    c = lr_rules.scale_clip("fixed", 0.2, 0.28, 16.0)
    assert (c.clip_low, c.clip_high) == (0.2, 0.28)
    # A configured value above its cap is kept at k > 1 (never grown), still shrunk below.
    assert lr_rules.scale_clip("sqrt", 0.7, 0.28, 4.0).clip_low == 0.7
    assert lr_rules.scale_clip("sqrt", 0.7, 0.28, 0.25).clip_low == pytest.approx(0.35)
    with pytest.raises(ValueError, match="unknown clip rule 'linear'"):
        lr_rules.scale_clip("linear", 0.2, 0.28, 2.0)


def test_the_warmup_rules_by_hand():
    # W = 20 updates at B_ref = 128: at B = 256 "responses" keeps 20 * 128 = 2560
    # responses -> 10 updates; at B = 64 -> 40; at B = 384: 20 / 3 = 6.67 -> 7.
    assert lr_rules.scale_warmup("responses", 20, 256, 128) == 10
    assert lr_rules.scale_warmup("responses", 20, 64, 128) == 40
    assert lr_rules.scale_warmup("responses", 20, 384, 128) == 7
    # 5 * 128 / 256 = 2.5 rounds half up to 3; 1 * 128 / 1024 = 0.125 -> at least 1.
    assert lr_rules.scale_warmup("responses", 5, 256, 128) == 3
    assert lr_rules.scale_warmup("responses", 1, 1024, 128) == 1
    assert lr_rules.scale_warmup("responses", 0, 1024, 128) == 0  # no warm-up stays none
    assert lr_rules.scale_warmup("updates", 20, 256, 128) == 20
    with pytest.raises(ValueError, match="unknown warm-up rule 'tokens'"):
        lr_rules.scale_warmup("tokens", 20, 256, 128)
    with pytest.raises(ValueError, match="warm-up updates must be an int >= 0"):
        lr_rules.scale_warmup("updates", -1, 256, 128)
