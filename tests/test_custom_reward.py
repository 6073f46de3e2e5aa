"""A user's reward function (task.reward_fn) in place of the task's verifier."""

import os

import numpy as np
import pytest
from run_fixtures import tiny_run_config

from rl_batch import artifacts
from rl_batch.runs import config as config_lib
from rl_batch.runs import run as run_lib
from rl_batch.tasks import custom_reward, get_task

REWARD_FILE = """
def length(prompt, response, answer, meta):
    return float(len(response))


def bad(prompt, response, answer, meta):
    return float("nan")

NOT_CALLABLE = 3

from rl_batch.tasks.custom_reward import batched

CALLS = []


@batched
def lengths(prompts, responses, answers, metas):
    CALLS.append(len(responses))
    return [float(len(r)) for r in responses]


@batched
def short(prompts, responses, answers, metas):
    return [1.0]
"""


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD_FILE)
    return str(path)


def test_the_users_function_scores_and_the_task_does_the_rest(reward_file, tmp_path, monkeypatch):
    task = get_task("addition", n_digits=2)
    wrapped = custom_reward.WithReward(task, f"{reward_file}:length")
    ex = task.make_example(np.random.default_rng(0)).to_dict()
    assert task.score(ex, ex["answer"]).reward == 1.0  # the verifier ...
    assert wrapped.score(ex, ex["answer"]).reward == len(ex["answer"])  # ... replaced
    assert wrapped.reward(ex, "4242") == 4.0
    assert wrapped.max_response_len == task.max_response_len
    # A module on the path works the same way.
    monkeypatch.syspath_prepend(os.path.dirname(reward_file))
    assert custom_reward.load_reward_fn("my_reward:length")("p", "abc", "a", {}) == 3.0
    with pytest.raises(ValueError, match=r"returned nan \(a finite float is needed\)"):
        custom_reward.WithReward(task, f"{reward_file}:bad").score(ex, ex["answer"])


def test_a_batched_reward_scores_a_rollout_in_one_call(reward_file):
    from rl_batch.tasks.rewards import score_responses

    task = get_task("addition", n_digits=2)
    rng = np.random.default_rng(0)
    examples = [task.make_example(rng).to_dict() for _ in range(2)]
    wrapped = custom_reward.WithReward(task, f"{reward_file}:lengths")
    rewards, _ = score_responses(wrapped, examples, ["a", "bb", "ccc", "dddd"], group_size=2)
    assert rewards.tolist() == [1.0, 2.0, 3.0, 4.0]
    assert wrapped.reward_fn.__globals__["CALLS"] == [4]  # one call for the 4 responses
    with pytest.raises(ValueError, match="returned 1 rewards for 4 responses"):
        score_responses(
            custom_reward.WithReward(task, f"{reward_file}:short"), examples, ["a"] * 4, 2
        )


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon", "expected 'package.module:function' or 'file.py:function'"),
        ("missing_file.py:length", "no such file 'missing_file.py'"),
        ("no_such_module_xyz:length", "cannot import 'no_such_module_xyz'"),
        ("{file}:nope", "has no function 'nope'"),
        ("{file}:NOT_CALLABLE", "has no function 'NOT_CALLABLE'"),
    ],
)
def test_a_bad_spec_fails_at_resolve_in_one_line(reward_file, tmp_path, spec, message):
    c = tiny_run_config(str(tmp_path / "run"))
    c.task.reward_fn = spec.format(file=reward_file)
    with pytest.raises(ValueError, match="invalid config: task.reward_fn=") as e:
        config_lib.resolve(c, device_count=1)
    assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_run_trains_on_the_users_reward(reward_file, tmp_path):
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    c.task.reward_fn = f"{reward_file}:length"
    c.budget_responses = 32
    run_lib.run(c, progress=False)
    updates = artifacts.read_metrics(c.run_dir, "update")
    assert updates
    for u in updates:  # mean len(response): generated tokens per response, less the EOS
        per_response = u["gen_tokens"] / u["batch_generated"]
        assert per_response - 1.0 <= u["reward_mean"] <= per_response
        assert u["reward_mean"] > 1.0  # (the addition verifier gives 0 or 1)
