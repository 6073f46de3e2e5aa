"""What a finished run keeps of its checkpoints (``sweep.keep_checkpoints``)."""

import os

import jax.numpy as jnp
import pytest

from rl_batch import artifacts
from rl_batch.runs import retention
from rl_batch.runs.checkpoint import Checkpointer


def _finished_run(run_dir, steps, stopped):
    """A run directory whose checkpoints hold ``steps`` (orbax keeps the last two), the
    last one's counters saying why it stopped."""
    ckpt = Checkpointer(os.path.join(run_dir, artifacts.CHECKPOINT_DIR))
    for step in steps:
        counters = {"step": step, "stopped": stopped if step == steps[-1] else ""}
        metrics = [{"kind": "update", "step": s} for s in range(1, step + 1)]
        ckpt.save(step, {"state": {"w": jnp.full(3, float(step))}}, {
            "counters": counters, "metrics": metrics, "rollouts_in_flight": []
        })  # fmt: skip
    kept = ckpt.all_steps()
    ckpt.close()
    return kept


def test_the_plain_file_reading_agrees_with_the_checkpointer(tmp_path):
    run_dir = str(tmp_path / "run")
    assert _finished_run(run_dir, [2, 4, 5], "budget") == [4, 5]  # (max_to_keep=2)
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    os.makedirs(os.path.join(ckpt_dir, "6.orbax-checkpoint-tmp-123"))  # a save cut short
    assert retention.saved_steps(ckpt_dir) == [4, 5]
    meta = retention.read_step_meta(ckpt_dir, 5)
    assert meta["counters"] == {"step": 5, "stopped": "budget"}
    assert [r["step"] for r in meta["metrics"]] == [1, 2, 3, 4, 5]
    assert "checksums" not in meta


@pytest.mark.parametrize(
    "policy, stopped, left, marker",
    [
        ("extendable", "budget", [5], False),  # a larger budget resumes from step 5
        ("extendable", "target", [], True),
        ("none", "budget", [], True),
        ("none", "target", [], True),
        ("all", "target", [4, 5], False),
    ],
)
def test_a_finished_run_keeps_what_the_policy_says(tmp_path, policy, stopped, left, marker):
    run_dir = str(tmp_path / "run")
    _finished_run(run_dir, [2, 4, 5], stopped)
    note = retention.prune_finished(run_dir, policy)
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    ckpt = Checkpointer(ckpt_dir)
    assert ckpt.all_steps() == left
    ckpt.close()
    removed = retention.read_removed(run_dir)
    if not marker:
        assert removed is None
        kept = "checkpoints removed (steps 4, step 5 kept; sweep.keep_checkpoints=extendable)"
        assert note == ("" if policy == "all" else kept)
        return
    assert note == f"checkpoints removed (steps 4, 5; sweep.keep_checkpoints={policy})"
    assert removed["step"] == 5 and removed["policy"] == policy
    assert removed["counters"] == {"step": 5, "stopped": stopped}
    assert [r["step"] for r in removed["metrics"]] == [1, 2, 3, 4, 5]
    # The directory stays (train without --resume still refuses it); pruning again
    # removes nothing and says so.
    assert os.listdir(ckpt_dir) == [retention.REMOVED_FILE]
    again = retention.prune_finished(run_dir, policy)
    assert again == f"no checkpoint kept (sweep.keep_checkpoints={policy})"
    # A step saved since (a run trained again) makes the marker void.
    _finished_run(run_dir, [1], "")
    assert retention.read_removed(run_dir) is None
    retention.clear_removed(run_dir)
    assert not os.path.exists(retention.removed_path(run_dir))


def test_the_budget_stop_is_the_run_loops():
    from rl_batch.runs import accounting

    assert retention.STOP_BUDGET == accounting.STOP_BUDGET


def test_an_unknown_policy_and_a_damaged_marker_are_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^sweep.keep_checkpoints='some': must be one of "
                       "extendable, none, all$"):  # fmt: skip
        retention.check_policy("some")
    run_dir = str(tmp_path / "run")
    os.makedirs(os.path.join(run_dir, artifacts.CHECKPOINT_DIR))
    open(retention.removed_path(run_dir), "w").write('{"step": ')
    with pytest.raises(ValueError, match="malformed JSON.*delete it to train the run again"):
        retention.read_removed(run_dir)


def test_a_run_whose_final_step_is_unreadable_keeps_its_checkpoints(tmp_path):
    run_dir = str(tmp_path / "run")
    _finished_run(run_dir, [2, 4], "target")
    ckpt_dir = os.path.join(run_dir, artifacts.CHECKPOINT_DIR)
    open(os.path.join(ckpt_dir, "4", retention.META_FILE), "w").write("{garbage")
    assert retention.prune_finished(run_dir, "none") == ""
    assert retention.saved_steps(ckpt_dir) == [2, 4]
