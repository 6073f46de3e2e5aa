"""GRPO learns: a warm-started tiny model's validation accuracy rises within 16 updates.

Every other end-to-end test runs a random policy with zero reward (zero advantages), so a
sign flip in the advantages or a wrong row order in the batch would pass them. This one
runs the default CPU study's configuration (``experiments/configs/grpo_cpu.py``: 3-digit
scratchpad addition, ~1M parameters, supervised warm start to an exact p_ref of 0.37) at
P x G = 8 x 8 for 1024 retained responses (16 updates), validating every 512 responses
with the exact p_ref on 512 prompts (no sampling noise), sampled mean@4 on 128 prompts
(standard error ~0.02) and greedy accuracy. (That a sign flip in the advantages fails it
is expected, not measured.)
"""

import numpy as np
import pytest

from experiments.configs import grpo_cpu
from rl_batch import artifacts
from rl_batch.runs import run as run_lib


@pytest.mark.slow
def test_grpo_raises_validation_accuracy_from_a_warm_start(tmp_path):
    c = grpo_cpu.get_config()
    del c["sweep"]
    c.work_dir = str(tmp_path / "work")
    c.run_dir = str(tmp_path / "run")
    c.prompts, c.group_size = 8, 8
    c.eval_prompts, c.eval_k, c.eval_greedy = 128, 4, True  # mean@4: standard error ~0.02
    c.eval_sampled_every = 1  # (the study samples every 4th validation; this test, each)
    c.eval_every_responses = 512
    c.budget_responses = 1024
    c.stop_at_target = False
    summary = run_lib.run(c, progress=False)
    assert summary["status"] == "finished"
    evals = artifacts.read_metrics(c.run_dir, "eval")
    exact = [e["eval_p_ref"] for e in evals]
    assert [e["eval_accuracy"] for e in evals] == exact  # the study's metric is the exact one
    accuracy = [e["eval_mean_at_k"] for e in evals]
    greedy = [e["eval_greedy_accuracy"] for e in evals]
    rewards = [u["reward_mean"] for u in artifacts.read_metrics(c.run_dir, "update")]
    assert exact[-1] >= exact[0] + 0.05, exact
    assert accuracy[-1] >= accuracy[0] + 0.05, accuracy
    assert greedy[-1] >= greedy[0], greedy
    assert np.mean(rewards[-4:]) > np.mean(rewards[:4]), rewards
