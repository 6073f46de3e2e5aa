"""Rollouts: prompts -> G responses each -> rewards, and validation mean@k.

Host-side glue between the data, the jitted sampler and the task verifiers. The
sampler does the heavy work; these functions only arrange prompts, split a training
batch into generation chunks (``gen_batch`` concurrent sequences) and score text.
"""

from __future__ import annotations

import base64
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rl_batch.rollout.sampler import (
    SampleOutput,
    Sampler,
    SamplingConfig,
    decode_slots,
    is_row_keys,
    kv_cache_slots,
    narrowed_slots,
)
from rl_batch.tasks.rewards import (
    greedy_accuracy,
    mean_at_k,
    score_responses,
    unverified_counts,
)
from rl_batch.tokenizers import encode_prompt


@dataclasses.dataclass
class Rollout:
    """A generated batch of P prompts x G responses, row-major ([p * G + g])."""

    examples: list[dict[str, Any]]  # P examples
    samples: SampleOutput  # numpy, B = P * G rows
    rewards_pg: np.ndarray  # [P, G] float32
    time_generate_s: float
    time_score_s: float
    gen_tokens: int
    # Partial rollout: which groups have finished ([P] bool); None when all have.
    complete_p: np.ndarray | None = None
    time_compile_s: float = 0.0  # compilation met while generating (not training time)
    # Forward FLOPs of the generation when ``samples`` also holds tokens generated
    # earlier (partial rollout); None: every response token in ``samples`` is new.
    gen_flops: float | None = None
    # ``rewards.unverified_counts`` of the scores: metrics-line name -> responses scored 0
    # without the verifier's verdict ({} for tasks whose verifier never skips).
    score_counts: dict[str, int] = dataclasses.field(default_factory=dict)
    # Decode-slot use of the sampler calls (``Sampler.last_stats``, summed): tokens of
    # decode steps and slot-steps run; 0 and 0 when unknown (partial rollout).
    decode_tokens: int = 0
    slot_steps: int = 0


def _array_to_json(x: np.ndarray) -> dict[str, Any]:
    x = np.ascontiguousarray(x)
    return {
        "dtype": x.dtype.str,
        "shape": list(x.shape),
        "data": base64.b64encode(x.tobytes()).decode("ascii"),
    }


def _array_from_json(d: dict[str, Any]) -> np.ndarray:
    flat = np.frombuffer(base64.b64decode(d["data"]), dtype=np.dtype(d["dtype"]))
    return flat.reshape(d["shape"]).copy()


def rollout_to_json(ro: Rollout) -> dict[str, Any]:
    """A rollout as JSON-serialisable data (arrays as exact base64 bytes).

    An asynchronous run saves its rollouts in flight with each checkpoint this way; the
    examples must be JSON-serialisable (the task data's dicts are).
    """
    return {
        "examples": list(ro.examples),
        "samples": {
            f.name: _array_to_json(np.asarray(getattr(ro.samples, f.name)))
            for f in dataclasses.fields(ro.samples)
            if getattr(ro.samples, f.name) is not None  # routed_experts when not recorded
        },
        "rewards_pg": _array_to_json(np.asarray(ro.rewards_pg)),
        "time_generate_s": ro.time_generate_s,
        "time_score_s": ro.time_score_s,
        "gen_tokens": int(ro.gen_tokens),
        "complete_p": None if ro.complete_p is None else _array_to_json(ro.complete_p),
        "time_compile_s": ro.time_compile_s,
        "gen_flops": ro.gen_flops,
        "score_counts": dict(ro.score_counts),
        "decode_tokens": int(ro.decode_tokens),
        "slot_steps": int(ro.slot_steps),
    }


def rollout_from_json(data: dict[str, Any]) -> Rollout:
    """The ``Rollout`` written by ``rollout_to_json`` (bit-exact arrays)."""
    samples = SampleOutput(**{k: _array_from_json(v) for k, v in data["samples"].items()})
    complete_p = data.get("complete_p")
    return Rollout(
        examples=list(data["examples"]),
        samples=samples,
        rewards_pg=_array_from_json(data["rewards_pg"]),
        time_generate_s=float(data["time_generate_s"]),
        time_score_s=float(data["time_score_s"]),
        gen_tokens=int(data["gen_tokens"]),
        complete_p=None if complete_p is None else _array_from_json(complete_p),
        time_compile_s=float(data.get("time_compile_s", 0.0)),
        gen_flops=data.get("gen_flops"),
        score_counts=dict(data.get("score_counts") or {}),
        decode_tokens=int(data.get("decode_tokens", 0)),
        slot_steps=int(data.get("slot_steps", 0)),
    )


def pad_prompts(ro: Rollout, prompt_len: int) -> Rollout:
    """``ro`` with its prompts left-padded to ``prompt_len`` positions (or to their own
    width if wider), masked like any padding.

    The learners' batches use it so that every update has one shape: the sampler pads
    prompts to a power-of-two bucket of the longest prompt in the call, so its width moves
    between steps with the data (math prompts: 64 ... 1024 tokens), and each new width
    would compile the update again.
    """
    if ro.samples.prompt_tokens.shape[1] >= prompt_len:
        return ro
    return dataclasses.replace(ro, samples=_concat_outputs([ro.samples], prompt_len=prompt_len))


def _concat_outputs(chunks: Sequence[SampleOutput], prompt_len: int = 0) -> SampleOutput:
    """Concatenates sampler outputs along the batch, padding P and R to the largest (P to
    at least ``prompt_len``)."""
    p = max(prompt_len, *(c.prompt_tokens.shape[1] for c in chunks))
    r = max(c.response_tokens.shape[1] for c in chunks)

    def pad(x, width, left, value):
        extra = width - x.shape[1]
        if extra == 0:
            return x
        pads = ((0, 0), (extra, 0)) if left else ((0, 0), (0, extra))
        return np.pad(x, pads, constant_values=value)

    pad_id = 0  # Padding tokens are masked everywhere downstream.
    routed = None
    if all(c.routed_experts is not None for c in chunks):
        # [B, P_c + R_c, L, k]: the prompt part is left-padded, the response part right.
        routed = np.concatenate(
            [
                np.concatenate(
                    [
                        _pad_rows(c.routed_experts[:, : c.prompt_tokens.shape[1]], p, True),
                        _pad_rows(c.routed_experts[:, c.prompt_tokens.shape[1] :], r, False),
                    ],
                    axis=1,
                )
                for c in chunks
            ]
        )
    return SampleOutput(
        prompt_tokens=np.concatenate([pad(c.prompt_tokens, p, True, pad_id) for c in chunks]),
        prompt_mask=np.concatenate([pad(c.prompt_mask, p, True, False) for c in chunks]),
        response_tokens=np.concatenate([pad(c.response_tokens, r, False, pad_id) for c in chunks]),
        response_mask=np.concatenate([pad(c.response_mask, r, False, False) for c in chunks]),
        response_logprobs=np.concatenate([pad(c.response_logprobs, r, False, 0.0) for c in chunks]),
        lengths=np.concatenate([c.lengths for c in chunks]),
        routed_experts=routed,
    )


def _pad_rows(x: np.ndarray, width: int, left: bool) -> np.ndarray:
    """Pads axis 1 of ``x`` to ``width`` with -1 (no expert choice), left or right."""
    extra = width - x.shape[1]
    pads = [(0, 0)] * x.ndim
    pads[1] = (extra, 0) if left else (0, extra)
    return np.pad(x, pads, constant_values=-1) if extra else x


def kv_cache_bytes(config: Any, rows: int, seq_len: int, dtype: str | None = None) -> int:
    """Bytes of the sampler's KV cache: rows x seq_len slots x layers x (k, v) x K x H.

    Args:
      config: a ``ModelConfig``.
      rows: sequences decoded together (the batch bucket).
      seq_len: cache slots per row (prompt bucket + response bucket).
      dtype: cache dtype (default: the model's compute dtype).
    """
    itemsize = np.dtype(dtype or config.dtype).itemsize
    per_slot = config.num_layers * 2 * config.num_kv_heads * config.head_dim * itemsize
    return rows * seq_len * per_slot


def check_kv_memory(
    sampler: Sampler,
    num_sequences: int,
    gen_batch: int,
    max_kv_bytes: int,
    what: str,
    sampling: SamplingConfig = SamplingConfig(),
) -> int:
    """Raises ValueError when one generation chunk's KV cache exceeds ``max_kv_bytes``.

    Args:
      sampler: the sampler (its buckets and model shape set the cache size).
      num_sequences: sequences of the whole rollout.
      gen_batch: chunk size (0 = all at once).
      max_kv_bytes: the bound; 0 skips the check.
      what: names the rollout in the error (e.g. "training rollout").
      sampling: the engine sets the cache layout (``sampler.kv_cache_slots``: static
        rows x (P + R) slots, continuous rows x P + slots x (P + R)).

    Returns:
      The KV-cache bytes of the largest chunk.
    """
    chunk = min(gen_batch, num_sequences) if gen_batch > 0 else num_sequences
    b, p, r = sampler.buckets(chunk, sampler.max_prompt_len, sampler.max_new_tokens)
    slots = kv_cache_slots(sampling, b, p, r)
    need = kv_cache_bytes(sampler.config, 1, slots, sampler.cache_dtype)
    if max_kv_bytes > 0 and need > max_kv_bytes:
        layout = f"{b} bucketed rows x {p + r} slots"
        if sampling.engine == "continuous":
            c = decode_slots(sampling, b)
            narrowed = narrowed_slots(sampling, c)
            c_text = f"{c} decode slots" + (f" (+ {narrowed} narrowing)" if narrowed else "")
            layout = f"{b} rows x {p} prompt slots + {c_text} x {p + r}"
        raise ValueError(
            f"{what}: a generation chunk of {chunk} sequences ({layout}) needs {need} "
            f"KV-cache bytes > max_kv_bytes={max_kv_bytes}; lower gen_batch={gen_batch} "
            "(0 = the whole batch)"
            + (" or sampling.slots" if sampling.engine == "continuous" else "")
            + " or raise max_kv_bytes"
        )
    return need


def generate(
    sampler: Sampler,
    params: Any,
    prompts: Sequence[Sequence[int]],
    *,
    rng: jax.Array,
    sampling: SamplingConfig,
    gen_batch: int = 0,
    max_new_tokens: int | None = None,
    call_stats: list[dict] | None = None,
) -> SampleOutput:
    """Samples one response per prompt, ``gen_batch`` sequences at a time (0 = all).

    ``rng``: one key (chunk i samples with ``fold_in(rng, i)``) or one typed key per
    prompt (`sampler.is_row_keys`; each chunk gets its rows' keys, so a row's draws do
    not depend on ``gen_batch``). ``call_stats``, when given, receives each sampler
    call's ``last_stats``."""
    chunk = gen_batch if gen_batch > 0 else len(prompts)
    per_row = is_row_keys(rng)
    if per_row and rng.shape[0] != len(prompts):
        raise ValueError(f"{rng.shape[0]} row keys for {len(prompts)} prompts")
    outs = []
    for i, start in enumerate(range(0, len(prompts), chunk)):
        outs.append(
            sampler(
                params,
                prompts[start : start + chunk],
                rng=rng[start : start + chunk] if per_row else jax.random.fold_in(rng, i),
                sampling=sampling,
                max_new_tokens=max_new_tokens,
            )
        )
        if call_stats is not None:
            # (a sampler callable that keeps no stats adds none: its use is unknown)
            call_stats.append(dict(getattr(sampler, "last_stats", {})))
    return outs[0] if len(outs) == 1 else _concat_outputs(outs)


def rollout_metrics(ro: Rollout) -> dict[str, float]:
    """Generated-length distribution of a rollout's responses (``gen_len_mean``, ``_p50``,
    ``_p90``, ``_max``; EOS included) and, when known, ``slot_utilisation``: tokens of
    decode steps over slot-steps of the sampler calls (static engine: finished rows hold
    their slots until the batch ends; continuous: slots refill)."""
    lengths = np.asarray(ro.samples.lengths, np.float64)
    metrics = {
        "gen_len_mean": float(lengths.mean()),
        "gen_len_p50": float(np.percentile(lengths, 50)),
        "gen_len_p90": float(np.percentile(lengths, 90)),
        "gen_len_max": float(lengths.max()),
    }
    if ro.slot_steps > 0:
        metrics["slot_utilisation"] = ro.decode_tokens / ro.slot_steps
    return metrics


def decode_responses(tokenizer, samples: SampleOutput) -> list[str]:
    """Response texts, the stop id that ended each (``tokenizer.stop_ids``) and padding
    removed."""
    stops = set(tokenizer.stop_ids)
    texts = []
    for tokens, mask in zip(samples.response_tokens, samples.response_mask):
        ids = [int(t) for t, m in zip(tokens, mask) if m and int(t) not in stops]
        texts.append(tokenizer.decode(ids))
    return texts


def stop_string_end(tokenizer, ids: Sequence[int], stop_strings: Sequence[str]) -> int | None:
    """The number of leading tokens of ``ids`` whose text first contains a stop string,
    or None when the whole text contains none (binary search over prefixes: a prefix's
    text is a prefix of a longer prefix's)."""
    if not any(s in tokenizer.decode(list(ids)) for s in stop_strings):
        return None
    lo, hi = 1, len(ids)  # invariant: the first hi tokens contain one
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tokenizer.decode(list(ids[:mid])) for s in stop_strings):
            hi = mid
        else:
            lo = mid + 1
    return hi


def truncate_at_stop_strings(
    tokenizer, samples: SampleOutput, stop_strings: Sequence[str]
) -> SampleOutput:
    """Ends each response at the token that completes its first stop string (the stop
    string stays in the response, as its last tokens: the policy is trained to emit it).

    Tokens after it become padding (``pad_id``, masked, log-prob 0) and ``lengths``
    shrinks, so reward, loss and token counts see the response as ended there. The
    sampler itself still ran to EOS or ``max_new_tokens`` (no early exit on text).
    """
    if not stop_strings:
        return samples
    stops = set(tokenizer.stop_ids)
    tokens, mask = samples.response_tokens.copy(), samples.response_mask.copy()
    logprobs, lengths = samples.response_logprobs.copy(), samples.lengths.copy()
    for b in range(len(lengths)):
        n = int(lengths[b])
        ids = [int(t) for t in tokens[b, :n]]
        end = stop_string_end(tokenizer, [t for t in ids if t not in stops], stop_strings)
        if end is None or end >= n:
            continue
        tokens[b, end:], mask[b, end:], logprobs[b, end:] = tokenizer.pad_id, False, 0.0
        lengths[b] = end
    return dataclasses.replace(
        samples,
        response_tokens=tokens,
        response_mask=mask,
        response_logprobs=logprobs,
        lengths=lengths,
    )


def rollout(
    sampler: Sampler,
    params: Any,
    task: Any,
    tokenizer: Any,
    examples: list[dict[str, Any]],
    group_size: int,
    *,
    rng: jax.Array,
    sampling: SamplingConfig,
    gen_batch: int = 0,
    stop_strings: Sequence[str] = (),
) -> Rollout:
    """Generates G responses for each of P examples and scores them; a response ends at
    its first stop string (`truncate_at_stop_strings`) when ``stop_strings`` are given."""
    t0 = time.perf_counter()
    prompt_ids = [encode_prompt(tokenizer, ex["prompt"]) for ex in examples]
    repeated = [ids for ids in prompt_ids for _ in range(group_size)]
    calls: list[dict] = []
    samples = generate(
        sampler, params, repeated, rng=rng, sampling=sampling, gen_batch=gen_batch, call_stats=calls
    )
    samples = truncate_at_stop_strings(tokenizer, samples, stop_strings)
    t1 = time.perf_counter()
    texts = decode_responses(tokenizer, samples)
    rewards_n, scores = score_responses(task, examples, texts, group_size=group_size)
    t2 = time.perf_counter()
    return Rollout(
        examples=examples,
        samples=samples,
        rewards_pg=rewards_n.reshape(len(examples), group_size),
        time_generate_s=t1 - t0,
        time_score_s=t2 - t1,
        gen_tokens=int(samples.lengths.sum()),
        score_counts=unverified_counts(task, scores),
        decode_tokens=sum(int(st.get("decode_tokens", 0)) for st in calls),
        slot_steps=sum(int(st.get("slot_steps", 0)) for st in calls),
    )


def evaluate(
    sampler: Sampler,
    params: Any,
    task: Any,
    tokenizer: Any,
    examples: list[dict[str, Any]],
    *,
    k: int,
    rng: jax.Array,
    sampling: SamplingConfig,
    greedy: bool = True,
    gen_batch: int = 0,
    on_rollout: Callable[[Rollout], None] | None = None,
    stop_strings: Sequence[str] = (),
) -> dict[str, float]:
    """Validation: mean@k at the sampling temperature, plus greedy accuracy.

    ``on_rollout``, when given, is called with the sampled rollout (k responses per
    example), e.g. to log some of its generations.

    Returns:
      ``eval_accuracy`` (mean@k), ``eval_k``, ``eval_pass_at_k`` (any of k correct),
      ``eval_greedy_accuracy`` (when ``greedy``) and ``time_eval_s``.
    """
    t0 = time.perf_counter()
    out = rollout(
        sampler,
        params,
        task,
        tokenizer,
        examples,
        k,
        rng=rng,
        sampling=sampling,
        gen_batch=gen_batch,
        stop_strings=stop_strings,
    )
    if on_rollout is not None:
        on_rollout(out)
    metrics = {
        "eval_accuracy": mean_at_k(out.rewards_pg),
        "eval_k": k,
        "eval_pass_at_k": float(np.mean(out.rewards_pg.max(axis=1) > 0)),
        "eval_response_len": float(out.samples.lengths.mean()),
        **{f"eval_{name}": n for name, n in out.score_counts.items()},
    }
    if greedy:
        g = rollout(
            sampler,
            params,
            task,
            tokenizer,
            examples,
            1,
            rng=rng,
            sampling=dataclasses.replace(sampling, greedy=True),  # (the same engine)
            gen_batch=gen_batch,
            stop_strings=stop_strings,
        )
        metrics["eval_greedy_accuracy"] = greedy_accuracy(g.rewards_pg[:, 0])
    metrics["time_eval_s"] = time.perf_counter() - t0
    return metrics
