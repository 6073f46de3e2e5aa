"""``eval_sampled_every``: a p_ref run takes the sampled mean@k at every k-th validation.

p_ref (what N* is on) is in every eval line and equal to a run that samples at every
validation; the sampled fields are in lines 0, k, 2k, ... and equal there; training does
not change; a resumed run keeps counting validations where it stopped.
"""

import pytest

from rl_batch import artifacts
from rl_batch.runs import run as run_lib
from tests.run_fixtures import deterministic, tiny_run_config

SAMPLED = ("eval_mean_at_k", "eval_pass_at_k", "eval_k", "eval_response_len")


def _config(work_dir, run_dir, **changes):
    fields = dict(budget_responses=128, eval_every_responses=16, eval_metric="p_ref")
    return tiny_run_config(work_dir, run_dir, **{**fields, **changes})


pytestmark = pytest.mark.slow  # whole training runs


def test_sampled_metrics_every_third_validation_and_nothing_else_changes(tmp_path):
    work_dir = str(tmp_path / "work")
    every_dir, third_dir, resumed_dir = (str(tmp_path / n) for n in ("every", "third", "res"))
    run_lib.run(_config(work_dir, every_dir), progress=False)
    run_lib.run(_config(work_dir, third_dir, eval_sampled_every=3), progress=False)
    # Stopped by its budget after 4 of its 9 validations, then extended (an allowed change).
    run_lib.run(_config(work_dir, resumed_dir, eval_sampled_every=3, budget_responses=48),
                progress=False)  # fmt: skip
    run_lib.run(_config(work_dir, resumed_dir, eval_sampled_every=3), progress=False)

    every = deterministic(artifacts.read_metrics(every_dir, "eval"))
    third = deterministic(artifacts.read_metrics(third_dir, "eval"))
    assert len(every) == len(third) == 9
    for i, (a, b) in enumerate(zip(every, third)):
        if i % 3 == 0:
            assert b == a, i
        else:
            assert not any(k in b for k in SAMPLED), i
            assert {"eval_p_ref", "eval_ref_logp", "eval_accuracy"} <= b.keys(), i
            assert b == {k: a[k] for k in b}, i
    assert deterministic(artifacts.read_metrics(third_dir, "train")) == deterministic(
        artifacts.read_metrics(every_dir, "train")
    )
    assert deterministic(artifacts.read_metrics(resumed_dir)) == deterministic(
        artifacts.read_metrics(third_dir)
    )
