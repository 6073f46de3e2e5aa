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

Memory (one 141 GB H200) for qwen3-1.7b at P + R = 1025 + 8193 tokens, from the AOT
planner at commit 1411a5b (CPU backend, one device, einsum attention, blocks stored
stacked under a scan, the default for real models; 49 s on the 2-core host)::

  python -m experiments.plan_memory --config=experiments/configs/grpo_study.py \
      --config.init.source=scratch --micro_seqs=2,4 --gen_batches=32,64 --also_fit=95e9

printed: params 6.88 GB, optimizer state 13.76 GB (float32 master weights); update peak
74.09 / 112.41 GB at 2 / 4 sequences per micro-batch; sampler peak (update state
resident) 62.59 / 97.77 GB at gen_batch 32 / 64 (KV cache 33.83 / 67.66 GB); fits
141 GB: ~5 sequences per micro-batch, gen_batch ~103 (``~``: extrapolated); fits 95 GB
(a TPU v5p chip): 2 and 32. Every sweep point fits with ``micro_batch_seqs=4`` and
``gen_batch=64`` (the defaults below). On one v5p chip use
``--config.grpo.micro_batch_seqs=2 --config.gen_batch=32`` (or shard with ``mesh.fsdp``);
re-plan for another model.
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
    # 1025 + 8193 tokens compile to a 112.4 GB peak (docstring): they fit a 141 GB H200
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
