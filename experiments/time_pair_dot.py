"""What the direct estimate of <g_2k, g_2k+1> costs an update (docs/noise_scale.md).

The half-group pairs (``grpo.group_noise``) read the inner product of a pair's two
halves either off the running sum of the micro-batch gradients (``pair_dot="running"``,
no buffer, about 2.4x the per-update spread) or directly from the kept gradient of the
first half (``"direct"``, one more parameter-sized float32 buffer carried through the
micro-batch scan). This times one GRPO update of the default CPU study's model
(``experiments/configs/grpo_cpu.py``) with each, beside the strided and whole-group
layouts, in interleaved rounds (``rl_batch.bench``: a change in the host's load falls on
all alike), and prints a table with the host's 1-minute load (``os.getloadavg``) and the
per-round ratios (median, min-max) of wall and process CPU seconds to the running-sum
update (on a shared host the CPU seconds are the steadier measure)::

  python -m experiments.time_pair_dot --prompts=16 --micro_batches=4 --rounds=20
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from experiments import cli
from experiments.configs import grpo_cpu
from rl_batch import bench
from rl_batch.algorithms import batch as batch_lib
from rl_batch.algorithms import grpo, learner, update_step
from rl_batch.models import sharding
from rl_batch.models import transformer as model_lib
from rl_batch.runs import config as config_lib

_PROMPTS = flags.DEFINE_integer("prompts", 16, "P prompts per batch.")
_GROUP = flags.DEFINE_integer("group_size", 8, "G responses per prompt.")
_MICRO = flags.DEFINE_integer("micro_batches", 4, "M micro-batches (even, >= 4).")
_RESPONSE = flags.DEFINE_integer("response_len", 24, "R response tokens per row.")
_ROUNDS = flags.DEFINE_integer("rounds", 20, "Timed rounds (at least).")
_SECONDS = flags.DEFINE_float("seconds", 20.0, "Timed seconds (at least, all variants).")

# label -> (layout, pair_dot)
VARIANTS = {
    "pairs, running sum": ("pairs", "running"),
    "pairs, direct": ("pairs", "direct"),
    "groups": ("groups", "direct"),
    "strided": ("strided", "direct"),
}


def _update(model, config, optimizer, layout, pair_dot):
    """A jitted GRPO update (the learner's loss, accumulation and optimizer step)."""

    def update(state, batch):
        tokens, seqs = batch_lib.loss_normalisers(batch.response_mask)
        loss_fn = functools.partial(
            grpo.grpo_loss,
            model,
            config,
            num_tokens=tokens,
            num_seqs=seqs,
            max_len=batch.response_tokens.shape[1],
        )
        grads, loss, metrics = update_step.accumulate_gradients(
            loss_fn,
            state.params,
            batch,
            config.micro_batches,
            group_size=config.group_size,
            layout=layout,
            pair_dot=pair_dot,
        )
        state, more = update_step.apply_update(state, grads, loss, optimizer)
        return state, {**metrics, **more}

    return jax.jit(update)


def _batch(rows: int, prompt_len: int, response_len: int, vocab: int) -> learner.Batch:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, response_len + 1, rows)
    response_mask = np.arange(response_len)[None, :] < lengths[:, None]
    return learner.Batch(
        prompt_tokens=jnp.asarray(rng.integers(1, vocab, (rows, prompt_len)), jnp.int32),
        prompt_mask=jnp.ones((rows, prompt_len), bool),
        response_tokens=jnp.asarray(rng.integers(1, vocab, (rows, response_len)), jnp.int32),
        response_mask=jnp.asarray(response_mask),
        advantages=jnp.asarray(rng.normal(size=rows), jnp.float32),
        old_logprobs=jnp.asarray(-rng.uniform(0.5, 3.0, (rows, response_len)), jnp.float32),
    )


def main(argv):
    del argv
    c = grpo_cpu.get_config()
    c.prompts, c.group_size = _PROMPTS.value, _GROUP.value
    c.grpo.micro_batches = _MICRO.value
    spec = config_lib.resolve(c, 1)
    model = spec.model
    config = spec.algorithm.replace(micro_batches=_MICRO.value, group_size=_GROUP.value)
    optimizer = learner.make_optimizer(1e-5)
    params = model_lib.init_params(model, 0)
    mesh = sharding.make_mesh(data=1, devices=jax.devices()[:1])
    rows = _PROMPTS.value * _GROUP.value
    batch = _batch(rows, spec.max_prompt_len, _RESPONSE.value, model.vocab_size)
    states, fns = {}, {}
    for label, (layout, pair_dot) in VARIANTS.items():
        states[label] = learner.init_train_state(model, params, optimizer, mesh=mesh)
        fns[label] = _update(model, config, optimizer, layout, pair_dot)

    def call(label):
        def run(_round):
            states[label], metrics = fns[label](states[label], batch)
            jax.block_until_ready(metrics)

        return run

    timings = bench.time_interleaved(
        {label: call(label) for label in VARIANTS},
        min_repeats=_ROUNDS.value,
        min_time_s=_SECONDS.value,
        warmup=True,
    )
    base = timings["pairs, running sum"]
    print(
        f"GRPO update, {model.num_params / 1e6:.2f}M parameters, P x G = {_PROMPTS.value} x "
        f"{_GROUP.value}, M = {_MICRO.value}, R = {_RESPONSE.value}; "
        f"{timings['strided'].repeats} interleaved rounds; {os.cpu_count()} CPUs, "
        f"{jax.devices()[0].platform}"
    )
    print(
        bench.markdown_header(
            ["update", "median s", "median CPU s", "load (1 min)", "wall ratio", "CPU ratio"]
        )
    )
    for label, t in timings.items():
        ratio, lo, hi = bench.ratio_summary(base.time_s, t.time_s)
        cpu, cpu_lo, cpu_hi = bench.ratio_summary(base.cpu_s, t.cpu_s)
        print(
            bench.markdown_row(
                [
                    label,
                    f"{t.median_s:.4f}",
                    f"{t.median_cpu_s:.4f}",
                    f"{t.median_load1:.2f} ({min(t.load1):.2f}-{max(t.load1):.2f})",
                    f"{ratio:.3f} ({lo:.3f}-{hi:.3f})",
                    f"{cpu:.3f} ({cpu_lo:.3f}-{cpu_hi:.3f})",
                ]
            )
        )


if __name__ == "__main__":
    cli.run(main)
