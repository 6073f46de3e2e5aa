"""Ahead-of-time device-memory estimates of the GRPO update and the sampler.

Each estimate compiles the real jitted function for abstract shapes
(``jax.jit(f).lower(ShapeDtypeStructs).compile().memory_analysis()``): no weights are
allocated, so shapes far larger than the host can run compile here. On the CPU backend,
run with ``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=false`` (set by
``experiments.plan_memory`` before jax starts): the default CPU scheduler ignores
memory, which overstates peaks and hides what remat saves.

The peak of one call is estimated as ``arguments + temporaries + outputs - aliased``
(donated state counted once). Compiled on one device with a 1-device mesh.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rl_batch.algorithms import grpo as grpo_lib
from rl_batch.algorithms import learner
from rl_batch.models import sharding
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import sampler as sampler_lib


@dataclasses.dataclass(frozen=True)
class Compiled:
    """Memory of one compiled program (bytes), from XLA's ``memory_analysis``."""

    arguments: int
    outputs: int
    aliased: int
    temp: int

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temp

    @classmethod
    def of(cls, compiled: Any) -> Compiled:
        m = compiled.memory_analysis()
        return cls(
            arguments=int(m.argument_size_in_bytes),
            outputs=int(m.output_size_in_bytes),
            aliased=int(m.alias_size_in_bytes),
            temp=int(m.temp_size_in_bytes),
        )


def tree_bytes(tree: Any) -> int:
    """Bytes of a tree of arrays or ``ShapeDtypeStruct``s."""
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def _mesh():
    return sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])


def abstract_train_state(
    model_config: model_lib.ModelConfig, optimizer: optax.GradientTransformation
) -> learner.TrainState:
    """The ``TrainState`` as ``ShapeDtypeStruct``s (no memory allocated)."""
    params = model_lib.abstract_params(model_config)
    return jax.eval_shape(lambda p: learner.init_train_state(model_config, p, optimizer), params)


def abstract_batch(b: int, p: int, r: int) -> learner.Batch:
    """A GRPO ``Batch`` of B sequences as ``ShapeDtypeStruct``s (with the sampler's
    old log-probs, as a run passes them)."""

    def sds(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype)

    return learner.Batch(
        prompt_tokens=sds((b, p), jnp.int32),
        prompt_mask=sds((b, p), jnp.bool_),
        response_tokens=sds((b, r), jnp.int32),
        response_mask=sds((b, r), jnp.bool_),
        advantages=sds((b,), jnp.float32),
        old_logprobs=sds((b, r), jnp.float32),
    )


def update_program(
    model_config: model_lib.ModelConfig,
    grpo_config: grpo_lib.GRPOConfig,
    optimizer: optax.GradientTransformation,
    *,
    batch: int,
    prompt_len: int,
    response_len: int,
) -> tuple[Any, tuple[Any, ...]]:
    """The jitted ``grpo.make_update_fn`` and its abstract arguments (state, batch of
    ``batch`` sequences of ``prompt_len + response_len`` tokens, key), on one device."""
    update = grpo_lib.make_update_fn(model_config, grpo_config, optimizer, _mesh())
    args = (
        abstract_train_state(model_config, optimizer),
        abstract_batch(batch, prompt_len, response_len),
        jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
    )
    return update, args


def update_memory(
    model_config: model_lib.ModelConfig,
    grpo_config: grpo_lib.GRPOConfig,
    optimizer: optax.GradientTransformation,
    *,
    batch: int,
    prompt_len: int,
    response_len: int,
) -> Compiled:
    """Compiles ``grpo.make_update_fn`` for a batch of ``batch`` sequences of
    ``prompt_len + response_len`` tokens (``grpo_config.micro_batches`` pieces)."""
    update, args = update_program(
        model_config,
        grpo_config,
        optimizer,
        batch=batch,
        prompt_len=prompt_len,
        response_len=response_len,
    )
    return Compiled.of(update.lower(*args).compile())


def _sampler_args(model_config: model_lib.ModelConfig, batch: int, prompt_len: int):
    """Abstract (params, prompt tokens [B, I], prompt mask [B, I], rng, max new tokens)
    of a sampler call: what both engines' programs take."""
    params = model_lib.abstract_params(model_config)
    tokens = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32)
    mask = jax.ShapeDtypeStruct((batch, prompt_len), jnp.bool_)
    rng = jax.ShapeDtypeStruct((), jax.random.key(0).dtype)
    new = jax.ShapeDtypeStruct((), jnp.int32)
    return params, tokens, mask, rng, new


def sampler_programs(
    model_config: model_lib.ModelConfig,
    *,
    batch: int,
    prompt_len: int,
    response_len: int,
) -> tuple[tuple[Any, tuple[Any, ...]], tuple[Any, tuple[Any, ...]]]:
    """The sampler's jitted prefill and decode loop for ``batch`` rows (gen_batch), each
    with its abstract arguments: ((prefill, args), (decode, args)). The decode state (KV
    cache included) is donated, as in ``Sampler``."""
    params, tokens, mask, rng, new = _sampler_args(model_config, batch, prompt_len)
    prefill = jax.jit(
        functools.partial(
            sampler_lib.prefill, model_config, response_len=response_len, eos_id=0, pad_id=0
        )
    )
    prefill_args = (params, tokens, mask, rng, new)
    state = jax.eval_shape(prefill, *prefill_args)
    decode = jax.jit(functools.partial(sampler_lib.decode, model_config), donate_argnums=1)
    return (prefill, prefill_args), (decode, (params, state))


def sampler_memory(
    model_config: model_lib.ModelConfig,
    *,
    batch: int,
    prompt_len: int,
    response_len: int,
) -> tuple[Compiled, Compiled]:
    """Compiles the sampler's prefill and decode loop for ``batch`` rows (gen_batch):
    (prefill, decode) (``sampler_programs``)."""
    programs = sampler_programs(
        model_config, batch=batch, prompt_len=prompt_len, response_len=response_len
    )
    pre, dec = (Compiled.of(fn.lower(*args).compile()) for fn, args in programs)
    return pre, dec


def continuous_program(
    model_config: model_lib.ModelConfig,
    sampling: sampler_lib.SamplingConfig,
    *,
    batch: int,
    prompt_len: int,
    response_len: int,
) -> tuple[Any, tuple[Any, ...]]:
    """The continuous engine's one jitted program (``sampler.sample_continuous``: prefill
    and the decode loop) for ``batch`` rows through ``sampling.slots`` slots, with its
    abstract arguments, as ``Sampler`` runs it (nothing donated)."""
    params, tokens, mask, rng, new = _sampler_args(model_config, batch, prompt_len)
    program = jax.jit(
        functools.partial(
            sampler_lib.sample_continuous,
            model_config,
            slots=sampler_lib.decode_slots(sampling, batch),
            response_len=response_len,
            eos_id=0,
            pad_id=0,
            sampling=sampling,
        )
    )
    return program, (params, tokens, mask, rng, new)


def sampler_call_memory(
    model_config: model_lib.ModelConfig,
    sampling: sampler_lib.SamplingConfig,
    *,
    batch: int,
    prompt_len: int,
    response_len: int,
) -> Compiled:
    """The compiled memory of one sampler call of ``batch`` rows (gen_batch) with
    ``sampling``'s engine: static, the larger-peak of prefill and the decode loop
    (``sampler_memory``); continuous, its one program (``continuous_program``)."""
    shapes = dict(batch=batch, prompt_len=prompt_len, response_len=response_len)
    if sampling.engine == "continuous":
        fn, args = continuous_program(model_config, sampling, **shapes)
        return Compiled.of(fn.lower(*args).compile())
    pre, dec = sampler_memory(model_config, **shapes)
    return max(pre, dec, key=lambda m: m.peak)


# Peaks that grow less than this fraction between the two largest compiled sizes are
# flat: params-sized buffers (gradients, accumulator, optimizer update) set the peak
# there, so a line through them says nothing about larger sizes (qwen3-4b at 512 + 2048
# peaked at 102.01 GB for both 2 and 4 sequences, and the line "fit" ~667856).
FLAT_GROWTH = 0.01


def is_flat(peaks: list[int]) -> bool:
    """Whether the last two peaks are too close for a straight line (``FLAT_GROWTH``)."""
    return len(peaks) >= 2 and peaks[-1] - peaks[-2] < FLAT_GROWTH * peaks[-1]


def largest_fitting(sizes: list[int], peaks: list[int], budget: float) -> tuple[int, bool]:
    """The largest size whose peak fits ``budget``, from peaks measured at ``sizes``
    (ascending) and a straight line through the last two beyond them (not when they are
    flat, ``is_flat``: then the largest measured size, a lower bound).

    Returns:
      (size, extrapolated): 0 if even the smallest measured size does not fit;
      ``extrapolated`` is True when the answer lies beyond the measured sizes.
    """
    fitting = [s for s, p in zip(sizes, peaks) if p <= budget]
    if not fitting:
        return 0, False
    if len(sizes) < 2 or fitting[-1] != sizes[-1] or is_flat(peaks):
        return fitting[-1], False
    (s0, p0), (s1, p1) = (sizes[-2], peaks[-2]), (sizes[-1], peaks[-1])
    slope = (p1 - p0) / (s1 - s0)
    return max(sizes[-1], int(s1 + (budget - p1) // slope)), True


def check_run_specs(specs: dict[str, Any], device_memory: float) -> list[str]:
    """Compiles each GRPO run's update and sampler at its own shapes and names the runs
    whose estimated peak exceeds ``device_memory`` bytes (an empty list when all fit).

    Args:
      specs: run name -> ``RunSpec`` (``rl_batch.runs.config.resolve``).
      device_memory: bytes of one device.

    Returns:
      One message per run that does not fit (PPO runs are not checked).
    """
    errors, cache = [], {}
    for name, spec in specs.items():
        c = spec.inputs
        if c.algo != "grpo":
            continue
        mc, b, m = spec.model, spec.batch, spec.micro_batches
        seqs = b // c.grpo.num_minibatches // m
        p, r = spec.max_prompt_len, spec.max_new_tokens
        gen = min(c.gen_batch or b, b)
        optimizer = learner.make_optimizer(1e-6, max_grad_norm=c.max_grad_norm or None)
        # Activations do not depend on the micro-batch count beyond 2 (a scan).
        key = ("update", mc, seqs, min(m, 2), p, r, c.max_grad_norm)
        if key not in cache:
            grpo = grpo_lib.GRPOConfig(micro_batches=min(m, 2))
            cache[key] = update_memory(
                mc, grpo, optimizer, batch=seqs * min(m, 2), prompt_len=p, response_len=r
            ).peak
        sampling = spec.rollout.sampling.method
        key_s = ("sampler", mc, gen, p, r, sampling)
        if key_s not in cache:
            m_s = sampler_call_memory(mc, sampling, batch=gen, prompt_len=p, response_len=r)
            opt = tree_bytes(abstract_train_state(mc, optimizer).opt_state)
            cache[key_s] = m_s.peak + opt
        slots_hint = " or sampling.slots" if sampling.engine == "continuous" else ""
        for what, peak, hint in (
            ("update", cache[key], f"{seqs} sequences per micro-batch: raise grpo.micro_batches"),
            ("sampler", cache[key_s], f"gen_batch {gen}: lower gen_batch{slots_hint}"),
        ):
            if peak > device_memory:
                errors.append(
                    f"{name}: the {what} needs ~{peak / 1e9:.1f} GB, more than the "
                    f"{device_memory / 1e9:.1f} GB of a device ({hint}, or lower "
                    "grpo.micro_batch_seqs; see experiments.plan_memory)"
                )
    return errors
