"""Partial rollout: responses continued across iterations equal uninterrupted ones."""

import jax
import numpy as np
import pytest

from rl_batch import artifacts, partial_rollout
from rl_batch import model as model_lib
from rl_batch import run as run_lib
from rl_batch.sampler import Sampler, SamplingConfig
from rl_batch.tasks import get_task
from rl_batch.tokenizers import CharTokenizer, encode_prompt
from tests.run_fixtures import TINY_MODEL, tiny_run_config

TOKENIZER = CharTokenizer()
CONFIG = model_lib.get_preset("tiny-1m", vocab_size=TOKENIZER.vocab_size, **TINY_MODEL)
EXAMPLES = [{"prompt": "12+34=", "answer": "640"}, {"prompt": "7+8=", "answer": "51"}]
NO_EOS = CONFIG.vocab_size  # an id the model never emits: rows run to max_new_tokens


def _groups(group_size=2):
    return [partial_rollout.new_group(TOKENIZER, ex, group_size, step=0) for ex in EXAMPLES]


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
        n = partial_rollout.advance(step, params, groups, rng=jax.random.key(i), **kwargs)
        assert n == 2 * len(groups)  # two more tokens for every unfinished response
    assert all(g.complete for g in groups)
    for row, g in enumerate(groups):
        assert g.tokens[0] == ref.response_tokens[row, :6].tolist()
        np.testing.assert_allclose(g.logprobs[0], ref.response_logprobs[row, :6], atol=1e-5)


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


def test_run_with_partial_rollout(tmp_path):
    config = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    config.partial_rollout.enabled = True
    config.partial_rollout.tokens_per_iter = 2  # responses of up to 4 tokens: 2 iterations
    summary = run_lib.run(config, progress=False)
    assert summary["status"] == "finished" and summary["responses_cum"] == 64
    updates = artifacts.read_metrics(str(tmp_path / "run"), "update")
    assert all(u["batch_responses"] == 16 for u in updates)
    assert updates[-1]["responses_generated_cum"] == 64


def test_partial_and_async_rollout_are_exclusive(tmp_path):
    from rl_batch import config as config_lib

    config = tiny_run_config(str(tmp_path / "work"), str(tmp_path / "run"))
    config.partial_rollout.enabled = config.async_rollout.enabled = True
    with pytest.raises(ValueError, match="cannot both be enabled"):
        config_lib.resolve(config, 1)
