"""Checkpoint round trip, mismatch errors, damaged steps and their fallback."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_batch.models import transformer as model
from rl_batch.runs.checkpoint import CheckpointDamagedError, Checkpointer, CheckpointMismatchError

SMALL = model.get_preset("tiny-1m", num_layers=2, hidden_size=32, intermediate_size=64)


def _tree(config, seed=0):
    params = model.init_params(config, seed)
    opt_state = optax.adamw(1e-3).init(params)
    return {"params": params, "opt_state": opt_state, "step": jnp.int32(7)}


@pytest.mark.slow  # 8 s in the fast tier at b3308b3 (2 cores, load 2-5)
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


@pytest.mark.slow  # 7 s in the fast tier at b3308b3 (2 cores, load 2-5)
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


def _three_steps(tmp_path):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), max_to_keep=3)
    trees = [_tree(SMALL, seed=s) for s in (1, 2, 3)]
    for step, tree in zip((1, 2, 3), trees):
        ckpt.save(step, tree, {"step": step})
    return ckpt, trees


def _assert_restores_step(ckpt, trees, step):
    restored, meta = ckpt.restore(_tree(SMALL))
    assert meta == {"step": step}
    for a, b in zip(jax.tree.leaves(trees[step - 1]), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unreadable_latest_metadata_falls_back_to_the_previous_step(tmp_path, caplog):
    ckpt, trees = _three_steps(tmp_path)
    (tmp_path / "ckpt" / "3" / "meta" / "metadata").write_text("{garbage")
    with caplog.at_level("WARNING"):
        _assert_restores_step(ckpt, trees, 2)
    assert "ckpt/3 cannot be read" in caplog.text and "falling back to step 2" in caplog.text
    with pytest.raises(CheckpointDamagedError, match="ckpt/3 cannot be read"):
        ckpt.restore(_tree(SMALL), step=3)  # a step asked for by number does not fall back


def test_arrays_that_do_not_match_their_checksums_fall_back(tmp_path, caplog):
    ckpt, trees = _three_steps(tmp_path)
    path = tmp_path / "ckpt" / "3" / "meta" / "metadata"
    meta = json.loads(path.read_text())
    name = sorted(meta["checksums"])[0]
    meta["checksums"][name] ^= 1  # as if the stored array had changed since it was saved
    path.write_text(json.dumps(meta))
    with caplog.at_level("WARNING"):
        _assert_restores_step(ckpt, trees, 2)
    assert f"1 array(s) do not match their checksums ({name})" in caplog.text


def test_flipped_bytes_in_the_latest_arrays_fall_back(tmp_path, caplog):
    ckpt, trees = _three_steps(tmp_path)
    files = [p for p in (tmp_path / "ckpt" / "3" / "state").rglob("*") if p.is_file()]
    data = max(files, key=lambda p: p.stat().st_size)  # the array data
    raw = bytearray(data.read_bytes())
    for i in range(len(raw) // 3, len(raw) // 3 + 64):
        raw[i] ^= 0xFF
    data.write_bytes(bytes(raw))
    with caplog.at_level("WARNING"):
        _assert_restores_step(ckpt, trees, 2)
    assert "ckpt/3" in caplog.text and "falling back to step 2" in caplog.text


def test_every_step_damaged_is_an_error_naming_the_last(tmp_path):
    ckpt, _ = _three_steps(tmp_path)
    for step in (1, 2, 3):
        (tmp_path / "ckpt" / str(step) / "meta" / "metadata").write_text("{garbage")
    with pytest.raises(CheckpointDamagedError, match="ckpt/1 cannot be read"):
        ckpt.restore(_tree(SMALL))
