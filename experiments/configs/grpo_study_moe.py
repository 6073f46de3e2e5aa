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

Memory per device is estimated in ``docs/memory.md`` (not compiled: no accelerator was
available); on 80 GB devices use ``mesh.fsdp=2`` over 16 devices.
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
