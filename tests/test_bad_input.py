"""Bad input: one clear error each, raised before any compute where possible.

Config-field validation itself is unit-tested in ``tests/test_config.py``; here the same
mistakes go through the command line (non-zero exit, the message, nothing written), and
the inputs only a run meets are tested through ``rl_batch.runs.run.run``: data files, an HF
directory, a run directory being resumed (its config, checkpoints and metrics).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from rl_batch import artifacts
from rl_batch.runs import run as run_lib
from rl_batch.runs.checkpoint import CheckpointMismatchError
from rl_batch.tokenizers import CharTokenizer
from tests.hf_fixtures import make_tiny_hf_dir
from tests.run_fixtures import tiny_run_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ------------------------------------------------------------------------ command line

# (flags, the message expected on stderr). The CLI sees two CPU devices.
CLI_CASES = {
    "negative_lr": (["--config.lr_ref=-0.001"], "lr_ref=-0.001: must be finite and > 0"),
    "zero_lr": (["--config.lr=0.0"], "lr=0.0: must be > 0"),
    "batch_not_divisible": (
        ["--config.prompts=3", "--config.group_size=3"],
        "3 x 3 = 9 is not divisible by the data-parallel size 2",
    ),
    "grpo_group_of_one": (["--config.group_size=1"], "group_size=1: GRPO needs >= 2"),
    "longer_than_context": (
        ["--config.max_new_tokens=300"],
        "response (300) tokens exceed the model context max_seq_len=256",
    ),
    "unknown_task": (["--config.task.name=sudoku"], "task.name='sudoku': known tasks are"),
    "unknown_preset": (["--config.model.preset=gpt-9"], "model.preset='gpt-9': known presets"),
}


@pytest.mark.slow  # 21 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_cli_rejects_bad_configs_before_writing_anything(tmp_path):
    env = dict(
        os.environ,
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=2",
        PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    procs = {}
    for name, (flags, _) in CLI_CASES.items():  # all at once: each is mostly start-up
        cmd = [sys.executable, "-m", "experiments.train", "--quiet"]
        cmd += ["--config=experiments/configs/grpo_cpu.py", f"--config.run_dir={tmp_path / name}"]
        cmd += [f"--config.work_dir={tmp_path / 'work'}", *flags]
        procs[name] = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            pytest.fail(f"{name}: timed out")
        message = CLI_CASES[name][1]
        assert proc.returncode != 0, (name, out)
        assert message in err, (name, err[-2000:])
        assert "invalid config" in err.strip().splitlines()[-1], (name, err[-500:])
        assert not os.path.exists(tmp_path / name), name
    assert not os.path.exists(tmp_path / "work")


# --------------------------------------------------------------------- data and models


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A random tiny Qwen3 checkpoint with a byte-level BPE tokenizer."""
    return make_tiny_hf_dir(tmp_path_factory.mktemp("qwen3-tiny"))


def _write_gsm8k(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"question": f"What is {i}+1?", "answer": f"so #### {i + 1}"}))
            f.write("\n")
    return str(path)


def _math_config(tmp_path, hf_path):
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    c.task.name = "math"
    c.task.kwargs = {"max_prompt_len": 96, "max_response_len": 12}
    c.task.train_file = _write_gsm8k(tmp_path / "train.jsonl", 16)
    c.task.validation_file = _write_gsm8k(tmp_path / "val.jsonl", 8)
    c.init.source, c.init.path = "hf", str(hf_path)
    c.model.overrides = {}
    c.prompts, c.group_size = 4, 2
    return c


def test_malformed_math_data_names_the_file_and_line(hf_dir, tmp_path):
    c = _math_config(tmp_path, hf_dir)
    lines = open(c.task.train_file).read().splitlines()
    lines[6] = lines[6][:20]  # line 7: a record cut in the middle
    lines[9] = json.dumps({"question": "What is 2+2?"})  # line 10: no answer
    with open(c.task.train_file, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"train\.jsonl:7: invalid JSON"):
        run_lib.run(c, progress=False)
    lines[6] = json.dumps({"question": "What is 1+1?", "answer": "#### 2"})
    with open(c.task.train_file, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"train\.jsonl:10: .*fields \['question'\]"):
        run_lib.run(c, progress=False)


def test_hf_directory_without_weights_is_named(hf_dir, tmp_path):
    no_weights = tmp_path / "no-weights"
    shutil.copytree(hf_dir, no_weights)
    os.remove(no_weights / "model.safetensors")
    c = _math_config(tmp_path, no_weights)
    with pytest.raises(FileNotFoundError, match=f"no model.safetensors or .* in {no_weights}"):
        run_lib.run(c, progress=False)


def test_non_utf8_math_data_names_the_file_and_line(hf_dir, tmp_path):
    c = _math_config(tmp_path, hf_dir)
    lines = open(c.task.train_file, "rb").read().splitlines()
    lines[4] = b'{"question": "What is \xff?", "answer": "#### 1"}'  # line 5: a Latin-1 byte
    open(c.task.train_file, "wb").write(b"\n".join(lines) + b"\n")
    with pytest.raises(ValueError, match=r"train\.jsonl:5: not UTF-8 text \(byte b'\\xff'"):
        run_lib.run(c, progress=False)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
@pytest.mark.slow  # 10 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_damaged_safetensors_are_named(hf_dir, tmp_path, damage):
    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    weights = broken / "model.safetensors"
    raw = weights.read_bytes()
    weights.write_bytes(raw[: len(raw) // 2] if damage == "truncated" else b"\x07" * 64)
    c = _math_config(tmp_path, broken)
    message = "truncated safetensors file" if damage == "truncated" else "not a readable"
    with pytest.raises(ValueError, match=f"{weights}: {message}"):
        run_lib.run(c, progress=False)


def test_corrupt_tokenizer_json_is_named(hf_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    path = broken / "tokenizer.json"
    path.write_text(path.read_text()[:100])
    c = _math_config(tmp_path, broken)
    with pytest.raises(ValueError, match=f"{path}: not a readable tokenizer.json"):
        run_lib.run(c, progress=False)


# -------------------------------------------------------------- resuming a run directory


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished one-update run of the tiny model (a checkpoint at step 1)."""
    root = tmp_path_factory.mktemp("finished")
    config = tiny_run_config(
        str(root / "work"), str(root / "run"), budget_responses=16, eval_greedy=False
    )
    assert run_lib.run(config, progress=False)["status"] == "finished"
    return config


def _copy_run(finished_run, tmp_path, **changes):
    """A copy of the finished run's directory and its config with ``changes``."""
    run_dir = str(tmp_path / "run")
    shutil.copytree(finished_run.run_dir, run_dir)
    config = tiny_run_config(
        finished_run.work_dir, run_dir, budget_responses=32, eval_greedy=False, **changes
    )
    return run_dir, config


@pytest.mark.slow  # 41 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_resuming_with_a_changed_model_names_the_difference(finished_run, tmp_path):
    run_dir, config = _copy_run(finished_run, tmp_path)
    config.model.overrides.hidden_size = 48
    with pytest.raises(
        ValueError, match=r"different config \(.*model.overrides.hidden_size: 32 -> 48\)"
    ):
        run_lib.run(config, progress=False)
    # Without the old config.json only the checkpoint can tell: it names the parameter.
    os.remove(os.path.join(run_dir, artifacts.CONFIG_FILE))
    with pytest.raises(CheckpointMismatchError) as info:
        run_lib.run(config, progress=False)
    message = str(info.value)
    assert f"checkpoint {run_dir}/{artifacts.CHECKPOINT_DIR}/1 does not match" in message
    # The parameters come first: the [V, D] embedding has D = 32 on disk.
    v = CharTokenizer().vocab_size
    assert message.splitlines()[1].strip() == (
        f"state/params/embed_vd: checkpoint shape ({v}, 32), expected ({v}, 48)"
    )


def test_corrupt_metrics_line_names_the_file_and_line(finished_run, tmp_path, caplog):
    run_dir, config = _copy_run(finished_run, tmp_path)
    path = os.path.join(run_dir, artifacts.METRICS_FILE)
    intact = open(path).read().splitlines()
    assert len(intact) >= 3
    lines = list(intact)
    lines[1] = lines[1][: len(lines[1]) // 2]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    # The checkpoint carries the lines up to its step: the file is rebuilt, and the
    # warning names the file and the line that was damaged.
    with caplog.at_level("WARNING"):
        run_lib.run(config, progress=False)
    assert f"{path}: 2: malformed JSON line" in caplog.text
    assert "rebuilt from checkpoint 1" in caplog.text
    assert open(path).read().splitlines()[: len(intact)] == intact
    # Read without a checkpoint's copy (an older checkpoint), the bad line is an error.
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=f"{path}:2: malformed JSON line"):
        list(artifacts.iter_jsonl(path))


def test_truncated_config_json_is_named(finished_run, tmp_path):
    run_dir, config = _copy_run(finished_run, tmp_path)
    path = os.path.join(run_dir, artifacts.CONFIG_FILE)
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text[: len(text) // 2])
    with pytest.raises(ValueError, match=f"{path}: malformed JSON"):
        run_lib.run(config, progress=False)
    assert open(path).read() == text[: len(text) // 2]  # left as it was
