"""A user's own task class: ``task.name = "package.module:TaskClass"``.

The spec is loaded like ``task.reward_fn`` (``package.module:TaskClass`` importable from
``PYTHONPATH``, or ``path/to/file.py:TaskClass``) and built as ``TaskClass(**task.kwargs)``
when the config is resolved, so a missing module, class or knob fails before any
compute, in one line. The contract is the synthetic tasks' (`rl_batch.tasks.base.Task`)::

    class MyTask:
        max_prompt_len: int    # longest prompt, in characters (BOS not included)
        max_response_len: int  # longest reference response, in characters (EOS not included)
        def make_example(self, rng: np.random.Generator) -> Example: ...
        def score(self, example, response: str) -> Score: ...

and a plug-in task runs as they do: its ``task.n_validation`` then ``task.n_train``
examples are drawn in memory from ``make_example`` (seeded by ``task.split_seed``;
validation prompts distinct, and none of them in training), prompts and responses are
tokenized by the character tokenizer (`rl_batch.tokenizers.CharTokenizer`), and the
policy warm-starts from ``init.source`` as for the synthetic tasks. Tasks over files of
real text are ``task.name = "math"`` with ``task.train_file`` (and a ``task.reward_fn``
for a reward of one's own).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rl_batch.tasks.base import Example
from rl_batch.tasks.custom_reward import load_object

REQUIRED = ("make_example", "score", "max_prompt_len", "max_response_len")


def is_plugin(name: str) -> bool:
    """Whether ``task.name`` names a user's task class (``module:Class``)."""
    return ":" in name


def target_hint(
    task_name: str, summary: dict[str, Any], target: float, band_lo: float | None
) -> str | None:
    """One line for a run of a user's task class that did not reach its target: the
    target and band it inherited were set for the shipped addition task, so it names the
    flags that set the task's own (None for a run that reached it, or of a shipped task).

    Args:
      summary: the run's ``summary.json`` (``reached``, ``final_eval_accuracy``).
    """
    if summary.get("reached") or not is_plugin(task_name):
        return None
    band = "" if band_lo is None else f" (band from {band_lo})"
    final = summary.get("final_eval_accuracy")
    return (
        f"hint: the target {target}{band} is the default config's, set for the addition "
        "task; set one for your task with --config.target=... and --config.target_band_lo=..."
        + ("" if final is None else f" (this run ended at accuracy {final:.3g})")
    )


def make_plugin_task(spec: str, kwargs: dict[str, Any]):
    """``Class(**kwargs)`` for ``spec`` (see the module doc).

    Raises:
      ValueError: one line naming ``task.name`` or ``task.kwargs`` and the problem.
    """
    cls = load_object(spec, "task.name", kind="TaskClass")
    where = f"task.name={spec!r}"
    try:
        task = cls(**kwargs)
    except TypeError as e:
        raise ValueError(f"{where}: task.kwargs={kwargs!r} do not build it ({e})") from None
    missing = [m for m in REQUIRED if not hasattr(task, m)]
    if missing:
        raise ValueError(f"{where}: the task lacks {missing} (a task has {list(REQUIRED)})")
    return task


def draw_splits(task, seed: int, sizes: dict[str, int], name: str) -> dict[str, list[Example]]:
    """Splits drawn from ``task.make_example`` in the order of ``sizes``; every split but
    ``train`` has prompts distinct and unused by the splits before it.

    Raises:
      ValueError: when the task has too few distinct prompts for the evaluation splits.
    """
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    splits: dict[str, list[Example]] = {}
    for split, n in sizes.items():
        distinct = split != "train"
        examples: list[Example] = []
        tries = 0
        while len(examples) < n:
            tries += 1
            if tries > 50 * n + 1000:
                raise ValueError(
                    f"{name}: found only {len(examples)} of {n} {split} prompts not "
                    f"used by earlier splits; the task has too few distinct prompts"
                )
            ex = task.make_example(rng)
            if ex.prompt in seen:
                continue
            if distinct:
                seen.add(ex.prompt)
            examples.append(ex)
        splits[split] = examples
    return splits


class ExampleList(Sequence):
    """Example dicts in memory, with `get_batch` like a TFDS `SplitSource`."""

    def __init__(self, examples: list[Example]):
        self._items = [ex.to_dict() for ex in examples]

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, key):
        return self._items[key]

    def get_batch(self, indices) -> list[dict[str, Any]]:
        """Items at ``indices``."""
        return [self._items[int(i)] for i in indices]


def plugin_splits(
    task, *, n_train: int, n_validation: int, seed: int, name: str
) -> tuple[ExampleList, ExampleList]:
    """(train, validation) of a plug-in task: ``n_train`` and ``n_validation`` distinct
    examples drawn from ``seed`` (the run's ``task.split_seed``); ``name`` names the task
    in errors (e.g. ``"task.name='my.module:Task'"``)."""
    sizes = {"validation": n_validation, "train": n_train}
    splits = draw_splits(task, seed, sizes, name)
    return ExampleList(splits["train"]), ExampleList(splits["validation"])
