"""Asynchronous rollout: a stopped or crashed run resumes into the uninterrupted one.

The batches in flight at a checkpoint were generated from older params than the
checkpoint holds; the resumed run must train on those very batches (same prompts,
samples and staleness), then go on drawing the same prompts with the same rng.
"""

import json

import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.rollout import groups as rollout_lib
from rl_batch.rollout.sampler import SampleOutput
from rl_batch.runs import run as run_lib
from tests.run_fixtures import assert_same_records, deterministic, tiny_run_config

# Whole training runs, stopped and resumed: the slow tier (-m slow).
pytestmark = pytest.mark.slow

# Weight decay moves the params at every update even while a random policy earns no
# reward (zero advantages), so samples drawn from the wrong params would show.
ASYNC = {"async_rollout.enabled": True, "weight_decay": 1.0, "checkpoint_every": 2}
# Values that depend on the machine's speed (or the process's history), not the run.


class _Crash(Exception):
    pass


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


def _run(config, monkeypatch, crash_after_step: int = 0) -> list[list[str]]:
    """Runs ``config``; returns the prompts of each training rollout it generated.

    With ``crash_after_step``, the run dies right after writing that update's metrics.
    """
    generated, real_rollout, real_append = [], rollout_lib.rollout, artifacts.append_jsonl

    def rollout(sampler, params, task, tokenizer, examples, group_size, **kwargs):
        if group_size == config.group_size:  # (validation draws eval_k = 2 or 1 per prompt)
            generated.append([ex["prompt"] for ex in examples])
        return real_rollout(sampler, params, task, tokenizer, examples, group_size, **kwargs)

    def append_jsonl(path, record):
        real_append(path, record)
        if record["kind"] == "update" and record["step"] == crash_after_step:
            raise _Crash(f"killed after update {crash_after_step}")

    with monkeypatch.context() as m:
        m.setattr(rollout_lib, "rollout", rollout)
        m.setattr(artifacts, "append_jsonl", append_jsonl)
        if crash_after_step:
            with pytest.raises(_Crash):
                run_lib.run(config, progress=False)
        else:
            assert run_lib.run(config, progress=False)["status"] == "finished"
    return generated[1:]  # generated[0]: the compile warm-up on the first prompts


def _updates(run_dir):
    return deterministic(artifacts.read_metrics(run_dir, "update"))


def _assert_same_updates(a, b):
    assert_same_records(a, b, rel=1e-6, abs=1e-7)


def test_stopped_async_run_extends_into_the_uninterrupted_run(work_dir, tmp_path, monkeypatch):
    full_dir, split_dir = str(tmp_path / "full"), str(tmp_path / "split")
    full = _run(tiny_run_config(work_dir, full_dir, budget_responses=96, **ASYNC), monkeypatch)
    # Stop after 3 updates (a rollout is in flight), then continue to the same budget.
    first = _run(tiny_run_config(work_dir, split_dir, budget_responses=48, **ASYNC), monkeypatch)
    second = _run(tiny_run_config(work_dir, split_dir, budget_responses=96, **ASYNC), monkeypatch)

    # 6 updates, each on a batch generated one update earlier (the first on the initial
    # params), plus the batch in flight at the end: 7 batches of 4 prompts.
    updates = _updates(full_dir)
    assert [u["staleness"] for u in updates] == [0, 1, 1, 1, 1, 1]
    assert len(full) == 7 and all(len(p) == 4 for p in full)
    # The batch in flight at the stop was trained on after the resume, not drawn again,
    # and no prompts were skipped.
    assert (len(first), len(second)) == (4, 3)
    assert first + second == full
    _assert_same_updates(_updates(split_dir), updates)


def test_crashed_async_run_resumes_into_the_uninterrupted_run(work_dir, tmp_path, monkeypatch):
    kwargs = dict(ASYNC, budget_responses=96)
    kwargs["async_rollout.max_staleness"] = 2  # two batches in flight at every checkpoint
    full_dir, run_dir = str(tmp_path / "full"), str(tmp_path / "run")
    full = _run(tiny_run_config(work_dir, full_dir, **kwargs), monkeypatch)
    crashed = _run(tiny_run_config(work_dir, run_dir, **kwargs), monkeypatch, crash_after_step=5)
    assert max(u["step"] for u in _updates(run_dir)) == 5
    resumed = _run(tiny_run_config(work_dir, run_dir, **kwargs), monkeypatch)

    updates = _updates(full_dir)
    assert [u["staleness"] for u in updates] == [0, 1, 2, 2, 2, 2]
    assert len(full) == 8  # 6 trained on, 2 in flight at the end
    # The checkpoint of step 4 held batches 4 and 5 (drawn after updates 2 and 3); the
    # crashed run had drawn batch 6 too. The resumed run draws batches 6 and 7 only.
    assert crashed == full[:7]
    assert resumed == full[6:]
    _assert_same_updates(_updates(run_dir), updates)


def test_async_checkpoint_resumed_synchronously_redraws_the_batches_in_flight(
    work_dir, tmp_path, monkeypatch
):
    run_dir = str(tmp_path / "run")
    first = _run(tiny_run_config(work_dir, run_dir, budget_responses=48, **ASYNC), monkeypatch)
    sync = dict(ASYNC, budget_responses=96)
    sync["async_rollout.enabled"] = False
    second = _run(tiny_run_config(work_dir, run_dir, **sync), monkeypatch)
    # The batch in flight at the stop (the 4th) is drawn again, from the checkpoint's
    # params, then the prompts go on in order: nothing skipped, nothing repeated.
    assert (len(first), len(second)) == (4, 3)
    assert second[0] == first[3]
    updates = _updates(run_dir)
    assert [u["step"] for u in updates] == [1, 2, 3, 4, 5, 6]
    assert [u["staleness"] for u in updates] == [0, 1, 1, 0, 0, 0]


def test_a_rollout_survives_json_bit_for_bit():
    rng = np.random.default_rng(0)
    samples = SampleOutput(
        prompt_tokens=rng.integers(0, 50, (4, 8), dtype=np.int32),
        prompt_mask=rng.random((4, 8)) < 0.5,
        response_tokens=rng.integers(0, 50, (4, 5), dtype=np.int32),
        response_mask=rng.random((4, 5)) < 0.5,
        response_logprobs=-rng.random((4, 5), dtype=np.float32),
        lengths=np.array([1, 5, 0, 3], np.int32),
    )
    ro = rollout_lib.Rollout(
        examples=[{"prompt": "1+2=", "answer": "3", "meta": {"a": 1}}] * 2,
        samples=samples,
        rewards_pg=np.array([[1.0, np.nan], [0.0, 0.5]], np.float32),
        time_generate_s=0.25,
        time_score_s=0.125,
        gen_tokens=9,
    )
    back = rollout_lib.rollout_from_json(json.loads(json.dumps(rollout_lib.rollout_to_json(ro))))
    for name in ("prompt_tokens", "prompt_mask", "response_tokens", "response_mask", "lengths"):
        got, want = getattr(back.samples, name), getattr(samples, name)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    assert back.samples.response_logprobs.tobytes() == samples.response_logprobs.tobytes()
    assert back.rewards_pg.tobytes() == ro.rewards_pg.tobytes()  # NaN included
    assert back.examples == ro.examples
    assert (back.time_generate_s, back.time_score_s, back.gen_tokens) == (0.25, 0.125, 9)
    assert back.complete_p is None and back.gen_flops is None
