"""The full single-run config with defaults; study configs start from it.

Every field of a run lives here so that ``config.json`` records all of them. Derived
values (the LR for a batch size under a rule, the response length from the task) are
computed by ``rl_batch.runs.config.resolve`` in one place and written under ``derived``; the
inputs here keep their values (``lr`` None = derive it).
"""

import dataclasses

from ml_collections import ConfigDict, config_dict

from rl_batch.algorithms import grpo as grpo_lib
from rl_batch.algorithms import ppo as ppo_lib
from rl_batch.models.transformer import ModelConfig
from rl_batch.rollout import sources
from rl_batch.runs import sections


def model_overrides() -> ConfigDict:
    """A ConfigDict with one unset (None) typed placeholder per ``ModelConfig`` field."""
    types = {"int": int, "float": float, "bool": bool, "str": str, "tuple[int, ...]": tuple}
    return ConfigDict(
        {
            f.name: config_dict.placeholder(types[str(f.type)])
            for f in dataclasses.fields(ModelConfig)
        }
    )


# Where each section class's fields sit in a run config ("" = top level): their meanings
# (the classes' docstrings) are what ``--help_config`` prints under them.
SECTIONS = (
    ("", sections.RunIO),
    ("task.", sections.Task),
    ("model.", sections.ModelSection),
    ("init.", sections.Init),
    ("", sections.Optimizer),
    ("grpo.", sections.Grpo),
    ("grpo.", grpo_lib.GRPOConfig),
    ("ppo.", sections.Ppo),
    ("ppo.", ppo_lib.PPOConfig),
    ("model.overrides.", ModelConfig),
    ("sampling.", sources.Sampling),
    ("async_rollout.", sources.AsyncRollout),
    ("partial_rollout.", sources.PartialRollout),
    ("", sections.Evaluation),
)


def run_config() -> ConfigDict:
    """A GRPO run on the reversed-digit addition task with the ~1M-parameter model."""
    c = ConfigDict()
    c.seed = 0
    # Where the run writes, what it logs and when it stops (rl_batch.runs.sections.RunIO:
    # each field and its default): name, run_dir, work_dir, xla_cache, budget_responses,
    # checkpoint_every, the stuck-run guards, max_kv_bytes, tracking, log_generations.
    c.update(sections.config_fields(sections.RunIO))

    # What the policy trains and validates on (rl_batch.runs.sections.Task: each field and
    # its default), e.g. math data: --config.task.name=math --config.task.train_file=...,
    # Qwen3's --config.task.chat_template_kwargs='{"enable_thinking": False}'.
    c.task = ConfigDict(sections.config_fields(sections.Task))

    # The policy's shape and starting point (rl_batch.runs.sections.ModelSection, Init).
    c.model = ConfigDict(sections.config_fields(sections.ModelSection))
    # ModelConfig fields, e.g. {"num_layers": 2}; every field is a typed placeholder
    # (None = unset) so that --config.model.overrides.vocab_size=151936 works.
    c.model.overrides = model_overrides()
    c.init = ConfigDict(sections.config_fields(sections.Init))

    c.pretrain = ConfigDict()
    c.pretrain.steps = 3000  # upper bound; training stops at stop_accuracy
    c.pretrain.batch_size = 64
    c.pretrain.lr = 1e-3
    c.pretrain.warmup_steps = 50
    c.pretrain.seed = 0
    c.pretrain.eval_every = 10  # accuracy climbs fast near the stop: check often
    c.pretrain.eval_prompts = 128
    c.pretrain.stop_accuracy = 0.25  # validation accuracy (stop_metric) that ends the warm start
    # "sampled": mean@1 on eval_prompts prompts (noisy: +-0.04 where the warm start ends);
    # "p_ref": the exact mean p(reference response) on the validation split (synthetic tasks).
    c.pretrain.stop_metric = "sampled"

    # Batch: P prompts x G responses = B responses per optimizer update.
    c.prompts = 16
    c.group_size = 8
    # Batch-size schedule (rl_batch.runs.batch_schedule): P per rollout batch, G fixed, one
    # update per batch, the LR rule applied at each batch's P x G. "fixed": P = prompts.
    # "warmup": P0 = start_prompts, doubling to prompts over the first `responses`
    # retained responses. "adaptive": P0 doubling (up to prompts) while the predicted time
    # falls, q(2B) / q(B) > (1 + 2B / B_n) / (1 + B / B_n), with q from `calibration` (a
    # sweep's calibration.json timing every batch it can take) and B_n a lower bound on
    # B_noise pooled over the updates at the current P, at least `window` of them (needs
    # grpo.micro_batches >= 2 and micro_layout "groups"). prompts / start_prompts must be
    # a power of two.
    c.batch_schedule = ConfigDict()
    c.batch_schedule.kind = "fixed"
    c.batch_schedule.start_prompts = 0  # P0 (warmup, adaptive)
    c.batch_schedule.responses = 0  # warmup: retained responses to reach prompts
    c.batch_schedule.window = 4  # adaptive: the least updates at a P before deciding
    c.batch_schedule.calibration = ""  # adaptive: calibration.json giving q(B)

    # The optimizer, its LR rule lr = rule(lr_ref, B / batch_ref) and the batch rules of
    # the Adam settings, clip range and warm-up (hparam_rules): top-level fields, each
    # with its default and meaning in rl_batch.runs.sections.Optimizer.
    c.update(sections.config_fields(sections.Optimizer))

    # The algorithm (rl_batch.runs.sections.Algo): "grpo" or "ppo", with its section
    # (sections.Grpo, sections.Ppo: each field and its default). PPO (algo="ppo"): a critic
    # as large as the policy, trained alone for the first ppo.warmup_updates rollout
    # batches (the sample axis starts when the actor starts); the study runs G = 1 (B = P)
    # and filter_groups = False (resolve() rejects filtering for PPO).
    c.algo = "grpo"
    c.filter_groups = True  # drop groups whose rewards are all equal (DAPO)
    c.grpo = ConfigDict(sections.config_fields(sections.Grpo))
    c.ppo = ConfigDict(sections.config_fields(sections.Ppo))

    # Sampling method and rollout engine (rl_batch.rollout.sources.Sampling: each field
    # and its default), e.g. --config.sampling.stop_strings="('</answer>', 'Question:')".
    c.sampling = ConfigDict(sections.config_fields(sources.Sampling))
    c.max_new_tokens = 0  # 0 = the task's max response length + EOS
    # Sequences generated concurrently; 0 = the whole batch at once. Independent of the
    # training batch (the rollout is generated in chunks): sweep it by running the batch
    # sweep once per value, e.g. ``--config.gen_batch=64`` into its own sweep directory.
    c.gen_batch = 0
    # Asynchronous rollout (a background thread generates batch k+1 while the learner
    # updates on batch k) and partial rollout (at most tokens_per_iter new tokens per
    # response and iteration): rl_batch.rollout.sources.AsyncRollout / PartialRollout.
    c.async_rollout = ConfigDict(sections.config_fields(sources.AsyncRollout))
    c.partial_rollout = ConfigDict(sections.config_fields(sources.PartialRollout))

    # How rollouts draw their random numbers: "rollout" (rollout i from fold_in(seed key,
    # i), row b of it from fold_in(that, b)) or "prompt" (each response from the
    # position of its prompt in the training stream and its member index: the same prompt
    # gets the same draws in every P x G, common random numbers across configurations).
    c.rollout_keys = "rollout"

    # Validation and the target, in cumulative *retained* responses
    # (rl_batch.runs.sections.Evaluation: each field and its default).
    c.update(sections.config_fields(sections.Evaluation))

    c.mesh = ConfigDict()
    c.mesh.data = -1  # -1 = all remaining devices
    c.mesh.fsdp = 1
    c.mesh.tensor = 1
    c.mesh.expert = 1  # MoE expert parallelism (experts split over it; batch split too)

    # Multi-process runs (jax.distributed); empty = single process or auto-detect.
    c.distributed = ConfigDict()
    c.distributed.coordinator_address = ""
    c.distributed.num_processes = 0
    c.distributed.process_id = -1
    return c


def sweep_config(run: ConfigDict) -> ConfigDict:
    """Adds a ``sweep`` section: comma-separated lists so flags can override them."""
    run.sweep = ConfigDict()
    run.sweep.prompts = "8,16,32,64"
    run.sweep.group_sizes = "8"
    run.sweep.lr_rules = "sqrt"  # of lr_rules.RULES; "surge" needs lr_rule_noise_scale
    run.sweep.seeds = "0"
    # Extra points beyond the product above, "PxG:rule" separated by commas,
    # e.g. "8x16:sqrt,32x8:fixed".
    run.sweep.extra_points = ""
    # PPO: the critic's axes, multiplying the grid (empty = the base ppo.critic_batch_scale
    # / ppo.critic_lr_rule); "actor" in critic_lr_rules = the actor's rule. A point off the
    # critic defaults is spelled "PxG:rule:kK[-critic_rule]", e.g. "64x1:sqrt:k2".
    run.sweep.critic_batch_scales = ""
    run.sweep.critic_lr_rules = ""
    run.sweep.reference = ""  # run config key "PxG:rule"; default: smallest batch, first rule
    # The analysis calls two configurations equivalent when the 90 % interval of their T
    # ratio lies inside 1 +- this (two one-sided tests; rl_batch.analysis.equivalence).
    run.sweep.equivalence_delta = 0.05
    # Named variants of the base config: name -> settings (nested like the run config),
    # e.g. {"warmup": {"batch_schedule": {"kind": "warmup", "start_prompts": 2,
    # "responses": 512}}}. A point "PxG:rule@name" in extra_points (or reference) runs
    # with them; a variant's configurations form their own batch family in the analysis.
    run.sweep.variants = ConfigDict()
    # > 0: bytes of one device; before any point starts, the sweep compiles each point's
    # update and sampler ahead of time (experiments.plan_memory, CPU) and refuses the
    # points whose estimate exceeds it, e.g. 141e9 for an H200.
    run.sweep.device_memory = 0.0
    # Points run this many at a time, each in its own process (> 1 implies --isolate):
    # on a 2-core CPU two small runs together finish ~1.3x sooner than one after the
    # other. Their measured q then shares the host; the calibration below does not.
    run.sweep.concurrent = 1
    # With concurrent > 1 (one process): each of the `concurrent` child processes runs
    # one point after another (rl_batch.sweeps.processes.Worker), keeping its imports; False starts
    # a process per point.
    run.sweep.reuse_workers = True
    # True: reused workers each pinned to their own share of the CPUs (concurrent = 2 on
    # 2 cores: one core each), so that XLA sizes each one's thread pools to its share
    # (rl_batch.sweeps.processes.cpu_slices). Off: on a 2-core Intel Xeon it used ~12 %
    # less CPU but no less wall time (experiments.sweep_speed; docs/cpu_study.md).
    run.sweep.pin_workers = False
    # A reused worker keeps the learner, sampler and scorer of this many configurations
    # (rl_batch.runs.programs): the next seed of one reuses them, compiled. Each kept GRPO
    # learner with a KL term holds a copy of the initial policy; 0 rebuilds per run.
    run.sweep.keep_programs = 8
    # > 0: after the points, every configuration's training step is timed side by side
    # in one process, interleaved over this many rounds (experiments.calibrate), and the
    # analysis takes T and q from those step times (calibration.json).
    run.sweep.calibrate_rounds = 0
    run.sweep.calibrate_steps = 2  # timed steps per configuration and round
    # > 0: this many of the rounds are timed before the points (a block of its own; the
    # rest after them). A shared host's relative step times move between sittings; the
    # intervals of T then carry how far they moved (rl_batch.analysis.intervals.block_drift),
    # and the block before the points compiles their programs into the XLA cache.
    run.sweep.calibrate_rounds_before = 0
    # Concurrencies ("512,1024") whose generation alone is timed in the same rotation: the
    # generation plateau (critical generation batch) can lie past the largest batch.
    run.sweep.calibrate_gen_probe = ""
    # True: after the grid, when the configuration with the smallest T has the smallest
    # (largest) batch of its family, the sweep adds the next batch beyond it by the grid's
    # factor (P / f, or G / f at P = 1; P x f), same LR rule, every seed, and repeats
    # until the minimum is interior or a limit below is reached
    # (rl_batch.analysis.extension.next_edge_points; <sweep>/extensions.json keeps the added
    # points, so a re-run of the same command runs only what is new).
    run.sweep.extend_edges = False
    # Which checkpoints a point keeps once it has finished (rl_batch.runs.retention; the
    # analysis reads none): "extendable" keeps the final step of a run that stopped at its
    # budget (what a larger budget resumes from) and none of a run that stopped at its
    # target (one extended later trains again from step 0, the same steps); "none" keeps
    # none; "all" keeps each run's last two steps (~11 MB each for the default model).
    run.sweep.keep_checkpoints = "extendable"
    run.sweep.extend_max_rounds = 2  # the most extension rounds (each adds 1-2 configurations)
    run.sweep.extend_max_batch = 0  # > 0: never extend past this batch (e.g. from memory)
    return run
