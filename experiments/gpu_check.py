r"""One-accelerator check: sampling and GRPO updates against their rooflines and the
compiled memory estimate, at a few batch sizes (random weights, the preset's vocabulary).

  python -m experiments.gpu_check [--preset=qwen3-0.6b] [--batches=16,64,256] \
      [--prompt_len=256] [--response_len=1024] [--micro_batch_seqs=16] \
      [--bandwidth=4.8e12] [--peak_flops=989e12] [--out=gpu_check.json]

The model takes a run's memory settings (``model.with_memory_defaults``, float32 master
weights under bf16 compute), as ``rl_batch.runs.config.make_model_config`` gives a real
checkpoint. Per batch size B (P + R = prompt + response tokens):

- **Sampling**: the sampler's jitted prefill and ``while_loop`` decode
  (``rl_batch.rollout.sampler.prefill`` / ``decode``, one device), every row generating R tokens
  (no stop id). Decode tokens/s = B * R / decode seconds; its roofline is the HBM-bound
  rate B / (bytes per step / ``--bandwidth``), bytes per step = the params as stored plus
  the whole KV cache (B x (P + R) slots: every decode step's attention reads all of them).
- **Long-tail lengths** (``--length_sigma`` > 0): both engines (``SamplingConfig.engine``
  static and continuous with ``--slots``, blocked attention ``--attn_block``) through a
  ``Sampler`` with log-normal per-row lengths forced as per-row limits: generated
  tokens/s and the useful-token fraction (decode tokens / slot-steps), and each engine's
  own roofline: its decode tokens over the time to read the params once per decode step
  plus the cache slots its attention read (``last_stats``' ``slots_read``) at
  ``--bandwidth``. The filled-KV roofline counts P + R / 2 cache slots per row and step
  (attention reading only the filled cache) instead of P + R.
- **Update**: ``rl_batch.algorithms.grpo.make_update_fn`` with ``B / micro_batch_seqs``
  micro-batches on random tokens, every response token real. MFU = the model FLOPs
  ``rl_batch.models.flops.update_flops`` (3x the forward, remat's recomputation not counted)
  per second over ``--peak_flops``.
- **Memory**: each program's compiled estimate, as ``experiments.plan_memory`` computes
  it (``rl_batch.runs.memory_plan.Compiled``: arguments + outputs - donated + temporaries),
  here on this backend, against ``device.memory_stats()['peak_bytes_in_use']`` after
  the phase (n/a where the backend has none, e.g. CPU). That peak is the process's
  high-water mark: all sampling runs first (batches ascending, only params resident),
  then the updates (ascending, the train state resident), so each reading is the largest
  so far of its phase, and an update's reading is at least the sampling phase's.

Each point runs once to compile and warm up, then ``--repeats`` times; the median
counts (``rl_batch.bench``, which also formats the tables). The timed programs are the
ones whose memory is read (compiled once each).

``--mesh_check`` runs only the mesh case instead (``mesh_sampling_check``): both engines
with top-p and top-k + top-p on ``data`` x ``tensor`` and ``data`` x ``fsdp`` meshes of
the first 4 devices, at per-row lengths that make the data shards run different numbers
of decode steps; it prints one line per case and exits non-zero unless every case gave
the one-device tokens (a collective inside a per-shard loop aborts it instead).
"""

from __future__ import annotations

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from experiments import cli
from rl_batch import bench
from rl_batch.algorithms import grpo as grpo_lib
from rl_batch.algorithms import learner
from rl_batch.models import flops
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import sampler as sampler_lib
from rl_batch.runs import memory_plan


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The flags as data (tests build them directly)."""

    preset: str = "qwen3-0.6b"
    vocab_size: int = 0
    batches: tuple[int, ...] = (16, 64, 256)
    prompt_len: int = 256
    response_len: int = 1024
    micro_batch_seqs: int = 16
    bandwidth: float = 4.8e12
    peak_flops: float = 989e12
    repeats: int = 2
    seed: int = 0
    slots: int = 0  # continuous engine's decode slots (0: B / 4)
    length_sigma: float = 1.0  # log-normal spread of the long-tail lengths (0: skip them)
    attn_block: int = 128  # blocked decode attention of the long-tail runs (0: full)
    model_overrides: dict = dataclasses.field(default_factory=dict)  # ModelConfig fields


# The command line, defined only when run as a program (``_define_flags``): the tests
# import this module beside ``experiments.throughput``, whose flags share these names.
_FLAG_HELP = {
    "preset": "Model preset (rl_batch.models.transformer.PRESETS).",
    "vocab_size": "Vocabulary override (0: the preset's).",
    "batches": "Batch sizes (sequences).",
    "prompt_len": "Prompt tokens P.",
    "response_len": "Response tokens R.",
    "micro_batch_seqs": "Sequences per update micro-batch.",
    "bandwidth": "HBM bytes/s (H200: 4.8e12).",
    "peak_flops": "Peak FLOP/s (H200 bf16 dense: 989e12).",
    "repeats": "Timed runs per point after the warm-up.",
    "seed": "Seed for weights and tokens.",
    "slots": "Continuous engine decode slots (0: B / 4).",
    "length_sigma": "Log-normal sigma of the long-tail response lengths (0: skip that part).",
    "attn_block": "Blocked decode attention block of the long-tail runs (0: full).",
}


def _define_flags() -> None:
    """One flag per `Settings` field in `_FLAG_HELP` (its default), plus ``--out``."""
    define = {str: flags.DEFINE_string, int: flags.DEFINE_integer, float: flags.DEFINE_float}
    for f in dataclasses.fields(Settings):
        if f.name not in _FLAG_HELP:
            continue
        if f.name == "batches":
            flags.DEFINE_list(f.name, [str(b) for b in f.default], _FLAG_HELP[f.name])
        else:
            define[type(f.default)](f.name, f.default, _FLAG_HELP[f.name])
    flags.DEFINE_string("out", None, "Write the rows as JSON here.")
    flags.DEFINE_bool("mesh_check", False, "Run only the mesh sampling check (4 devices).")


def model_config(settings: Settings) -> model_lib.ModelConfig:
    """The preset with a run's memory settings and master weights."""
    overrides = {"vocab_size": settings.vocab_size} if settings.vocab_size else {}
    overrides |= settings.model_overrides
    base = model_lib.get_preset(settings.preset, **overrides)
    base = model_lib.with_master_weights(model_lib.with_memory_defaults(base))
    length = settings.prompt_len + settings.response_len
    return base.replace(max_seq_len=max(base.max_seq_len, length))


def peak_bytes_in_use() -> int | None:
    """The device's high-water mark of allocated bytes (None where not reported)."""
    stats = jax.devices()[0].memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return None
    return int(stats["peak_bytes_in_use"])


def _median_time(fn, repeats: int) -> float:
    """Median wall seconds of ``repeats`` calls of ``fn()`` after one warm-up call."""
    return bench.time_calls(lambda _: fn(), min_repeats=repeats, min_time_s=0.0).median_s


def sample_point(mc, params, batch: int, settings: Settings) -> dict:
    """Prefill + decode of ``batch`` rows: times, decode tokens/s and its roofline,
    compiled memory estimate (max of prefill and decode) and the device's peak."""
    p, r = settings.prompt_len, settings.response_len
    rng = np.random.default_rng(settings.seed + batch)
    tokens = jnp.asarray(rng.integers(1, mc.vocab_size, (batch, p)), jnp.int32)
    mask = jnp.ones((batch, p), bool)
    key = jax.random.key(settings.seed)
    # eos_id outside the vocabulary: every row generates exactly R tokens.
    prefill = (
        jax.jit(
            functools.partial(
                sampler_lib.prefill, mc, response_len=r, eos_id=mc.vocab_size, pad_id=0
            )
        )
        .lower(params, tokens, mask, key, r)
        .compile()
    )
    state = prefill(params, tokens, mask, key, r)
    decode = (
        jax.jit(functools.partial(sampler_lib.decode, mc), donate_argnums=1)
        .lower(params, state)
        .compile()
    )
    estimate = max(memory_plan.Compiled.of(prefill).peak, memory_plan.Compiled.of(decode).peak)
    prefill_t, decode_t = bench.Timings(), bench.Timings()

    def run_once():
        s = prefill_t.record(lambda: jax.block_until_ready(prefill(params, tokens, mask, key, r)))
        s = decode_t.record(lambda: jax.block_until_ready(decode(params, s)))
        assert int(sampler_lib.outputs(s).lengths.min()) == r

    del state
    for _ in range(settings.repeats + 1):  # the first is the warm-up
        run_once()
    prefill_s = bench.median(prefill_t.time_s[1:])
    decode_s = bench.median(decode_t.time_s[1:])
    step_bytes = memory_plan.tree_bytes(params) + model_lib.kv_cache_bytes(mc, batch, p + r)
    roofline = batch / (step_bytes / settings.bandwidth)
    # Reading only the filled cache: P + R / 2 slots per row on average over the steps.
    filled_bytes = memory_plan.tree_bytes(params) + model_lib.kv_cache_bytes(mc, batch, p + r // 2)
    return {
        "batch": batch,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "decode_tokens_per_s": batch * r / decode_s,
        "roofline_tokens_per_s": roofline,
        "decode_bytes_per_step": step_bytes,
        "filled_roofline_tokens_per_s": batch / (filled_bytes / settings.bandwidth),
        "sample_estimate_bytes": estimate,
        "sample_peak_bytes": peak_bytes_in_use(),
    }


def engine_point(mc, params, batch: int, settings: Settings) -> dict:
    """Both engines at long-tail lengths (``sampler.long_tail_lengths``, forced as per-row
    limits): wall seconds of a whole ``Sampler`` call (median), generated tokens/s, the
    useful-token fraction (decode tokens / slot-steps) and each engine's own HBM roofline
    (decode tokens over the time to read the params once per decode step and the cache
    slots its attention read, at ``--bandwidth``)."""
    p, r = settings.prompt_len, settings.response_len
    lengths = sampler_lib.long_tail_lengths(batch, r, settings.length_sigma, settings.seed)
    sampler = sampler_lib.Sampler(
        mc, eos_id=mc.vocab_size, pad_id=0, max_prompt_len=p, max_new_tokens=r
    )
    prompts = np.random.default_rng(settings.seed + batch).integers(1, mc.vocab_size, (batch, p))
    slots = settings.slots or max(batch // 4, 1)
    engines = {
        "static": sampler_lib.SamplingConfig(attn_block=settings.attn_block),
        "continuous": sampler_lib.SamplingConfig(
            engine="continuous", slots=slots, attn_block=settings.attn_block
        ),
    }
    key = jax.random.key(settings.seed)
    params_bytes = memory_plan.tree_bytes(params)
    slot_bytes = model_lib.kv_cache_bytes(mc, 1, 1)
    row = {"tail_max_over_mean": float(lengths.max() / lengths.mean()), "slots": slots}
    for name, cfg in engines.items():

        def call(cfg=cfg):
            out = sampler(params, prompts.tolist(), rng=key, sampling=cfg, max_new_tokens=lengths)
            assert (out.lengths == lengths).all()

        time_s = _median_time(call, settings.repeats)
        st = sampler.last_stats
        row[f"{name}_tokens_per_s"] = float(lengths.sum()) / time_s
        row[f"{name}_useful"] = st["decode_tokens"] / max(st["slot_steps"], 1)
        row.update({f"{name}_{k}": st[k] for k in ("decode_steps", "decode_tokens", "slots_read")})
        # This engine's own HBM roofline: every decode step reads the params once, and
        # attention reads the cache slots it did read (``slots_read``).
        read = st["decode_steps"] * params_bytes + st["slots_read"] * slot_bytes
        row[f"{name}_roofline_tokens_per_s"] = st["decode_tokens"] / (read / settings.bandwidth)
    return row


def update_point(mc, state, optimizer, mesh, batch: int, settings: Settings):
    """One GRPO update of ``batch`` sequences: time, tokens/s, MFU, compiled estimate and
    the device's peak. Returns (row, state) (the update donates its state)."""
    from rl_batch.models import sharding

    p, r = settings.prompt_len, settings.response_len
    micro = max(batch // settings.micro_batch_seqs, 1)
    update_fn = grpo_lib.make_update_fn(
        mc, grpo_lib.GRPOConfig(micro_batches=micro), optimizer, mesh
    )
    rng = np.random.default_rng(settings.seed + 2 + batch)
    data = sharding.shard_batch(
        learner.Batch(
            prompt_tokens=jnp.asarray(rng.integers(1, mc.vocab_size, (batch, p)), jnp.int32),
            prompt_mask=jnp.ones((batch, p), bool),
            response_tokens=jnp.asarray(rng.integers(1, mc.vocab_size, (batch, r)), jnp.int32),
            response_mask=jnp.ones((batch, r), bool),
            advantages=jnp.asarray(rng.standard_normal(batch), jnp.float32),
            old_logprobs=jnp.full((batch, r), -np.log(mc.vocab_size), jnp.float32),
        ),
        mesh,
    )
    key = jax.random.key(settings.seed)
    # (The compiled update takes the clip range as its fourth argument: the configured one.)
    compiled = update_fn.lower(state, data, key).compile()
    holder = [state]

    def step():
        holder[0], metrics = compiled(holder[0], data, key, update_fn.clip)
        jax.block_until_ready(metrics)

    time_s = _median_time(step, settings.repeats)
    tokens = batch * (p + r)
    model_flops = flops.update_flops(mc, tokens=tokens, seq_len=p + r)
    row = {
        "batch": batch,
        "micro_batches": micro,
        "update_s": time_s,
        "update_tokens_per_s": tokens / time_s,
        "update_flops_per_s": model_flops / time_s,
        "mfu": model_flops / time_s / settings.peak_flops,
        "update_estimate_bytes": memory_plan.Compiled.of(compiled).peak,
        "update_peak_bytes": peak_bytes_in_use(),
    }
    return row, holder[0]


def run(settings: Settings) -> list[dict]:
    """Every batch: sampling first (all batches), then the updates; one row per batch."""
    from rl_batch.models import sharding

    mc = model_config(settings)
    print(
        f"gpu_check: {settings.preset} ({mc.num_params / 1e6:.0f}M params, {mc.param_dtype} "
        f"params, {mc.dtype} compute, attention={model_lib.attention_impl(mc)}, "
        f"remat={mc.remat}), P + R = {settings.prompt_len} + {settings.response_len}, "
        f"device {jax.devices()[0].device_kind} ({jax.default_backend()}), bandwidth "
        f"{settings.bandwidth:.3g} B/s, peak {settings.peak_flops:.3g} FLOP/s",
        flush=True,
    )
    params = model_lib.init_params(mc, settings.seed)
    batches = sorted(settings.batches)
    rows = {}
    for b in batches:
        rows[b] = sample_point(mc, params, b, settings)
        print(f"sampled batch {b}: {rows[b]['decode_tokens_per_s']:.0f} tok/s", flush=True)
        if settings.length_sigma > 0:
            rows[b].update(engine_point(mc, params, b, settings))
            print(
                f"long-tail batch {b}: static {rows[b]['static_tokens_per_s']:.0f}, "
                f"continuous {rows[b]['continuous_tokens_per_s']:.0f} tok/s",
                flush=True,
            )
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    optimizer = learner.make_optimizer(1e-6, max_grad_norm=1.0)
    state = learner.init_train_state(mc, params, optimizer, mesh=mesh)
    del params  # the state holds (and the update donates) them
    for b in batches:
        row, state = update_point(mc, state, optimizer, mesh, b, settings)
        rows[b].update(row)
        print(f"updated batch {b}: {row['update_tokens_per_s']:.0f} tok/s", flush=True)
    out = [rows[b] for b in batches]
    print(format_table(out))
    if settings.length_sigma > 0:
        print(format_engine_table(out))
    return out


def _gb(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 1e9:.1f}"


def format_table(rows: list[dict]) -> str:
    """Markdown: per batch, decode vs roofline, update tokens/s and MFU, memory (GB)."""
    columns = [
        "B", "prefill s", "decode tok/s", "roofline tok/s", "% roofline", "sample est / peak GB",
        "micro-batches", "update s", "update tok/s", "MFU", "update est / peak GB",
    ]  # fmt: skip
    return bench.markdown_table(
        columns,
        [
            [
                x["batch"],
                f"{x['prefill_s']:.3f}",
                f"{x['decode_tokens_per_s']:.0f}",
                f"{x['roofline_tokens_per_s']:.0f}",
                f"{100 * x['decode_tokens_per_s'] / x['roofline_tokens_per_s']:.1f}%",
                f"{_gb(x['sample_estimate_bytes'])} / {_gb(x['sample_peak_bytes'])}",
                x["micro_batches"],
                f"{x['update_s']:.3f}",
                f"{x['update_tokens_per_s']:.0f}",
                f"{100 * x['mfu']:.1f}%",
                f"{_gb(x['update_estimate_bytes'])} / {_gb(x['update_peak_bytes'])}",
            ]
            for x in rows
        ],
    )


def format_engine_table(rows: list[dict]) -> str:
    """Markdown: both engines at long-tail lengths per batch."""
    columns = [
        "B", "max/mean", "static tok/s", "static useful", "static % roofline", "slots",
        "continuous tok/s", "continuous useful", "continuous % roofline", "x static",
        "filled-KV roofline tok/s",
    ]  # fmt: skip
    return bench.markdown_table(
        columns,
        [
            [
                x["batch"],
                f"{x['tail_max_over_mean']:.2f}",
                f"{x['static_tokens_per_s']:.0f}",
                f"{x['static_useful']:.3f}",
                f"{100 * x['static_tokens_per_s'] / x['static_roofline_tokens_per_s']:.1f}",
                x["slots"],
                f"{x['continuous_tokens_per_s']:.0f}",
                f"{x['continuous_useful']:.3f}",
                f"{100 * x['continuous_tokens_per_s'] / x['continuous_roofline_tokens_per_s']:.1f}",
                f"{x['continuous_tokens_per_s'] / x['static_tokens_per_s']:.2f}",
                f"{x['filled_roofline_tokens_per_s']:.0f}",
            ]
            for x in rows
        ],
    )


MESH_PROMPTS = [
    [5, 6, 7],
    [8, 9, 10, 11],
    [3],
    [20, 21, 22, 23, 24],
    [1, 2],
    [7] * 6,
    [9, 8],
    [3] * 7,
]
# Shard 0 (rows 0-3 on data = 2) runs 29 decode steps, shard 1 (rows 4-7) 19.
MESH_LIMITS = [2, 30, 5, 11, 3, 7, 1, 20]


def mesh_sampling_check(preset: str = "tiny-1m") -> dict[str, dict]:
    """Top-p and top-k + top-p with both engines on ``data`` x ``tensor`` and ``data`` x
    ``fsdp`` meshes of the first 4 devices, against one device.

    Returns:
      {"method/engine/mesh": {lengths, same_tokens, same_mask, logprob_diff}}.
    """
    from rl_batch.models import sharding

    devices = jax.devices()[:4]
    if len(devices) < 4:
        raise ValueError(f"--mesh_check needs 4 devices, found {len(devices)}")
    mc = model_lib.get_preset(preset)
    kwargs = dict(eos_id=mc.vocab_size, pad_id=0, max_prompt_len=8, max_new_tokens=32)
    params = jax.device_put(model_lib.init_params(mc, 0), devices[0])
    methods = {
        "top_p": sampler_lib.SamplingConfig(temperature=0.8, top_p=0.9),
        "top_k_top_p": sampler_lib.SamplingConfig(temperature=0.8, top_k=20, top_p=0.9),
    }
    results = {}
    for method, base in methods.items():
        for engine in ("static", "continuous"):
            sampling = dataclasses.replace(base, engine=engine, slots=4 * (engine == "continuous"))
            ref = sampler_lib.Sampler(mc, **kwargs)(
                params, MESH_PROMPTS, rng=jax.random.key(1), sampling=sampling,
                max_new_tokens=MESH_LIMITS,
            )  # fmt: skip
            for name, shape in (("data_x_tensor", (2, 1, 2)), ("data_x_fsdp", (2, 2, 1))):
                mesh = sharding.make_mesh(*shape, devices=devices)
                out = sampler_lib.Sampler(mc, mesh=mesh, **kwargs)(
                    jax.device_put(params, sharding.param_shardings(mc, mesh)),
                    MESH_PROMPTS, rng=jax.random.key(1), sampling=sampling,
                    max_new_tokens=MESH_LIMITS,
                )  # fmt: skip
                results[f"{method}/{engine}/{name}"] = dict(
                    lengths=out.lengths.tolist(),
                    same_tokens=bool((out.response_tokens == ref.response_tokens).all()),
                    same_mask=bool((out.response_mask == ref.response_mask).all()),
                    logprob_diff=float(np.abs(out.response_logprobs - ref.response_logprobs).max()),
                )
                print(
                    f"mesh_check {method}/{engine}/{name}: {results[f'{method}/{engine}/{name}']}"
                )
    return results


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if flags.FLAGS.mesh_check:
        results = mesh_sampling_check()
        if flags.FLAGS.out:
            with open(flags.FLAGS.out, "w") as f:
                json.dump({"device": jax.devices()[0].device_kind, "cases": results}, f, indent=1)
        ok = all(r["same_tokens"] and r["same_mask"] for r in results.values())
        print(f"mesh_check: {len(results)} cases, tokens {'equal' if ok else 'DIFFER'}")
        if not ok:
            raise SystemExit(1)
        return
    values = {name: getattr(flags.FLAGS, name) for name in _FLAG_HELP}
    values["batches"] = tuple(int(b) for b in values["batches"])
    settings = Settings(**values)
    rows = run(settings)
    out = flags.FLAGS.out
    if out:
        with open(out, "w") as f:
            json.dump(
                {"device": jax.devices()[0].device_kind, "settings": dataclasses.asdict(settings)}
                | {"rows": rows},
                f,
                indent=1,
            )
        print(f"wrote {out}")


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
