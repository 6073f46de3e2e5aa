"""Run-config validation: one clear error per bad field, derived values computed once."""

import math

import pytest

from experiments.configs import base, grpo_cpu
from rl_batch import config as config_lib
from tests.run_fixtures import set_fields


def _config(**changes):
    c = base.run_config()
    c.run_dir = "/tmp/unused"
    return set_fields(c, changes)


def test_sqrt_rule_derives_the_lr():
    c = config_lib.resolve(_config(prompts=32, group_size=8, lr_ref=1e-4, batch_ref=64), 1)
    # B = 256 = 4 x B_ref, so lr = 1e-4 * sqrt(4) = 2e-4.
    assert math.isclose(c.lr, 2e-4)
    assert c.derived.batch_responses == 256
    assert "sqrt" in c.derived.lr_arithmetic


def test_fixed_rule_keeps_the_reference_lr():
    c = config_lib.resolve(_config(prompts=32, lr_rule="fixed", lr_ref=1e-4, batch_ref=64), 1)
    assert math.isclose(c.lr, 1e-4)


def test_explicit_lr_overrides_the_rule():
    c = config_lib.resolve(_config(lr=3e-4), 1)
    assert c.lr == 3e-4


def test_response_length_comes_from_the_task():
    c = config_lib.resolve(_config(), 1)
    # 3-digit addition: "abc+def=" (8 chars) + BOS. Scratchpad response: three column
    # steps "a+b+c=cs" (8 chars) joined by 2 commas, ">" and 4 answer digits = 31, + EOS.
    assert c.derived.max_prompt_len == 9
    assert c.derived.max_new_tokens == 32


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"lr": -1e-3}, "lr=-0.001: must be > 0"),
        ({"lr_ref": -1e-3}, "lr_ref=-0.001"),
        ({"group_size": 1}, "group_size=1: GRPO needs >= 2"),
        ({"task.name": "sudoku"}, "task.name='sudoku'"),
        ({"model.preset": "gpt-9"}, "model.preset='gpt-9'"),
        ({"lr_rule": "cubic"}, "lr_rule='cubic'"),
        ({"target": 1.5}, "target=1.5"),
        ({"init.source": "hf"}, "needs init.path"),
        ({"model.overrides": {"max_seq_len": 8}}, "exceed the model context max_seq_len=8"),
    ],
)
def test_bad_values_are_named(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_lib.resolve(_config(**changes), 1)


def test_batch_must_divide_over_the_data_axis():
    with pytest.raises(ValueError, match=r"3 x 2 = 6 is not divisible by the data-parallel size 4"):
        config_lib.resolve(_config(prompts=3, group_size=2), 4)


def test_mesh_must_fit_the_devices():
    with pytest.raises(ValueError, match="does not fit 8 devices"):
        config_lib.resolve(_config(**{"mesh.data": 3}), 8)


def test_default_study_config_resolves():
    c = grpo_cpu.get_config()
    del c["sweep"]
    c.run_dir = "/tmp/unused"
    assert config_lib.resolve(c, 1).lr > 0


@pytest.mark.parametrize("name", ["grpo_cpu", "ppo_cpu", "grpo_gpu", "grpo_tpu"])
def test_every_study_grid_resolves(name, tmp_path):
    import importlib

    from rl_batch import sweep

    config = importlib.import_module(f"experiments.configs.{name}").get_config()
    points, resolved = sweep.plan(config, str(tmp_path))
    assert points and all(r.lr > 0 for r in resolved.values())
