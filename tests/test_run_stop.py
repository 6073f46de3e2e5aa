"""A finished run stays finished on resume; a damaged checkpoint is rewritten once redone.

A run that stopped at its confirmed target (or spent its budget) records why in its
checkpoint's counters; resuming it with the same config, or after its summary.json was
lost or damaged (what a sweep rerun does), trains nothing. Only a setting of
``config.RESUME_ALLOWED`` extends it.
"""

import json
import os

import pytest

from rl_batch import artifacts
from rl_batch.runs import retention
from rl_batch.runs import run as run_lib
from rl_batch.runs.accounting import STOP_TARGET, Counters, restored_counters
from rl_batch.runs.checkpoint import Checkpointer
from tests.run_fixtures import TIMING, assert_same_records, deterministic, tiny_run_config

# Whole training runs, stopped and resumed: the slow tier (-m slow).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


def _target_config(work_dir, run_dir, **changes):
    # The exact p(reference) of a random model is tiny but > 0: a target of 1e-12 is
    # confirmed at the first validation after the start (step 2, 32 responses).
    fields = dict(
        budget_responses=128, stop_at_target=True, confirm_evals=1, target=1e-12,
        eval_metric="p_ref", checkpoint_every=1,
    )  # fmt: skip
    return tiny_run_config(work_dir, run_dir, **{**fields, **changes})


def _untimed(summary):
    return {k: v for k, v in summary.items() if not any(t in k for t in TIMING)}


def test_a_run_stopped_at_its_target_stays_stopped(work_dir, tmp_path):
    run_dir = str(tmp_path / "run")
    first = run_lib.run(_target_config(work_dir, run_dir), progress=False)
    assert (first["status"], first["steps"]) == ("finished", 2)
    metrics_path = os.path.join(run_dir, artifacts.METRICS_FILE)
    summary_path = os.path.join(run_dir, artifacts.SUMMARY_FILE)
    metrics = open(metrics_path).read()
    ckpt = Checkpointer(os.path.join(run_dir, artifacts.CHECKPOINT_DIR))
    assert ckpt.all_steps()[-1] == 2
    # Resumed as is, twice; after summary.json was lost; after it was damaged.
    for damage in ("none", "none", "removed", "corrupt"):
        if damage == "removed":
            os.remove(summary_path)
        elif damage == "corrupt":
            open(summary_path, "w").write('{"status": "fini')
        again = run_lib.run(_target_config(work_dir, run_dir), progress=False)
        assert open(metrics_path).read() == metrics, damage  # not one line more
        assert _untimed(again) == _untimed(first), damage
        assert ckpt.all_steps()[-1] == 2
    # A longer budget does not extend a run that stopped at its target...
    longer = run_lib.run(_target_config(work_dir, run_dir, budget_responses=256), progress=False)
    assert longer["steps"] == 2 and open(metrics_path).read() == metrics
    # ...no longer stopping there does (an allowed change): to the budget.
    on = run_lib.run(_target_config(work_dir, run_dir, stop_at_target=False), progress=False)
    assert (on["stopped"], on["steps"], on["responses_cum"]) == ("budget", 8, 128)
    evals = [r["responses_cum"] for r in artifacts.read_metrics(run_dir, "eval")]
    assert evals == [0, 32, 64, 96, 128]
    assert first["stopped"] == STOP_TARGET  # (summary.json says why, as the checkpoint does)


def test_a_run_that_spent_its_budget_is_extended_only_by_a_larger_one(work_dir, tmp_path):
    run_dir = str(tmp_path / "run")
    first = run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=48), progress=False)
    assert (first["stopped"], first["steps"]) == ("budget", 3)
    again = run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=48), progress=False)
    assert _untimed(again) == _untimed(first)
    longer = run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=64), progress=False)
    assert (longer["stopped"], longer["steps"]) == ("budget", 4)


def test_checkpoints_from_before_the_stop_field_read_a_confirmed_target_as_stopped():
    c = tiny_run_config("/tmp/unused", stop_at_target=True, confirm_evals=2)
    old = {k: v for k, v in vars(Counters(step=5, evals_at_target=2)).items() if k != "stopped"}
    assert restored_counters(c, old).stopped == STOP_TARGET
    assert restored_counters(c, {**old, "evals_at_target": 1}).stopped == ""
    assert restored_counters(c, {**old, "stopped": ""}).stopped == ""  # a new checkpoint
    c.stop_at_target = False
    assert restored_counters(c, old).stopped == ""


def test_a_damaged_latest_checkpoint_is_rewritten_when_the_run_redoes_it(
    work_dir, tmp_path, caplog
):
    run_dir = str(tmp_path / "run")
    config = tiny_run_config(work_dir, run_dir, budget_responses=64)  # steps 2 and 4 saved
    run_lib.run(config, progress=False)
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    assert Checkpointer(ckpt_dir).all_steps() == [2, 4]
    metrics = artifacts.read_metrics(run_dir)
    (open(os.path.join(ckpt_dir, "4", "meta", "metadata"), "w")).write("{garbage")
    with caplog.at_level("WARNING"):
        summary = run_lib.run(config, progress=False)  # falls back to 2, redoes 3 and 4
    assert "falling back to step 2" in caplog.text
    assert summary["steps"] == 4
    saved = json.load(open(os.path.join(ckpt_dir, "4", "meta", "metadata")))
    assert saved["counters"]["step"] == 4  # step 4 written again, whole
    caplog.clear()
    with caplog.at_level("WARNING"):
        run_lib.run(config, progress=False)
    assert "falling back" not in caplog.text and "cannot be read" not in caplog.text
    redone = artifacts.read_metrics(run_dir)
    assert [(r["kind"], r["step"]) for r in redone] == [(r["kind"], r["step"]) for r in metrics]


def test_a_run_whose_checkpoints_were_removed_at_its_target_resumes_as_if_kept(
    work_dir, tmp_path, caplog
):
    # sweep.keep_checkpoints="extendable" removes every step of a run stopped at its
    # target. Resumed, it stays stopped (nothing trained, its summary rebuilt); extended,
    # it trains again from step 0 with one warning and ends exactly where the run that
    # kept its checkpoints ends when extended the same way.
    kept_dir, run_dir = str(tmp_path / "kept"), str(tmp_path / "run")
    for d in (kept_dir, run_dir):
        first = run_lib.run(_target_config(work_dir, d), progress=False)
    assert (first["status"], first["steps"]) == ("finished", 2)
    note = retention.prune_finished(run_dir, "extendable")
    assert note == "checkpoints removed (steps 1, 2; sweep.keep_checkpoints=extendable)"
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    assert retention.saved_steps(ckpt_dir) == []
    metrics_path = os.path.join(run_dir, artifacts.METRICS_FILE)
    summary_path = os.path.join(run_dir, artifacts.SUMMARY_FILE)
    metrics = open(metrics_path).read()
    for damage in ("none", "summary removed", "metrics cut"):
        if damage == "summary removed":
            os.remove(summary_path)
        elif damage == "metrics cut":  # (rebuilt from the copy removed.json keeps)
            open(metrics_path, "w").write(metrics.splitlines(keepends=True)[0])
        again = run_lib.run(_target_config(work_dir, run_dir), progress=False)
        assert _untimed(again) == _untimed(first), damage
        assert open(metrics_path).read() == metrics, damage
        assert retention.saved_steps(ckpt_dir) == [], damage  # nothing trained or saved
    longer = run_lib.run(_target_config(work_dir, run_dir, budget_responses=256), progress=False)
    assert longer["steps"] == 2 and open(metrics_path).read() == metrics
    # Extended: from step 0, said in one line, the same as resuming the kept checkpoint.
    caplog.clear()
    with caplog.at_level("WARNING"):
        on = run_lib.run(_target_config(work_dir, run_dir, stop_at_target=False), progress=False)
    # Ours only: orbax may add its own (a slow previous save on a loaded host).
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and r.name.startswith("rl_batch")
    ]
    assert warnings == [
        f"{run_dir}: its checkpoints were removed when it finished (step 2, "
        "sweep.keep_checkpoints=extendable); this config trains it further: it trains "
        "again from step 0 (the same seed redoes the same steps, re-timed)"
    ]
    kept = run_lib.run(_target_config(work_dir, kept_dir, stop_at_target=False), progress=False)
    assert (on["stopped"], on["steps"], on["responses_cum"]) == ("budget", 8, 128)
    untimed = [{k: v for k, v in _untimed(x).items() if k != "q"} for x in (on, kept)]
    assert untimed[0] == untimed[1]  # (q: responses per second)
    assert_same_records(
        deterministic(artifacts.read_metrics(run_dir)),
        deterministic(artifacts.read_metrics(kept_dir)),
        rel=1e-6,
        abs=1e-7,
    )
    assert not os.path.exists(retention.removed_path(run_dir))


def test_a_run_pruned_at_its_target_by_itself_leaves_what_the_sweeps_prune_leaves(
    work_dir, tmp_path
):
    # io.prune_at_target (what a sweep sets under "extendable"): no final save, the
    # marker the sweep's prune would write for the twin that saved, its earlier steps gone.
    twin_dir, run_dir = str(tmp_path / "twin"), str(tmp_path / "run")
    twin = run_lib.run(_target_config(work_dir, twin_dir), progress=False)
    retention.prune_finished(twin_dir, "extendable")
    first = run_lib.run(
        _target_config(work_dir, run_dir, prune_at_target="extendable"), progress=False
    )
    assert (first["stopped"], first["steps"]) == ("target", 2)
    untimed = [{k: v for k, v in _untimed(x).items() if k != "q"} for x in (first, twin)]
    assert untimed[0] == untimed[1]  # (q: responses per second)
    assert retention.saved_steps(os.path.join(run_dir, artifacts.CHECKPOINT_DIR)) == []
    kept_none = "no checkpoint kept (sweep.keep_checkpoints=extendable)"
    assert retention.prune_finished(run_dir, "extendable") == kept_none  # (the sweep's line)
    ours, theirs = (retention.read_removed(d) for d in (run_dir, twin_dir))
    for marker in (ours, theirs):
        marker["counters"] = _untimed(marker["counters"])
        marker["metrics"] = deterministic(marker["metrics"])
    assert ours == theirs and ours["step"] == 2 and ours["policy"] == "extendable"
    metrics = open(os.path.join(run_dir, artifacts.METRICS_FILE)).read()
    again = run_lib.run(  # resumed: nothing trained, as the twin's resume
        _target_config(work_dir, run_dir, prune_at_target="extendable"), progress=False
    )
    assert _untimed(again) == _untimed(first)
    assert open(os.path.join(run_dir, artifacts.METRICS_FILE)).read() == metrics
    # A budget stop keeps its final save under the same setting ("extendable" keeps it).
    budget_dir = str(tmp_path / "budget")
    config = tiny_run_config(work_dir, budget_dir, budget_responses=48)
    config.prune_at_target = "extendable"
    assert run_lib.run(config, progress=False)["stopped"] == "budget"
    assert retention.saved_steps(os.path.join(budget_dir, artifacts.CHECKPOINT_DIR)) == [2, 3]


def test_a_run_that_spent_its_budget_keeps_its_final_step_for_a_larger_one(work_dir, tmp_path):
    run_dir = str(tmp_path / "run")
    first = run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=48), progress=False)
    assert (first["stopped"], first["steps"]) == ("budget", 3)
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    assert retention.saved_steps(ckpt_dir) == [2, 3]
    retention.prune_finished(run_dir, "extendable")
    assert retention.saved_steps(ckpt_dir) == [3]
    longer = run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=64), progress=False)
    assert (longer["stopped"], longer["steps"]) == ("budget", 4)
    updates = [r["step"] for r in artifacts.read_metrics(run_dir, "update")]
    assert updates == [1, 2, 3, 4]
