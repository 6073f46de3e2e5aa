"""The run config's sections as frozen, validated dataclasses.

Each section class owns its fields' defaults (``experiments/configs/base.py`` builds the
config from them), its validation (``errors``: one message per bad field, the message
naming the field as configured) and its reading of older ``config.json`` files
(``from_config``: a field the file does not have takes its default, which is what the
code did before the field existed). ``rl_batch.runs.config.resolve`` builds every section
once; the code below ``rl_batch.runs`` receives these objects, never a ConfigDict.

Adding a field to a section is one edit (the field, with its default and a comment) plus
its test; ``docs/design.md`` shows one.

This module holds the optimizer section and its batch rules (``Optimizer``,
``HparamRules``, ``CriticRule``, ``BatchRules``): the one derivation of every
batch-dependent value (``BatchRules.at``), used by ``resolve`` at the run's batch and by
the run loop at every batch of a batch schedule.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from rl_batch.algorithms import lr_rules

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
    """``cls`` from a config section: each field the section has, the default for each it
    lacks (a config.json written before the field existed); keys ``cls`` does not know
    are left for the caller's validation."""
    known = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in _plain(given).items() if k in known}
    return cls(**{**values, **extra})


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
        sqrt(k), capped at 0.5 / 1.0 (ratio bounds no wider than [1/2, 2]).
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
        """The settings a batch schedule of ``kind`` over ``batches`` (each bucket's P x G)
        cannot serve, one line each: the run loop sets the policy's LR (with the warm-up's
        factor at that batch, `BatchHparams.warmup_factor`), betas and eps at each batch
        (`at`), while the clip range is set once per run (the compiled update holds it);
        and every bucket's rules must derive."""
        if kind == "fixed":
            return []
        rules = self.optimizer.hparam_rules
        out = []
        if rules.clip != "fixed":
            out.append(
                f"hparam_rules.clip={rules.clip!r} with batch_schedule.kind={kind!r}: the "
                "clip range is set once per run; use hparam_rules.clip='fixed' with a batch "
                "schedule"
            )
        for batch in batches:
            try:
                self.at(batch)
            except ValueError as e:
                out.append(f"batch_schedule at batch {batch}: {e}")
                break
        return out
