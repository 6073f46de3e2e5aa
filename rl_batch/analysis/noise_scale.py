"""Gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training").

With per-example gradients of mean ``G`` and covariance ``Sigma``, the mean gradient over a
batch of ``b`` examples has ``E|g_b|^2 = |G|^2 + tr(Sigma)/b``. Two batch sizes b < B give
unbiased estimates::

    |G|^2     ~ (B |g_B|^2 - b |g_b|^2) / (B - b)
    tr(Sigma) ~ (|g_b|^2 - |g_B|^2) / (1/b - 1/B)

Each is noisy at one step; smooth both with an EMA, then take ``B_simple = tr(Sigma) /
|G|^2`` (the ratio of the smoothed terms, not the smoothed ratio). ``B_simple`` estimates
the batch where the steps/samples trade-off turns, ``(S/S_min - 1)(E/E_min - 1) = 1``:
compare it with the critical training batch.

Metric fields read from update lines (written by a learner that measures them; all
optional), first scheme found wins:

1. ``grad_sq_micro``, ``grad_sq_full``, ``gns_batch_micro``, ``gns_batch_full`` (what
   an update logs with micro-batches, ``rl_batch.algorithms.noise_statistics``: the mean
   over micro-batches of each micro-batch gradient's squared norm, the full batch's, and
   the two sizes in sequences). Averaging ``|g_b|^2`` over the micro-batches keeps it unbiased.
2. ``grad_sq_small``, ``grad_sq_big``, ``noise_batch_small``, ``noise_batch_big`` (the
   big size defaults to the update's ``batch_responses``).
3. ``noise_scale``: a per-update ``B_simple`` already computed in the step.

``prefix="critic_"`` reads ``critic_grad_sq_micro`` etc. for a PPO critic.

**Inter- and intra-prompt terms (GRPO groups).** The G responses of one prompt share it,
so their gradients are not independent. Model response j of prompt p (shape letters:
docs/glossary.md) as ``g_pj = G_mean + a_p + e_pj``, with prompt effects ``a_p`` of
covariance ``Sigma_inter`` (the spread of the prompts' mean gradients) and
response effects ``e_pj`` of covariance ``Sigma_intra`` (the spread within a group),
independent across prompts, exchangeable within one. A set of b responses holding
``n_p`` of prompt p has a mean gradient with::

    E|g|^2 = |G|^2 + tr(Sigma_inter) sum_p n_p^2 / b^2 + tr(Sigma_intra) / b

(whole groups: ``sum_p n_p^2 / b^2 = G / b``; the same share of every prompt: ``1 / P``,
which is why micro-batches that cut every group alike, the default strided ones with G
divisible by M, give B_simple the trace ``tr(Sigma_intra)`` alone and a ``|G|^2`` that
carries ``tr(Sigma_inter) / P``). With ``grpo.group_noise`` the learner
splits the batch into M / 2 pairs of micro-batches (``noise_statistics.group_pair_order``): the
two micro-batches of a pair hold the two halves of the same ``n`` whole groups, b = n G
/ 2 responses each, and pairs share no prompt. Three measurements then have::

    E[grad_sq_micro] = |G|^2 + tr(Sigma_inter) / n + tr(Sigma_intra) / b   (one half)
    E[grad_dot_pair] = |G|^2 + tr(Sigma_inter) / n                        (<half, half>)
    E[grad_sq_full]  = |G|^2 + tr(Sigma_inter) / P + tr(Sigma_intra) / B   (the batch)

and ``group_noise_terms`` inverts them (unbiased; it needs n < P, two pairs at least).
The inter-prompt and intra-prompt noise scales are ``B_inter = tr(Sigma_inter) / |G|^2``
and ``B_intra = tr(Sigma_intra) / |G|^2``, in responses. A batch of P prompts x G
responses has ``E|g_B|^2 = |G|^2 + (G B_inter + B_intra) |G|^2 / B``: at a fixed G its
noise scale is ``G B_inter + B_intra``, and raising P lowers both terms while raising G
lowers the intra-prompt term only. ``B_simple`` from the same half-group micro-batches
counts ``tr(Sigma_intra) + tr(Sigma_inter) G (M - 2) / (2 (M - 1))`` as its trace (and
``|G|^2 + tr(Sigma_inter) G / (2 (B - b))`` as its ``|G|^2``), a layout-dependent
mixture (docs/noise_scale.md).

**Which noise scale B_simple is: the micro-batch layout.** The run's
``grpo.micro_layout`` (``measurement_layout``) decides it. ``"groups"`` (the default):
each measurement unit holds whole groups, ``sum_p n_p^2 / b^2 = G / b`` for both sizes,
so B_simple is the batch noise scale ``B_noise = (G tr(Sigma_inter) + tr(Sigma_intra)) /
|G|^2``, the quantity that matters when P grows. ``"strided"`` (a config.json written
before the field): B_simple ``~ tr(Sigma_intra) / (|G|^2 + tr(Sigma_inter) / P)``, the
intra-prompt term, which grows with the P it is measured at. With ``group_noise``
(``"pairs"``) B_noise is ``G B_inter + B_intra`` from the split below. A PPO run (G = 1)
measures B_noise in any layout. ``run_noise_scale`` pools B_noise over the second half
of the updates with a Fieller interval (``gradient_noise.pooled_ratio_interval``), and
``implied_noise_scale`` fits the B_noise that the family's sample costs imply,
``r_N(B) = (1 + B / B_n) / (1 + B_ref / B_n)``, for the report to set the two side by side.

Fields (``GROUP_FIELDS``): ``grad_sq_micro``, ``grad_dot_pair``, ``grad_sq_full``,
``gns_batch_micro`` (b), ``gns_prompts_pair`` (n), ``gns_batch_full`` (B),
``gns_prompts_full`` (P). With dropped groups (padding) b and n are harmonic means over
the pairs with real responses, and B and P count real responses and prompts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from rl_batch.analysis.curves import RunData
from rl_batch.artifacts import Configuration
from rl_batch.gradient_noise import noise_scale_terms, pooled_ratio_interval

DEFAULT_DECAY = 0.95
Z95 = 1.959964  # two-sided 95 % normal quantile
# (|g_b|^2, |g_B|^2, b, B) field names, in order of preference.
FIELD_SCHEMES = (
    ("grad_sq_micro", "grad_sq_full", "gns_batch_micro", "gns_batch_full"),
    ("grad_sq_small", "grad_sq_big", "noise_batch_small", "noise_batch_big"),
)


# (|g_half|^2, <g_half, g_other_half>, |g_B|^2, b, n, B, P): the group split's fields.
GROUP_FIELDS = (
    "grad_sq_micro",
    "grad_dot_pair",
    "grad_sq_full",
    "gns_batch_micro",
    "gns_prompts_pair",
    "gns_batch_full",
    "gns_prompts_full",
)


def group_noise_terms(
    sq_half: Any,
    dot_pair: Any,
    sq_full: Any,
    b_half: Any,
    n_pair: Any,
    b_full: Any,
    p_full: Any,
) -> tuple[Any, Any, Any]:
    """Unbiased ``(|G|^2, tr(Sigma_inter), tr(Sigma_intra))`` from half-group pairs.

    Inverts (see the module docstring)::

        E[sq_half]  = |G|^2 + tr(Sigma_inter) / n + tr(Sigma_intra) / b
        E[dot_pair] = |G|^2 + tr(Sigma_inter) / n
        E[sq_full]  = |G|^2 + tr(Sigma_inter) / P + tr(Sigma_intra) / B

    as ``tr(Sigma_intra) = b (sq_half - dot_pair)``, ``tr(Sigma_inter) = (dot_pair -
    sq_full + tr(Sigma_intra) / B) / (1 / n - 1 / P)`` and ``|G|^2 = dot_pair -
    tr(Sigma_inter) / n``. Plain arithmetic (floats, numpy or ``jax.numpy`` arrays).

    Args:
      sq_half: ``grad_sq_micro``, mean squared norm of a half-group micro-batch's gradient.
      dot_pair: ``grad_dot_pair``, mean inner product of a pair's two halves' gradients.
      sq_full: ``grad_sq_full``, the batch gradient's squared norm.
      b_half: responses per half-group micro-batch (``gns_batch_micro``).
      n_pair: prompts per pair (``gns_prompts_pair``), ``n < P``.
      b_full: responses in the batch (``gns_batch_full``).
      p_full: prompts in the batch (``gns_prompts_full``).

    Returns:
      ``(g2, trace_inter, trace_intra)`` (any can be negative at a single step).
    """
    trace_intra = b_half * (sq_half - dot_pair)
    trace_inter = (dot_pair - sq_full + trace_intra / b_full) / (1.0 / n_pair - 1.0 / p_full)
    g2 = dot_pair - trace_inter / n_pair
    return g2, trace_inter, trace_intra


class NoiseScaleEMA:
    """EMA-smoothed gradient noise scale.

    Both terms are smoothed with the same decay from zero, so their bias correction
    cancels in the ratio.

    Example::

        ema = NoiseScaleEMA(decay=0.95)
        for sq_b, sq_B in measurements:
            b_simple = ema.update(sq_b, sq_B, b=32, B=256)
    """

    def __init__(self, decay: float = DEFAULT_DECAY):
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"NoiseScaleEMA: decay must be in [0, 1), got {decay}")
        self.decay = decay
        self.g2_ema = 0.0
        self.trace_ema = 0.0
        self.count = 0

    def update(self, sq_small: float, sq_big: float, b: float, B: float) -> float:  # noqa: N803
        """Adds one measurement and returns the smoothed ``B_simple`` (NaN while |G|^2 <= 0).

        Args:
          sq_small: ``|g_b|^2`` at batch ``b``.
          sq_big: ``|g_B|^2`` at batch ``B``.
          b: small batch size.
          B: big batch size (``B > b``).

        Returns:
          ``trace_ema / g2_ema``.
        """
        if not B > b > 0:
            raise ValueError(f"NoiseScaleEMA.update: need B > b > 0, got b={b}, B={B}")
        g2, trace_sigma = noise_scale_terms(float(sq_small), float(sq_big), float(b), float(B))
        self.g2_ema = self.decay * self.g2_ema + (1.0 - self.decay) * g2
        self.trace_ema = self.decay * self.trace_ema + (1.0 - self.decay) * trace_sigma
        self.count += 1
        return self.value

    @property
    def value(self) -> float:
        """The current smoothed ``B_simple`` (NaN before any positive |G|^2 estimate)."""
        return self.trace_ema / self.g2_ema if self.g2_ema > 0 else float("nan")


@dataclasses.dataclass(frozen=True)
class NoiseScaleSummary:
    """``B_simple`` of one run.

    Attributes:
      name: run name.
      key: its configuration.
      source: the small-batch field the estimate came from (``grad_sq_micro`` or
        ``grad_sq_small``, prefixed), or ``noise_scale`` (the per-update field).
      n_updates: updates with a measurement.
      final: last EMA value (squared norms) or last finite per-update value.
      median_second_half: median of the EMA (or per-update) values over the second half.
      pooled: ``mean(tr(Sigma)) / mean(|G|^2)`` over the second half (squared norms only).
      inter, intra: ``B_inter`` and ``B_intra`` pooled over the second half of the
        updates that log ``GROUP_FIELDS`` (``mean(tr(Sigma_inter)) / mean(|G|^2)``, and
        likewise; None without them or when the pooled ``|G|^2 <= 0``).
      inter_final, intra_final: their EMA values at the last such update (None
        without them).
      layout: the micro-batch layout measured with (``measurement_layout``): with
        ``"strided"`` the B_simple values are the intra-prompt term, not B_noise.
      b_noise, b_noise_lo, b_noise_hi: the batch noise scale ``(G tr_inter + tr_intra)
        / |G|^2`` pooled over the second half and its 95 % Fieller interval (None when
        the layout does not measure it; ``b_noise`` None, the interval kept, when the
        pooled ``|G|^2 <= 0``).
    """

    name: str
    key: Configuration
    source: str
    n_updates: int
    final: float
    median_second_half: float
    pooled: float | None
    inter: float | None = None
    intra: float | None = None
    inter_final: float | None = None
    intra_final: float | None = None
    layout: str = "strided"
    b_noise: float | None = None
    b_noise_lo: float | None = None
    b_noise_hi: float | None = None


def measurement_layout(config: dict[str, Any]) -> str:
    """The micro-batch layout a run measured its noise with (``"groups"``, ``"strided"``
    or ``"pairs"``; see the module docstring): ``grpo.group_noise`` -> pairs, else
    ``grpo.micro_layout`` (missing: strided, what runs did before the field); a run of
    one response per prompt (PPO, G = 1) measures B_noise in any layout: groups."""
    if config.get("algo", "grpo") != "grpo" or config.get("group_size", 0) == 1:
        return "groups"
    section = config.get("grpo") or {}
    if section.get("group_noise", False):
        return "pairs"
    return section.get("micro_layout", "strided")


def b_noise_terms(
    run: RunData, prefix: str = "", second_half: bool = True
) -> tuple[np.ndarray, np.ndarray] | None:
    """Per-update ``(trace, |G|^2)`` whose pooled ratio is the batch noise scale B_noise
    (``G tr_inter + tr_intra`` and ``|G|^2``), over the second half of the measured
    updates (all with ``second_half=False``); None when the run's layout does not
    measure B_noise (strided) or it logs no measurement."""
    layout = "groups" if prefix else measurement_layout(run.config)
    if layout == "pairs":
        fields = [run.field(prefix + f) for f in GROUP_FIELDS]
        ok = np.ones_like(fields[0], dtype=bool)
        for x in fields:
            ok &= np.isfinite(x)
        sq_h, dot, sq_f, b, n, big_b, big_p = fields
        ok &= (b > 0) & (n > 0) & (big_p > n)
        if not ok.any():
            return None
        g2, inter, intra = group_noise_terms(*(x[ok] for x in fields))
        group = big_b[ok] / big_p[ok]  # G: real responses per real prompt
        trace = group * inter + intra
    elif layout == "groups":
        sq_b, sq_big, b, big_b = (run.field(prefix + n) for n in FIELD_SCHEMES[0])
        ok = np.isfinite(sq_b) & np.isfinite(sq_big) & np.isfinite(b) & np.isfinite(big_b)
        ok &= (big_b > b) & (b > 0)
        if not ok.any():
            return None
        g2, trace = noise_scale_terms(sq_b[ok], sq_big[ok], b[ok], big_b[ok])
    else:
        return None
    start = len(g2) // 2 if second_half else 0
    return np.asarray(trace[start:], float), np.asarray(g2[start:], float)


def pooled_b_noise(
    terms: list[tuple[np.ndarray, np.ndarray]], z: float = Z95
) -> tuple[float, float, float] | None:
    """B_noise pooled over the ``b_noise_terms`` of one or several runs: the ratio of the
    mean trace to the mean ``|G|^2`` and its Fieller interval (``(estimate, lo, hi)``;
    the estimate NaN when the mean ``|G|^2 <= 0``); None with fewer than two updates."""
    if not terms:
        return None
    trace = np.concatenate([t for t, _ in terms])
    g2 = np.concatenate([g for _, g in terms])
    if len(trace) < 2:
        return None
    est, lo, hi = pooled_ratio_interval(trace, g2, z)
    return float(est), float(lo), float(hi)


@dataclasses.dataclass(frozen=True)
class ImpliedNoiseScale:
    """The B_noise a family's sample costs imply (``implied_noise_scale``).

    Attributes:
      b_noise: the best fit of ``r_N(B) = (1 + B / B_n) / (1 + B_ref / B_n)``.
      lo, hi: its 95 % profile interval (``chi2 <= min + 3.84``); ``hi`` inf when the
        r_N rise too little to bound B_n from above, ``lo`` 0 likewise from below.
      points: the r_N with an interval the fit used.
      chi2: the fit's chi-square at ``b_noise`` (``points - 1`` degrees of freedom).
    """

    b_noise: float
    lo: float
    hi: float
    points: int
    chi2: float


def implied_noise_scale(
    batches: list[int], r_n: list[Any], batch_ref: int, grid: int = 2001
) -> ImpliedNoiseScale | None:
    """Fits B_n to measured sample costs: ``r_N(B) = (1 + B / B_n) / (1 + B_ref / B_n)``
    (McCandlish et al. 2018: samples to a result ``E = E_min (1 + B / B_noise)``).

    Weighted least squares on ``log r_N``, each point's weight from its interval (``se =
    (log hi - log lo) / (2 x 1.96)``), over a log grid of B_n from ``min(B) / 100`` to
    ``max(B) x 100``; the reference (``exact``) and r_N without an interval are left out.

    Args:
      batches: each configuration's batch B (responses).
      r_n: each one's r_N (``time_to_target.Estimate`` or None: not reached).
      batch_ref: B_ref, the batch r_N is measured against.
      grid: grid points.

    Returns:
      The fit, or None with fewer than two usable points.
    """
    xs, ys, ses = [], [], []
    for b, e in zip(batches, r_n):
        if e is None or e.exact or not e.has_interval or not (e.lo > 0 and e.mean > 0):
            continue
        xs.append(float(b))
        ys.append(np.log(e.mean))
        ses.append(max((np.log(e.hi) - np.log(e.lo)) / (2 * Z95), 1e-6))
    if len(xs) < 2:
        return None
    x, y, se = np.array(xs), np.array(ys), np.array(ses)
    bn = np.geomspace(min(x.min(), batch_ref) / 100.0, max(x.max(), batch_ref) * 100.0, grid)
    model = np.log1p(x[None, :] / bn[:, None]) - np.log1p(batch_ref / bn[:, None])  # [grid, n]
    chi2 = np.sum(((y[None, :] - model) / se[None, :]) ** 2, axis=1)
    best = int(np.argmin(chi2))
    inside = np.flatnonzero(chi2 <= chi2[best] + 3.84)
    lo = 0.0 if inside[0] == 0 else float(bn[inside[0]])
    hi = np.inf if inside[-1] == grid - 1 else float(bn[inside[-1]])
    return ImpliedNoiseScale(
        b_noise=float(bn[best]), lo=lo, hi=hi, points=len(xs), chi2=float(chi2[best])
    )


def run_noise_scale(
    run: RunData, prefix: str = "", decay: float = DEFAULT_DECAY
) -> NoiseScaleSummary | None:
    """Summarizes a run's gradient noise scale from its update lines.

    Args:
      run: the run.
      prefix: field prefix (``""`` for the actor, ``"critic_"`` for a PPO critic).
      decay: EMA decay for the squared-norm sources.

    Returns:
      The summary, or ``None`` when the run logs neither source.
    """
    for names in FIELD_SCHEMES:
        summary = _from_squared_norms(run, [prefix + n for n in names], decay)
        if summary is not None:
            split = group_noise_scales(run, prefix, decay) or {}
            layout = "groups" if prefix else measurement_layout(run.config)
            terms = b_noise_terms(run, prefix)
            pooled = None if terms is None else pooled_b_noise([terms])
            if pooled is not None:
                est, lo, hi = pooled
                split.update(b_noise=None if np.isnan(est) else est, b_noise_lo=lo, b_noise_hi=hi)
            return dataclasses.replace(summary, layout=layout, **split)
    ns = run.field(prefix + "noise_scale")
    ns = ns[np.isfinite(ns)]
    if ns.size == 0:
        return None
    return NoiseScaleSummary(
        name=run.name,
        key=run.key,
        source="noise_scale",
        n_updates=int(ns.size),
        final=float(ns[-1]),
        median_second_half=float(np.median(ns[len(ns) // 2 :])),
        pooled=None,
    )


def _from_squared_norms(run: RunData, names: list[str], decay: float) -> NoiseScaleSummary | None:
    sq_b, sq_B, b, B = (run.field(n) for n in names)  # noqa: N806
    B = np.where(np.isfinite(B), B, run.field("batch_responses"))  # noqa: N806
    ok = np.isfinite(sq_b) & np.isfinite(sq_B) & np.isfinite(b) & np.isfinite(B) & (B > b)
    if ok.sum() > 0:
        ema = NoiseScaleEMA(decay)
        trail = np.array([ema.update(*args) for args in zip(sq_b[ok], sq_B[ok], b[ok], B[ok])])
        g2, tr = noise_scale_terms(sq_b[ok], sq_B[ok], b[ok], B[ok])
        half = slice(len(trail) // 2, None)
        g2_mean = float(np.mean(g2[half]))
        pooled = float(np.mean(tr[half]) / g2_mean) if g2_mean > 0 else None
        tail = trail[half][np.isfinite(trail[half])]
        return NoiseScaleSummary(
            name=run.name,
            key=run.key,
            source=names[0],
            n_updates=int(ok.sum()),
            final=float(trail[-1]),
            median_second_half=float(np.median(tail)) if tail.size else float("nan"),
            pooled=pooled,
        )
    return None


def group_noise_scales(
    run: RunData, prefix: str = "", decay: float = DEFAULT_DECAY
) -> dict[str, float | None] | None:
    """A run's inter-/intra-prompt noise scales from its ``GROUP_FIELDS``.

    Args:
      run: the run.
      prefix: field prefix.
      decay: EMA decay of the three terms (each smoothed alone, ratios of the smoothed).

    Returns:
      ``{"inter", "intra", "inter_final", "intra_final"}`` (see ``NoiseScaleSummary``),
      or None when no update logs every field with ``n < P``.
    """
    sq_h, dot, sq_f, b, n, big_b, big_p = (run.field(prefix + f) for f in GROUP_FIELDS)
    ok = np.ones_like(sq_h, dtype=bool)
    for x in (sq_h, dot, sq_f, b, n, big_b, big_p):
        ok &= np.isfinite(x)
    ok &= (b > 0) & (n > 0) & (big_p > n)
    if not ok.any():
        return None
    g2, inter, intra = group_noise_terms(
        sq_h[ok], dot[ok], sq_f[ok], b[ok], n[ok], big_b[ok], big_p[ok]
    )
    weights = (1.0 - decay) * decay ** np.arange(len(g2))[::-1]  # EMA from 0 at the last
    g2_ema, inter_ema, intra_ema = (float(np.sum(weights * x)) for x in (g2, inter, intra))
    half = slice(len(g2) // 2, None)
    g2_mean = float(np.mean(g2[half]))
    pooled = g2_mean > 0
    return {
        "inter": float(np.mean(inter[half])) / g2_mean if pooled else None,
        "intra": float(np.mean(intra[half])) / g2_mean if pooled else None,
        "inter_final": inter_ema / g2_ema if g2_ema > 0 else float("nan"),
        "intra_final": intra_ema / g2_ema if g2_ema > 0 else float("nan"),
    }


@dataclasses.dataclass(frozen=True)
class NoiseScaleComparison:
    """Measured B_noise against the B_noise the family's r_N imply (the report's lines).

    Attributes:
      measured: ``(estimate, lo, hi)`` pooled over the family's runs (second halves).
      runs: the runs pooled.
      implied: the r_N fit (None when too few r_N have an interval).
      agree: the two 95 % intervals overlap (None without both).
    """

    measured: tuple[float, float, float] | None
    runs: int
    implied: ImpliedNoiseScale | None
    agree: bool | None


def compare_noise_scales(
    runs: list[RunData], batches: list[int], r_n: list[Any], batch_ref: int
) -> NoiseScaleComparison:
    """B_noise measured in ``runs`` (pooled, `pooled_b_noise`) against the B_noise
    implied by the family's sample costs ``r_n`` at ``batches`` (`implied_noise_scale`)."""
    terms = [t for t in (b_noise_terms(r) for r in runs) if t is not None]
    measured = pooled_b_noise(terms)
    implied = implied_noise_scale(batches, r_n, batch_ref)
    agree = None
    if measured is not None and implied is not None:
        _, lo, hi = measured
        agree = bool(lo <= implied.hi and implied.lo <= hi and hi > 0)
    return NoiseScaleComparison(measured=measured, runs=len(terms), implied=implied, agree=agree)
