"""experiments.eval_cadence: a finished sweep re-read with every k-th evaluation."""

import analysis_fixtures as fx
import numpy as np

from experiments import eval_cadence
from rl_batch.analysis import curves


def test_thin_run_keeps_every_kth_evaluation_and_the_last(tmp_path):
    sweep = curves.load_sweep(fx.write_sweep(str(tmp_path)))
    run = sweep.runs[0]
    n = len(run.eval_responses)
    assert n >= 5
    thin = eval_cadence.thin_run(run, 2)
    want = sorted(set(range(0, n, 2)) | {n - 1})  # by hand: 0, 2, 4, ... and the last
    assert list(thin.eval_responses) == [run.eval_responses[i] for i in want]
    assert list(thin.eval_accuracy) == [run.eval_accuracy[i] for i in want]
    assert [r["responses_cum"] for r in thin.eval_records] == [
        run.eval_records[i]["responses_cum"] for i in want
    ]
    assert np.array_equal(thin.responses, run.responses)  # updates untouched
    assert eval_cadence.thin_run(run, 1).eval_responses.tolist() == run.eval_responses.tolist()


def test_the_table_has_the_full_cadence_as_its_first_row(tmp_path):
    sweep = curves.load_sweep(fx.write_sweep(str(tmp_path)))
    rows = eval_cadence.cadence_table(sweep, [2])
    assert len(rows) == 4
    n = sum(len(r.eval_responses) for r in sweep.runs)
    assert f"| {n} of {n} |" in rows[2] and "| 1.000-1.000 | 1.000-1.000 |" in rows[2]
    kept = sum(len(eval_cadence.thin_run(r, 2).eval_responses) for r in sweep.runs)
    assert f"| {kept} of {n} |" in rows[3] and kept < n


def test_every_below_two_or_not_a_number_is_refused():
    import pytest

    assert eval_cadence.parse_every("2,4") == [2, 4]
    for bad in ("0", "1", "x", ""):
        with pytest.raises(ValueError, match="--every="):
            eval_cadence.parse_every(bad)
