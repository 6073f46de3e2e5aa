"""The task interface: examples, scores and what every task provides.

A task makes examples (``prompt``, ``answer``, ``meta``) and scores a response against an
example. For the synthetic tasks ``answer`` is a complete correct response (the target of
supervised warm-up) and the verifier checks the response's *value*; for math data it is the
ground-truth final answer. ``meta`` holds JSON-serialisable extras.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt with its reference answer.

    Attributes:
        prompt: text the model is conditioned on (BOS is added by the tokenizer helpers).
        answer: reference response (synthetic tasks) or ground-truth answer (math).
        meta: JSON-serialisable extras (e.g. Countdown's numbers and target).
    """

    prompt: str
    answer: str
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "answer": self.answer, "meta": dict(self.meta)}


@dataclasses.dataclass(frozen=True)
class Score:
    """A verifier's verdict on one response.

    Attributes:
        reward: 1.0 when correct, else 0.0.
        format_ok: the response had the expected shape (an answer could be extracted).
        parsed: the extracted answer as text, or None when nothing could be extracted.
        error: why the response failed, when it did (e.g. "uses 7 more than given").
        unverified: why it scored 0 without the verifier's verdict, when it did
            (``rewards.UNVERIFIED_KINDS``: "too_big", "timeout"); None otherwise.
    """

    reward: float
    format_ok: bool
    parsed: str | None = None
    error: str | None = None
    unverified: str | None = None


def to_example(example: Example | Mapping[str, Any]) -> Example:
    """Accepts an `Example` or a dict with ``prompt``/``answer`` (and optional ``meta``).

    Raises:
        ValueError: when a field is missing.
    """
    if isinstance(example, Example):
        return example
    try:
        return Example(str(example["prompt"]), str(example["answer"]), example.get("meta") or {})
    except KeyError as e:
        raise ValueError(f"example is missing field {e.args[0]!r}: {example!r}") from None


@runtime_checkable
class Task(Protocol):
    """What every task provides.

    ``max_prompt_len`` and ``max_response_len`` bound prompt and response lengths in tokens
    of the task's tokenizer (characters for the synthetic tasks; BOS and EOS *not*
    included), so a run loop can size its buffers.
    """

    name: str

    @property
    def max_prompt_len(self) -> int: ...

    @property
    def max_response_len(self) -> int: ...

    def make_example(self, rng: np.random.Generator) -> Example: ...

    def score(self, example: Example | Mapping[str, Any], response: str) -> Score: ...

    def reward(self, example: Example | Mapping[str, Any], response: str) -> float: ...
