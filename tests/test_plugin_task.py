"""A user's own task class (task.name = "module:Class") trains without editing the package."""

import numpy as np
import pytest
from run_fixtures import tiny_run_config

from rl_batch import artifacts
from rl_batch.runs import config as config_lib
from rl_batch.runs import pretrain
from rl_batch.runs import run as run_lib
from rl_batch.tasks import plugin
from rl_batch.tasks.base import Example, Score, to_example


class ReverseTask:
    """Reverse a string of ``n_digits`` digits: "123=" -> "321"."""

    def __init__(self, n_digits: int = 3):
        self.n_digits = n_digits
        self.name = "reverse"

    @property
    def max_prompt_len(self) -> int:
        return self.n_digits + 1

    @property
    def max_response_len(self) -> int:
        return self.n_digits

    def make_example(self, rng: np.random.Generator) -> Example:
        digits = "".join(str(d) for d in rng.integers(0, 10, self.n_digits))
        return Example(digits + "=", digits[::-1], {"digits": digits})

    def score(self, example, response: str) -> Score:
        answer = to_example(example).answer
        return Score(reward=float(response.strip() == answer), format_ok=True)


class NoScore:
    max_prompt_len = max_response_len = 4

    def make_example(self, rng):
        return Example("1=", "1")


SPEC = f"{__name__}:ReverseTask"


def plugin_config(tmp_path, **changes):
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"), **changes)
    c.task.name = SPEC
    c.task.kwargs = {"n_digits": 3}
    return c


def test_the_task_class_is_built_with_its_knobs_and_draws_its_splits(tmp_path):
    spec = config_lib.resolve(plugin_config(tmp_path), device_count=1)
    c = spec.config
    task = config_lib.make_task(c)
    assert isinstance(task, ReverseTask) and task.n_digits == 3
    assert spec.max_prompt_len == 3 + 1 + 1  # + BOS
    assert spec.max_new_tokens == 3 + 1  # + EOS
    train, val = spec.task.plugin_splits(task)
    assert (len(train), len(val)) == (256, 32)
    val_prompts = {ex["prompt"] for ex in val}
    assert len(val_prompts) == 32  # distinct ...
    assert not val_prompts & {ex["prompt"] for ex in train}  # ... and not trained on
    for ex in val.get_batch([0, 5]):
        assert ex["answer"] == ex["prompt"][:-1][::-1]
    again, _ = spec.task.plugin_splits(task)  # seeded by task.split_seed
    assert again.get_batch(range(4)) == train.get_batch(range(4))
    assert pretrain.cache_key(spec).startswith("test_plugin_task_ReverseTask-")


def test_a_file_spec_loads_the_class(tmp_path):
    path = tmp_path / "my_task.py"
    path.write_text("class T:\n    pass\n")
    with pytest.raises(ValueError, match=r"the task lacks \['make_example', 'score'"):
        plugin.make_plugin_task(f"{path}:T", {})


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("no_such_module_xyz:Task", {}, "task.name='no_such_module_xyz:Task': cannot import"),
        (f"{__name__}:Nope", {}, "has no TaskClass 'Nope'"),
        ("missing_file.py:Task", {}, "no such file 'missing_file.py'"),
        (SPEC, {"n_digits": 3, "width": 2}, "task.kwargs={'n_digits': 3, 'width': 2} do not"),
        (f"{__name__}:NoScore", {}, "the task lacks ['score']"),
    ],
)
def test_a_bad_task_fails_at_resolve_in_one_line(tmp_path, name, kwargs, message):
    c = plugin_config(tmp_path)
    c.task.name, c.task.kwargs = name, kwargs
    with pytest.raises(ValueError) as e:
        config_lib.resolve(c, device_count=1)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_name_without_a_colon_names_the_plugin_form(tmp_path):
    c = plugin_config(tmp_path)
    c.task.name = "reverse"
    with pytest.raises(ValueError, match="'package.module:TaskClass'"):
        config_lib.resolve(c, device_count=1)


@pytest.mark.slow  # 10 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_run_trains_and_evaluates_on_the_users_task(tmp_path):
    c = plugin_config(tmp_path)
    c.budget_responses = 32
    run_lib.run(c, progress=False)
    updates = artifacts.read_metrics(c.run_dir, "update")
    evals = artifacts.read_metrics(c.run_dir, "eval")
    assert updates and evals
    assert all(0.0 <= u["reward_mean"] <= 1.0 for u in updates)
    assert all(0.0 <= e["eval_accuracy"] <= 1.0 for e in evals)


@pytest.mark.slow  # 11 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_the_warm_start_trains_on_the_users_task(tmp_path):
    c = plugin_config(tmp_path, **{"init.source": "pretrain"})
    c.pretrain.steps, c.pretrain.eval_every, c.pretrain.eval_prompts = 4, 2, 8
    c.pretrain.warmup_steps, c.pretrain.stop_accuracy = 1, 1.1  # (every step runs)
    _, info = pretrain.train_base(config_lib.resolve(c), progress=False)
    assert info["steps"] == 4 and [e[0] for e in info["evals"]] == [2, 4]
    assert all(np.isfinite(loss) for _, loss in info["losses"])


MY_TASK = """
import numpy as np
from rl_batch.tasks.base import Example, Score, to_example


class Reverse:
    def __init__(self, n_digits: int = 3):
        self.n_digits = n_digits
        self.max_prompt_len = n_digits + 1
        self.max_response_len = n_digits

    def make_example(self, rng: np.random.Generator) -> Example:
        digits = "".join(map(str, rng.integers(0, 10, self.n_digits)))
        return Example(prompt=digits + "=", answer=digits[::-1])

    def score(self, example, response: str) -> Score:
        return Score(reward=float(response == to_example(example).answer), format_ok=True)
"""


def test_the_warm_start_cache_key_follows_the_task_files_source(tmp_path):
    # Editing my_task.py reused the stale cached warm start (issue 48): the key hashes
    # the task file's source, so an edit trains a new one.
    path = tmp_path / "my_task.py"
    path.write_text(MY_TASK)
    config = plugin_config(tmp_path)
    config.task.name = f"{path}:Reverse"
    key = pretrain.cache_key(config_lib.resolve(config, device_count=1))
    assert key == pretrain.cache_key(config_lib.resolve(config, device_count=1))
    path.write_text(MY_TASK.replace("response == ", "response.strip() == "))
    assert pretrain.cache_key(config_lib.resolve(config, device_count=1)) != key


def test_a_users_task_that_misses_the_target_gets_one_hint():
    missed = {"reached": False, "final_eval_accuracy": 0.50448}
    hint = plugin.target_hint("my_task.py:Reverse", missed, 0.53, 0.43)
    assert hint == (
        "hint: the target 0.53 (band from 0.43) is the default config's, set for the "
        "addition task; set one for your task with --config.target=... and "
        "--config.target_band_lo=... (this run ended at accuracy 0.504)"
    )
    assert plugin.target_hint("addition", missed, 0.53, 0.43) is None  # a shipped task
    assert plugin.target_hint("my_task.py:Reverse", {"reached": True}, 0.48, None) is None
