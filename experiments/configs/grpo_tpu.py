"""TPU VM slice study: the GPU study's protocol over all chips of a slice.

Every worker of the slice runs the same command (``launch/tpu_vm.sh``, which sets
``RL_BATCH_DISTRIBUTED=auto`` so ``jax.distributed`` finds its peers); the batch is split
over every chip on the ``data`` axis, so P x G must be a multiple of the chip count::

  launch/tpu_vm.sh sweep experiments/configs/grpo_tpu.py /mnt/shared/grpo_tpu
"""

from experiments.configs import grpo_gpu


def get_config(arg=None):
    c = grpo_gpu.get_config(arg)
    c.sweep.prompts = "64,128,256,512,1024,2048"
    c.sweep.extra_points = "64x16:sqrt,128x16:sqrt,128x8:fixed,256x8:fixed"
    c.sweep.reference = "64x8:sqrt"
    c.lr_ref, c.batch_ref = 1e-4, 512
    return c
