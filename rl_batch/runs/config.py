"""Validating run configs and resolving them, once, into a ``RunSpec``.

``resolve(config)`` checks every field (one ``ValueError`` naming each bad field,
before any compute) and returns the run's ``RunSpec`` (``rl_batch.runs.spec``): the
inputs as given plus every derived value (the LR and Adam settings under the batch
rule, the micro-batch count, the response length from the task, the model's shape,
the algorithm's config). Resolve never changes an input: everything that trains reads
the effective values from the spec (``spec.optimizer.lr``, not ``lr``, which stays None
when the rule derives it). ``load_spec`` reads a run's ``config.json`` back as its spec
without resolving again.

Length: over 800 lines because every cross-field check of a run config (sections against
each other, the mesh, the batch schedule, resume compatibility and the older-file
fields) is here, so that one pass names every bad field before compute.
"""

from __future__ import annotations

import copy
import math
import os
import platform
from typing import Any

from ml_collections import ConfigDict

from rl_batch import targets
from rl_batch.algorithms import grpo, learner, lr_rules, ppo
from rl_batch.models import transformer as model_lib
from rl_batch.rollout.sampler import Sampler, SamplingConfig
from rl_batch.rollout.sources import AsyncRollout, RolloutSettings, Sampling
from rl_batch.runs import batch_schedule, retention, sections, tracking
from rl_batch.runs.spec import RunSpec
from rl_batch.tasks.custom_reward import WithReward
from rl_batch.tasks.plugin import is_plugin, make_plugin_task
from rl_batch.tasks.registry import TASKS, get_task
from rl_batch.tokenizers import CharTokenizer

ALGOS = ("grpo", "ppo")
# Validation accuracy the target is on: sampled mean@k, or the exact p(reference response).
EVAL_METRICS = sections.EVAL_METRICS
INIT_SOURCES = ("pretrain", "scratch", "checkpoint", "hf", "params")
SYNTHETIC_TASKS = sections.SYNTHETIC_TASKS
# The ``grpo.GRPOConfig`` field behind each key of a GRPO run's ``grpo`` section (all its
# fields but ``temperature``, which comes from ``sampling``).
GRPO_FIELDS = grpo.GRPOConfig.config_fields()

# The ``SamplingConfig`` fields a run config's ``sampling`` section sets (``greedy`` is
# validation's own; ``stop_strings`` is host-side, not the sampler's).
SAMPLING_FIELDS = Sampling.method_fields()

# The ``ppo.PPOConfig`` field behind each key of a PPO run's ``ppo`` section (``value_clip``
# 0 = off is None there, ``temperature`` comes from ``sampling``).
PPO_FIELDS = (
    "gamma",
    "lam",
    "whiten_advantages",
    "value_clip",
    "kl_coef",
    "kl_estimator",
    "warmup_updates",
    "critic_batch_scale",
    "clip_low",
    "clip_high",
    "loss_agg",
    "micro_batches",
)


def is_generated(name: str) -> bool:
    """Whether task ``name`` draws its examples from ``make_example`` (the synthetic
    tasks and a user's task class, ``module:Class``) rather than reading files."""
    return name in SYNTHETIC_TASKS or is_plugin(name)


def make_task(c: ConfigDict):
    """The task of a run config (a registered one, or a user's class: ``task.name =
    "module:Class"``, see `rl_batch.tasks.plugin`), scored by ``task.reward_fn`` when one
    is named."""
    if is_plugin(c.task.name):
        task = make_plugin_task(c.task.name, c.task.kwargs.to_dict())
    else:
        task = get_task(c.task.name, **c.task.kwargs.to_dict())
    spec = c.task.get("reward_fn")
    return WithReward(task, spec) if spec else task


def make_tokenizer(c: ConfigDict):
    """The tokenizer of a run: characters for synthetic tasks, the HF one otherwise."""
    if is_generated(c.task.name):
        return CharTokenizer()
    from rl_batch.tokenizers import HFTokenizer

    return HFTokenizer(c.init.path)


def make_model_config(c: ConfigDict, head: str = "lm") -> model_lib.ModelConfig:
    """The model: the HF checkpoint's shape (``init.source="hf"``) or a preset's, then
    the memory settings of its size (``model.with_memory_defaults``: remat, attention,
    log-prob chunks for >= 100M parameters), float32 master weights under bf16 compute
    (``model.master_weights``), then ``model.overrides`` (unset fields are None);
    vocabulary sized to the character tokenizer for synthetic tasks."""
    overrides = {k: v for k, v in c.model.overrides.to_dict().items() if v is not None}
    if c.init.source == "hf":
        from rl_batch.models import hf

        base = hf.config_from_hf(hf.read_hf_config(c.init.path))
    else:
        if is_generated(c.task.name) and "vocab_size" not in overrides:
            overrides["vocab_size"] = CharTokenizer().vocab_size
        base = model_lib.get_preset(c.model.preset)
    base = model_lib.with_memory_defaults(base)
    if c.model.get("master_weights", True):
        base = model_lib.with_master_weights(base)
    return base.replace(head=head, **overrides)


def make_sampler(spec: RunSpec, tokenizer, mesh=None):
    """The rollout sampler of a run: the task's prompt and response limits, the
    tokenizer's stop ids (EOS and any other end-of-response id) and PAD, the batch
    sharded over ``mesh`` when it has > 1 device, MoE routing recorded when
    ``record_routing`` or ``routing_replay`` asks for it."""
    return Sampler(
        spec.model,
        eos_id=tokenizer.stop_ids,
        pad_id=tokenizer.pad_id,
        max_prompt_len=spec.max_prompt_len,
        max_new_tokens=spec.max_new_tokens,
        mesh=mesh if mesh is not None and mesh.size > 1 else None,
        record_routing=records_routing(spec.inputs, spec.model),
    )


def records_routing(c: ConfigDict, model_config: model_lib.ModelConfig) -> bool:
    """Whether the sampler keeps a MoE policy's expert choices (GRPO only)."""
    grpo = c.get("grpo") or {}
    wanted = bool(grpo.get("record_routing", False) or grpo.get("routing_replay", False))
    return wanted and c.algo == "grpo" and model_config.num_experts > 0


def data_axis_size(c: ConfigDict, device_count: int) -> int:
    """How many ways the batch is split: the product of the ``data``, ``fsdp`` and
    ``expert`` axes."""
    fsdp, tensor, expert = c.mesh.fsdp, c.mesh.tensor, c.mesh.get("expert", 1)
    data = c.mesh.data if c.mesh.data > 0 else device_count // max(fsdp * tensor * expert, 1)
    return data * fsdp * expert


def micro_batches_for(sequences: int, max_seqs: int, shards: int = 1) -> int | None:
    """The fewest micro-batches M that split ``sequences`` into equal pieces of at most
    ``max_seqs`` (a memory budget, e.g. from ``experiments.plan_memory``), each divisible
    by ``shards``; None if there is none."""
    for m in range(max(1, -(-sequences // max_seqs)), sequences + 1):
        if sequences % m == 0 and (sequences // m) % shards == 0:
            return m
    return None


def _is_int(value) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    """True for a finite int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _dataclass_errors(cls, fields: dict[str, tuple[str, object]]) -> list[str]:
    """Runs ``cls``'s own validation on each config key, beside the keys valid alone.

    A key is checked with every other key that ``cls`` accepts on its own, so that a rule
    between fields is judged on the configured values (``grpo.policy_loss="gspo"`` beside
    ``grpo.loss_agg="seq_mean_token_mean"``), not on the other fields' defaults.

    Args:
      cls: a dataclass that validates its fields (``GRPOConfig``, ``SamplingConfig``).
      fields: config key -> (field of ``cls``, value).

    Returns:
      ``"key=value: cls's error"`` for each key ``cls`` rejects.
    """

    def error(**values) -> Exception | None:
        try:
            cls(**values)
        except (TypeError, ValueError) as e:
            return e
        return None

    valid = {f: v for f, v in fields.values() if error(**{f: v}) is None}
    errors = []
    for key, (field, value) in fields.items():
        e = error(**{**valid, field: value})
        if e is not None:
            errors.append(f"{key}={value!r}: {e}")
    return errors


def _check_run_fields(c: ConfigDict, check) -> None:
    """Validates the run-loop and rollout fields (their 0 sentinels kept)."""
    for name in (
        "checkpoint_every",
        "confirm_evals",
        "max_consecutive_skips",
        "max_empty_rollouts",
    ):
        check(_is_int(c[name]) and c[name] >= 1, f"{name}={c[name]!r}: must be an int >= 1")
    every_s = c.get("checkpoint_min_s", 0.0)
    check(
        _is_number(every_s) and every_s >= 0,
        f"checkpoint_min_s={every_s!r}: must be a number >= 0 (seconds; 0 = none skipped)",
    )
    prune = c.get("prune_at_target", "")
    check(
        prune == "" or prune in retention.POLICIES,
        f"prune_at_target={prune!r}: must be '' or a sweep.keep_checkpoints policy "
        f"({', '.join(retention.POLICIES)})",
    )
    check(
        _is_int(c.gen_batch) and c.gen_batch >= 0,
        f"gen_batch={c.gen_batch!r}: must be an int >= 0 (0 = the whole batch at once)",
    )
    check(
        _is_int(c.max_new_tokens) and c.max_new_tokens >= 0,
        f"max_new_tokens={c.max_new_tokens!r}: must be an int >= 0 "
        "(0 = the task's longest response + EOS)",
    )
    async_rollout = c.get("async_rollout", None)
    if async_rollout is not None and async_rollout.enabled:
        staleness = async_rollout.max_staleness
        check(
            _is_int(staleness) and staleness >= 1,
            f"async_rollout.max_staleness={staleness!r}: must be an int >= 1 when "
            "async_rollout.enabled=True (disable async_rollout for synchronous rollouts)",
        )
    stops = c.sampling.get("stop_strings", ())
    check(
        isinstance(stops, (tuple, list)) and all(isinstance(x, str) and x for x in stops),
        f"sampling.stop_strings={stops!r}: must be a tuple of non-empty strings, "
        "e.g. --config.sampling.stop_strings=\"('</answer>',)\"",
    )
    sampling = sections.read(Sampling, c.sampling)  # (fields it lacks at their defaults)
    errors = _dataclass_errors(
        SamplingConfig,
        {f"sampling.{name}": (name, getattr(sampling, name)) for name in SAMPLING_FIELDS},
    )
    if c.algo == "grpo":
        errors += _dataclass_errors(
            grpo.GRPOConfig,
            # group_noise depends on the derived micro-batch count: ``_micro_batches``;
            # micro_layout may be missing (older inputs: strided, ``sections.Grpo.OLDER_FILES``).
            {
                f"grpo.{name}": (name, c.grpo[name])
                for name in GRPO_FIELDS
                if name != "group_noise" and (name in c.grpo or name != "micro_layout")
            },
        )
    for message in errors:
        check(False, message)


def _check_ppo(c: ConfigDict, check) -> None:
    """Validates the ``ppo`` section (``experiments/configs/base.py``) of a PPO run."""
    check(
        not c.filter_groups,
        "filter_groups=True with algo='ppo': PPO's critic gives every response a "
        "baseline, so no group is dropped (and a group of one always has equal rewards); "
        "set filter_groups=False",
    )
    if "ppo" not in c:
        check(False, "algo='ppo' needs a ppo section (see experiments/configs/base.py)")
        return
    p = c.ppo
    check(
        p.critic_lr_ref > 0 and math.isfinite(p.critic_lr_ref),
        f"ppo.critic_lr_ref={p.critic_lr_ref}: must be finite and > 0",
    )
    check(
        p.critic_lr is None or (p.critic_lr > 0 and math.isfinite(p.critic_lr)),
        f"ppo.critic_lr={p.critic_lr}: must be > 0, or None (unset) to derive it from "
        "critic_lr_rule",
    )
    check(
        p.critic_lr_rule in ("",) + lr_rules.RULES,
        f"ppo.critic_lr_rule={p.critic_lr_rule!r}: expected '' (the actor's) or one of "
        f"{lr_rules.RULES}",
    )
    # The algorithm's fields are validated by PPOConfig itself (one place).
    for message in _dataclass_errors(
        ppo.PPOConfig, {f"ppo.{name}": (name, p[name]) for name in PPO_FIELDS}
    ):
        check(False, message)


def check_data_sizes(c: ConfigDict, n_train: int, n_val: int, train_name: str, val_name: str):
    """Enough training examples for one batch of prompts and validation examples for the
    evaluation the config asks for, else a one-line error naming the data and the field.

    Raises:
      ValueError: naming the data (``train_name``/``val_name``), its size and the field.
    """
    needs = [
        (train_name, n_train, "prompts", c.prompts),
        (val_name, n_val, "eval_prompts", c.eval_prompts),
    ]
    if c.eval_metric == "p_ref" and c.eval_ref_prompts:
        needs.append((val_name, n_val, "eval_ref_prompts", c.eval_ref_prompts))
    for name, have, field, want in needs:
        if have < want:
            raise ValueError(
                f"{name} has {have} examples, fewer than {field}={want}: lower {field} or "
                "add examples"
            )


def resolve(config: ConfigDict, device_count: int | None = None) -> RunSpec:
    """Validates a run config and derives every value from it: the run's one resolution.

    Args:
      config: a run config (see ``experiments/configs/base.py``); a ``derived`` or
        ``sweep`` section in it is ignored (a resolved config is resolved anew from its
        inputs).
      device_count: devices the mesh spans (default ``jax.device_count()``).

    Returns:
      The ``RunSpec``: the inputs exactly as given plus the derived values, among them

      - ``optimizer``: the policy's Adam settings, ``lr`` when set, else ``lr_rule``
        applied to ``lr_ref`` at B / ``batch_ref`` with the rule's betas and eps
        (``malladi`` rescales them); ``lr_arithmetic``: how the rule got there;
      - ``critic_optimizer`` (PPO): ``ppo.critic_lr`` when set, else the critic's rule at
        k x B; ``critic_rule``: that rule's whole result;
      - ``micro_batches``: the update's gradient-accumulation micro-batches (GRPO: from
        ``grpo.micro_batch_seqs`` when it is > 0, else ``grpo.micro_batches``; PPO:
        ``ppo.micro_batches``);
      - ``clip_low``/``clip_high`` and ``lr_warmup_updates`` at B under ``hparam_rules``
        (``hparam_arithmetic``: how, when a rule is off its default);
      - ``batch`` = prompts x group_size, ``max_prompt_len``, ``max_new_tokens``,
        ``model``, ``algorithm``, ``device_count``, ``python``.

    Raises:
      ValueError: naming every invalid field.
    """
    c = ConfigDict(config.to_dict())
    for section in ("derived", "sweep"):
        if section in c:
            del c[section]
    stops = c.get("sampling", {}).get("stop_strings")
    if isinstance(stops, list):  # a config read back from JSON, which has no tuples
        del c.sampling["stop_strings"]
        c.sampling.stop_strings = tuple(stops)
    _raise_if(_field_errors(c))  # each field alone
    _raise_if(_data_errors(c))  # the task's data is there, and large enough
    try:
        task = make_task(c)
        model_config = make_model_config(c)
    except (OSError, TypeError, ValueError) as e:
        raise ValueError(f"invalid config: {e}") from e
    max_prompt_len = task.max_prompt_len + 1  # + BOS
    max_new_tokens = c.max_new_tokens or task.max_response_len + 1  # + EOS
    if device_count is None:
        import jax

        device_count = jax.device_count()
    errors = _length_errors(c, task, model_config, max_prompt_len, max_new_tokens)
    errors += _layout_errors(c, model_config, device_count)
    _raise_if(errors)
    batch = c.prompts * c.group_size  # B: derived here once, then read as spec.batch
    # Every batch-dependent value from one derivation: at B here, at each batch of a
    # batch schedule in the run loop (whose every bucket is derived here, before compute).
    rules = sections.BatchRules.from_config(c)
    try:
        at = rules.at(batch)
    except ValueError as e:
        raise ValueError(f"invalid config: {e}") from e
    schedule = batch_schedule.BatchSchedule.from_config(c)
    _raise_if(rules.schedule_errors(schedule.kind, schedule.batches))
    return RunSpec.build(
        c,
        batch=batch,
        policy=at.adam,
        lr_arithmetic=at.lr_arithmetic,
        critic_optimizer=at.critic_adam,
        critic_rule=at.critic_rule,
        micro_batches=_micro_batches(c, batch, device_count),
        max_prompt_len=max_prompt_len,
        max_new_tokens=max_new_tokens,
        model=model_config,
        device_count=device_count,
        python=platform.python_version(),
        clip_low=at.clip.clip_low,
        clip_high=at.clip.clip_high,
        lr_warmup_updates=at.warmup_updates,
        hparam_arithmetic=at.hparam_arithmetic,
    )


def load_spec(data: dict[str, Any]) -> RunSpec:
    """A run's ``config.json`` (or a spec's ``to_json()``) as its ``RunSpec``, read as it
    was resolved; a config without its ``derived`` section is resolved here.

    Raises:
      ValueError: naming every invalid field of an unresolved config.
    """
    if isinstance(data.get("derived"), dict):
        data = copy.deepcopy(data)
        _fill_added(data)  # fields whose older value depends on the file (ADDED_FIELDS)
        return RunSpec.from_json(data)
    return resolve(ConfigDict(data))


class _Errors(list):
    """Messages of the checks that failed."""

    def check(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)


def _section_errors(build) -> list[str]:
    """The validation message of a section ``build()`` refuses (``[]`` when it builds)."""
    try:
        build()
    except ValueError as e:
        return [str(e)]
    return []


def _raise_if(errors: list[str]) -> None:
    if errors:
        raise ValueError("invalid config: " + "; ".join(errors))


def _field_errors(c: ConfigDict) -> list[str]:
    """Checks of each field on its own (values, ranges, known names)."""
    errors = _Errors()
    check = errors.check
    check(c.algo in ALGOS, f"algo={c.algo!r}: expected one of {ALGOS}")
    check(c.prompts >= 1, f"prompts={c.prompts}: must be >= 1")
    check(c.group_size >= 1, f"group_size={c.group_size}: must be >= 1")
    errors.extend(batch_schedule.config_errors(c))
    if c.algo == "grpo":
        check(
            c.group_size >= 2,
            f"group_size={c.group_size}: GRPO needs >= 2 responses per prompt "
            "(group-relative advantages are zero for a group of one)",
        )
    if c.algo == "ppo":
        _check_ppo(c, check)
    errors.extend(sections.HparamRules.unknown_errors(c.get("hparam_rules")))
    errors.extend(_section_errors(lambda: sections.Optimizer.from_config(c)))
    _check_run_fields(c, check)
    check(c.budget_responses >= 1, f"budget_responses={c.budget_responses}: must be >= 1")
    check(
        c.eval_every_responses >= 1,
        f"eval_every_responses={c.eval_every_responses}: must be >= 1",
    )
    check(c.eval_k >= 1, f"eval_k={c.eval_k}: must be >= 1")
    check(_is_int(c.seed) and c.seed >= 0, f"seed={c.seed!r}: must be an int >= 0")
    check(c.eval_prompts >= 1, f"eval_prompts={c.eval_prompts}: must be >= 1")
    check(
        c.eval_metric in EVAL_METRICS,
        f"eval_metric={c.eval_metric!r}: expected one of {EVAL_METRICS}",
    )
    check(c.eval_ref_prompts >= 0, f"eval_ref_prompts={c.eval_ref_prompts}: must be >= 0")
    chunk = c.get("eval_ref_chunk", 256)  # (older config files lack it)
    check(_is_int(chunk) and chunk >= 1, f"eval_ref_chunk={chunk!r}: must be an int >= 1")
    sampled_every = c.get("eval_sampled_every", 1)
    check(
        _is_int(sampled_every) and sampled_every >= 1,
        f"eval_sampled_every={sampled_every!r}: must be an int >= 1",
    )
    check(
        sampled_every == 1 or c.eval_metric == "p_ref",
        f"eval_sampled_every={sampled_every!r} needs eval_metric='p_ref' (the sampled "
        f"mean@k is what eval_metric={c.eval_metric!r} puts N* on: every validation)",
    )
    errors.extend(tracking.config_errors(c.get("tracking", "jsonl")))
    n_gen = c.get("log_generations", 0)
    check(_is_int(n_gen) and n_gen >= 0, f"log_generations={n_gen!r}: must be an int >= 0")
    every = c.get("log_generations_every", 0)
    check(
        _is_int(every) and every >= 0,
        f"log_generations_every={every!r}: must be an int >= 0 (updates; 0 = off)",
    )
    stop_metric = c.pretrain.get("stop_metric", "sampled")
    check(
        stop_metric in ("sampled", "p_ref"),
        f"pretrain.stop_metric={stop_metric!r}: expected 'sampled' or 'p_ref'",
    )
    check(
        c.eval_metric != "p_ref" or c.task.name != "math",
        "eval_metric='p_ref' needs a task with one reference response per prompt "
        "(the synthetic tasks); math data has final answers only: use 'mean_at_k'",
    )
    check(0 < c.target <= 1, f"target={c.target}: must be an accuracy in (0, 1]")
    band_lo = c.get("target_band_lo")
    check(
        band_lo is None or 0 <= band_lo < c.target,
        f"target_band_lo={band_lo}: must be below the target {c.target} (or None)",
    )
    crossing = c.get("target_crossing", "update")
    check(
        crossing in targets.CROSSINGS,
        f"target_crossing={crossing!r}: expected one of {targets.CROSSINGS}",
    )
    check(c.init.source in INIT_SOURCES, f"init.source={c.init.source!r}: expected {INIT_SOURCES}")
    check(
        c.init.source in ("pretrain", "scratch") or bool(c.init.path),
        f"init.source={c.init.source!r} needs init.path",
    )
    check(
        c.init.source in ("pretrain", "scratch", "params")
        or not c.init.path
        or os.path.isdir(c.init.path),
        f"init.path={c.init.path!r}: no such directory (init.source={c.init.source!r})",
    )
    check(
        c.init.source != "params" or not c.init.path or os.path.isfile(c.init.path),
        f"init.path={c.init.path!r}: no such params file (init.source='params')",
    )
    check(
        c.task.name in TASKS or is_plugin(c.task.name),
        f"task.name={c.task.name!r}: known tasks are {sorted(TASKS)}, or a task class of "
        "your own: 'package.module:TaskClass' or 'file.py:TaskClass'",
    )
    _check_task_fields(c, check)
    check(
        c.model.preset in model_lib.PRESETS,
        f"model.preset={c.model.preset!r}: known presets are {sorted(model_lib.PRESETS)}",
    )
    return errors


def _data_errors(c: ConfigDict) -> list[str]:
    """Synthetic split sizes against the batch and evaluation; data files that exist."""
    errors = _Errors()
    if is_generated(c.task.name):  # (their sizes are settings: checked here)
        try:
            check_data_sizes(
                c, c.task.n_train, c.task.n_validation, "task.n_train", "task.n_validation"
            )
        except ValueError as e:
            errors.append(str(e))
    else:
        fraction = c.task.get("eval_fraction", 0.0)
        path = c.task.train_file
        errors.check(bool(path) and os.path.exists(path), f"task.train_file={path!r}: no such file")
        path = c.task.validation_file
        if not fraction:
            errors.check(
                bool(path) and os.path.exists(path),
                f"task.validation_file={path!r}: no such file (or hold out part of "
                "task.train_file: task.eval_fraction)",
            )
        errors.check(
            not (fraction and path),
            f"task.eval_fraction={fraction} and task.validation_file={path!r}: set one of them",
        )
    return errors


def _check_task_fields(c: ConfigDict, check) -> None:
    """Validates the data-splitting and chat-template fields of ``task``."""
    synthetic = is_generated(c.task.name)
    fraction = c.task.get("eval_fraction", 0.0)
    check(
        isinstance(fraction, (int, float)) and 0 <= fraction < 1,
        f"task.eval_fraction={fraction!r}: must be in [0, 1)",
    )
    check(
        not (synthetic and fraction),
        f"task.eval_fraction={fraction!r}: task {c.task.name!r} has its own validation split "
        "(task.n_validation)",
    )
    seed = c.task.get("split_seed", 0)
    check(_is_int(seed) and seed >= 0, f"task.split_seed={seed!r}: must be an int >= 0")
    kwargs = c.task.get("chat_template_kwargs") or {}
    check(
        hasattr(kwargs, "keys"),
        f"task.chat_template_kwargs={kwargs!r}: must be a dict of template variables",
    )
    check(
        not (synthetic and kwargs),
        f"task.chat_template_kwargs: task {c.task.name!r} renders no chat template "
        "(math data does)",
    )


def _length_errors(c, task, model_config, max_prompt_len: int, max_new_tokens: int) -> list[str]:
    """Prompt and response lengths against the task and the model context."""
    errors = _Errors()
    check = errors.check
    if is_generated(c.task.name):  # (their responses have a known longest length)
        check(
            max_new_tokens >= task.max_response_len + 1,
            f"max_new_tokens={c.max_new_tokens}: the task's responses take up to "
            f"{task.max_response_len + 1} tokens with EOS (0 = exactly that)",
        )
    check(
        max_prompt_len + max_new_tokens <= model_config.max_seq_len,
        f"prompt ({max_prompt_len}) + response ({max_new_tokens}) tokens exceed the model "
        f"context max_seq_len={model_config.max_seq_len}",
    )
    check(
        c.get("rollout_keys", "rollout") in ROLLOUT_KEYS,
        f"rollout_keys={c.get('rollout_keys')!r}: must be one of {ROLLOUT_KEYS}",
    )
    if c.partial_rollout.enabled:
        check(
            c.get("rollout_keys", "rollout") == "rollout",
            'partial_rollout continues groups across rollouts: it needs rollout_keys="rollout"',
        )
        check(
            c.partial_rollout.tokens_per_iter >= 1,
            f"partial_rollout.tokens_per_iter={c.partial_rollout.tokens_per_iter}: must be >= 1",
        )
        check(
            not c.async_rollout.enabled,
            "partial_rollout and async_rollout cannot both be enabled",
        )
        check(
            not c.sampling.get("stop_strings"),
            "sampling.stop_strings is not supported with partial_rollout (continued "
            "responses are cut on stop ids only)",
        )
        check(
            max_prompt_len + max_new_tokens + c.partial_rollout.tokens_per_iter
            <= model_config.max_seq_len,
            "partial rollout continues prompt + response + tokens_per_iter tokens, more than "
            f"the model context max_seq_len={model_config.max_seq_len}",
        )
    return errors


def _layout_errors(c: ConfigDict, model_config, device_count: int) -> list[str]:
    """The mesh against the devices and the model's experts; MoE routing options."""
    errors = _Errors()
    check = errors.check
    expert = c.mesh.get("expert", 1)
    per_axis = c.mesh.fsdp * c.mesh.tensor * expert * (c.mesh.data if c.mesh.data > 0 else 1)
    check(
        device_count % per_axis == 0 and (c.mesh.data < 0 or per_axis == device_count),
        f"mesh data={c.mesh.data} fsdp={c.mesh.fsdp} tensor={c.mesh.tensor} "
        + (f"expert={expert} " if expert != 1 else "")
        + f"does not fit {device_count} devices",
    )
    if model_config.num_experts:
        check(
            _is_int(expert) and expert >= 1 and model_config.num_experts % expert == 0,
            f"mesh.expert={expert!r}: must be a positive int dividing the model's "
            f"num_experts={model_config.num_experts}",
        )
    else:
        check(_is_int(expert) and expert >= 1, f"mesh.expert={expert!r}: must be a positive int")
    grpo = c.get("grpo") or {}
    if grpo.get("record_routing", False) or grpo.get("routing_replay", False):
        check(
            model_config.num_experts > 0 and c.algo == "grpo",
            "grpo.record_routing / grpo.routing_replay need algo='grpo' and a MoE model "
            f"(num_experts={model_config.num_experts})",
        )
        check(
            not c.partial_rollout.enabled,
            "grpo.record_routing / grpo.routing_replay do not support partial_rollout "
            "(continued responses carry no routing record)",
        )
    return errors


def _micro_batches(c: ConfigDict, batch: int, device_count: int) -> int:
    """The update's micro-batch count (GRPO: from ``grpo.micro_batch_seqs`` when set),
    after checking that the batch splits over the data-parallel shards.

    Raises:
      ValueError: the batch or its micro-batches do not divide over the shards.
    """
    errors = _Errors()
    micro_batches = c.ppo.micro_batches if c.algo == "ppo" else c.grpo.micro_batches
    shards = data_axis_size(c, device_count)
    errors.check(
        batch % shards == 0,
        f"batch prompts x group_size = {c.prompts} x {c.group_size} = {batch} is not "
        f"divisible by the data-parallel size {shards}",
    )
    if c.algo == "grpo" and c.grpo.get("micro_batch_seqs", 0):
        micro = micro_batches_for(batch // c.grpo.num_minibatches, c.grpo.micro_batch_seqs, shards)
        errors.check(
            micro is not None,
            f"grpo.micro_batch_seqs={c.grpo.micro_batch_seqs}: no micro-batch count "
            f"splits the {batch // c.grpo.num_minibatches} sequences of an update into "
            f"pieces of at most that many, divisible by the data-parallel size {shards}",
        )
        micro_batches = micro or micro_batches
    if c.algo == "grpo" and c.grpo.get("group_noise", False):
        errors.check(
            c.grpo.num_minibatches * c.grpo.num_epochs == 1,
            "grpo.group_noise=True needs one update per batch (num_minibatches and "
            "num_epochs 1: minibatches reshuffle the rows)",
        )
        try:
            learner.check_group_pairs(c.prompts, c.group_size, micro_batches)
        except ValueError as e:
            errors.check(False, f"grpo.group_noise=True: {e} (the update's micro-batches)")
    schedule = batch_schedule.BatchSchedule.from_config(c)
    layout = c.grpo.get("micro_layout", "strided") if c.algo == "grpo" else "strided"
    if layout == "groups" and not c.grpo.get("group_noise", False) and micro_batches > 1:
        for prompts in schedule.buckets:  # (every P the run takes; fixed: prompts)
            try:
                learner.check_whole_groups(prompts, micro_batches)
            except ValueError as e:
                errors.check(False, f"grpo.micro_layout='groups' at {prompts} prompts: {e}")
                break
    if schedule.kind != "fixed" and not errors:
        start = schedule.start_prompts * c.group_size
        minibatches = c.grpo.num_minibatches if c.algo == "grpo" else 1
        pieces = minibatches * micro_batches * shards
        errors.check(
            start % pieces == 0,
            f"batch_schedule.start_prompts={schedule.start_prompts}: its batch "
            f"{schedule.start_prompts} x {c.group_size} = {start} does not split into "
            f"num_minibatches x micro_batches x data-parallel size = {pieces} equal pieces",
        )
    _raise_if(errors)
    return micro_batches


# Settings that may differ when a run directory is resumed (every other field of the
# resolved config, ``derived`` included, must match): the runway and when to stop
# (extending a run), checkpoint cadence, the stuck-run guards, where things live, the
# process layout of a multi-process launch (its device count: a sharded step equals the
# unsharded one, tests/test_sharding.py) and the compile cache. None of them changes the
# computation of the steps already done.
RESUME_ALLOWED = (
    "distributed",
    "derived.device_count",
    # The typed sections' fields marked so: the runway, when to stop, how summary.json
    # reads N* (target_crossing), checkpoint cadence, the stuck-run guards, where things
    # live and where copies of the metrics go (sections.RunIO, sections.Evaluation), and
    # e.g. async_rollout.enabled; the continuous engine's loop widths (sampling.min_slots,
    # sampling.widths_per_halving: no token changes).
    *sections.resumable(sections.RunIO),
    *sections.resumable(sections.Evaluation),
    *sections.resumable(sections.Optimizer),
    *sections.resumable(RolloutSettings),
    *sections.resumable(AsyncRollout, "async_rollout."),
    *sections.resumable(Sampling, "sampling."),
)


# Fields added after run directories existed: a config.json without one is read with the
# value that computes what the code before the field did (so such a run still resumes
# when the new config keeps it). Validation rows of math files are shuffled since
# task.split_seed exists: an older math run (validation unshuffled) does not resume.
ROLLOUT_KEYS = ("rollout", "prompt")


def _old_micro_batches(old: dict[str, Any]) -> int:
    """The update's micro-batch count of an older config.json (its derived one if any)."""
    section = old.get("grpo") or {}
    return int((old.get("derived") or {}).get("micro_batches", section.get("micro_batches", 1)))


ADDED_FIELDS: dict[str, Any] = {
    "batch_schedule": lambda old: dict(batch_schedule.FIXED),
    # The layout runs measured with before the field: strided; a run of one micro-batch
    # measured nothing, so any layout is its behaviour: today's default.
    "grpo.micro_layout": lambda old: "strided" if _old_micro_batches(old) > 1 else "groups",
    "batch_schedule.calibration": "",
    "variant": "",
    # The derived values the rules set: before them, the clip range as configured, no
    # warm-up, no arithmetic, and a critic's betas by its LR rule alone.
    "derived.clip_low": lambda old: (old.get(old.get("algo", "grpo")) or {}).get("clip_low"),
    "derived.clip_high": lambda old: (old.get(old.get("algo", "grpo")) or {}).get("clip_high"),
    "derived.lr_warmup_updates": 0,
    "derived.hparam_arithmetic": "",
    "derived.critic.adam_rule": "fixed",
}


def _with_added_fields(old: dict[str, Any]) -> dict[str, Any]:
    """``old`` (a config.json) with each missing `ADDED_FIELDS` entry set to its value."""
    import copy

    old = copy.deepcopy(old)
    # First the fields whose older value depends on the file (before the sections' fill).
    _fill_added(old)
    # The typed sections: each field a file lacks at the value its section reads it with.
    for cls in (sections.Optimizer, RolloutSettings, sections.Evaluation, sections.RunIO):
        _fill(old, sections.older_values(cls))
    _fill(old, {"algo": "grpo", "filter_groups": True})
    for name, cls in (("grpo", sections.Grpo), ("ppo", sections.Ppo), ("init", sections.Init)):
        _fill(old, {name: sections.older_values(cls)})
    _fill(old, {"model": sections.older_values(sections.ModelSection)})
    if isinstance(old.get("task"), dict):
        _fill(old["task"], sections.Task.resume_fallbacks(old["task"]))
    return old


def _fill_added(old: dict[str, Any]) -> None:
    """Sets each `ADDED_FIELDS` entry ``old`` lacks (where its parent section exists)."""
    for path, value in ADDED_FIELDS.items():
        *parents, leaf = path.split(".")
        node = old
        for p in parents:
            node = node.get(p) if isinstance(node, dict) else None
        if isinstance(node, dict) and leaf not in node:
            value = value(old) if callable(value) else value
            if value is not None:
                node[leaf] = value


def _fill(node: dict[str, Any], defaults: dict[str, Any]) -> None:
    """Sets each key of ``defaults`` that ``node`` lacks (recursively into sections)."""
    import copy

    for key, value in defaults.items():
        if key not in node:
            node[key] = copy.deepcopy(value)
        elif isinstance(value, dict) and isinstance(node[key], dict):
            _fill(node[key], value)


def resume_diffs(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``"field: old -> new"`` for every setting outside `RESUME_ALLOWED` (a field or a
    dotted path and everything under it) that differs between a run directory's
    config.json (missing `ADDED_FIELDS` read with their values) and a resolved config
    (``to_dict()``)."""
    old = _with_added_fields(old)
    keys = sorted((old.keys() | new.keys()) - {"sweep"})
    diffs = [d for k in keys for d in _leaf_diffs(old.get(k), new.get(k), k)]

    def allowed(diff: str) -> bool:
        path = diff.split(":", 1)[0]
        return any(path == a or path.startswith(a + ".") for a in RESUME_ALLOWED)

    return [d for d in diffs if not allowed(d)]


def _leaf_diffs(old: Any, new: Any, name: str) -> list[str]:
    """``"name.key: old -> new"`` for every leaf that differs between two config values."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for key in sorted(old.keys() | new.keys())
            for d in _leaf_diffs(old.get(key), new.get(key), f"{name}.{key}")
        ]
    if isinstance(old, (list, tuple)) and isinstance(new, (list, tuple)):
        old, new = list(old), list(new)  # (JSON has no tuples)
    return [] if old == new else [f"{name}: {old!r} -> {new!r}"]
