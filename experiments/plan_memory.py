r"""Device memory of a sweep's GRPO update and sampler, compiled ahead of time.

Compiles the update and the sampler for abstract shapes (no weights; runs on a CPU host
for shapes no machine here can run) and prints, per sweep point, the memory of params,
optimizer state, update activations and KV cache, and the largest sequences per
micro-batch and ``gen_batch`` that fit ``--device_memory``::

  python -m experiments.plan_memory --config=experiments/configs/grpo_study.py \
      --config.init.source=scratch --config.model.preset=qwen3-0.6b \
      --prompt_len=512 --response_len=2048 --micro_seqs=8,16 --gen_batches=16,32

``--baseline`` compiles the settings before issue 19 (bf16 params and Adam moments, no
remat, einsum attention, unchunked log-probs, per-layer blocks) for a before/after
comparison. Estimates are single-device; the update's activations do not depend on the
number of micro-batches (a scan), only on the sequences in one. Beyond the largest compiled size
the fit is a straight line through the last two sizes (marked ``~``), unless their
peaks are flat (params-sized buffers set them at small sizes): then the largest compiled
size is a lower bound (marked ``>=``; compile larger sizes).
"""

import os

# Before jax starts: the CPU backend's default scheduler ignores memory (it overstates
# peaks and hides what remat saves).
_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _FLAG).strip()

import time  # noqa: E402

from absl import app, flags  # noqa: E402

from experiments import cli  # noqa: E402

_CONFIG = cli.define_config("config", None, "Run or sweep config file.")
_DEVICE_MEMORY = flags.DEFINE_float("device_memory", 141e9, "Bytes of one device (H200).")
_ALSO_FIT = flags.DEFINE_list(
    "also_fit",
    [],
    "More device sizes (bytes) to print the fit for from the same compiles, e.g. 95e9 "
    "(a TPU v5p chip); the sweep table uses --device_memory.",
)
_PROMPT_LEN = flags.DEFINE_integer(
    "prompt_len", 0, "Prompt tokens P (0: the task's longest prompt + 1, as a run pads)."
)
_RESPONSE_LEN = flags.DEFINE_integer(
    "response_len", 0, "Response tokens R (0: max_new_tokens or the task's longest + 1)."
)
# Small sizes can sit where params-sized buffers (gradients, accumulator, optimizer
# update) set the peak and activations do not show: 1 -> 2 sequences of qwen3-1.7b at
# 512 + 2048 tokens grew the peak 0.3 GB, 8 -> 16 grew it 17 GB.
_MICRO_SEQS = flags.DEFINE_list(
    "micro_seqs", ["8", "16"], "Sequences per micro-batch to compile (the fit uses the last two)."
)
_GEN_BATCHES = flags.DEFINE_list("gen_batches", ["16", "32"], "Sampler batches to compile.")
_BATCH_SHARDS = flags.DEFINE_integer(
    "batch_shards",
    1,
    "Devices an update's micro-batch is split over (mesh data x fsdp x expert): the sweep "
    "table checks each device's share of grpo.micro_batch_seqs against the one-device fit "
    "(params and optimizer state counted unsharded, so fsdp leaves room to spare).",
)
_BASELINE = flags.DEFINE_bool("baseline", False, "Compile the pre-issue-19 settings.")
_SKIP_SAMPLER = flags.DEFINE_bool("skip_sampler", False, "Compile the update only.")


def _gb(x: float) -> str:
    return f"{x / 1e9:.2f}"


def main(argv):
    del argv
    import jax

    from rl_batch.algorithms import grpo as grpo_lib
    from rl_batch.algorithms import learner
    from rl_batch.models import transformer as model_lib
    from rl_batch.rollout import sampler as sampler_lib
    from rl_batch.rollout import sources as rollout_source
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import memory_plan, sections

    if _CONFIG.value is None:
        raise app.UsageError("pass --config=...")
    c = _CONFIG.value
    mc = config_lib.make_model_config(c)
    if _BASELINE.value:
        baseline = dict(remat="none", attention="einsum", logits_chunk=0, scan_layers=False)
        mc = mc.replace(param_dtype=mc.dtype, **baseline)
    # As resolve derives them: + BOS, + EOS.
    task = config_lib.make_task(c)
    p = _PROMPT_LEN.value or task.max_prompt_len + 1
    r = _RESPONSE_LEN.value or c.max_new_tokens or task.max_response_len + 1
    budget = _DEVICE_MEMORY.value
    optimizer = learner.make_optimizer(1e-6, max_grad_norm=c.max_grad_norm or None)
    # Two micro-batches: the gradient accumulator exists, as in any M > 1 update.
    grpo = grpo_lib.GRPOConfig(micro_batches=2, temperature=c.sampling.temperature)
    state = memory_plan.abstract_train_state(mc, optimizer)
    params_b = memory_plan.tree_bytes(state.params)
    opt_b = memory_plan.tree_bytes(state.opt_state)

    print(
        f"# AOT memory plan: {jax.default_backend()} backend, XLA_FLAGS={os.environ['XLA_FLAGS']}"
    )
    print(
        f"model {c.model.preset} ({mc.num_params / 1e6:.0f}M params, {mc.param_dtype} params, "
        f"{mc.dtype} compute, remat={mc.remat}, attention={model_lib.attention_impl(mc)}, "
        f"logits_chunk={mc.logits_chunk}, scan_layers={mc.scan_layers}); P + R = {p} + {r}; "
        f"device {_gb(budget)} GB"
    )
    print(f"params {_gb(params_b)} GB, optimizer state {_gb(opt_b)} GB\n")

    micro_sizes = sorted(int(x) for x in _MICRO_SEQS.value)
    print("| sequences / micro-batch | temp (activations) GB | update peak GB | compile s |")
    print("|---|---|---|---|")
    update_peaks = []
    for b in micro_sizes:
        start = time.perf_counter()
        m = memory_plan.update_memory(
            mc, grpo, optimizer, batch=2 * b, prompt_len=p, response_len=r
        )
        update_peaks.append(m.peak)
        print(f"| {b} | {_gb(m.temp)} | {_gb(m.peak)} | {time.perf_counter() - start:.0f} |")
    micro_fit, _ = memory_plan.largest_fitting(micro_sizes, update_peaks, budget)

    gen_fit, gen_sizes, gen_peaks = 0, [], []
    if not _SKIP_SAMPLER.value:
        gen_sizes = sorted(int(x) for x in _GEN_BATCHES.value)
        sampling = sections.read(rollout_source.Sampling, c.sampling).method
        # (continuous: one program, prefill and decode loop; its temp is in the decode column)
        print(
            f"\nsampler engine {sampling.engine}"
            + (f", slots {sampling.slots or 'all'}" if sampling.engine == "continuous" else "")
            + f", attn_block {sampling.attn_block}"
        )
        print(
            "\n| gen_batch | KV cache GB | prefill temp GB | decode temp GB | peak GB | compile s |"
        )
        print("|---|---|---|---|---|---|")
        for g in gen_sizes:
            start = time.perf_counter()
            if sampling.engine == "continuous":
                pre_temp = "-"
                dec = memory_plan.sampler_call_memory(
                    mc, sampling, batch=g, prompt_len=p, response_len=r
                )
                peak = dec.peak
            else:
                pre, dec = memory_plan.sampler_memory(mc, batch=g, prompt_len=p, response_len=r)
                pre_temp, peak = _gb(pre.temp), max(pre.peak, dec.peak)
            kv = model_lib.kv_cache_bytes(mc, 1, sampler_lib.kv_cache_slots(sampling, g, p, r))
            # The update's state stays on the device while the sampler runs.
            peak += opt_b
            gen_peaks.append(peak)
            print(
                f"| {g} | {_gb(kv)} | {pre_temp} | {_gb(dec.temp)} | {_gb(peak)} | "
                f"{time.perf_counter() - start:.0f} |"
            )
        gen_fit, _ = memory_plan.largest_fitting(gen_sizes, gen_peaks, budget)

    def mark(extrapolated, sizes, peaks, fit):
        if extrapolated:
            return "~"
        # The largest compiled size fits, and its peak is flat: more may fit.
        return ">=" if sizes and fit == sizes[-1] and memory_plan.is_flat(peaks) else ""

    print()
    for other in [budget] + [float(x) for x in _ALSO_FIT.value]:
        m_fit, m_extra = memory_plan.largest_fitting(micro_sizes, update_peaks, other)
        m_mark = mark(m_extra, micro_sizes, update_peaks, m_fit)
        line = f"fits {_gb(other)} GB: {m_mark}{m_fit} sequences per micro-batch"
        if not _SKIP_SAMPLER.value:
            g_fit, g_extra = memory_plan.largest_fitting(gen_sizes, gen_peaks, other)
            line += f", gen_batch {mark(g_extra, gen_sizes, gen_peaks, g_fit)}{g_fit}"
        print(line)
    if "sweep" in c:
        _sweep_table(c, micro_fit, None if _SKIP_SAMPLER.value else gen_fit)


def _sweep_table(c, micro_fit: int, gen_fit: int | None) -> None:
    """Per sweep point: does the config's own grpo.micro_batches (or the count its
    grpo.micro_batch_seqs derives) / gen_batch fit, and the fewest micro-batches /
    largest gen_batch that do."""
    from rl_batch.runs import config as config_lib
    from rl_batch.sweeps import sweep

    print(
        "\n| sweep point | B | config micro_batches (seqs per device) | fits | fewest "
        "micro_batches that fit | config gen_batch | fits | largest gen_batch that fits |"
    )
    print("|---|---|---|---|---|---|---|---|")
    shards = _BATCH_SHARDS.value
    for point in {pt.key: pt for pt in sweep.expand_grid(c)}.values():
        b = point.configuration.batch
        seqs_cfg = c.grpo.get("micro_batch_seqs", 0)
        m_cfg = (
            config_lib.micro_batches_for(b, seqs_cfg, shards) if seqs_cfg else c.grpo.micro_batches
        ) or c.grpo.micro_batches
        # Sequences of one micro-batch on one device.
        seqs = b // m_cfg // shards if b % (m_cfg * shards) == 0 else None
        fits = "yes" if seqs is not None and 0 < seqs <= micro_fit else "**no**"
        # The fewest micro-batches whose per-device size fits and divides B.
        needed = next(
            (m for m in range(1, b + 1) if b % (m * shards) == 0 and b // m // shards <= micro_fit),
            None,
        )
        row = [point.key, b, f"{m_cfg} ({seqs})", fits, needed if micro_fit else "none"]
        if gen_fit is None:
            row += ["-", "-", "-"]
        else:
            g_cfg = c.gen_batch or b  # 0: the whole batch at once
            row += [c.gen_batch, "yes" if g_cfg <= gen_fit else "**no**", min(b, gen_fit)]
        print("| " + " | ".join(str(x) for x in row) + " |")


if __name__ == "__main__":
    cli.run(main)
