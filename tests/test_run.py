"""End-to-end runs on a tiny model: artifacts, timing split, resume."""

import json
import os

import pytest

from rl_batch import artifacts
from rl_batch.runs import run as run_lib
from tests.run_fixtures import assert_same_records, deterministic, tiny_run_config

UPDATE_FIELDS = (
    "step responses_cum responses_generated_cum prompts group_size batch_responses lr "
    "reward_mean time_generate_s time_score_s time_update_s time_train_cum_s gen_tokens "
    "grad_norm loss clip_frac kl gen_len_mean gen_len_p50 gen_len_p90 gen_len_max slot_utilisation"
).split()
# Values that depend on the machine's speed, not on the computation.
# (and on the process's history: a resumed run compiles the validation sampler later).


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


def test_run_writes_the_artifacts(work_dir, tmp_path):
    run_dir = str(tmp_path / "run")
    summary = run_lib.run(tiny_run_config(work_dir, run_dir), progress=False)
    assert summary["status"] == "finished"
    assert summary["responses_cum"] == 64
    updates = artifacts.read_metrics(run_dir, "update")
    evals = artifacts.read_metrics(run_dir, "eval")
    assert len(updates) == 4  # 64 responses / (4 prompts x 4 responses)
    for field in UPDATE_FIELDS:
        assert field in updates[0], field
    assert [e["responses_cum"] for e in evals] == [0, 32, 64]
    assert all(e["eval_k"] == 2 for e in evals)
    # Training time is the sum of the per-update step times; evaluation is excluded.
    assert updates[-1]["time_train_cum_s"] == pytest.approx(summary["time_train_s"])
    assert summary["time_eval_s"] > 0 and summary["time_compile_s"] > 0
    config = artifacts.read_json(os.path.join(run_dir, artifacts.CONFIG_FILE))
    assert config["derived"]["lr"] == pytest.approx(1e-3)  # B = B_ref under the sqrt rule
    assert config["lr"] is None  # the input: derived from the rule
    assert all(u["lr"] == pytest.approx(1e-3) for u in updates)  # the effective LR
    assert os.listdir(os.path.join(run_dir, artifacts.CHECKPOINT_DIR))


@pytest.mark.slow  # 8 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_resumed_run_matches_uninterrupted(work_dir, tmp_path):
    full_dir, split_dir = str(tmp_path / "full"), str(tmp_path / "split")
    run_lib.run(tiny_run_config(work_dir, full_dir, budget_responses=96), progress=False)
    # Stop after 3 updates, then continue to the same budget from the checkpoint.
    run_lib.run(tiny_run_config(work_dir, split_dir, budget_responses=48), progress=False)
    run_lib.run(tiny_run_config(work_dir, split_dir, budget_responses=96), progress=False)
    full = deterministic(artifacts.read_metrics(full_dir), "update")
    split = deterministic(artifacts.read_metrics(split_dir), "update")
    assert len(full) == 6
    assert_same_records(full, split, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("damage", ["cut mid-line", "removed", "doubled", "edited"])
@pytest.mark.slow  # 25 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_damaged_metrics_are_rebuilt_from_the_checkpoint_on_resume(
    work_dir, tmp_path, damage, caplog
):
    run_dir = str(tmp_path / "run")
    # 3 updates, checkpointed at the last; the file then holds the lines up to step 3.
    run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=48), progress=False)
    path = os.path.join(run_dir, artifacts.METRICS_FILE)
    intact = open(path).read()
    lines = intact.splitlines(keepends=True)
    damaged = {
        "cut mid-line": intact[: len(intact) // 2],
        "removed": None,
        "doubled": intact + intact,
        "edited": "".join(lines[:1] + [lines[1].replace('"step": 1', '"step": 1, "x": 1')]
                          + lines[2:]),
    }[damage]  # fmt: skip
    if damaged is None:
        os.remove(path)
    else:
        open(path, "w").write(damaged)
    with caplog.at_level("WARNING"):
        run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=96), progress=False)
    assert "rebuilt from checkpoint 3" in caplog.text
    resumed = artifacts.read_metrics(run_dir)
    assert [json.loads(x) for x in lines] == resumed[: len(lines)]  # the lines up to step 3
    steps = [(r["kind"], r["step"]) for r in resumed]
    assert len(steps) == len(set(steps)) and steps[-1] == ("eval", 6)  # each once, to the end


def test_a_different_config_does_not_resume_into_a_run_dir(work_dir, tmp_path):
    run_dir = str(tmp_path / "run")
    run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=16), progress=False)
    with pytest.raises(ValueError, match="different config.*prompts"):
        run_lib.run(tiny_run_config(work_dir, run_dir, prompts=8), progress=False)
    # The first run's files are untouched.
    summary = json.load(open(os.path.join(run_dir, artifacts.SUMMARY_FILE)))
    assert summary["status"] == "finished"


def test_a_run_whose_groups_are_all_filtered_stops_with_a_clear_error(work_dir, tmp_path):
    # A random policy never solves addition: every group has equal (zero) rewards.
    config = tiny_run_config(
        work_dir, str(tmp_path / "run"), filter_groups=True, max_empty_rollouts=2
    )
    with pytest.raises(RuntimeError, match="2 rollout batches in a row had no group"):
        run_lib.run(config, progress=False)
    summary = json.load(open(tmp_path / "run" / artifacts.SUMMARY_FILE))
    assert summary["status"] == "failed" and "no group" in summary["error"]
    # What to do, in the same line: a policy that never solves the task needs a warm start.
    assert "mean reward 0.000): the policy never solves this task: start from a warm start on " \
        "it (--config.init.source=pretrain" in summary["error"]  # fmt: skip


def test_a_policy_that_solves_every_prompt_is_told_to_make_the_task_harder():
    from rl_batch.runs.accounting import Counters, stuck_error

    c = tiny_run_config("/tmp/unused", max_empty_rollouts=3)
    assert stuck_error(c, Counters(consecutive_empty=2), 1.0, "ckpt") is None
    error = stuck_error(c, Counters(consecutive_empty=3), 1.0, "ckpt")
    assert str(error) == (
        "3 rollout batches in a row had no group with differing rewards (mean reward 1.000): "
        "the policy solves every prompt: make the task harder, or sample at a higher "
        "--config.sampling.temperature"
    )


def test_a_run_from_its_warm_start_is_told_what_the_warm_start_reached(tmp_path):
    # A run that already starts from the task's warm start (init.source=pretrain) is not
    # advised to set it: the advice names the warm start's directory and the accuracy its
    # training recorded (info.json), and what to change.
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import pretrain
    from rl_batch.runs.accounting import Counters, stuck_error

    c = tiny_run_config(str(tmp_path), **{"init.source": "pretrain"})
    c.max_empty_rollouts = 3
    c.pretrain.steps, c.pretrain.stop_accuracy = 40, 0.25
    spec = config_lib.resolve(c)
    where = pretrain.cache_dir(spec)
    assert pretrain.warm_start_info(spec) == {
        "dir": where, "info": None, "pretrain": c.pretrain.to_dict()
    }  # fmt: skip
    os.makedirs(where)
    # The last evaluation of the warm start's training: (step, greedy, sampled accuracy).
    info = {"steps": 40, "evals": [[20, 0.0, 0.0], [40, 0.0, 0.0625]]}
    artifacts.write_json_atomic(os.path.join(where, "info.json"), info)
    warm = pretrain.warm_start_info(spec)
    assert warm["info"] == info
    error = str(stuck_error(c, Counters(consecutive_empty=3), 0.0, "ckpt", warm))
    assert error == (
        "3 rollout batches in a row had no group with differing rewards (mean reward 0.000): "
        f"the policy never solves this task: its warm start ({where}) reached sampled "
        "accuracy 0.062 in 40 steps, below pretrain.stop_accuracy=0.25 (pretrain.steps=40 "
        "ran out): raise --config.pretrain.steps or --config.pretrain.lr, or make the task "
        "easier"
    )
    assert "init.source" not in error
    # A warm start that reached its stop accuracy, and yet no rollout is rewarded.
    info["evals"][-1][2] = 0.3
    warm["info"] = info
    error = str(stuck_error(c, Counters(consecutive_empty=3), 0.0, "ckpt", warm))
    assert error.endswith(
        f"its warm start ({where}) reached sampled accuracy 0.300 in 40 steps "
        "(pretrain.stop_accuracy=0.25), yet no rollout is rewarded: check that the task's "
        "reward accepts its own examples' answers, or raise --config.pretrain.stop_accuracy"
    )
    # No info.json: said so (the warm start's directory named).
    warm["info"] = None
    error = str(stuck_error(c, Counters(consecutive_empty=3), 0.0, "ckpt", warm))
    assert f"its warm start ({where}, init.source=pretrain) records no accuracy" in error


@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_grpo_kl_to_the_initial_policy(work_dir, tmp_path):
    # grpo.kl_coef > 0 keeps the initial policy as the reference. The logged KL is k3 to
    # the reference, else to the behaviour policy, which with one epoch is the policy
    # being updated: 0 at every update. Against the frozen reference it grows once the
    # policy has moved away from it.
    # The reference log-probs are computed in micro-batches, like the update.
    kls, first = {}, {}
    for kl_coef in (0.0, 0.5):
        run_dir = str(tmp_path / f"kl{kl_coef}")
        changes = {"grpo.kl_coef": kl_coef, "weight_decay": 1.0, "grpo.micro_batches": 2}
        summary = run_lib.run(tiny_run_config(work_dir, run_dir, **changes), progress=False)
        assert summary["status"] == "finished"
        updates = artifacts.read_metrics(run_dir, "update")
        kls[kl_coef] = [r["kl"] for r in updates]
        first[kl_coef] = updates[0]
    assert kls[0.0] == pytest.approx([0.0] * 4, abs=1e-7)
    assert kls[0.5][0] == pytest.approx(0.0, abs=1e-7)  # policy == reference
    assert min(kls[0.5][2:]) > 1e-6, kls
    # The reference forward adds 1/3 of the update's forward + backward FLOPs (the first
    # rollouts are the same: same initial policy and seed).
    assert first[0.0]["update_tokens"] == first[0.5]["update_tokens"]
    upd_flops = {k: r["update_flops_per_s"] * r["time_update_s"] for k, r in first.items()}
    assert upd_flops[0.5] == pytest.approx(upd_flops[0.0] * 4 / 3, rel=1e-6)


@pytest.mark.slow  # 7 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_resume_refuses_any_setting_outside_the_allow_list(work_dir, tmp_path):
    run_dir = str(tmp_path / "run")
    run_lib.run(tiny_run_config(work_dir, run_dir, budget_responses=16), progress=False)
    before = open(os.path.join(run_dir, artifacts.CONFIG_FILE)).read()
    changed = tiny_run_config(work_dir, run_dir, budget_responses=16, eval_k=1)
    changed.sampling.temperature = 0.5
    with pytest.raises(ValueError) as e:
        run_lib.run(changed, progress=False)
    assert "eval_k: 2 -> 1" in str(e.value) and "sampling.temperature: 1.0 -> 0.5" in str(e.value)
    assert open(os.path.join(run_dir, artifacts.CONFIG_FILE)).read() == before  # untouched
    # Extending the runway (an allowed change) resumes and runs on.
    longer = tiny_run_config(work_dir, run_dir, budget_responses=32)
    assert run_lib.run(longer, progress=False)["responses_cum"] >= 32


def test_summary_says_running_while_the_run_is_alive(work_dir, tmp_path, monkeypatch):
    run_dir = str(tmp_path / "run")
    path = os.path.join(run_dir, artifacts.SUMMARY_FILE)
    seen, save = [], run_lib.save_checkpoint

    def spy(ckpt, state, counters, *args):
        seen.append((counters.step, json.load(open(path))["status"]))
        save(ckpt, state, counters, *args)

    monkeypatch.setattr(run_lib, "save_checkpoint", spy)
    config = tiny_run_config(work_dir, run_dir, budget_responses=48, checkpoint_every=1)
    assert run_lib.run(config, progress=False)["status"] == "finished"
    assert [step for step, _ in seen] == [1, 2, 3]  # each update's (the last: the final)
    assert all(status == "running" for _, status in seen), seen
    assert json.load(open(path))["status"] == "finished"


def test_checkpoints_wait_checkpoint_min_s_between_saves(work_dir, tmp_path, monkeypatch):
    saved, save = [], run_lib.save_checkpoint
    monkeypatch.setattr(
        run_lib, "save_checkpoint", lambda s, state, c: saved.append(c.step) or save(s, state, c)
    )
    changes = dict(budget_responses=48, checkpoint_every=1, checkpoint_min_s=3600.0)
    run_lib.run(tiny_run_config(work_dir, str(tmp_path / "run"), **changes), progress=False)
    # Due after each of the 3 updates, none an hour after the start: the final one alone.
    # (checkpoint_min_s=0 saves after each: test_summary_says_running_while_the_run_is_alive.)
    assert saved == [3]


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
@pytest.mark.slow  # 24 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_run_starts_from_another_runs_checkpoint(work_dir, tmp_path, algo):
    import jax
    import numpy as np

    from rl_batch.models import transformer as model_lib
    from rl_batch.runs import config as config_lib
    from rl_batch.runs.checkpoint import Checkpointer

    changes = {"algo": algo, "group_size": 1, "prompts": 8} if algo == "ppo" else {}
    first = tiny_run_config(work_dir, str(tmp_path / "first"), budget_responses=16, **changes)
    run_lib.run(first, progress=False)
    c = tiny_run_config(work_dir, str(tmp_path / "second"), **changes)
    c.init.source, c.init.path = "checkpoint", os.path.join(first.run_dir, "checkpoints")
    c = config_lib.resolve(c)
    model_config = c.model
    params = run_lib.initial_params(c)
    # The trained policy of the first run (the whole-state restore reads the same arrays).
    expected = Checkpointer(c.inputs.init.path).restore_params(
        model_lib.abstract_params(model_config)
    )
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(expected)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
