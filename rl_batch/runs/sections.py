"""The run config's sections as frozen, validated dataclasses.

Each section class owns its fields' defaults (``experiments/configs/base.py`` builds the
config from them), its validation (``errors``: one message per bad field, the message
naming the field as configured) and its reading of older ``config.json`` files
(``from_config``: a field the file does not have takes its default, which is what the
code did before the field existed). ``rl_batch.runs.config.resolve`` builds every section
once; the code below ``rl_batch.runs`` receives these objects, never a ConfigDict.

Adding a field to a section is one edit (the field, with its default and a comment) plus
its test; ``docs/design.md`` shows one.

This module holds the task, model, init, algorithm (``Algo``: ``Grpo``, ``Ppo``),
evaluation and run I/O sections, the reading of the rollout sections (whose classes are
``rl_batch.rollout.sources``'s: ``rollout_settings``), and the optimizer section and its
batch rules (``Optimizer``, ``HparamRules``, ``CriticRule``, ``BatchRules``): the one
derivation of every batch-dependent value (``BatchRules.at``), used by ``resolve`` at the
run's batch and by the run loop at every batch of a batch schedule. (Over 800 lines
for that reason: every section's fields, defaults and older-file values in one file.)
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

from rl_batch import artifacts
from rl_batch.algorithms import grpo as grpo_lib
from rl_batch.algorithms import lr_rules
from rl_batch.algorithms import ppo as ppo_lib
from rl_batch.rollout.sources import AsyncRollout, PartialRollout, RolloutSettings, Sampling
from rl_batch.tasks.plugin import is_plugin, plugin_splits

# A field that may change when a run directory is resumed carries ``metadata={"resume":
# True}`` (``rl_batch.runs.config.RESUME_ALLOWED`` collects them with `resumable`).


def _is_int(value) -> bool:
    """True for an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def _plain(given: Any) -> dict[str, Any]:
    """A config section (ConfigDict, dict or None) as a plain dict."""
    if given is None:
        return {}
    return dict(given.to_dict() if hasattr(given, "to_dict") else given)


def read(cls, given: Any, **extra: Any):
    """``cls`` from a config section: each field the section has, for each it lacks (a
    config.json written before the field existed) its value in ``cls.OLDER_FILES`` when
    the class has one there (what the code did before the field existed, where that is
    not the default), else its default; keys ``cls`` does not know are left for the
    caller's validation."""
    known = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in _plain(given).items() if k in known}
    older = getattr(cls, "OLDER_FILES", {})
    return cls(**{**{k: v for k, v in older.items() if k not in values}, **values, **extra})


def defaults(cls) -> dict[str, Any]:
    """``{field: default}`` of a section class (nested sections as dicts)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            out[f.name] = defaults(type(value)) if dataclasses.is_dataclass(value) else value
    return out


def older_values(cls) -> dict[str, Any]:
    """``{field: value}`` that `read` gives a field a config.json lacks: the default, or
    the class's ``OLDER_FILES`` value (nested sections as dicts)."""
    return {**defaults(cls), **getattr(cls, "OLDER_FILES", {})}


# The type of an optional field's placeholder (set later from a flag).
_PLACEHOLDERS = {"float | None": float, "int | None": int, "str | None": str}


def config_fields(cls) -> dict[str, Any]:
    """``{field: default}`` of a section class for a run ConfigDict
    (``experiments/configs/base.py``): an optional field unset (None) as a typed
    placeholder, so that ``--config.lr=1e-4`` works; nested sections as ConfigDicts."""
    from ml_collections import ConfigDict, config_dict

    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is None:
            out[f.name] = config_dict.placeholder(_PLACEHOLDERS[f.type])
        elif f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
            nested = dataclasses.is_dataclass(value)
            out[f.name] = ConfigDict(config_fields(type(value))) if nested else value
    return out


def resumable(cls, prefix: str = "") -> tuple[str, ...]:
    """The dotted names of ``cls``'s fields marked `RESUMABLE`."""
    return tuple(prefix + f.name for f in dataclasses.fields(cls) if f.metadata.get("resume"))


def rollout_settings(c: Any) -> RolloutSettings:
    """The rollout sections of run config ``c`` (``sources.RolloutSettings``, whose
    classes own their fields' defaults and checks): each field a config.json written
    before it existed lacks at its default (e.g. the static engine, min_slots 1)."""
    values = _plain(c)
    return read(
        RolloutSettings,
        values,
        sampling=read(Sampling, values.get("sampling")),
        async_rollout=read(AsyncRollout, values.get("async_rollout")),
        partial_rollout=read(PartialRollout, values.get("partial_rollout")),
    )


# --------------------------------------------------------------- task, model, init


# Tasks whose examples are generated from a seed (the character tokenizer, a known
# longest response, their own validation split).
SYNTHETIC_TASKS = ("addition", "arithmetic_mix", "multiplication", "countdown")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """The ``task`` section: what the policy is trained and validated on.

    Attributes:
      name: a registered task (``rl_batch.tasks.registry.TASKS``) or a task class of your
        own, ``"package.module:Class"`` / ``"file.py:Class"`` (``rl_batch.tasks.plugin``).
      kwargs: the task's constructor arguments (synthetic tasks: e.g. n_digits).
      n_train, n_validation: synthetic and plug-in tasks: examples generated per split.
      train_file, validation_file, format: math data (``name="math"``): local JSONL /
        Parquet files in DAPO-Math-17K, GSM8K, MATH or AIME format (``"auto"`` detects).
      instruction: the instruction appended to each math question (None: the default
        ``math_data.DEFAULT_INSTRUCTION``; DAPO prompts carry their own).
      system_prompt: an optional system message of math prompts ("" = none).
      drop_long_prompts: math prompts over the sampler's budget are dropped with a
        warning naming their lines, instead of stopping the run.
      chat_template_kwargs: extra variables of the tokenizer's chat template, e.g.
        ``{"enable_thinking": False}``.
      eval_fraction: no validation_file: hold out this fraction of train_file as the
        validation rows (chosen by split_seed, never trained on).
      split_seed: chooses the held-out rows and shuffles the validation rows of a file
        (the first eval_prompts of them are validated on).
      reward_fn: your own reward instead of the task's verifier,
        ``"package.module:function"`` or ``"file.py:function"``
        (``rl_batch.tasks.custom_reward``); "" = the task's.
    """

    name: str = "addition"
    # Scratchpad responses run to ~31 tokens: generation matters as in LLM RL.
    kwargs: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"n_digits": 3, "scratchpad": True}
    )
    n_train: int = 20_000
    n_validation: int = 512
    train_file: str = ""
    validation_file: str = ""
    format: str = "auto"
    instruction: str | None = None
    system_prompt: str = ""
    drop_long_prompts: bool = False
    chat_template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    eval_fraction: float = 0.0
    split_seed: int = 0
    reward_fn: str = ""

    @classmethod
    def from_config(cls, given: Any) -> Task:
        """A ``task`` section; a config.json written before a field existed reads it at its
        default (what the code did before it)."""
        section = _plain(given)
        for name in ("kwargs", "chat_template_kwargs"):
            if name in section:
                section[name] = _plain(section[name])
        return read(cls, section)

    @staticmethod
    def resume_fallbacks(section: dict[str, Any]) -> dict[str, Any]:
        """The values a config.json's ``task`` section lacking a field is compared with on
        resume: the defaults, except ``kwargs`` (the task's own, not merged) and
        ``split_seed`` of a math run (its validation rows were not shuffled before the
        field existed: such a run does not resume)."""
        out = defaults(Task)
        del out["kwargs"]
        if section.get("name") not in SYNTHETIC_TASKS:
            del out["split_seed"]
        return out

    def plugin_splits(self, task):
        """(train, validation) of a plug-in task (``name="module:Class"``) as configured."""
        return plugin_splits(
            task,
            n_train=self.n_train,
            n_validation=self.n_validation,
            seed=self.split_seed or 0,
            name=f"task.name={self.name!r}",
        )

    @property
    def is_generated(self) -> bool:
        """Whether the examples come from ``make_example`` (synthetic and plug-in tasks)
        rather than files."""
        return self.name in SYNTHETIC_TASKS or is_plugin(self.name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSection:
    """The ``model`` section: the policy's shape (``resolve`` derives ``RunSpec.model``).

    Attributes:
      preset: a ``rl_batch.models.transformer.PRESETS`` name (``init.source="hf"``: the
        checkpoint's shape instead).
      overrides: ``ModelConfig`` fields set on top, e.g. ``{"num_layers": 2}``; a field
        set to None is unset (the run config has a typed placeholder for each).
      master_weights: bf16-compute models keep float32 params and Adam moments
        (``model.with_master_weights``).
    """

    preset: str = "tiny-1m"
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    master_weights: bool = True

    @classmethod
    def from_config(cls, given: Any) -> ModelSection:
        """A ``model`` section (older files: ``master_weights`` on, as before it existed)."""
        section = _plain(given)
        if "overrides" in section:
            section["overrides"] = _plain(section["overrides"])
        return read(cls, section)

    @property
    def set_overrides(self) -> dict[str, Any]:
        """The overrides that are set (not None)."""
        return {k: v for k, v in self.overrides.items() if v is not None}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Init:
    """The ``init`` section: the starting policy.

    Attributes:
      source: ``"pretrain"`` (supervised warm start on the task, cached in work_dir),
        ``"scratch"`` (random init), ``"checkpoint"`` (a run's checkpoint dir), ``"hf"``
        (an HF dir), ``"params"`` (a base policy file, .npz of host arrays:
        ``experiments.pretrain --export``).
      path: the checkpoint, HF directory or params file (checkpoint, hf, params).
    """

    source: str = "pretrain"
    path: str = ""

    @classmethod
    def from_config(cls, given: Any) -> Init:
        """An ``init`` section."""
        return read(cls, given)


# ------------------------------------------------------------------------ algorithm


@dataclasses.dataclass(frozen=True, kw_only=True)
class Grpo:
    """The ``grpo`` section (``rl_batch.algorithms.grpo.GRPOConfig`` documents each of
    its fields and owns their checks) and the two that are not the algorithm's:

    Attributes:
      micro_batch_seqs: > 0: at most this many sequences per micro-batch (a memory budget,
        from ``experiments.plan_memory``); the update's micro-batch count
        (``derived.micro_batches``) is then derived per batch instead of taken from
        ``micro_batches``.
      record_routing: MoE policies: the sampler records each token's experts (logs the
        rollout-vs-update ``moe_routing_disagreement``); ``routing_replay`` also routes
        the update by that record.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    kl_coef: float = 0.0  # KL-to-initial-policy loss term (k3; 0 = no reference kept)
    loss_agg: str = "token_mean"
    advantage: str = "grpo"
    micro_batches: int = 1  # gradient accumulation; same maths
    micro_batch_seqs: int = 0
    num_minibatches: int = 1  # > 1 departs from the one-update-per-batch protocol
    num_epochs: int = 1
    policy_loss: str = "token"
    router_aux_loss_coef: float = 0.0
    record_routing: bool = False
    routing_replay: bool = False
    group_noise: bool = False
    # Which rows each micro-batch holds, so which noise scale B_simple measures
    # (docs/noise_scale.md): "groups" (whole groups: the batch noise scale B_noise =
    # (G tr_inter + tr_intra) / |G|^2, what the report, the adaptive schedule and surge
    # use) or "strided" (rows m, m + M, ...: the intra-prompt term only). Same gradient.
    micro_layout: str = "groups"
    # A config.json written before micro_layout measured with the strided layout.
    OLDER_FILES: ClassVar[dict[str, Any]] = {"micro_layout": "strided"}

    def algorithm(self, *, temperature: float, group_size: int, micro_batches: int):
        """The ``GRPOConfig`` the update trains with (validates the fields)."""
        fields = {f.name for f in dataclasses.fields(grpo_lib.GRPOConfig)}
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in fields}
        values.update(temperature=temperature, group_size=group_size, micro_batches=micro_batches)
        return grpo_lib.GRPOConfig(**values)

    @property
    def records_routing(self) -> bool:
        """Whether the sampler keeps the expert choices (either routing option)."""
        return self.record_routing or self.routing_replay


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ppo:
    """The ``ppo`` section (``rl_batch.algorithms.ppo.PPOConfig`` documents the
    algorithm's fields and owns their checks; ``value_clip`` 0 = off is None there) and
    the critic's optimizer and initialisation:

    Attributes:
      critic_lr_ref, critic_lr_rule, critic_lr, critic_batch_scale: the critic's LR,
        ``critic_lr`` when set, else rule(critic_lr_ref, k x B / batch_ref) with k =
        ``critic_batch_scale`` and the rule ``critic_lr_rule`` ("" = the actor's)
        (`CriticRule`).
      critic_from_policy: the critic's body is a copy of the initial policy's.
    """

    warmup_updates: int = 30  # critic-only updates first (the study's 30)
    critic_lr_ref: float = 1e-3
    critic_lr_rule: str = ""
    critic_lr: float | None = None
    critic_batch_scale: int = 1
    critic_from_policy: bool = True
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True
    value_clip: float = 0.2  # 0 = off (inert with one update per batch: V = V_old there)
    kl_coef: float = 0.0
    kl_estimator: str = "k1"
    clip_low: float = 0.2
    clip_high: float = 0.2
    loss_agg: str = "token_mean"  # actor; the value loss is always a token mean
    micro_batches: int = 1  # gradient accumulation for both networks; same maths

    def algorithm(self, *, temperature: float, micro_batches: int):
        """The ``PPOConfig`` the update trains with (validates the fields)."""
        fields = {f.name for f in dataclasses.fields(ppo_lib.PPOConfig)}
        values = {k: v for k, v in dataclasses.asdict(self).items() if k in fields}
        values.update(
            value_clip=self.value_clip or None, temperature=temperature, micro_batches=micro_batches
        )
        return ppo_lib.PPOConfig(**values)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Algo:
    """The algorithm: the top-level ``algo`` and ``filter_groups`` fields and the
    ``grpo`` / ``ppo`` sections (only the one ``algo`` names is used).

    Attributes:
      name: ``"grpo"`` or ``"ppo"`` (the run config's ``algo``).
      filter_groups: drop groups whose rewards are all equal (DAPO); PPO: False.
      grpo, ppo: `Grpo`, `Ppo`.
    """

    name: str = "grpo"
    filter_groups: bool = True
    grpo: Grpo = dataclasses.field(default_factory=Grpo)
    ppo: Ppo = dataclasses.field(default_factory=Ppo)

    @classmethod
    def from_config(cls, c: Any) -> Algo:
        """The algorithm fields of run config ``c`` (older files: each missing field at
        its default, e.g. ``grpo.group_noise`` off)."""
        values = _plain(c)
        return cls(
            name=values.get("algo", "grpo"),
            filter_groups=values.get("filter_groups", True),
            grpo=read(Grpo, values.get("grpo")),
            ppo=read(Ppo, values.get("ppo")),
        )

    @property
    def section(self) -> Grpo | Ppo:
        """The section of the algorithm the run trains with."""
        return self.ppo if self.name == "ppo" else self.grpo

    @property
    def configured_micro_batches(self) -> int:
        """The section's ``micro_batches`` (before ``grpo.micro_batch_seqs`` derives it)."""
        return self.section.micro_batches

    @property
    def records_routing(self) -> bool:
        """Whether the run asks the sampler for a MoE policy's expert choices."""
        return self.name == "grpo" and self.grpo.records_routing

    def config(self, *, temperature: float, group_size: int, micro_batches: int):
        """The algorithm's own config (``GRPOConfig`` or ``PPOConfig``) at the resolved
        micro-batch count."""
        if self.name == "ppo":
            return self.ppo.algorithm(temperature=temperature, micro_batches=micro_batches)
        return self.grpo.algorithm(
            temperature=temperature, group_size=group_size, micro_batches=micro_batches
        )


# ------------------------------------------------------------------- evaluation, I/O

EVAL_METRICS = ("mean_at_k", "p_ref")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Evaluation:
    """Validation and the target: top-level fields of a run config, in cumulative
    *retained* responses.

    Attributes:
      eval_every_responses: validate every this many retained responses.
      eval_prompts: held-out prompts validated on.
      eval_k: samples per prompt (mean@k).
      eval_greedy: validation samples greedily instead of at the sampling temperature.
      eval_metric: the accuracy the target and N* are on: ``"mean_at_k"`` (sampled; always
        logged as ``eval_mean_at_k``) or ``"p_ref"``, the exact mean p(reference
        response) at the sampling temperature on ``eval_ref_prompts`` validation prompts
        (0 = all; synthetic tasks, ``rl_batch.algorithms.exact_eval``).
      eval_ref_prompts: see ``eval_metric``.
      eval_ref_chunk: validation prompts per call of the teacher-forced p_ref pass (the
        last call padded). A CPU's caches favour small calls (64 rows took 0.77x the time
        of 256 on a 2-core AMD EPYC, docs/cpu_study.md); the values agree to float
        rounding, not bit for bit.
      eval_sampled_every: with ``eval_metric="p_ref"``, the sampled mean@k (``eval_prompts``
        x ``eval_k`` responses) is taken at every this many validations, the first one
        included (validation 0, 1 x this, 2 x this, ...); the others log p_ref alone. The
        sampled metric is then a check that p_ref tracks the sampled accuracy
        (``rl_batch.analysis.measurement.validation_noise``), not what N* is on. 1 = every
        validation; ``eval_metric="mean_at_k"`` needs 1.
      target: the validation accuracy (``eval_metric``) to reach.
      target_band_lo: set: N*, T and q are also taken over the band [target_band_lo,
        target] (``rl_batch.targets.time_to_band``); None: the single target.
      target_crossing: how N* is read off the evaluations (``rl_batch.targets.CROSSINGS``):
        ``"update"`` (the update that realizes the interpolated crossing) or ``"linear"``.
      stop_at_target: stop once the target has been reached ``confirm_evals`` times.
      confirm_evals: see ``stop_at_target``.
    """

    eval_every_responses: int = 1024
    eval_prompts: int = 128
    eval_k: int = 4
    eval_greedy: bool = True
    eval_metric: str = "mean_at_k"
    eval_ref_prompts: int = 0
    eval_ref_chunk: int = 256
    eval_sampled_every: int = dataclasses.field(default=1, metadata={"resume": True})
    target: float = 0.5
    target_band_lo: float | None = None
    target_crossing: str = dataclasses.field(default="update", metadata={"resume": True})
    stop_at_target: bool = dataclasses.field(default=False, metadata={"resume": True})
    confirm_evals: int = dataclasses.field(default=2, metadata={"resume": True})

    @classmethod
    def from_config(cls, c: Any) -> Evaluation:
        """The evaluation fields of run config ``c`` (older files: missing ones, e.g.
        ``target_crossing``, at their defaults)."""
        return read(cls, c)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunIO:
    """Where a run writes, what it logs and when it stops: top-level fields of a run
    config. None of them changes the computation of an update.

    Attributes:
      name: the run's name (the sweep sets it).
      variant: the sweep's named variant of the base config (``sweep.variants``), if any.
      run_dir: the output directory (required to train).
      work_dir: caches: TFDS data, warm-start checkpoints, the compile cache.
      xla_cache: cache compiled programs in ``<work_dir>/xla_cache`` (JAX's persistent
        cache; ``$JAX_COMPILATION_CACHE_DIR``, when set, wins).
      budget_responses: the runway: retained responses before the run stops.
      checkpoint_every: updates between checkpoints.
      checkpoint_min_s: a checkpoint due by ``checkpoint_every`` is skipped while fewer
        than this many seconds passed since the run's last save (or its start); 0 = none
        skipped. The final checkpoint is always written (but see ``prune_at_target``); a
        crash loses at most this long plus ``checkpoint_every`` updates.
      prune_at_target: a ``sweep.keep_checkpoints`` policy (``rl_batch.runs.retention``)
        that the run applies itself when it stops at its confirmed target, where the
        sweep would apply it a moment later (the sweep sets it). One that keeps no step of
        such a run (``"extendable"``, ``"none"``) saves no final checkpoint: the run leaves
        ``checkpoints/removed.json`` (its final counters and metrics lines) and removes
        the steps it saved before, as the sweep would. ``""`` (default) or ``"all"``: the
        final checkpoint is written.
      max_consecutive_skips: non-finite updates in a row before the run stops.
      max_empty_rollouts: all-filtered rollout batches in a row before the run stops.
      max_kv_bytes: KV-cache bound of one generation chunk; 0 = unchecked (the run stops
        at start-up when a chunk would exceed it: lower gen_batch).
      tracking: dashboards that get a copy of every metrics line, a comma list of
        ``"jsonl"``, ``"tensorboard"``, ``"wandb"`` (``rl_batch.runs.tracking``).
      log_generations: validation prompts whose sampled responses go to
        generations.jsonl at every validation; 0 = off.
      log_generations_every: every this many updates, the training rollout's first
        ``log_generations`` prompts (at least 1) go there too; 0 = off.
    """

    name: str = dataclasses.field(default="", metadata={"resume": True})
    variant: str = ""
    run_dir: str = dataclasses.field(default="", metadata={"resume": True})
    work_dir: str = dataclasses.field(
        default_factory=lambda: artifacts.default_dir(".", "workdir"), metadata={"resume": True}
    )
    xla_cache: bool = dataclasses.field(default=True, metadata={"resume": True})
    budget_responses: int = dataclasses.field(default=16_384, metadata={"resume": True})
    checkpoint_every: int = dataclasses.field(default=25, metadata={"resume": True})
    checkpoint_min_s: float = dataclasses.field(default=0.0, metadata={"resume": True})
    prune_at_target: str = dataclasses.field(default="", metadata={"resume": True})
    max_consecutive_skips: int = dataclasses.field(default=5, metadata={"resume": True})
    max_empty_rollouts: int = dataclasses.field(default=20, metadata={"resume": True})
    max_kv_bytes: int = 0
    tracking: str = dataclasses.field(default="jsonl", metadata={"resume": True})
    log_generations: int = dataclasses.field(default=4, metadata={"resume": True})
    log_generations_every: int = dataclasses.field(default=0, metadata={"resume": True})

    # A config.json written before these fields existed: no compile cache, no generations.
    OLDER_FILES: ClassVar[dict[str, Any]] = {"xla_cache": False, "log_generations": 0}

    @classmethod
    def from_config(cls, c: Any) -> RunIO:
        """The I/O fields of run config ``c`` (older files: missing ones at their
        defaults, e.g. no generations logged from training rollouts)."""
        return read(cls, c)


# --------------------------------------------------------------- optimizer and rules


@dataclasses.dataclass(frozen=True, kw_only=True)
class Adam:
    """The Adam settings one network trains with (at one batch, after its rule)."""

    lr: float
    b1: float
    b2: float
    eps: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class HparamRules:
    """The ``hparam_rules`` section: batch-tied rules beyond the LR, each at
    k = B / batch_ref (`rl_batch.algorithms.lr_rules`). The defaults keep them fixed.

    Attributes:
      adam: ``"fixed"`` or ``"sde"``: Malladi et al.'s 1 - b -> k (1 - b), eps -> eps /
        sqrt(k) beside lr_rule (not with ``"malladi"``, which already does it, nor with a
        fixed lr).
      clip: ``"fixed"`` or ``"sqrt"``: clip_low / clip_high (grpo or ppo section) times
        sqrt(k), capped at 0.5 / 1.0 (ratio bounds no wider than [1/2, 2]). With a batch
        schedule, k of the batch each update has (the update takes the range as an
        argument: ``RunSpec.clip_at``).
      warmup: ``"updates"``: the warm-up lasts lr_warmup_updates updates at any batch;
        ``"responses"``: as many responses as at batch_ref, round(lr_warmup_updates *
        batch_ref / B) updates.
    """

    adam: str = lr_rules.HPARAM_DEFAULTS["adam"]
    clip: str = lr_rules.HPARAM_DEFAULTS["clip"]
    warmup: str = lr_rules.HPARAM_DEFAULTS["warmup"]

    @classmethod
    def from_config(cls, given: Any) -> HparamRules:
        """The section (missing, or missing a field: each at its default)."""
        return read(cls, given)

    @staticmethod
    def unknown_errors(given: Any) -> list[str]:
        """One message per key of a ``hparam_rules`` section that names no rule (their
        choices: `Optimizer.errors`)."""
        return [
            f"hparam_rules.{name}: no such rule (rules: {sorted(lr_rules.HPARAM_RULES)})"
            for name in _plain(given)
            if name not in lr_rules.HPARAM_RULES
        ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Optimizer:
    """The policy optimizer and its LR rule: top-level fields of a run config.

    Attributes:
      lr_rule: ``"sqrt"``, ``"linear"``, ``"fixed"``, ``"malladi"`` or ``"surge"``:
        lr = rule(lr_ref, B / batch_ref) (`rl_batch.algorithms.lr_rules`).
      lr_ref: the LR tuned at ``batch_ref``.
      batch_ref: responses (P x G) at which ``lr_ref`` was tuned.
      lr_rule_noise_scale: ``"surge"``: the noise scale B_noise in responses where its LR
        peaks (> 0; measure it in a pilot: B_simple in the report). Unused by the others.
      lr: None (unset): derived from the rule (``derived.lr``/``b1``/``b2``/``eps``); a
        value > 0 overrides the rule.
      b1, b2, eps: Adam's settings at ``batch_ref``.
      weight_decay: AdamW's decoupled weight decay.
      max_grad_norm: global gradient-norm clip; 0 = off.
      lr_warmup_updates: policy LR warm-up: update i (from 0) trains at lr * min(1, (i +
        1) / W), W the effective warm-up (``derived.lr_warmup_updates``, see
        ``hparam_rules.warmup``); 0 = none. With a batch schedule W is the one at the
        batch each update has (`BatchHparams.warmup_factor`).
      hparam_rules: `HparamRules`.
    """

    lr_rule: str = "sqrt"
    lr_ref: float = 5e-5
    batch_ref: int = 128
    lr_rule_noise_scale: float = 0.0
    lr: float | None = None
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    lr_warmup_updates: int = 0
    hparam_rules: HparamRules = dataclasses.field(default_factory=HparamRules)

    def __post_init__(self):
        errors = self.errors()
        if errors:
            raise ValueError("; ".join(errors))

    @classmethod
    def from_config(cls, c: Any) -> Optimizer:
        """The optimizer fields of run config ``c`` (older files: missing ones at their
        defaults, ``hparam_rules`` among them)."""
        top = {f.name: c[f.name] for f in dataclasses.fields(cls) if f.name in c}
        top["hparam_rules"] = HparamRules.from_config(c.get("hparam_rules"))
        return cls(**top)

    def errors(self) -> list[str]:
        """One message per invalid field (the rules' choices: `HparamRules.errors_of`)."""
        out = []

        def check(ok: bool, message: str) -> None:
            if not ok:
                out.append(message)

        check(
            self.lr_ref > 0 and math.isfinite(self.lr_ref),
            f"lr_ref={self.lr_ref}: must be finite and > 0",
        )
        check(self.batch_ref >= 1, f"batch_ref={self.batch_ref}: must be >= 1")
        check(
            self.lr is None or (self.lr > 0 and math.isfinite(self.lr)),
            f"lr={self.lr}: must be > 0, or None (unset) to derive it from lr_rule",
        )
        for name in ("b1", "b2"):
            value = getattr(self, name)
            check(0.0 <= value < 1.0, f"{name}={value}: must be in [0, 1)")
        check(self.eps >= 0, f"eps={self.eps}: must be >= 0")
        check(self.weight_decay >= 0, f"weight_decay={self.weight_decay}: must be >= 0")
        check(
            self.max_grad_norm >= 0,
            f"max_grad_norm={self.max_grad_norm}: must be >= 0 (0 = off)",
        )
        for name, choices in lr_rules.HPARAM_RULES.items():
            value = getattr(self.hparam_rules, name)
            check(value in choices, f"hparam_rules.{name}={value!r}: expected one of {choices}")
        warmup = self.lr_warmup_updates
        check(
            _is_int(warmup) and warmup >= 0,
            f"lr_warmup_updates={warmup!r}: must be an int >= 0 (0 = no warm-up)",
        )
        if self.hparam_rules.adam == "sde":
            check(
                self.lr_rule != "malladi",
                "hparam_rules.adam='sde' with lr_rule='malladi': malladi already scales the "
                "betas and eps (use lr_rule='sqrt' with hparam_rules.adam='sde' for the same)",
            )
            check(
                self.lr is None,
                f"hparam_rules.adam='sde' with lr={self.lr}: a fixed lr keeps the Adam "
                "settings as given; unset lr to derive both from the rules",
            )
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class CriticRule:
    """PPO's critic optimizer rule (from the ``ppo`` section): its LR is ``lr`` when set,
    else ``lr_rule`` (the actor's when "") applied to ``lr_ref`` at k x B,
    k = ``batch_scale`` (the critic steps once per k rollout batches)."""

    lr_ref: float
    lr_rule: str
    lr: float | None
    batch_scale: int

    @classmethod
    def from_config(cls, c: Any) -> CriticRule | None:
        """The critic rule of a PPO run config (None for GRPO)."""
        if c.algo != "ppo":
            return None
        p = c.ppo
        return cls(
            lr_ref=p.critic_lr_ref,
            lr_rule=p.critic_lr_rule,
            lr=p.critic_lr,
            batch_scale=p.critic_batch_scale,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchHparams:
    """Every batch-dependent value of a run at one batch of B responses (`BatchRules.at`).

    Attributes:
      batch: B.
      adam: the policy's Adam settings (``lr`` when set, else the LR rule's; the rule's
        betas and eps, or the configured ones beside a fixed ``lr``).
      rule: the LR rule's whole result at B (its ``describe()``: ``lr_arithmetic``).
      clip: the policy-ratio clip range at B (``hparam_rules.clip``).
      warmup_updates: the LR warm-up in updates at B (``hparam_rules.warmup``).
      hparam_arithmetic: how the non-default ``hparam_rules`` got there ("" when none is).
      critic_adam, critic_rule: PPO's critic settings at k x B and its rule's result
        (None for GRPO).
    """

    batch: int
    adam: Adam
    rule: lr_rules.OptimizerHparams
    clip: lr_rules.ClipHparams
    warmup_updates: int
    hparam_arithmetic: str
    critic_adam: Adam | None = None
    critic_rule: lr_rules.OptimizerHparams | None = None

    @property
    def lr_arithmetic(self) -> str:
        """How the LR rule got to ``rule.lr``, in words."""
        return self.rule.describe()

    def warmup_factor(self, update: int) -> float:
        """The LR warm-up's factor at update ``update`` (from 0) made at this batch:
        ``min(1, (update + 1) / warmup_updates)``, 1 without a warm-up (the optimizer's
        ``warmup_lr`` schedule at a fixed batch; a batch schedule's run loop applies it
        at each batch it takes, so ``hparam_rules.warmup = "responses"`` shortens the
        warm-up as P grows)."""
        if self.warmup_updates <= 0:
            return 1.0
        return min(1.0, (update + 1) / self.warmup_updates)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchRules:
    """The optimizer section with the other batch-tied settings the rules scale (the
    algorithm's clip range as configured, PPO's critic rule): the one derivation of every
    batch-dependent value, at the run's batch (``resolve``) and at each batch of a batch
    schedule (the run loop)."""

    optimizer: Optimizer
    clip_low: float
    clip_high: float
    critic: CriticRule | None = None

    @classmethod
    def from_config(cls, c: Any) -> BatchRules:
        """The rules of (validated) run config ``c``; older files as `Optimizer` reads them."""
        section = c.get(c.get("algo", "grpo")) or {}
        return cls(
            optimizer=Optimizer.from_config(c),
            clip_low=section.get("clip_low"),
            clip_high=section.get("clip_high"),
            critic=CriticRule.from_config(c),
        )

    def at(self, batch: int) -> BatchHparams:
        """Every batch-dependent value at ``batch`` responses.

        Raises:
          ValueError: the LR rule cannot serve ``batch`` (an unknown rule, ``surge``
            without its noise scale), naming ``lr_rule``.
        """
        o = self.optimizer
        try:
            hp = lr_rules.scale_hparams(
                rule=o.lr_rule,
                ref_lr=o.lr_ref,
                batch=batch,
                ref_batch=o.batch_ref,
                b1=o.b1,
                b2=o.b2,
                eps=o.eps,
                noise_scale=o.lr_rule_noise_scale,
                adam_rule=o.hparam_rules.adam,
            )
        except ValueError as e:
            raise ValueError(f"lr_rule={o.lr_rule!r}: {e}") from e
        if o.lr is None:
            adam = Adam(lr=hp.lr, b1=hp.b1, b2=hp.b2, eps=hp.eps)
        else:
            adam = Adam(lr=o.lr, b1=o.b1, b2=o.b2, eps=o.eps)
        critic_adam, critic_hp = self._critic_at(batch)
        clip, warmup, words = self._hparams_at(batch)
        return BatchHparams(
            batch=batch,
            adam=adam,
            rule=hp,
            clip=clip,
            warmup_updates=warmup,
            hparam_arithmetic=words,
            critic_adam=critic_adam,
            critic_rule=critic_hp,
        )

    def _critic_at(self, batch: int):
        """The critic's Adam settings and rule result at its effective batch k x B (it
        steps once per ``batch_scale`` rollout batches on their mean gradient)."""
        if self.critic is None:
            return None, None
        o, critic = self.optimizer, self.critic
        rule = critic.lr_rule or o.lr_rule
        hp = lr_rules.scale_hparams(
            rule=rule,
            ref_lr=critic.lr_ref,
            batch=batch * critic.batch_scale,
            ref_batch=o.batch_ref,
            b1=o.b1,
            b2=o.b2,
            eps=o.eps,
            noise_scale=o.lr_rule_noise_scale,
            # (a malladi critic already scales its betas and eps)
            adam_rule="fixed" if rule == "malladi" else o.hparam_rules.adam,
        )
        lr = hp.lr if critic.lr is None else critic.lr
        return Adam(lr=lr, b1=hp.b1, b2=hp.b2, eps=hp.eps), hp

    def _hparams_at(self, batch: int) -> tuple[lr_rules.ClipHparams, int, str]:
        """The clip range and the LR warm-up (updates) at ``batch``, and the arithmetic of
        the rules off their defaults ("" when none is)."""
        o, rules = self.optimizer, self.optimizer.hparam_rules
        k = batch / o.batch_ref
        clip = lr_rules.scale_clip(rules.clip, self.clip_low, self.clip_high, k)
        given = o.lr_warmup_updates
        warmup = lr_rules.scale_warmup(rules.warmup, given, batch, o.batch_ref)
        words = []
        if rules.clip != lr_rules.HPARAM_DEFAULTS["clip"]:
            words.append(clip.describe())
        if rules.warmup != lr_rules.HPARAM_DEFAULTS["warmup"]:
            words.append(
                f"warmup=responses: lr_warmup_updates = round(W * B_ref / B) = "
                f"round({given} * {o.batch_ref} / {batch}) = {warmup}"
            )
        return clip, warmup, "; ".join(words)

    def schedule_errors(self, kind: str, batches: tuple[int, ...]) -> list[str]:
        """The batches a batch schedule of ``kind`` over ``batches`` (each bucket's P x G)
        cannot serve, one line (the first such bucket): the run loop sets the policy's LR
        (with the warm-up's factor at that batch, `BatchHparams.warmup_factor`), betas and
        eps (`at`) and passes the clip range at that batch to the update
        (``RunSpec.clip_at``), so every rule serves a schedule when every bucket's
        values derive."""
        if kind == "fixed":
            return []
        out = []
        for batch in batches:
            try:
                self.at(batch)
            except ValueError as e:
                out.append(f"batch_schedule at batch {batch}: {e}")
                break
        return out
