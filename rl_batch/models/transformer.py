"""Decoder-only transformer of the Qwen3 / Qwen2 / Llama family in Flax NNX.

One module covers the family through config switches: RMSNorm, rotary position
embeddings (configurable theta), grouped-query attention, optional QK-norm (Qwen3),
optional QKV bias (Qwen2), SwiGLU MLP, tied or untied embeddings, and an optional
scalar value head (PPO critics). With ``num_experts > 0`` the MLP of the sparse layers is
the Qwen3-MoE mixture-of-experts block of ``rl_batch.models.moe`` (``ModelConfig.is_moe_layer``).

Parameters are exchanged as a *pure* nested dict of arrays (``params``): the learner,
the optimizer, the sampler, checkpoints and the Hugging Face importer all use that one
tree. ``forward(config, params, ...)`` is the pure functional entry point; the NNX
module is rebuilt from ``params`` at trace time, so there is no copy of the weights.

With ``scan_layers`` the blocks' parameters are stored stacked on a leading [L] axis;
``to_layout`` converts a tree between the two layouts (HF import and export map either).

Every parameter carries logical axis names (metadata ``logical_axes``) that
``rl_batch.models.sharding`` maps to mesh axes; ``logical_axes(config)`` returns them as a tree
shaped like ``params``.

Shape letters (docs/glossary.md): B batch rows, T tokens fed to the forward (query
positions), S key/value (cache) slots, D model width, N query heads, K key/value heads,
J = N // K query heads per KV head and Q = J * T query rows of one KV head (the attention
code's local names still write J as ``g``: ``logits_bkgts``), H head dim, F MLP width,
V vocabulary, L layers, E experts, A experts per token (still ``k`` in
``replay_experts_btlk``).

Length: over 800 lines because the whole dense decoder family (config, attention with its
KV-cache and blocked variants, MLP, block, model, the pure ``forward`` and the two
parameter layouts) lives in one module, as in the reference implementations it is
checked against; the MoE block is ``rl_batch.models.moe``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rl_batch.models import moe as moe_lib

Params = dict[str, Any]
# Per-layer KV cache: {"k": [B, K, S, H], "v": [B, K, S, H]} (heads before slots, so
# attention reads the cache without transposing it on every decode step).
LayerCache = dict[str, jax.Array]
Cache = list[LayerCache]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_HEADS = ("lm", "value")
# Decoder-block rematerialisation: what the backward pass keeps of each block's forward.
# "full" keeps only the block's input (and recomputes the rest); the "dots" policies
# also keep matmul outputs ("dots_with_no_batch_dims_saveable": the weight matmuls but
# not the [B, K, Q, S] attention scores, which are batched matmuls).
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")
# "einsum": this module's attention (the reference; fast on CPU). "xla" / "cudnn":
# ``jax.nn.dot_product_attention`` with that implementation (cudnn: flash attention,
# GPU only, bf16/fp16). "auto": cudnn on GPU where it applies, einsum on CPU, xla
# elsewhere (TPU; a Pallas splash-attention kernel is not wired in).
ATTENTION_IMPLS = ("einsum", "xla", "cudnn", "auto")
# Logical axis of the stacked decoder blocks (``scan_layers``): never sharded.
LAYERS_AXIS = "layers"
# Finite instead of -inf so that fully masked rows (left padding) stay NaN-free.
_MASK_VALUE = -1e30


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape and numerics of a decoder-only transformer.

    Attributes:
      vocab_size: V.
      hidden_size: model width D.
      num_layers: number of decoder blocks.
      num_heads: query heads N.
      num_kv_heads: key/value heads K (N must be a multiple of K; K < N is GQA).
      head_dim: per-head width H.
      intermediate_size: SwiGLU width F.
      rope_theta: rotary embedding base.
      rms_norm_eps: RMSNorm epsilon.
      qk_norm: RMSNorm on each query/key head before RoPE (Qwen3).
      qkv_bias: bias on the q/k/v projections (Qwen2).
      tie_embeddings: the LM head reuses the embedding matrix.
      max_seq_len: longest sequence (prompt + response) the model supports.
      param_dtype: storage dtype of parameters.
      dtype: compute dtype of activations and matmuls (logits are float32).
      head: "lm" for next-token logits, "value" for a scalar value per position.
      remat: rematerialisation of each decoder block in the backward pass, one of
        ``REMAT_POLICIES`` (memory only: the gradients are the same).
      attention: attention implementation for multi-token passes (training forward,
        prefill), one of ``ATTENTION_IMPLS``; one-token decode steps always use einsum.
      logits_chunk: response positions whose [B, chunk, V] logits exist at once when
        log-probs and entropy are computed from hidden states (``rl_batch.models.logprobs``);
        0 = all R positions at once. Memory only: the values are the same.
      scan_layers: store the decoder blocks' parameters stacked on a leading layer
        axis (``params["layers"]`` is one block's tree of [L, ...] arrays, logical axis
        ``"layers"``) and run cache-free passes (training) as one ``lax.scan`` over
        them, so the program holds one block, and the optimizer one update per block
        parameter, instead of ``num_layers``. KV-cache passes (sampling) run the blocks
        unrolled on static slices of the stack, each writing its own layer's cache in
        place. ``stack_layers`` / ``unstack_layers`` / ``to_layout`` convert trees.
      num_experts: E experts per sparse (MoE) layer; 0 = a dense model.
      num_experts_per_tok: experts k each token is routed to (top-k of the router).
      moe_intermediate_size: SwiGLU width of one expert.
      norm_topk_prob: renormalise the k routing weights to sum to 1 (Qwen3-MoE).
      decoder_sparse_step: layer i is sparse iff (i + 1) % step == 0 (HF's rule) ...
      mlp_only_layers: ... and i is not in this tuple (those keep the dense MLP of
        width ``intermediate_size``).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    qk_norm: bool = False
    qkv_bias: bool = False
    tie_embeddings: bool = True
    max_seq_len: int = 2048
    param_dtype: str = "float32"
    dtype: str = "float32"
    head: str = "lm"
    remat: str = "none"
    attention: str = "einsum"
    logits_chunk: int = 0
    scan_layers: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"ModelConfig.num_heads={self.num_heads} must be a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
        for name in ("param_dtype", "dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(
                    f"ModelConfig.{name}={getattr(self, name)!r}; expected one of {sorted(_DTYPES)}"
                )
        if self.head not in _HEADS:
            raise ValueError(f"ModelConfig.head={self.head!r}; expected one of {_HEADS}")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"ModelConfig.remat={self.remat!r}; expected one of {REMAT_POLICIES}")
        if self.attention not in ATTENTION_IMPLS:
            raise ValueError(
                f"ModelConfig.attention={self.attention!r}; expected one of {ATTENTION_IMPLS}"
            )
        if not isinstance(self.scan_layers, bool):
            raise ValueError(f"ModelConfig.scan_layers must be a bool, got {self.scan_layers!r}")
        if not isinstance(self.logits_chunk, int) or self.logits_chunk < 0:
            raise ValueError(
                f"ModelConfig.logits_chunk must be a non-negative int, got {self.logits_chunk!r}"
            )
        # JSON round trips give lists; the config must stay hashable (jit static arg).
        object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
        moe_lib.check_moe_config(self)
        if self.scan_layers and self.num_experts:
            # The scan stacks identical blocks, and the router logits a MoE block sows
            # (``forward_with_router``) cannot leave a ``lax.scan`` body.
            raise ValueError(
                "ModelConfig.scan_layers=True is not supported with a MoE model "
                f"(num_experts={self.num_experts}); use scan_layers=False"
            )

    def replace(self, **changes) -> ModelConfig:
        """Returns a copy with ``changes`` applied (validated again)."""
        return dataclasses.replace(self, **changes)

    def is_moe_layer(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` has the MoE block (HF Qwen3-MoE's rule)."""
        return (
            self.num_experts > 0
            and layer not in self.mlp_only_layers
            and (layer + 1) % self.decoder_sparse_step == 0
        )

    @property
    def num_moe_layers(self) -> int:
        """Number of sparse (MoE) layers."""
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def num_active_params(self) -> int:
        """Parameters one token uses: ``num_params`` less the experts it is not routed to
        (E - k of every sparse layer). Equals ``num_params`` for a dense model."""
        inactive = self.num_experts - self.num_experts_per_tok
        return self.num_params - self.num_moe_layers * inactive * 3 * self.hidden_size * (
            self.moe_intermediate_size
        )

    @property
    def num_params(self) -> int:
        """Exact parameter count of the module built from this config."""
        d, n, k, h, f = (
            self.hidden_size,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            self.intermediate_size,
        )
        attn = d * n * h + 2 * d * k * h + n * h * d
        if self.qkv_bias:
            attn += n * h + 2 * k * h
        if self.qk_norm:
            attn += 2 * h
        dense_layer = attn + 3 * d * f + 2 * d
        # A sparse layer: router [D, E] and E experts of 3 * D * F_moe each.
        moe_layer = attn + d * self.num_experts * (1 + 3 * self.moe_intermediate_size) + 2 * d
        n_moe = self.num_moe_layers
        total = self.vocab_size * d + (self.num_layers - n_moe) * dense_layer + d
        total += n_moe * moe_layer
        if self.head == "value":
            total += d + 1
        elif not self.tie_embeddings:
            total += d * self.vocab_size
        return total

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """The config ``to_dict`` wrote (also read back from JSON, which has no tuples)."""
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


# Memory settings of real-model (>= 100M parameter) run configs (``with_memory_defaults``;
# the presets themselves are the checkpoints' shapes): remat every block, flash
# attention where there is one, log-probs 512 response positions at a time (one 2k-token
# 0.6B sequence: 0.3 GB of fp32 logits instead of 1.2 GB), and the blocks stored stacked
# under a scan (dense models only): the qwen3-0.6b update compiles in 6.8 s instead of
# 454 s with trace-time stacking (``experiments.compile_cost``, docs/memory.md).
STUDY_MEMORY = dict(remat="full", attention="auto", logits_chunk=512, scan_layers=True)
REAL_MODEL_PARAMS = 100_000_000


def with_memory_defaults(config: ModelConfig) -> ModelConfig:
    """``config`` with ``STUDY_MEMORY`` applied if it has >= 100M parameters (a real
    checkpoint's shape; MoE models keep their per-layer blocks, which a scan cannot
    run); small models keep their settings. Run configs apply this before their
    ``model.overrides`` (``rl_batch.runs.config.make_model_config``)."""
    if config.num_params < REAL_MODEL_PARAMS:
        return config
    changes = dict(STUDY_MEMORY)
    if config.num_experts:
        del changes["scan_layers"]
    return config.replace(**changes)


def with_master_weights(config: ModelConfig) -> ModelConfig:
    """Mixed precision: parameters stored in float32 (and so Adam's moments, which take
    the parameters' dtype) under a lower-precision compute dtype, which every matmul
    casts the weights to. A bf16-stored policy loses updates below its rounding step:
    one Adam step at lr 1e-7 changed 0.1% of a bf16 tiny policy's weights."""
    if config.dtype == "float32":
        return config
    return config.replace(param_dtype="float32")


# Tiny CPU models and the shapes (no weights) of real checkpoints.
PRESETS: dict[str, ModelConfig] = {
    # ~1.0M parameters: 4 layers, d=128. Vocab fits the character tokenizer.
    "tiny-1m": ModelConfig(
        vocab_size=64,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=512,
        qk_norm=True,
        max_seq_len=256,
    ),
    # ~4.8M parameters: 6 layers, d=256.
    "tiny-5m": ModelConfig(
        vocab_size=64,
        hidden_size=256,
        num_layers=6,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
        intermediate_size=768,
        qk_norm=True,
        max_seq_len=256,
    ),
    "qwen3-0.6b": ModelConfig(
        vocab_size=151_936,
        hidden_size=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=3072,
        rope_theta=1_000_000.0,
        qk_norm=True,
        tie_embeddings=True,
        max_seq_len=40_960,
        param_dtype="bfloat16",
        dtype="bfloat16",
    ),
    "qwen3-1.7b": ModelConfig(
        vocab_size=151_936,
        hidden_size=2048,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=6144,
        rope_theta=1_000_000.0,
        qk_norm=True,
        tie_embeddings=True,
        max_seq_len=40_960,
        param_dtype="bfloat16",
        dtype="bfloat16",
    ),
    "qwen3-4b": ModelConfig(
        vocab_size=151_936,
        hidden_size=2560,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=9728,
        rope_theta=1_000_000.0,
        qk_norm=True,
        tie_embeddings=True,
        max_seq_len=40_960,
        param_dtype="bfloat16",
        dtype="bfloat16",
    ),
    "qwen3-8b": ModelConfig(
        vocab_size=151_936,
        hidden_size=4096,
        num_layers=36,
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        intermediate_size=12288,
        rope_theta=1_000_000.0,
        qk_norm=True,
        tie_embeddings=False,
        max_seq_len=40_960,
        param_dtype="bfloat16",
        dtype="bfloat16",
    ),
    "qwen2.5-0.5b": ModelConfig(
        vocab_size=151_936,
        hidden_size=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        head_dim=64,
        intermediate_size=4864,
        rope_theta=1_000_000.0,
        qkv_bias=True,
        tie_embeddings=True,
        max_seq_len=32_768,
        param_dtype="bfloat16",
        dtype="bfloat16",
    ),
    "qwen2.5-1.5b": ModelConfig(
        vocab_size=151_936,
        hidden_size=1536,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        head_dim=128,
        intermediate_size=8960,
        rope_theta=1_000_000.0,
        qkv_bias=True,
        tie_embeddings=True,
        max_seq_len=32_768,
        param_dtype="bfloat16",
        dtype="bfloat16",
    ),
    # ~3.4M parameters (1.0M active): 4 layers, d=128, 8 experts of width 128, top-2.
    "tiny-moe": ModelConfig(
        vocab_size=64,
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=512,
        qk_norm=True,
        max_seq_len=256,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        norm_topk_prob=True,
    ),
    # Qwen3-30B-A3B: 48 layers, 128 experts of width 768, 8 active; 30.5B / 3.3B.
    "qwen3-30b-a3b": ModelConfig(
        vocab_size=151_936,
        hidden_size=2048,
        num_layers=48,
        num_heads=32,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=6144,
        rope_theta=1_000_000.0,
        qk_norm=True,
        tie_embeddings=False,
        max_seq_len=40_960,
        param_dtype="bfloat16",
        dtype="bfloat16",
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        norm_topk_prob=True,
    ),
    # Qwen3-235B-A22B: 94 layers, 128 experts of width 1536, 8 active; 235B / 22B.
    "qwen3-235b-a22b": ModelConfig(
        vocab_size=151_936,
        hidden_size=4096,
        num_layers=94,
        num_heads=64,
        num_kv_heads=4,
        head_dim=128,
        intermediate_size=12288,
        rope_theta=1_000_000.0,
        qk_norm=True,
        tie_embeddings=False,
        max_seq_len=40_960,
        param_dtype="bfloat16",
        dtype="bfloat16",
        num_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=1536,
        norm_topk_prob=True,
    ),
}


def get_preset(name: str, **overrides) -> ModelConfig:
    """Returns a named preset, optionally with fields overridden.

    Raises:
      ValueError: for an unknown preset name (the message lists the known ones).
    """
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


# ----------------------------------------------------------------------------- layers


def _param(rngs: nnx.Rngs, shape, axes, config: ModelConfig, init: str = "normal") -> nnx.Param:
    dtype = _DTYPES[config.param_dtype]
    if init == "normal":
        value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        value = jnp.zeros(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=axes)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32, cast back to the input dtype before the scale (as in HF)."""
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale.astype(x.dtype) * x32.astype(x.dtype)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, axis_name: str, config: ModelConfig, *, rngs: nnx.Rngs):
        self.scale = _param(rngs, (dim,), (axis_name,), config, init="ones")
        self.eps = config.rms_norm_eps

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.scale[...], self.eps)


def dense(x: jax.Array, w: jax.Array) -> jax.Array:
    """``x [..., D] @ w [D, F]`` as one 2-D matmul over the flattened leading axes.

    The same values as the batched form, but its backward pass is two plain GEMMs: with a
    3-D ``x`` XLA's CPU backend computed the weight gradient (a contraction over batch and
    time at once) about 3x slower, which made the decoder's backward pass ~9x its forward.
    """
    lead = x.shape[:-1]
    return (x.reshape(-1, x.shape[-1]) @ w).reshape(*lead, w.shape[-1])


def rope(x_btnh: jax.Array, positions_bt: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding, "rotate half" convention (Llama/Qwen in HF)."""
    h = x_btnh.shape[-1]
    inv_freq_h2 = 1.0 / (theta ** (jnp.arange(0, h, 2, dtype=jnp.float32) / h))
    angles_bth2 = positions_bt[..., None].astype(jnp.float32) * inv_freq_h2
    angles_bth = jnp.concatenate([angles_bth2, angles_bth2], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles_bth), jnp.sin(angles_bth)
    x32 = x_btnh.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * cos + rotated * sin).astype(x_btnh.dtype)


def attention_impl(config: ModelConfig) -> str:
    """The attention implementation ``config.attention`` names on this backend.

    ``auto`` picks cuDNN flash attention on a GPU for the shapes it supports (bf16/fp16
    compute, head_dim a multiple of 8 up to 128), else XLA; einsum on the CPU.
    """
    if config.attention != "auto":
        return config.attention
    backend = jax.default_backend()
    if backend == "cpu":
        return "einsum"
    cudnn_ok = (
        config.dtype in ("bfloat16", "float16")
        and config.head_dim % 8 == 0
        and config.head_dim <= 128
    )
    return "cudnn" if backend == "gpu" and cudnn_ok else "xla"


def _einsum_attention(
    q_btnh: jax.Array, k_bksh: jax.Array, v_bksh: jax.Array, mask_bts: jax.Array
) -> jax.Array:
    """Grouped-query attention with fp32 scores [B, K, G * T, S] (the reference path).

    Two batched matmuls over (B, K) with the G query heads of a KV head and the T queries
    flattened into one axis of Q = G * T rows: the form CPU matmul libraries run fast (a
    "btkgh"-ordered einsum output made XLA emit B * K * G tiny matmuls, about a third of
    the decode step time).
    """
    b, t, n, h = q_btnh.shape
    kv = k_bksh.shape[1]
    g = n // kv
    dt = q_btnh.dtype
    q_bkqh = q_btnh.reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, h)
    logits_bkqs = jnp.einsum("bkqh,bksh->bkqs", q_bkqh, k_bksh)
    logits_bkgts = logits_bkqs.reshape(b, kv, g, t, -1).astype(jnp.float32) * (h**-0.5)
    logits_bkgts = jnp.where(mask_bts[:, None, None, :, :], logits_bkgts, _MASK_VALUE)
    probs_bkqs = jax.nn.softmax(logits_bkgts, axis=-1).astype(dt).reshape(b, kv, g * t, -1)
    out_bkqh = jnp.einsum("bkqs,bksh->bkqh", probs_bkqs, v_bksh)
    return out_bkqh.reshape(b, kv, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def _blocked_decode_attention(
    q_btnh: jax.Array,
    k_bksh: jax.Array,
    v_bksh: jax.Array,
    mask_bts: jax.Array,
    kv_len: jax.Array,
    block: int,
) -> jax.Array:
    """``_einsum_attention`` that reads only the first ``kv_len`` cache slots, in blocks.

    Flash-decoding style: a ``lax.while_loop`` over K/V blocks of ``block`` slots up to
    ``kv_len`` (traced; the largest filled length of the batch) with an online softmax
    in fp32, so a step at context L reads about L slots, not all S. Slots past
    ``kv_len`` must be masked out in ``mask_bts`` (they are never read). The last block
    is shifted back to end at S when S is not a multiple of ``block``; slots it
    re-reads are masked so that none counts twice.

    Args:
      q_btnh: [B, T, N, H] queries.
      k_bksh, v_bksh: [B, K, S, H] cache (compute dtype).
      mask_bts: [B, T, S] bool, True where query t may attend slot s.
      kv_len: [] int32, slots [0, kv_len) are read (clipped to [1, S]).
      block: slots per block (static, >= 1; clipped to S).

    Returns:
      [B, T, N, H] attention outputs (compute dtype).
    """
    b, t, n, h = q_btnh.shape
    kv, s = k_bksh.shape[1], k_bksh.shape[2]
    g = n // kv
    block = max(1, min(block, s))
    dt = q_btnh.dtype
    q_bkqh = q_btnh.reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, h)
    kv_len = jnp.clip(jnp.asarray(kv_len, jnp.int32), 1, s)
    num_blocks = (kv_len + block - 1) // block
    zero = jnp.zeros((), jnp.int32)

    def body(carry):
        i, max_bkgt, sum_bkgt, acc_bkgth = carry
        first = i * block
        start = jnp.minimum(first, s - block)
        k_blk = jax.lax.dynamic_slice(k_bksh, (zero, zero, start, zero), (b, kv, block, h))
        v_blk = jax.lax.dynamic_slice(v_bksh, (zero, zero, start, zero), (b, kv, block, h))
        mask_btc = jax.lax.dynamic_slice(mask_bts, (zero, zero, start), (b, t, block))
        fresh_c = start + jnp.arange(block, dtype=jnp.int32) >= first  # not read before
        logits_bkqc = jnp.einsum("bkqh,bkch->bkqc", q_bkqh, k_blk)
        logits_bkgtc = logits_bkqc.reshape(b, kv, g, t, block).astype(jnp.float32) * (h**-0.5)
        valid_btc = mask_btc & fresh_c[None, None, :]
        logits_bkgtc = jnp.where(valid_btc[:, None, None], logits_bkgtc, _MASK_VALUE)
        new_max_bkgt = jnp.maximum(max_bkgt, jnp.max(logits_bkgtc, axis=-1))
        probs_bkgtc = jnp.exp(logits_bkgtc - new_max_bkgt[..., None])
        # Slots re-read by a shifted last block (or past kv_len) carry no weight at all.
        probs_bkgtc = jnp.where(fresh_c, probs_bkgtc, 0.0)
        scale_bkgt = jnp.exp(max_bkgt - new_max_bkgt)
        out_bkqh = jnp.einsum(
            "bkqc,bkch->bkqh", probs_bkgtc.astype(dt).reshape(b, kv, g * t, block), v_blk
        )
        acc_bkgth = acc_bkgth * scale_bkgt[..., None] + out_bkqh.reshape(b, kv, g, t, h).astype(
            jnp.float32
        )
        sum_bkgt = sum_bkgt * scale_bkgt + jnp.sum(probs_bkgtc, axis=-1)
        return i + 1, new_max_bkgt, sum_bkgt, acc_bkgth

    init = (
        zero,
        jnp.full((b, kv, g, t), -jnp.inf, jnp.float32),
        jnp.zeros((b, kv, g, t), jnp.float32),
        jnp.zeros((b, kv, g, t, h), jnp.float32),
    )
    _, _, sum_bkgt, acc_bkgth = jax.lax.while_loop(lambda c: c[0] < num_blocks, body, init)
    out_bkgth = (acc_bkgth / sum_bkgt[..., None]).astype(dt)
    return out_bkgth.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


class Attention(nnx.Module):
    """Grouped-query self-attention with an optional KV cache."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        d, n, k, h = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        self.config = c
        self.q_dnh = _param(rngs, (d, n, h), ("embed", "q_heads", "head_dim"), c)
        self.k_dkh = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), c)
        self.v_dkh = _param(rngs, (d, k, h), ("embed", "kv_heads", "head_dim"), c)
        self.o_nhd = _param(rngs, (n, h, d), ("q_heads", "head_dim", "embed"), c)
        if c.qkv_bias:
            self.q_bias_nh = _param(rngs, (n, h), ("q_heads", "head_dim"), c, init="zeros")
            self.k_bias_kh = _param(rngs, (k, h), ("kv_heads", "head_dim"), c, init="zeros")
            self.v_bias_kh = _param(rngs, (k, h), ("kv_heads", "head_dim"), c, init="zeros")
        if c.qk_norm:
            self.q_norm = RMSNorm(h, "head_dim", c, rngs=rngs)
            self.k_norm = RMSNorm(h, "head_dim", c, rngs=rngs)

    def __call__(
        self,
        x_btd: jax.Array,
        positions_bt: jax.Array,
        mask_bts: jax.Array,
        cache: LayerCache | None = None,
        cache_index: jax.Array | int | None = None,
        kv_len: jax.Array | None = None,
        kv_block: int = 0,
    ) -> tuple[jax.Array, LayerCache | None]:
        c = self.config
        dt = _DTYPES[c.dtype]
        b, t, d = x_btd.shape
        n, k, h = c.num_heads, c.num_kv_heads, c.head_dim
        q_btnh = dense(x_btd, self.q_dnh[...].astype(dt).reshape(d, n * h)).reshape(b, t, n, h)
        k_btkh = dense(x_btd, self.k_dkh[...].astype(dt).reshape(d, k * h)).reshape(b, t, k, h)
        v_btkh = dense(x_btd, self.v_dkh[...].astype(dt).reshape(d, k * h)).reshape(b, t, k, h)
        if c.qkv_bias:
            q_btnh = q_btnh + self.q_bias_nh[...].astype(dt)
            k_btkh = k_btkh + self.k_bias_kh[...].astype(dt)
            v_btkh = v_btkh + self.v_bias_kh[...].astype(dt)
        if c.qk_norm:
            q_btnh = self.q_norm(q_btnh)
            k_btkh = self.k_norm(k_btkh)
        q_btnh = rope(q_btnh, positions_bt, c.rope_theta)
        k_btkh = rope(k_btkh, positions_bt, c.rope_theta)

        k_bkth = jnp.swapaxes(k_btkh, 1, 2)
        v_bkth = jnp.swapaxes(v_btkh, 1, 2)
        if cache is not None and jnp.ndim(cache_index) == 1:
            # One slot per row ([B] cache_index, T = 1): rows of a continuous batch sit
            # at different steps; each row's new key/value is scattered into its slot.
            # The static sampler decodes through this path too (its B slots all equal):
            # XLA's CPU backend rounds a step's log-probs differently when the step's
            # cache write is a dynamic_update_slice (other fusions, FMA contraction),
            # and both engines must give the same log-probs bit for bit
            # (tests/test_rollout_engine.py).
            rows_b = jnp.arange(b)
            slot_b = jnp.asarray(cache_index, jnp.int32)
            k_bksh = cache["k"].at[rows_b, :, slot_b].set(k_bkth[:, :, 0].astype(cache["k"].dtype))
            v_bksh = cache["v"].at[rows_b, :, slot_b].set(v_bkth[:, :, 0].astype(cache["v"].dtype))
            cache = {"k": k_bksh, "v": v_bksh}
        elif cache is not None:
            # Write the T new keys/values at slots [cache_index, cache_index + T).
            zero = jnp.zeros((), jnp.int32)
            start = (zero, zero, jnp.asarray(cache_index, jnp.int32), zero)
            k_bksh = jax.lax.dynamic_update_slice(
                cache["k"], k_bkth.astype(cache["k"].dtype), start
            )
            v_bksh = jax.lax.dynamic_update_slice(
                cache["v"], v_bkth.astype(cache["v"].dtype), start
            )
            cache = {"k": k_bksh, "v": v_bksh}
        else:
            k_bksh, v_bksh = k_bkth, v_bkth

        b, t, n, h = q_btnh.shape
        impl = attention_impl(c)
        if impl != "einsum" and t > 1 and t == k_bksh.shape[2]:
            # A multi-token pass over exactly its own T slots (training forward, prefill
            # into a P-slot cache): queries and keys are aligned, so the mask is causal.
            out_btnh = jax.nn.dot_product_attention(
                q_btnh,
                jnp.swapaxes(k_bksh, 1, 2).astype(dt),
                jnp.swapaxes(v_bksh, 1, 2).astype(dt),
                mask=mask_bts[:, None, :, :],
                is_causal=impl == "cudnn",  # lets cuDNN skip the upper triangle
                implementation=impl,
            )
        elif kv_len is not None and kv_block > 0:
            out_btnh = _blocked_decode_attention(
                q_btnh, k_bksh.astype(dt), v_bksh.astype(dt), mask_bts, kv_len, kv_block
            )
        else:
            out_btnh = _einsum_attention(q_btnh, k_bksh.astype(dt), v_bksh.astype(dt), mask_bts)
        # A plain 2-D matmul over the flattened (n, h) axis: as a two-axis contraction
        # XLA's CPU layout pass contracted in (h, n) order and transposed o_nhd (a
        # weight copy per decode step).
        o_qd = self.o_nhd[...].reshape(n * h, -1).astype(dt)
        out_btd = dense(out_btnh.reshape(b, t, n * h), o_qd)
        return out_btd, cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.dtype = _DTYPES[config.dtype]
        self.gate_df = _param(rngs, (d, f), ("embed", "mlp"), config)
        self.up_df = _param(rngs, (d, f), ("embed", "mlp"), config)
        self.down_fd = _param(rngs, (f, d), ("mlp", "embed"), config)

    def __call__(self, x_btd: jax.Array) -> jax.Array:
        dt = self.dtype
        gate_btf = dense(x_btd, self.gate_df[...].astype(dt))
        up_btf = dense(x_btd, self.up_df[...].astype(dt))
        return dense(jax.nn.silu(gate_btf) * up_btf, self.down_fd[...].astype(dt))


class Block(nnx.Module):
    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, layer: int = 0):
        self.input_norm = RMSNorm(config.hidden_size, "embed", config, rngs=rngs)
        self.attn = Attention(config, rngs=rngs)
        self.post_attn_norm = RMSNorm(config.hidden_size, "embed", config, rngs=rngs)
        if config.is_moe_layer(layer):
            self.mlp = moe_lib.MoeMLP(config, rngs=rngs, param=_param)
        else:
            self.mlp = MLP(config, rngs=rngs)

    def __call__(
        self, x_btd, positions_bt, mask_bts, cache=None, cache_index=None, kv_len=None, kv_block=0
    ):
        attn_btd, cache = self.attn(
            self.input_norm(x_btd), positions_bt, mask_bts, cache, cache_index, kv_len, kv_block
        )
        x_btd = x_btd + attn_btd
        x_btd = x_btd + self.mlp(self.post_attn_norm(x_btd))
        return x_btd, cache


def _stack_blocks(blocks: list[Block]) -> Block:
    """One ``Block`` whose parameters are the blocks' stacked on a leading [L] axis
    (logical axis ``LAYERS_AXIS`` prepended to each parameter's axes)."""
    graphdef, _ = nnx.split(blocks[0])

    def stack(*variables: nnx.Variable) -> nnx.Variable:
        first = variables[0]
        metadata = dict(first.get_metadata())
        metadata["logical_axes"] = (LAYERS_AXIS, *metadata.get("logical_axes", ()))
        return type(first)(jnp.stack([v[...] for v in variables]), **metadata)

    states = [nnx.state(block) for block in blocks]
    stacked = jax.tree.map(stack, *states, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return nnx.merge(graphdef, stacked)


class Transformer(nnx.Module):
    """The decoder. ``__call__`` returns (logits [B,T,V] or values [B,T], new cache)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.embed_vd = _param(rngs, (c.vocab_size, c.hidden_size), ("vocab", "embed"), c)
        blocks = [Block(c, rngs=rngs, layer=i) for i in range(c.num_layers)]
        # (Stacked from the per-layer blocks, so both layouts draw the same weights.)
        self.layers = _stack_blocks(blocks) if c.scan_layers else nnx.List(blocks)
        self.final_norm = RMSNorm(c.hidden_size, "embed", c, rngs=rngs)
        if c.head == "value":
            self.value_d = _param(rngs, (c.hidden_size,), ("embed",), c)
            self.value_bias = _param(rngs, (), (), c, init="zeros")
        elif not c.tie_embeddings:
            self.lm_head_dv = _param(rngs, (c.hidden_size, c.vocab_size), ("embed", "vocab"), c)

    def hidden(
        self,
        tokens_bt: jax.Array,
        positions_bt: jax.Array,
        mask_bts: jax.Array,
        cache: Cache | None = None,
        cache_index: jax.Array | int | None = None,
        kv_len: jax.Array | None = None,
        kv_block: int = 0,
    ) -> tuple[jax.Array, Cache | None]:
        """Final-normed hidden states [B, T, D] (compute dtype) and the new cache.

        ``kv_len`` and ``kv_block`` (> 0) select blocked attention over the first
        ``kv_len`` cache slots (``_blocked_decode_attention``); else the einsum reference
        reads all S slots."""
        c = self.config
        dt = _DTYPES[c.dtype]
        x_btd = jnp.take(self.embed_vd[...], tokens_bt, axis=0).astype(dt)
        new_cache = [] if cache is not None else None
        policy = None
        if c.remat not in ("none", "full"):
            policy = getattr(jax.checkpoint_policies, c.remat)
        if c.scan_layers and cache is None:
            return self.final_norm(self._scan_blocks(x_btd, positions_bt, mask_bts, policy)), None
        if c.remat != "none" and cache is None:
            run_block = nnx.remat(lambda block, x, pos, m: block(x, pos, m)[0], policy=policy)
        else:
            run_block = None
        blocks = self._unstacked_blocks() if c.scan_layers else self.layers
        for i, layer in enumerate(blocks):
            if run_block is not None:
                x_btd = run_block(layer, x_btd, positions_bt, mask_bts)
                continue
            layer_cache = cache[i] if cache is not None else None
            x_btd, layer_cache = layer(
                x_btd, positions_bt, mask_bts, layer_cache, cache_index, kv_len, kv_block
            )
            if new_cache is not None:
                new_cache.append(layer_cache)
        return self.final_norm(x_btd), new_cache

    def _scan_blocks(self, x_btd, positions_bt, mask_bts, policy) -> jax.Array:
        """The blocks as one ``lax.scan`` over their stored stacked ([L, ...]) params."""
        graphdef, stacked = nnx.split(self.layers)

        def body(x_btd, state):
            return nnx.merge(graphdef, state)(x_btd, positions_bt, mask_bts)[0], None

        if self.config.remat != "none":
            body = jax.checkpoint(body, policy=policy, prevent_cse=False)
        x_btd, _ = jax.lax.scan(body, x_btd, stacked)
        return x_btd

    def _unstacked_blocks(self) -> list[Block]:
        """The stacked blocks as L modules on static slices of the stack (KV-cache path:
        each block then updates its own layer's cache in place, where a scan would
        carry the whole cache through its body on every decode step)."""
        graphdef, stacked = nnx.split(self.layers)
        return [
            nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], stacked))
            for i in range(self.config.num_layers)
        ]

    def head_dv(self) -> jax.Array:
        """The LM head matrix [D, V] in storage dtype (the embedding's transpose if tied)."""
        return self.embed_vd[...].T if self.config.tie_embeddings else self.lm_head_dv[...]

    def __call__(
        self,
        tokens_bt: jax.Array,
        positions_bt: jax.Array,
        mask_bts: jax.Array,
        cache: Cache | None = None,
        cache_index: jax.Array | int | None = None,
        *,
        last_only: bool = False,
        kv_len: jax.Array | None = None,
        kv_block: int = 0,
    ) -> tuple[jax.Array, Cache | None]:
        """Logits [B, T, V] float32 (values [B, T]) and the new cache; ``last_only``
        applies the head at the last position only ([B, 1, V] / [B, 1]); ``kv_len`` and
        ``kv_block`` as in ``hidden``."""
        c = self.config
        x_btd, new_cache = self.hidden(
            tokens_bt, positions_bt, mask_bts, cache, cache_index, kv_len, kv_block
        )
        if last_only:
            x_btd = x_btd[:, -1:]
        if c.head == "value":
            values_bt = dense(
                x_btd.astype(jnp.float32), self.value_d[...].astype(jnp.float32)[:, None]
            )[..., 0]
            return values_bt + self.value_bias[...].astype(jnp.float32), new_cache
        logits_btv = dense(x_btd, self.head_dv().astype(x_btd.dtype)).astype(jnp.float32)
        return logits_btv, new_cache


# ------------------------------------------------------------------ functional interface


@functools.lru_cache(maxsize=64)
def _graphdef(config: ModelConfig):
    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    graphdef, abstract_state = nnx.split(abstract)
    return graphdef, abstract_state


def init_params(config: ModelConfig, rng: jax.Array | int) -> Params:
    """Initializes parameters (normal(0.02) weights, unit norms, zero biases).

    Args:
      config: the model shape.
      rng: a PRNG key or an int seed.

    Returns:
      The pure nested-dict parameter tree.
    """
    model = Transformer(config, rngs=nnx.Rngs(params=rng))
    return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def abstract_params(config: ModelConfig) -> Params:
    """The parameter tree as ``jax.ShapeDtypeStruct`` leaves (no memory allocated)."""
    return nnx.to_pure_dict(_graphdef(config)[1])


def logical_axes(config: ModelConfig) -> Params:
    """Logical axis names of every parameter, as a tree shaped like ``params``."""
    state = _graphdef(config)[1]
    axes = jax.tree.map(
        lambda v: tuple(v.get_metadata().get("logical_axes", ())),
        state,
        is_leaf=lambda x: isinstance(x, nnx.Variable),
    )
    return nnx.to_pure_dict(axes)


def is_stacked(params: Params) -> bool:
    """Whether ``params["layers"]`` is in the stacked (``scan_layers``) layout: one
    block's tree of [L, ...] arrays, not a dict of per-layer trees keyed 0..L-1."""
    return not all(isinstance(key, int) for key in params["layers"])


def stack_layers(params: Params) -> Params:
    """The tree with its per-layer blocks stacked on a leading [L] axis (a copy)."""
    if is_stacked(params):
        return params
    layers = params["layers"]
    blocks = [layers[i] for i in range(len(layers))]
    stacked = jax.tree.map(lambda *xs: _stack_like(xs), *blocks)
    return {**params, "layers": stacked}


def _stack_like(xs):
    """Stacks host (numpy) arrays on the host and device arrays on the device."""
    return np.stack(xs) if all(isinstance(x, np.ndarray) for x in xs) else jnp.stack(xs)


def unstack_layers(params: Params) -> Params:
    """The tree with its stacked blocks split back into per-layer trees keyed 0..L-1."""
    if not is_stacked(params):
        return params
    stacked = params["layers"]
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    layers = {i: jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(num_layers)}
    return {**params, "layers": layers}


def to_layout(config: ModelConfig, params: Params) -> Params:
    """``params`` in the layer layout ``config`` stores (stacked iff ``scan_layers``)."""
    return stack_layers(params) if config.scan_layers else unstack_layers(params)


def bind(config: ModelConfig, params: Params) -> Transformer:
    """Rebuilds the NNX module around ``params`` (no copy; use inside jit)."""
    return nnx.merge(_graphdef(config)[0], params)


def causal_mask(input_mask_bt: jax.Array) -> jax.Array:
    """[B, T, T] mask: query t sees key s iff s <= t and key s is a real token."""
    t = input_mask_bt.shape[1]
    causal_tt = jnp.tril(jnp.ones((t, t), dtype=bool))
    return causal_tt[None] & input_mask_bt[:, None, :].astype(bool)


def cache_mask(kv_mask_bs: jax.Array, cache_index: jax.Array | int, t: int) -> jax.Array:
    """[B, T, S] mask for T queries written at slots [cache_index, cache_index + T).

    Query t (at slot cache_index + t) sees slot s iff s <= cache_index + t and slot s
    holds a real token (``kv_mask_bs``). ``cache_index`` is one slot for all rows, or
    [B] slots, one per row.
    """
    s = kv_mask_bs.shape[1]
    index_b1 = jnp.reshape(jnp.asarray(cache_index, jnp.int32), (-1, 1))  # [1 or B, 1]
    query_slot_bt = index_b1 + jnp.arange(t, dtype=jnp.int32)[None, :]
    causal_bts = jnp.arange(s, dtype=jnp.int32)[None, None, :] <= query_slot_bt[:, :, None]
    return causal_bts & kv_mask_bs[:, None, :].astype(bool)


def positions_from_mask(input_mask_bt: jax.Array) -> jax.Array:
    """Positions that skip padding: cumsum(mask) - 1, clipped at 0 (as in HF generate)."""
    return jnp.maximum(jnp.cumsum(input_mask_bt.astype(jnp.int32), axis=-1) - 1, 0)


def forward(
    config: ModelConfig,
    params: Params,
    tokens_bt: jax.Array,
    *,
    input_mask_bt: jax.Array | None = None,
    positions_bt: jax.Array | None = None,
) -> jax.Array:
    """Full (teacher-forced) forward pass without a cache.

    Args:
      config: the model shape.
      params: the parameter tree.
      tokens_bt: [B, T] int token ids.
      input_mask_bt: [B, T] bool, True for real tokens (default: all real). Padding may
        sit anywhere; padded positions produce unused outputs.
      positions_bt: [B, T] RoPE positions (default: ``positions_from_mask``).

    Returns:
      logits [B, T, V] float32 (or values [B, T] for ``head="value"``).
    """
    if input_mask_bt is None:
        input_mask_bt = jnp.ones(tokens_bt.shape, bool)
    if positions_bt is None:
        positions_bt = positions_from_mask(input_mask_bt)
    out, _ = bind(config, params)(tokens_bt, positions_bt, causal_mask(input_mask_bt))
    return out


def forward_hidden(
    config: ModelConfig,
    params: Params,
    tokens_bt: jax.Array,
    *,
    input_mask_bt: jax.Array | None = None,
    positions_bt: jax.Array | None = None,
) -> jax.Array:
    """``forward`` without the head: final-normed hidden states [B, T, D] in the compute
    dtype. ``hidden_btd @ lm_head(config, params)`` (in the compute dtype, then float32)
    are ``forward``'s logits; ``rl_batch.models.logprobs`` takes it from there in chunks."""
    if input_mask_bt is None:
        input_mask_bt = jnp.ones(tokens_bt.shape, bool)
    if positions_bt is None:
        positions_bt = positions_from_mask(input_mask_bt)
    hidden_btd, _ = bind(config, params).hidden(tokens_bt, positions_bt, causal_mask(input_mask_bt))
    return hidden_btd


def lm_head(config: ModelConfig, params: Params) -> jax.Array:
    """The LM head matrix [D, V] in storage dtype (the embedding transposed if tied)."""
    if config.head != "lm":
        raise ValueError(f"lm_head needs ModelConfig.head='lm', got {config.head!r}")
    return params["embed_vd"].T if config.tie_embeddings else params["lm_head_dv"]


def forward_with_cache(
    config: ModelConfig,
    params: Params,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    kv_mask_bs: jax.Array,
    cache: Cache,
    cache_index: jax.Array | int,
    *,
    last_only: bool = False,
    kv_len: jax.Array | None = None,
    kv_block: int = 0,
) -> tuple[jax.Array, Cache]:
    """Forward pass that appends T tokens to a KV cache at ``cache_index``.

    Args:
      config: the model shape.
      params: the parameter tree.
      tokens_bt: [B, T] new tokens (T = prompt length at prefill, 1 when decoding).
      positions_bt: [B, T] their RoPE positions.
      kv_mask_bs: [B, S] True where a cache slot holds a real token (including the
        slots being written now).
      cache: per-layer caches from ``init_cache``.
      cache_index: first slot to write; or [B] slots, one per row (T = 1 only).
      last_only: compute the head at the last of the T positions only (a prefill needs
        no other logits: [B, 1, V] instead of [B, T, V]).
      kv_len: with ``kv_block`` > 0, attention reads only cache slots [0, kv_len) in
        blocks of ``kv_block`` (every unmasked slot must lie below it); None or
        ``kv_block`` = 0: the einsum reference over all S slots.
      kv_block: slots per attention block (static).

    Returns:
      (logits [B, T, V] float32 or values [B, T], updated cache).
    """
    if jnp.ndim(cache_index) == 1 and tokens_bt.shape[1] != 1:
        raise ValueError(f"per-row cache_index needs T = 1 token per row, got {tokens_bt.shape}")
    mask_bts = cache_mask(kv_mask_bs, cache_index, tokens_bt.shape[1])
    return bind(config, params)(
        tokens_bt,
        positions_bt,
        mask_bts,
        cache,
        cache_index,
        last_only=last_only,
        kv_len=kv_len,
        kv_block=kv_block,
    )


def init_cache(config: ModelConfig, batch: int, length: int, dtype: str | None = None) -> Cache:
    """Allocates a zero KV cache: per layer {"k", "v"} of shape [B, K, S, H]."""
    dt = _DTYPES[dtype or config.dtype]
    shape = (batch, config.num_kv_heads, length, config.head_dim)
    return [
        {"k": jnp.zeros(shape, dt), "v": jnp.zeros(shape, dt)} for _ in range(config.num_layers)
    ]


def kv_cache_bytes(config: ModelConfig, batch: int, length: int, dtype: str | None = None) -> int:
    """Bytes of a KV cache for ``batch`` sequences of ``length`` slots."""
    itemsize = jnp.dtype(_DTYPES[dtype or config.dtype]).itemsize
    return 2 * config.num_layers * batch * length * config.num_kv_heads * config.head_dim * itemsize


def token_logprobs(logits_btv: jax.Array, targets_bt: jax.Array) -> jax.Array:
    """log p(target) per position, [B, T], computed in float32."""
    logp_btv = jax.nn.log_softmax(logits_btv.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(logp_btv, targets_bt[..., None], axis=-1)[..., 0]


# ------------------------------------------------------------------ router outputs (MoE)


def _sparse_layers(config: Any) -> list[int]:
    return [i for i in range(config.num_layers) if config.is_moe_layer(i)]


def _call_capturing(config, params, replay_experts_btlk, *args, method="__call__", **kwargs):
    """Calls the bound model's ``method`` (``__call__`` or ``hidden``) on ``args`` under
    ``nnx.capture``: (outputs, logits_lte)."""
    if config.num_experts == 0:
        raise ValueError("router outputs need a MoE config (num_experts > 0)")
    module = bind(config, params)
    sparse = _sparse_layers(config)
    if replay_experts_btlk is not None:
        b, t, n_layers, k = replay_experts_btlk.shape
        if n_layers != len(sparse):
            raise ValueError(
                f"replayed experts have {n_layers} layers; the model has {len(sparse)} sparse"
            )
        for j, i in enumerate(sparse):
            experts_tk = replay_experts_btlk[:, :, j].reshape(b * t, k)
            module.layers[i].mlp.replay = moe_lib.RoutingReplay(experts_tk)
    fn = module if method == "__call__" else getattr(module, method)
    out, captured = nnx.capture(fn, nnx.Intermediate)(*args, **kwargs)
    layers = nnx.to_pure_dict(captured)["layers"]
    logits_lte = jnp.stack([layers[i]["mlp"]["router_logits"][0] for i in sparse])
    return out, logits_lte


def forward_with_router(
    config: Any,
    params: Any,
    tokens_bt: jax.Array,
    *,
    input_mask_bt: jax.Array | None = None,
    positions_bt: jax.Array | None = None,
    replay_experts_btlk: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``model.forward`` that also returns every sparse layer's router logits.

    Args:
      config: a ``ModelConfig`` with ``num_experts > 0``.
      params, tokens_bt, input_mask_bt, positions_bt: as for ``model.forward``.
      replay_experts_btlk: optional [B, T, L, k] expert ids per token and sparse layer
        to route by instead of the router's top-k (routing replay; negative ids: no
        record, the router decides).

    Returns:
      (model output as ``model.forward``, router logits [L, B * T, E] float32 of the L
      sparse layers in layer order; token b * T + t is row (b, t)).
    """
    if input_mask_bt is None:
        input_mask_bt = jnp.ones(tokens_bt.shape, bool)
    if positions_bt is None:
        positions_bt = positions_from_mask(input_mask_bt)
    (out, _), logits_lte = _call_capturing(
        config,
        params,
        replay_experts_btlk,
        tokens_bt,
        positions_bt,
        causal_mask(input_mask_bt),
    )
    return out, logits_lte


def forward_hidden_with_router(
    config: Any,
    params: Any,
    tokens_bt: jax.Array,
    *,
    input_mask_bt: jax.Array | None = None,
    positions_bt: jax.Array | None = None,
    replay_experts_btlk: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """``model.forward_hidden`` that also returns the router logits.

    Arguments as ``forward_with_router``.

    Returns:
      (final-normed hidden states [B, T, D] in the compute dtype, router logits
      [L, B * T, E] float32), for ``rl_batch.models.logprobs``' chunked head.
    """
    if input_mask_bt is None:
        input_mask_bt = jnp.ones(tokens_bt.shape, bool)
    if positions_bt is None:
        positions_bt = positions_from_mask(input_mask_bt)
    (hidden_btd, _), logits_lte = _call_capturing(
        config,
        params,
        replay_experts_btlk,
        tokens_bt,
        positions_bt,
        causal_mask(input_mask_bt),
        method="hidden",
    )
    return hidden_btd, logits_lte


def forward_with_cache_and_router(
    config: Any,
    params: Any,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    kv_mask_bs: jax.Array,
    cache: Any,
    cache_index: jax.Array | int,
    *,
    last_only: bool = False,
    kv_len: jax.Array | None = None,
    kv_block: int = 0,
) -> tuple[jax.Array, Any, jax.Array]:
    """``model.forward_with_cache`` (``last_only``, ``kv_len``, ``kv_block`` as there)
    that also returns the router logits [L, B * T, E] of all T fed tokens."""
    mask_bts = cache_mask(kv_mask_bs, cache_index, tokens_bt.shape[1])
    (out, cache), logits_lte = _call_capturing(
        config,
        params,
        None,
        tokens_bt,
        positions_bt,
        mask_bts,
        cache,
        cache_index,
        last_only=last_only,
        kv_len=kv_len,
        kv_block=kv_block,
    )
    return out, cache, logits_lte
