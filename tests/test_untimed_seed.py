"""One untimed seed makes its configuration untimed: N* and r_N only, never ranked by T."""

import json
import os

from analysis_fixtures import STANDARD_CONFIGS, run_name, write_sweep

from rl_batch.analysis import curves, planner, time_to_target
from rl_batch.artifacts import Configuration


def _untime(run_dir: str) -> None:
    """Drops every timing field of a run's metrics and summary (a run that logged none)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(path, "w") as f:
        for row in rows:
            kept = {k: v for k, v in row.items() if not k.startswith("time_")}
            f.write(json.dumps(kept) + "\n")


def test_a_configuration_with_one_untimed_seed_is_untimed_and_not_ranked(tmp_path):
    sweep_dir = write_sweep(str(tmp_path / "s"), seed_factors=(0.99, 1.0, 1.01))
    ref = Configuration("grpo", *STANDARD_CONFIGS[0][:3])  # 8 x 8 sqrt, the reference
    other = Configuration("grpo", *STANDARD_CONFIGS[1][:3])
    timed = time_to_target.analyze_sweep(curves.load_sweep(sweep_dir))
    assert timed.stats[other].q is not None

    _untime(os.path.join(sweep_dir, "runs", run_name(*STANDARD_CONFIGS[1][:3], 1)))
    analysis = time_to_target.analyze_sweep(curves.load_sweep(sweep_dir))
    s = analysis.stats[other]
    assert s.reached and s.n_star is not None  # N* and r_N stay
    assert s.q is None and s.time_to_target_s is None  # no T over the other seeds alone
    assert analysis.ratios[other].r_n is not None and analysis.ratios[other].r_t is None
    plan = planner.plan_full(analysis)
    row = next(r for r in plan.rows if r.key == other)
    assert "no timing (1/3 seeds untimed)" in row.note
    assert other not in plan.candidates and plan.best != other
    ranked_by_t = [r.key for r in plan.rows if r.r_t is not None]
    assert other not in ranked_by_t and ranked_by_t[0] == plan.best
    assert plan.rows.index(row) >= len(ranked_by_t)  # after every configuration with a T
    assert ref in ranked_by_t
