"""Validation without sampling noise: the policy's probability of each reference response.

For a task whose examples carry one canonical response (the synthetic tasks' ``answer``,
e.g. the scratchpad of an addition), ``p_ref = p(answer + EOS | prompt)`` at the sampling
temperature is the probability that one sampled response *is* the reference. Its mean over
the validation prompts is the exact-match accuracy mean@inf: what mean@k estimates with
binomial noise (standard error ~0.02 for mean@4 on 128 prompts), computed exactly from one
teacher-forced forward pass. It is a lower bound of the sampled accuracy (a response with a
different scratchpad and the right answer also scores 1); on the addition task the two
agree to within the sampled metric's noise (see the run's eval lines, which hold both).

``ReferenceScorer(...)(params)`` returns the eval-line fields ``eval_p_ref`` (mean p_ref)
and ``eval_ref_logp`` (mean log p_ref per prompt, nats), in a fixed number of jitted calls
of fixed shapes (one compilation).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rl_batch.algorithms import forward
from rl_batch.models import transformer as model_lib
from rl_batch.tokenizers import encode_prompt


class ReferenceBatch(NamedTuple):
    """Teacher-forced prompts and reference responses (the ``batch.Batch`` input fields)."""

    prompt_tokens: np.ndarray  # [N, P] int32, left-padded
    prompt_mask: np.ndarray  # [N, P] bool
    response_tokens: np.ndarray  # [N, R] int32, right-padded; answer then EOS
    response_mask: np.ndarray  # [N, R] bool


def reference_batch(
    tokenizer: Any, examples: Sequence[dict[str, Any]], rows: int | None = None
) -> ReferenceBatch:
    """Tokens of each example's prompt and reference response (``answer`` + EOS).

    Args:
      tokenizer: the policy's tokenizer.
      examples: dicts with ``prompt`` and ``answer``.
      rows: pad to this many rows (all-False masks) so that every call has one shape.

    Raises:
      ValueError: an example has no non-empty ``answer`` (the task has no reference).
    """
    prompts, answers = [], []
    for i, ex in enumerate(examples):
        answer = ex.get("answer") if hasattr(ex, "get") else None
        if not isinstance(answer, str) or not answer:
            raise ValueError(
                f"eval_metric='p_ref' needs a reference response per example; validation "
                f"example {i} has answer={answer!r}"
            )
        prompts.append(encode_prompt(tokenizer, ex["prompt"]))
        answers.append(tokenizer.encode(answer) + [tokenizer.eos_id])
    n = rows or len(examples)
    p, r = max(map(len, prompts)), max(map(len, answers))
    pt = np.full((n, p), tokenizer.pad_id, np.int32)
    pm = np.zeros((n, p), bool)
    rt = np.full((n, r), tokenizer.pad_id, np.int32)
    rm = np.zeros((n, r), bool)
    for i, (ids, ans) in enumerate(zip(prompts, answers)):
        pt[i, p - len(ids) :], pm[i, p - len(ids) :] = ids, True
        rt[i, : len(ans)], rm[i, : len(ans)] = ans, True
    return ReferenceBatch(pt, pm, rt, rm)


class ReferenceScorer:
    """Mean p(reference response) of a fixed set of validation examples (see module doc).

    Args:
      model_config: the policy's shape.
      tokenizer: its tokenizer.
      examples: validation examples with ``prompt`` and ``answer``.
      temperature: the sampling temperature (p_ref is the probability of sampling it).
      chunk: rows per jitted call (0 = all at once); the last chunk is padded.

    A call with a ``memo_key`` keeps its result under it and a later call with that key
    returns it without a pass: the caller's promise that the params are the same (a run's
    warm start, scored by every run of its configuration that a process runs:
    ``rl_batch.runs.run.Evaluator``). The pass is deterministic, so the values are the ones
    a new pass would give; ``time_eval_ref_s`` is then the lookup's.
    """

    def __init__(
        self,
        model_config: model_lib.ModelConfig,
        tokenizer: Any,
        examples: Sequence[dict[str, Any]],
        *,
        temperature: float = 1.0,
        chunk: int = 256,
    ):
        n = len(examples)
        self.chunk = min(chunk, n) if chunk > 0 else n
        rows = -(-n // self.chunk) * self.chunk
        self.n = n
        self.batch = reference_batch(tokenizer, examples, rows)

        def seq_logp(params, piece: ReferenceBatch) -> jax.Array:  # -> [C]
            logp_cr = forward.compute_logprobs(model_config, params, piece, temperature)
            return logp_cr.sum(axis=1)

        self._seq_logp = jax.jit(seq_logp)
        self._memo: dict[Any, dict[str, float]] = {}

    def logp(self, params: Any) -> np.ndarray:
        """[N] float64 log p(reference response) of each example."""
        out = []
        for start in range(0, self.batch.prompt_tokens.shape[0], self.chunk):
            piece = ReferenceBatch(
                *(jnp.asarray(x[start : start + self.chunk]) for x in self.batch)
            )
            out.append(np.asarray(self._seq_logp(params, piece)))
        return np.concatenate(out)[: self.n].astype(np.float64)

    def __call__(self, params: Any, memo_key: Any = None) -> dict[str, float]:
        """``eval_p_ref``, ``eval_ref_logp`` and ``time_eval_ref_s`` of ``params`` (kept
        under ``memo_key`` when given, and taken from there when kept: see the class doc)."""
        t0 = time.perf_counter()
        if memo_key is None or memo_key not in self._memo:
            logp_n = self.logp(params)
            values = {
                "eval_p_ref": float(np.mean(np.exp(logp_n))),
                "eval_ref_logp": float(np.mean(logp_n)),
            }
            if memo_key is not None:
                self._memo[memo_key] = values
        else:
            values = self._memo[memo_key]
        return {**values, "time_eval_ref_s": time.perf_counter() - t0}
