"""Model FLOPs per token, the device's matmul rate, and per-step throughput metrics.

FLOP counting (forward pass, one token):

    2 * (matmul weights)  +  4 * L * S * N * H

``matmul weights`` are every layer's q/k/v/o and MLP projections plus the LM head (the
embedding lookup is a gather: no FLOPs; norms are negligible). In a MoE layer they are
the *active* weights: the router [D, E] and the k experts a token is routed to (k SwiGLU
MLPs of width F_moe, counted as one of width k * F_moe); the E - k other experts do no
work for that token. Tokens/s, FLOP/s and the cost model then measure the computation
the hardware does, as for a dense model of ``num_active_params``. The second term is the
attention (QK^T and PV, 2 FLOPs per multiply-add each) of a query over ``S`` cached
slots. Both the sampler and the learner attend over the whole fixed-size sequence
(masked), so ``S`` is the padded sequence width: the work the hardware does.

An update (forward + backward) costs about 3x the forward FLOPs. "Achieved" FLOP/s are
these model FLOPs divided by wall time, compared with the rate of a large jitted matmul
measured once per process (``measure_matmul_flops``).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp

from rl_batch.models import transformer as model_lib

UPDATE_FLOPS_MULTIPLIER = 3  # forward + backward (about 2x the forward)
# Keys of ``step_throughput`` that depend on the machine's speed, not on the computation.
RATE_KEYS = (
    "gen_tokens_per_s",
    "responses_per_s",
    "update_tokens_per_s",
    "gen_time_share",
    "gen_flops_per_s",
    "update_flops_per_s",
    "gen_matmul_frac",
    "update_matmul_frac",
    "matmul_flops_per_s",
)


def layer_matmul_shapes(
    config: model_lib.ModelConfig, layer: int = 0
) -> dict[str, tuple[int, int]]:
    """One layer's projections as 2-D matmul weights [in, out], in the order they run.

    For a sparse (MoE) ``layer`` the MLP entries are the active ones, per token: the
    router (D, E) and gate/up (D, k * F_moe), down (k * F_moe, D) for its k experts.
    """
    d, n, k, h, f = (
        config.hidden_size,
        config.num_heads,
        config.num_kv_heads,
        config.head_dim,
        config.intermediate_size,
    )
    shapes = {"q": (d, n * h), "k": (d, k * h), "v": (d, k * h), "o": (n * h, d)}
    if config.is_moe_layer(layer):
        f = config.num_experts_per_tok * config.moe_intermediate_size
        shapes["router"] = (d, config.num_experts)
    return {**shapes, "gate": (d, f), "up": (d, f), "down": (f, d)}


def matmul_weights(config: model_lib.ModelConfig) -> int:
    """Weights used in matmuls per token: the layers' projections plus the LM head
    (a MoE layer's active weights only, see ``layer_matmul_shapes``)."""
    per_layer = [
        sum(a * b for a, b in layer_matmul_shapes(config, i).values())
        for i in range(config.num_layers)
    ]
    head = config.hidden_size if config.head == "value" else config.hidden_size * config.vocab_size
    return sum(per_layer) + head


def model_flops_per_token(config: model_lib.ModelConfig, seq_len: int) -> float:
    """Forward FLOPs of one token attending over ``seq_len`` slots.

    Args:
      config: the model shape.
      seq_len: attention context (slots the query's scores are computed over).

    Returns:
      ``2 * matmul_weights + 4 * L * seq_len * N * H``.
    """
    attention = 4 * config.num_layers * seq_len * config.num_heads * config.head_dim
    return float(2 * matmul_weights(config) + attention)


def generation_flops(
    config: model_lib.ModelConfig,
    *,
    prompt_tokens: int,
    gen_tokens: int,
    prompt_len: int,
    seq_len: int,
) -> float:
    """Forward FLOPs of a rollout: prefill over ``prompt_len`` slots, decode over ``seq_len``.

    Args:
      config: the model shape.
      prompt_tokens: real prompt tokens prefilled (all rows).
      gen_tokens: generated tokens (all rows, EOS included).
      prompt_len: prompt bucket width I (prefill attends over I slots).
      seq_len: I + R (each decode step attends over the whole cache).
    """
    return prompt_tokens * model_flops_per_token(
        config, prompt_len
    ) + gen_tokens * model_flops_per_token(config, seq_len)


def update_flops(config: model_lib.ModelConfig, *, tokens: int, seq_len: int) -> float:
    """FLOPs of one update (forward + backward) over ``tokens`` tokens of width ``seq_len``."""
    return UPDATE_FLOPS_MULTIPLIER * tokens * model_flops_per_token(config, seq_len)


def _default_matmul_size() -> int:
    return 2048 if jax.default_backend() == "cpu" else 8192


def time_matmul_flops(size: int = 0, dtype: str = "float32", repeats: int = 3) -> float:
    """Best-of-``repeats`` FLOP/s of a jitted [size, size] @ [size, size] matmul, now.

    Args:
      size: matrix size; 0 picks 2048 on a CPU, 8192 on an accelerator.
      dtype: element dtype (use the model's compute dtype).
      repeats: timed calls after a warm-up; the fastest counts.

    Returns:
      FLOP/s (``2 size^3 / seconds``).
    """
    size = size or _default_matmul_size()
    a = jax.random.normal(jax.random.key(0), (size, size), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (size, size), jnp.float32).astype(dtype)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


@functools.cache
def measure_matmul_flops(size: int = 0, dtype: str = "float32", repeats: int = 3) -> float:
    """``time_matmul_flops``, measured once per process and argument set (cached)."""
    return time_matmul_flops(size, dtype, repeats)


def _rate(amount: float, seconds: float) -> float | None:
    return amount / seconds if seconds > 0 else None


def step_throughput(
    *,
    gen_tokens: int,
    gen_flops: float,
    time_generate_s: float,
    update_tokens: int,
    upd_flops: float,
    time_update_s: float,
    responses: int,
    step_time_s: float,
    matmul_flops_per_s: float,
) -> dict[str, Any]:
    """Throughput metrics of one training step (or of a whole run, from sums).

    Args:
      gen_tokens: tokens generated.
      gen_flops: their model FLOPs (``generation_flops``).
      time_generate_s: generation wall time.
      update_tokens: prompt + response tokens the update processed.
      upd_flops: its FLOPs (``update_flops``).
      time_update_s: update wall time.
      responses: retained responses (training samples).
      step_time_s: training wall time (generation + scoring + update + idle).
      matmul_flops_per_s: the device's measured matmul rate.

    Returns:
      ``gen_tokens_per_s``, ``responses_per_s``, ``update_tokens_per_s``,
      ``gen_time_share``, ``gen_flops_per_s``, ``update_flops_per_s``,
      ``gen_matmul_frac``, ``update_matmul_frac`` (None where a time is zero).
    """
    gen_rate = _rate(gen_flops, time_generate_s)
    upd_rate = _rate(upd_flops, time_update_s)
    return {
        "gen_tokens_per_s": _rate(gen_tokens, time_generate_s),
        "responses_per_s": _rate(responses, step_time_s),
        "update_tokens": update_tokens,
        "update_tokens_per_s": _rate(update_tokens, time_update_s),
        "gen_time_share": _rate(time_generate_s, step_time_s),
        "gen_flops_per_s": gen_rate,
        "update_flops_per_s": upd_rate,
        "gen_matmul_frac": None if gen_rate is None else gen_rate / matmul_flops_per_s,
        "update_matmul_frac": None if upd_rate is None else upd_rate / matmul_flops_per_s,
        "matmul_flops_per_s": matmul_flops_per_s,
    }


def rollout_costs(config: model_lib.ModelConfig, samples: Any) -> dict[str, float]:
    """Generation and update work of one rollout batch (a ``SampleOutput`` of numpy arrays).

    Every row is counted, dropped groups included: the update keeps one batch shape and
    computes over them too.

    Returns:
      ``gen_tokens``, ``gen_flops``, ``update_tokens`` (real prompt + response tokens)
      and ``update_flops``.
    """
    p = samples.prompt_tokens.shape[1]
    s = p + samples.response_tokens.shape[1]
    prompt_tokens = int(samples.prompt_mask.sum())
    gen_tokens = int(samples.response_mask.sum())
    tokens = prompt_tokens + gen_tokens
    return {
        "gen_tokens": gen_tokens,
        "gen_flops": generation_flops(
            config, prompt_tokens=prompt_tokens, gen_tokens=gen_tokens, prompt_len=p, seq_len=s
        ),
        "update_tokens": tokens,
        "update_flops": update_flops(config, tokens=tokens, seq_len=s),
    }


def jit_cache_size(fn: Any) -> int:
    """Compiled programs held by a ``jax.jit`` function (0 for anything else)."""
    size = getattr(fn, "_cache_size", None)
    return int(size()) if callable(size) else 0
