"""Synthetic tasks, verifiers, registry, batched scoring, eval helpers and TFDS splits."""

import json
import logging
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest

from rl_batch.tasks import (
    TASKS,
    AdditionTask,
    CountdownTask,
    Example,
    MultiplicationTask,
    Task,
    get_task,
    greedy_accuracy,
    mean_at_k,
    pass_at_k,
    score_responses,
    task_kwargs,
)
from rl_batch.tasks.synthetic import ExpressionError, evaluate_expression, reversed_digits

# ---------------------------------------------------------------------------------------
# Addition


def test_addition_reference_responses_by_hand():
    plain, pad = AdditionTask(n_digits=3), AdditionTask(n_digits=3, scratchpad=True)
    assert reversed_digits(579, 4) == "9750"
    assert plain.response_for(123, 456) == "9750"
    assert pad.response_for(123, 456) == "3+6+0=09,2+5+0=07,1+4+0=05>9750"
    # Carries ripple through every column: 999 + 1 = 1000.
    assert pad.response_for(999, 1) == "9+1+0=10,9+0+1=10,9+0+1=10>0001"
    assert (plain.max_prompt_len, plain.max_response_len) == (8, 4)
    assert pad.max_response_len == len(pad.response_for(999, 1)) == 31


def test_addition_make_example_is_seeded_and_padded():
    task = AdditionTask(n_digits=3)
    a = task.make_example(np.random.default_rng(7))
    b = task.make_example(np.random.default_rng(7))
    assert a == b
    x, y = a.meta["a"], a.meta["b"]
    assert a.prompt == f"{x:03d}+{y:03d}="
    assert a.answer == str(x + y).zfill(4)[::-1]


@pytest.mark.parametrize(
    "response,reward,format_ok",
    [
        ("9750", 1.0, True),
        ("975", 1.0, True),  # Missing padding zero: same number.
        ("  9750 \n", 1.0, True),  # Surrounding whitespace ignored.
        ("97500", 1.0, True),
        ("9751", 0.0, True),
        ("0579", 0.0, True),  # Most-significant first is a different number.
        ("9 750", 0.0, False),
        ("97a0", 0.0, False),
        ("", 0.0, False),
        ("3+6+0=09>9750", 0.0, False),  # Scratchpad text when none is expected.
    ],
)
def test_addition_reward(response, reward, format_ok):
    score = AdditionTask(n_digits=3).score(Example("123+456=", "9750"), response)
    assert (score.reward, score.format_ok) == (reward, format_ok)


def test_addition_scratchpad_reward_checks_only_the_final_answer():
    task = AdditionTask(n_digits=3, scratchpad=True)
    ex = {"prompt": "123+456=", "answer": "3+6+0=09,2+5+0=07,1+4+0=05>9750"}
    assert task.reward(ex, ex["answer"]) == 1.0
    assert task.reward(ex, "garbage steps > 9750 ") == 1.0
    score = task.score(ex, "3+6+0=09,2+5+0=07,1+4+0=05>9760")
    assert (score.reward, score.format_ok, score.parsed) == (0.0, True, "9760")
    score = task.score(ex, "3+6+0=09,2+5+0=07,1+4+0=05 9750")
    assert (score.reward, score.format_ok) == (0.0, False)


# ---------------------------------------------------------------------------------------
# Multiplication


def test_multiplication_reference_responses_by_hand():
    plain = MultiplicationTask(n_digits=2)
    pad = MultiplicationTask(n_digits=2, scratchpad=True)
    assert plain.m_digits == 2
    assert plain.response_for(12, 34) == "8040"  # 408
    # 12*4 = 48 -> "8400"; 12*3*10 = 360 -> "0630", running 408 -> "8040".
    assert pad.response_for(12, 34) == "8400:8400,0630:8040>8040"
    assert pad.max_response_len == len(pad.response_for(99, 99))
    three_by_two = MultiplicationTask(n_digits=3, m_digits=2)
    assert three_by_two.response_for(999, 99) == "10989"  # 98901 reversed
    assert three_by_two.max_prompt_len == len("999*99=")


@pytest.mark.parametrize(
    "response,reward,format_ok",
    [("8040", 1.0, True), (" 804\t", 1.0, True), ("0408", 0.0, True), ("8o40", 0.0, False)],
)
def test_multiplication_reward(response, reward, format_ok):
    score = MultiplicationTask(n_digits=2).score(Example("12*34=", "8040"), response)
    assert (score.reward, score.format_ok) == (reward, format_ok)


def test_digit_task_rejects_foreign_prompt():
    with pytest.raises(ValueError, match="not of the form"):
        MultiplicationTask().score(Example("12+34=", "6400"), "6400")


# ---------------------------------------------------------------------------------------
# Countdown


def test_evaluate_expression_by_hand():
    assert evaluate_expression("2+3*4") == (14, [2, 3, 4])
    assert evaluate_expression("(2+3)*4") == (20, [2, 3, 4])
    assert evaluate_expression("10-4-3")[0] == 3  # Left-associative.
    assert evaluate_expression("64/4/2")[0] == 8
    assert evaluate_expression(" 8 / 3 ")[0] == Fraction(8, 3)
    assert evaluate_expression("8/(3-8/3)")[0] == 24
    for bad in ["", "3*", "(3+5", "3+5)", "3**7", "-3+5", "3 5", "2^3", "__import__('os')"]:
        with pytest.raises(ExpressionError):
            evaluate_expression(bad)
    with pytest.raises(ExpressionError, match="nested deeper"):
        evaluate_expression("(" * 40 + "1" + ")" * 40)
    with pytest.raises(ZeroDivisionError):
        evaluate_expression("5/(3-3)")


@pytest.mark.parametrize(
    "prompt,response,reward,format_ok,error",
    [
        ("3 5 7|26=", "3*7+5", 1.0, True, None),
        ("3 5 7|26=", "  3 * 7 + 5 ", 1.0, True, None),
        ("3 5 7|15=", "3*5", 1.0, True, None),  # A subset of the numbers is allowed.
        ("3 5 7|26=", "5*7-3*3", 0.0, True, "uses 3 2x, given 1x"),
        ("3 3 5|26=", "5*3+3+3", 0.0, True, "uses 3 3x, given 2x"),
        ("3 3 5|6=", "3+3", 1.0, True, None),  # A repeated number may be used as often.
        ("3 5 7|26=", "7*4-2", 0.0, True, "number 2 is not given"),
        ("3 3 5|1=", "5/(3-3)", 0.0, True, "division by zero"),
        ("3 5 7|26=", "3*7+7", 0.0, True, "uses 7 2x, given 1x"),
        ("3 5 7|26=", "3+5+7", 0.0, True, "value 15 != target 26"),
        ("3 5 7|26=", "3*7+5=26", 0.0, False, "unexpected character '='"),
        ("3 5 7|26=", "(3*7+5", 0.0, False, "unbalanced parentheses"),
        ("3 5 7|26=", "", 0.0, False, "empty expression"),
        ("8 3 8 3|24=", "8/(3-8/3)", 1.0, True, None),  # Fractional intermediate.
    ],
)
def test_countdown_reward(prompt, response, reward, format_ok, error):
    score = CountdownTask().score(Example(prompt, ""), response)
    assert (score.reward, score.format_ok) == (reward, format_ok)
    if error is None:
        assert score.error is None
    else:
        assert error in score.error


def test_countdown_examples_are_solvable_and_nontrivial():
    task = CountdownTask(n_numbers=4, max_number=20, max_target=200)
    rng = np.random.default_rng(3)
    for _ in range(300):
        ex = task.make_example(rng)
        numbers, target = task.parse_prompt(ex.prompt)
        assert numbers == ex.meta["numbers"] and target == ex.meta["target"]
        assert 1 <= target <= 200 and target not in numbers
        assert sorted(evaluate_expression(ex.answer)[1]) == sorted(numbers)  # Uses all.
        assert task.reward(ex, ex.answer) == 1.0


# ---------------------------------------------------------------------------------------
# All synthetic tasks: references score 1 and fit the declared lengths.


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("addition", {"n_digits": 1}),
        ("addition", {"n_digits": 5, "scratchpad": True}),
        ("multiplication", {"n_digits": 3, "m_digits": 2}),
        ("multiplication", {"n_digits": 3, "scratchpad": True}),
        ("arithmetic_mix", {}),
        ("arithmetic_mix", {"mul_digits": [2, 2], "mix": [1, 3], "scratchpad": False}),
        ("countdown", {}),
        ("countdown", {"n_numbers": 6, "max_number": 99, "max_target": 999}),
    ],
)
def test_reference_answers_score_one_and_fit(name, kwargs):
    task = get_task(name, **kwargs)
    rng = np.random.default_rng(0)
    examples = [task.make_example(rng) for _ in range(300)]
    rewards_n, scores = score_responses(task, examples, [ex.answer for ex in examples])
    assert rewards_n.dtype == np.float32 and rewards_n.shape == (300,)
    assert rewards_n.min() == 1.0 and all(s.format_ok for s in scores)
    assert max(len(ex.prompt) for ex in examples) <= task.max_prompt_len
    assert max(len(ex.answer) for ex in examples) <= task.max_response_len
    json.dumps([ex.to_dict() for ex in examples])  # Meta must be JSON-serialisable.


def test_arithmetic_mix_draws_both_ops_and_scores_each_by_its_own_rule():
    task = get_task("arithmetic_mix", mix=[1, 3])
    rng = np.random.default_rng(0)
    examples = [task.make_example(rng) for _ in range(2000)]
    ops = [ex.meta["op"] for ex in examples]
    assert 0.70 < ops.count("mul") / len(ops) < 0.80  # weights 1:3
    add = next(ex for ex in examples if ex.meta["op"] == "add")
    mul = next(ex for ex in examples if ex.meta["op"] == "mul")
    assert "+" in add.prompt and add.answer == AdditionTask(scratchpad=True).response_for(
        add.meta["a"], add.meta["b"]
    )
    assert mul.prompt == f"{mul.meta['a']:03d}*{mul.meta['b']}="
    # 123 * 4 = 492: reversed and padded to 4 digits, after the one partial product.
    assert task.score({"prompt": "123*4=", "answer": ""}, "2940:2940>2940").reward == 1.0
    assert task.score({"prompt": "123*4=", "answer": ""}, "2940:2940>2941").reward == 0.0
    assert task.score({"prompt": "123+004=", "answer": ""}, "x>7210").reward == 1.0
    assert task.max_response_len == AdditionTask(scratchpad=True).max_response_len
    with pytest.raises(ValueError, match="mix=\\[1.0\\]: expected 2 weights"):
        get_task("arithmetic_mix", mix=[1])
    with pytest.raises(ValueError, match="m_digits must be in"):
        get_task("arithmetic_mix", mul_digits=[3, 0])


def test_knob_validation():
    with pytest.raises(ValueError, match="n_digits must be in"):
        AdditionTask(n_digits=0)
    with pytest.raises(ValueError, match="m_digits must be in"):
        MultiplicationTask(n_digits=2, m_digits=0)
    with pytest.raises(ValueError, match="n_numbers must be in"):
        CountdownTask(n_numbers=1)


# ---------------------------------------------------------------------------------------
# Registry


def test_registry_builds_tasks_and_names_bad_input():
    task = get_task("addition", n_digits=4, scratchpad=True)
    assert task == AdditionTask(n_digits=4, scratchpad=True) and task.name == "addition"
    assert task_kwargs(task) == {"n_digits": 4, "scratchpad": True}
    assert get_task("math").name == "math"
    for name in TASKS:
        assert isinstance(get_task(name), Task), name
    with pytest.raises(ValueError, match="unknown task 'subtraction'; known tasks: addition, "):
        get_task("subtraction")
    with pytest.raises(ValueError, match=r"no option\(s\) \['digits'\]"):
        get_task("addition", digits=3)


# ---------------------------------------------------------------------------------------
# Batched scoring and evaluation helpers


def test_score_responses_groups_by_example():
    task = AdditionTask(n_digits=1)
    examples = [Example("1+2=", "30"), {"prompt": "9+9=", "answer": "81"}]
    responses = ["30", "3", "xx", "81", "81", "18"]  # G = 3 per example.
    rewards_n, scores = score_responses(task, examples, responses, group_size=3)
    np.testing.assert_array_equal(rewards_n, [1, 1, 0, 1, 1, 0])
    assert [s.format_ok for s in scores] == [True, True, False, True, True, True]
    assert scores[5].parsed == "18"
    with pytest.raises(ValueError, match="got 5 responses for 2 examples with group_size=3"):
        score_responses(task, examples, responses[:5], group_size=3)
    with pytest.raises(ValueError, match="missing field 'answer'"):
        score_responses(task, [{"prompt": "1+2="}], ["30"])


def test_eval_helpers_by_hand():
    rewards_pk = np.array([[1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
    assert mean_at_k(rewards_pk) == pytest.approx(4 / 12)
    assert pass_at_k(rewards_pk) == pytest.approx(2 / 3)
    assert pass_at_k(np.array([[0.4, 0.6]]), threshold=0.5) == 1.0
    assert greedy_accuracy(np.array([1.0, 0.0, 0.0, 1.0])) == 0.5
    with pytest.raises(ValueError, match=r"2-D array, got shape \(3,\)"):
        mean_at_k(np.ones(3))
    with pytest.raises(ValueError, match="1-D array"):
        greedy_accuracy(np.ones((2, 2)))


# ---------------------------------------------------------------------------------------
# TFDS splits (ArrayRecord, no TensorFlow)


def test_generate_splits_disjoint_and_deterministic():
    from rl_batch.tasks.tfds_builders import generate_splits, make_config

    config = make_config("addition", seed=1, n_train=3000, n_validation=200, n_test=200)
    splits = generate_splits(config)
    assert {k: len(v) for k, v in splits.items()} == {"train": 3000, "validation": 200, "test": 200}
    val = {e.prompt for e in splits["validation"]}
    test = {e.prompt for e in splits["test"]}
    assert len(val) == 200 and len(test) == 200 and not val & test
    assert not {e.prompt for e in splits["train"]} & (val | test)
    assert generate_splits(config) == splits
    other = generate_splits(make_config("addition", seed=2, n_train=10, n_validation=5, n_test=5))
    assert other["validation"] != splits["validation"][:5]


def test_generate_splits_too_few_prompts():
    from rl_batch.tasks.tfds_builders import generate_splits, make_config

    # 1-digit addition has only 100 distinct prompts.
    config = make_config("addition", n_digits=1, n_train=10, n_validation=80, n_test=80)
    with pytest.raises(ValueError, match="too few distinct prompts"):
        generate_splits(config)


def test_config_names_are_readable_and_distinct():
    from rl_batch.tasks.tfds_builders import make_config

    a = make_config("addition", n_digits=3)
    assert a.name.startswith("addition-n_digits3-scratchpadFalse-seed0-")
    assert make_config("addition").name == a.name  # Defaults are filled in.
    assert make_config("addition", n_train=100).name != a.name
    assert make_config("countdown", max_target=50).name.startswith("countdown-max_number9-")
    with pytest.raises(ValueError, match="unknown task"):
        make_config("nope")


def test_load_split_hides_only_the_benign_tfds_warnings(tmp_path, caplog):
    from rl_batch.tasks.tfds_builders import load_split

    kwargs = dict(n_train=40, n_validation=8, n_test=8)  # a custom (not predefined) config
    with caplog.at_level(logging.INFO, logger="absl"):
        load_split("arithmetic_mix", "train", tmp_path, **kwargs)
        load_split("arithmetic_mix", "validation", tmp_path, **kwargs)
        logging.getLogger("absl").warning("another warning")
    messages = [r.getMessage() for r in caplog.records]
    assert not any("custom data configuration" in m or "dataset_info" in m for m in messages)
    assert "another warning" in messages


def test_load_split_prepares_once_and_reads_back(tmp_path, monkeypatch):
    from rl_batch.tasks import tfds_builders
    from rl_batch.tasks.tfds_builders import load_split

    kwargs = dict(n_digits=2, scratchpad=True, n_train=400, n_validation=40, n_test=30)
    train = load_split("addition", "train", tmp_path, **kwargs)
    expected = tfds_builders.generate_splits(tfds_builders.make_config("addition", **kwargs))
    assert len(train) == 400
    items = train[0:400]
    # TFDS stores the split in a shuffled but fixed order: same multiset of examples.
    got = sorted(json.dumps(d, sort_keys=True) for d in items)
    want = sorted(json.dumps(e.to_dict(), sort_keys=True) for e in expected["train"])
    assert got == want
    task = get_task("addition", n_digits=2, scratchpad=True)
    assert all(task.reward(d, d["answer"]) == 1.0 for d in items[:50])
    assert train[-1] == items[-1] and train.get_batch([3, 1]) == [items[3], items[1]]
    with pytest.raises(IndexError):
        train[400]
    files = [f for f in os.listdir(tmp_path / "rl_batch_synthetic") if not f.startswith(".")]
    assert len(files) == 1
    version_dir = tmp_path / "rl_batch_synthetic" / files[0] / "1.0.0"
    assert any(f.endswith(".array_record-00000-of-00001") for f in os.listdir(version_dir))

    # Second use: no regeneration.
    def fail(config):
        raise AssertionError("regenerated")

    monkeypatch.setattr(tfds_builders, "generate_splits", fail)
    validation = load_split("addition", "validation", tmp_path, **kwargs)
    test = load_split("addition", "test", tmp_path, **kwargs)
    assert (len(validation), len(test)) == (40, 30)
    eval_prompts = {d["prompt"] for d in validation[:]} | {d["prompt"] for d in test[:]}
    assert not eval_prompts & {d["prompt"] for d in items}
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        load_split("addition", "dev", tmp_path, **kwargs)


def test_load_split_works_with_tensorflow_blocked(tmp_path):
    """The default (predefined) config, prepared in a process where TensorFlow cannot load."""
    code = f"""
import sys

class HideTensorFlow:  # Makes TensorFlow look uninstalled, even where it is installed.
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name == "tensorflow" or name.startswith("tensorflow."):
            return None
        find_spec = getattr(self.finder, "find_spec", None)
        return None if find_spec is None else find_spec(name, path, target)

sys.meta_path[:] = [HideTensorFlow(f) for f in sys.meta_path]
try:
    import tensorflow  # noqa: F401
    raise SystemExit("tensorflow still importable")
except ModuleNotFoundError:
    pass
from rl_batch.tasks import get_task, load_split
src = load_split("countdown", "validation", {str(tmp_path)!r})
task = get_task("countdown")
assert len(src) == 512, len(src)
assert all(task.reward(d, d["answer"]) == 1.0 for d in src[:])
assert "tensorflow" not in sys.modules
print("OK", src[0]["prompt"], src[0]["answer"])
"""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-1].startswith("OK ")
