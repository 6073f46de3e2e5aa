"""The weight mapping of experiments/tunix_compare.py onto tunix's Qwen3 (tiny model),
and its greedy-token agreement report.

Needs tunix (``google-tunix``), which the project does not install: skipped without it
(as in CI). See the script's docstring for the install.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("tunix")

from experiments import tunix_compare  # noqa: E402
from rl_batch.models import transformer as model_lib  # noqa: E402

SETTINGS = tunix_compare.Settings(preset="tiny-1m", vocab_size=64, prompt_len=5, new_tokens=7)


def _tokens(config, shape, seed=0):
    return np.random.RandomState(seed).randint(0, config.vocab_size, shape)


@pytest.mark.parametrize("tie", [True, False])
def test_mapped_model_gives_our_logits(tie):
    config = tunix_compare.model_config(SETTINGS).replace(tie_embeddings=tie)
    params = tunix_compare.random_params(config, 0)
    model = tunix_compare.tunix_qwen3(config, params)
    parity = tunix_compare.logit_parity(config, params, model, _tokens(config, (2, 12)))
    assert parity["max_rel"] <= tunix_compare.PARITY_RTOL, parity


def test_random_params_draw_norm_scales_away_from_one():
    config = tunix_compare.model_config(SETTINGS)
    params = model_lib.unstack_layers(tunix_compare.random_params(config, 0))
    q_scale = np.asarray(params["layers"][0]["attn"]["q_norm"]["scale"])
    k_scale = np.asarray(params["layers"][0]["attn"]["k_norm"]["scale"])
    assert np.abs(q_scale - 1).max() > 0.01 and np.abs(q_scale - k_scale).max() > 0.01
    # The weights are init_params' own.
    ref = model_lib.unstack_layers(model_lib.init_params(config, 0))
    np.testing.assert_array_equal(params["embed_vd"], ref["embed_vd"])


def test_parity_check_catches_a_wrong_mapping():
    """Swapping the q and k norm scales (same shape) must break the logit check."""
    config = tunix_compare.model_config(SETTINGS)
    params = tunix_compare.random_params(config, 0)
    swapped = jax.tree_util.tree_map(lambda x: x, model_lib.unstack_layers(params))
    attn = swapped["layers"][1]["attn"]
    attn["q_norm"], attn["k_norm"] = attn["k_norm"], attn["q_norm"]
    model = tunix_compare.tunix_qwen3(config, swapped)
    parity = tunix_compare.logit_parity(config, params, model, _tokens(config, (2, 12)))
    assert parity["max_rel"] > 100 * tunix_compare.PARITY_RTOL, parity


def test_tunix_forward_is_causal():
    """Logits at a position do not change when a later token does (the mask is causal)."""
    config = tunix_compare.model_config(SETTINGS)
    model = tunix_compare.tunix_qwen3(config, tunix_compare.random_params(config, 0))
    tokens = _tokens(config, (1, 8))
    changed = tokens.copy()
    changed[0, 5] = (changed[0, 5] + 1) % config.vocab_size
    a, b = tunix_compare.tunix_forward(model, tokens), tunix_compare.tunix_forward(model, changed)
    np.testing.assert_array_equal(a[:, :5], b[:, :5])
    assert np.abs(a[:, 5:] - b[:, 5:]).max() > 0


def test_configs_tunix_cannot_hold_are_refused():
    config = tunix_compare.model_config(SETTINGS)
    for bad in (
        config.replace(rope_theta=10_000.0),
        config.replace(qk_norm=False),
        config.replace(qkv_bias=True),
    ):
        with pytest.raises(ValueError, match="not comparable with tunix"):
            tunix_compare.tunix_config(bad)


def test_mapping_shape_mismatch_is_a_value_error():
    config = tunix_compare.model_config(SETTINGS)
    params = model_lib.unstack_layers(tunix_compare.random_params(config, 0))
    params["layers"][0]["mlp"]["gate_df"] = jnp.zeros((3, 3))
    with pytest.raises(ValueError, match="gate_proj"):
        tunix_compare.tunix_qwen3(config, params)


def test_agreement_reports_the_first_differing_step_and_its_logit_gap():
    config = tunix_compare.model_config(SETTINGS)
    params = tunix_compare.random_params(config, 0)
    prompts_bp = _tokens(config, (3, 5), seed=1)
    ours_br = _tokens(config, (3, 4), seed=2)
    theirs_br = ours_br.copy()
    theirs_br[1, 2] = (ours_br[1, 2] + 7) % config.vocab_size
    theirs_br[1, 3] = (ours_br[1, 3] + 1) % config.vocab_size  # after the first difference
    got = tunix_compare.agreement(config, params, prompts_bp, ours_br, theirs_br)
    assert got["rows_equal"] == pytest.approx(2 / 3)
    assert got["tokens_equal"] == pytest.approx(10 / 12)
    [row] = got["diverged"]
    assert (row["row"], row["step"]) == (1, 2)
    # Response token 2 is predicted by the logits at prompt length - 1 + 2 = 6.
    seq = np.concatenate([prompts_bp[1], ours_br[1]])[None]
    logits_v = np.asarray(model_lib.forward(config, params, jnp.asarray(seq)))[0, 6]
    want = logits_v[ours_br[1, 2]] - logits_v[theirs_br[1, 2]]
    assert row["logit_gap"] == pytest.approx(float(want), abs=1e-6)
    assert row["logit_max"] == pytest.approx(float(np.abs(logits_v).max()))
    same = tunix_compare.agreement(config, params, prompts_bp, ours_br, ours_br)
    assert same == {"rows_equal": 1.0, "tokens_equal": 1.0, "diverged": []}
