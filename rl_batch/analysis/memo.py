"""Remembering pure functions of numpy arrays by the arrays' content.

A report's seed bootstrap (`rl_batch.analysis.stability`, 200 resamples) analyses the
same runs again and again, each time through new objects: the resampled `RunData` hold
the same arrays, and the interval functions get new [seeds, fields] arrays of the same
numbers for every level and every finding that asks. `by_content` remembers such a
function by what its arguments hold, never by which objects they are:

- the key is, per argument, an array's dtype, shape and bytes (or a str, int or None with
  its type), so arrays that differ in any bit are different keys, and an array
  changed in place after a call is a new key;
- the function is called on arrays rebuilt from the key alone (``np.frombuffer``:
  C order, the same dtype, read-only), so a result cannot belong to other numbers than
  its key's, and a hit returns exactly what a miss would have computed;
- the cache is least-recently-used and bounded by the bytes its keys hold, so a sweep
  of long runs evicts instead of growing; results must be immutable (floats, tuples,
  frozen dataclasses), since every hit shares one.

An argument that is neither a C-ordered numeric array nor a str, int (bool) or None goes
to the function uncached.
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

_PLAIN = (str, int, type(None))  # floats stay out: 0.0 == -0.0 would share a key
_ENTRY_OVERHEAD = 256  # bytes counted per entry besides its arrays' (tuples, result)


class _Cache:
    """A least-recently-used dict bounded by the bytes of its keys' arrays."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: collections.OrderedDict[tuple, tuple[Any, int]] = collections.OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0
        self.lock = threading.Lock()

    def get(self, key: tuple) -> tuple[bool, Any]:
        with self.lock:
            found = self.entries.get(key)
            if found is None:
                self.misses += 1
                return False, None
            self.entries.move_to_end(key)
            self.hits += 1
            return True, found[0]

    def put(self, key: tuple, value: Any, size: int) -> None:
        if size > self.max_bytes:
            return
        with self.lock:
            if key in self.entries:
                return
            self.entries[key] = (value, size)
            self.bytes += size
            while self.bytes > self.max_bytes:
                _, (_, old) = self.entries.popitem(last=False)
                self.bytes -= old

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.bytes = self.hits = self.misses = 0


def _key(args: tuple) -> tuple | None:
    """The arguments' key: per argument ``("a", dtype, shape, bytes)`` for a C-ordered
    numeric array, ``("v", type, x)`` for a str, int (bool) or None; None when any is
    something else."""
    key = []
    for x in args:
        if isinstance(x, np.ndarray):
            dtype = x.dtype
            if dtype.kind not in "biuf" or not dtype.isnative or not x.flags.c_contiguous:
                return None
            key.append(("a", dtype.str, x.shape, x.tobytes()))
        elif isinstance(x, _PLAIN):
            key.append(("v", type(x), x))
        else:
            return None
    return tuple(key)


def _rebuilt(part: tuple) -> Any:
    if part[0] == "a":
        _, dtype, shape, data = part
        return np.frombuffer(data, dtype=dtype).reshape(shape)
    return part[2]


def by_content(max_bytes: int) -> Callable[[Callable], Callable]:
    """Decorator: remember a pure function of positional array (and plain) arguments by
    their content (module docstring), in at most ``max_bytes`` of key arrays. The
    wrapped function gets ``cache_info()`` (hits, misses, entries, bytes) and
    ``cache_clear()``."""

    def wrap(fn: Callable) -> Callable:
        cache = _Cache(max_bytes)

        @functools.wraps(fn)
        def cached(*args: Any) -> Any:
            key = _key(args)
            if key is None:
                return fn(*args)
            found, value = cache.get(key)
            if found:
                return value
            value = fn(*(_rebuilt(p) for p in key))
            size = _ENTRY_OVERHEAD + sum(len(p[3]) for p in key if p[0] == "a")
            cache.put(key, value, size)
            return value

        def cache_info() -> dict[str, int]:
            return {
                "hits": cache.hits,
                "misses": cache.misses,
                "entries": len(cache.entries),
                "bytes": cache.bytes,
            }

        cached.cache_info = cache_info
        cached.cache_clear = cache.clear
        return cached

    return wrap
