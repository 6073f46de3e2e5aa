"""Checkpoint round trip and mismatch errors."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_batch import model
from rl_batch.checkpoint import Checkpointer, CheckpointMismatchError

SMALL = model.get_preset("tiny-1m", num_layers=2, hidden_size=32, intermediate_size=64)


def _tree(config, seed=0):
    params = model.init_params(config, seed)
    opt_state = optax.adamw(1e-3).init(params)
    return {"params": params, "opt_state": opt_state, "step": jnp.int32(7)}


def test_round_trip_restores_arrays_and_meta(tmp_path):
    tree = _tree(SMALL)
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(7, tree, {"responses_cum": 1024, "data_position": 64})
    restored, meta = ckpt.restore(_tree(SMALL, seed=1))
    assert meta == {"responses_cum": 1024, "data_position": 64}
    assert ckpt.latest_step() == 7
    for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_keeps_only_the_latest_steps(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=2)
    tree = _tree(SMALL)
    for step in (1, 2, 3):
        ckpt.save(step, tree, {"step": step})
    assert ckpt.latest_step() == 3
    _, meta = ckpt.restore(tree, step=2)
    assert meta == {"step": 2}
    assert ckpt.all_steps() == [2, 3]


def test_shape_mismatch_names_the_parameter(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    ckpt.save(1, _tree(SMALL), {})
    wider = SMALL.replace(hidden_size=64)
    with pytest.raises(
        CheckpointMismatchError, match=r"embed_vd: checkpoint shape \(64, 32\), expected \(64, 64\)"
    ):
        ckpt.restore(_tree(wider))


def test_empty_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Checkpointer(str(tmp_path / "none")).restore(_tree(SMALL))
