"""The toy Hugging Face models of the tests, in one place.

- ``TINY`` / ``tiny_config(family)``: a 2-layer dense model of each family (Qwen3,
  Qwen2, Llama); ``TINY_MOE`` / ``tiny_moe_config(variant)``: a 3-layer Qwen3-MoE.
- ``random_params``: our parameters with non-trivial norms and biases;
  ``hf_model``: transformers' model of the same shape, every weight randomised
  (needs torch + transformers; skips without them).
- ``make_tiny_hf_dir``: a random tiny checkpoint directory (Qwen3 layout, byte-level
  BPE tokenizer) for the runs that start from HF weights.
"""

import jax
import jax.numpy as jnp
import pytest

from rl_batch.models import hf
from rl_batch.models import transformer as model_lib
from rl_batch.tokenizers import HFTokenizer
from tests.run_fixtures import TINY_MODEL
from tests.test_tokenizers import make_hf_tokenizer

# ------------------------------------------------------------------------- dense models

TINY = dict(
    vocab_size=128,
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=96,
    rope_theta=10_000.0,
    max_seq_len=128,
)
FAMILY_FLAGS = {
    "qwen3": dict(qk_norm=True, qkv_bias=False),
    "qwen2": dict(qk_norm=False, qkv_bias=True),
    "llama": dict(qk_norm=False, qkv_bias=False),
}
FAMILIES = tuple(FAMILY_FLAGS)


def tiny_config(family: str, **overrides) -> model_lib.ModelConfig:
    """``TINY`` with the flags of ``family`` (a key of ``FAMILY_FLAGS``)."""
    return model_lib.ModelConfig(**{**TINY, **FAMILY_FLAGS[family], **overrides})


# --------------------------------------------------------------------------- MoE models

# 3 layers: with mlp_only_layers=(1,) layer 1 keeps the dense MLP, 0 and 2 are sparse.
TINY_MOE = dict(
    TINY,
    num_layers=3,
    qk_norm=True,
    tie_embeddings=False,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    mlp_only_layers=(1,),
)
MOE_VARIANTS = {
    "norm_topk": dict(norm_topk_prob=True),
    "raw_topk": dict(norm_topk_prob=False),
    # decoder_sparse_step=2: layers 1 (and 3) sparse; top-3 of 6 experts, tied head.
    "step2": dict(
        decoder_sparse_step=2,
        mlp_only_layers=(),
        num_experts=6,
        num_experts_per_tok=3,
        tie_embeddings=True,
    ),
}


def tiny_moe_config(variant: str) -> model_lib.ModelConfig:
    """``TINY_MOE`` with the changes of ``variant`` (a key of ``MOE_VARIANTS``)."""
    return model_lib.ModelConfig(**{**TINY_MOE, **MOE_VARIANTS[variant]})


# ------------------------------------------------------------------------ random weights


def random_params(config: model_lib.ModelConfig, seed: int) -> model_lib.Params:
    """Random params with non-trivial norms and biases (init gives ones / zeros)."""
    leaves, treedef = jax.tree.flatten(model_lib.abstract_params(config))
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    out = []
    for key, spec in zip(keys, leaves):
        scale = 0.2 if len(spec.shape) < 2 else 0.15
        value = scale * jax.random.normal(key, spec.shape, jnp.float32)
        out.append(value.astype(spec.dtype))
    params = jax.tree.unflatten(treedef, out)
    # Norm scales around 1 so activations stay O(1).
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x + 1 if "scale" in jax.tree_util.keystr(p) else x, params
    )


HF_CLASSES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
}


def hf_model(config: model_lib.ModelConfig, model_type: str, seed: int):
    """A random transformers model (fp32, eager attention) with the shape of ``config``.

    Every weight is drawn anew: norm scales ``1 + 0.2 N(0, 1)``, biases ``0.2 N(0, 1)``,
    the rest ``0.15 N(0, 1)``. No BOS / EOS / PAD ids, so generation runs the full length.

    Args:
      config: our config of the model (dense, or MoE for ``model_type="qwen3_moe"``).
      model_type: a key of ``HF_CLASSES``.
      seed: torch's seed.
    """
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config_cls, model_cls = (getattr(transformers, n) for n in HF_CLASSES[model_type])
    moe = {}
    if config.num_experts:
        moe = dict(
            num_experts=config.num_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            moe_intermediate_size=config.moe_intermediate_size,
            norm_topk_prob=config.norm_topk_prob,
            decoder_sparse_step=config.decoder_sparse_step,
            mlp_only_layers=list(config.mlp_only_layers),
        )
    cfg = config_cls(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_seq_len,
        rope_theta=config.rope_theta,
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        **moe,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    if config.tie_embeddings:  # copy_ into the shared tensor keeps them tied; check it.
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


# --------------------------------------------------------------------- checkpoint dirs


def make_tiny_hf_dir(directory):
    """Writes tokenizer.json, config.json and model.safetensors into ``directory``: the
    run tests' 1-layer model (``run_fixtures.TINY_MODEL``) in the Qwen3 layout."""
    make_hf_tokenizer(directory)
    config = model_lib.ModelConfig(
        vocab_size=HFTokenizer(directory).vocab_size,
        **TINY_MODEL,
        qk_norm=True,
        max_seq_len=256,
    )
    hf.save_hf_checkpoint(config, model_lib.init_params(config, 0), str(directory))
    return directory
