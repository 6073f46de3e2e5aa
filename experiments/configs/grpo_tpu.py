"""TPU VM slice study: the GPU study's protocol over all chips of a slice.

Every worker of the slice runs the same command (``launch/tpu_vm.sh``, which sets
``RL_BATCH_DISTRIBUTED=auto`` so ``jax.distributed`` finds its peers); the batch is split
over every chip on the ``data`` axis, so P x G must be a multiple of the chip count::

  launch/tpu_vm.sh sweep experiments/configs/grpo_tpu.py /mnt/shared/grpo_tpu

Mesh: ``mesh.fsdp=4`` (parameters and optimizer state sharded over 4 chips, the batch
over all of them; the smallest v5p slice, v5p-8, has 4 chips and every larger one a
multiple of 4), ``mesh.data`` the rest.

Memory: ``grpo.micro_batch_seqs=16384`` counts the whole slice (4096 per chip on a
v5p-8) and ``gen_batch=0``; every grid point fits a 95 GB v5p chip (the planner's
output: ``docs/memory.md``).
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
