"""Generation/update cost model and the critical generation batch.

Generation (autoregressive decode) at concurrency ``c`` sequences: one decode step costs
about ``t_step(c) = a + b c`` seconds (``a``: reading the weights once per step, memory
bound; ``b``: the per-sequence compute and KV-cache traffic), so::

    tokens/s (c) = c / (a + b c)   ->   1/b as c grows (saturating)

The *critical generation batch* is where throughput plateaus: the smallest ``c`` that
reaches ``frac`` (default 0.9) of the asymptote, ``c_frac = frac a / ((1 - frac) b)``
(``9 a / b`` at 90%); the measured version is the smallest measured batch reaching
``frac`` of the best measured throughput. Memory bounds it independently: the KV cache
of ``c`` sequences must fit beside the parameters and optimizer state.

The update (forward + backward + optimizer) is about linear in tokens:
``t_update = u0 + u1 tokens``, with ``tokens`` the prompt + response tokens of the
update (from run metrics: the update lines' ``update_tokens``, not ``gen_tokens``, which
counts generated response tokens only).

Throughput file (``<sweep>/throughput.json``, written by ``python -m
experiments.throughput --out=<sweep>/throughput.json`` or by ``write_throughput``)::

    {
      "device": "NVIDIA H200",                       # free text
      "generation": [                                # one entry per concurrency
        {"batch": 64, "tokens_per_s": 1.2e4, "time_s": 3.4, "new_tokens": 640}, ...],
      "update": [                                    # one entry per training batch
        {"batch": 64, "time_s": 0.8, "tokens": 12288}, ...],
      # optional, for the KV-cache bound:
      "device_memory_bytes": 150000000000,
      "model": {"layers": 28, "kv_heads": 8, "head_dim": 128, "max_seq_len": 4096,
                "dtype_bytes": 2, "n_params": 1500000000, "train_bytes_per_param": 16},
      # optional, what was measured (experiments.throughput writes it; other keys kept):
      "settings": {"preset": "tiny-5m", "vocab_size": 512, "prompt_len": 16,
                   "new_tokens": 32, ...}
    }

``generation[i].batch`` is the number of sequences decoded together, ``new_tokens`` the
tokens each of them generated in ``time_s`` seconds (``tokens_per_s = batch * new_tokens
/ time_s``);
``update[i].tokens`` the tokens (prompt + response) of one update of ``batch`` responses.
The report states the ``settings`` model and lengths and warns when ``settings.preset``
differs from the runs' ``model.preset`` (``model_check``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_batch import artifacts
from rl_batch.analysis import intervals
from rl_batch.analysis.curves import RunData, find_config_value

THROUGHPUT_FILE = "throughput.json"
# The sweep's interleaved step timing (``rl_batch.sweeps.calibrate``): every concurrency measured
# side by side, so host load cannot move the plateau as it can between runs.
CALIBRATION_SOURCE = "calibration.json (interleaved)"
DEFAULT_PLATEAU_FRAC = 0.9
# Fit-quality gate (`fit_problems`): a verdict that rests on ``t_step = a + b c`` is withheld
# when the fitted tokens/s misses a measured point by more than this share of it, ...
MAX_REL_RESIDUAL = 0.10
# ... or, with one measurement per c (no spread to judge noise by), when a larger c is
# this share slower than a smaller one.
SLOWER_TOL = 0.05
# Parameters + gradients (f32) + Adam m and v (f32): 4 + 4 + 8 bytes per parameter.
DEFAULT_TRAIN_BYTES_PER_PARAM = 16


@dataclasses.dataclass(frozen=True)
class GenPoint:
    """One generation measurement: ``batch`` sequences decoded together."""

    batch: int
    tokens_per_s: float
    time_s: float
    new_tokens: int


@dataclasses.dataclass(frozen=True)
class UpdatePoint:
    """One update measurement: a training step on ``batch`` responses of ``tokens`` tokens."""

    batch: int
    time_s: float
    tokens: int


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What sets the KV-cache and training-state memory of a model.

    Attributes:
      layers: transformer layers.
      kv_heads: key/value heads per layer.
      head_dim: head dimension.
      max_seq_len: prompt + response tokens cached per sequence.
      dtype_bytes: bytes per cached element (2 for bf16).
      n_params: parameter count.
      train_bytes_per_param: resident bytes per parameter for training (default 16:
        f32 params + grads + Adam m, v).
    """

    layers: int
    kv_heads: int
    head_dim: int
    max_seq_len: int
    dtype_bytes: int = 2
    n_params: int = 0
    train_bytes_per_param: int = DEFAULT_TRAIN_BYTES_PER_PARAM


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Contents of a throughput file (see the module docstring)."""

    device: str
    generation: tuple[GenPoint, ...]
    update: tuple[UpdatePoint, ...]
    device_memory_bytes: int | None = None
    model: ModelShape | None = None
    settings: dict[str, Any] | None = None


def _require(obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise ValueError(f"{where}: missing field {key!r} (has {sorted(obj)})")
    return obj[key]


def parse_throughput(obj: Any, source: str = "<throughput>") -> Throughput:
    """Validates and parses a throughput JSON object.

    Args:
      obj: the decoded JSON.
      source: file name used in errors.

    Returns:
      The ``Throughput``.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"{source}: expected a JSON object, got {type(obj).__name__}")
    gen, upd = [], []
    for i, g in enumerate(obj.get("generation") or []):
        where = f"{source}: generation[{i}]"
        batch, time_s = int(_require(g, "batch", where)), float(_require(g, "time_s", where))
        new_tokens = int(_require(g, "new_tokens", where))
        tps = g.get("tokens_per_s")
        tps = float(tps) if tps is not None else batch * new_tokens / time_s
        if batch <= 0 or time_s <= 0 or tps <= 0:
            raise ValueError(f"{where}: batch, time_s and tokens_per_s must be > 0, got {g}")
        gen.append(GenPoint(batch, tps, time_s, new_tokens))
    for i, u in enumerate(obj.get("update") or []):
        where = f"{source}: update[{i}]"
        upd.append(
            UpdatePoint(
                int(_require(u, "batch", where)),
                float(_require(u, "time_s", where)),
                int(_require(u, "tokens", where)),
            )
        )
    model = obj.get("model")
    if model is not None:
        fields = {f.name for f in dataclasses.fields(ModelShape)}
        unknown = set(model) - fields
        if unknown:
            raise ValueError(f"{source}: model has unknown fields {sorted(unknown)}")
        model = ModelShape(**model)
    mem = obj.get("device_memory_bytes")
    settings = obj.get("settings")
    if settings is not None and not isinstance(settings, dict):
        raise ValueError(f"{source}: settings must be an object, got {type(settings).__name__}")
    return Throughput(
        device=str(obj.get("device", "unknown")),
        generation=tuple(sorted(gen, key=lambda p: p.batch)),
        update=tuple(sorted(upd, key=lambda p: p.batch)),
        device_memory_bytes=None if mem is None else int(mem),
        model=model,
        settings=None if settings is None else dict(settings),
    )


def load_throughput(path: str) -> Throughput:
    """Reads and validates a throughput file."""
    return parse_throughput(artifacts.read_json(path), source=path)


def throughput_to_json(t: Throughput) -> dict[str, Any]:
    """The JSON object of a ``Throughput`` (the file format above)."""
    obj: dict[str, Any] = {
        "device": t.device,
        "generation": [dataclasses.asdict(p) for p in t.generation],
        "update": [dataclasses.asdict(p) for p in t.update],
    }
    if t.device_memory_bytes is not None:
        obj["device_memory_bytes"] = t.device_memory_bytes
    if t.model is not None:
        obj["model"] = dataclasses.asdict(t.model)
    if t.settings is not None:
        obj["settings"] = dict(t.settings)
    return obj


def write_throughput(
    path: str,
    device: str,
    generation: Sequence[dict[str, Any] | GenPoint],
    update: Sequence[dict[str, Any] | UpdatePoint] = (),
    device_memory_bytes: int | None = None,
    model: ModelShape | dict[str, Any] | None = None,
    settings: dict[str, Any] | None = None,
) -> Throughput:
    """Validates and writes a throughput file (atomically).

    Args:
      path: output path (``<sweep>/throughput.json`` to be picked up by the report).
      device: device description.
      generation: entries ``{"batch", "tokens_per_s", "time_s", "new_tokens"}``.
      update: entries ``{"batch", "time_s", "tokens"}``.
      device_memory_bytes: device memory, for the KV-cache bound (optional).
      model: model shape, for the KV-cache bound (optional).
      settings: what was measured (``preset``, ``vocab_size``, ``prompt_len``,
        ``new_tokens``; optional, checked against the runs by the report).

    Returns:
      The parsed ``Throughput`` that was written.
    """

    def as_dict(p):
        return dataclasses.asdict(p) if dataclasses.is_dataclass(p) else dict(p)

    obj: dict[str, Any] = {
        "device": device,
        "generation": [as_dict(p) for p in generation],
        "update": [as_dict(p) for p in update],
    }
    if device_memory_bytes is not None:
        obj["device_memory_bytes"] = int(device_memory_bytes)
    if model is not None:
        obj["model"] = as_dict(model)
    if settings is not None:
        obj["settings"] = dict(settings)
    t = parse_throughput(obj, source=path)
    artifacts.write_json_atomic(path, throughput_to_json(t))
    return t


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0


@dataclasses.dataclass(frozen=True)
class GenerationFit:
    """``t_step(c) = a + b c`` fitted to generation throughput (see the module docstring).

    Attributes:
      a_s: per-step fixed cost in seconds.
      b_s: per-sequence per-step cost in seconds.
      r2: coefficient of determination of the fitted tokens/s against the measured
        (the quantity drawn and read off; on step times the large c's seconds make any
        line look good).
      batches: [K] measured concurrencies.
      tokens_per_s: [K] measured throughput.
    """

    a_s: float
    b_s: float
    r2: float
    batches: np.ndarray
    tokens_per_s: np.ndarray

    def predict(self, c: Any) -> np.ndarray:
        """Predicted tokens/s at concurrency ``c``."""
        c = np.asarray(c, dtype=np.float64)
        return c / (self.a_s + self.b_s * c)

    @property
    def rel_residuals(self) -> np.ndarray:
        """[K] ``(fit - measured) / measured`` tokens/s at each measured c."""
        return self.predict(self.batches) / self.tokens_per_s - 1.0

    @property
    def max_rel_residual(self) -> float:
        """The largest ``|fit - measured| / measured`` tokens/s over the measured c."""
        return float(np.max(np.abs(self.rel_residuals)))

    @property
    def asymptote(self) -> float:
        """Tokens/s as c grows (``inf`` when the fit does not saturate, b <= 0)."""
        return 1.0 / self.b_s if self.b_s > 0 else float("inf")

    def plateau_batch(self, frac: float = DEFAULT_PLATEAU_FRAC) -> float | None:
        """Smallest c reaching ``frac`` of the asymptote, ``frac a / ((1 - frac) b)``.

        ``None`` when the fit does not saturate (b <= 0) or a <= 0.
        """
        if self.b_s <= 0 or self.a_s <= 0:
            return None
        return frac * self.a_s / ((1.0 - frac) * self.b_s)


def fit_generation(batches: Sequence[float], tokens_per_s: Sequence[float]) -> GenerationFit:
    """Fits ``t_step(c) = a + b c`` to throughput measurements by least squares.

    The step time is ``c / tokens_per_s`` (each of the c sequences gains one token per
    step); with early stopping it is the effective step time.

    Args:
      batches: [K] concurrencies (at least two distinct).
      tokens_per_s: [K] measured generated tokens per second.

    Returns:
      The fit.
    """
    c = np.asarray(batches, dtype=np.float64)
    tps = np.asarray(tokens_per_s, dtype=np.float64)
    if c.shape != tps.shape or np.unique(c).size < 2:
        raise ValueError(f"fit_generation: need >= 2 distinct batches, got {c.tolist()}")
    if np.any(tps <= 0) or np.any(c <= 0):
        raise ValueError(f"fit_generation: batches and tokens/s must be > 0: {c}, {tps}")
    step_s = c / tps
    b, a = np.polyfit(c, step_s, 1)
    return GenerationFit(float(a), float(b), _r2(tps, c / (a + b * c)), c, tps)


def measured_plateau_batch(
    batches: Sequence[float], tokens_per_s: Sequence[float], frac: float = DEFAULT_PLATEAU_FRAC
) -> int:
    """Smallest measured batch whose throughput reaches ``frac`` of the best measured."""
    c = np.asarray(batches, dtype=np.float64)
    tps = np.asarray(tokens_per_s, dtype=np.float64)
    order = np.argsort(c)
    c, tps = c[order], tps[order]
    return int(c[np.nonzero(tps >= frac * tps.max())[0][0]])


@dataclasses.dataclass(frozen=True)
class UpdateFit:
    """``t_update = intercept_s + s_per_token * tokens``."""

    intercept_s: float
    s_per_token: float
    r2: float

    def predict(self, tokens: Any) -> np.ndarray:
        return self.intercept_s + self.s_per_token * np.asarray(tokens, dtype=np.float64)


def fit_update(tokens: Sequence[float], time_s: Sequence[float]) -> UpdateFit:
    """Least-squares line of update time against tokens (at least two distinct sizes)."""
    x = np.asarray(tokens, dtype=np.float64)
    y = np.asarray(time_s, dtype=np.float64)
    if x.shape != y.shape or np.unique(x).size < 2:
        raise ValueError(f"fit_update: need >= 2 distinct token counts, got {x.tolist()}")
    slope, intercept = np.polyfit(x, y, 1)
    return UpdateFit(float(intercept), float(slope), _r2(y, intercept + slope * x))


def kv_cache_bytes_per_sequence(shape: ModelShape) -> int:
    """KV-cache bytes of one sequence: keys and values of every layer at full length."""
    return (
        2 * shape.layers * shape.kv_heads * shape.head_dim * shape.max_seq_len * shape.dtype_bytes
    )


def train_state_bytes(shape: ModelShape) -> int:
    """Resident bytes of parameters + gradients + optimizer state."""
    return shape.n_params * shape.train_bytes_per_param


def max_kv_batch(shape: ModelShape, device_memory_bytes: float, usable_frac: float = 0.9) -> int:
    """Largest concurrency whose KV cache fits beside the training state.

    ``floor((usable_frac * memory - train_state) / kv_per_sequence)``; ``usable_frac``
    leaves room for activations and the runtime.

    Args:
      shape: model shape.
      device_memory_bytes: device memory.
      usable_frac: fraction of the memory the cache and training state may use.

    Returns:
      The batch (0 when nothing fits).
    """
    free = usable_frac * device_memory_bytes - train_state_bytes(shape)
    return max(0, int(math.floor(free / kv_cache_bytes_per_sequence(shape))))


def run_generation_point(run: RunData) -> tuple[float, float] | None:
    """(concurrency, tokens/s) of one run from its update lines.

    Concurrency is the sequences generated per update (``batch_generated``, else the
    ``responses_generated_cum`` increments, else ``prompts * group_size``), capped by the
    config's ``gen_batch`` when that is > 0 (generation in chunks); tokens/s is the median
    over updates of ``gen_tokens / time_generate_s`` (the median skips a first update
    that compiled).
    """
    tok, t = run.field("gen_tokens"), run.field("time_generate_s")
    ok = np.isfinite(tok) & np.isfinite(t) & (t > 0) & (tok > 0)
    if not ok.any():
        return None
    per_update = run.field("batch_generated")
    if not np.any(np.isfinite(per_update)):
        gen = run.field("responses_generated_cum")
        per_update = np.diff(np.concatenate([[0.0], gen]))
    per_update = per_update[np.isfinite(per_update) & (per_update > 0)]
    c = float(np.median(per_update)) if per_update.size else float(run.key.batch)
    gen_batch = find_config_value(run.config, "gen_batch")
    if isinstance(gen_batch, (int, float)) and gen_batch > 0:
        c = min(c, float(gen_batch))
    return c, float(np.median(tok[ok] / t[ok]))


@dataclasses.dataclass(frozen=True)
class GenerationReport:
    """The critical generation batch.

    Attributes:
      source: ``"throughput.json"``, ``CALIBRATION_SOURCE`` or ``"run metrics"``.
      device: device description (when known).
      fit: the ``t_step = a + b c`` fit.
      frac: plateau fraction.
      plateau_batch_fit: smallest c reaching ``frac`` of the fitted asymptote.
      plateau_batch_measured: smallest measured c reaching ``frac`` of the best measured.
      max_kv_batch: KV-cache bound (``None`` without model shape and device memory).
      update_fit: update time against prompt + response tokens (``None`` without
        update measurements).
      update_fit_note: why the update fit is missing or partial ("" when complete).
      measured: throughput file only: the model and lengths it measured.
      model_notes: throughput file only: the runs' model, and checks that could not be
        made (e.g. runs initialised from a Hugging Face checkpoint).
      model_warnings: throughput file only: mismatches with the runs (its preset
        differs from theirs).
      samples: concurrency -> the tokens/s measurements behind its point (calibration
        visits, or runs); empty for a throughput file.
    """

    source: str
    device: str
    fit: GenerationFit
    frac: float
    plateau_batch_fit: float | None
    plateau_batch_measured: int
    max_kv_batch: int | None
    update_fit: UpdateFit | None
    update_fit_note: str = ""
    measured: str = ""
    model_notes: tuple[str, ...] = ()
    model_warnings: tuple[str, ...] = ()
    samples: dict[float, tuple[float, ...]] = dataclasses.field(default_factory=dict)

    @property
    def critical_generation_batch(self) -> float:
        """The measured plateau, capped by the KV-cache bound when known."""
        c = float(self.plateau_batch_measured)
        return min(c, float(self.max_kv_batch)) if self.max_kv_batch is not None else c


def fit_problems(
    gen: GenerationReport,
    level: float = 0.95,
    max_rel_residual: float = MAX_REL_RESIDUAL,
    slower_tol: float = SLOWER_TOL,
) -> list[str]:
    """Why the fit ``t_step(c) = a + b c`` does not describe the measurements (empty: it
    does); a verdict resting on it ("generation throughput saturates") is withheld then.

    - a negative intercept ``a`` (a step that costs less than nothing at c = 0: the
      points do not follow the model);
    - a larger c slower than a smaller one beyond noise: with repeated measurements
      (``gen.samples``, two or more at both) the ``level`` t interval of their tokens/s
      ratio lies below 1; with one measurement each, slower by more than ``slower_tol``;
    - the fitted tokens/s misses a measured point by more than ``max_rel_residual`` of it.

    Returns:
      One phrase per problem, e.g. ``"c = 128 slower than c = 64 (0.83x)"``.
    """
    f = gen.fit
    out = []
    if f.a_s < 0:
        out.append(f"negative intercept a = {f.a_s:.3g} s")
    order = np.argsort(f.batches)
    c, tps = f.batches[order], f.tokens_per_s[order]
    for j in range(1, c.size):
        for i in range(j):
            ratio = float(tps[j] / tps[i])
            big = np.asarray(gen.samples.get(float(c[j]), ()), float)
            small = np.asarray(gen.samples.get(float(c[i]), ()), float)
            if big.size >= 2 and small.size >= 2:
                slower = intervals.t_log_ratio(big[:, None], small[:, None], [1.0], level)[2] < 1
            else:
                slower = ratio < 1.0 - slower_tol
            if slower:
                out.append(f"c = {c[j]:.0f} slower than c = {c[i]:.0f} ({ratio:.2f}x)")
                break
    if f.max_rel_residual > max_rel_residual:
        k = int(np.argmax(np.abs(f.rel_residuals)))
        out.append(
            f"the fit misses c = {f.batches[k]:.0f} by {f.rel_residuals[k]:+.0%} "
            f"(> {max_rel_residual:.0%})"
        )
    return out


def _nested(tree: Any, *keys: str) -> Any:
    for k in keys:
        if not isinstance(tree, dict):
            return None
        tree = tree.get(k)
    return tree


def _join(values: set[Any]) -> str:
    return "/".join(str(v) for v in sorted(values, key=str))


MODEL_NOT_RECORDED = "model not recorded (no settings.preset in the file)"


def describe_settings(settings: dict[str, Any] | None) -> str:
    """What a throughput file measured, e.g. ``preset tiny-5m, vocab 512, 16 prompt
    tokens, 32 new tokens per sequence``; ``MODEL_NOT_RECORDED`` without a preset."""
    if not settings or settings.get("preset") is None:
        return MODEL_NOT_RECORDED
    parts = [f"preset {settings['preset']}"]
    if settings.get("vocab_size") is not None:
        parts.append(f"vocab {settings['vocab_size']}")
    if settings.get("prompt_len") is not None:
        parts.append(f"{settings['prompt_len']} prompt tokens")
    if settings.get("new_tokens") is not None:
        parts.append(f"{settings['new_tokens']} new tokens per sequence")
    return ", ".join(parts)


def model_check(
    throughput: Throughput, runs: Sequence[RunData]
) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """Compares the model a throughput file measured with the runs' model.

    Reads ``settings`` of the file and each run's ``config.json``: ``model.preset``,
    ``init.source``/``init.path``, ``derived.max_prompt_len``, ``derived.max_new_tokens``
    and ``derived.model.vocab_size``. Runs with ``init.source == "hf"`` have no preset
    to match (their shape comes from the checkpoint): that is noted, not warned.

    Args:
      throughput: the parsed throughput file.
      runs: the sweep's runs.

    Returns:
      (what the file measured, notes, warnings); a warning when the file's preset
      differs from a run's ``model.preset``.
    """
    settings = throughput.settings or {}
    measured = describe_settings(settings)
    preset = settings.get("preset")
    presets, hf_paths, prompt, resp, vocab = set(), set(), set(), set(), set()
    unknown = 0
    for r in runs:
        if _nested(r.config, "init", "source") == "hf":
            hf_paths.add(_nested(r.config, "init", "path") or "?")
        elif _nested(r.config, "model", "preset") is not None:
            presets.add(_nested(r.config, "model", "preset"))
        else:
            unknown += 1
        for dst, keys in (
            (prompt, ("derived", "max_prompt_len")),
            (resp, ("derived", "max_new_tokens")),
            (vocab, ("derived", "model", "vocab_size")),
        ):
            v = _nested(r.config, *keys)
            if v is not None:
                dst.add(v)
    notes, warnings = [], []
    if presets or prompt or resp or vocab:
        parts = [f"preset {_join(presets)}"] if presets else []
        parts += [f"vocab {_join(vocab)}"] if vocab else []
        parts += [f"prompts <= {_join(prompt)} tokens"] if prompt else []
        parts += [f"responses <= {_join(resp)} tokens"] if resp else []
        notes.append("The runs: " + ", ".join(parts) + ".")
    if hf_paths:
        notes.append(
            f"Runs initialised from a Hugging Face checkpoint (init.source='hf': "
            f"{_join(hf_paths)}) have no preset to match against the throughput file; "
            "check by hand that it measured that model."
        )
    if unknown:
        notes.append(f"{unknown} run(s) record no model.preset: not checked.")
    if preset is None:
        notes.append(
            "The throughput file does not record its model"
            + (", so it cannot be checked against the runs' preset." if presets else ".")
        )
    other = sorted(p for p in presets if p != preset) if preset is not None else []
    if other:
        warnings.append(
            f"{THROUGHPUT_FILE} measured preset {preset}, but the runs use model.preset "
            f"{', '.join(map(str, other))}: its throughput, plateau and KV-cache bound "
            "describe another model than the runs'."
        )
    return measured, tuple(notes), tuple(warnings)


def run_update_points(runs: Sequence[RunData]) -> tuple[list[float], list[float], list[str]]:
    """Per-run (median update tokens, median update seconds) from the update lines.

    Tokens are ``update_tokens`` (prompt + response tokens of the update); ``gen_tokens``
    (generated tokens only) is never used in its place.

    Returns:
      (tokens, seconds, names of runs that log no ``update_tokens``).
    """
    tokens, times, lacking = [], [], []
    for r in runs:
        if not r.has_field("update_tokens"):
            lacking.append(r.name)
            continue
        t, tok = r.field("time_update_s"), r.field("update_tokens")
        ok = np.isfinite(t) & np.isfinite(tok) & (tok > 0)
        if ok.any():
            tokens.append(float(np.median(tok[ok])))
            times.append(float(np.median(t[ok])))
    return tokens, times, lacking


def generation_report(
    throughput: Throughput | None = None,
    runs: Sequence[RunData] = (),
    frac: float = DEFAULT_PLATEAU_FRAC,
    usable_frac: float = 0.9,
    calibration: dict[float, list[float]] | None = None,
) -> GenerationReport | None:
    """Critical generation batch from a throughput file, else from the sweep's
    calibration, else from run metrics.

    Args:
      throughput: parsed throughput file (preferred when it has >= 2 batches; its model
        is checked against the runs', see ``model_check``).
      runs: runs whose update lines carry ``gen_tokens`` and ``time_generate_s`` (and
        ``update_tokens``, ``time_update_s`` for the update fit).
      calibration: the sweep's interleaved generation timing, concurrency -> per-visit
        tokens/s (``artifacts.calibration_generation``), used when it covers >= 2
        concurrencies (the update fit still comes
        from the runs).
      frac: plateau fraction.
      usable_frac: memory fraction for ``max_kv_batch``.

    Returns:
      The report, or ``None`` with fewer than two distinct concurrencies.
    """
    update_fit, kv, device, update_note = None, None, "unknown", ""
    measured, notes, warnings = "", (), ()
    if throughput is not None and len({p.batch for p in throughput.generation}) >= 2:
        source, device = THROUGHPUT_FILE, throughput.device
        measured, notes, warnings = model_check(throughput, runs)
        c = [p.batch for p in throughput.generation]
        tps = [p.tokens_per_s for p in throughput.generation]
        if len({p.tokens for p in throughput.update}) >= 2:
            update_fit = fit_update(
                [p.tokens for p in throughput.update], [p.time_s for p in throughput.update]
            )
        if throughput.model is not None and throughput.device_memory_bytes is not None:
            kv = max_kv_batch(throughput.model, throughput.device_memory_bytes, usable_frac)
    else:
        by_c = calibration
        source = CALIBRATION_SOURCE
        if by_c is None or len(by_c) < 2:
            source, by_c = "run metrics", {}
            for r in runs:
                pt = run_generation_point(r)
                if pt is not None:
                    by_c.setdefault(pt[0], []).append(pt[1])
        if len(by_c) < 2:
            return None
        c = sorted(by_c)
        average = np.median if source == CALIBRATION_SOURCE else np.mean  # over visits / runs
        tps = [float(average(by_c[x])) for x in c]
        tokens, times, lacking = run_update_points(runs)
        if len(set(tokens)) >= 2:
            update_fit = fit_update(tokens, times)
        if lacking and update_fit is None:
            update_note = (
                f"no update-time fit: {len(lacking)} of {len(runs)} runs log no "
                "update_tokens (prompt + response tokens per update; older metrics "
                "files), and gen_tokens (generated tokens only) is not a substitute"
            )
        elif lacking:
            update_note = (
                f"update-time fit from {len(runs) - len(lacking)} runs; {len(lacking)} "
                "log no update_tokens (older metrics files) and are left out"
            )
        elif update_fit is None:
            update_note = "no update-time fit: fewer than two distinct update sizes"
    fit = fit_generation(c, tps)
    return GenerationReport(
        source=source,
        device=device,
        fit=fit,
        frac=frac,
        plateau_batch_fit=fit.plateau_batch(frac),
        plateau_batch_measured=measured_plateau_batch(c, tps, frac),
        max_kv_batch=kv,
        update_fit=update_fit,
        update_fit_note=update_note,
        measured=measured,
        model_notes=notes,
        model_warnings=warnings,
        samples={} if source == THROUGHPUT_FILE else {x: tuple(by_c[x]) for x in c},
    )
