"""Warm start: sequences and loss mask, the stop rule, and the cache in work_dir."""

import json
import os

import jax
import numpy as np
import pytest

from rl_batch.runs import config as config_lib
from rl_batch.runs import pretrain
from rl_batch.tokenizers import CharTokenizer
from tests.run_fixtures import tiny_run_config


def test_sequences_and_loss_mask_by_hand():
    tok = CharTokenizer()
    tokens, input_mask, loss_mask = pretrain.make_sequences(
        tok, [{"prompt": "1+2=", "answer": "3"}, {"prompt": "9+9=", "answer": "81"}], 8
    )
    # BOS 1 + 2 = then the answer and EOS, right-padded to 8.
    first = [tok.bos_id, *tok.encode("1+2="), *tok.encode("3"), tok.eos_id]
    assert tokens[0].tolist() == first + [tok.pad_id] * (8 - len(first))
    assert input_mask[0].tolist() == [True] * 7 + [False]
    # logits[t] predicts tokens[t + 1]: positions 4 ("=" -> "3") and 5 ("3" -> EOS).
    assert np.flatnonzero(loss_mask[0]).tolist() == [4, 5]
    assert np.flatnonzero(loss_mask[1]).tolist() == [4, 5, 6]  # "8", "1", EOS


def _spec(c):
    return config_lib.resolve(c, 1)


def pretrain_config(tmp_path, **pretrain_changes):
    c = tiny_run_config(str(tmp_path / "work"), **{"init.source": "pretrain"})
    c.pretrain.steps = 6
    c.pretrain.eval_every = 2
    c.pretrain.eval_prompts = 8
    c.pretrain.warmup_steps = 1
    for key, value in pretrain_changes.items():
        c.pretrain[key] = value
    return c


@pytest.mark.slow  # 10 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_training_stops_at_the_first_eval_that_reaches_stop_accuracy(tmp_path):
    _, info = pretrain.train_base(
        _spec(pretrain_config(tmp_path, stop_accuracy=0.0)), progress=False
    )
    assert info["steps"] == 2 and [e[0] for e in info["evals"]] == [2]


def test_unreachable_stop_accuracy_runs_every_step(tmp_path):
    _, info = pretrain.train_base(
        _spec(pretrain_config(tmp_path, stop_accuracy=1.1)), progress=False
    )
    assert info["steps"] == 6
    assert [e[0] for e in info["evals"]] == [2, 4, 6]
    assert [step for step, _ in info["losses"]] == [2, 4, 6]
    assert all(np.isfinite(loss) for _, loss in info["losses"])
    assert 0.0 <= info["val_mean_at_4"] <= 1.0 and 0.0 <= info["val_greedy_accuracy"] <= 1.0


def test_base_params_are_trained_once_then_read_from_the_cache(tmp_path, monkeypatch):
    c = _spec(pretrain_config(tmp_path, stop_accuracy=0.0))
    first = pretrain.base_params(c, progress=False)
    directory = pretrain.cache_dir(c)
    with open(os.path.join(directory, "info.json")) as f:
        assert json.load(f)["key"] == pretrain.cache_key(c)

    def no_training(*args, **kwargs):
        raise AssertionError("the cached base policy should have been used")

    monkeypatch.setattr(pretrain, "train_base", no_training)
    second = pretrain.base_params(c, progress=False)
    for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(
    "change", [("pretrain", "stop_accuracy", 0.3), ("pretrain", "seed", 1), ("task", "n_train", 9)]
)
def test_cache_key_follows_what_determines_the_base_policy(tmp_path, change):
    c = pretrain_config(tmp_path)
    key = pretrain.cache_key(_spec(c))
    section, field, value = change
    c[section][field] = value
    assert pretrain.cache_key(_spec(c)) != key


def test_params_file_round_trip_and_a_run_starts_from_it(tmp_path):
    """``init.source="params"`` starts a run from the policy in a written file."""
    from rl_batch.runs import run as run_lib
    from tests.run_fixtures import numpy_params

    c = tiny_run_config(str(tmp_path / "work"))
    model_config = config_lib.resolve(c).model
    params = numpy_params(model_config, seed=7)
    path = str(tmp_path / "base.npz")
    pretrain.write_params_file(path, params)
    read = pretrain.load_params_file(path, model_config)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(read)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    c.init.source, c.init.path = "params", path
    c.run_dir = str(tmp_path / "run")
    start = run_lib.initial_params(config_lib.resolve(c))
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_params_file_of_another_model_is_refused_in_one_line(tmp_path):
    from tests.run_fixtures import numpy_params

    c = tiny_run_config(str(tmp_path / "work"))
    model_config = config_lib.resolve(c).model
    path = str(tmp_path / "base.npz")
    pretrain.write_params_file(path, numpy_params(model_config))
    c.model.overrides.hidden_size = 64
    other = config_lib.resolve(c).model
    with pytest.raises(ValueError, match=r"base\.npz: no array .* of shape"):
        pretrain.load_params_file(path, other)


def test_missing_params_file_is_a_config_error(tmp_path):

    c = tiny_run_config(str(tmp_path / "work"), run_dir=str(tmp_path / "run"))
    c.init.source, c.init.path = "params", str(tmp_path / "absent.npz")
    with pytest.raises(ValueError, match="no such params file"):
        config_lib.resolve(c)
