"""The study's GRPO grids on a real model and math data (multi-host hardware).

Mirrors the published grids: P = 64 ... 4096 prompts with G = 8 under the sqrt LR rule,
the group-size pairs (128, 8) / (64, 16) and (256, 8) / (128, 16), and fixed against
sqrt LR at P = 128 and 256; the reference is P = 128. The policy starts from a local
Hugging Face checkpoint (Qwen3 / Qwen2 / Llama family) and trains on a local math file
(DAPO-Math-17K, GSM8K, MATH or AIME format) scored with math-verify::

  python -m experiments.grpo_sweep \
      --config=experiments/configs/grpo_study.py:/models/Qwen3-1.7B \
      --config.task.train_file=/data/dapo-math-17k.parquet \
      --config.task.validation_file=/data/aime24.jsonl

Memory: ``grpo.micro_batch_seqs=4`` and ``gen_batch=64`` fit one 141 GB H200 for
qwen3-1.7b at 1025 + 8193 tokens; the planner's output for this config (and the
settings for a TPU v5p chip) is in ``docs/memory.md``; re-plan for another model.
"""

from ml_collections import ConfigDict

from experiments.configs import base


def get_config(arg=None):
    c = base.sweep_config(base.run_config())
    c.init.source = "hf"
    c.init.path = arg or ""
    # With init.source="hf" the model shape comes from the checkpoint's config.json;
    # the preset only names the intended size in config.json.
    c.model.preset = "qwen3-1.7b"
    c.task.name = "math"
    c.task.kwargs = ConfigDict({"max_prompt_len": 1024, "max_response_len": 8192})
    c.sampling.temperature = 1.0
    c.lr_ref, c.batch_ref = 1e-6, 128 * 8
    c.max_grad_norm = 1.0
    # A memory budget per micro-batch, not a fixed count (16 gave 32-2048 sequences over
    # the grid): micro_batches = B / 4 at every point. 4 sequences of qwen3-1.7b at
    # 1025 + 8193 tokens compile to a 112.4 GB peak (docs/memory.md): they fit a 141 GB H200
    # (cuDNN attention on a GPU needs less than the CPU compile's einsum).
    c.grpo.micro_batch_seqs = 4
    # KV cache 1.06 GB per 9.2k-token sequence: gen_batch 64 peaks at 97.8 GB with the
    # update state resident (~103 fit).
    c.gen_batch = 64
    c.budget_responses = 2_000_000
    c.eval_every_responses = 16_384
    c.eval_prompts = 256
    c.eval_k = 16
    c.target = 0.5
    c.sweep.prompts = "64,128,256,512,1024,2048,4096"
    c.sweep.group_sizes = "8"
    c.sweep.lr_rules = "sqrt"
    c.sweep.extra_points = "64x16:sqrt,128x16:sqrt,128x8:fixed,256x8:fixed"
    c.sweep.reference = "128x8:sqrt"
    return c
