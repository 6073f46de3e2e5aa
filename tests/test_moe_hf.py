"""Qwen3-MoE parity with transformers' ``Qwen3MoeForCausalLM`` on tiny random models:
config mapping, checkpoint round trips, fp32 logits, router choices, the load-balancing
loss, and greedy generation (full forward and the KV-cache sampler).

Needs the test extra (torch + transformers); skipped without it.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.models import hf, moe
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import sampler as sampler_lib
from tests.hf_fixtures import MOE_VARIANTS, hf_model, random_params, tiny_moe_config
from tests.test_hf import (
    NEW_TOKENS,
    PROMPTS,
    _hf_greedy,
    _hf_logits,
    _left_padded_batch,
    _max_diff,
    _our_logits,
    _simple_greedy,
)


@pytest.fixture(scope="module", params=tuple(MOE_VARIANTS))
def hf_pair(request, tmp_path_factory):
    """(variant, HF model, our config, our params loaded from its save_pretrained)."""
    variant = request.param
    directory = tmp_path_factory.mktemp(f"moe_{variant}")
    model = hf_model(tiny_moe_config(variant), "qwen3_moe", seed=list(MOE_VARIANTS).index(variant))
    model.save_pretrained(directory, safe_serialization=True)
    config, params = hf.load_hf_checkpoint(directory)
    return variant, model, config, params, directory


# ---------------------------------------------------------------------------- config / IO


def test_config_from_hf_json_matches(hf_pair):
    variant, _, config, params, directory = hf_pair
    assert config == tiny_moe_config(variant)
    # transformers 5 writes num_experts as num_local_experts; both spellings are read.
    hf_json = json.loads((directory / "config.json").read_text())
    assert hf_json["model_type"] == "qwen3_moe"
    assert hf_json.get("num_local_experts", hf_json.get("num_experts")) == config.num_experts
    layer = config.mlp_only_layers[0] if config.mlp_only_layers else 0
    assert not config.is_moe_layer(layer)
    assert set(params["layers"][layer]["mlp"]) == {"gate_df", "up_df", "down_fd"}
    sparse = next(i for i in range(config.num_layers) if config.is_moe_layer(i))
    assert set(params["layers"][sparse]["mlp"]) == {"router_de", "gate_edf", "up_edf", "down_efd"}


def test_qwen3_30b_a3b_config_json():
    """Qwen3-30B-A3B's published config.json gives the preset."""
    hf_json = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "decoder_sparse_step": 1,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "initializer_range": 0.02,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "max_window_layers": 48,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }
    assert hf.config_from_hf(hf_json) == model_lib.get_preset("qwen3-30b-a3b")
    for preset in ("qwen3-30b-a3b", "qwen3-235b-a22b", "tiny-moe"):
        config = model_lib.get_preset(preset)
        assert hf.config_from_hf(hf.config_to_hf(config)) == config


def test_config_to_hf_moe_errors():
    with pytest.raises(ValueError, match=r"model_type='qwen3' does not match num_experts=8"):
        hf.config_to_hf(tiny_moe_config("norm_topk"), "qwen3")
    dense = model_lib.get_preset("tiny-1m")
    with pytest.raises(ValueError, match=r"model_type='qwen3_moe' does not match num_experts=0"):
        hf.config_to_hf(dense, "qwen3_moe")
    assert hf.config_to_hf(dense)["model_type"] == "qwen3"


def test_tensor_names_and_round_trip(tmp_path, hf_pair):
    """Our save writes HF's per-expert names and layouts; save -> load is exact."""
    pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    _, model, config, params, directory = hf_pair
    hf.save_hf_checkpoint(config, params, tmp_path)
    theirs = load_file(os.path.join(directory, "model.safetensors"))
    ours = load_file(os.path.join(tmp_path, "model.safetensors"))
    assert set(ours) == set(theirs) - ({"lm_head.weight"} if config.tie_embeddings else set())
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)
    sparse = next(i for i in range(config.num_layers) if config.is_moe_layer(i))
    # Expert 3's up_proj [F, D] is slice 3 of our up_edf [E, D, F], transposed.
    up = ours[f"model.layers.{sparse}.mlp.experts.3.up_proj.weight"]
    np.testing.assert_array_equal(up, np.asarray(params["layers"][sparse]["mlp"]["up_edf"][3]).T)
    loaded_config, loaded = hf.load_hf_checkpoint(tmp_path)
    assert loaded_config == config
    for (path, got), want in zip(
        jax.tree_util.tree_flatten_with_path(loaded)[0], jax.tree.leaves(params)
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), str(path))


def test_bf16_round_trip(tmp_path):
    config = tiny_moe_config("norm_topk").replace(param_dtype="bfloat16", dtype="bfloat16")
    params = random_params(config, seed=4)
    hf.save_hf_checkpoint(config, params, tmp_path)
    loaded_config, loaded = hf.load_hf_checkpoint(tmp_path)
    assert loaded_config == config
    got, want = loaded["layers"][2]["mlp"]["down_efd"], params["layers"][2]["mlp"]["down_efd"]
    assert got.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


def test_missing_expert_tensor_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file

    config = tiny_moe_config("norm_topk")
    hf.save_hf_checkpoint(config, random_params(config, seed=4), tmp_path)
    file = os.path.join(tmp_path, "model.safetensors")
    tensors = dict(load_file(file))
    del tensors["model.layers.2.mlp.experts.5.gate_proj.weight"]
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.2\.mlp\.experts\.5\.gate_proj"):
        hf.load_hf_checkpoint(tmp_path)


def test_exported_checkpoint_loads_in_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = tiny_moe_config("raw_topk")
    params = random_params(config, seed=6)
    hf.save_hf_checkpoint(config, params, tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(theirs).__name__ == "Qwen3MoeForCausalLM"
    tokens_bt, mask_bt, positions_bt = _left_padded_batch(seed=3)
    ours = _our_logits(config, params, tokens_bt, mask_bt)
    diff = _max_diff(ours, _hf_logits(theirs, tokens_bt, mask_bt, positions_bt), mask_bt)
    print(f"qwen3_moe exported fp32 max|dlogit|={diff:.2e}")
    assert diff < 1e-4


# ---------------------------------------------------------------------------- numerics


def _hf_router(model, tokens_bt, mask_bt, positions_bt):
    """HF's per-layer router logits [L, B * T, E] and aux loss (output_router_logits)."""
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens_bt),
            attention_mask=torch.tensor(mask_bt.astype(np.int64)),
            position_ids=torch.tensor(positions_bt),
            output_router_logits=True,
        )
    logits = np.stack([x.float().numpy() for x in out.router_logits])
    return out.logits.float().numpy(), logits, float(out.aux_loss)


@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_logits_router_choices_and_aux_loss_match_hf(hf_pair):
    variant, model, config, params, _ = hf_pair
    tokens_bt, mask_bt, positions_bt = _left_padded_batch(seed=7)
    hf_logits_btv, hf_router_lte, hf_aux = _hf_router(model, tokens_bt, mask_bt, positions_bt)

    ours_btv, router_lte = jax.jit(
        lambda p, t, m: model_lib.forward_with_router(config, p, t, input_mask_bt=m)
    )(params, jnp.asarray(tokens_bt), jnp.asarray(mask_bt))
    ours_btv, router_lte = np.asarray(ours_btv), np.asarray(router_lte)
    diff = _max_diff(ours_btv, hf_logits_btv, mask_bt)
    print(f"qwen3_moe {variant} fp32 max|dlogit|={diff:.2e}")
    assert diff < 1e-4
    # forward_with_router's logits are model.forward's.
    np.testing.assert_allclose(_our_logits(config, params, tokens_bt, mask_bt), ours_btv, atol=1e-6)

    assert router_lte.shape == (config.num_moe_layers, tokens_bt.size, config.num_experts)
    real_t = mask_bt.reshape(-1)
    np.testing.assert_allclose(router_lte[:, real_t], hf_router_lte[:, real_t], atol=1e-4)
    # Per-token expert choices: the top-k *sets* equal HF's on every real token.
    k = config.num_experts_per_tok
    ours_ltk = np.sort(np.argsort(-router_lte, axis=-1)[..., :k], axis=-1)
    theirs_ltk = np.sort(np.argsort(-hf_router_lte, axis=-1)[..., :k], axis=-1)
    np.testing.assert_array_equal(ours_ltk[:, real_t], theirs_ltk[:, real_t])
    assert len(np.unique(ours_ltk[:, real_t])) == config.num_experts  # all experts used

    aux = float(moe.load_balancing_loss(jnp.asarray(router_lte), jnp.asarray(real_t), k))
    print(f"aux loss ours {aux:.6f} HF {hf_aux:.6f}")
    np.testing.assert_allclose(aux, hf_aux, rtol=1e-5)


@pytest.mark.slow  # 16 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_greedy_generation_matches_hf(hf_pair):
    variant, model, config, params, _ = hf_pair
    theirs = _hf_greedy(model, PROMPTS)
    assert theirs.shape == (len(PROMPTS), NEW_TOKENS)
    assert len(np.unique(theirs)) > 5  # not a degenerate repeat of one token
    np.testing.assert_array_equal(_simple_greedy(config, params, PROMPTS), theirs)
    # The KV-cache sampler, unchanged, on the MoE model.
    sampler = sampler_lib.Sampler(
        config,
        eos_id=config.vocab_size,  # outside the vocabulary: never stops early, like HF
        pad_id=0,
        max_prompt_len=16,
        max_new_tokens=NEW_TOKENS,
    )
    out = sampler(
        params, PROMPTS, rng=jax.random.key(0), sampling=sampler_lib.SamplingConfig(greedy=True)
    )
    np.testing.assert_array_equal(np.asarray(out.response_tokens)[:, :NEW_TOKENS], theirs)
