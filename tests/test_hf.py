"""Hugging Face interop: config mapping, load/save errors, and logit/generation parity
with transformers' own Qwen3 / Qwen2 / Llama implementations on tiny random models.

The parity tests need the test extra (torch + transformers); they are skipped without it.
"""

import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rl_batch.models import hf
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import sampler as sampler_lib
from tests.hf_fixtures import FAMILIES, HF_CLASSES, hf_model, random_params, tiny_config


def _left_padded_batch(seed: int = 0, vocab: int = 128):
    """[3, 12] tokens with 0, 4 and 9 left-pad slots; positions = cumsum(mask) - 1."""
    rs = np.random.RandomState(seed)
    tokens_bt = rs.randint(0, vocab, (3, 12))
    mask_bt = np.ones((3, 12), bool)
    mask_bt[1, :4] = False
    mask_bt[2, :9] = False
    tokens_bt[~mask_bt] = 0
    positions_bt = np.maximum(np.cumsum(mask_bt, axis=1) - 1, 0)
    return tokens_bt, mask_bt, positions_bt


@functools.cache
def _jit_forward(config):
    return jax.jit(functools.partial(model_lib.forward, config))


def _our_logits(config, params, tokens_bt, mask_bt):
    return np.asarray(_jit_forward(config)(params, jnp.asarray(tokens_bt), input_mask_bt=mask_bt))


# ---------------------------------------------------------------------------- pure config


def test_config_from_hf_qwen3_0_6b_json():
    """The fields of Qwen3-0.6B's config.json (transformers 4 spelling) give the preset."""
    hf_json = {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "max_window_layers": 28,
        "model_type": "qwen3",
        "num_attention_heads": 16,
        "num_hidden_layers": 28,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "vocab_size": 151936,
    }
    assert hf.config_from_hf(hf_json) == model_lib.get_preset("qwen3-0.6b")
    assert hf.config_from_hf(hf_json, dtype="float32").param_dtype == "float32"


def test_config_from_hf_defaults_and_new_spelling():
    base = dict(vocab_size=10, hidden_size=64, intermediate_size=8, num_hidden_layers=1)
    llama = hf.config_from_hf(
        {
            **base,
            "model_type": "llama",
            "num_attention_heads": 4,
            "rope_parameters": {"rope_theta": 500.0, "rope_type": "default"},
            "dtype": "bfloat16",
        }
    )
    assert (llama.head_dim, llama.num_kv_heads, llama.rope_theta) == (16, 4, 500.0)
    assert (llama.max_seq_len, llama.param_dtype, llama.tie_embeddings) == (2048, "bfloat16", False)
    assert not llama.qk_norm and not llama.qkv_bias
    qwen2 = hf.config_from_hf({**base, "model_type": "qwen2", "num_attention_heads": 2})
    assert qwen2.qkv_bias and not qwen2.qk_norm and qwen2.head_dim == 32
    # transformers' Qwen3Config defaults head_dim to 128, not hidden_size // heads.
    qwen3 = hf.config_from_hf({**base, "model_type": "qwen3", "num_attention_heads": 2})
    assert qwen3.qk_norm and qwen3.head_dim == 128


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "mistral"}, "unsupported model_type 'mistral'"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"attention_bias": True}, "attention_bias=True"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "RoPE scaling 'yarn'"),
        ({"use_sliding_window": True}, "sliding-window"),
        ({"dtype": "float64", "torch_dtype": "float64"}, "dtype 'float64'"),
        ({"vocab_size": None}, "lacks required fields ['vocab_size']"),
    ],
)
def test_config_from_hf_rejects_unsupported(change, message):
    hf_json = hf.config_to_hf(tiny_config("qwen3"), "qwen3")
    hf_json.update(change)
    hf_json = {k: v for k, v in hf_json.items() if v is not None}
    with pytest.raises(ValueError, match=re.escape(message)):
        hf.config_from_hf(hf_json)


@pytest.mark.parametrize(
    "preset, model_type",
    [
        ("qwen3-0.6b", "qwen3"),
        ("qwen3-8b", "qwen3"),
        ("qwen2.5-0.5b", "qwen2"),
        ("tiny-1m", "qwen3"),
    ],
)
def test_config_round_trip(preset, model_type):
    config = model_lib.get_preset(preset)
    assert hf.config_from_hf(hf.config_to_hf(config, model_type)) == config


def test_config_to_hf_rejects_mismatched_family():
    with pytest.raises(ValueError, match="model_type='qwen2' needs qk_norm=False, qkv_bias=True"):
        hf.config_to_hf(tiny_config("qwen3"), "qwen2")
    with pytest.raises(ValueError, match="head='value'"):
        hf.config_to_hf(tiny_config("qwen3", head="value"), "qwen3")
    with pytest.raises(ValueError, match="model_type='gpt2'"):
        hf.config_to_hf(tiny_config("qwen3"), "gpt2")


# ---------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.slow  # 8 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_save_load_round_trip_is_exact(tmp_path, family, dtype):
    config = tiny_config(family, param_dtype=dtype, dtype=dtype, tie_embeddings=family != "qwen2")
    params = random_params(config, seed=1)
    hf.save_hf_checkpoint(config, params, tmp_path, model_type=family)
    loaded_config, loaded = hf.load_hf_checkpoint(tmp_path)
    assert loaded_config == config
    assert jax.tree.structure(loaded) == jax.tree.structure(params)
    for path, got in jax.tree_util.tree_flatten_with_path(loaded)[0]:
        want = params
        for key in path:
            want = want[key.key]
        assert got.dtype == want.dtype, jax.tree_util.keystr(path)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), jax.tree_util.keystr(path))
    # A tied config writes no lm_head; an untied one does, transposed to [V, D].
    tensors = load_file(os.path.join(tmp_path, "model.safetensors")) if dtype == "float32" else {}
    if tensors:
        assert ("lm_head.weight" in tensors) == (not config.tie_embeddings)
        q = tensors["model.layers.1.self_attn.q_proj.weight"]  # [N*H, D]
        q_dnh = np.asarray(params["layers"][1]["attn"]["q_dnh"])
        assert q[2 * 16 + 5, 7] == q_dnh[7, 2, 5]  # row n * H + h of HF is head n, dim h


def test_load_as_numpy_and_dtype_override(tmp_path):
    config = tiny_config("qwen3", param_dtype="bfloat16", dtype="bfloat16")
    params = random_params(config, seed=2)
    hf.save_hf_checkpoint(config, params, tmp_path, model_type="qwen3")
    cfg32, p32 = hf.load_hf_checkpoint(tmp_path, dtype="float32", as_numpy=True)
    assert cfg32 == config.replace(param_dtype="float32", dtype="float32")
    assert isinstance(p32["embed_vd"], np.ndarray) and p32["embed_vd"].dtype == np.float32
    np.testing.assert_array_equal(p32["embed_vd"], np.asarray(params["embed_vd"], np.float32))


@pytest.fixture
def saved_qwen3(tmp_path):
    config = tiny_config("qwen3")
    hf.save_hf_checkpoint(config, random_params(config, seed=3), tmp_path, model_type="qwen3")
    return tmp_path


def _rewrite_tensors(directory, fn):
    file = os.path.join(directory, "model.safetensors")
    tensors = fn(dict(load_file(file)))
    save_file(tensors, file, metadata={"format": "pt"})


def _rewrite_config(directory, **changes):
    file = os.path.join(directory, "config.json")
    with open(file) as f:
        cfg = json.load(f)
    cfg.update(changes)
    with open(file, "w") as f:
        json.dump(cfg, f)


def test_load_errors_name_the_problem(saved_qwen3, tmp_path_factory):
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf.load_hf_checkpoint(empty)
    with open(empty / "config.json", "w") as f:
        json.dump(hf.config_to_hf(tiny_config("qwen3"), "qwen3"), f)
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index"):
        hf.load_hf_checkpoint(empty)

    def drop(t):
        del t["model.layers.1.mlp.up_proj.weight"]
        return t

    def extra(t):
        t["model.layers.2.mlp.up_proj.weight"] = t["model.layers.1.mlp.up_proj.weight"]
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # skipped
        return t

    _rewrite_tensors(saved_qwen3, extra)
    with pytest.raises(ValueError, match=r"1 tensor\(s\) the model does not use.*layers\.2\.mlp"):
        hf.load_hf_checkpoint(saved_qwen3)
    _rewrite_tensors(saved_qwen3, drop)
    with pytest.raises(ValueError, match=r"lacks 1 tensor\(s\).*model.layers.1.mlp.up_proj.weight"):
        hf.load_hf_checkpoint(saved_qwen3)


def test_load_shape_mismatch_names_tensor(saved_qwen3):
    _rewrite_config(saved_qwen3, intermediate_size=80)
    with pytest.raises(
        ValueError,
        match=r"model.layers.0.mlp.gate_proj.weight .* has shape \[96, 64\], expected \[80, 64\]",
    ):
        hf.load_hf_checkpoint(saved_qwen3)


def test_load_tied_checkpoint_with_lm_head(saved_qwen3):
    # Some exporters write lm_head.weight even when tied: accepted only if it is a copy.
    _rewrite_tensors(saved_qwen3, lambda t: {**t, "lm_head.weight": t["model.embed_tokens.weight"]})
    config, params = hf.load_hf_checkpoint(saved_qwen3)
    assert config.tie_embeddings and "lm_head_dv" not in params
    _rewrite_tensors(saved_qwen3, lambda t: {**t, "lm_head.weight": t["lm_head.weight"] + 1})
    with pytest.raises(ValueError, match="ties the embeddings but .* differs"):
        hf.load_hf_checkpoint(saved_qwen3)


def test_load_unsupported_model_type(saved_qwen3):
    _rewrite_config(saved_qwen3, model_type="gemma")
    with pytest.raises(ValueError, match="unsupported model_type 'gemma'"):
        hf.load_hf_checkpoint(saved_qwen3)


def test_save_rejects_params_that_do_not_match(tmp_path):
    config = tiny_config("llama")
    params = random_params(config, seed=4)
    params["layers"][0]["mlp"]["up_df"] = params["layers"][0]["mlp"]["up_df"][:, :10]
    with pytest.raises(ValueError, match=r"params\['layers'\]\[0\]\['mlp'\]\['up_df'\] has shape"):
        hf.save_hf_checkpoint(config, params, tmp_path, model_type="llama")


def test_load_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"<|endoftext|>": 0, "<|im_end|>": 1, "hello": 2, "world": 3, "[UNK]": 4}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>", "<|im_end|>"])
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = hf.load_tokenizer(tmp_path)
    assert loaded.encode("hello world") == [2, 3]
    assert loaded.eos_id == 1  # <|im_end|>, found by name
    assert loaded.vocab_size == 5


# ---------------------------------------------------------------------------- HF parity


def _hf_model(family: str, *, tied: bool, seed: int = 0):
    """A random transformers model of ``tiny_config(family)`` (``hf_fixtures.hf_model``)."""
    return hf_model(tiny_config(family, tie_embeddings=tied), family, seed)


def _hf_logits(model, tokens_bt, mask_bt, positions_bt):
    torch = pytest.importorskip("torch")
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(tokens_bt),
            attention_mask=torch.tensor(mask_bt.astype(np.int64)),
            position_ids=torch.tensor(positions_bt),
        )
    return out.logits.float().numpy()


def _max_diff(ours_btv, theirs_btv, mask_bt):
    assert np.isfinite(ours_btv[mask_bt]).all()
    # The logits must carry signal, or a loose match would prove nothing.
    assert theirs_btv[mask_bt].std() > 0.3
    return float(np.abs(ours_btv[mask_bt] - theirs_btv[mask_bt]).max())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_logits_match_hf_fp32(tmp_path, family, tied):
    model = _hf_model(family, tied=tied, seed=2 * FAMILIES.index(family) + tied)
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, params = hf.load_hf_checkpoint(tmp_path)
    assert config == tiny_config(family, tie_embeddings=tied)
    assert ("lm_head_dv" in params) == (not tied)
    tokens_bt, mask_bt, positions_bt = _left_padded_batch()
    ours = _our_logits(config, params, tokens_bt, mask_bt)
    theirs = _hf_logits(model, tokens_bt, mask_bt, positions_bt)
    diff = _max_diff(ours, theirs, mask_bt)
    print(f"{family} tied={tied} fp32 max|dlogit|={diff:.2e}")
    assert diff < 1e-4


def test_sharded_checkpoint_matches_hf(tmp_path):
    model = _hf_model("qwen2", tied=False, seed=11)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="60KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2
    assert not (tmp_path / "model.safetensors").exists()
    config, params = hf.load_hf_checkpoint(tmp_path)
    tokens_bt, mask_bt, positions_bt = _left_padded_batch(seed=1)
    ours = _our_logits(config, params, tokens_bt, mask_bt)
    diff = _max_diff(ours, _hf_logits(model, tokens_bt, mask_bt, positions_bt), mask_bt)
    print(f"qwen2 sharded fp32 max|dlogit|={diff:.2e}")
    assert diff < 1e-4


def test_bf16_checkpoint_matches_hf(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = _hf_model("qwen3", tied=True, seed=12).to(torch.bfloat16)
    model.save_pretrained(tmp_path, safe_serialization=True)
    # Reference: transformers' fp32 model of the same bf16 weights.
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    config, params = hf.load_hf_checkpoint(tmp_path)
    assert config.param_dtype == "bfloat16" and params["embed_vd"].dtype == jnp.bfloat16
    want = model.model.layers[0].self_attn.q_proj.weight.detach().float().numpy()  # [N*H, D]
    got = np.asarray(params["layers"][0]["attn"]["q_dnh"], np.float32)  # [D, N, H]
    np.testing.assert_array_equal(got.reshape(64, -1).T, want)  # bit-exact bf16 read

    tokens_bt, mask_bt, positions_bt = _left_padded_batch(seed=2)
    theirs = _hf_logits(reference, tokens_bt, mask_bt, positions_bt)
    config32, params32 = hf.load_hf_checkpoint(tmp_path, dtype="float32")
    diff32 = _max_diff(_our_logits(config32, params32, tokens_bt, mask_bt), theirs, mask_bt)
    diff16 = _max_diff(_our_logits(config, params, tokens_bt, mask_bt), theirs, mask_bt)
    # transformers' own bf16 model sets the scale of bf16 rounding error (~0.07 here).
    hf_diff16 = _max_diff(_hf_logits(model, tokens_bt, mask_bt, positions_bt), theirs, mask_bt)
    print(
        f"qwen3 bf16 weights: ours fp32 compute {diff32:.2e}, ours bf16 compute {diff16:.2e}, "
        f"transformers bf16 compute {hf_diff16:.2e}"
    )
    assert diff32 < 1e-4
    assert diff16 < 2 * hf_diff16 and diff16 < 0.15


@pytest.mark.parametrize("family", FAMILIES)
def test_exported_checkpoint_loads_in_transformers(tmp_path, family):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = tiny_config(family, tie_embeddings=family == "llama")
    params = random_params(config, seed=5)
    hf.save_hf_checkpoint(config, params, tmp_path, model_type=family)
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(theirs_model).__name__ == HF_CLASSES[family][1]
    tokens_bt, mask_bt, positions_bt = _left_padded_batch(seed=3)
    ours = _our_logits(config, params, tokens_bt, mask_bt)
    diff = _max_diff(ours, _hf_logits(theirs_model, tokens_bt, mask_bt, positions_bt), mask_bt)
    print(f"{family} exported fp32 max|dlogit|={diff:.2e}")
    assert diff < 1e-4


# ---------------------------------------------------------------------------- generation

PROMPTS = [[5, 17, 99, 3, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15], [100, 1, 64]]
NEW_TOKENS = 32


def _hf_greedy(model, prompts, pad_id=0):
    """transformers' greedy generate on left-padded prompts: [B, NEW_TOKENS] tokens."""
    torch = pytest.importorskip("torch")
    p = max(len(x) for x in prompts)
    tokens = np.full((len(prompts), p), pad_id, np.int64)
    mask = np.zeros((len(prompts), p), np.int64)
    for i, x in enumerate(prompts):
        tokens[i, p - len(x) :], mask[i, p - len(x) :] = x, 1
    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            pad_token_id=pad_id,
            eos_token_id=None,
        )
    return out[:, p:].numpy()


def _simple_greedy(config, params, prompts, pad_id=0):
    """Greedy decoding by re-running the full forward over a fixed [B, P + R] buffer."""
    p, b = max(len(x) for x in prompts), len(prompts)
    tokens = np.full((b, p + NEW_TOKENS), pad_id, np.int32)
    mask = np.zeros((b, p + NEW_TOKENS), bool)
    for i, x in enumerate(prompts):
        tokens[i, p - len(x) : p], mask[i, p - len(x) : p] = x, True
    forward = _jit_forward(config)
    for step in range(NEW_TOKENS):
        logits_btv = forward(params, jnp.asarray(tokens), input_mask_bt=jnp.asarray(mask))
        tokens[:, p + step] = np.asarray(jnp.argmax(logits_btv[:, p + step - 1], axis=-1))
        mask[:, p + step] = True
    return tokens[:, p:]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow  # 4 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_greedy_generation_matches_hf(tmp_path, family):
    model = _hf_model(family, tied=family != "llama", seed=21)
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, params = hf.load_hf_checkpoint(tmp_path)
    theirs = _hf_greedy(model, PROMPTS)
    assert theirs.shape == (len(PROMPTS), NEW_TOKENS)
    assert len(np.unique(theirs)) > 5  # not a degenerate repeat of one token
    np.testing.assert_array_equal(_simple_greedy(config, params, PROMPTS), theirs)


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sampler_greedy_matches_hf(tmp_path, family):
    model = _hf_model(family, tied=family != "llama", seed=22)
    model.save_pretrained(tmp_path, safe_serialization=True)
    config, params = hf.load_hf_checkpoint(tmp_path)
    theirs = _hf_greedy(model, PROMPTS)
    sampler = sampler_lib.Sampler(
        config,
        eos_id=config.vocab_size,  # outside the vocabulary: never stops early, like HF here
        pad_id=0,
        max_prompt_len=16,
        max_new_tokens=NEW_TOKENS,
    )
    out = sampler(
        params,
        PROMPTS,
        rng=jax.random.key(0),
        sampling=sampler_lib.SamplingConfig(greedy=True),
    )
    np.testing.assert_array_equal(np.asarray(out.lengths), [NEW_TOKENS] * len(PROMPTS))
    assert np.asarray(out.response_mask)[:, :NEW_TOKENS].all()
    np.testing.assert_array_equal(np.asarray(out.response_tokens)[:, :NEW_TOKENS], theirs)
