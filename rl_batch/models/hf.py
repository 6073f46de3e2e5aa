"""Hugging Face interop: load and save Qwen3 / Qwen3-MoE / Qwen2 / Llama checkpoints
without torch.

A Hugging Face model directory holds ``config.json`` and the weights as
``model.safetensors`` or as shards listed in ``model.safetensors.index.json``. This
module maps them to and from `rl_batch.models.transformer`'s parameter tree:

    HF tensor                                   shape      ours                          shape
    model.embed_tokens.weight                   [V, D]     embed_vd                      [V, D]
    model.layers.{i}.input_layernorm.weight     [D]        layers[i].input_norm.scale    [D]
    model.layers.{i}.self_attn.q_proj.weight    [N*H, D]   layers[i].attn.q_dnh          [D, N, H]
    model.layers.{i}.self_attn.k_proj.weight    [K*H, D]   layers[i].attn.k_dkh          [D, K, H]
    model.layers.{i}.self_attn.v_proj.weight    [K*H, D]   layers[i].attn.v_dkh          [D, K, H]
    model.layers.{i}.self_attn.o_proj.weight    [D, N*H]   layers[i].attn.o_nhd          [N, H, D]
    model.layers.{i}.self_attn.{q,k,v}_proj.bias           layers[i].attn.{q,k,v}_bias_* [N|K, H]
    model.layers.{i}.self_attn.{q,k}_norm.weight [H]       layers[i].attn.{q,k}_norm.scale
    model.layers.{i}.post_attention_layernorm.weight       layers[i].post_attn_norm.scale
    model.layers.{i}.mlp.gate_proj.weight       [F, D]     layers[i].mlp.gate_df         [D, F]
    model.layers.{i}.mlp.up_proj.weight         [F, D]     layers[i].mlp.up_df           [D, F]
    model.layers.{i}.mlp.down_proj.weight       [D, F]     layers[i].mlp.down_fd         [F, D]
  qwen3_moe sparse layers (``ModelConfig.is_moe_layer``) instead of the three above:
    model.layers.{i}.mlp.gate.weight            [E, D]     layers[i].mlp.router_de       [D, E]
    ...mlp.experts.{j}.gate_proj.weight         [F, D]     layers[i].mlp.gate_edf[j]     [D, F]
    ...mlp.experts.{j}.up_proj.weight           [F, D]     layers[i].mlp.up_edf[j]       [D, F]
    ...mlp.experts.{j}.down_proj.weight         [D, F]     layers[i].mlp.down_efd[j]     [F, D]
    model.norm.weight                           [D]        final_norm.scale              [D]
    lm_head.weight (untied only)                [V, D]     lm_head_dv                    [D, V]

Loading is strict: a missing tensor, a shape mismatch or a tensor the model would not
use is an error that names it (silently dropping weights hides mapping bugs). The only
tensors skipped are rotary ``inv_freq`` buffers (recomputed, not learned) and an
``lm_head.weight`` equal to the embedding when the config ties them.

Tensors are read with ``safetensors.safe_open(..., framework="flax")``, which (unlike its
numpy backend) knows bfloat16: each comes as a host (CPU) jax array, then a numpy array
(``ml_dtypes.bfloat16`` for bf16) that the layout conversions work on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rl_batch import artifacts
from rl_batch.models import transformer as model_lib

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen2", "llama")
_ARCHITECTURES = {
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
}
# transformers' defaults for fields a config.json may leave out.
_MAX_POSITIONS_DEFAULT = {"qwen3": 32_768, "qwen3_moe": 32_768, "qwen2": 32_768, "llama": 2048}
_CONFIG_FILE = "config.json"
_SINGLE_FILE = "model.safetensors"
_INDEX_FILE = "model.safetensors.index.json"
_DTYPE_NAMES = ("float32", "bfloat16", "float16")


# ----------------------------------------------------------------------------- config


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """Reads ``config.json`` from a Hugging Face model directory.

    Raises:
      FileNotFoundError: when ``path`` has no ``config.json``.
      ValueError: when the file is not valid JSON.
    """
    file = os.path.join(os.fspath(path), _CONFIG_FILE)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no {_CONFIG_FILE} in Hugging Face model directory {path}")
    with open(file) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}: invalid JSON ({e})") from e


def _rope_theta(hf: Mapping[str, Any]) -> float:
    """rope_theta from either the flat (transformers 4) or ``rope_parameters`` (5) layout."""
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for source in (rope, scaling):
        kind = source.get("rope_type", source.get("type", "default"))
        if kind != "default":
            raise ValueError(
                f"RoPE scaling {kind!r} is not supported (only plain RoPE): {dict(source)}"
            )
    return float(rope.get("rope_theta", hf.get("rope_theta", 10_000.0)))


def config_from_hf(hf: Mapping[str, Any], *, dtype: str | None = None) -> model_lib.ModelConfig:
    """Maps a Hugging Face ``config.json`` dict to a `ModelConfig`.

    Missing optional fields take transformers' defaults for the model type (notably
    ``head_dim`` is 128 for qwen3 and ``hidden_size // num_attention_heads`` otherwise).
    qwen3_moe also maps ``num_experts`` (or ``num_local_experts``), ``num_experts_per_tok``,
    ``moe_intermediate_size``, ``norm_topk_prob``, ``decoder_sparse_step`` and
    ``mlp_only_layers``; ``router_aux_loss_coef`` is a training setting, not a shape (see
    ``GRPOConfig.router_aux_loss_coef``), and is not read.

    Args:
      hf: the parsed ``config.json`` (model_type qwen3, qwen3_moe, qwen2 or llama).
      dtype: parameter and compute dtype ("float32", "bfloat16", "float16"); None uses
        the checkpoint's ``dtype`` / ``torch_dtype`` (float32 when absent).

    Returns:
      The model config (``param_dtype == dtype``, ``head="lm"``).

    Raises:
      ValueError: for an unsupported model type or feature (RoPE scaling, sliding
        window, o_proj/MLP bias, an activation other than SiLU), a missing required
        field, or an unknown dtype.
    """
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"unsupported model_type {model_type!r} in config.json; "
            f"supported: {SUPPORTED_MODEL_TYPES}"
        )
    required = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
    )
    missing = [k for k in required if k not in hf]
    if missing:
        raise ValueError(f"{model_type} config.json lacks required fields {missing}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act={act!r} is not supported (only 'silu')")
    if hf.get("attention_bias", False):
        # qwen3 / llama attention_bias also puts a bias on o_proj, which the model lacks.
        raise ValueError(f"{model_type} attention_bias=True (o_proj bias) is not supported")
    if hf.get("mlp_bias", False):
        raise ValueError(f"{model_type} mlp_bias=True is not supported")
    if hf.get("use_sliding_window", False) or "sliding_attention" in (hf.get("layer_types") or ()):
        raise ValueError(f"{model_type} sliding-window attention is not supported")

    if dtype is None:
        dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"dtype {dtype!r} is not supported; expected one of {_DTYPE_NAMES}")
    heads = hf["num_attention_heads"]
    default_head_dim = 128 if model_type == "qwen3" else hf["hidden_size"] // heads
    moe: dict[str, Any] = {}
    if model_type == "qwen3_moe":
        # transformers' Qwen3MoeConfig defaults (num_experts is stored as num_local_experts
        # by transformers 5, as num_experts by 4).
        num_experts = hf.get("num_experts", hf.get("num_local_experts", 128))
        moe = dict(
            num_experts=num_experts,
            num_experts_per_tok=hf.get("num_experts_per_tok", 8),
            moe_intermediate_size=hf.get("moe_intermediate_size", 768),
            norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
            decoder_sparse_step=hf.get("decoder_sparse_step", 1),
            mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
        )
    return model_lib.ModelConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or default_head_dim,
        intermediate_size=hf["intermediate_size"],
        rope_theta=_rope_theta(hf),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        qkv_bias=model_type == "qwen2",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=hf.get("max_position_embeddings", _MAX_POSITIONS_DEFAULT[model_type]),
        param_dtype=dtype,
        dtype=dtype,
        **moe,
    )


def config_to_hf(config: model_lib.ModelConfig, model_type: str | None = None) -> dict[str, Any]:
    """Maps a `ModelConfig` to a Hugging Face ``config.json`` dict.

    Both the transformers 4 (``rope_theta``, ``torch_dtype``) and 5 (``rope_parameters``,
    ``dtype``) spellings are written so either version reads the file.

    Args:
      config: an LM-head config.
      model_type: "qwen3" (needs qk_norm, no qkv bias), "qwen3_moe" (as qwen3, and
        ``num_experts > 0``), "qwen2" (needs qkv bias, no qk_norm) or "llama" (neither);
        only qwen3_moe takes a MoE config. None: qwen3_moe for a MoE config, else qwen3.

    Returns:
      The config dict.

    Raises:
      ValueError: when the config cannot be expressed as ``model_type``.
    """
    if model_type is None:
        model_type = "qwen3_moe" if config.num_experts else "qwen3"
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type={model_type!r}; expected one of {SUPPORTED_MODEL_TYPES}")
    if config.head != "lm":
        raise ValueError(f"only head='lm' configs export to Hugging Face, got head={config.head!r}")
    want_qk_norm, want_bias = model_type in ("qwen3", "qwen3_moe"), model_type == "qwen2"
    if config.qk_norm != want_qk_norm or config.qkv_bias != want_bias:
        raise ValueError(
            f"model_type={model_type!r} needs qk_norm={want_qk_norm}, qkv_bias={want_bias}; "
            f"the config has qk_norm={config.qk_norm}, qkv_bias={config.qkv_bias}"
        )
    if (model_type == "qwen3_moe") != (config.num_experts > 0):
        raise ValueError(
            f"model_type={model_type!r} does not match num_experts={config.num_experts} "
            "(MoE configs export as qwen3_moe, dense ones as qwen3 / qwen2 / llama)"
        )
    hf: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_theta": config.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": config.tie_embeddings,
        "dtype": config.param_dtype,
        "torch_dtype": config.param_dtype,
    }
    if model_type == "qwen3_moe":
        hf.update(
            num_experts=config.num_experts,
            num_experts_per_tok=config.num_experts_per_tok,
            moe_intermediate_size=config.moe_intermediate_size,
            norm_topk_prob=config.norm_topk_prob,
            decoder_sparse_step=config.decoder_sparse_step,
            mlp_only_layers=list(config.mlp_only_layers),
        )
    if model_type in ("qwen3", "qwen3_moe", "llama"):
        hf["attention_bias"] = False
    if model_type == "llama":
        hf["mlp_bias"] = False
    else:
        hf["use_sliding_window"] = False
    return hf


# ----------------------------------------------------------------------------- tensor map


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One checkpoint tensor: its HF name and shape, where it lives in ``params``, and the
    layout conversions in both directions. ``index`` is set for a per-expert tensor, and
    for every layer tensor of a ``scan_layers`` model: it is slice ``index`` of the
    leading (expert, or layer) dimension of the parameter at ``path``."""

    hf_name: str
    path: tuple[Any, ...]
    hf_shape: tuple[int, ...]
    to_ours: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    index: int | None = None


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _transpose(x: np.ndarray) -> np.ndarray:
    return x.T


def _tensor_map(config: model_lib.ModelConfig) -> list[_Tensor]:
    """Every tensor of an HF checkpoint for ``config``, in a fixed order."""
    c = config
    d, n, k, h, f, v = (
        c.hidden_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.intermediate_size,
        c.vocab_size,
    )

    def proj_in(heads):  # HF [heads*H, D] <-> ours [D, heads, H]
        return (
            lambda w: w.T.reshape(d, heads, h),
            lambda w: w.reshape(d, heads * h).T,
        )

    def bias(heads):  # HF [heads*H] <-> ours [heads, H]
        return (lambda b: b.reshape(heads, h), lambda b: b.reshape(heads * h))

    o_proj = (lambda w: w.T.reshape(n, h, d), lambda w: w.reshape(n * h, d).T)
    same, swap = (_identity, _identity), (_transpose, _transpose)

    out = [_Tensor("model.embed_tokens.weight", ("embed_vd",), (v, d), *same)]
    for i in range(c.num_layers):
        pre, at = f"model.layers.{i}.", ("layers", i, "attn")
        entries = [
            ("input_layernorm.weight", ("layers", i, "input_norm", "scale"), (d,), same),
            ("self_attn.q_proj.weight", (*at, "q_dnh"), (n * h, d), proj_in(n)),
            ("self_attn.k_proj.weight", (*at, "k_dkh"), (k * h, d), proj_in(k)),
            ("self_attn.v_proj.weight", (*at, "v_dkh"), (k * h, d), proj_in(k)),
            ("self_attn.o_proj.weight", (*at, "o_nhd"), (d, n * h), o_proj),
        ]
        if c.qkv_bias:
            entries += [
                ("self_attn.q_proj.bias", (*at, "q_bias_nh"), (n * h,), bias(n)),
                ("self_attn.k_proj.bias", (*at, "k_bias_kh"), (k * h,), bias(k)),
                ("self_attn.v_proj.bias", (*at, "v_bias_kh"), (k * h,), bias(k)),
            ]
        if c.qk_norm:
            entries += [
                ("self_attn.q_norm.weight", (*at, "q_norm", "scale"), (h,), same),
                ("self_attn.k_norm.weight", (*at, "k_norm", "scale"), (h,), same),
            ]
        mlp = ("layers", i, "mlp")
        entries += [
            (
                "post_attention_layernorm.weight",
                ("layers", i, "post_attn_norm", "scale"),
                (d,),
                same,
            ),
        ]
        if c.is_moe_layer(i):
            e, fe = c.num_experts, c.moe_intermediate_size
            entries.append(("mlp.gate.weight", (*mlp, "router_de"), (e, d), swap))
        else:
            entries += [
                ("mlp.gate_proj.weight", (*mlp, "gate_df"), (f, d), swap),
                ("mlp.up_proj.weight", (*mlp, "up_df"), (f, d), swap),
                ("mlp.down_proj.weight", (*mlp, "down_fd"), (d, f), swap),
            ]
        out += [_Tensor(pre + name, path, shape, *conv) for name, path, shape, conv in entries]
        if c.is_moe_layer(i):
            for j in range(e):
                ex = f"{pre}mlp.experts.{j}."
                out += [
                    _Tensor(ex + "gate_proj.weight", (*mlp, "gate_edf"), (fe, d), *swap, j),
                    _Tensor(ex + "up_proj.weight", (*mlp, "up_edf"), (fe, d), *swap, j),
                    _Tensor(ex + "down_proj.weight", (*mlp, "down_efd"), (d, fe), *swap, j),
                ]
    if c.scan_layers:  # layer i's tensors are slice i of the stacked [L, ...] params
        out = [_layer_slice(t) for t in out]
    out.append(_Tensor("model.norm.weight", ("final_norm", "scale"), (d,), *same))
    if not c.tie_embeddings:
        out.append(_Tensor("lm_head.weight", ("lm_head_dv",), (v, d), *swap))
    return out


def _layer_slice(t: _Tensor) -> _Tensor:
    """A per-layer tensor (path ``("layers", i, ...)``) as slice i of the stacked
    parameter at ``("layers", ...)`` (MoE models, whose experts use ``index``, never
    stack their layers)."""
    if t.path[0] != "layers":
        return t
    return dataclasses.replace(t, path=("layers", *t.path[2:]), index=t.path[1])


def _path_str(path: tuple[Any, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _get(tree: Mapping, path: tuple[Any, ...]):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[Any, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


# ----------------------------------------------------------------------------- safetensors IO


def _open_safetensors(file: str, stack: contextlib.ExitStack):
    """``safe_open(file, framework="flax")``, its errors one line naming the file.

    Raises:
      ValueError: the file is truncated (a partial download) or not safetensors at all.
    """
    from safetensors import SafetensorError, safe_open

    try:
        return stack.enter_context(safe_open(file, framework="flax"))
    except SafetensorError as e:
        if "not fully covered" in str(e) or "incomplete" in str(e):
            raise ValueError(
                f"{file}: truncated safetensors file ({os.path.getsize(file)} bytes; {e})"
            ) from None
        raise ValueError(f"{file}: not a readable safetensors file ({e})") from None


class _SafetensorsReader:
    """Name -> numpy array over a single-file or sharded safetensors checkpoint."""

    def __init__(self, directory: str, stack: contextlib.ExitStack):
        single = os.path.join(directory, _SINGLE_FILE)
        index = os.path.join(directory, _INDEX_FILE)
        if os.path.isfile(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index} has no 'weight_map' object")
            files = sorted(set(weight_map.values()))
        elif os.path.isfile(single):
            weight_map, files = None, [_SINGLE_FILE]
        else:
            others = [
                name
                for name in ("pytorch_model.bin", "pytorch_model.bin.index.json")
                if os.path.exists(os.path.join(directory, name))
            ]
            hint = f" (found {others}: convert to safetensors first)" if others else ""
            raise FileNotFoundError(f"no {_SINGLE_FILE} or {_INDEX_FILE} in {directory}{hint}")
        self.location: dict[str, str] = {}  # tensor name -> file path
        self._handles = {}
        for name in files:
            file = os.path.join(directory, name)
            if not os.path.isfile(file):
                raise FileNotFoundError(f"shard {name} listed in {index} is missing")
            self._handles[file] = _open_safetensors(file, stack)
            for tensor in self._handles[file].keys():
                if tensor in self.location:
                    raise ValueError(
                        f"tensor {tensor} is in both {self.location[tensor]} and {file}"
                    )
                self.location[tensor] = file
        if weight_map is not None:
            for tensor, name in weight_map.items():
                if self.location.get(tensor) != os.path.join(directory, name):
                    raise ValueError(f"{index} maps {tensor} to {name}, which does not hold it")

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self.location[name]].get_slice(name).get_shape())

    def get(self, name: str) -> np.ndarray:
        # On the host: the checkpoint is converted there before any device sees it. This
        # process's own CPU device: under several processes jax.devices("cpu")[0] is
        # process 0's, which no other process can read from.
        with jax.default_device(jax.local_devices(backend="cpu")[0]):
            return np.asarray(self._handles[self.location[name]].get_tensor(name))


def _is_ignorable(name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq")


# ----------------------------------------------------------------------------- load / save


def load_hf_checkpoint(
    path: str | os.PathLike,
    *,
    dtype: str | None = None,
    as_numpy: bool = False,
    scan_layers: bool = False,
) -> tuple[model_lib.ModelConfig, model_lib.Params]:
    """Loads a local Hugging Face Qwen3 / Qwen3-MoE / Qwen2 / Llama model directory.

    Args:
      path: directory with ``config.json`` and ``model.safetensors`` (or
        ``model.safetensors.index.json`` plus its shards).
      dtype: parameter and compute dtype; None keeps the checkpoint's dtype.
      as_numpy: return host numpy arrays (to ``jax.device_put`` with shardings yourself)
        instead of arrays on the default device.
      scan_layers: return the stacked-layer layout (``ModelConfig.scan_layers``; each
        layer's tensors are written into their slice of the stack, no per-layer copy).

    Returns:
      ``(config, params)``; ``params`` has exactly the structure and shapes of
      ``rl_batch.models.transformer.abstract_params(config)``.

    Raises:
      FileNotFoundError: no ``config.json``, no weights file, or a missing shard.
      ValueError: unsupported model type or feature, a missing tensor, a tensor of the
        wrong shape, or tensors the model would not use (all named in the message).
    """
    directory = os.fspath(path)
    config = config_from_hf(read_hf_config(directory), dtype=dtype)
    if scan_layers:
        config = config.replace(scan_layers=True)
    np_dtype = np.dtype(jnp.dtype(config.param_dtype))
    params: dict[str, Any] = {}
    shapes = model_lib.abstract_params(config)
    stacked: dict[tuple[Any, ...], np.ndarray] = {}  # per-expert tensors, filled slice-wise
    with contextlib.ExitStack() as stack:
        reader = _SafetensorsReader(directory, stack)
        expected = _tensor_map(config)
        missing = [t.hf_name for t in expected if t.hf_name not in reader.location]
        if missing:
            raise ValueError(
                f"checkpoint {directory} lacks {len(missing)} tensor(s) the {_describe(config)} "
                f"config needs, e.g. {missing[:5]}; it holds e.g. {sorted(reader.location)[:5]}"
            )
        for t in expected:
            got = reader.shape(t.hf_name)
            if got != t.hf_shape:
                raise ValueError(
                    f"tensor {t.hf_name} in {reader.location[t.hf_name]} has shape {list(got)}, "
                    f"expected {list(t.hf_shape)} from config.json"
                )
            value = np.ascontiguousarray(t.to_ours(reader.get(t.hf_name)).astype(np_dtype))
            if t.index is not None:
                if t.path not in stacked:
                    stacked[t.path] = np.empty(_get(shapes, t.path).shape, np_dtype)
                stacked[t.path][t.index] = value
                continue
            _set(params, t.path, value if as_numpy else jnp.asarray(value))
        for path, value in stacked.items():
            _set(params, path, value if as_numpy else jnp.asarray(value))
        used = {t.hf_name for t in expected}
        leftover = sorted(n for n in reader.location if n not in used and not _is_ignorable(n))
        if config.tie_embeddings and "lm_head.weight" in leftover:
            lm_head = reader.get("lm_head.weight")
            embed = reader.get("model.embed_tokens.weight")
            if lm_head.shape != embed.shape or not np.array_equal(lm_head, embed):
                raise ValueError(
                    f"config.json ties the embeddings but {directory} holds an lm_head.weight "
                    "that differs from model.embed_tokens.weight"
                )
            leftover.remove("lm_head.weight")
    if leftover:
        raise ValueError(
            f"checkpoint {directory} holds {len(leftover)} tensor(s) the model does not use, "
            f"e.g. {leftover[:5]}; config.json may not describe these weights"
        )
    _check_tree(config, params)
    logging.info(
        "loaded %s (%d parameters) from %s", _describe(config), config.num_params, directory
    )
    return config, params


def _describe(config: model_lib.ModelConfig) -> str:
    """A short description for messages, e.g. ``"28-layer d=1024 qk_norm"``."""
    extras = [n for n in ("qk_norm", "qkv_bias") if getattr(config, n)]
    if config.num_experts:
        extras.append(f"moe {config.num_experts}x top-{config.num_experts_per_tok}")
    return " ".join([f"{config.num_layers}-layer d={config.hidden_size}", *extras])


def _check_tree(config: model_lib.ModelConfig, params: model_lib.Params) -> None:
    """Raises ValueError unless ``params`` matches ``abstract_params(config)`` in structure
    and shapes."""
    want = model_lib.abstract_params(config)
    want_paths = dict(jax.tree_util.tree_flatten_with_path(want)[0])
    got_paths = dict(jax.tree_util.tree_flatten_with_path(params)[0])
    if set(want_paths) != set(got_paths):
        extra = sorted(jax.tree_util.keystr(p) for p in set(got_paths) - set(want_paths))
        lacking = sorted(jax.tree_util.keystr(p) for p in set(want_paths) - set(got_paths))
        raise ValueError(
            f"params do not match the config: missing {lacking[:5]}, extra {extra[:5]}"
        )
    for p, spec in want_paths.items():
        if tuple(got_paths[p].shape) != tuple(spec.shape):
            raise ValueError(
                f"params{jax.tree_util.keystr(p)} has shape {tuple(got_paths[p].shape)}, "
                f"expected {tuple(spec.shape)}"
            )


def save_hf_checkpoint(
    config: model_lib.ModelConfig,
    params: model_lib.Params,
    path: str | os.PathLike,
    *,
    model_type: str | None = None,
    extra_config: Mapping[str, Any] | None = None,
) -> None:
    """Writes ``config.json`` and a single ``model.safetensors`` that transformers loads.

    Tensors are stored in ``config.param_dtype``; a tied config writes no ``lm_head``.
    Arrays are gathered to host memory (fine on one host; on several hosts gather first).

    Args:
      config: an LM-head config expressible as ``model_type`` (see `config_to_hf`).
      params: a tree matching ``abstract_params(config)``.
      path: output directory (created if needed; its config.json and model.safetensors
        are overwritten).
      model_type: "qwen3", "qwen3_moe", "qwen2" or "llama"; None: qwen3_moe for a MoE
        config, else qwen3.
      extra_config: fields merged into config.json (e.g. ``eos_token_id``).

    Raises:
      ValueError: when the config cannot be expressed as ``model_type``, ``params`` do not
        match the config, or ``path`` already holds a sharded checkpoint.
    """
    from safetensors.numpy import save_file

    hf = config_to_hf(config, model_type)
    hf.update(extra_config or {})
    _check_tree(config, params)
    directory = os.fspath(path)
    if os.path.exists(os.path.join(directory, _INDEX_FILE)):
        raise ValueError(f"{directory} already holds a sharded checkpoint ({_INDEX_FILE})")
    np_dtype = np.dtype(jnp.dtype(config.param_dtype))
    host: dict[tuple[Any, ...], np.ndarray] = {}  # each parameter gathered once

    def value(t: _Tensor) -> np.ndarray:
        if t.path not in host:
            host[t.path] = np.asarray(_get(params, t.path)).astype(np_dtype)
        x = host[t.path] if t.index is None else host[t.path][t.index]
        return np.ascontiguousarray(t.to_hf(x))

    tensors = {t.hf_name: value(t) for t in _tensor_map(config)}
    os.makedirs(directory, exist_ok=True)
    save_file(tensors, os.path.join(directory, _SINGLE_FILE), metadata={"format": "pt"})
    artifacts.give_default_mode(os.path.join(directory, _SINGLE_FILE))  # (it writes 0600)
    with open(os.path.join(directory, _CONFIG_FILE), "w") as f:
        json.dump(hf, f, indent=2, sort_keys=True)
        f.write("\n")


# ----------------------------------------------------------------------------- tokenizer


def load_tokenizer(path: str | os.PathLike, chat_template=None):
    """The tokenizer of a local Hugging Face model directory (no network).

    Args:
      path: the directory holding ``tokenizer.json`` (or the file itself).
      chat_template: passed to `rl_batch.tokenizers.HFTokenizer` (None: the template in
        ``tokenizer_config.json``, else ChatML).

    Returns:
      An `rl_batch.tokenizers.HFTokenizer` (the project's `Tokenizer` interface).
    """
    from rl_batch.tokenizers import HFTokenizer

    return HFTokenizer(path, chat_template=chat_template)
