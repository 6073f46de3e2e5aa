"""A GRPO run from a local Hugging Face checkpoint on math data files (no downloads)."""

import json

import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch import run as run_lib
from rl_batch.tokenizers import HFTokenizer
from tests.hf_fixtures import make_tiny_hf_dir
from tests.run_fixtures import tiny_run_config


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random tiny Qwen3 checkpoint with a byte-level BPE tokenizer."""
    return make_tiny_hf_dir(tmp_path_factory.mktemp("qwen3-tiny"))


def _write_gsm8k(path, n, start=0):
    with open(path, "w") as f:
        for i in range(start, start + n):
            f.write(json.dumps({"question": f"What is {i}+1?", "answer": f"so #### {i + 1}"}))
            f.write("\n")
    return str(path)


def test_grpo_run_on_math_files_from_an_hf_checkpoint(hf_dir, tmp_path):
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    c.task.name = "math"
    c.task.kwargs = {"max_prompt_len": 96, "max_response_len": 12}
    c.task.train_file = _write_gsm8k(tmp_path / "train.jsonl", 16)
    c.task.validation_file = _write_gsm8k(tmp_path / "val.jsonl", 8, start=100)
    c.init.source, c.init.path = "hf", str(hf_dir)
    c.model.overrides = {}
    c.prompts, c.group_size = 4, 2  # 8 responses: one per fake device
    c.budget_responses, c.eval_every_responses = 16, 16
    c.eval_prompts, c.eval_k = 4, 1
    summary = run_lib.run(c, progress=False)
    assert summary["status"] == "finished"
    updates = artifacts.read_metrics(str(tmp_path / "run"), "update")
    assert len(updates) == 2 and all(np.isfinite(u["loss"]) for u in updates)
    config = artifacts.read_json(str(tmp_path / "run" / artifacts.CONFIG_FILE))
    assert config["derived"]["model"]["vocab_size"] == HFTokenizer(hf_dir).vocab_size


def test_missing_math_file_is_named(hf_dir, tmp_path):
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    c.task.name, c.task.kwargs = "math", {}
    c.task.train_file = str(tmp_path / "nope.jsonl")
    c.init.source, c.init.path = "hf", str(hf_dir)
    with pytest.raises(ValueError, match=r"task.train_file='.*nope.jsonl': no such file"):
        run_lib.run(c, progress=False)
