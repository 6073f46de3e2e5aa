"""Batch-size scaling rules for Adam hyperparameters (the one place they are derived).

A run trains with a batch of ``B = P x G`` responses; the reference configuration used
``B_ref`` responses and a tuned learning rate ``lr_ref``. With ``k = B / B_ref``:

- ``sqrt`` (default; Hilton et al. 2022, the study's rule): ``lr = lr_ref * sqrt(k)``.
- ``linear`` (Goyal et al. 2017, an SGD rule): ``lr = lr_ref * k``.
- ``fixed``: ``lr = lr_ref`` (the ablation that breaks invariance).
- ``malladi`` (Malladi et al. 2022, Adam SDE rule): ``lr = lr_ref * sqrt(k)``,
  ``1 - b -> k (1 - b)`` for both betas, ``eps -> eps / sqrt(k)``.

- ``surge`` (Li et al. 2024, "Surge Phenomenon in Optimal Learning Rate and Batch Size
  Scaling", arXiv 2405.14578): with Adam-style (sign-like) updates the optimal LR rises
  with B up to a peak at the gradient noise scale ``B_noise``, then falls::

      lr(B) = lr_peak * 2 / (sqrt(B_noise / B) + sqrt(B / B_noise))

  with ``lr_peak`` chosen so that ``lr(B_ref) = lr_ref``, i.e.
  ``lr = lr_ref * f(B_ref) / f(B)``, ``f(x) = sqrt(B_noise / x) + sqrt(x / B_noise)``.
  ``B_noise`` (responses) is the ``noise_scale`` argument (the run config's
  ``lr_rule_noise_scale``, measured by a pilot: ``B_simple`` in the report). This is the
  paper's Theorem 3 (its Eq. 13: ``eps_opt(B) ~ eps_max / (0.5 (sqrt(B_noise / B) +
  sqrt(B / B_noise)))``, peaking at ``B_peak = B_noise``, Eq. 15; Eq. 23 inverts it for
  ``eps_max`` from one measured ``(B, eps_opt)``, as ``lr_ref`` at ``B_ref`` does here),
  checked against the paper's text. Two limits of it: Theorem 3 holds for
  ``B << pi sigma^2 / (2 mu^2)`` (per-parameter gradient SNR); far past that the optimal
  LR levels off at a non-zero value (Theorem 4), which this rule does not model. And the
  paper's ``B_noise`` (its Eq. 14, estimated from the steps/samples trade-off, Eq. 22) is
  McCandlish et al.'s critical batch, of which ``B_simple`` is the usual estimate.
  Far below the peak it grows like ``sqrt(B)`` (as ``sqrt``); far above it falls like
  ``1 / sqrt(B)``.

Only ``malladi`` changes the betas and eps, unless ``adam_rule="sde"`` asks for its
Adam part (``sde_adam``, the one place it is computed) beside another LR rule. The beta
rule can leave [0, 1) for large
``k`` (``k (1 - b) > 1``, e.g. b2 = 0.999 at k > 1000, b1 = 0.9 at k > 10): then
``1 - b_new`` is clamped to 1, i.e. ``b_new = 0`` (no averaging), and the clamp is
recorded in ``OptimizerHparams.clamped`` and shown by ``describe()``. For ``k < 1`` the
rule gives ``b_new = 1 - k (1 - b)`` which stays in (b, 1), so no clamp is needed there.

Batch-tied rules for hyperparameters beyond the LR (the run config's ``hparam_rules``
section; ``HPARAM_RULES`` lists each field's choices, the first the default that keeps
today's behaviour):

- ``adam``: ``"fixed"`` (the betas and eps as configured) or ``"sde"`` (Malladi et al.'s
  ``1 - b -> k (1 - b)``, ``eps -> eps / sqrt(k)`` beside any LR rule but ``malladi``,
  which already does this).
- ``clip``: ``"fixed"`` or ``"sqrt"``: ``clip_low``/``clip_high`` times ``sqrt(k)``, the
  trust region growing as the ``sqrt`` rule's step does (``scale_clip``), each capped at
  ``CLIP_CAPS`` (ratio bounds no wider than [1/2, 2]); with a batch schedule at the batch
  each update has (the update takes the range as an argument).
- ``warmup``: ``"updates"`` (the LR warm-up lasts ``lr_warmup_updates`` updates at every
  batch) or ``"responses"`` (it lasts as many responses as at the reference batch:
  ``round(W * B_ref / B)`` updates, at least 1; ``scale_warmup``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

RULES = ("sqrt", "linear", "fixed", "malladi", "surge")
# The run config's hparam_rules fields and their choices (the first: the default, which
# computes what the code did before the section existed).
HPARAM_RULES: dict[str, tuple[str, ...]] = {
    "adam": ("fixed", "sde"),
    "clip": ("fixed", "sqrt"),
    "warmup": ("updates", "responses"),
}
HPARAM_DEFAULTS: dict[str, str] = {name: choices[0] for name, choices in HPARAM_RULES.items()}
# The largest clip_low / clip_high the "sqrt" clip rule gives: ratio bounds no wider than
# [1 - 0.5, 1 + 1] = [1/2, 2], a factor of 2 either way in the per-token probability
# ratio. Past that the clipped surrogate no longer bounds the step (at clip_low = 1 the
# lower bound 1 - clip_low reaches 0 and clips nothing), so growing it further with the
# batch would remove the trust region rather than widen it.
CLIP_CAPS: dict[str, float] = {"clip_low": 0.5, "clip_high": 1.0}


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerHparams:
    """Adam hyperparameters for one batch size, with the inputs that produced them.

    Attributes:
      lr, b1, b2, eps: the values to train with.
      rule: the scaling rule name.
      k: batch ratio ``batch / ref_batch``.
      batch, ref_batch: batch sizes in responses (P x G).
      ref_lr, ref_b1, ref_b2, ref_eps: the reference values.
      clamped: names of betas whose ``malladi`` value was clamped to 0.
      noise_scale: ``surge``'s ``B_noise`` in responses (None for the other rules).
      adam_rule: ``"sde"`` when the betas and eps follow the SDE rule beside a non-
        ``malladi`` LR rule (``hparam_rules.adam``), else ``"fixed"``.
    """

    lr: float
    b1: float
    b2: float
    eps: float
    rule: str
    k: float
    batch: int
    ref_batch: int
    ref_lr: float
    ref_b1: float
    ref_b2: float
    ref_eps: float
    clamped: tuple[str, ...] = ()
    noise_scale: float | None = None
    adam_rule: str = "fixed"

    def describe(self) -> str:
        """The arithmetic as one line, for config.json and logs."""
        rule = self.rule + (", adam=sde" if self.adam_rule == "sde" else "")
        head = f"rule={rule}: k = B / B_ref = {self.batch} / {self.ref_batch} = {self.k:g}"
        if self.rule == "fixed":
            parts = [head, f"lr = lr_ref = {self.lr:g}"]
        elif self.rule == "linear":
            parts = [head, f"lr = lr_ref * k = {self.ref_lr:g} * {self.k:g} = {self.lr:g}"]
        elif self.rule == "surge":
            n = self.noise_scale
            parts = [
                head,
                f"B_noise = {n:g}",
                f"lr = lr_ref * f(B_ref) / f(B), f(x) = "
                f"sqrt(B_noise / x) + sqrt(x / B_noise) = {self.ref_lr:g} * "
                f"{_surge_f(self.ref_batch, n):g} / {_surge_f(self.batch, n):g} = {self.lr:g} "
                f"(peak lr {self.ref_lr * _surge_f(self.ref_batch, n) / 2:g} at B = B_noise)",
            ]
        else:
            root = math.sqrt(self.k)
            parts = [head, f"lr = lr_ref * sqrt(k) = {self.ref_lr:g} * {root:g} = {self.lr:g}"]
        if self.rule != "malladi" and self.adam_rule != "sde":
            return "; ".join(parts)
        for name in ("b1", "b2"):
            ref = getattr(self, f"ref_{name}")
            new = getattr(self, name)
            clamp = " (clamped: k * (1 - b) > 1)" if name in self.clamped else ""
            parts.append(
                f"{name} = 1 - k * (1 - {ref:g}) = 1 - {self.k:g} * {1 - ref:g} = {new:g}{clamp}"
            )
        parts.append(
            f"eps = eps_ref / sqrt(k) = {self.ref_eps:g} / {math.sqrt(self.k):g} = {self.eps:g}"
        )
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (with ``describe``) for config.json."""
        out = dataclasses.asdict(self)
        out["clamped"] = list(self.clamped)
        out["describe"] = self.describe()
        return out


def scale_hparams(
    *,
    rule: str = "sqrt",
    batch: int,
    ref_batch: int,
    ref_lr: float,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    noise_scale: float | None = None,
    adam_rule: str = "fixed",
) -> OptimizerHparams:
    """Adam hyperparameters for ``batch`` responses, scaled from the reference.

    Args:
      rule: one of ``RULES``.
      batch: training batch in responses (P x G).
      ref_batch: reference batch in responses.
      ref_lr: learning rate tuned at ``ref_batch``.
      b1, b2, eps: the reference Adam betas and epsilon.
      noise_scale: ``B_noise`` in responses, > 0; needed by ``surge`` (ignored by the
        other rules).
      adam_rule: ``"sde"``: the betas and eps follow the SDE rule (``sde_adam``) beside
        ``rule``; ``"fixed"``: only ``malladi`` changes them.

    Returns:
      ``OptimizerHparams`` (call ``describe()`` for the arithmetic).

    Raises:
      ValueError: for an unknown rule (listing the rules) or non-positive inputs, or
        ``adam_rule="sde"`` beside ``malladi`` (which already applies it).
    """
    if rule not in RULES:
        raise ValueError(f"unknown LR rule {rule!r}; expected one of {RULES}")
    if adam_rule not in HPARAM_RULES["adam"]:
        raise ValueError(f"unknown Adam rule {adam_rule!r}; expected one of {HPARAM_RULES['adam']}")
    if adam_rule == "sde" and rule == "malladi":
        raise ValueError(
            "adam rule 'sde' beside LR rule 'malladi': malladi already scales the betas and "
            "eps (use lr_rule='sqrt' with the 'sde' Adam rule for the same thing)"
        )
    for name, value in (("batch", batch), ("ref_batch", ref_batch)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name} must be a positive int (responses), got {value!r}")
    if not ref_lr > 0:
        raise ValueError(f"ref_lr must be > 0, got {ref_lr!r}")
    for name, value in (("b1", b1), ("b2", b2)):
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    if rule == "surge" and not (
        isinstance(noise_scale, (int, float)) and math.isfinite(noise_scale) and noise_scale > 0
    ):
        raise ValueError(
            f"rule 'surge' needs the noise scale B_noise > 0 (responses; config "
            f"lr_rule_noise_scale), got {noise_scale!r}"
        )

    k = batch / ref_batch
    new = {"lr": ref_lr, "b1": b1, "b2": b2, "eps": eps}
    clamped = []
    if rule == "sqrt":
        new["lr"] = ref_lr * math.sqrt(k)
    elif rule == "linear":
        new["lr"] = ref_lr * k
    elif rule == "surge":
        new["lr"] = ref_lr * _surge_f(ref_batch, noise_scale) / _surge_f(batch, noise_scale)
    elif rule == "malladi":
        new["lr"] = ref_lr * math.sqrt(k)
    if rule == "malladi" or adam_rule == "sde":
        new["b1"], new["b2"], new["eps"], clamped = sde_adam(b1, b2, eps, k)
    return OptimizerHparams(
        **new,
        rule=rule,
        k=k,
        batch=batch,
        ref_batch=ref_batch,
        ref_lr=ref_lr,
        ref_b1=b1,
        ref_b2=b2,
        ref_eps=eps,
        clamped=tuple(clamped),
        noise_scale=float(noise_scale) if rule == "surge" else None,
        adam_rule=adam_rule,
    )


def sde_adam(
    b1: float, b2: float, eps: float, k: float
) -> tuple[float, float, float, tuple[str, ...]]:
    """Malladi et al.'s SDE rule for Adam at batch ratio ``k``: ``1 - b -> k (1 - b)``
    for both betas (``1 - b`` capped at 1, i.e. ``b = 0``), ``eps -> eps / sqrt(k)``.

    Returns:
      ``(b1, b2, eps, clamped)``, ``clamped`` naming the betas that were capped.
    """
    out, clamped = {}, []
    for name, beta in (("b1", b1), ("b2", b2)):
        one_minus = k * (1.0 - beta)
        if one_minus > 1.0:
            one_minus = 1.0
            clamped.append(name)
        out[name] = 1.0 - one_minus
    return out["b1"], out["b2"], eps / math.sqrt(k), tuple(clamped)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClipHparams:
    """The policy-ratio clip range at one batch (``hparam_rules.clip``).

    Attributes:
      clip_low, clip_high: the values to train with (ratio bounds ``1 - clip_low``,
        ``1 + clip_high``).
      rule: ``"fixed"`` or ``"sqrt"``.
      k: batch ratio ``B / B_ref``.
      ref_low, ref_high: the configured values (at ``B_ref``).
      capped: names of the values held at ``CLIP_CAPS``.
    """

    clip_low: float
    clip_high: float
    rule: str
    k: float
    ref_low: float
    ref_high: float
    capped: tuple[str, ...] = ()

    def describe(self) -> str:
        """The arithmetic as one line (for ``derived.hparam_arithmetic``)."""
        if self.rule == "fixed":
            return f"clip=fixed: clip_low = {self.clip_low:g}, clip_high = {self.clip_high:g}"
        root = math.sqrt(self.k)
        parts = []
        for name, ref in (("clip_low", self.ref_low), ("clip_high", self.ref_high)):
            value = getattr(self, name)
            cap = f" (capped at {max(CLIP_CAPS[name], ref):g})" if name in self.capped else ""
            parts.append(f"{name} = {ref:g} * {root:g} = {value:g}{cap}")
        return "clip=sqrt: clip * sqrt(k): " + ", ".join(parts)


def scale_clip(rule: str, clip_low: float, clip_high: float, k: float) -> ClipHparams:
    """The clip range at batch ratio ``k`` under ``rule``: ``"fixed"`` keeps it,
    ``"sqrt"`` multiplies both by ``sqrt(k)``, each at most its ``CLIP_CAPS`` value (or
    the configured value when that is larger: the rule never grows such a one).

    Raises:
      ValueError: an unknown rule, ``k <= 0`` or a negative clip.
    """
    if rule not in HPARAM_RULES["clip"]:
        raise ValueError(f"unknown clip rule {rule!r}; expected one of {HPARAM_RULES['clip']}")
    if not k > 0:
        raise ValueError(f"the batch ratio k must be > 0, got {k!r}")
    if not (clip_low >= 0 and clip_high >= 0):
        raise ValueError(f"clip_low and clip_high must be >= 0, got {clip_low!r}, {clip_high!r}")
    values, capped = {"clip_low": clip_low, "clip_high": clip_high}, []
    if rule == "sqrt":
        for name, given in tuple(values.items()):
            cap = max(CLIP_CAPS[name], given)  # (never below the value as given)
            values[name] = min(given * math.sqrt(k), cap)
            if given * math.sqrt(k) > cap:
                capped.append(name)
    return ClipHparams(
        **values, rule=rule, k=k, ref_low=clip_low, ref_high=clip_high, capped=tuple(capped)
    )


def scale_warmup(rule: str, updates: int, batch: int, ref_batch: int) -> int:
    """The LR warm-up length in updates at ``batch`` responses: ``"updates"`` keeps
    ``updates``; ``"responses"`` keeps the responses it spans at ``ref_batch``:
    ``round(updates * ref_batch / batch)`` (halves up), at least 1 when ``updates > 0``.

    Raises:
      ValueError: an unknown rule, a negative ``updates`` or a non-positive batch.
    """
    if rule not in HPARAM_RULES["warmup"]:
        raise ValueError(f"unknown warm-up rule {rule!r}; expected one of {HPARAM_RULES['warmup']}")
    if not (isinstance(updates, int) and not isinstance(updates, bool) and updates >= 0):
        raise ValueError(f"warm-up updates must be an int >= 0, got {updates!r}")
    if not (batch > 0 and ref_batch > 0):
        raise ValueError(f"batch and ref_batch must be > 0, got {batch!r}, {ref_batch!r}")
    if rule == "updates" or updates == 0:
        return updates
    return max(1, math.floor(updates * ref_batch / batch + 0.5))


def _surge_f(batch: float, noise_scale: float) -> float:
    """``sqrt(B_noise / B) + sqrt(B / B_noise)``: 2 at the peak, ``lr`` is ``1 / f``."""
    return math.sqrt(noise_scale / batch) + math.sqrt(batch / noise_scale)
