r"""Training-step and validation seconds under micro-batch and p_ref-call sizes, side by side.

  python -m experiments.learner_speed --prompts=8,16,32 --micro_batch_seqs=0,32 \
      --ref_chunks=256,64 --rounds=4

Two tables from one process, each interleaved round by round so that every setting sees
the same host load:

- **update**: one training step of each ``prompts x G`` configuration of ``--config`` at
  each ``grpo.micro_batch_seqs`` (0 = the whole batch in one piece), timed by the
  calibration's own stepper (``rl_batch.sweeps.calibrate.calibrate``: generation, batch,
  update, metrics to host); the update's share is the step less its generation.
- **p_ref**: the exact validation pass (``rl_batch.algorithms.exact_eval``) over the
  config's ``eval_ref_prompts`` validation prompts at each call size (``eval_ref_chunk``),
  with the largest |log p| difference from the first size (the sums agree to float
  rounding, not bit for bit).

Each row gives the median seconds and the per-round ratio to the first setting of its
configuration (median [min, max]); the host load is printed before and after.
"""

from __future__ import annotations

import numpy as np
from absl import flags, logging
from ml_collections import ConfigDict

from experiments import cli, configs
from rl_batch import bench, provenance
from rl_batch.algorithms import exact_eval
from rl_batch.runs import config as config_lib
from rl_batch.runs import run as run_lib
from rl_batch.sweeps import calibrate


def _define_flags() -> None:
    """The command's flags, defined only when it runs as one."""
    cli.define_config("config", configs.path("grpo_cpu.py"), "Run config file.")
    flags.DEFINE_string("prompts", "8,16,32", "Prompts per batch (G from the config).")
    flags.DEFINE_string("micro_batch_seqs", "0,32", "grpo.micro_batch_seqs values.")
    flags.DEFINE_string("ref_chunks", "256,64", "eval_ref_chunk values.")
    flags.DEFINE_integer("rounds", 4, "Interleaved visits per setting.")


def _ints(text: str, name: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise ValueError(f"--{name}={text!r}: expected comma-separated integers >= 0")
    return values


def _ratio(summary: tuple[float, float, float]) -> str:
    return "{:.3f} [{:.3f}, {:.3f}]".format(*summary)


def update_rows(base, prompts: list[int], micro: list[int], rounds: int) -> list[list[str]]:
    """One row per (P, micro_batch_seqs): step, generation and update seconds."""
    specs = {}
    for p in prompts:
        for m in micro:
            c = ConfigDict(base.to_dict())
            c.prompts, c.grpo.micro_batch_seqs = p, m
            c.run_dir = f"/tmp/learner_speed/p{p}_m{m}"
            specs[f"{p}x{c.group_size}:m{m}"] = config_lib.resolve(c)
    record = calibrate.calibrate(specs, rounds=rounds, steps=2, log_fn=lambda _: None)
    rows = []
    for p in prompts:
        first = None
        for m in micro:
            r = record["configs"][f"{p}x{base.group_size}:m{m}"]
            step, gen = np.array(r["step_s"]), np.array(r["generate_s"])
            first = step if first is None else first
            ratio = bench.ratio_summary(list(first), list(step))
            rows.append([f"{p} x {base.group_size}", str(m), f"{np.median(step):.3f}",
                         f"{np.median(gen):.3f}", f"{np.median(step - gen):.3f}",
                         _ratio(ratio)])  # fmt: skip
    return rows


def ref_rows(base, chunks: list[int], rounds: int) -> list[list[str]]:
    """One row per call size: seconds of one p_ref pass and its difference from the first."""
    spec = config_lib.resolve(base)
    tokenizer = config_lib.make_tokenizer(base)
    _, val = run_lib.load_task_data(spec, tokenizer)
    n = min(spec.evaluation.eval_ref_prompts or len(val), len(val))
    examples = [val[i] for i in range(n)]
    params = run_lib.initial_params(spec)
    temperature = spec.rollout.sampling.temperature
    scorers = [
        exact_eval.ReferenceScorer(spec.model, tokenizer, examples, temperature=temperature,
                                   chunk=k)
        for k in chunks
    ]  # fmt: skip
    logps = [s.logp(params) for s in scorers]  # (compiles each once, untimed)
    timings = bench.time_interleaved(
        {str(k): (lambda r, s=s: s.logp(params)) for k, s in zip(chunks, scorers)},
        min_repeats=rounds,
        min_time_s=0.0,
    )
    seconds = [timings[str(k)].time_s for k in chunks]
    return [
        [str(k), str(n), f"{np.median(s):.3f}", _ratio(bench.ratio_summary(seconds[0], s)),
         f"{np.abs(lp - logps[0]).max():.1e}"]
        for k, s, lp in zip(chunks, seconds, logps)
    ]  # fmt: skip


def main(argv) -> None:
    del argv
    f = flags.FLAGS
    prompts = _ints(f.prompts, "prompts")
    micro = _ints(f.micro_batch_seqs, "micro_batch_seqs")
    chunks = _ints(f.ref_chunks, "ref_chunks")
    if min(prompts) < 1 or min(chunks) < 1 or f.rounds < 1:
        raise ValueError("--prompts, --ref_chunks and --rounds must be >= 1")
    base = f.config
    logging.set_verbosity(logging.WARNING)  # (the dataset loader's INFO lines)
    print(f"# {provenance.now()} {provenance.hardware()} load {provenance.load_average()}")
    print(bench.markdown_table(
        ["batch", "micro_batch_seqs", "step s", "gen s", "update s", "step / first [min, max]"],
        update_rows(base, prompts, micro, f.rounds)))  # fmt: skip
    print()
    print(bench.markdown_table(
        ["eval_ref_chunk", "prompts", "p_ref pass s", "time / first [min, max]", "max |d log p|"],
        ref_rows(base, chunks, f.rounds)))  # fmt: skip
    print(f"# end {provenance.now()} load {provenance.load_average()}")


if __name__ == "__main__":
    _define_flags()
    cli.run(main)
