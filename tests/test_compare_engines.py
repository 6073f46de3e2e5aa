"""experiments.compare_engines: per-round ratios of two engines' step times, by hand."""

from experiments import compare_engines


def test_ratio_rows_pair_the_engines_round_by_round():
    record = {
        "configs": {
            "8x8:sqrt": {"step_s": [1.0, 2.0, 4.0], "generate_s": [0.5, 0.5, 1.0]},
            "8x8:sqrt@continuous": {
                "step_s": [0.5, 3.0, 2.0],
                "generate_s": [0.25, 0.5, 0.25],
                "engine": "continuous",
                "slots": 16,
            },
        }
    }
    (row,) = compare_engines.ratio_rows(record, ["8x8:sqrt"], "@continuous")
    assert row["engine"] == "continuous 16 slots"
    # Step: round ratios 0.5, 1.5, 0.5 (median 0.5), medians 2.0 and 2.0. Generation:
    # ratios 0.5, 1.0, 0.25, medians 0.5 and 0.25.
    assert row["step_s"] == (2.0, 2.0) and row["step_s_ratio"] == (0.5, 0.5, 1.5)
    assert row["generate_s_ratio"] == (0.5, 0.25, 1.0)
    table = compare_engines.format_rows([row], "static")
    assert (
        "| 8x8:sqrt | 2.000 | 2.000 | 0.50 [0.50, 1.50] | 0.500 | 0.250 | 0.50 [0.25, 1.00] |"
        in table
    )
