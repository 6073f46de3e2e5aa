"""Partial rollout: long responses continue across updates under the newest policy.

Each iteration generates at most ``tokens_per_iter`` new tokens per unfinished response.
A response that has not ended (no EOS and below ``max_new_tokens``) is carried to the
next iteration, where it is continued from the *updated* parameters: its prompt plus
the tokens generated so far are prefilled again and decoding goes on. A group of G
responses enters a training batch when all of its responses have ended; the batch keeps
P groups (carried ones first, new prompts to fill), so its shapes never change and only
the completed groups are trained on (the others are masked like filtered groups).

Throughput counts what each iteration does (``Advanced``): a token is generated once,
in the iteration that decoded it, and the re-prefill of carried tokens is prefill work;
the batch's samples (which hold every carried token) are no measure of generation.

The per-token log-probs come from whichever policy generated each token, so the update's
importance ratio departs from 1 for carried tokens (the decoupled objective); the
``staleness`` of a group is the number of updates between its first token and training.
The carry-over is plain data (``to_json`` / ``from_json``) saved with each checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

from rl_batch.models import flops
from rl_batch.rollout.groups import Rollout, decode_responses
from rl_batch.rollout.sampler import SampleOutput, Sampler, SamplingConfig, eos_ids_of
from rl_batch.tasks.rewards import score_responses, unverified_counts
from rl_batch.tokenizers import encode_prompt


@dataclasses.dataclass
class Group:
    """One prompt's G responses, possibly unfinished."""

    example: dict[str, Any]
    prompt_ids: list[int]
    tokens: list[list[int]]  # G responses so far (EOS included once emitted)
    logprobs: list[list[float]]
    done: list[bool]
    started_at_step: int  # optimizer step when its first token was generated

    @property
    def complete(self) -> bool:
        return all(self.done)


def new_group(tokenizer, example: dict[str, Any], group_size: int, step: int) -> Group:
    return Group(
        example=example,
        prompt_ids=encode_prompt(tokenizer, example["prompt"]),
        tokens=[[] for _ in range(group_size)],
        logprobs=[[] for _ in range(group_size)],
        done=[False] * group_size,
        started_at_step=step,
    )


@dataclasses.dataclass(frozen=True)
class Advanced:
    """The work of one ``advance`` call (the throughput counts this, not the batch).

    Attributes:
      gen_tokens: new tokens kept in the responses (EOS included).
      prefill_tokens: real tokens prefilled: every unfinished response's prompt plus
        the tokens it carried in (decoded before, prefilled again now).
      gen_flops: forward FLOPs of that prefill and of decoding the kept tokens
        (``flops.generation_flops`` over the call's prompt and response buckets).
    """

    gen_tokens: int = 0
    prefill_tokens: int = 0
    gen_flops: float = 0.0


def advance(
    sampler: Sampler,
    params: Any,
    groups: list[Group],
    *,
    eos_id: int | tuple[int, ...],
    max_new_tokens: int,
    tokens_per_iter: int,
    rng: jax.Array,
    sampling: SamplingConfig,
) -> Advanced:
    """Generates up to ``tokens_per_iter`` more tokens for every unfinished response.

    ``sampler`` must accept prompts of up to prompt + ``max_new_tokens`` tokens and
    ``tokens_per_iter`` new tokens. Returns the work done: the tokens generated and the
    FLOPs of this call only (the carried tokens of earlier calls are not counted again
    as generated, but their re-prefill is counted as prefill work). Tokens the sampler
    decodes past ``max_new_tokens`` are dropped and not counted.
    """
    eos_ids = eos_ids_of(eos_id)  # any one ends a row
    rows = [(g, i) for g in groups for i in range(len(g.done)) if not g.done[i]]
    if not rows:
        return Advanced()
    prompts = [g.prompt_ids + g.tokens[i] for g, i in rows]
    out = sampler(params, prompts, rng=rng, sampling=sampling, max_new_tokens=tokens_per_iter)
    generated = 0
    for row, (g, i) in enumerate(rows):
        n = min(int(out.lengths[row]), max_new_tokens - len(g.tokens[i]))
        new = out.response_tokens[row, :n].tolist()
        g.tokens[i].extend(new)
        g.logprobs[i].extend(out.response_logprobs[row, :n].tolist())
        g.done[i] = any(e in new for e in eos_ids) or len(g.tokens[i]) >= max_new_tokens
        generated += n
    prefill_tokens = sum(len(p) for p in prompts)
    prompt_len = out.prompt_tokens.shape[1]  # the buckets the sampler ran with
    gen_flops = flops.generation_flops(
        sampler.config,
        prompt_tokens=prefill_tokens,
        gen_tokens=generated,
        prompt_len=prompt_len,
        seq_len=prompt_len + out.response_tokens.shape[1],
    )
    return Advanced(gen_tokens=generated, prefill_tokens=prefill_tokens, gen_flops=gen_flops)


def to_rollout(
    groups: list[Group],
    task: Any,
    tokenizer: Any,
    *,
    prompt_len: int,
    response_len: int,
    pad_id: int,
) -> Rollout:
    """The fixed-shape batch of P groups, with its ``complete_p`` mask [P].

    Rewards are scored for complete groups only (0 elsewhere); incomplete groups get an
    all-False response mask downstream through ``keep_p``.
    """
    g_size = len(groups[0].done)
    b = len(groups) * g_size
    prompt_tokens = np.full((b, prompt_len), pad_id, np.int32)
    prompt_mask = np.zeros((b, prompt_len), bool)
    tokens = np.full((b, response_len), pad_id, np.int32)
    mask = np.zeros((b, response_len), bool)
    logprobs = np.zeros((b, response_len), np.float32)
    for p, group in enumerate(groups):
        for i in range(g_size):
            row, n = p * g_size + i, len(group.tokens[i])
            prompt_tokens[row, prompt_len - len(group.prompt_ids) :] = group.prompt_ids
            prompt_mask[row, prompt_len - len(group.prompt_ids) :] = True
            tokens[row, :n] = group.tokens[i]
            mask[row, :n] = True
            logprobs[row, :n] = group.logprobs[i]
    samples = SampleOutput(
        prompt_tokens=prompt_tokens,
        prompt_mask=prompt_mask,
        response_tokens=tokens,
        response_mask=mask,
        response_logprobs=logprobs,
        lengths=mask.sum(axis=1, dtype=np.int32),
    )
    complete_p = np.array([g.complete for g in groups])
    rewards_pg = np.zeros((len(groups), g_size), np.float32)
    done_groups = [g for g in groups if g.complete]
    t0 = time.perf_counter()
    scores = []
    if done_groups:
        rows = np.concatenate(
            [np.arange(p * g_size, (p + 1) * g_size) for p in np.where(complete_p)[0]]
        )
        texts = decode_responses(tokenizer, _take_rows(samples, rows))
        rewards_n, scores = score_responses(task, [g.example for g in done_groups], texts, g_size)
        rewards_pg[complete_p] = rewards_n.reshape(-1, g_size)
    return Rollout(
        examples=[g.example for g in groups],
        samples=samples,
        rewards_pg=rewards_pg,
        time_generate_s=0.0,
        time_score_s=time.perf_counter() - t0,
        gen_tokens=0,
        complete_p=complete_p,
        score_counts=unverified_counts(task, scores),
    )


def _take_rows(samples: SampleOutput, rows: np.ndarray) -> SampleOutput:
    return SampleOutput(
        *(None if x is None else np.asarray(x)[rows] for x in dataclasses.astuple(samples))
    )


def to_json(groups: list[Group]) -> list[dict[str, Any]]:
    """The carry-over as JSON-serialisable data (saved with checkpoints)."""
    return [dataclasses.asdict(g) for g in groups]


def from_json(data: list[dict[str, Any]]) -> list[Group]:
    return [Group(**g) for g in data]
