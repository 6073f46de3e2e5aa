"""Task registry: ``get_task(name, **knobs)``."""

from __future__ import annotations

import dataclasses
from typing import Any

from rl_batch.tasks.base import Task
from rl_batch.tasks.math_data import MathTask
from rl_batch.tasks.synthetic import (
    AdditionTask,
    ArithmeticMixTask,
    CountdownTask,
    MultiplicationTask,
)

TASKS: dict[str, type] = {
    "addition": AdditionTask,
    "arithmetic_mix": ArithmeticMixTask,
    "multiplication": MultiplicationTask,
    "countdown": CountdownTask,
    "math": MathTask,
}


def task_kwargs(task: Task) -> dict[str, Any]:
    """The knobs that rebuild ``task`` with `get_task` (``name`` excluded)."""
    return {f.name: getattr(task, f.name) for f in dataclasses.fields(task) if f.init}


def get_task(name: str, **kwargs: Any) -> Task:
    """Builds a registered task.

    Args:
        name: one of `TASKS` (``addition``, ``arithmetic_mix``, ``multiplication``,
            ``countdown``, ``math``).
        **kwargs: the task's knobs, e.g. ``n_digits=3, scratchpad=True``.

    Returns:
        The task.

    Raises:
        ValueError: unknown task name (the message lists the known ones) or unknown knob
            (the message lists the task's knobs).
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    cls = TASKS[name]
    knobs = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(kwargs) - set(knobs))
    if unknown:
        raise ValueError(f"task {name!r} has no option(s) {unknown}; its options are {knobs}")
    return cls(**kwargs)
