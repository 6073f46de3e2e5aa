"""rl_batch.bench: rounds, load record, medians, paired ratios and tables, by hand."""

import math

import pytest

from rl_batch import bench


class FakeClock:
    """Wall and CPU clocks that move only when a timed call says so."""

    def __init__(self):
        self.wall = 100.0
        self.cpu = 7.0
        self.load = 0.5

    def spend(self, wall: float, cpu: float) -> None:
        self.wall += wall
        self.cpu += cpu
        self.load += 0.25  # the load the next call reads


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(bench.time, "perf_counter", lambda: c.wall)
    monkeypatch.setattr(bench.time, "process_time", lambda: c.cpu)
    monkeypatch.setattr(bench.os, "getloadavg", lambda: (c.load, 9.0, 9.0))
    return c


def test_medians_and_paired_ratios_by_hand():
    assert bench.median([3.0, 1.0, 2.0]) == 2.0
    assert bench.median([4.0, 1.0, 3.0, 2.0]) == 2.5  # mean of the middle two
    # Rounds: base 1, 2, 4 and new 0.5, 3, 2 -> ratios 0.5, 1.5, 0.5.
    assert bench.ratio_summary([1.0, 2.0, 4.0], [0.5, 3.0, 2.0]) == (0.5, 0.5, 1.5)
    # Paired by round, not a ratio of medians: medians 2 and 2 would say 1.0.
    assert bench.median([1.0, 2.0, 4.0]) == bench.median([0.5, 3.0, 2.0]) == 2.0
    with pytest.raises(ValueError, match="equal, nonzero length"):
        bench.ratio_summary([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="equal, nonzero length"):
        bench.ratio_summary([], [])


def test_markdown_table_by_hand():
    table = bench.markdown_table(["B", "tok/s"], [[16, "120"], [64, f"{400.0:.0f}"]])
    assert table == "| B | tok/s |\n| --- | --- |\n| 16 | 120 |\n| 64 | 400 |"
    assert bench.markdown_header(["a"]) == "| a |\n| --- |"
    assert bench.markdown_row(["x", 1, 2.5]) == "| x | 1 | 2.5 |"
    with pytest.raises(ValueError, match="has 1 cells, expected 2"):
        bench.markdown_table(["a", "b"], [["only"]])


def test_time_interleaved_rounds_in_order_until_repeats_and_seconds(clock):
    calls = []
    walls = {"ours": 0.25, "theirs": 1.0}

    def make(label):
        def fn(r):
            calls.append((label, r))
            if r >= 0:
                clock.spend(walls[label], walls[label] / 2)

        return fn

    timed = bench.time_interleaved(
        {"ours": make("ours"), "theirs": make("theirs")},
        min_repeats=2,
        min_time_s=3.0,
        warmup=True,
    )
    # Warm-ups (-1), untimed, then rounds of (ours, theirs). Each round spends 1.25 s:
    # 2 rounds give 2.5 s < 3.0, so a third round runs (3.75 s).
    assert calls == [("ours", -1), ("theirs", -1)] + [
        (label, r) for r in range(3) for label in ("ours", "theirs")
    ]
    assert timed["ours"].time_s == [0.25] * 3 and timed["theirs"].time_s == [1.0] * 3
    assert timed["ours"].cpu_s == [0.125] * 3 and timed["theirs"].median_cpu_s == 0.5
    # The load read before each call: 0.5, then +0.25 after every timed call.
    assert timed["ours"].load1 == [0.5, 1.0, 1.5]
    assert timed["theirs"].load1 == [0.75, 1.25, 1.75]
    assert timed["theirs"].median_load1 == 1.25 and timed["ours"].repeats == 3


def test_time_calls_stops_at_the_later_of_repeats_and_seconds(clock):
    seen = []

    def fn(i):
        seen.append(i)
        clock.spend(0.5, 0.5)

    # min_time_s dominates: 0.5 s per call, 2 s needs 4 calls (min_repeats 1).
    timed = bench.time_calls(fn, min_repeats=1, min_time_s=2.0)
    assert seen == [-1, 0, 1, 2, 3] and timed.repeats == 4 and timed.median_s == 0.5
    # min_repeats dominates, no warm-up.
    seen.clear()
    timed = bench.time_calls(fn, min_repeats=3, min_time_s=0.0, warmup=False)
    assert seen == [0, 1, 2] and timed.repeats == 3


def test_load_is_nan_where_the_os_has_none(monkeypatch):
    def no_load():
        raise OSError("no load average")

    monkeypatch.setattr(bench.os, "getloadavg", no_load)
    assert math.isnan(bench.load_1min())
