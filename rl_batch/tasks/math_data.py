"""Real math data from local files, and the math task that scores it with math_verify.

Supported layouts (JSONL, or Parquet when the file name ends in ``.parquet``):

- ``dapo``: DAPO-Math-17K: ``prompt`` is a list of chat messages (used as given; its own
  instruction asks for an ``Answer:`` line, which the verifier also accepts) and
  ``reward_model.ground_truth`` the answer.
- ``gsm8k``: ``question``, ``answer`` ending in ``#### 42``.
- ``math``: ``problem``, ``solution`` with a ``\\boxed{}`` final answer (or an ``answer``
  field, as in MATH-500).
- ``aime``: ``problem`` or ``question``, ``answer``.

``fmt="auto"`` picks the layout from each record's fields. Every loader returns
`Example` objects whose ``answer`` is the ground truth and whose ``meta["messages"]`` is the
chat conversation; ``prompt`` is that conversation rendered through the tokenizer's chat
template when a tokenizer is given, else the user message text.

With ``max_prompt_tokens`` the loader also enforces the prompt budget at load time: each
prompt is encoded exactly as a rollout will encode it (`rl_batch.tokenizers.encode_prompt`,
BOS included) and a prompt over the budget is an error naming its file and line, or, with
``drop_long_prompts=True``, is dropped and counted in a logged warning.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from rl_batch.tasks.base import Example, Score, to_example
from rl_batch.tasks.rewards import extract_boxed, math_score
from rl_batch.tokenizers import HFTokenizer, encode_prompt

log = logging.getLogger(__name__)

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
FORMATS = ("dapo", "gsm8k", "math", "aime")
# Line numbers of over-long prompts quoted in an error or warning.
_LINES_SHOWN = 5


class _RecordError(ValueError):
    """A record without the fields its layout needs (re-raised with file and line)."""


def _field(record: Mapping[str, Any], *names: str) -> Any:
    for name in names:
        if name in record and record[name] is not None:
            return record[name]
    raise _RecordError(f"missing field {' or '.join(repr(n) for n in names)}")


def _user_messages(question: Any, instruction: str, system: str | None) -> list[dict]:
    if not isinstance(question, str) or not question.strip():
        raise _RecordError(f"question must be a non-empty string, got {question!r}")
    content = f"{question.strip()}\n{instruction}" if instruction else question.strip()
    messages = [{"role": "user", "content": content}]
    return ([{"role": "system", "content": system}] if system else []) + messages


def _answer_text(value: Any) -> str:
    if isinstance(value, (int, float, np.integer, np.floating)):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise _RecordError(f"answer must be a non-empty string or number, got {value!r}")
    return value.strip()


def _parse_dapo(record, instruction, system):
    prompt = _field(record, "prompt")
    if isinstance(prompt, np.ndarray):  # Parquet lists can come back as arrays.
        prompt = prompt.tolist()
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise _RecordError(f"'prompt' must be a non-empty list of chat messages, got {prompt!r}")
    messages = []
    for m in prompt:
        if not isinstance(m, Mapping) or not isinstance(m.get("content"), str):
            raise _RecordError(f"bad chat message in 'prompt': {m!r}")
        messages.append({"role": str(m.get("role", "user")), "content": m["content"]})
    if system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    reward_model = _field(record, "reward_model")
    if not isinstance(reward_model, Mapping):
        raise _RecordError(f"'reward_model' must be an object, got {reward_model!r}")
    return messages, _answer_text(_field(reward_model, "ground_truth"))


def _parse_gsm8k(record, instruction, system):
    answer = _field(record, "answer")
    if not isinstance(answer, str) or "####" not in answer:
        raise _RecordError(f"gsm8k 'answer' has no '#### <final answer>': {answer!r:.80}")
    final = answer.rsplit("####", 1)[1].strip().replace(",", "")
    messages = _user_messages(_field(record, "question"), instruction, system)
    return messages, _answer_text(final)


def _parse_math(record, instruction, system):
    messages = _user_messages(_field(record, "problem"), instruction, system)
    if record.get("answer") is not None:
        return messages, _answer_text(record["answer"])
    solution = _field(record, "solution")
    boxed = extract_boxed(solution) if isinstance(solution, str) else None
    if not boxed:
        raise _RecordError(f"MATH 'solution' has no \\boxed{{}} answer: {solution!r:.80}")
    return messages, boxed


def _parse_aime(record, instruction, system):
    messages = _user_messages(_field(record, "problem", "question"), instruction, system)
    return messages, _answer_text(_field(record, "answer"))


_PARSERS: dict[str, Callable] = {
    "dapo": _parse_dapo,
    "gsm8k": _parse_gsm8k,
    "math": _parse_math,
    "aime": _parse_aime,
}


def detect_format(record: Mapping[str, Any]) -> str:
    """Guesses a record's layout from its fields (see the module docstring)."""
    if "reward_model" in record:
        return "dapo"
    if (
        "question" in record
        and isinstance(record.get("answer"), str)
        and "####" in (record["answer"])
    ):
        return "gsm8k"
    if "problem" in record and "solution" in record:
        return "math"
    if ("problem" in record or "question" in record) and "answer" in record:
        return "aime"
    raise _RecordError(
        f"cannot tell the layout from fields {sorted(record)}; set task.format (fmt= of "
        f"load_math_file) to one of {', '.join(FORMATS)}"
    )


def _iter_records(path: str) -> Iterator[tuple[int, Any]]:
    """Yields (1-based line or row number, record); JSON errors name the line."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        for i, record in enumerate(pq.read_table(path).to_pylist(), start=1):
            yield i, record
        return
    with open(path, "rb") as f:
        for i, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(
                    f"{path}:{i}: not UTF-8 text (byte {raw[e.start : e.start + 1]!r} at "
                    f"column {e.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                yield i, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: invalid JSON ({e.msg})") from None


def format_prompt(
    messages: Sequence[Mapping[str, str]],
    tokenizer: HFTokenizer | None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Prompt text for a conversation: the chat template (given ``chat_template_kwargs``)
    when a tokenizer is given, else the message contents joined by blank lines."""
    if tokenizer is None:
        return "\n\n".join(m["content"] for m in messages)
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, chat_template_kwargs=chat_template_kwargs
    )


def load_math_file(
    path: str | os.PathLike,
    fmt: str = "auto",
    tokenizer: HFTokenizer | None = None,
    instruction: str = DEFAULT_INSTRUCTION,
    system: str | None = None,
    limit: int | None = None,
    max_prompt_tokens: int | None = None,
    drop_long_prompts: bool = False,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> list[Example]:
    """Loads math problems from a local JSONL or Parquet file.

    Args:
        path: the file (``.parquet`` is read with pyarrow, anything else as JSONL).
        fmt: one of ``"dapo"``, ``"gsm8k"``, ``"math"``, ``"aime"`` or ``"auto"``.
        tokenizer: renders prompts through its chat template when given.
        instruction: appended to each question (not to DAPO prompts, which carry their own).
        system: optional system message.
        limit: keep only the first ``limit`` examples (after any dropped prompts).
        max_prompt_tokens: when given, the most tokens a prompt may have as a rollout
            encodes it (`encode_prompt`: BOS included when the tokenizer has one), i.e.
            the sampler's limit, ``config.derived.max_prompt_len`` of a run. Needs
            ``tokenizer``.
        drop_long_prompts: drop prompts over ``max_prompt_tokens`` (their count and
            first lines are logged as a warning) instead of raising.
        chat_template_kwargs: extra variables of the tokenizer's jinja chat template
            (e.g. ``{"enable_thinking": False}`` for Qwen3).

    Returns:
        Examples with ``answer`` = ground truth and ``meta`` = {"messages", "format",
        "line"}.

    Raises:
        ValueError: bad JSON or a missing/malformed field, naming the file and the 1-based
            line (row, for Parquet); a prompt over ``max_prompt_tokens`` (unless
            ``drop_long_prompts``), naming the file, the line of the first one, its token
            count, the limit and how many prompts of the file are over it; an unknown
            ``fmt``; ``max_prompt_tokens`` without a tokenizer or below 1.
    """
    path = os.fspath(path)
    if fmt != "auto" and fmt not in _PARSERS:
        raise ValueError(f"unknown math data format {fmt!r}; known: {', '.join(FORMATS)}, auto")
    if max_prompt_tokens is not None:
        if tokenizer is None:
            raise ValueError(
                f"max_prompt_tokens={max_prompt_tokens} needs the tokenizer that encodes the "
                "prompts; got tokenizer=None"
            )
        if max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens={max_prompt_tokens}: must be >= 1")
    examples = []
    too_long: list[tuple[int, int]] = []  # (line, tokens) of prompts over the budget
    for line, record in _iter_records(path):
        if limit is not None and len(examples) >= limit:
            break
        try:
            if not isinstance(record, Mapping):
                raise _RecordError(f"expected a JSON object, got {type(record).__name__}")
            record_fmt = detect_format(record) if fmt == "auto" else fmt
            messages, answer = _PARSERS[record_fmt](record, instruction, system)
        except _RecordError as e:
            raise ValueError(f"{path}:{line}: {e}") from None
        prompt = format_prompt(messages, tokenizer, chat_template_kwargs)
        if max_prompt_tokens is not None:
            n_tokens = len(encode_prompt(tokenizer, prompt))
            if n_tokens > max_prompt_tokens:
                too_long.append((line, n_tokens))
                continue
        meta = {"messages": messages, "format": record_fmt, "line": line}
        examples.append(Example(prompt, answer, meta))
    if too_long:
        lines = ", ".join(str(line) for line, _ in too_long[:_LINES_SHOWN])
        more = ", ..." if len(too_long) > _LINES_SHOWN else ""
        if not drop_long_prompts:
            first_line, first_tokens = too_long[0]
            raise ValueError(
                f"{path}:{first_line}: prompt has {first_tokens} tokens, over the limit of "
                f"{max_prompt_tokens} (BOS included); {len(too_long)} prompt(s) of this file "
                f"are over it (lines {lines}{more}). Raise the task's max_prompt_len or drop "
                "them (drop_long_prompts)"
            )
        log.warning(
            "%s: dropped %d of %d prompts over %d tokens (lines %s%s)",
            path,
            len(too_long),
            len(too_long) + len(examples),
            max_prompt_tokens,
            lines,
            more,
        )
    return examples


def hold_out(examples: Sequence[Any], fraction: float, seed: int) -> tuple[list, list]:
    """Splits a file's examples into (train, validation) without overlap.

    Args:
        examples: the examples of one file.
        fraction: the share held out for validation, in (0, 1): round(fraction x N)
            examples, at least 1, at most N - 1.
        seed: chooses which (the same seed, the same split).

    Returns:
        The training examples in file order, the held-out ones in a random order.

    Raises:
        ValueError: ``fraction`` outside (0, 1) or fewer than 2 examples.
    """
    n = len(examples)
    if not 0 < fraction < 1:
        raise ValueError(f"eval_fraction={fraction}: must be in (0, 1)")
    if n < 2:
        raise ValueError(f"eval_fraction={fraction}: {n} example(s) cannot be split")
    n_val = min(max(1, round(fraction * n)), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    held = order[:n_val]
    kept = np.sort(order[n_val:])
    return [examples[i] for i in kept], [examples[i] for i in held]


def shuffled(examples: Sequence[Any], seed: int) -> list:
    """``examples`` in a fixed random order (validation takes its first eval_prompts: a
    file sorted by source or difficulty would otherwise give its first rows only)."""
    return [examples[i] for i in np.random.default_rng(seed).permutation(len(examples))]


@dataclasses.dataclass(frozen=True, kw_only=True)
class MathTask:
    """Math problems scored by `rl_batch.tasks.rewards.math_score`.

    Examples come from files (`load_math_file`), not from a generator.

    Attributes:
        max_prompt_len: prompt budget in tokens of the model's tokenizer, BOS excluded
            (a run's sampler, and the load-time check of `load_math_file` given
            ``config.derived.max_prompt_len``, allow one more token for BOS).
        max_response_len: response budget in tokens.
        timeout_s: math_verify timeout per call in the main thread; off it, the
            watchdog's limit for a whole check is ``3 * timeout_s``.
    """

    # Responses can score 0 unverified (too big, or timed out): rollouts count them
    # (``rewards.unverified_counts``).
    may_skip_verification: ClassVar[bool] = True
    max_prompt_len: int = 512
    max_response_len: int = 2048
    timeout_s: int = 5
    name: str = dataclasses.field(default="math", init=False)

    def make_example(self, rng: np.random.Generator) -> Example:
        raise NotImplementedError(
            "the math task has no generator: load examples with "
            "rl_batch.tasks.math_data.load_math_file"
        )

    def score(self, example: Example | Mapping[str, Any], response: str) -> Score:
        return math_score(response, to_example(example).answer, self.timeout_s)

    def reward(self, example: Example | Mapping[str, Any], response: str) -> float:
        return self.score(example, response).reward
