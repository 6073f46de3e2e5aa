"""Single-host GPU study: GRPO batch scaling with the ~5M model on 5-digit addition.

The same protocol as the CPU study with a larger model, a harder task and batches up to
P x G = 8192 responses; one accelerator host (run with ``--config.mesh.data=-1`` over all
its devices). Typical use::

  python -m experiments.grpo_sweep --config=experiments/configs/grpo_gpu.py \
      --sweep_dir=sweeps/grpo_gpu

Memory: ``grpo.micro_batch_seqs=4096`` and ``gen_batch=0`` (the whole batch at once); every
grid point fits one 141 GB H200 (the planner's output: ``docs/memory.md``).
"""

from experiments.configs import base


def get_config(arg=None):
    del arg
    c = base.sweep_config(base.run_config())
    c.model.preset = "tiny-5m"
    c.task.kwargs = {"n_digits": 5, "scratchpad": True}
    c.task.n_train = 200_000
    c.pretrain.batch_size = 256
    c.pretrain.steps = 5000
    c.lr_ref, c.batch_ref = 1e-4, 256
    # Sequences per update micro-batch (48.9 GB compiled peak; docs/memory.md).
    c.grpo.micro_batch_seqs = 4096
    c.gen_batch = 0  # the whole batch at once (8192 rows: ~5 GB)
    c.budget_responses = 400_000
    c.eval_every_responses = 8192
    c.eval_prompts = 512
    c.sweep.prompts = "32,64,128,256,512,1024"
    c.sweep.group_sizes = "8"
    c.sweep.lr_rules = "sqrt"
    c.sweep.extra_points = "64x16:sqrt,128x16:sqrt,128x8:fixed,256x8:fixed"
    c.sweep.seeds = "0,1,2"
    c.sweep.reference = "32x8:sqrt"
    return c
