"""experiments.export_hf / rl_batch.runs.export: a run's policy as a Hugging Face directory."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from rl_batch import artifacts
from rl_batch.models import hf
from rl_batch.models import transformer as model_lib
from rl_batch.runs import config as config_lib
from rl_batch.runs import export
from rl_batch.runs import run as run_lib
from rl_batch.runs.checkpoint import Checkpointer
from tests.run_fixtures import numpy_params, tiny_run_config


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A finished tiny GRPO run (synthetic task, character tokenizer)."""
    root = tmp_path_factory.mktemp("export")
    run_dir = str(root / "run")
    config = tiny_run_config(str(root / "work"), run_dir, budget_responses=16)
    run_lib.run(config, progress=False)
    return run_dir


def _model_config(run_dir):
    c = ConfigDict(artifacts.read_json(os.path.join(run_dir, artifacts.CONFIG_FILE)))
    return config_lib.make_model_config(c)


def _checkpoint_params(run_dir, step=None):
    """The policy params by the full-restore path (independent of the export's)."""
    ckpt = Checkpointer(os.path.join(run_dir, artifacts.CHECKPOINT_DIR))
    try:
        like = model_lib.abstract_params(_model_config(run_dir))
        return jax.tree.map(np.asarray, ckpt.restore_params(like, step)), ckpt.all_steps()
    finally:
        ckpt.close()


def _assert_same_params(got, want):
    flat_got = dict(jax.tree_util.tree_flatten_with_path(got)[0])
    flat_want = dict(jax.tree_util.tree_flatten_with_path(want)[0])
    assert flat_got.keys() == flat_want.keys()
    for path, value in flat_want.items():
        name = jax.tree_util.keystr(path)
        assert np.asarray(flat_got[path]).dtype == np.float32, name
        np.testing.assert_array_equal(np.asarray(flat_got[path]), np.asarray(value), err_msg=name)


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_export_round_trips_exactly(tiny_run, tmp_path):
    out = str(tmp_path / "hf")
    result = export.export_run(tiny_run, out)
    want, steps = _checkpoint_params(tiny_run)
    assert result.step == steps[-1]
    assert result.model_type == "qwen3" and result.dtype == "float32"
    assert result.files == ("config.json", "model.safetensors")
    assert result.tokenizer_source is None
    assert "no Hugging Face tokenizer" in result.describe()
    config, params = hf.load_hf_checkpoint(out, as_numpy=True)
    assert config.vocab_size == _model_config(tiny_run).vocab_size
    _assert_same_params(params, want)


def test_exported_files_are_readable_by_others_as_open_would_write_them(tiny_run, tmp_path):
    # safetensors wrote model.safetensors 0600 (issue 48): every file is 0666 less the umask.
    old = os.umask(0o022)
    try:
        export.export_run(tiny_run, str(tmp_path / "hf"))
    finally:
        os.umask(old)
    modes = {f: os.stat(tmp_path / "hf" / f).st_mode & 0o777 for f in os.listdir(tmp_path / "hf")}
    assert modes == {"config.json": 0o644, "model.safetensors": 0o644}


def test_export_bfloat16(tiny_run, tmp_path):
    out = str(tmp_path / "hf")
    export.export_run(tiny_run, out, dtype="bfloat16")
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["torch_dtype"] == "bfloat16"
    _, params = hf.load_hf_checkpoint(out, as_numpy=True)
    want, _ = _checkpoint_params(tiny_run)
    np.testing.assert_array_equal(
        params["embed_vd"].astype(np.float32),
        want["embed_vd"].astype(params["embed_vd"].dtype).astype(np.float32),
    )


def test_errors_before_any_work(tiny_run, tmp_path):
    out = str(tmp_path / "hf")
    with pytest.raises(export.ExportError, match=r"no step 12345 .*available steps: \[\d"):
        export.export_run(tiny_run, out, step=12345)
    assert not os.path.exists(out)
    with pytest.raises(export.ExportError, match="no config.json"):
        export.export_run(str(tmp_path), out)
    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    shutil.copy(os.path.join(tiny_run, artifacts.CONFIG_FILE), empty_run)
    with pytest.raises(export.ExportError, match="no checkpoint"):
        export.export_run(str(empty_run), out)
    (empty_run / artifacts.CHECKPOINT_DIR).mkdir()
    with pytest.raises(export.ExportError, match="no checkpoint"):
        export.export_run(str(empty_run), out)
    # A sweep point whose checkpoints were removed when it finished: said, with the way out.
    (empty_run / artifacts.CHECKPOINT_DIR / "removed.json").write_text("{}")
    with pytest.raises(export.ExportError, match="removed them when the run finished.*=all"):
        export.export_run(str(empty_run), out)
    os.makedirs(out)
    (tmp_path / "hf" / "keep.txt").write_text("x")
    with pytest.raises(export.ExportError, match="not empty; pass --overwrite"):
        export.export_run(tiny_run, out)
    assert os.listdir(out) == ["keep.txt"]
    result = export.export_run(tiny_run, out, overwrite=True)
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"] == list(result.files)
    with pytest.raises(export.ExportError, match="dtype"):
        export.export_run(tiny_run, str(tmp_path / "other"), dtype="float16")


def test_ppo_checkpoint_exports_the_actor(tiny_run, tmp_path):
    """A PPO-shaped state: the actor is exported, not the critic or the reference."""
    run_dir = tmp_path / "ppo_run"
    run_dir.mkdir()
    shutil.copy(os.path.join(tiny_run, artifacts.CONFIG_FILE), run_dir)
    config = _model_config(tiny_run)
    actor, ref = numpy_params(config, seed=1), numpy_params(config, seed=2)
    state = {
        "actor": {"params": actor, "step": np.int32(3)},
        "critic": {"params": {"value_d": np.ones(config.hidden_size, np.float32)}},
        "ref_params": ref,
    }
    ckpt = Checkpointer(str(run_dir / artifacts.CHECKPOINT_DIR))
    ckpt.save(3, {"state": state}, {"counters": {}})
    ckpt.close()
    out = str(tmp_path / "hf")
    assert export.export_run(str(run_dir), out).step == 3
    _, params = hf.load_hf_checkpoint(out, as_numpy=True)
    _assert_same_params(params, actor)


def test_hf_init_copies_tokenizer_files(tmp_path):
    source, out = tmp_path / "source", tmp_path / "out"
    source.mkdir()
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (source / name).write_text(name)
    (source / "model.safetensors").write_text("weights")
    copied = export.copy_tokenizer_files(str(source), str(out))
    assert copied == ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]
    assert sorted(os.listdir(out)) == sorted(copied)
    assert (out / "tokenizer.json").read_text() == "tokenizer.json"


@pytest.mark.slow  # 20 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_exported_run_loads_in_transformers(tiny_run, tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = str(tmp_path / "hf")
    export.export_run(tiny_run, out)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert type(theirs).__name__ == "Qwen3ForCausalLM"
    config = _model_config(tiny_run)
    params, _ = _checkpoint_params(tiny_run)
    tokens_bt = np.random.RandomState(0).randint(0, config.vocab_size, (3, 10))
    ours = np.asarray(model_lib.forward(config, params, jax.numpy.asarray(tokens_bt)))
    with torch.no_grad():
        logits = theirs(input_ids=torch.tensor(tokens_bt, dtype=torch.long)).logits.numpy()
    diff = float(np.max(np.abs(ours - logits)))
    print(f"exported run fp32 max|dlogit|={diff:.2e}")
    assert diff < 1e-4
