"""Verifiable tasks: synthetic generators, real math data, rewards and evaluation helpers.

``load_split`` (TFDS-backed splits of the synthetic tasks) is imported lazily so that
importing the tasks does not import tensorflow_datasets.
"""

from rl_batch.tasks.base import Example, Score, Task, to_example
from rl_batch.tasks.math_data import MathTask, load_math_file
from rl_batch.tasks.registry import TASKS, get_task, task_kwargs
from rl_batch.tasks.rewards import (
    greedy_accuracy,
    math_score,
    mean_at_k,
    pass_at_k,
    score_responses,
)
from rl_batch.tasks.synthetic import (
    AdditionTask,
    ArithmeticMixTask,
    CountdownTask,
    MultiplicationTask,
)

__all__ = [
    "TASKS",
    "AdditionTask",
    "ArithmeticMixTask",
    "CountdownTask",
    "Example",
    "MathTask",
    "MultiplicationTask",
    "Score",
    "Task",
    "get_task",
    "greedy_accuracy",
    "load_math_file",
    "load_split",
    "math_score",
    "mean_at_k",
    "pass_at_k",
    "score_responses",
    "task_kwargs",
    "to_example",
]


def __getattr__(name):
    if name == "load_split":
        from rl_batch.tasks.tfds_builders import load_split

        return load_split
    raise AttributeError(f"module 'rl_batch.tasks' has no attribute {name!r}")
