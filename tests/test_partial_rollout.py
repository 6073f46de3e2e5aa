"""Partial rollout: responses continued across iterations equal uninterrupted ones."""

import jax
import numpy as np
import pytest

from rl_batch import artifacts
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import partial as partial_rollout
from rl_batch.rollout import sources as rollout_source
from rl_batch.rollout.sampler import Sampler, SamplingConfig
from rl_batch.runs import run as run_lib
from rl_batch.tasks import get_task
from rl_batch.tokenizers import CharTokenizer, encode_prompt
from tests.run_fixtures import TINY_MODEL, tiny_run_config

TOKENIZER = CharTokenizer()
CONFIG = model_lib.get_preset("tiny-1m", vocab_size=TOKENIZER.vocab_size, **TINY_MODEL)
EXAMPLES = [{"prompt": "12+34=", "answer": "640"}, {"prompt": "7+8=", "answer": "51"}]
NO_EOS = CONFIG.vocab_size  # an id the model never emits: rows run to max_new_tokens


def _groups(group_size=2):
    return [partial_rollout.new_group(TOKENIZER, ex, group_size, step=0) for ex in EXAMPLES]


@pytest.mark.slow  # 7 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_greedy_continuation_equals_one_uninterrupted_generation():
    params = model_lib.init_params(CONFIG, 0)
    greedy = SamplingConfig(greedy=True)
    whole = Sampler(CONFIG, eos_id=NO_EOS, pad_id=0, max_prompt_len=8, max_new_tokens=6)
    prompts = [encode_prompt(TOKENIZER, ex["prompt"]) for ex in EXAMPLES]
    ref = whole(params, prompts, rng=jax.random.key(0), sampling=greedy)

    step = Sampler(CONFIG, eos_id=NO_EOS, pad_id=0, max_prompt_len=14, max_new_tokens=2)
    groups = _groups(group_size=1)
    kwargs = dict(eos_id=NO_EOS, max_new_tokens=6, tokens_per_iter=2, sampling=greedy)
    for i in range(3):
        assert not any(g.complete for g in groups)
        work = partial_rollout.advance(step, params, groups, rng=jax.random.key(i), **kwargs)
        assert work.gen_tokens == 2 * len(groups)  # two more tokens per unfinished response
    assert all(g.complete for g in groups)
    for row, g in enumerate(groups):
        assert g.tokens[0] == ref.response_tokens[row, :6].tolist()
        np.testing.assert_allclose(g.logprobs[0], ref.response_logprobs[row, :6], atol=1e-5)


# FLOPs of one token of CONFIG over s slots (rl_batch.models.flops): 2 x matmul weights (a layer's
# q, k, v, o = 32x32, 32x16, 32x16, 32x32 and MLP 3 x 32x64 = 9216, the LM head 32 x 55 =
# 1760) plus attention 4 x L=1 x s x N=2 x H=16.
def _flops_per_token(s):
    return 2 * (9216 + 1760) + 4 * 1 * s * 2 * 16


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_advance_counts_each_token_once_and_the_re_prefill_as_prefill():
    params = model_lib.init_params(CONFIG, 0)
    step = Sampler(CONFIG, eos_id=NO_EOS, pad_id=0, max_prompt_len=14, max_new_tokens=2)
    groups = _groups(group_size=1)  # prompts of 7 ("<bos>12+34=") and 5 ("<bos>7+8=") tokens
    assert [len(g.prompt_ids) for g in groups] == [7, 5]
    kwargs = dict(eos_id=NO_EOS, max_new_tokens=6, tokens_per_iter=2, sampling=SamplingConfig())
    # Each call: 2 rows x 2 new tokens; the prefill is each prompt plus the tokens carried
    # in (0, 2, 4), over the prompt bucket (8, then 16 capped at 14); decoding attends
    # over the prompt bucket + 2 response slots.
    expected = [
        (12, 12 * _flops_per_token(8) + 4 * _flops_per_token(10)),  # 368640
        (16, 16 * _flops_per_token(14) + 4 * _flops_per_token(16)),  # 475904
        (20, 20 * _flops_per_token(14) + 4 * _flops_per_token(16)),  # 570880
    ]
    for i, (prefill, gen_flops) in enumerate(expected):
        work = partial_rollout.advance(step, params, groups, rng=jax.random.key(i), **kwargs)
        assert (work.gen_tokens, work.prefill_tokens) == (4, prefill)
        assert work.gen_flops == gen_flops
    assert [368640, 475904, 570880] == [f for _, f in expected]
    # Every response token was counted once: 12 in all, the two 6-token responses.
    assert [len(g.tokens[0]) for g in groups] == [6, 6]
    assert partial_rollout.advance(step, params, groups, rng=jax.random.key(3), **kwargs) == (
        partial_rollout.Advanced()
    )


def test_batch_keeps_fixed_shapes_and_trains_only_finished_groups():
    params = model_lib.init_params(CONFIG, 0)
    step = Sampler(CONFIG, eos_id=NO_EOS, pad_id=0, max_prompt_len=14, max_new_tokens=3)
    groups = _groups()
    groups[1].done = [True, True]  # pretend the second group ended earlier
    # "7+8=" -> 15, written reversed as "510": ids 8, 4, 3 then EOS (2); and a wrong "2".
    groups[1].tokens = [[8, 4, 3, 2], [5, 2]]
    groups[1].logprobs = [[-0.1, -0.2, -0.3, -0.4], [-0.4, -0.5]]
    kwargs = dict(eos_id=NO_EOS, max_new_tokens=6, tokens_per_iter=3)
    partial_rollout.advance(
        step, params, groups, rng=jax.random.key(0), **kwargs, sampling=SamplingConfig()
    )
    ro = partial_rollout.to_rollout(
        groups, get_task("addition", n_digits=2), TOKENIZER, prompt_len=8, response_len=8, pad_id=0
    )
    assert ro.complete_p.tolist() == [False, True]
    assert ro.samples.response_tokens.shape == (4, 8) and ro.samples.prompt_tokens.shape == (4, 8)
    assert ro.samples.lengths.tolist() == [3, 3, 4, 2]
    np.testing.assert_allclose(ro.samples.response_logprobs[3, :2], [-0.4, -0.5])
    assert ro.samples.prompt_mask[2].sum() == len(encode_prompt(TOKENIZER, "7+8="))
    assert ro.rewards_pg.tolist() == [[0.0, 0.0], [1.0, 0.0]]  # unfinished: not scored


@pytest.mark.slow  # 9 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_run_with_partial_rollout(tmp_path):
    config = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    config.partial_rollout.enabled = True
    config.partial_rollout.tokens_per_iter = 2  # responses of up to 4 tokens: 2 iterations
    summary = run_lib.run(config, progress=False)
    assert summary["status"] == "finished" and summary["responses_cum"] == 64
    updates = artifacts.read_metrics(str(tmp_path / "run"), "update")
    assert all(u["batch_responses"] == 16 for u in updates)
    assert updates[-1]["responses_generated_cum"] == 64


class _NoEosTokenizer(CharTokenizer):
    """The character tokenizer with an EOS the model never emits: every response is
    ``max_new_tokens`` long, so the tokens of each iteration can be counted by hand."""

    eos_id = NO_EOS


@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_run_counts_each_generated_token_once(tmp_path, monkeypatch):
    from rl_batch.runs import config as config_lib

    monkeypatch.setattr(config_lib, "make_tokenizer", lambda c: _NoEosTokenizer())
    config = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    config.partial_rollout.enabled = True
    config.partial_rollout.tokens_per_iter = 2
    summary = run_lib.run(config, progress=False)
    updates = artifacts.read_metrics(str(tmp_path / "run"), "update")

    # Responses are 4 tokens (max_new_tokens), 2 per iteration: iteration 2k + 1 starts 4
    # new groups (4 x 4 rows x 2 tokens = 32 tokens, nothing finishes), iteration 2k + 2
    # continues them (32 more tokens) and trains on them. 64 responses: 4 updates, 8
    # iterations, 256 tokens: each update generated 32 (not the 64 its batch holds).
    c = config_lib.resolve(config)
    assert (c.max_new_tokens, len(updates)) == (4, 4)
    for u in updates:
        assert (u["gen_tokens"], u["batch_generated"], u["response_len_mean"]) == (32, 16, 4.0)

    # The prompts of update k: positions 4k .. 4k + 3 of the training order.
    train, _ = run_lib.load_task_data(c, _NoEosTokenizer())
    lengths = [
        [len(encode_prompt(TOKENIZER, train[int(i)]["prompt"])) for i in order]
        for order in (
            rollout_source.training_order(len(train), c.inputs.seed, 4 * k, 4) for k in range(4)
        )
    ]
    max_prompt = c.max_prompt_len + 4  # the partial sampler's largest prompt bucket

    def iteration(prompt_lens, carried):
        """(prompt bucket, generation FLOPs) of 16 rows carrying ``carried`` tokens each."""
        p = min(max(8, 1 << (max(prompt_lens) + carried - 1).bit_length()), max_prompt)
        prefill = 4 * sum(n + carried for n in prompt_lens)
        return p, prefill * _flops_per_token(p) + 32 * _flops_per_token(p + 2)

    timed_tokens, timed_flops, buckets = 0, 0.0, set()
    for k, prompt_lens in enumerate(lengths):
        for carried in (0, 2):
            p, gen_flops = iteration(prompt_lens, carried)
            if p in buckets:  # (an iteration that compiles a new bucket is not timed)
                timed_tokens, timed_flops = timed_tokens + 32, timed_flops + gen_flops
            buckets.add(p)
        u = updates[k]
        if u["time_generate_s"] > 0:
            assert u["gen_flops_per_s"] * u["time_generate_s"] == pytest.approx(gen_flops)
    assert any(u["time_generate_s"] > 0 for u in updates)
    # The run's throughput counts the timed iterations' tokens once each.
    assert 0 < timed_tokens <= 256
    time_generate = summary["time_generate_s"]
    assert summary["gen_tokens_per_s"] * time_generate == pytest.approx(timed_tokens)
    assert summary["gen_flops_per_s"] * time_generate == pytest.approx(timed_flops)


def test_partial_and_async_rollout_are_exclusive(tmp_path):
    from rl_batch.runs import config as config_lib

    config = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    config.partial_rollout.enabled = config.async_rollout.enabled = True
    with pytest.raises(ValueError, match="cannot both be enabled"):
        config_lib.resolve(config, 1)
