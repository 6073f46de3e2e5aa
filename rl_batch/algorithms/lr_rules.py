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
  ``lr_rule_noise_scale``, measured by a pilot: ``B_simple`` in the report). The form is
  the one stated in the issue and recalled from the paper (its optimal-LR law,
  ``eps_opt(B) = eps_max / (0.5 (sqrt(B_noise / B) + sqrt(B / B_noise)))``, peaking at
  ``B_peak = B_noise``); the paper's text was not at hand to check the equation against.
  Far below the peak it grows like ``sqrt(B)`` (as ``sqrt``); far above it falls like
  ``1 / sqrt(B)``.

Only ``malladi`` changes the betas and eps. Its beta rule can leave [0, 1) for large
``k`` (``k (1 - b) > 1``, e.g. b2 = 0.999 at k > 1000, b1 = 0.9 at k > 10): then
``1 - b_new`` is clamped to 1, i.e. ``b_new = 0`` (no averaging), and the clamp is
recorded in ``OptimizerHparams.clamped`` and shown by ``describe()``. For ``k < 1`` the
rule gives ``b_new = 1 - k (1 - b)`` which stays in (b, 1), so no clamp is needed there.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

RULES = ("sqrt", "linear", "fixed", "malladi", "surge")


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

    def describe(self) -> str:
        """The arithmetic as one line, for config.json and logs."""
        head = f"rule={self.rule}: k = B / B_ref = {self.batch} / {self.ref_batch} = {self.k:g}"
        if self.rule == "fixed":
            return f"{head}; lr = lr_ref = {self.lr:g}"
        if self.rule == "linear":
            return f"{head}; lr = lr_ref * k = {self.ref_lr:g} * {self.k:g} = {self.lr:g}"
        if self.rule == "surge":
            n = self.noise_scale
            return (
                f"{head}; B_noise = {n:g}; lr = lr_ref * f(B_ref) / f(B), f(x) = "
                f"sqrt(B_noise / x) + sqrt(x / B_noise) = {self.ref_lr:g} * "
                f"{_surge_f(self.ref_batch, n):g} / {_surge_f(self.batch, n):g} = {self.lr:g} "
                f"(peak lr {self.ref_lr * _surge_f(self.ref_batch, n) / 2:g} at B = B_noise)"
            )
        lr = f"lr = lr_ref * sqrt(k) = {self.ref_lr:g} * {math.sqrt(self.k):g} = {self.lr:g}"
        if self.rule == "sqrt":
            return f"{head}; {lr}"
        parts = [head, lr]
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

    Returns:
      ``OptimizerHparams`` (call ``describe()`` for the arithmetic).

    Raises:
      ValueError: for an unknown rule (listing the rules) or non-positive inputs.
    """
    if rule not in RULES:
        raise ValueError(f"unknown LR rule {rule!r}; expected one of {RULES}")
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
        new["eps"] = eps / math.sqrt(k)
        for name, beta in (("b1", b1), ("b2", b2)):
            one_minus = k * (1.0 - beta)
            if one_minus > 1.0:
                one_minus = 1.0
                clamped.append(name)
            new[name] = 1.0 - one_minus
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
    )


def _surge_f(batch: float, noise_scale: float) -> float:
    """``sqrt(B_noise / B) + sqrt(B / B_noise)``: 2 at the peak, ``lr`` is ``1 / f``."""
    return math.sqrt(noise_scale / batch) + math.sqrt(batch / noise_scale)
