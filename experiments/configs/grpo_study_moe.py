"""The study's GRPO grids on its own model family: Qwen3-30B-A3B (MoE), one 8-GPU host.

``grpo_study`` with a Qwen3-MoE checkpoint, experts split over an ``expert`` mesh axis
of 8 and the sampler's routing recorded (``moe_routing_disagreement`` per update)::

  python -m experiments.grpo_sweep \
      --config=experiments/configs/grpo_study_moe.py:/models/Qwen3-30B-A3B-Instruct-2507 \
      --config.task.train_file=/data/dapo-math-17k.parquet \
      --config.task.validation_file=/data/aime24.jsonl

Options worth sweeping for MoE: ``--config.grpo.routing_replay=True`` (route the update
by the rollout's experts), ``--config.grpo.policy_loss=gspo`` with
``--config.grpo.loss_agg=seq_mean_token_mean --config.grpo.clip_low=3e-4
--config.grpo.clip_high=4e-4`` (GSPO), ``--config.grpo.router_aux_loss_coef=0.001``.

Memory per device, estimated (not run or compiled here; no accelerator was available):
30.53B parameters, 28.99B of them in experts, 1.54B elsewhere. With ``mesh.expert=8``
each device holds 28.99 / 8 + 1.54 = 5.16B parameters. With the default float32 master
weights (``model.master_weights``: float32 parameters, Adam moments and gradients, plus
the float32 micro-batch accumulator, 20 bytes per parameter) that is ~103 GB of state
per device, leaving ~38 GB of an H200's 141 GB; with ``model.master_weights=False``
(bf16 parameters, moments and gradients, 12 bytes per parameter) ~62 GB. On 80 GB
devices use ``mesh.fsdp=2`` over 16 devices. The real-model memory defaults
(``model.with_memory_defaults``: remat, flash attention, chunked log-probs) apply;
``scan_layers`` does not support MoE layers. Keep ``grpo.micro_batches`` high enough
that one micro-batch holds a few sequences, and check with
``jax.jit(...).lower(...).compile().memory_analysis()`` on the CPU backend (see
CPU-NOTES) before a run.
"""

from experiments.configs import grpo_study


def get_config(arg=None):
    c = grpo_study.get_config(arg)
    # With init.source="hf" the shape comes from the checkpoint's config.json.
    c.model.preset = "qwen3-30b-a3b"
    c.mesh.expert = 8  # 128 experts -> 16 per device; the batch is split over it too
    c.mesh.data = -1
    c.grpo.record_routing = True
    c.grpo.micro_batches = 64
    return c
