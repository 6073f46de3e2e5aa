"""TPU VM slice study: the GPU study's protocol over all chips of a slice.

Every worker of the slice runs the same command (``launch/tpu_vm.sh``, which sets
``RL_BATCH_DISTRIBUTED=auto`` so ``jax.distributed`` finds its peers); the batch is split
over every chip on the ``data`` axis, so P x G must be a multiple of the chip count::

  launch/tpu_vm.sh sweep experiments/configs/grpo_tpu.py /mnt/shared/grpo_tpu

Mesh: ``mesh.fsdp=4`` (parameters and optimizer state sharded over 4 chips, the batch
over all of them; the smallest v5p slice, v5p-8, has 4 chips and every larger one a
multiple of 4), ``mesh.data`` the rest.

Memory (95 GB per TPU v5p chip), from the AOT planner at commit 7fa10b5 (CPU backend,
one device, params unsharded, so fsdp only adds room; P + R = 13 + 52 tokens)::

  python -m experiments.plan_memory --config=experiments/configs/grpo_tpu.py \
      --device_memory=95e9 --batch_shards=4 --micro_seqs=2048,4096 \
      --gen_batches=2048,4096

printed: update peak 24.49 / 48.91 GB at 2048 / 4096 sequences per device per
micro-batch, sampler peak 1.22 / 2.39 GB at gen_batch 2048 / 4096; fits 95 GB: ~7962
sequences per micro-batch, gen_batch ~166761 (``~``: extrapolated), and every sweep
point fits with its derived micro-batches. ``grpo.micro_batch_seqs`` counts the whole
slice: 16384 = 4096 per chip on 4 chips (fewer on more), so the largest point
(B = 16384) is one micro-batch on a v5p-8. The whole batch is sampled at once
(``gen_batch=0``; the sampler splits rows over ``mesh.data`` only, and 16384 rows on one
chip are ~10 GB).
"""

from experiments.configs import grpo_gpu


def get_config(arg=None):
    c = grpo_gpu.get_config(arg)
    c.sweep.prompts = "64,128,256,512,1024,2048"
    c.sweep.extra_points = "64x16:sqrt,128x16:sqrt,128x8:fixed,256x8:fixed"
    c.sweep.reference = "64x8:sqrt"
    c.lr_ref, c.batch_ref = 1e-4, 512
    c.mesh.fsdp = 4
    c.grpo.micro_batch_seqs = 16384  # over the slice: 4096 per chip on a v5p-8
    c.gen_batch = 0
    return c
