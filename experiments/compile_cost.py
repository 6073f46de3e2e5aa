r"""Compile cost of the GRPO update and the sampler per layer layout, side by side.

For one model shape, compiles the jitted GRPO update (and the sampler's prefill and
decode loop) ahead of time for abstract shapes (no weights), once per layer layout, the
layouts alternating (loop, scan, loop, scan, ...) so host load falls on both alike, and
prints a table: StableHLO and optimized-HLO characters, lowering and compile seconds,
XLA's memory analysis (temporaries and peak), and the host's 1-minute load beside each
compile (the load and the table are ``rl_batch.bench``'s)::

  python -m experiments.compile_cost --preset=qwen3-0.6b --prompt_len=512 \
      --response_len=2048 --micro_seqs=1 --repeats=2

``loop`` is the per-layer parameter tree with the blocks unrolled in the program;
``scan`` is ``ModelConfig.scan_layers`` (blocks stored stacked, one block under a
``lax.scan``). The model gets the run config's settings for its size (remat, attention,
log-prob chunks, float32 master weights under bf16 compute). Runs on the CPU backend
with ``--xla_cpu_enable_concurrency_optimized_scheduler=false`` (as
``experiments.plan_memory``), with the persistent compilation cache off (a cache hit
would time a read, not a compile); times are this host's, comparable only within one
table.
"""

import os

# Before jax starts (see experiments.plan_memory): a memory-aware CPU scheduler.
_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import dataclasses  # noqa: E402
import time  # noqa: E402

from absl import app, flags  # noqa: E402

from experiments import cli  # noqa: E402
from rl_batch import bench  # noqa: E402

_PRESET = flags.DEFINE_string("preset", "qwen3-0.6b", "Model preset (shape only).")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 512, "Prompt tokens P.")
_RESPONSE_LEN = flags.DEFINE_integer("response_len", 2048, "Response tokens R.")
_MICRO_SEQS = flags.DEFINE_integer("micro_seqs", 1, "Sequences per micro-batch.")
_MICRO_BATCHES = flags.DEFINE_integer("micro_batches", 2, "Micro-batches per update.")
_GEN_BATCH = flags.DEFINE_integer("gen_batch", 16, "Sampler rows (prefill and decode).")
_LAYOUTS = flags.DEFINE_list("layouts", ["loop", "scan"], "Layer layouts: loop, scan.")
_PARTS = flags.DEFINE_list("parts", ["update", "sampler"], "Programs: update, sampler.")
_REPEATS = flags.DEFINE_integer("repeats", 1, "Rounds over the layouts (interleaved).")
_NUM_LAYERS = flags.DEFINE_integer("num_layers", 0, "Override the preset's layers (0: keep).")


@dataclasses.dataclass(frozen=True)
class Cost:
    """One compiled program: its size, how long it took, and its memory (bytes)."""

    stablehlo_chars: int
    hlo_chars: int
    lower_s: float
    compile_s: float
    temp: int
    peak: int
    load: float  # host 1-minute load average when the compile finished


def compile_cost(lowered, lower_s: float) -> Cost:
    """Compiles a ``jax.stages.Lowered`` (that took ``lower_s`` to lower) and measures it."""
    from rl_batch.runs.memory_plan import Compiled

    t0 = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - t0
    memory = Compiled.of(compiled)
    return Cost(
        stablehlo_chars=len(lowered.as_text()),
        hlo_chars=len(compiled.as_text()),
        lower_s=lower_s,
        compile_s=compile_s,
        temp=memory.temp,
        peak=memory.peak,
        load=bench.load_1min(),
    )


def _lower(fn, *args):
    """(``fn.lower(*args)``, its seconds)."""
    t0 = time.perf_counter()
    lowered = fn.lower(*args)
    return lowered, time.perf_counter() - t0


def model_config(layout: str):
    """The preset with the run config's memory settings, in layer layout ``layout``."""
    from rl_batch.models import transformer as model_lib

    config = model_lib.get_preset(_PRESET.value)
    if _NUM_LAYERS.value:
        config = config.replace(num_layers=_NUM_LAYERS.value)
    config = model_lib.with_master_weights(model_lib.with_memory_defaults(config))
    return config.replace(scan_layers=layout == "scan")


def update_lowered(config):
    """The GRPO update of ``micro_batches`` x ``micro_seqs`` sequences, lowered (with
    its lowering seconds)."""
    from rl_batch.algorithms import grpo as grpo_lib
    from rl_batch.algorithms import learner
    from rl_batch.runs import memory_plan

    optimizer = learner.make_optimizer(1e-6, max_grad_norm=1.0)
    update, args = memory_plan.update_program(
        config,
        grpo_lib.GRPOConfig(micro_batches=_MICRO_BATCHES.value),
        optimizer,
        batch=_MICRO_BATCHES.value * _MICRO_SEQS.value,
        prompt_len=_PROMPT_LEN.value,
        response_len=_RESPONSE_LEN.value,
    )
    return _lower(update, *args)


def sampler_lowered(config):
    """The sampler's prefill and decode loop for ``gen_batch`` rows, each lowered with
    its seconds (``memory_plan.sampler_programs``)."""
    from rl_batch.runs import memory_plan

    (prefill, prefill_args), (decode, decode_args) = memory_plan.sampler_programs(
        config,
        batch=_GEN_BATCH.value,
        prompt_len=_PROMPT_LEN.value,
        response_len=_RESPONSE_LEN.value,
    )
    return _lower(prefill, *prefill_args), _lower(decode, *decode_args)


COLUMNS = [
    "layout", "program", "round", "StableHLO M chars", "HLO M chars", "lower s", "compile s",
    "temp GB", "peak GB", "load 1m",
]  # fmt: skip


def _row(layout: str, part: str, round_: int, cost: Cost) -> str:
    return bench.markdown_row(
        [layout, part, round_, f"{cost.stablehlo_chars / 1e6:.2f}", f"{cost.hlo_chars / 1e6:.2f}"]
        + [f"{cost.lower_s:.1f}", f"{cost.compile_s:.1f}", f"{cost.temp / 1e9:.2f}"]
        + [f"{cost.peak / 1e9:.2f}", f"{cost.load:.1f}"]
    )


def main(argv):
    del argv
    import jax

    jax.config.update("jax_enable_compilation_cache", False)

    for layout in _LAYOUTS.value:
        if layout not in ("loop", "scan"):
            raise app.UsageError(f"--layouts: {layout!r} is not one of loop, scan")
    for part in _PARTS.value:
        if part not in ("update", "sampler"):
            raise app.UsageError(f"--parts: {part!r} is not one of update, sampler")
    c = model_config(_LAYOUTS.value[0])
    print(
        f"{_PRESET.value}: {c.num_layers} layers, P + R = {_PROMPT_LEN.value} + "
        f"{_RESPONSE_LEN.value}; update {_MICRO_BATCHES.value} x {_MICRO_SEQS.value} "
        f"sequences (remat={c.remat}, attention={c.attention}, logits_chunk="
        f"{c.logits_chunk}, params {c.param_dtype} / compute {c.dtype}); sampler "
        f"gen_batch {_GEN_BATCH.value}; jax {jax.__version__}, {jax.default_backend()}",
        flush=True,
    )
    print(bench.markdown_header(COLUMNS), flush=True)
    for round_ in range(1, _REPEATS.value + 1):
        for layout in _LAYOUTS.value:
            config = model_config(layout)
            if "update" in _PARTS.value:
                print(_row(layout, "update", round_, compile_cost(*update_lowered(config))))
            if "sampler" in _PARTS.value:
                prefill, decode = sampler_lowered(config)
                print(_row(layout, "prefill", round_, compile_cost(*prefill)))
                print(_row(layout, "decode", round_, compile_cost(*decode)), flush=True)
            jax.clear_caches()


if __name__ == "__main__":
    cli.run(main)
