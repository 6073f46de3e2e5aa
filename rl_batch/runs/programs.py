"""A configuration's compiled programs, kept across the runs of one process.

A sweep worker (``sweep.reuse_workers``) runs one grid point after another, most of them
seeds of a configuration it has run before. Each run builds a learner, a sampler and a
validation scorer, and tracing and compiling their jitted functions (or loading them
from the persistent XLA cache) is paid again by every run: ~2 s of a ~14 s run of the
default CPU study when one process runs two seeds back to back. ``keep(n)`` keeps the
last ``n`` configurations' objects, and a run whose config differs from a kept one only
in fields that enter no program (``PER_RUN_FIELDS``; for GRPO also the seed) reuses
them, already compiled.

Off (``keep(0)``) unless a process turns it on: the sweep's workers do; a test that
patches a learner or sampler function gets fresh objects.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from ml_collections import ConfigDict

# Config fields that name or place a run and enter none of its programs.
PER_RUN_FIELDS = ("name", "run_dir")


class Programs(NamedTuple):
    """What a run builds and compiles before its first step."""

    algo: Any  # learner.Algorithm: its jitted update_fn
    sampler: Any  # sampler.Sampler: jitted prefill and decode per shape bucket
    scorer: Any  # exact_eval.ReferenceScorer with eval_metric="p_ref", else None


_kept: collections.OrderedDict[str, Programs] = collections.OrderedDict()
_capacity = 0


def keep(n: int) -> None:
    """Keeps the programs of the last ``n`` configurations this process ran (0: none)."""
    global _capacity
    _capacity = max(int(n), 0)
    while len(_kept) > _capacity:
        _kept.popitem(last=False)


def key(c: ConfigDict) -> str:
    """The part of a resolved run config that decides its programs: all of it but the
    per-run fields and, for GRPO, the seed (every rng is an argument of the jitted
    functions; PPO's ``init_state`` draws the critic from ``config.seed``)."""
    fields = c.to_dict()
    for name in PER_RUN_FIELDS:
        fields.pop(name, None)
    if fields.get("algo") != "ppo":
        fields.pop("seed", None)
    return json.dumps(fields, sort_keys=True, default=str)


def get(c: ConfigDict, build: Callable[[], Programs]) -> Programs:
    """The kept programs of ``c``'s configuration, else ``build()`` (kept when on)."""
    if _capacity == 0:
        return build()
    k = key(c)
    if k in _kept:
        _kept.move_to_end(k)
        return _kept[k]
    programs = build()
    _kept[k] = programs
    while len(_kept) > _capacity:
        _kept.popitem(last=False)
    return programs
