"""Common random numbers (``rollout_keys="prompt"``): a prompt's responses draw the same
random numbers in every batch shape, and the analysis pairs such configurations by seed."""

import jax
import numpy as np
import pytest

from rl_batch.analysis import time_to_target as ttt
from rl_batch.models import transformer as model
from rl_batch.rollout import groups as rollout_lib
from rl_batch.rollout import sampler as sampler_lib
from rl_batch.rollout import sources as rollout_source

CONFIG = model.get_preset("tiny-1m")
PROMPTS = [[5, 6, 7], [8, 9, 10, 11], [3], [20, 21, 22, 23, 24], [4, 4], [7, 8, 9]]


def _data(keys):
    return np.asarray(jax.random.key_data(keys))


def test_prompt_row_keys_follow_the_prompt_and_member():
    base = jax.random.key(3)
    big = rollout_source.prompt_row_keys(base, position=0, prompts=4, group_size=2)  # [8]
    assert big.shape == (8,)
    # The second half of the 4-prompt batch is a 2-prompt batch drawn at position 2.
    half = rollout_source.prompt_row_keys(base, position=2, prompts=2, group_size=2)
    np.testing.assert_array_equal(_data(big[4:]), _data(half))
    # Prompt-major rows: row p * G + g is fold_in(fold_in(stream, position + p), g).
    stream = jax.random.fold_in(base, rollout_source.PROMPT_KEY_STREAM)
    want = jax.random.fold_in(jax.random.fold_in(stream, 1), 1)
    np.testing.assert_array_equal(_data(big[3]), _data(want))
    # A larger group keeps members 0..G-1 and adds new ones; another seed draws anew.
    wide = rollout_source.prompt_row_keys(base, position=0, prompts=1, group_size=4)
    np.testing.assert_array_equal(_data(wide[:2]), _data(big[:2]))
    other = rollout_source.prompt_row_keys(jax.random.key(4), 0, 4, 2)
    assert not (_data(other) == _data(big)).all(axis=-1).any()


@pytest.mark.slow  # 24 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_prompts_responses_do_not_depend_on_the_batch_shape():
    params = model.init_params(CONFIG, 0)
    sampler = sampler_lib.Sampler(
        CONFIG, eos_id=CONFIG.vocab_size, pad_id=0, max_prompt_len=8, max_new_tokens=8
    )
    base, g = jax.random.key(0), 2
    sampling = sampler_lib.SamplingConfig()

    def responses(position, count, gen_batch=0):
        prompts = [p for p in PROMPTS[position : position + count] for _ in range(g)]
        keys = rollout_source.prompt_row_keys(base, position, count, g)
        out = rollout_lib.generate(
            sampler, params, prompts, rng=keys, sampling=sampling, gen_batch=gen_batch
        )
        return out.response_tokens

    whole = responses(0, 6)  # P = 6 in one batch
    # P = 2 at a time (three rollouts), and P = 6 decoded 4 sequences at a time.
    pieces = np.concatenate([responses(0, 2), responses(2, 2), responses(4, 2)])
    np.testing.assert_array_equal(pieces, whole)
    np.testing.assert_array_equal(responses(0, 6, gen_batch=4), whole)
    assert len({tuple(r) for r in whole}) > 6  # (the draws do differ between rows)


def _runs(prompts, group, rule, seeds, keys):
    key = ttt.Configuration("grpo", prompts, group, rule)
    return [
        ttt.RunTarget(f"r{s}", key, s, 0.5, 100.0, 1.0, 100.0, 2.0, 100.0, 1.0, rollout_keys=keys)
        for s in seeds
    ]


@pytest.mark.parametrize("keys, other_shape_pairs", [("prompt", True), ("rollout", False)])
def test_matched_pairs_follow_the_rollout_keys(keys, other_shape_pairs):
    ref = _runs(8, 8, "sqrt", [0, 1, 2], keys)
    assert ttt.matched_pair(_runs(8, 8, "fixed", [2, 1, 0], keys), ref)  # LR rule alone
    assert ttt.matched_pair(_runs(4, 8, "sqrt", [0, 1, 2], keys), ref) == other_shape_pairs
    assert not ttt.matched_pair(_runs(4, 8, "sqrt", [0, 1, 3], keys), ref)
    # Runs keyed differently do not share their draws.
    other = "rollout" if keys == "prompt" else "prompt"
    assert not ttt.matched_pair(_runs(8, 8, "fixed", [0, 1, 2], other), ref)
