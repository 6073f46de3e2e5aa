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
    # the grid): micro_batches = B / 4 at every point. experiments.plan_memory (CPU AOT,
    # einsum attention, one device) put qwen3-1.7b at 1024 + 8193 tokens at 59.9, 84.7
    # and 132.8 GB peak for 1, 2 and 4 sequences: 4 fit a 141 GB H200 (cuDNN attention
    # on a GPU needs less). Re-plan for another model or device.
    c.grpo.micro_batch_seqs = 4
    # KV cache 1.06 GB per 9.2k-token sequence: gen_batch 64 peaked at 97.8 GB with the
    # update state resident (plan_memory, same setting; ~103 fit).
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
