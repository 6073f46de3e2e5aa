"""Edge optima: the plan and the report flag them; `next_edge_points` extends past them."""

import analysis_fixtures as fx
import pytest

from rl_batch import artifacts
from rl_batch.analysis import curves, edges, extension, findings, planner, report
from rl_batch.analysis import time_to_target as ttt

SMALLER_WORDS = "at the edge of the grid: a smaller batch was not tried"
LARGER_WORDS = "at the edge of the grid: a larger batch was not tried"


def _analysis(tmp_path, configs, reference):
    sweep_dir = fx.write_sweep(str(tmp_path), configs=configs, reference=reference)
    return ttt.analyze_sweep(curves.load_sweep(sweep_dir), n_boot=100)


def test_interior_optimum_is_not_flagged(tmp_path):
    a = _analysis(tmp_path, fx.STANDARD_CONFIGS, "P8_G8_sqrt_s0")
    plan = planner.plan_full(a)
    assert plan.best == artifacts.Configuration("grpo", 32, 8, "sqrt") and plan.edge == ""
    assert "edge of the grid" not in planner.format_plan_table(plan)
    ext = extension.next_edge_points(a)
    assert ext.stop and "interior" in ext.reason


# r_N 1.05, 1.6, 2.5 at B = 256, 512, 1024 against r_q ~1.1, 1.05: B = 256 is fastest.
LEFT_EDGE = ((32, 8, "sqrt", 1.05), (64, 8, "sqrt", 1.6), (128, 8, "sqrt", 2.5))


def test_smallest_batch_best_is_flagged_and_extended_down(tmp_path):
    a = _analysis(tmp_path, LEFT_EDGE, "P32_G8_sqrt_s0")
    plan = planner.plan_full(a)
    assert plan.best == artifacts.Configuration("grpo", 32, 8, "sqrt")
    assert SMALLER_WORDS in plan.edge
    table = planner.format_plan_table(plan)
    assert SMALLER_WORDS in table
    assert planner.plan_to_json(plan)["edge"] == plan.edge
    text = report.build_report(a, resamples=0)
    assert SMALLER_WORDS in text
    u = findings.u_shape_finding(a, 0.1)
    assert SMALLER_WORDS in u.note
    ext = extension.next_edge_points(a)
    # The grid's factor is 64 / 32 = 2: P = 32 / 2 at G = 8, the same LR rule.
    assert ext.points == ("16x8:sqrt",) and ext.side == edges.SMALLER
    assert SMALLER_WORDS in ext.reason
    # The limits: rounds done, and a batch bound only on the larger side.
    stop = extension.next_edge_points(a, rounds_done=2, max_rounds=2)
    assert stop.stop and "limit: 2 extension round(s)" in stop.reason
    assert extension.next_edge_points(a, max_batch=64).points == ("16x8:sqrt",)


def test_largest_batch_best_is_extended_up_and_bounded(tmp_path):
    configs = ((8, 8, "sqrt", 1.0), (16, 8, "sqrt", 1.0), (32, 8, "sqrt", 1.05))
    a = _analysis(tmp_path, configs, "P8_G8_sqrt_s0")
    plan = planner.plan_full(a)
    assert plan.best.batch == 256 and LARGER_WORDS in plan.edge
    assert extension.next_edge_points(a).points == ("64x8:sqrt",)
    stop = extension.next_edge_points(a, max_batch=256)
    assert stop.stop and "over the largest batch 256" in stop.reason


def test_at_one_prompt_the_group_shrinks_then_stops(tmp_path):
    configs = ((1, 8, "sqrt", 1.0), (2, 8, "sqrt", 3.0))  # q(16) ~ 1.8 q(8)
    a = _analysis(tmp_path, configs, "P1_G8_sqrt_s0")
    assert extension.next_edge_points(a).points == ("1x4:sqrt",)
    stop = extension.next_edge_points(a, min_group=8)
    assert stop.stop and "P = 1" in stop.reason


def test_non_dividing_factor_stops(tmp_path):
    configs = ((3, 8, "sqrt", 1.0), (6, 8, "sqrt", 3.0))
    a = _analysis(tmp_path, configs, "P3_G8_sqrt_s0")
    stop = extension.next_edge_points(a)
    assert stop.stop and "P = 3 does not divide" in stop.reason


@pytest.mark.parametrize(
    "batches,best,side",
    [((32, 64, 128), 32, "smaller"), ((32, 64, 128), 128, "larger"),
     ((32, 64, 128), 64, None), ((64,), 64, "both")],
)  # fmt: skip
def test_edge_side(batches, best, side):
    keys = [artifacts.Configuration("grpo", b // 8, 8, "sqrt") for b in batches]
    # Another LR rule's smaller batch does not make the sqrt best interior.
    keys.append(artifacts.Configuration("grpo", 1, 8, "fixed"))
    assert edges.edge_side(keys, artifacts.Configuration("grpo", best // 8, 8, "sqrt")) == side


def test_report_lists_the_grid_extension(tmp_path):
    a = _analysis(tmp_path, LEFT_EDGE, "P32_G8_sqrt_s0")
    assert "## Grid extension" not in report.build_report(a, resamples=0)
    ext = {"rounds": [{"points": ["16x8:sqrt"], "reason": "why", "best": "x"}], "stopped": "s"}
    artifacts.write_json_atomic(str(tmp_path / extension.EXTENSIONS_FILE), ext)
    text = report.build_report(a, resamples=0)
    assert "- round 1: added 16x8:sqrt: why" in text and "- stopped: s" in text


def _keys(*specs):
    return [artifacts.Configuration("grpo", p, g, r, "", v) for p, g, r, v in specs]


def test_ahead_points_are_the_smaller_side_below_every_batch():
    # The default study's grid: the sqrt family P = 2..32 x 8 and two one-batch families.
    keys = _keys(*[(p, 8, "sqrt", "") for p in (2, 4, 8, 16, 32)],
                 (16, 8, "fixed", ""), (8, 16, "sqrt", ""))  # fmt: skip
    # 8 x 16 is of the sqrt family (any split); 8 x 8:fixed (B = 64) is not below B = 16.
    assert extension.ahead_points(keys) == ("1x8:sqrt",)
    # At P = 1 the group halves (not below min_group); a variant's family is not extended.
    keys = _keys((1, 4, "sqrt", ""), (2, 4, "sqrt", ""), (2, 4, "sqrt", "warmup"))
    assert extension.ahead_points(keys) == ("1x2:sqrt",)
    assert extension.ahead_points(keys, min_group=4) == ()


def test_ahead_points_match_what_the_extension_adds(tmp_path):
    a = _analysis(tmp_path, LEFT_EDGE, "P32_G8_sqrt_s0")
    assert extension.ahead_points(list(a.stats)) == extension.next_edge_points(a).points
