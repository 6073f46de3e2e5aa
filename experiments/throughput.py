r"""Throughput benchmarks, one part per component.

  python -m experiments.throughput --part=sampler [--max_batch=1024] [--out=throughput.json]
  python -m experiments.throughput --part=engine [--engine_rows=64 --slots=8,16,32]

``--part=engine``: static against continuous batching (and full against blocked decode
attention) at forced long-tail response lengths; see ``run_engine``.

``--part=widths``: the seconds of one decode step at each width of ``--batches`` (both
engines, every row ``--new_tokens`` long, interleaved): what a narrow loop in the
continuous engine's tail costs per row against a wide one; see ``run_widths``.

``--part=sampler``: tokens/s of ``rl_batch.rollout.sampler.Sampler`` against Hugging Face
``generate`` (PyTorch CPU, KV cache, sampling) on the same Qwen3 weights, for a range of
batch sizes, plus the FLOP/s achieved while decoding against a large jitted matmul
measured in the same run.

Timing (``rl_batch.bench``): ours runs once per batch size to warm up (the jit compile),
HF once in total; then each is repeated until ``--min_repeats`` (``--hf_min_repeats``)
runs and ``--min_time_s`` seconds are reached and the median wall time is reported, with
the median process CPU time (all threads) beside it: on a machine shared with other jobs
CPU time per token says more about efficiency than wall time. HF runs with each of
``--hf_threads`` torch thread counts and the fastest counts. Each batch size runs ours
then HF back to back so both see the same load. On a CPU host JAX gets one device per
core (``--cpu_devices``) and our sampler splits the batch over them
(``--data_devices``), as HF's torch threads split its work over the cores; the same
sampler on one device is timed beside it. The matmul peak is re-measured before
every batch size and the best value of the run is the denominator of "% matmul".

The JSON written by ``--out`` has the layout ``rl_batch.analysis`` reads::

    {"device": str,
     "generation": [{"batch", "tokens_per_s", "time_s", "new_tokens"}],
     "update": [],
     "hf_generation": [{"batch", "tokens_per_s", "time_s", "new_tokens"}],
     "sampler_details": [...], "matmul_flops_per_s": float, "settings": {...}}

An existing file is updated in place: keys written by other parts are kept.

To add a part, write ``run_<part>(settings) -> dict`` (the JSON keys it fills) and
register it in ``PARTS``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import platform
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from experiments import cli
from rl_batch import bench
from rl_batch.models import flops
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import sampler as sampler_lib

_PART = flags.DEFINE_string("part", "sampler", "Which benchmark to run: a key of PARTS.")
_PRESET = flags.DEFINE_string(
    "preset", "tiny-5m", "Model preset (rl_batch.models.transformer.PRESETS)."
)
_VOCAB = flags.DEFINE_integer("vocab_size", 512, "Vocabulary size override.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 16, "Prompt tokens per row.")
_NEW_TOKENS = flags.DEFINE_integer("new_tokens", 32, "Generated tokens per row.")
_BATCHES = flags.DEFINE_list("batches", None, "Batch sizes (default: 1, 2, 4, ... max_batch).")
_MAX_BATCH = flags.DEFINE_integer("max_batch", 1024, "Largest batch of the default list.")
_HF = flags.DEFINE_bool("hf", True, "Also time Hugging Face generate (needs torch).")
_MIN_REPEATS = flags.DEFINE_integer("min_repeats", 2, "Timed runs per point, at least.")
_HF_MIN_REPEATS = flags.DEFINE_integer("hf_min_repeats", 1, "Timed HF runs per point, at least.")
_HF_THREADS = flags.DEFINE_list(
    "hf_threads",
    None,
    "torch thread counts to try for HF; the fastest counts (default: the core count and 1, "
    "because torch's OpenMP threads slow down badly when other processes share the cores).",
)
_MIN_TIME = flags.DEFINE_float("min_time_s", 1.0, "Timed seconds per point, at least.")
_MATMUL = flags.DEFINE_integer("matmul_size", 2048, "Square matmul size for the peak FLOP/s.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed for weights, prompts and sampling.")
_OUT = flags.DEFINE_string("out", None, "Write (merge) results into this JSON file.")
_CPU_DEVICES = flags.DEFINE_integer(
    "cpu_devices",
    0,
    "CPU host devices to create (jax_num_cpu_devices): 0 = $JAX_NUM_CPU_DEVICES if set, "
    "else one per core, so that a CPU host samples data-parallel over its cores. No effect "
    "on accelerators.",
)
_ENGINE_ROWS = flags.DEFINE_integer("engine_rows", 64, "--part=engine: rows (responses).")
_SLOTS = flags.DEFINE_list("slots", ["8", "16", "32"], "--part=engine: continuous slot counts.")
_LENGTH_SIGMA = flags.DEFINE_float(
    "length_sigma", 1.0, "--part=engine: sigma of the log-normal response lengths."
)
_ATTN_BLOCKS = flags.DEFINE_list(
    "attn_blocks",
    ["0", "32"],
    "--part=engine: decode attention modes every engine runs in: 0 full attention, K > 0 "
    "blocked attention in blocks of K slots.",
)
_MIN_SLOTS = flags.DEFINE_list(
    "min_slots",
    [str(sampler_lib.SamplingConfig.min_slots)],
    "--part=engine: the continuous engine's narrowest loop (SamplingConfig.min_slots); a "
    "list runs each (labels end in 'mN').",
)
_WIDTHS_PER_HALVING = flags.DEFINE_list(
    "widths_per_halving",
    [str(sampler_lib.SamplingConfig.widths_per_halving)],
    "--part=engine: the continuous engine's loop widths per halving of its slots "
    "(SamplingConfig.widths_per_halving); a list runs each (labels end in 'wN').",
)
_DATA_DEVICES = flags.DEFINE_integer(
    "data_devices",
    -1,
    "Sample data-parallel over this many devices (-1: all of them). With more than one, "
    "the single-device sampler is timed beside it.",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Benchmark settings (the flags, as data, so tests can build them directly)."""

    preset: str = "tiny-5m"
    vocab_size: int = 512
    prompt_len: int = 16
    new_tokens: int = 32
    batches: tuple[int, ...] = tuple(2**i for i in range(11))
    hf: bool = True
    min_repeats: int = 2
    hf_min_repeats: int = 1
    hf_threads: tuple[int, ...] = (os.cpu_count() or 1, 1)
    min_time_s: float = 1.0
    matmul_size: int = 2048
    seed: int = 0
    data_devices: int = 1  # sampler batch split over a mesh ``data`` axis of this size (-1: all)
    engine_rows: int = 64  # --part=engine: responses per call
    slots: tuple[int, ...] = (8, 16, 32)  # --part=engine: continuous slot counts
    length_sigma: float = 1.0  # --part=engine: log-normal sigma of the forced lengths
    attn_blocks: tuple[int, ...] = (0, 32)  # --part=engine: attention modes (0: full)
    # --part=engine: the continuous engine's narrowest loops, each timed
    min_slots: tuple[int, ...] = (sampler_lib.SamplingConfig.min_slots,)
    # --part=engine: loop widths per halving of the continuous engine's slots, each timed
    widths_per_halving: tuple[int, ...] = (sampler_lib.SamplingConfig.widths_per_halving,)


# ---------------------------------------------------------------------------- measuring


def weight_matmul_seconds(
    config: model_lib.ModelConfig,
    rows: int,
    steps: int,
    mesh: jax.sharding.Mesh | None = None,
    repeats: int = 3,
) -> float:
    """Best-of-``repeats`` seconds of the model's weight matmuls alone, ``steps`` in a row.

    A step runs every layer's q, k, v, o, gate, up and down projections and the LM head
    on [rows, D] activations (rows split over the mesh's ``data`` axis when a mesh is
    given), each matmul feeding the next as in the model, with no attention, norms,
    cache or sampling: a floor, on this machine's matmul kernels, for any sampler that
    computes the same projections in the same batch layout.
    """
    d, n, k = config.hidden_size, config.num_heads, config.num_kv_heads
    shapes = flops.layer_matmul_shapes(config)
    keys = iter(jax.random.split(jax.random.key(0), 7 * config.num_layers + 2))
    layers = [
        {name: 0.02 * jax.random.normal(next(keys), shape) for name, shape in shapes.items()}
        for _ in range(config.num_layers)
    ]
    head_dv = 0.02 * jax.random.normal(next(keys), (d, config.vocab_size))

    def step(_, x_rd):
        for w in layers:
            q_rq, k_rk, v_rk = x_rd @ w["q"], x_rd @ w["k"], x_rd @ w["v"]
            a_rq = q_rq + jnp.tile(k_rk + v_rk, (1, n // k))  # keeps k and v live
            x_rd = x_rd + a_rq @ w["o"]
            x_rd = x_rd + (jax.nn.silu(x_rd @ w["gate"]) * (x_rd @ w["up"])) @ w["down"]
        return x_rd + jnp.mean(x_rd @ head_dv, axis=-1, keepdims=True)

    def chain(x_rd):
        return jax.lax.fori_loop(0, steps, step, x_rd)

    x_rd = jax.random.normal(next(keys), (rows, d))
    if mesh is not None:
        spec = jax.sharding.PartitionSpec("data")
        chain = jax.shard_map(chain, mesh=mesh, in_specs=spec, out_specs=spec)
        x_rd = jax.device_put(x_rd, jax.sharding.NamedSharding(mesh, spec))
    fn = jax.jit(chain)
    fn(x_rd).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(x_rd).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def device_description() -> str:
    """E.g. ``cpu:cpu x1 (x86_64, 2 cores)``."""
    dev = jax.devices()[0]
    host = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return f"{dev.platform}:{dev.device_kind} x{jax.device_count()} ({host})"


# ------------------------------------------------------------------------ Hugging Face


def hf_qwen3(config: model_lib.ModelConfig, params: model_lib.Params):
    """A ``transformers.Qwen3ForCausalLM`` (float32, eval mode) with our weights.

    Our projections are stored input-major (``q_dnh``: [D, N, H]); torch ``Linear``
    weights are [out, in], so each is reshaped to 2-D and transposed.
    """
    params = model_lib.unstack_layers(params)
    import torch
    import transformers

    if not config.qk_norm or config.qkv_bias:
        raise ValueError(f"hf_qwen3 needs a Qwen3-style config (qk_norm, no qkv bias): {config}")
    d, n, k, h = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
    hf_config = transformers.Qwen3Config(
        vocab_size=config.vocab_size,
        hidden_size=d,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=n,
        num_key_value_heads=k,
        head_dim=h,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        rms_norm_eps=config.rms_norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        max_position_embeddings=config.max_seq_len,
        attention_bias=False,
        use_sliding_window=False,
    )
    hf_config._attn_implementation = "sdpa"
    model = transformers.Qwen3ForCausalLM(hf_config).to(torch.float32).eval()

    def t(x) -> torch.Tensor:
        return torch.from_numpy(np.array(x, dtype=np.float32))

    state = {"model.embed_tokens.weight": t(params["embed_vd"])}
    state["model.norm.weight"] = t(params["final_norm"]["scale"])
    if not config.tie_embeddings:
        state["lm_head.weight"] = t(params["lm_head_dv"]).T
    for i in range(config.num_layers):
        layer = params["layers"][i]
        attn, mlp = layer["attn"], layer["mlp"]
        pre = f"model.layers.{i}."
        state[pre + "input_layernorm.weight"] = t(layer["input_norm"]["scale"])
        state[pre + "post_attention_layernorm.weight"] = t(layer["post_attn_norm"]["scale"])
        state[pre + "self_attn.q_proj.weight"] = t(attn["q_dnh"]).reshape(d, n * h).T
        state[pre + "self_attn.k_proj.weight"] = t(attn["k_dkh"]).reshape(d, k * h).T
        state[pre + "self_attn.v_proj.weight"] = t(attn["v_dkh"]).reshape(d, k * h).T
        state[pre + "self_attn.o_proj.weight"] = t(attn["o_nhd"]).reshape(n * h, d).T
        state[pre + "self_attn.q_norm.weight"] = t(attn["q_norm"]["scale"])
        state[pre + "self_attn.k_norm.weight"] = t(attn["k_norm"]["scale"])
        state[pre + "mlp.gate_proj.weight"] = t(mlp["gate_df"]).T
        state[pre + "mlp.up_proj.weight"] = t(mlp["up_df"]).T
        state[pre + "mlp.down_proj.weight"] = t(mlp["down_fd"]).T
    missing, unexpected = model.load_state_dict(
        {key: value.contiguous() for key, value in state.items()}, strict=False
    )
    missing = [key for key in missing if key != "lm_head.weight" or not config.tie_embeddings]
    if missing or unexpected:
        raise ValueError(f"HF weight conversion: missing {missing}, unexpected {unexpected}")
    if config.tie_embeddings:
        model.tie_weights()
    return model


def hf_max_logit_error(
    config: model_lib.ModelConfig, params: model_lib.Params, hf_model, tokens_bt: np.ndarray
) -> float:
    """Largest |logit difference| between our forward pass and the HF model's."""
    import torch

    ours_btv = np.asarray(model_lib.forward(config, params, jnp.asarray(tokens_bt)))
    with torch.inference_mode():
        theirs_btv = hf_model(torch.from_numpy(tokens_bt.astype(np.int64))).logits.numpy()
    return float(np.abs(ours_btv - theirs_btv).max())


# ----------------------------------------------------------------------------- parts


def run_sampler(settings: Settings) -> dict:
    """Sampler tokens/s vs HF generate, and decode FLOP/s vs the matmul peak."""
    config = model_lib.get_preset(settings.preset, vocab_size=settings.vocab_size)
    params = model_lib.init_params(config, settings.seed)
    p_len, new = settings.prompt_len, settings.new_tokens
    data_devices = jax.device_count() if settings.data_devices == -1 else settings.data_devices
    samplers = {1: _make_sampler(config, p_len, new)}
    placed = {1: params}
    if data_devices > 1:
        from rl_batch.models import sharding

        mesh = sharding.make_mesh(data=data_devices, devices=jax.devices()[:data_devices])
        samplers[data_devices] = _make_sampler(config, p_len, new, mesh)
        placed[data_devices] = jax.device_put(params, sharding.param_shardings(config, mesh))
    sampler = samplers[data_devices]  # the headline: every device this run was given
    peak = flops.time_matmul_flops(settings.matmul_size, repeats=5)
    print(
        f"model {settings.preset} (V={config.vocab_size}, {config.num_params / 1e6:.2f}M params), "
        f"prompt {p_len}, {new} new tokens, device {device_description()}, "
        f"sampling data-parallel over {data_devices} device(s), engine "
        f"{SAMPLER_PART_SAMPLING.engine} (attn_block {SAMPLER_PART_SAMPLING.attn_block})"
    )

    hf_model = None
    if settings.hf:
        import torch

        hf_model = hf_qwen3(config, params)
        check = np.random.RandomState(settings.seed).randint(0, config.vocab_size, (2, p_len))
        err = hf_max_logit_error(config, params, hf_model, check)
        print(f"HF parity: max |logit difference| {err:.2e} on a [2, {p_len}] batch")
        if err > 1e-3:
            raise RuntimeError(f"HF model disagrees with ours (max logit error {err})")
        _hf_generate(hf_model, check, new, settings.seed)  # warm-up; HF has nothing to compile

    # Decode FLOPs per generated token after the first (the first comes from prefill).
    s_len = p_len + sampler.buckets(1, p_len, new)[2]
    # The decode attends over the whole fixed-size cache (S = P + R slots): that is the
    # work it does.
    decode_flops = flops.model_flops_per_token(config, s_len)
    prompts_rng = np.random.RandomState(settings.seed + 1)
    generation, hf_generation, details = [], [], []
    for batch in settings.batches:
        prompts_bp = prompts_rng.randint(0, config.vocab_size, (batch, p_len))
        prompts = prompts_bp.tolist()
        # The machine is shared: re-measure the matmul peak next to every point.
        row_peak = flops.time_matmul_flops(settings.matmul_size, repeats=3)
        peak = max(peak, row_peak)
        timed = {
            n: _time_sampler(samplers[n], placed[n], prompts, new, settings)
            for n in sorted(samplers, reverse=True)
        }
        time_s, cpu_s, stats, repeats = timed[data_devices]
        decode_s = bench.median([s["decode_s"] for s in stats])
        # The same projections with nothing else: prefill's B x P rows once, then R - 1
        # decode steps of B rows (bucketed sizes, split over the same devices).
        rows, p_bucket, _ = sampler.buckets(batch, p_len, new)
        floor_s = weight_matmul_seconds(
            config, rows * p_bucket, 1, sampler.mesh
        ) + weight_matmul_seconds(config, rows, new - 1, sampler.mesh)
        tokens = batch * new
        generation.append(
            {"batch": batch, "tokens_per_s": tokens / time_s, "time_s": time_s, "new_tokens": new}
        )
        details.append(
            {
                "batch": batch,
                "data_devices": data_devices,
                "single_device_time_s": timed[1][0],
                "matmul_floor_s": floor_s,
                "cpu_s": cpu_s,
                "prefill_s": bench.median([s["prefill_s"] for s in stats]),
                "decode_s": decode_s,
                "decode_tokens_per_s": batch * (new - 1) / decode_s,
                "decode_flops_per_s": batch * (new - 1) / decode_s * decode_flops,
                "matmul_flops_per_s_nearby": row_peak,
                "repeats": repeats,
                # (the engine the sampler ran: the static one, SamplingConfig's default)
                "engine": stats[0]["engine"],
                "slots": stats[0]["slots"],
                "attn_block": SAMPLER_PART_SAMPLING.attn_block,
            }
        )
        line = f"batch {batch}: ours {tokens / time_s:.0f} tok/s ({repeats} runs)"
        if data_devices > 1:
            line += f", ours on 1 device {tokens / timed[1][0]:.0f} tok/s"
        line += f", its matmuls alone {tokens / floor_s:.0f} tok/s"
        if hf_model is not None:
            by_threads, cpu_by_threads, prefill_by_threads = {}, {}, {}
            for threads in dict.fromkeys(settings.hf_threads):
                torch.set_num_threads(threads)
                hf = bench.time_calls(
                    lambda i, x=prompts_bp: _hf_generate(hf_model, x, new, settings.seed + i),
                    min_repeats=settings.hf_min_repeats,
                    min_time_s=settings.min_time_s,
                    warmup=False,
                )
                by_threads[threads] = hf.median_s
                cpu_by_threads[threads] = hf.median_cpu_s
                # HF's prefill: the same call with one new token (prompt forward, one
                # sample), the counterpart of our prefill_s.
                prefill_by_threads[threads] = bench.time_calls(
                    lambda i, x=prompts_bp: _hf_generate(hf_model, x, 1, settings.seed + i),
                    min_repeats=max(3, settings.hf_min_repeats),
                    min_time_s=settings.min_time_s / 4,
                    warmup=False,
                ).median_s
            threads, hf_time_s = min(by_threads.items(), key=lambda item: item[1])
            hf_decode_s = hf_time_s - prefill_by_threads[threads]
            hf_generation.append(
                {"batch": batch, "tokens_per_s": tokens / hf_time_s, "time_s": hf_time_s}
                | {"new_tokens": new, "threads": threads, "cpu_s": cpu_by_threads[threads]}
                | {"prefill_s": prefill_by_threads[threads], "decode_s": hf_decode_s}
                | {"decode_tokens_per_s": batch * (new - 1) / hf_decode_s}
                | {"time_s_by_threads": {str(t): v for t, v in by_threads.items()}}
            )
            line += ", HF " + ", ".join(
                f"{tokens / v:.0f} tok/s ({t} threads)" for t, v in by_threads.items()
            )
        print(line, flush=True)

    for row in details:
        row["fraction_of_matmul_peak"] = row["decode_flops_per_s"] / peak
    print(f"\nmatmul {settings.matmul_size}^2 f32, best in this run: {peak / 1e9:.1f} GFLOP/s")
    print(format_table(generation, hf_generation, details))
    return {
        "device": device_description(),
        "generation": generation,
        "hf_generation": hf_generation,
        "sampler_details": details,
        "matmul_flops_per_s": peak,
        "settings": dataclasses.asdict(settings) | {"decode_flops_per_token": decode_flops},
    }


# The engine ``--part=sampler`` times: the static one (a batch sharded over the data
# devices, which the continuous engine does not do yet); ``--part=engine`` compares them.
SAMPLER_PART_SAMPLING = sampler_lib.SamplingConfig()


def _make_sampler(
    config: model_lib.ModelConfig, prompt_len: int, new_tokens: int, mesh=None
) -> sampler_lib.Sampler:
    # eos_id outside the vocabulary: every row generates exactly `new_tokens` tokens,
    # like HF with min_new_tokens == max_new_tokens.
    return sampler_lib.Sampler(
        config,
        eos_id=config.vocab_size,
        pad_id=0,
        max_prompt_len=prompt_len,
        max_new_tokens=new_tokens,
        mesh=mesh,
    )


def _time_sampler(
    sampler: sampler_lib.Sampler,
    params: model_lib.Params,
    prompts: list[list[int]],
    new_tokens: int,
    settings: Settings,
) -> tuple[float, float, list[dict], int]:
    """(median wall s, median CPU s, per-call ``last_stats``, timed calls) of one batch."""
    stats: list[dict] = []

    def call(i: int) -> None:
        key = jax.random.fold_in(jax.random.key(settings.seed), i + 1)
        out = sampler(params, prompts, rng=key, sampling=SAMPLER_PART_SAMPLING)
        assert int(out.lengths.min()) == new_tokens, out.lengths
        if i >= 0:
            stats.append(dict(sampler.last_stats))

    timed = bench.time_calls(call, min_repeats=settings.min_repeats, min_time_s=settings.min_time_s)
    return timed.median_s, timed.median_cpu_s, stats, timed.repeats


def format_table(generation: list[dict], hf_generation: list[dict], details: list[dict]) -> str:
    """The sampler table: throughput vs HF (wall and CPU time), decode FLOP/s vs matmul.

    "ours" samples data-parallel over every device the run was given (the CPU host's
    cores, see ``--cpu_devices``); "1-dev" is the same sampler on one device, timed
    in the same run; "matmuls" is the rate if a call cost only its weight matmuls
    (``weight_matmul_seconds``: a ceiling for this layout on this machine's kernels);
    "ratio" is ours / HF for the whole call (prefill included, the headline); the
    "decode" columns leave out the prefill on both sides (HF's prefill is timed as the
    same ``generate`` call with one new token) and "dec ratio" compares those.
    """
    hf = {row["batch"]: row for row in hf_generation}
    nan = float("nan")
    nan_row = {"tokens_per_s": nan, "cpu_s": nan, "threads": 0, "decode_tokens_per_s": nan}
    engines = dict.fromkeys(
        f"{d.get('engine', 'static')} (attn_block {d.get('attn_block', 0)})" for d in details
    )
    columns = [
        "batch", "ours tok/s", "1-dev tok/s", "matmuls tok/s", "HF tok/s", "thr", "ratio",
        "decode tok/s", "HF decode", "dec ratio", "ours tok/cpu-s", "HF tok/cpu-s", "ratio",
        "decode GFLOP/s", "% matmul",
    ]  # fmt: skip
    rows = []
    for row, detail in zip(generation, details):
        theirs = hf.get(row["batch"], nan_row)
        tokens = row["batch"] * row["new_tokens"]
        ours_cpu, hf_cpu = tokens / detail["cpu_s"], tokens / theirs["cpu_s"]
        ours_dec, hf_dec = detail["decode_tokens_per_s"], theirs["decode_tokens_per_s"]
        rows.append(
            [
                row["batch"],
                f"{row['tokens_per_s']:.0f}",
                f"{tokens / detail['single_device_time_s']:.0f}",
                f"{tokens / detail['matmul_floor_s']:.0f}",
                f"{theirs['tokens_per_s']:.0f}",
                theirs["threads"],
                f"{row['tokens_per_s'] / theirs['tokens_per_s']:.2f}",
                f"{ours_dec:.0f}",
                f"{hf_dec:.0f}",
                f"{ours_dec / hf_dec:.2f}",
                f"{ours_cpu:.0f}",
                f"{hf_cpu:.0f}",
                f"{ours_cpu / hf_cpu:.2f}",
                f"{detail['decode_flops_per_s'] / 1e9:.1f}",
                f"{100 * detail['fraction_of_matmul_peak']:.1f}%",
            ]
        )
    engine_line = f"sampler engine: {', '.join(engines) or 'static'}"
    return engine_line + "\n" + bench.markdown_table(columns, rows)


def _hf_generate(hf_model, prompts_bp: np.ndarray, new_tokens: int, seed: int) -> None:
    """HF ``generate``: KV cache, multinomial sampling at temperature 1, no filters."""
    import torch

    torch.manual_seed(seed)
    input_ids = torch.from_numpy(prompts_bp.astype(np.int64))
    with torch.inference_mode():
        out = hf_model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            use_cache=True,
            pad_token_id=0,
            eos_token_id=1,
        )
    assert out.shape == (prompts_bp.shape[0], prompts_bp.shape[1] + new_tokens), out.shape


def run_update(settings: Settings) -> dict:
    """GRPO update time vs training batch (``settings.batches`` responses of P + R tokens).

    One jitted ``grpo.make_update_fn`` step (forward, backward, Adam) on random tokens
    with every response token real; its FLOPs are ``rl_batch.models.flops.update_flops`` (3x the
    forward), compared with the matmul rate measured in the same process.
    """
    from rl_batch.algorithms import grpo, learner
    from rl_batch.models import sharding

    config = model_lib.get_preset(settings.preset, vocab_size=settings.vocab_size)
    p_len, r_len = settings.prompt_len, settings.new_tokens
    mesh = sharding.make_mesh()
    optimizer = learner.make_optimizer(lr=1e-5, max_grad_norm=1.0)
    update_fn = grpo.make_update_fn(config, grpo.GRPOConfig(), optimizer, mesh)
    params = model_lib.init_params(config, settings.seed)
    state = learner.init_train_state(config, params, optimizer, mesh=mesh)
    peak = flops.measure_matmul_flops(settings.matmul_size)
    print(
        f"update: model {settings.preset} ({config.num_params / 1e6:.2f}M params), prompt "
        f"{p_len} + response {r_len} tokens, device {device_description()}"
    )
    rng = np.random.RandomState(settings.seed + 2)
    rows = []
    for batch in settings.batches:
        shards = sharding.batch_shard_count(mesh)
        if batch % shards:
            print(f"batch {batch}: skipped (not divisible by {shards} batch shards)")
            continue
        data = learner.Batch(
            prompt_tokens=jnp.asarray(rng.randint(0, config.vocab_size, (batch, p_len))),
            prompt_mask=jnp.ones((batch, p_len), bool),
            response_tokens=jnp.asarray(rng.randint(0, config.vocab_size, (batch, r_len))),
            response_mask=jnp.ones((batch, r_len), bool),
            advantages=jnp.asarray(rng.standard_normal(batch), jnp.float32),
            old_logprobs=jnp.full((batch, r_len), -np.log(config.vocab_size), jnp.float32),
        )
        data = sharding.shard_batch(data, mesh)

        def step(i: int, data=data) -> None:
            nonlocal state  # the update donates its input state
            state, metrics = update_fn(state, data, jax.random.key(max(i, 0)))
            jax.block_until_ready(metrics)

        timed = bench.time_calls(
            step, min_repeats=settings.min_repeats, min_time_s=settings.min_time_s
        )
        time_s = timed.median_s
        tokens = batch * (p_len + r_len)
        upd_flops = flops.update_flops(config, tokens=tokens, seq_len=p_len + r_len)
        rows.append(
            {
                "batch": batch,
                "time_s": time_s,
                "tokens": tokens,
                "tokens_per_s": tokens / time_s,
                "cpu_s": timed.median_cpu_s,
                "flops_per_s": upd_flops / time_s,
                "fraction_of_matmul_peak": upd_flops / time_s / peak,
                "repeats": timed.repeats,
            }
        )
        print(f"batch {batch}: {time_s:.3f} s, {tokens / time_s:.0f} tok/s", flush=True)
    print(format_update_table(rows))
    return {
        "device": device_description(),
        "update": rows,
        "matmul_flops_per_s": peak,
        "update_settings": dataclasses.asdict(settings)
        | {"update_flops_per_token": flops.update_flops(config, tokens=1, seq_len=p_len + r_len)},
    }


def format_update_table(rows: list[dict]) -> str:
    """The update table: time, tokens/s and FLOP/s against the matmul rate per batch."""
    columns = ["batch", "time s", "tokens", "tok/s", "tok/cpu-s", "GFLOP/s", "% matmul"]
    return bench.markdown_table(
        columns,
        [
            [
                row["batch"],
                f"{row['time_s']:.3f}",
                row["tokens"],
                f"{row['tokens_per_s']:.0f}",
                f"{row['tokens'] / row['cpu_s']:.0f}",
                f"{row['flops_per_s'] / 1e9:.1f}",
                f"{100 * row['fraction_of_matmul_peak']:.1f}%",
            ]
            for row in rows
        ],
    )


def run_all(settings: Settings) -> dict:
    """The sampler and update parts, one JSON (generation and update side by side)."""
    results = run_sampler(settings)
    update = run_update(settings)
    results["update"] = update["update"]
    results["update_settings"] = update["update_settings"]
    results["matmul_flops_per_s"] = max(results["matmul_flops_per_s"], update["matmul_flops_per_s"])
    return results


def engine_configs(settings: Settings) -> list[tuple[str, sampler_lib.SamplingConfig]]:
    """(label, sampling config) of each engine the part times: static, then continuous
    at each slot count, each ``min_slots`` and each ``widths_per_halving`` (labelled
    ``mN`` and ``wN`` when more than one is given), each in every attention mode of
    ``attn_blocks`` (0: full)."""

    def label(name: str, block: int, cfg: sampler_lib.SamplingConfig | None = None) -> str:
        name += f" blk{block}" if block else ""
        if cfg is not None and len(settings.min_slots) > 1:
            name += f" m{cfg.min_slots}"
        if cfg is not None and len(settings.widths_per_halving) > 1:
            name += f" w{cfg.widths_per_halving}"
        return name

    configs = [
        (label("static", b), sampler_lib.SamplingConfig(attn_block=b)) for b in settings.attn_blocks
    ]
    for slots, m, k, b in itertools.product(
        settings.slots, settings.min_slots, settings.widths_per_halving, settings.attn_blocks
    ):
        cfg = sampler_lib.SamplingConfig(
            engine="continuous", slots=slots, attn_block=b, min_slots=m, widths_per_halving=k
        )
        configs.append((label(f"continuous {slots}", b, cfg), cfg))
    return configs


def run_engine(settings: Settings) -> dict:
    """Static against continuous batching at forced long-tail response lengths.

    ``engine_rows`` responses with log-normal lengths (``long_tail_lengths``; the longest
    is ``new_tokens``) are sampled by every engine of ``engine_configs``, interleaved in
    one process (``bench.time_interleaved``): each round calls every engine once, and each
    engine's median wall time over the rounds is reported. Every engine must give the
    static engine's tokens. Columns (``format_engine_table``): the seconds JAX spent
    compiling the engine's first call (``bench.compile_seconds``), generated tokens/s
    (all tokens of the call over its wall time), the speedup over the fastest static
    attention mode and its share of the count-of-work ideal (``ideal_speedup``), the
    useful-token fraction (tokens of decode steps / slot-steps), cache bytes read by decode
    attention per generated token, and the median 1-minute host load (``bench.load_1min``)
    read before each engine's timed calls.
    """
    rows, p_len, r_len = settings.engine_rows, settings.prompt_len, settings.new_tokens
    config = model_lib.get_preset(settings.preset, vocab_size=settings.vocab_size)
    config = config.replace(max_seq_len=max(config.max_seq_len, p_len + r_len))
    params = model_lib.init_params(config, settings.seed)
    lengths = sampler_lib.long_tail_lengths(rows, r_len, settings.length_sigma, settings.seed)
    rng = np.random.RandomState(settings.seed + 1)
    prompts = rng.randint(1, config.vocab_size, (rows, p_len)).tolist()
    sampler = _make_sampler(config, p_len, r_len)
    slot_bytes = model_lib.kv_cache_bytes(config, 1, 1)
    ideal = ideal_speedup(lengths)
    print(
        f"engine: model {settings.preset} ({config.num_params / 1e6:.2f}M params), {rows} rows, "
        f"prompt {p_len}, lengths log-normal sigma {settings.length_sigma}: mean "
        f"{lengths.mean():.1f}, p50 {np.median(lengths):.0f}, max {lengths.max()}, max/mean "
        f"{lengths.max() / lengths.mean():.2f} (count-of-work ideal {ideal:.2f}x); device "
        f"{device_description()}",
        flush=True,
    )
    configs = engine_configs(settings)
    key = jax.random.key(settings.seed)
    reference = None
    compile_s = {}
    for label, cfg in configs:  # warm-up (compile) and the equality check
        with bench.compile_seconds() as compiled:
            out = sampler(params, prompts, rng=key, sampling=cfg, max_new_tokens=lengths.tolist())
        compile_s[label] = compiled["s"]
        np.testing.assert_array_equal(out.lengths, lengths)
        if reference is None:
            reference = out.response_tokens
        np.testing.assert_array_equal(out.response_tokens, reference, err_msg=label)
    stats: dict[str, dict] = {}

    def call(label: str, cfg: sampler_lib.SamplingConfig) -> None:
        sampler(params, prompts, rng=key, sampling=cfg, max_new_tokens=lengths.tolist())
        stats[label] = dict(sampler.last_stats)

    timed = bench.time_interleaved(
        {label: (lambda _, label=label, cfg=cfg: call(label, cfg)) for label, cfg in configs},
        min_repeats=settings.min_repeats,
        min_time_s=settings.min_time_s,
    )
    generated = int(lengths.sum())
    table = []
    for label, cfg in configs:
        st, time_s = stats[label], timed[label].median_s
        decode_tokens = max(st["decode_tokens"], 1)
        table.append(
            {
                "engine": label,
                "slots": st["slots"],
                "attn_block": cfg.attn_block,
                "min_slots": cfg.min_slots,
                "widths_per_halving": cfg.widths_per_halving,
                "time_s": time_s,
                "compile_s": compile_s[label],
                "tokens_per_s": generated / time_s,
                "useful_fraction": decode_tokens / max(st["slot_steps"], 1),
                "cache_bytes_per_token": st["slots_read"]
                * slot_bytes
                / max(st["decode_tokens"], 1),
                "decode_steps": st["decode_steps"],
                "load_1min": timed[label].median_load1,
                "repeats": timed[label].repeats,
                "times_s": list(timed[label].time_s),  # one per round, in round order
            }
        )
    print(format_engine_table(table, ideal))
    return {
        "device": device_description(),
        "engine": table,
        "engine_settings": dataclasses.asdict(settings)
        | {
            "lengths_mean": float(lengths.mean()),
            "lengths_max": int(lengths.max()),
            "ideal_speedup": ideal,
        },
    }


def run_widths(settings: Settings) -> dict:
    """Seconds per decode step at each width W of ``batches``: W rows of ``new_tokens``
    tokens each (no row ends early, so every step decodes all W), with the static engine
    and the continuous one (``slots`` = W: one loop), in the first attention mode of
    ``attn_blocks``, interleaved (``bench.time_interleaved``). Each call's median time
    over its ``new_tokens`` - 1 decode steps (prefill included: one step's worth) gives
    ms/step, and ms/step / W the cost of one row-step. The continuous engine's tail runs
    at narrow widths, so where a row-step costs more there, fewer idle slots (a higher
    useful fraction) saves less time than their count."""
    p_len, r_len = settings.prompt_len, settings.new_tokens
    config = model_lib.get_preset(settings.preset, vocab_size=settings.vocab_size)
    config = config.replace(max_seq_len=max(config.max_seq_len, p_len + r_len))
    params = model_lib.init_params(config, settings.seed)
    sampler = _make_sampler(config, p_len, r_len)
    block = settings.attn_blocks[0]
    rng, key = np.random.RandomState(settings.seed + 1), jax.random.key(settings.seed)
    calls = {}
    for width in settings.batches:
        prompts = rng.randint(1, config.vocab_size, (width, p_len)).tolist()
        for engine in ("static", "continuous"):
            cfg = sampler_lib.SamplingConfig(engine=engine, attn_block=block)

            def call(_, prompts=prompts, cfg=cfg) -> None:
                out = sampler(params, prompts, rng=key, sampling=cfg, max_new_tokens=r_len)
                assert int(out.lengths.min()) == r_len, out.lengths

            calls[(engine, width)] = call
    print(
        f"widths: model {settings.preset} ({config.num_params / 1e6:.2f}M params), prompt "
        f"{p_len}, {r_len} tokens a row, attn_block {block}; device {device_description()}",
        flush=True,
    )
    timed = bench.time_interleaved(
        calls, min_repeats=settings.min_repeats, min_time_s=settings.min_time_s, warmup=True
    )
    widest = max(settings.batches)
    table = []
    for (engine, width), t in timed.items():
        step_s = t.median_s / max(r_len - 1, 1)
        row = {"engine": engine, "width": width, "attn_block": block, "step_s": step_s}
        row |= {"row_step_s": step_s / width, "load_1min": t.median_load1, "repeats": t.repeats}
        table.append(row)
    wide = {r["engine"]: r["row_step_s"] for r in table if r["width"] == widest}
    print(
        bench.markdown_table(
            ["engine", "W", "ms/step", "ms/row-step", f"x W = {widest}", "load1"],
            [
                [
                    r["engine"],
                    r["width"],
                    f"{r['step_s'] * 1e3:.2f}",
                    f"{r['row_step_s'] * 1e3:.3f}",
                    f"{r['row_step_s'] / wide[r['engine']]:.2f}",
                    f"{r['load_1min']:.2f}",
                ]
                for r in table
            ],
        )
    )
    return {
        "device": device_description(),
        "widths": table,
        "widths_settings": dataclasses.asdict(settings),
    }


def ideal_speedup(lengths: np.ndarray) -> float:
    """The count-of-work ideal of a continuous engine over a static one: the static engine
    decodes every row for the longest row's steps (B x max), a continuous one only each
    row's own tokens (the sum), so the ratio is max / mean of the response lengths."""
    return float(len(lengths) * lengths.max() / lengths.sum())


def format_engine_table(rows: list[dict], ideal: float) -> str:
    """The engine table: each row's speedup over the fastest static row ("x best static"),
    that speedup's share of the count-of-work ``ideal`` ("of ideal", from median times)
    and the least and largest share over the rounds ("rounds": each round's time against
    the fastest static row's time in the same round, ``bench.ratio_summary``)."""
    columns = [
        "engine", "slots", "time s", "compile s", "tok/s", "x best static", "of ideal",
        "rounds", "useful", "KV B/tok", "steps", "load1",
    ]  # fmt: skip
    static = [r for r in rows if r["engine"].startswith("static")]
    best_row = max(static, key=lambda r: r["tokens_per_s"])
    best = best_row["tokens_per_s"]

    def rounds(row: dict) -> str:
        _, lo, hi = bench.ratio_summary(row["times_s"], best_row["times_s"])
        return f"{lo / ideal:.2f}-{hi / ideal:.2f}"

    return bench.markdown_table(
        columns,
        [
            [
                row["engine"],
                row["slots"],
                f"{row['time_s']:.3f}",
                f"{row['compile_s']:.1f}",
                f"{row['tokens_per_s']:.0f}",
                f"{row['tokens_per_s'] / best:.2f}",
                f"{row['tokens_per_s'] / best / ideal:.2f}",
                rounds(row),
                f"{row['useful_fraction']:.3f}",
                f"{row['cache_bytes_per_token']:.0f}",
                row["decode_steps"],
                f"{row['load_1min']:.2f}",
            ]
            for row in rows
        ],
    )


PARTS: dict[str, Callable[[Settings], dict]] = {
    "sampler": run_sampler,
    "engine": run_engine,
    "widths": run_widths,
    "update": run_update,
    "all": run_all,
}


# ------------------------------------------------------------------------------ main


def _ints(flag: flags.FlagHolder) -> tuple[int, ...]:
    """A comma-list flag's values as ints; a ValueError that names the flag otherwise."""
    try:
        return tuple(int(x) for x in flag.value)
    except ValueError:
        raise ValueError(f"--{flag.name}={','.join(flag.value)}: expected integers") from None


def settings_from_flags() -> Settings:
    if _BATCHES.value:
        batches = _ints(_BATCHES)
    else:
        batches = tuple(
            2**i for i in range(_MAX_BATCH.value.bit_length()) if 2**i <= _MAX_BATCH.value
        )
    return Settings(
        preset=_PRESET.value,
        vocab_size=_VOCAB.value,
        prompt_len=_PROMPT_LEN.value,
        new_tokens=_NEW_TOKENS.value,
        batches=batches,
        hf=_HF.value,
        min_repeats=_MIN_REPEATS.value,
        hf_min_repeats=_HF_MIN_REPEATS.value,
        hf_threads=_ints(_HF_THREADS) if _HF_THREADS.value else Settings.hf_threads,
        min_time_s=_MIN_TIME.value,
        matmul_size=_MATMUL.value,
        seed=_SEED.value,
        data_devices=_DATA_DEVICES.value,
        engine_rows=_ENGINE_ROWS.value,
        slots=_ints(_SLOTS),
        length_sigma=_LENGTH_SIGMA.value,
        attn_blocks=_ints(_ATTN_BLOCKS),
        min_slots=_ints(_MIN_SLOTS),
        widths_per_halving=_ints(_WIDTHS_PER_HALVING),
    )


def write_results(path: str, results: dict) -> None:
    """Merges ``results`` into the JSON file at ``path`` (other parts' keys are kept)."""
    merged = {"device": results.get("device", ""), "generation": [], "update": []}
    if os.path.exists(path):
        with open(path) as f:
            merged.update(json.load(f))
    merged.update(results)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(merged, f, indent=1)
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if _PART.value not in PARTS:
        raise app.UsageError(f"--part={_PART.value!r}; expected one of {sorted(PARTS)}")
    if _PART.value in ("engine", "widths") and not _ATTN_BLOCKS.value:
        raise app.UsageError("--attn_blocks is empty; expected attention modes, e.g. 0,32")
    for flag in (_MIN_SLOTS, _WIDTHS_PER_HALVING):
        if _PART.value == "engine" and not flag.value:
            raise app.UsageError(f"--{flag.name} is empty; expected e.g. 1 or 1,2")
    if _CPU_DEVICES.value < 0:
        raise app.UsageError(f"--cpu_devices={_CPU_DEVICES.value}; expected >= 0")
    # Before JAX creates its CPU client: as asked, else JAX_NUM_CPU_DEVICES if set, else
    # one host device per core.
    if _CPU_DEVICES.value or "JAX_NUM_CPU_DEVICES" not in os.environ:
        jax.config.update("jax_num_cpu_devices", _CPU_DEVICES.value or os.cpu_count() or 1)
    try:  # a flag that does not parse, or an engine setting SamplingConfig rejects
        settings = settings_from_flags()
        if _PART.value == "engine":
            engine_configs(settings)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    results = PARTS[_PART.value](settings)
    if _OUT.value:
        write_results(_OUT.value, results)
        print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    cli.run(main)
