"""The record comparison the resume and multi-process tests rely on."""

import math

import pytest

from tests.run_fixtures import assert_close, assert_same_records


def test_numbers_compare_within_tolerance_and_other_values_exactly():
    assert_close(
        {"a": 1.0, "s": "x", "n": None, "l": [1, 2.0]},
        {"a": 1.0 + 1e-9, "s": "x", "n": None, "l": [1, 2.0 + 1e-9]},
        rel=1e-6,
        abs=0,
    )
    assert_close(math.nan, math.nan, rel=1e-6, abs=0)
    for x, y in [
        (1.0, 1.1),
        ("x", "y"),
        (True, False),
        (None, 0),
        ([1], [1, 2]),
        ({"a": 1}, {"b": 1}),
    ]:
        with pytest.raises(AssertionError):
            assert_close(x, y, rel=1e-6, abs=1e-7)


def test_a_failing_record_is_named():
    a = [{"kind": "update", "step": 3, "loss": 0.5}]
    with pytest.raises(AssertionError, match="update.*3.*loss"):
        assert_same_records(a, [{"kind": "update", "step": 3, "loss": 0.6}], rel=1e-6, abs=1e-7)
    with pytest.raises(AssertionError):
        assert_same_records(a, a + a, rel=1e-6, abs=1e-7)
