"""The benchmark harness the timing programs share: timed calls, host load, medians, tables.

Every benchmark in ``experiments/`` (``throughput``, ``gpu_check``, ``tunix_compare``,
``compare_engines``, ``compile_cost``) measures the same way:

- ``time_calls`` calls one function until a number of calls *and* a number of timed
  seconds are reached (after an untimed warm-up call for the jit compile);
  ``time_interleaved`` does the same for several functions in rounds, one call of each
  per round, so that a change in the host's load falls on all of them alike (the
  machines these run on are shared). Both return ``Timings``: per call, the wall seconds,
  the process CPU seconds (all threads; less sensitive than wall time to other processes
  on the cores) and the host's 1-minute load read just before the call (``load_1min``).
- ``median`` and ``ratio_summary`` (per-round ratios of two interleaved series: median,
  min, max) reduce them; a median is what a table reports, never a mean (one slow call
  on a shared host moves a mean, not a median).
- ``markdown_table`` (or ``markdown_header`` then ``markdown_row`` per line, to print
  rows as they are measured) formats the result; the caller formats each cell.

A top-level module (docs/design.md, layering): standard library only, so a benchmark at
any layer (a CLI in ``experiments/``, the calibration in ``rl_batch.sweeps``) can use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence


def load_1min() -> float:
    """The host's 1-minute load average (``/proc/loadavg``'s first field on Linux; NaN
    where the OS reports none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


@dataclasses.dataclass
class Timings:
    """The timed calls of one function, one entry per call, in call order.

    Attributes:
      time_s: wall seconds.
      cpu_s: process CPU seconds (all threads).
      load1: the host's 1-minute load average read just before the call.
    """

    time_s: list[float] = dataclasses.field(default_factory=list)
    cpu_s: list[float] = dataclasses.field(default_factory=list)
    load1: list[float] = dataclasses.field(default_factory=list)

    @property
    def repeats(self) -> int:
        return len(self.time_s)

    @property
    def median_s(self) -> float:
        return median(self.time_s)

    @property
    def median_cpu_s(self) -> float:
        return median(self.cpu_s)

    @property
    def median_load1(self) -> float:
        return median(self.load1)

    def record(self, fn: Callable[[], object]) -> object:
        """Calls ``fn()`` once, timed, and appends its wall and CPU seconds and the load
        read before it. Returns what ``fn`` returned."""
        self.load1.append(load_1min())
        start, cpu_start = time.perf_counter(), time.process_time()
        out = fn()
        self.time_s.append(time.perf_counter() - start)
        self.cpu_s.append(time.process_time() - cpu_start)
        return out


def time_calls(
    fn: Callable[[int], object], *, min_repeats: int, min_time_s: float, warmup: bool = True
) -> Timings:
    """Calls ``fn(i)`` (i = 0, 1, ...) until ``min_repeats`` calls and ``min_time_s``
    timed seconds are reached.

    With ``warmup``, ``fn(-1)`` runs first, untimed (jit compile, first allocations).
    """
    return time_interleaved(
        {"": fn}, min_repeats=min_repeats, min_time_s=min_time_s, warmup=warmup
    )[""]


# jax.monitoring's duration events of a jit compile: tracing, lowering, XLA's compile.
_COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
)


@contextlib.contextmanager
def compile_seconds():
    """Sums the seconds JAX spends compiling (tracing, lowering, XLA's backend compile)
    inside the block, from ``jax.monitoring``'s duration events: a dict whose ``"s"`` is
    the total once the block ends. A program found in the compilation cache adds 0."""
    import jax  # (here: the rest of this module runs without JAX)

    total = {"s": 0.0}

    def listen(event: str, duration_s: float, **_) -> None:
        if event in _COMPILE_EVENTS:
            total["s"] += duration_s

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield total
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)


def time_interleaved(
    calls: dict[str, Callable[[int], object]],
    *,
    min_repeats: int,
    min_time_s: float,
    warmup: bool = False,
) -> dict[str, Timings]:
    """Rounds of one call of each of ``calls``, in order, until ``min_repeats`` rounds
    and ``min_time_s`` seconds (the timed calls' wall seconds, summed over all of them).

    Round ``r`` calls ``fn(r)``. With ``warmup``, each ``fn(-1)`` runs first, untimed.

    Returns:
      label -> ``Timings`` with one entry per round.
    """
    if warmup:
        for fn in calls.values():
            fn(-1)
    out = {label: Timings() for label in calls}
    rounds, spent = 0, 0.0
    while rounds < min_repeats or spent < min_time_s:
        for label, fn in calls.items():
            out[label].record(lambda fn=fn, r=rounds: fn(r))
            spent += out[label].time_s[-1]
        rounds += 1
    return out


def median(values: Sequence[float]) -> float:
    """The median (the mean of the middle two of an even count)."""
    return statistics.median(values)


def ratio_summary(base: Sequence[float], new: Sequence[float]) -> tuple[float, float, float]:
    """(median, min, max) of the per-round ratios ``new[r] / base[r]`` of two series timed
    in the same rounds: pairing by round cancels the load both saw in that round.

    Raises:
      ValueError: the series differ in length or are empty.
    """
    if len(base) != len(new) or not base:
        raise ValueError(f"paired series need one equal, nonzero length: {len(base)}, {len(new)}")
    ratios = [b / a for a, b in zip(base, new)]
    return median(ratios), min(ratios), max(ratios)


def markdown_row(cells: Sequence[object]) -> str:
    """``| a | b | c |``: one table line (each cell as ``str``; format numbers first)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def markdown_header(columns: Sequence[str]) -> str:
    """The header line and the rule line (``| --- | --- |``) of a markdown table."""
    return markdown_row(columns) + "\n" + markdown_row(["---"] * len(columns))


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table: ``columns`` as the header, one line per row of cells.

    Raises:
      ValueError: a row has another number of cells than there are columns.
    """
    for row in rows:
        if len(row) != len(columns):
            raise ValueError(f"row {list(row)} has {len(row)} cells, expected {len(columns)}")
    return "\n".join([markdown_header(columns)] + [markdown_row(row) for row in rows])
