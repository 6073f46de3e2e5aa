"""Which point a sweep's worker runs next: each configuration compiled by one worker.

A worker process keeps the compiled programs of the configurations it ran
(``sweep.keep_programs``), and every process shares the persistent XLA cache
(``xla_cache``). Handed out in grid order (the seeds of a configuration adjacent), two
workers would start the same configuration together and both compile it; neither finds
the other's programs in the cache, since neither has finished. `PointQueue` instead gives
a worker the next seed of the configuration it is on, and once that configuration has no
seed left to start, the first configuration that no other worker is on. Only when every
configuration left is taken does a worker join one (by then its first worker has
compiled it, so the joiner reads the programs from the cache).

The order changes which process runs a point and when, not what it computes: a run's
result depends on its config and seed alone (kept programs and the cache change no
result, docs/cpu_study.md).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class PointQueue(Generic[T]):
    """Points grouped by configuration, handed to workers with configuration affinity.

    Args:
      points: the points to run, in grid order.
      config_of: a point's configuration (points with equal keys share compiled programs).

    ``next(worker)`` returns a point, or None once every point has been handed out or
    `close` was called. Thread-safe.
    """

    def __init__(self, points: Sequence[T], config_of: Callable[[T], Hashable]):
        self._left: dict[Hashable, collections.deque[T]] = {}
        for point in points:
            self._left.setdefault(config_of(point), collections.deque()).append(point)
        self._on: dict[int, Hashable] = {}  # worker -> the configuration it is on
        self._lock = threading.Lock()
        self._closed = False

    def next(self, worker: int) -> T | None:
        """The next point for ``worker`` (see the module doc), or None when done."""
        with self._lock:
            if self._closed:
                return None
            config = self._on.get(worker)
            if config is None or not self._left[config]:
                config = self._choose(worker)
                if config is None:
                    return None
                self._on[worker] = config
            return self._left[config].popleft()

    def _choose(self, worker: int) -> Hashable | None:
        """The first configuration with points left that no other worker is on; else the
        one with the most points left (None: nothing left)."""
        taken = {c for w, c in self._on.items() if w != worker}
        left = [c for c, points in self._left.items() if points]
        free = [c for c in left if c not in taken]
        if free:
            return free[0]
        return max(left, key=lambda c: len(self._left[c]), default=None)

    def close(self) -> None:
        """Hands out nothing more (the points not yet handed out are not run)."""
        with self._lock:
            self._closed = True
