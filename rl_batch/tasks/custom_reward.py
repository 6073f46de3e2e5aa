"""A user's own reward on any task: ``task.reward_fn = "module:function"``.

The function replaces the task's verifier (its examples, prompts and warm start stay)::

    def my_reward(prompt: str, response: str, answer: str, meta: dict) -> float: ...

``answer`` is the example's reference (the complete response for synthetic tasks, the
final answer for math data) and ``meta`` its extras. A function marked `batched` scores
a whole rollout in one call instead (e.g. a reward model, or a remote verifier)::

    @batched
    def my_rewards(prompts, responses, answers, metas) -> list[float]: ...

with one entry per response (prompts repeated G times, in group order).

The spec is ``package.module:name`` (importable from ``PYTHONPATH``) or
``path/to/file.py:name``; it is loaded when the config is resolved, so a missing module
or name fails before any compute, in one line. The reward is any finite float: GRPO
normalises it within each group, and evaluation reports its mean (``eval_accuracy`` is
then the mean reward, not a pass rate).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rl_batch.tasks.base import Example, Score, Task, to_example

RewardFn = Callable[[str, str, str, Mapping[str, Any]], float]


def batched(fn: Callable) -> Callable:
    """Marks ``fn(prompts, responses, answers, metas) -> list[float]`` as a batched reward
    (one call per rollout; see the module doc)."""
    fn.rl_batch_batched = True
    return fn


def is_batched(fn: Callable) -> bool:
    """Whether ``fn`` was marked with `batched`."""
    return bool(getattr(fn, "rl_batch_batched", False))


def load_object(spec: str, field: str, kind: str = "function") -> Any:
    """The object named by ``spec`` (``module:name`` or ``file.py:name``), for the config
    field ``field`` (``task.reward_fn``, ``task.name``); ``kind`` names what is expected.

    Raises:
      ValueError: one line naming the field, the spec and what is wrong with it.
    """
    where = f"{field}={spec!r}"
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{where}: expected 'package.module:{kind}' or 'file.py:{kind}'")
    try:
        if module_name.endswith(".py"):
            if not os.path.isfile(module_name):
                raise ValueError(f"{where}: no such file {module_name!r}")
            unique = "rl_batch_user_" + os.path.basename(module_name)[:-3]
            loader = importlib.util.spec_from_file_location(unique, module_name)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{where}: cannot import {module_name!r} ({e})") from None
    obj = getattr(module, attr, None)
    if not callable(obj):
        raise ValueError(f"{where}: {module_name!r} has no {kind} {attr!r}")
    return obj


def load_reward_fn(spec: str) -> RewardFn:
    """The reward function named by ``spec`` (``module:name`` or ``file.py:name``).

    Raises:
      ValueError: one line naming the spec and what is wrong with it.
    """
    return load_object(spec, "task.reward_fn")


class WithReward:
    """``task`` with its verifier replaced by a user's reward function (see the module
    doc); every other attribute is the task's."""

    may_skip_verification = False  # the user's function scores every response

    def __init__(self, task: Task, spec: str):
        self.task, self.spec, self.reward_fn = task, spec, load_reward_fn(spec)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.task, name)

    def score(self, example: Example | Mapping[str, Any], response: str) -> Score:
        """The user's reward for one response (``format_ok``: it returned a number)."""
        return self.score_batch([example], [response])[0]

    def score_batch(
        self, examples: Sequence[Example | Mapping[str, Any]], responses: Sequence[str]
    ) -> list[Score]:
        """The user's rewards for ``responses[i]`` to ``examples[i]``: one call of a
        `batched` function, else one call per response."""
        exs = [to_example(e) for e in examples]
        if is_batched(self.reward_fn):
            values = list(
                self.reward_fn(
                    [e.prompt for e in exs],
                    list(responses),
                    [e.answer for e in exs],
                    [dict(e.meta) for e in exs],
                )
            )
            if len(values) != len(exs):
                raise ValueError(
                    f"task.reward_fn={self.spec!r} returned {len(values)} rewards for "
                    f"{len(exs)} responses"
                )
        else:
            values = [
                self.reward_fn(e.prompt, r, e.answer, dict(e.meta)) for e, r in zip(exs, responses)
            ]
        return [Score(reward=self._finite(v, e), format_ok=True) for v, e in zip(values, exs)]

    def _finite(self, value: Any, ex: Example) -> float:
        try:
            reward = float(value)
        except (TypeError, ValueError):
            reward = math.nan
        if not math.isfinite(reward):
            raise ValueError(
                f"task.reward_fn={self.spec!r} returned {value!r} (a finite float is needed) "
                f"for the prompt {ex.prompt[:60]!r}"
            )
        return reward

    def reward(self, example: Example | Mapping[str, Any], response: str) -> float:
        return self.score(example, response).reward
