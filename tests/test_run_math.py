"""A GRPO run from a local Hugging Face checkpoint on math data files (no downloads)."""

import dataclasses
import json
import os

import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.runs import config as config_lib
from rl_batch.runs import run as run_lib
from rl_batch.tasks import math_data, rewards
from rl_batch.tasks.math_data import DEFAULT_INSTRUCTION, load_math_file
from rl_batch.tasks.rewards import math_score
from rl_batch.tokenizers import HFTokenizer, encode_prompt
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


@pytest.mark.slow  # 15 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_grpo_run_on_math_files_from_an_hf_checkpoint(hf_dir, tmp_path, monkeypatch):
    # Every verdict is marked unverified (even-length responses too big, odd-length ones
    # timed out) to follow the counts into the metrics lines; the rewards are math_score's.
    def marked(response, ground_truth, timeout_s):
        kind = rewards.UNVERIFIED_TIMEOUT if len(response) % 2 else rewards.UNVERIFIED_TOO_BIG
        return dataclasses.replace(math_score(response, ground_truth, timeout_s), unverified=kind)

    monkeypatch.setattr(math_data, "math_score", marked)
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
    for u in updates:
        counted = u["score_unverified_too_big"] + u["score_unverified_timeout"]
        assert counted == u["batch_generated"] == 8
    for e in artifacts.read_metrics(str(tmp_path / "run"), "eval"):
        assert e["eval_score_unverified_too_big"] + e["eval_score_unverified_timeout"] == 4
    config = artifacts.read_json(str(tmp_path / "run" / artifacts.CONFIG_FILE))
    assert config["derived"]["model"]["vocab_size"] == HFTokenizer(hf_dir).vocab_size


def test_missing_math_file_is_named(hf_dir, tmp_path):
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    c.task.name, c.task.kwargs = "math", {}
    c.task.train_file = str(tmp_path / "nope.jsonl")
    c.init.source, c.init.path = "hf", str(hf_dir)
    with pytest.raises(ValueError, match=r"task.train_file='.*nope.jsonl': no such file"):
        run_lib.run(c, progress=False)


def test_too_few_examples_for_the_batch_or_the_evaluation_are_named(hf_dir, tmp_path):
    c = _math_config(hf_dir, tmp_path, _write_gsm8k(tmp_path / "train.jsonl", 16))
    c.task.kwargs = {"max_prompt_len": 96, "max_response_len": 12}
    c.task.validation_file = _write_gsm8k(tmp_path / "val.jsonl", 1)
    c.eval_prompts = 256
    with pytest.raises(ValueError, match=r"val.jsonl \(task.validation_file\) has 1 examples, "
                       r"fewer than eval_prompts=256"):  # fmt: skip
        run_lib.run(c, progress=False)
    assert not os.path.exists(os.path.join(c.run_dir, artifacts.METRICS_FILE))
    c.eval_prompts, c.prompts = 1, 32
    with pytest.raises(ValueError, match=r"train.jsonl \(task.train_file\) has 16 examples, fewer"):
        run_lib.run(c, progress=False)
    # An empty file is named by its path.
    open(c.task.train_file, "w").close()
    with pytest.raises(ValueError) as e:
        run_lib.run(c, progress=False)
    assert str(e.value).startswith(f"{c.task.train_file} (task.train_file) has 0 examples")


def test_synthetic_split_sizes_are_checked_at_resolve(tmp_path):
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"), eval_prompts=64)
    with pytest.raises(ValueError, match="task.n_validation has 32 examples, fewer than "):
        config_lib.resolve(c, device_count=1)


def _math_config(hf_dir, tmp_path, train_file, **task_kwargs):
    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    c.task.name, c.task.kwargs = "math", task_kwargs
    c.task.train_file = c.task.validation_file = train_file
    c.init.source, c.init.path = "hf", str(hf_dir)
    c.model.overrides = {}
    c.prompts, c.group_size = 4, 2
    return c


def test_prompt_budget_is_the_samplers(hf_dir, tmp_path):
    """With a run's ``derived.max_prompt_len`` the loader keeps exactly the prompts the
    run's sampler accepts (the same encoding, BOS and chat template included)."""
    questions = ["What is 1+1?", "What is 12+1? Think.", "What is 1+1? " * 8]
    path = tmp_path / "train.jsonl"
    path.write_text(
        "".join(json.dumps({"question": q, "answer": "#### 2"}) + "\n" for q in questions)
    )
    tokenizer = HFTokenizer(hf_dir)
    examples = load_math_file(path, "auto", tokenizer=tokenizer)
    lengths = [len(encode_prompt(tokenizer, e.prompt)) for e in examples]
    assert lengths[0] < lengths[1] < lengths[2]
    # A task budget that the second prompt meets exactly and the third exceeds.
    c = config_lib.resolve(
        _math_config(
            hf_dir, tmp_path, str(path), max_prompt_len=lengths[1] - 1, max_response_len=12
        )
    )
    assert c.max_prompt_len == lengths[1]
    sampler = config_lib.make_sampler(c, tokenizer)
    kept = load_math_file(
        path,
        c.inputs.task.format,
        tokenizer=tokenizer,
        max_prompt_tokens=c.max_prompt_len,
        drop_long_prompts=True,
    )
    assert [e.meta["line"] for e in kept] == [1, 2]
    for example in kept:
        sampler._validate([encode_prompt(tokenizer, example.prompt)], 1)
    with pytest.raises(ValueError, match=f"prompt 0 has {lengths[2]} tokens"):
        sampler._validate([encode_prompt(tokenizer, examples[2].prompt)], 1)
    with pytest.raises(ValueError, match=f"train.jsonl:3: prompt has {lengths[2]} tokens"):
        load_math_file(path, tokenizer=tokenizer, max_prompt_tokens=c.max_prompt_len)


def test_over_long_math_prompt_fails_at_load_time(hf_dir, tmp_path):
    train = _write_gsm8k(tmp_path / "train.jsonl", 16)
    with open(train, "a") as f:  # line 17
        f.write(json.dumps({"question": "step " * 200, "answer": "#### 1"}) + "\n")
    c = config_lib.resolve(
        _math_config(hf_dir, tmp_path, train, max_prompt_len=96, max_response_len=12)
    )
    with pytest.raises(
        ValueError, match=r"train\.jsonl:17: prompt has \d+ tokens, over the limit of 97"
    ):
        run_lib.load_task_data(c, HFTokenizer(hf_dir))
    # With task.drop_long_prompts the over-long prompt is dropped (with a warning).
    c = _math_config(hf_dir, tmp_path, train, max_prompt_len=96, max_response_len=12)
    c.task.drop_long_prompts = True
    kept, _ = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert len(kept) == 16


def test_instruction_and_system_prompt_reach_the_prompts(hf_dir, tmp_path):
    train = _write_gsm8k(tmp_path / "train.jsonl", 16)
    c = _math_config(hf_dir, tmp_path, train, max_prompt_len=96, max_response_len=12)
    default, _ = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert DEFAULT_INSTRUCTION in default[0]["prompt"]
    c.task.instruction, c.task.system_prompt = "Answer briefly.", "You are terse."
    ours, _ = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert "Answer briefly." in ours[0]["prompt"] and "You are terse." in ours[0]["prompt"]
    assert DEFAULT_INSTRUCTION not in ours[0]["prompt"]


def test_chat_template_kwargs_reach_the_prompts(tmp_path):
    hf_dir = make_tiny_hf_dir(tmp_path / "qwen3-thinking")
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
        "{% endif %}{% endif %}"
    )
    (hf_dir / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    train = _write_gsm8k(tmp_path / "train.jsonl", 16)
    c = _math_config(hf_dir, tmp_path, train, max_prompt_len=96, max_response_len=12)
    default, _ = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert "<think>" not in default[0]["prompt"]
    c.task.chat_template_kwargs = {"enable_thinking": False}
    ours, _ = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert ours[0]["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    bad = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    bad.task.chat_template_kwargs = {"enable_thinking": False}
    with pytest.raises(ValueError, match="task 'addition' renders no chat template"):
        config_lib.resolve(bad, device_count=1)


def _questions(examples):
    return [ex["meta"]["messages"][-1]["content"].split("?")[0] for ex in examples]


def test_eval_fraction_holds_out_part_of_the_train_file(hf_dir, tmp_path):
    train = _write_gsm8k(tmp_path / "train.jsonl", 20)
    c = _math_config(hf_dir, tmp_path, train, max_prompt_len=96, max_response_len=12)
    c.task.validation_file, c.task.eval_fraction, c.eval_prompts = "", 0.25, 4
    tr, val = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert len(tr) == 15 and len(val) == 5
    everything = [f"What is {i}+1" for i in range(20)]
    assert not set(_questions(tr)) & set(_questions(val))
    assert sorted(_questions(tr) + _questions(val)) == sorted(everything)
    assert _questions(tr) == [q for q in everything if q in _questions(tr)]  # file order
    again = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert again == (tr, val)  # the seed fixes the split
    c.task.split_seed = 1
    _, other = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert set(_questions(other)) != set(_questions(val))
    # Too small a hold-out for the evaluation is named as such.
    c.eval_prompts = 6
    with pytest.raises(
        ValueError, match=r"eval_fraction=0.25 of .*train.jsonl \(task.train_file\) has 5 "
    ):
        run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"task.eval_fraction": 1.5}, r"task.eval_fraction=1.5: must be in \[0, 1\)"),
        (
            {"task.eval_fraction": 0.2},
            r"task.eval_fraction=0.2 and task.validation_file=.*: set one",
        ),
        ({"task.validation_file": ""}, r"task.validation_file='': no such file \(or hold out"),
        ({"task.split_seed": -1}, r"task.split_seed=-1: must be an int >= 0"),
    ],
)
def test_bad_data_split_settings_are_one_line_errors(hf_dir, tmp_path, changes, message):
    train = _write_gsm8k(tmp_path / "train.jsonl", 20)
    c = _math_config(hf_dir, tmp_path, train, max_prompt_len=96, max_response_len=12)
    for key, value in changes.items():
        c.task[key.split(".")[1]] = value
    with pytest.raises(ValueError, match=message) as e:
        config_lib.resolve(c, device_count=1)
    assert "\n" not in str(e.value)
    synthetic = tiny_run_config(str(tmp_path / "work"), "", **{"task.eval_fraction": 0.1})
    with pytest.raises(ValueError, match="has its own validation split"):
        config_lib.resolve(synthetic, device_count=1)


def test_validation_rows_of_a_file_are_shuffled_with_a_fixed_seed(hf_dir, tmp_path):
    train = _write_gsm8k(tmp_path / "train.jsonl", 16)
    c = _math_config(hf_dir, tmp_path, train, max_prompt_len=96, max_response_len=12)
    c.task.validation_file = _write_gsm8k(tmp_path / "val.jsonl", 20, start=100)
    _, val = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    in_file = [f"What is {i}+1" for i in range(100, 120)]
    assert sorted(_questions(val)) == sorted(in_file) and _questions(val) != in_file
    _, again = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert again == val
    c.task.split_seed = 3
    _, other = run_lib.load_task_data(config_lib.resolve(c), HFTokenizer(hf_dir))
    assert _questions(other)[:4] != _questions(val)[:4]  # another first eval_prompts


@pytest.mark.slow  # 20 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_update_compiles_once_over_prompts_of_varying_length(hf_dir, tmp_path, monkeypatch):
    """The sampler buckets each call's prompts to a power of two of the longest, so the
    width moves with the data; the learner's batches are padded to the run's longest
    prompt (``rollout.pad_prompts``), so the update compiles once (here: three prompts,
    one per step, in three different buckets)."""
    from rl_batch.algorithms import grpo
    from rl_batch.models import flops
    from rl_batch.rollout import groups as rollout

    def write(path, repeats):
        with open(path, "w") as f:
            for n in repeats:
                f.write(json.dumps({"question": "What is " + "1+" * n + "1?", "answer": "#### 2"}))
                f.write("\n")
        return str(path)

    c = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    c.task.name = "math"
    c.task.kwargs = {"max_prompt_len": 160, "max_response_len": 8}
    c.task.train_file = write(tmp_path / "train.jsonl", [1, 12, 40])
    c.task.validation_file = write(tmp_path / "val.jsonl", [1, 2])
    c.init.source, c.init.path = "hf", str(hf_dir)
    c.model.overrides = {}
    c.prompts, c.group_size = 1, 8  # one prompt per step (8 rows: one per fake device)
    c.budget_responses, c.eval_every_responses = 24, 10**6
    c.eval_prompts, c.eval_k = 2, 1
    updates, widths = [], []
    make_update_fn, pad_prompts = grpo.make_update_fn, rollout.pad_prompts

    def spy_update(*args, **kwargs):
        updates.append(make_update_fn(*args, **kwargs))
        return updates[-1]

    def spy_pad(ro, prompt_len):
        widths.append(ro.samples.prompt_tokens.shape[1])
        padded = pad_prompts(ro, prompt_len)
        assert padded.samples.prompt_tokens.shape[1] == prompt_len == 161
        return padded

    monkeypatch.setattr(grpo, "make_update_fn", spy_update)
    monkeypatch.setattr(rollout, "pad_prompts", spy_pad)
    assert run_lib.run(c, progress=False)["status"] == "finished"
    assert len(artifacts.read_metrics(str(tmp_path / "run"), "update")) == 3
    assert len(set(widths)) >= 2, widths  # the sampler's prompt widths did vary
    assert len(updates) == 1 and flops.jit_cache_size(updates[0]) == 1


@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_padded_prompts_give_the_same_update(tmp_path):
    """Left-padding the prompts (masked) leaves the GRPO update unchanged."""
    import jax

    from rl_batch.models import sharding
    from rl_batch.models import transformer as model_lib
    from rl_batch.rollout import groups as rollout
    from rl_batch.rollout.sampler import SampleOutput
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import run as run_lib

    spec = config_lib.resolve(tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run")))
    c, mc = spec.inputs, spec.model
    rng = np.random.default_rng(0)
    b, p, r = c.prompts * c.group_size, 5, 6
    prompt_mask = np.ones((b, p), bool)
    prompt_mask[::2, :2] = False  # some prompts already left-padded
    response_mask = np.arange(r)[None, :] < rng.integers(1, r + 1, size=(b, 1))
    samples = SampleOutput(
        prompt_tokens=rng.integers(3, mc.vocab_size, size=(b, p)).astype(np.int32) * prompt_mask,
        prompt_mask=prompt_mask,
        response_tokens=rng.integers(3, mc.vocab_size, size=(b, r)).astype(np.int32)
        * response_mask,
        response_mask=response_mask,
        response_logprobs=np.where(response_mask, -rng.random((b, r)), 0.0).astype(np.float32),
        lengths=response_mask.sum(1),
    )
    ro = rollout.Rollout(
        examples=[{}] * c.prompts,
        samples=samples,
        rewards_pg=rng.random((c.prompts, c.group_size)).astype(np.float32),
        time_generate_s=0.0,
        time_score_s=0.0,
        gen_tokens=int(response_mask.sum()),
    )
    keep = np.ones(c.prompts, bool)
    params = jax.device_get(model_lib.init_params(mc, jax.random.key(0)))  # updates donate
    mesh = sharding.make_mesh(1, 1, 1, devices=jax.devices()[:1])
    outs = []
    for prompt_len in (p, 12):
        algo = run_lib.make_algorithm(spec, mesh)
        algo.prompt_len = prompt_len
        batch = algo.make_batch(ro, keep)
        assert batch.prompt_tokens.shape == (b, prompt_len)
        state, metrics = algo.update_fn(algo.init_state(params), batch, jax.random.key(1))
        outs.append((jax.device_get(state.params), jax.device_get(metrics)))
    (params_a, metrics_a), (params_b, metrics_b) = outs
    np.testing.assert_allclose(metrics_a["loss"], metrics_b["loss"], rtol=1e-5, atol=1e-7)
    for x, y in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
