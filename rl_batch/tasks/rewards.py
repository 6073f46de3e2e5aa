"""Batched scoring, evaluation helpers and the math_verify answer checker.

- `score_responses`: one task, many (example, response) pairs -> rewards ``[N]`` + scores.
- `mean_at_k`, `pass_at_k`, `greedy_accuracy`: pure numpy reductions for evaluation.
- `extract_boxed`, `math_score`: the verifier for real math data (``\\boxed{}`` answers
  checked with math_verify), with a watchdog timeout off the main thread.
- `unverified_counts`: how many responses scored 0 without a verdict (too big to verify,
  or the verifier timed out), the rollout metrics ``score_unverified_*``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rl_batch.tasks.base import Example, Score, Task


def score_responses(
    task: Task,
    examples: Sequence[Example | Mapping[str, Any]],
    responses: Sequence[str],
    group_size: int = 1,
) -> tuple[np.ndarray, list[Score]]:
    """Scores responses; example ``i`` owns ``responses[i * G:(i + 1) * G]``.

    Args:
        task: the task whose verifier to use.
        examples: ``P`` examples (`Example` or dicts with ``prompt``/``answer``).
        responses: ``P * group_size`` decoded responses, grouped by example (the row-major
            flattening of a ``[P, G]`` layout).
        group_size: responses per example ``G``.

    Returns:
        ``(rewards_n, scores)``: float32 rewards ``[P * G]`` and one `Score` per response.

    Raises:
        ValueError: when ``len(responses) != len(examples) * group_size``.
    """
    if group_size < 1 or len(responses) != len(examples) * group_size:
        raise ValueError(
            f"got {len(responses)} responses for {len(examples)} examples with "
            f"group_size={group_size}; expected {len(examples) * group_size}"
        )
    owners = [examples[i // group_size] for i in range(len(responses))]
    if hasattr(task, "score_batch"):  # one call for the rollout (a batched reward_fn)
        scores = list(task.score_batch(owners, responses))
    else:
        scores = [task.score(ex, response) for ex, response in zip(owners, responses)]
    rewards_n = np.asarray([s.reward for s in scores], dtype=np.float32)  # [P * G]
    return rewards_n, scores


# ``Score.unverified``: why a response scored 0 without the verifier's verdict.
UNVERIFIED_TOO_BIG = "too_big"  # longer than MAX_ANSWER_CHARS or nested past MAX_NESTING
UNVERIFIED_TIMEOUT = "timeout"  # math_verify ran past its time (the watchdog's count)
UNVERIFIED_KINDS = (UNVERIFIED_TOO_BIG, UNVERIFIED_TIMEOUT)


def unverified_metric(kind: str) -> str:
    """The metrics-line name of a count of ``Score.unverified == kind``."""
    return f"score_unverified_{kind}"


def unverified_counts(task: Task, scores: Sequence[Score]) -> dict[str, int]:
    """``score_unverified_too_big`` and ``score_unverified_timeout``: responses of
    ``scores`` that scored 0 unverified, for a task whose verifier can skip
    (``task.may_skip_verification``, the math task); {} for any other task, so that
    synthetic runs' metrics lines stay as they were."""
    if not getattr(task, "may_skip_verification", False):
        return {}
    return {unverified_metric(k): sum(s.unverified == k for s in scores) for k in UNVERIFIED_KINDS}


def _check_ndim(x: np.ndarray, ndim: int, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != ndim or x.size == 0:
        raise ValueError(f"{name} must be a non-empty {ndim}-D array, got shape {x.shape}")
    return x


def mean_at_k(rewards_pk: np.ndarray) -> float:
    """mean@k: the average reward over ``k`` samples per prompt, averaged over prompts.

    Args:
        rewards_pk: rewards ``[P, k]``.

    Returns:
        The mean over all ``P * k`` entries.
    """
    return float(_check_ndim(rewards_pk, 2, "rewards_pk").mean())


def pass_at_k(rewards_pk: np.ndarray, threshold: float = 1.0) -> float:
    """pass@k: the fraction of prompts with at least one sample scoring ``>= threshold``.

    Args:
        rewards_pk: rewards ``[P, k]``.
        threshold: the reward that counts as solved.

    Returns:
        The fraction of the ``P`` prompts solved.
    """
    rewards_pk = _check_ndim(rewards_pk, 2, "rewards_pk")
    return float((rewards_pk >= threshold).any(axis=1).mean())


def greedy_accuracy(rewards_p: np.ndarray) -> float:
    """Accuracy of one greedy (temperature 0) response per prompt.

    Args:
        rewards_p: rewards ``[P]``.

    Returns:
        Their mean.
    """
    return float(_check_ndim(rewards_p, 1, "rewards_p").mean())


# ---------------------------------------------------------------------------------------
# Real math answers.

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_ANSWER_LINE_RE = re.compile(r"Answer\s*:\s*(.+?)\s*$", re.MULTILINE)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced.

    Args:
        text: a response.

    Returns:
        The content, stripped, or None when there is no complete boxed expression.
    """
    for m in reversed(list(_BOXED_RE.finditer(text))):
        depth, start = 1, m.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i].strip()
    return None


def extract_final_answer(text: str) -> str | None:
    """The last ``\\boxed{}`` content, else the last ``Answer: ...`` line (the format the
    DAPO-Math-17K prompts ask for), else None."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    lines = _ANSWER_LINE_RE.findall(text)
    if lines:
        return lines[-1].strip().strip("$").strip()
    return None


# Answers beyond these are scored 0 unverified: a 4000-deep nested ground truth took 21 s
# per math_verify call.
MAX_ANSWER_CHARS = 2000
MAX_NESTING = 64


def _too_big_to_verify(text: str) -> str:
    """Why ``text`` is too long or too deeply nested to verify ("" when it is not)."""
    if len(text) > MAX_ANSWER_CHARS:
        return f"{len(text)} characters (more than {MAX_ANSWER_CHARS})"
    depth = deepest = 0
    for ch in text:
        if ch in "{([":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "})]":
            depth = max(depth - 1, 0)
    if deepest > MAX_NESTING:
        return f"brackets nested {deepest} deep (more than {MAX_NESTING})"
    return ""


class VerifyTimeout(Exception):
    """The watchdog's verdict: the check ran past its time."""


def call_with_timeout(fn: Callable[[], Any], timeout_s: float) -> Any:
    """``fn()``, run in a daemon thread and waited for at most ``timeout_s`` seconds.

    math_verify's own timeouts use ``signal.alarm``, which only works in the main thread;
    this is the watchdog for scoring from any other (the async rollout's generator
    thread). A thread cannot be stopped: on expiry ``fn`` runs on in the background until
    it returns (daemon: it does not hold up the process's exit), which is why answers too
    big to verify are refused before any call.

    Raises:
      VerifyTimeout: ``fn`` has not returned after ``timeout_s``.
      Exception: whatever ``fn`` raised.
    """
    box: dict[str, Any] = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    worker = threading.Thread(target=target, name="math_verify", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise VerifyTimeout(f"math_verify ran past {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["result"]


def _verify(answer: str, ground_truth: str, timeout: int | None) -> bool:
    """math_verify's verdict; ``timeout`` per call (None: none, off the main thread)."""
    import math_verify

    gold = math_verify.parse(f"${ground_truth}$", parsing_timeout=timeout)
    pred = math_verify.parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
    if gold and pred:
        return math_verify.verify(gold, pred, timeout_seconds=timeout)
    # Unparseable on either side: fall back to exact text.
    return answer.replace(" ", "") == ground_truth.strip().replace(" ", "")


def math_score(response: str, ground_truth: str, timeout_s: int = 5) -> Score:
    """Checks a math response's final answer against the ground truth with math_verify.

    The final answer is the last ``\\boxed{}`` content (or a final ``Answer:`` line);
    ``format_ok`` says whether one was found. math_verify's timeouts use ``signal.alarm``,
    which only works in the main thread; elsewhere math_verify runs without its own
    timeouts under a watchdog (``call_with_timeout``) of ``3 * timeout_s`` for the whole
    check (its two parses and the comparison: their limit in the main thread), and a
    check past it scores 0 with ``unverified="timeout"``. Answers (or ground truths)
    longer than ``MAX_ANSWER_CHARS`` or nested deeper than ``MAX_NESTING`` brackets score
    0 without being verified (``unverified="too_big"``). Any exception inside math_verify
    scores 0 (with the error recorded).

    Args:
        response: the model's decoded response.
        ground_truth: the reference answer (plain or LaTeX, without ``$``).
        timeout_s: per-call math_verify timeout in the main thread; off it, the whole
            check has ``3 * timeout_s``.

    Returns:
        A `Score` with ``parsed`` the extracted answer text.
    """
    answer = extract_final_answer(response)
    if answer is None:
        return Score(0.0, False, None, "no \\boxed{} answer")
    if not answer:
        return Score(0.0, False, "", "empty \\boxed{} answer")
    for what, text in (("answer", answer), ("ground truth", ground_truth)):
        too_big = _too_big_to_verify(text)
        if too_big:  # (math_verify's parse is slow on these, and off the main thread
            # the watchdog cannot stop it)
            return Score(
                0.0,
                True,
                answer[:MAX_ANSWER_CHARS],
                f"{what} not verified: {too_big}",
                unverified=UNVERIFIED_TOO_BIG,
            )
    try:
        if threading.current_thread() is threading.main_thread():
            ok = _verify(answer, ground_truth, timeout_s)
        else:
            ok = call_with_timeout(lambda: _verify(answer, ground_truth, None), 3 * timeout_s)
    except VerifyTimeout as e:
        return Score(0.0, True, answer, f"not verified: {e}", unverified=UNVERIFIED_TIMEOUT)
    except Exception as e:  # noqa: BLE001 - a verifier crash must not stop training.
        return Score(0.0, True, answer, f"math_verify failed: {type(e).__name__}: {e}")
    return Score(1.0 if ok else 0.0, True, answer, None if ok else "not equivalent")
