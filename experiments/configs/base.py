"""The full single-run config with defaults; study configs start from it.

Every field of a run lives here so that ``config.json`` records all of them. Derived
values (the LR for a batch size under a rule, the response length from the task) are
computed by ``rl_batch.runs.config.resolve`` in one place and written under ``derived``; the
inputs here keep their values (``lr`` None = derive it).
"""

import dataclasses

from ml_collections import ConfigDict, config_dict

from rl_batch import artifacts
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


def run_config() -> ConfigDict:
    """A GRPO run on the reversed-digit addition task with the ~1M-parameter model."""
    c = ConfigDict()
    c.algo = "grpo"  # "grpo" or "ppo"
    c.name = ""  # run name (the sweep sets it)
    c.variant = ""  # the sweep's named variant of the base config (sweep.variants), if any
    c.run_dir = ""  # output directory; required for experiments.train
    c.seed = 0
    # caches: TFDS data, warm-start checkpoints ($RL_BATCH_DEFAULT_ROOT/workdir when set)
    c.work_dir = artifacts.default_dir(".", "workdir")
    # Compiled programs cached in <work_dir>/xla_cache (JAX's persistent cache), so that
    # the seeds of a configuration compile once (6 s -> 2 s per run on a 2-core CPU).
    # $JAX_COMPILATION_CACHE_DIR, when set, wins.
    c.xla_cache = True

    c.task = ConfigDict()
    c.task.name = "addition"
    # Scratchpad responses run to ~31 tokens: generation matters as in LLM RL.
    c.task.kwargs = ConfigDict({"n_digits": 3, "scratchpad": True})
    c.task.n_train = 20_000  # synthetic tasks: examples generated per split
    c.task.n_validation = 512
    # Math data (task.name = "math"): local JSONL/Parquet files in DAPO-Math-17K, GSM8K,
    # MATH or AIME format, prompts rendered with the HF tokenizer's chat template.
    c.task.train_file = ""
    c.task.validation_file = ""
    c.task.format = "auto"
    # Math data prompting: the instruction appended to each question (None: "Please
    # reason step by step, and put your final answer within \boxed{}."; DAPO prompts carry
    # their own), an optional system message, and whether prompts over the sampler's
    # budget are dropped (with a warning naming their lines) instead of stopping the run.
    c.task.instruction = config_dict.placeholder(str)
    c.task.system_prompt = ""
    c.task.drop_long_prompts = False
    # Extra variables of the tokenizer's jinja chat template, e.g. Qwen3's
    # --config.task.chat_template_kwargs='{"enable_thinking": False}'.
    c.task.chat_template_kwargs = ConfigDict()
    # No validation_file: hold out this fraction of train_file as the validation rows
    # (chosen by split_seed, never trained on). Validation rows of a file are shuffled
    # with split_seed before the first eval_prompts of them are taken.
    c.task.eval_fraction = 0.0
    c.task.split_seed = 0
    # Your own reward instead of the task's verifier: "package.module:function" or
    # "path/to/file.py:function", called as fn(prompt, response, answer, meta) -> float
    # (rl_batch.tasks.custom_reward).
    c.task.reward_fn = ""

    c.model = ConfigDict()
    c.model.preset = "tiny-1m"
    # ModelConfig fields, e.g. {"num_layers": 2}; every field is a typed placeholder
    # (None = unset) so that --config.model.overrides.vocab_size=151936 works.
    c.model.overrides = model_overrides()
    # bf16-compute models keep float32 params and Adam moments (model.with_master_weights).
    c.model.master_weights = True

    # Starting policy: "pretrain" (supervised warm start on the task, cached in work_dir),
    # "scratch" (random init), "checkpoint" (a run's checkpoint dir), "hf" (an HF dir),
    # "params" (a base policy file, .npz of host arrays: experiments.pretrain --export).
    c.init = ConfigDict()
    c.init.source = "pretrain"
    c.init.path = ""

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

    c.grpo = ConfigDict()
    c.grpo.clip_low = 0.2
    c.grpo.clip_high = 0.28
    c.grpo.kl_coef = 0.0  # KL-to-initial-policy loss term (k3; 0 = no reference kept)
    c.grpo.loss_agg = "token_mean"
    c.grpo.advantage = "grpo"
    c.grpo.micro_batches = 1  # gradient accumulation; same maths
    # > 0: at most this many sequences per micro-batch (a memory budget, from
    # experiments.plan_memory); the update's micro-batch count (derived.micro_batches) is
    # then derived per batch size instead of taken from grpo.micro_batches.
    c.grpo.micro_batch_seqs = 0
    c.grpo.num_minibatches = 1  # >1 departs from the one-update-per-batch protocol
    c.grpo.num_epochs = 1
    # "token": the token-level clipped surrogate; "gspo": GSPO's sequence-level ratio
    # (needs loss_agg="seq_mean_token_mean"; its paper's clips are 3e-4 / 4e-4).
    c.grpo.policy_loss = "token"
    # MoE policies: weight of the router load-balancing loss (HF's Switch-style aux loss;
    # 0 = off; HF Qwen3-MoE configs carry 0.001 for pre-training).
    c.grpo.router_aux_loss_coef = 0.0
    # MoE policies: the sampler records each token's experts (logs the rollout-vs-update
    # moe_routing_disagreement); routing_replay also routes the update by that record.
    c.grpo.record_routing = False
    c.grpo.routing_replay = False
    # True: order each update's micro-batches as half-group pairs and log the gradient
    # noise split into inter-prompt and intra-prompt terms (docs/noise_scale.md). Needs an
    # even micro-batch count >= 4 (derived.micro_batches), an even group_size, prompts
    # divisible by micro-batches / 2 and one update per batch.
    c.grpo.group_noise = False
    # Which rows each micro-batch holds, so which noise scale B_simple measures
    # (docs/noise_scale.md): "groups" (whole groups: the batch noise scale B_noise =
    # (G tr_inter + tr_intra) / |G|^2, what the report, the adaptive schedule and surge
    # use; needs micro-batches dividing prompts or prompts dividing micro-batches) or
    # "strided" (rows m, m + M, ...: the intra-prompt term only). Same gradient either way.
    c.grpo.micro_layout = "groups"

    # PPO (algo="ppo"): a critic as large as the policy, trained alone for the first
    # warmup_updates rollout batches (the sample axis starts when the actor starts).
    # The study runs G = 1 (B = P) and filter_groups = False (a critic learns from every
    # response; resolve() rejects filtering for PPO).
    c.ppo = ConfigDict()
    c.ppo.warmup_updates = 30  # critic-only updates first (the study's 30)
    # Critic LR: critic_lr = rule(critic_lr_ref, k * B / batch_ref), k = critic_batch_scale.
    c.ppo.critic_lr_ref = 1e-3
    c.ppo.critic_lr_rule = ""  # "" = the actor's lr_rule
    # None (unset): derived from the rule (derived.critic_lr); a value > 0 overrides it.
    c.ppo.critic_lr = config_dict.placeholder(float)
    c.ppo.critic_batch_scale = 1  # the critic steps once per k rollout batches (grad mean)
    c.ppo.critic_from_policy = True  # critic body = a copy of the initial policy's
    c.ppo.gamma = 1.0
    c.ppo.lam = 1.0
    c.ppo.whiten_advantages = True
    c.ppo.value_clip = 0.2  # 0 = off (inert with one update per batch: V = V_old there)
    c.ppo.kl_coef = 0.0  # per-token KL-to-initial-policy penalty in the rewards
    c.ppo.kl_estimator = "k1"
    c.ppo.clip_low = 0.2
    c.ppo.clip_high = 0.2
    c.ppo.loss_agg = "token_mean"  # actor; the value loss is always a token mean
    c.ppo.micro_batches = 1  # gradient accumulation for both networks; same maths

    # Sampling method and rollout engine (rl_batch.rollout.sources.Sampling: each field
    # and its default), e.g. --config.sampling.stop_strings="('</answer>', 'Question:')".
    c.sampling = ConfigDict(sections.config_fields(sources.Sampling))
    c.max_new_tokens = 0  # 0 = the task's max response length + EOS
    # Sequences generated concurrently; 0 = the whole batch at once. Independent of the
    # training batch (the rollout is generated in chunks): sweep it by running the batch
    # sweep once per value, e.g. ``--config.gen_batch=64`` into its own sweep directory.
    c.gen_batch = 0
    # KV-cache bound of one generation chunk (bucketed rows x (prompt + response) slots x
    # layers x 2 x kv heads x head dim x bytes); 0 = unchecked. The run stops at start-up
    # when a chunk (training or validation) would exceed it: lower gen_batch.
    c.max_kv_bytes = 0
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

    c.filter_groups = True  # drop groups whose rewards are all equal (DAPO)

    # Runway, validation and target, all in cumulative *retained* responses.
    c.budget_responses = 16_384
    c.eval_every_responses = 1024
    c.eval_prompts = 128
    c.eval_k = 4
    c.eval_greedy = True
    # The validation accuracy that the target and N* are on: "mean_at_k" (sampled, above;
    # always logged as eval_mean_at_k) or "p_ref", the exact mean p(reference response) at
    # the sampling temperature on eval_ref_prompts validation prompts (0 = all): mean@inf
    # of exact matches, without sampling noise (synthetic tasks; rl_batch.algorithms.exact_eval).
    c.eval_metric = "mean_at_k"
    c.eval_ref_prompts = 0
    c.target = 0.5  # validation accuracy (eval_metric) to reach
    # Set: N*, T and q are also taken over the band [target_band_lo, target] (geometric
    # means over 9 levels; rl_batch.targets.time_to_band), the whole-curve estimator the
    # analysis then uses for every ratio. None: the single target.
    c.target_band_lo = config_dict.placeholder(float)
    # How N* is read off the evaluations: "update" (the update that realizes the crossing
    # interpolated between two evaluations: a batch of B responses reaches a level at a
    # multiple of B) or "linear" (the interpolated point; on average half a batch early).
    c.target_crossing = "update"
    c.stop_at_target = False  # stop once the target has been reached confirm_evals times
    c.confirm_evals = 2

    # Dashboards that get a copy of every metrics line (metrics.jsonl is always written):
    # a comma list of "jsonl", "tensorboard" (needs tensorboardX), "wandb" (offline unless
    # $WANDB_MODE says otherwise); rl_batch.runs.tracking.
    c.tracking = "jsonl"
    # Validation prompts whose sampled responses and rewards go to generations.jsonl (and
    # to the dashboards) at every validation; 0 = off.
    c.log_generations = 4
    # Every this many updates, the training rollout's first log_generations prompts (at
    # least 1) with their responses, rewards and lengths go there too ("source": "train");
    # 0 = off.
    c.log_generations_every = 0

    c.checkpoint_every = 25  # updates
    c.max_consecutive_skips = 5  # non-finite updates in a row before the run stops
    c.max_empty_rollouts = 20  # all-filtered rollout batches in a row before the run stops

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
    # A reused worker keeps the learner, sampler and scorer of this many configurations
    # (rl_batch.runs.programs): the next seed of one reuses them, compiled. Each kept GRPO
    # learner with a KL term holds a copy of the initial policy; 0 rebuilds per run.
    run.sweep.keep_programs = 8
    # > 0: after the points, every configuration's training step is timed side by side
    # in one process, interleaved over this many rounds (experiments.calibrate), and the
    # analysis takes T and q from those step times (calibration.json).
    run.sweep.calibrate_rounds = 0
    run.sweep.calibrate_steps = 2  # timed steps per configuration and round
    # Concurrencies ("512,1024") whose generation alone is timed in the same rotation: the
    # generation plateau (critical generation batch) can lie past the largest batch.
    run.sweep.calibrate_gen_probe = ""
    # True: after the grid, when the configuration with the smallest T has the smallest
    # (largest) batch of its family, the sweep adds the next batch beyond it by the grid's
    # factor (P / f, or G / f at P = 1; P x f), same LR rule, every seed, and repeats
    # until the minimum is interior or a limit below is reached
    # (rl_batch.analysis.planner.next_edge_points; <sweep>/extensions.json keeps the added
    # points, so a re-run of the same command runs only what is new).
    run.sweep.extend_edges = False
    run.sweep.extend_max_rounds = 2  # the most extension rounds (each adds 1-2 configurations)
    run.sweep.extend_max_batch = 0  # > 0: never extend past this batch (e.g. from memory)
    return run
