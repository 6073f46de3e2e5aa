"""RunSpec: one run's inputs and every value derived from them, resolved once.

``rl_batch.runs.config.resolve(config)`` validates a run config and returns a
``RunSpec``; nothing after it resolves again. A sweep plans specs, its workers and
subprocesses receive ``spec.to_json()``, and ``<run>/config.json`` is that JSON: the
inputs exactly as configured plus a ``derived`` section. ``RunSpec.from_json`` reads it
back without recomputing anything, so a config.json written before the spec existed
(the same format) still loads and resumes.

The typed fields own the derived values; ``spec.config`` is the read-only config view
(inputs + ``derived``) for code that reads configured fields (``spec.config.task.name``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from ml_collections import ConfigDict, FrozenConfigDict

from rl_batch.algorithms import grpo, lr_rules, ppo
from rl_batch.models import transformer as model_lib
from rl_batch.rollout.sources import RolloutSettings
from rl_batch.runs import sections
from rl_batch.runs.batch_schedule import BatchSchedule
from rl_batch.runs.sections import Adam, BatchHparams, BatchRules

__all__ = ["Adam", "RunSpec"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A resolved run: the configured inputs and every derived value.

    Attributes:
      inputs: every configured field, exactly as given (no ``derived``, no ``sweep``).
      batch: B = prompts x group_size, the responses one rollout batch generates (the
        one meaning of "batch" in a config; a metrics line's ``batch_responses`` counts
        the retained responses of one update).
      optimizer: the policy's Adam settings at B (``lr`` when set, else ``lr_rule``
        applied to ``lr_ref`` at B / ``batch_ref``; the rule's betas and eps).
      lr_arithmetic: how the rule got to ``optimizer.lr``, in words.
      critic_optimizer: PPO's critic Adam settings at k x B (None for GRPO).
      critic_rule: the critic rule's whole result (None for GRPO).
      micro_batches: the update's gradient-accumulation micro-batches.
      max_prompt_len: prompt tokens the run accepts (the task's longest + BOS).
      max_new_tokens: response tokens the sampler generates at most (+ EOS).
      model: the policy's model config.
      algorithm: ``grpo.GRPOConfig`` or ``ppo.PPOConfig`` of the run.
      device_count: devices the run's mesh spans.
      python: the Python version that resolved it.
      batch_schedule: the prompts per rollout batch over the run (from the inputs'
        ``batch_schedule`` section; fixed at ``prompts`` when it has none).
      clip_low, clip_high: the policy-ratio clip range at B (``hparam_rules.clip``; the
        algorithm config trains with them).
      lr_warmup_updates: the policy LR's warm-up in updates at B (``lr_warmup_updates``
        under ``hparam_rules.warmup``; 0 = none).
      hparam_arithmetic: how the non-default ``hparam_rules`` got there, in words ("" when
        every rule keeps its default).
      rollout: the rollout sections (``sources.RolloutSettings``: sampling, async and
        partial rollout, gen_batch, rollout_keys), as ``RolloutSource`` reads them.
      rules: the optimizer section and the batch rules (``sections.BatchRules``): the one
        derivation of every batch-dependent value (``hparams_at``).
      task, model_section, init, algo, evaluation, io: the run config's other sections
        (``sections.Task``, ``ModelSection``, ``Init``, ``Algo``, ``Evaluation``,
        ``RunIO``), each read once from the inputs with its defaults for what an older
        config.json lacks.
    """

    inputs: FrozenConfigDict
    batch: int
    optimizer: Adam
    lr_arithmetic: str
    critic_optimizer: Adam | None = None
    critic_rule: lr_rules.OptimizerHparams | None = None
    micro_batches: int
    max_prompt_len: int
    max_new_tokens: int
    model: model_lib.ModelConfig
    algorithm: grpo.GRPOConfig | ppo.PPOConfig
    device_count: int
    python: str
    batch_schedule: BatchSchedule
    clip_low: float
    clip_high: float
    lr_warmup_updates: int
    hparam_arithmetic: str
    rules: BatchRules
    rollout: RolloutSettings
    task: sections.Task
    model_section: sections.ModelSection
    init: sections.Init
    algo: sections.Algo
    evaluation: sections.Evaluation
    io: sections.RunIO

    @classmethod
    def build(
        cls,
        inputs: ConfigDict,
        *,
        batch: int,
        policy: lr_rules.OptimizerHparams | Adam,
        lr_arithmetic: str,
        critic_optimizer: Adam | None,
        critic_rule: lr_rules.OptimizerHparams | None,
        micro_batches: int,
        max_prompt_len: int,
        max_new_tokens: int,
        model: model_lib.ModelConfig,
        device_count: int,
        python: str,
        clip_low: float,
        clip_high: float,
        lr_warmup_updates: int,
        hparam_arithmetic: str,
    ) -> RunSpec:
        """A spec from validated inputs and the derived values (``config.resolve``)."""
        inputs = ConfigDict(inputs.to_dict())
        for section in ("derived", "sweep"):
            if section in inputs:
                del inputs[section]
        rollout = sections.rollout_settings(inputs)
        algo = sections.Algo.from_config(inputs)
        algorithm = algo.config(
            temperature=rollout.sampling.temperature,
            group_size=rollout.group_size,
            micro_batches=micro_batches,
        )
        return cls(
            inputs=FrozenConfigDict(inputs),
            batch=batch,
            optimizer=Adam(lr=policy.lr, b1=policy.b1, b2=policy.b2, eps=policy.eps),
            lr_arithmetic=lr_arithmetic,
            critic_optimizer=critic_optimizer,
            critic_rule=critic_rule,
            micro_batches=micro_batches,
            max_prompt_len=max_prompt_len,
            max_new_tokens=max_new_tokens,
            model=model,
            algorithm=algorithm.replace(clip_low=clip_low, clip_high=clip_high),
            device_count=device_count,
            python=python,
            batch_schedule=BatchSchedule.from_config(inputs),
            rules=BatchRules.from_config(inputs),
            rollout=rollout,
            task=sections.Task.from_config(inputs.get("task")),
            model_section=sections.ModelSection.from_config(inputs.get("model")),
            init=sections.Init.from_config(inputs.get("init")),
            algo=algo,
            evaluation=sections.Evaluation.from_config(inputs),
            io=sections.RunIO.from_config(inputs),
            clip_low=clip_low,
            clip_high=clip_high,
            lr_warmup_updates=lr_warmup_updates,
            hparam_arithmetic=hparam_arithmetic,
        )

    def hparams_at(self, batch: int) -> BatchHparams:
        """Every batch-dependent value at a rollout batch of ``batch`` responses (a batch
        schedule's current P x G), by the derivation ``resolve`` used at ``self.batch``."""
        return self.rules.at(batch)

    def optimizer_at(self, batch: int, update: int | None = None) -> Adam:
        """The policy's Adam settings at a rollout batch of ``batch`` responses:
        ``optimizer`` itself (as resolved, or as a config.json recorded it) at the
        configured batch, else ``hparams_at(batch).adam``; with ``update`` (a batch
        schedule's update, from 0) the LR times the warm-up's factor at that batch."""
        adam = self.optimizer if batch == self.batch else self.hparams_at(batch).adam
        if update is None:
            return adam
        factor = self.hparams_at(batch).warmup_factor(update)
        return dataclasses.replace(adam, lr=adam.lr * factor)

    def clip_at(self, batch: int) -> tuple[float, float]:
        """The policy-ratio clip range ``(clip_low, clip_high)`` at a rollout batch of
        ``batch`` responses: ``clip_low``/``clip_high`` themselves (as resolved, or as a
        config.json recorded them) at the configured batch, else ``hparams_at(batch).clip``
        (``hparam_rules.clip`` at that batch)."""
        if batch == self.batch:
            return self.clip_low, self.clip_high
        clip = self.hparams_at(batch).clip
        return clip.clip_low, clip.clip_high

    # ------------------------------------------------------------ the JSON form

    def derived(self) -> dict[str, Any]:
        """The ``derived`` section of ``config.json`` (keys as written since it existed)."""
        out: dict[str, Any] = dataclasses.asdict(self.optimizer)
        out["lr_arithmetic"] = self.lr_arithmetic
        if self.critic_optimizer is not None:
            out["critic_lr"] = self.critic_optimizer.lr
            out["critic"] = self.critic_rule.to_dict()
        out.update(
            micro_batches=self.micro_batches,
            batch=self.batch,
            max_prompt_len=self.max_prompt_len,
            max_new_tokens=self.max_new_tokens,
            model=self.model.to_dict(),
            num_params=self.model.num_params,
            device_count=self.device_count,
            python=self.python,
            clip_low=self.clip_low,
            clip_high=self.clip_high,
            lr_warmup_updates=self.lr_warmup_updates,
            hparam_arithmetic=self.hparam_arithmetic,
        )
        return out

    def to_json(self) -> dict[str, Any]:
        """``config.json``: the inputs plus the ``derived`` section (JSON types only)."""
        return {**_plain(self.inputs.to_dict()), "derived": _plain(self.derived())}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSpec:
        """The spec a ``to_json()`` (a run's ``config.json``) describes; nothing is recomputed.

        Raises:
          ValueError: ``data`` has no ``derived`` section (an unresolved config: resolve it
            with ``rl_batch.runs.config.resolve``).
        """
        derived = data.get("derived")
        if not isinstance(derived, dict):
            raise ValueError("a run spec needs its derived section (resolve the config first)")
        inputs = ConfigDict({k: v for k, v in data.items() if k not in ("derived", "sweep")})
        stops = inputs.get("sampling", {}).get("stop_strings")
        if isinstance(stops, list):  # (JSON has no tuples)
            del inputs.sampling["stop_strings"]
            inputs.sampling.stop_strings = tuple(stops)
        critic, critic_optimizer = derived.get("critic"), None
        if critic is not None:
            fields = {f.name for f in dataclasses.fields(lr_rules.OptimizerHparams)}
            critic = {k: v for k, v in critic.items() if k in fields}
            critic = lr_rules.OptimizerHparams(**{**critic, "clamped": tuple(critic["clamped"])})
            critic_optimizer = Adam(
                lr=derived["critic_lr"], b1=critic.b1, b2=critic.b2, eps=critic.eps
            )
        batch = derived.get("batch", inputs.prompts * inputs.group_size)  # (older files)
        clips = inputs.get(inputs.get("algo", "grpo"), {})  # (older files: as configured)
        return cls.build(
            inputs,
            batch=batch,
            policy=Adam(lr=derived["lr"], b1=derived["b1"], b2=derived["b2"], eps=derived["eps"]),
            lr_arithmetic=derived.get("lr_arithmetic", ""),
            critic_optimizer=critic_optimizer,
            critic_rule=critic,
            micro_batches=derived["micro_batches"],
            max_prompt_len=derived["max_prompt_len"],
            max_new_tokens=derived["max_new_tokens"],
            model=model_lib.ModelConfig.from_dict(derived["model"]),
            device_count=derived["device_count"],
            python=derived.get("python", ""),
            clip_low=derived.get("clip_low", clips.get("clip_low")),
            clip_high=derived.get("clip_high", clips.get("clip_high")),
            lr_warmup_updates=derived.get("lr_warmup_updates", 0),
            hparam_arithmetic=derived.get("hparam_arithmetic", ""),
        )

    @functools.cached_property
    def config(self) -> FrozenConfigDict:
        """The read-only config view: the inputs plus ``derived`` (as ``config.json``)."""
        return FrozenConfigDict(ConfigDict(self.to_json()))

    def replace_inputs(self, **changes: Any) -> RunSpec:
        """This spec with top-level inputs that derive nothing changed (``run_dir``,
        ``name``, ``budget_responses``, ...): a resumed or relocated run."""
        inputs = ConfigDict(self.inputs.to_dict())
        for key, value in changes.items():
            inputs[key] = value
        return dataclasses.replace(self, inputs=FrozenConfigDict(inputs))


def _plain(value: Any) -> Any:
    """``value`` with tuples as lists (what JSON reads back), recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
