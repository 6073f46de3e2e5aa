"""A user's own reward on any task: ``task.reward_fn = "module:function"``.

The function replaces the task's verifier (its examples, prompts and warm start stay)::

    def my_reward(prompt: str, response: str, answer: str, meta: dict) -> float: ...

``answer`` is the example's reference (the complete response for synthetic tasks, the
final answer for math data) and ``meta`` its extras. The spec is ``package.module:name``
(importable from ``PYTHONPATH``) or ``path/to/file.py:name``; it is loaded when the config
is resolved, so a missing module or name fails before any compute, in one line. The
reward is any finite float: GRPO normalises it within each group, and evaluation reports
its mean (``eval_accuracy`` is then the mean reward, not a pass rate).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from rl_batch.tasks.base import Example, Score, Task, to_example

RewardFn = Callable[[str, str, str, Mapping[str, Any]], float]


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
        ex = to_example(example)
        value = self.reward_fn(ex.prompt, response, ex.answer, dict(ex.meta))
        try:
            reward = float(value)
        except (TypeError, ValueError):
            reward = math.nan
        if not math.isfinite(reward):
            raise ValueError(
                f"task.reward_fn={self.spec!r} returned {value!r} (a finite float is needed) "
                f"for the prompt {ex.prompt[:60]!r}"
            )
        return Score(reward=reward, format_ok=True)

    def reward(self, example: Example | Mapping[str, Any], response: str) -> float:
        return self.score(example, response).reward
