"""Tests for rl_batch.rollout.sampler: cache path vs teacher forcing, EOS, limits, buckets, mesh."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.models import sharding
from rl_batch.models import transformer as model
from rl_batch.rollout import sampler as sampler_lib
from rl_batch.rollout.sampler import SamplingConfig

CONFIG = model.get_preset("tiny-1m")
PAD, NO_EOS = 0, CONFIG.vocab_size  # an id outside the vocabulary never stops a row
# Different lengths, so rows are left-padded by different amounts.
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [3], [20, 21, 22, 23, 24]]
# Jitted teacher-forced forward pass (eager op-by-op dispatch is slow).
forward = jax.jit(model.forward, static_argnums=0)


@pytest.fixture(scope="module")
def params():
    return model.init_params(CONFIG, 0)


@pytest.fixture(scope="module")
def sampler():
    return sampler_lib.Sampler(
        CONFIG, eos_id=NO_EOS, pad_id=PAD, max_prompt_len=16, max_new_tokens=16
    )


@pytest.fixture(scope="module")
def small_sampler():
    """Shorter buckets; shared so that its compiled programs are reused across tests."""
    return sampler_lib.Sampler(
        CONFIG, eos_id=NO_EOS, pad_id=PAD, max_prompt_len=8, max_new_tokens=8
    )


def teacher_forced_logprobs(params, out, temperature):
    """log p(response token r) from one full forward pass over [prompt | response]."""
    tokens_bt = np.concatenate([out.prompt_tokens, out.response_tokens], axis=1)
    mask_bt = np.concatenate([out.prompt_mask, out.response_mask], axis=1)
    logits_btv = forward(CONFIG, params, jnp.asarray(tokens_bt), input_mask_bt=mask_bt)
    p = out.prompt_tokens.shape[1]
    # The logits at slot P-1+r predict response token r.
    logits_brv = np.asarray(logits_btv[:, p - 1 : -1]) / temperature
    logprobs_br = np.asarray(model.token_logprobs(logits_brv, out.response_tokens))
    return logits_brv, logprobs_br


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_logprobs_match_teacher_forced_forward(params, sampler):
    out = sampler(params, PROMPTS, rng=jax.random.key(1), sampling=SamplingConfig(temperature=0.7))
    assert out.response_tokens.shape[0] == len(PROMPTS)
    assert out.response_mask.all() and (out.lengths == 16).all()
    _, expected_br = teacher_forced_logprobs(params, out, temperature=0.7)
    np.testing.assert_allclose(out.response_logprobs, expected_br, atol=1e-5, rtol=0)
    assert np.all(out.response_logprobs < 0)


def test_padded_rows_match_unpadded_single_runs(params, sampler):
    out = sampler(params, PROMPTS, rng=jax.random.key(2), sampling=SamplingConfig(temperature=1.0))
    # Each row as [prompt | response] starting at slot 0 (no left padding); trailing pad
    # cannot change earlier logits under the causal mask, so one batch serves all rows.
    rows = [prompt + out.response_tokens[i].tolist() for i, prompt in enumerate(PROMPTS)]
    width = max(map(len, rows))
    tokens_bt = np.array([row + [PAD] * (width - len(row)) for row in rows])
    logits_btv = forward(CONFIG, params, jnp.asarray(tokens_bt))
    for i, prompt in enumerate(PROMPTS):
        logits_rv = logits_btv[i, len(prompt) - 1 : len(rows[i]) - 1]
        expected_r = model.token_logprobs(logits_rv[None], out.response_tokens[i][None])[0]
        np.testing.assert_allclose(out.response_logprobs[i], expected_r, atol=1e-5, rtol=0)


@pytest.mark.slow  # 8 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_greedy_is_argmax_of_teacher_forced_logits(params, sampler):
    out = sampler(params, PROMPTS, rng=jax.random.key(0), sampling=SamplingConfig(greedy=True))
    logits_brv, expected_br = teacher_forced_logprobs(params, out, temperature=1.0)
    np.testing.assert_array_equal(out.response_tokens, logits_brv.argmax(-1))
    np.testing.assert_allclose(out.response_logprobs, expected_br, atol=1e-5, rtol=0)


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_sequence_stops_at_eos_then_pad_and_masked(params):
    free = sampler_lib.Sampler(
        CONFIG, eos_id=NO_EOS, pad_id=PAD, max_prompt_len=8, max_new_tokens=8
    )
    greedy = SamplingConfig(greedy=True)
    ref = free(params, PROMPTS, rng=jax.random.key(0), sampling=greedy)
    eos = int(ref.response_tokens[0, 2])  # row 0 must stop after 3 tokens (or earlier)
    stopping = sampler_lib.Sampler(
        CONFIG, eos_id=eos, pad_id=PAD, max_prompt_len=8, max_new_tokens=8
    )
    out = stopping(params, PROMPTS, rng=jax.random.key(0), sampling=greedy)
    for i in range(len(PROMPTS)):
        hits = np.flatnonzero(ref.response_tokens[i] == eos)
        n = int(hits[0]) + 1 if hits.size else 8
        assert out.lengths[i] == n
        np.testing.assert_array_equal(out.response_tokens[i, :n], ref.response_tokens[i, :n])
        np.testing.assert_allclose(out.response_logprobs[i, :n], ref.response_logprobs[i, :n])
        assert out.response_mask[i, :n].all() and not out.response_mask[i, n:].any()
        assert (out.response_tokens[i, n:] == PAD).all()
        assert (out.response_logprobs[i, n:] == 0).all()
    assert out.lengths[0] <= 3 and out.response_tokens[0, out.lengths[0] - 1] == eos


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_any_of_several_stop_ids_ends_a_row(params):
    free = sampler_lib.Sampler(
        CONFIG, eos_id=NO_EOS, pad_id=PAD, max_prompt_len=8, max_new_tokens=8
    )
    greedy = SamplingConfig(greedy=True)
    ref = free(params, PROMPTS, rng=jax.random.key(0), sampling=greedy)
    stops = (int(ref.response_tokens[0, 2]), int(ref.response_tokens[1, 4]), NO_EOS)
    stopping = sampler_lib.Sampler(
        CONFIG, eos_id=stops, pad_id=PAD, max_prompt_len=8, max_new_tokens=8
    )
    assert stopping.eos_id == stops[0] and stopping.eos_ids == stops
    out = stopping(params, PROMPTS, rng=jax.random.key(0), sampling=greedy)
    for i in range(len(PROMPTS)):  # each row ends at its first stop id, whichever it is
        hits = np.flatnonzero(np.isin(ref.response_tokens[i], stops))
        n = int(hits[0]) + 1 if hits.size else 8
        assert out.lengths[i] == n, i
        np.testing.assert_array_equal(out.response_tokens[i, :n], ref.response_tokens[i, :n])
    assert out.lengths[0] <= 3 and out.lengths[1] <= 5
    assert sampler_lib.eos_ids_of(7) == (7,) and sampler_lib.eos_ids_of([7, 3, 7]) == (7, 3)
    with pytest.raises(ValueError, match="at least one end-of-sequence id"):
        sampler_lib.eos_ids_of(())


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_loop_stops_when_every_row_is_done(params):
    prompt, greedy = [PROMPTS[1]], SamplingConfig(greedy=True)
    free = sampler_lib.Sampler(
        CONFIG, eos_id=NO_EOS, pad_id=PAD, max_prompt_len=8, max_new_tokens=8
    )
    first = int(free(params, prompt, rng=jax.random.key(0), sampling=greedy).response_tokens[0, 0])
    assert free.last_stats["decode_steps"] == 7  # no EOS: runs to max_new_tokens
    stopping = sampler_lib.Sampler(
        CONFIG, eos_id=first, pad_id=PAD, max_prompt_len=8, max_new_tokens=8
    )
    out = stopping(params, prompt, rng=jax.random.key(0), sampling=greedy)
    assert out.lengths.tolist() == [1] and out.response_tokens[0, 0] == first
    assert stopping.last_stats["decode_steps"] == 0  # EOS from prefill: the loop never runs


def test_max_new_tokens_respected_without_recompiling(params, sampler):
    out = sampler(params, PROMPTS, rng=jax.random.key(3), max_new_tokens=5)
    compiled = sampler.num_compilations
    assert out.response_tokens.shape[1] == 8  # response bucket
    assert (out.lengths == 5).all()
    assert out.response_mask[:, :5].all() and not out.response_mask[:, 5:].any()
    assert (out.response_tokens[:, 5:] == PAD).all()
    out7 = sampler(params, PROMPTS, rng=jax.random.key(3), max_new_tokens=7)
    assert (out7.lengths == 7).all()
    # Same rng, same limit bucket: the first 5 tokens agree.
    np.testing.assert_array_equal(out7.response_tokens[:, :5], out.response_tokens[:, :5])
    assert sampler.num_compilations == compiled
    with pytest.raises(ValueError, match="max_new_tokens=17"):
        sampler(params, PROMPTS, rng=jax.random.key(3), max_new_tokens=17)


def test_same_seed_same_samples_different_seed_different(params, sampler):
    a = sampler(params, PROMPTS, rng=jax.random.key(7))
    b = sampler(params, PROMPTS, rng=jax.random.key(7))
    c = sampler(params, PROMPTS, rng=jax.random.key(8))
    np.testing.assert_array_equal(a.response_tokens, b.response_tokens)
    np.testing.assert_array_equal(a.response_logprobs, b.response_logprobs)
    assert (a.response_tokens != c.response_tokens).mean() > 0.5


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_top_k_one_and_tiny_top_p_equal_greedy(params, sampler):
    greedy = sampler(params, PROMPTS, rng=jax.random.key(0), sampling=SamplingConfig(greedy=True))
    top_k = sampler(params, PROMPTS, rng=jax.random.key(5), sampling=SamplingConfig(top_k=1))
    top_p = sampler(params, PROMPTS, rng=jax.random.key(6), sampling=SamplingConfig(top_p=1e-6))
    np.testing.assert_array_equal(top_k.response_tokens, greedy.response_tokens)
    np.testing.assert_array_equal(top_p.response_tokens, greedy.response_tokens)
    # Log-probs are of the unfiltered softmax (temperature 1 here), as for greedy.
    np.testing.assert_allclose(top_k.response_logprobs, greedy.response_logprobs, atol=1e-6)
    assert (greedy.response_logprobs < -0.1).any()  # i.e. not the filtered prob of 1


@pytest.mark.slow  # 3 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_no_recompilation_within_buckets(params, small_sampler):
    s, rng = small_sampler, jax.random.key(0)
    s(params, PROMPTS[:3], rng=rng)  # B bucket 4, P bucket 8
    assert s.last_stats["batch_bucket"] == 4 and s.last_stats["prompt_bucket"] == 8
    compiled = s.num_compilations
    s(params, PROMPTS, rng=rng)  # 4 rows, longest prompt 7
    s(params, [[1] * 8, [2] * 5, [3]], rng=rng, max_new_tokens=6)
    assert s.num_compilations == compiled
    out = s(params, PROMPTS + [[4] * 6], rng=rng)  # B bucket 8: prefill + decode traced
    assert s.num_compilations == compiled + 2
    assert out.response_tokens.shape == (5, 8) and out.prompt_tokens.shape == (5, 8)


def test_bucket_rounding():
    assert [sampler_lib.bucket(n, minimum=8) for n in (1, 8, 9, 17)] == [8, 8, 16, 32]
    assert sampler_lib.bucket(17, minimum=8, cap=20) == 20
    assert [sampler_lib.bucket(n, granule=6) for n in (1, 6, 7)] == [6, 6, 12]


def test_bad_inputs_raise(params, sampler):
    with pytest.raises(ValueError, match="prompt 1 has 0 tokens"):
        sampler(params, [[1], []], rng=jax.random.key(0))
    with pytest.raises(ValueError, match="prompt 0 has 17 tokens"):
        sampler(params, [[1] * 17], rng=jax.random.key(0))
    with pytest.raises(ValueError, match="outside"):
        sampler(params, [[CONFIG.vocab_size]], rng=jax.random.key(0))
    with pytest.raises(ValueError, match="max_seq_len"):
        sampler_lib.Sampler(CONFIG, eos_id=1, pad_id=0, max_prompt_len=200, max_new_tokens=100)


def test_sample_batch_under_user_jit_matches_sampler(params, sampler):
    greedy = SamplingConfig(greedy=True)
    ref = sampler(params, PROMPTS, rng=jax.random.key(0), sampling=greedy)
    tokens_bp, mask_bp = sampler.pad_prompts(PROMPTS, 4, ref.prompt_tokens.shape[1])
    fn = jax.jit(
        functools.partial(
            sampler_lib.sample_batch,
            CONFIG,
            max_new_tokens=16,
            eos_id=NO_EOS,
            pad_id=PAD,
            sampling=greedy,
        )
    )
    out = fn(params, tokens_bp, mask_bp, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out.response_tokens), ref.response_tokens)
    np.testing.assert_array_equal(np.asarray(out.lengths), ref.lengths)
    np.testing.assert_allclose(np.asarray(out.response_logprobs), ref.response_logprobs, atol=1e-6)


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2), (1, 4, 2)])
@pytest.mark.parametrize("sampling", [SamplingConfig(greedy=True), SamplingConfig(top_k=20)])
@pytest.mark.slow  # 31 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_mesh_sharded_batch_matches_single_device(params, mesh_shape, sampling):
    assert len(jax.devices()) == 8, "tests/conftest.py should provide 8 fake CPU devices"
    mesh = sharding.make_mesh(*mesh_shape)
    # EOS inside the vocabulary: shards finish at different steps, each in its own loop.
    kwargs = dict(eos_id=5, pad_id=PAD, max_prompt_len=16, max_new_tokens=16)
    single = sampler_lib.Sampler(CONFIG, **kwargs)
    sharded = sampler_lib.Sampler(CONFIG, mesh=mesh, **kwargs)
    prompts = PROMPTS + [[9, 8, 7], [3] * 12]
    ref = single(params, prompts, rng=jax.random.key(0), sampling=sampling)
    if not sampling.greedy:
        assert len(set(ref.lengths)) > 1, "expected some rows to stop at EOS early"
    sharded_params = jax.device_put(params, sharding.param_shardings(CONFIG, mesh))
    out = sharded(sharded_params, prompts, rng=jax.random.key(0), sampling=sampling)
    assert sharded.last_stats["batch_bucket"] == 8  # a multiple of the data axis
    np.testing.assert_array_equal(out.response_tokens, ref.response_tokens)
    np.testing.assert_array_equal(out.response_mask, ref.response_mask)
    np.testing.assert_allclose(out.response_logprobs, ref.response_logprobs, atol=1e-5)
    assert sharded.last_stats["decode_steps"] == single.last_stats["decode_steps"]


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_row_samples_do_not_depend_on_the_batch_around_them(params, sampler):
    # Row b draws from fold_in(rng, b): adding rows (a bigger batch bucket) leaves it as is.
    few = sampler(params, PROMPTS[:2], rng=jax.random.key(3))
    many = sampler(params, PROMPTS + [[4] * 6] * 4, rng=jax.random.key(3))
    assert few.response_tokens.shape[0] == 2 and many.response_tokens.shape[0] == 8
    np.testing.assert_array_equal(many.response_tokens[:2], few.response_tokens)


@pytest.mark.parametrize(
    "overrides",
    [
        # Qwen2-like: QKV bias, no QK-norm, untied LM head; plus plain multi-head attention.
        dict(qkv_bias=True, qk_norm=False, tie_embeddings=False),
        dict(num_kv_heads=4, rope_theta=1_000_000.0),
    ],
)
@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_cache_path_matches_full_forward_for_config_switches(overrides):
    config = CONFIG.replace(**overrides)
    params = model.init_params(config, 1)
    # Biases start at zero; make them matter.
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (
            x + 0.1 * jax.random.normal(jax.random.key(len(path)), x.shape)
            if "bias" in jax.tree_util.keystr(path)
            else x
        ),
        params,
    )
    s = sampler_lib.Sampler(config, eos_id=NO_EOS, pad_id=PAD, max_prompt_len=8, max_new_tokens=8)
    out = s(params, PROMPTS, rng=jax.random.key(4))
    tokens_bt = np.concatenate([out.prompt_tokens, out.response_tokens], axis=1)
    mask_bt = np.concatenate([out.prompt_mask, out.response_mask], axis=1)
    logits_btv = forward(config, params, jnp.asarray(tokens_bt), input_mask_bt=mask_bt)
    expected_br = model.token_logprobs(logits_btv[:, 7:-1], jnp.asarray(out.response_tokens))
    np.testing.assert_allclose(out.response_logprobs, expected_br, atol=1e-5, rtol=0)


def test_value_head_config_is_rejected(params):
    config = CONFIG.replace(head="value")
    s = sampler_lib.Sampler(config, eos_id=1, pad_id=PAD, max_prompt_len=8, max_new_tokens=8)
    with pytest.raises(ValueError, match="LM head"):
        s(model.init_params(config, 0), PROMPTS, rng=jax.random.key(0))


# ------------------------------------------------------------------- sampling methods alone


def test_top_k_filter_hand_values():
    logits = jnp.array([[1.0, 3.0, 2.0, 0.0], [0.0, 0.0, 5.0, -1.0]])
    out = np.asarray(sampler_lib.top_k_filter(logits, 2))
    np.testing.assert_array_equal(np.isfinite(out), [[0, 1, 1, 0], [1, 1, 1, 0]])  # tie kept
    np.testing.assert_array_equal(out[0, 1:3], [3.0, 2.0])


def test_top_p_filter_hand_values():
    # probs 0.5, 0.25, 0.125, 0.125: p=0.6 keeps the top two (mass before 2nd = 0.5 < 0.6).
    logits = jnp.log(jnp.array([[0.125, 0.5, 0.125, 0.25]]))
    keep = np.isfinite(np.asarray(sampler_lib.top_p_filter(logits, 0.6)))
    np.testing.assert_array_equal(keep, [[0, 1, 0, 1]])
    keep = np.isfinite(np.asarray(sampler_lib.top_p_filter(logits, 0.5)))
    np.testing.assert_array_equal(keep, [[0, 1, 0, 0]])


@pytest.mark.parametrize(
    "sampling, expected",
    [
        # softmax([0, 1, 2, 3] / 2)
        (
            SamplingConfig(temperature=2.0),
            np.exp(np.arange(4) / 2) / np.exp(np.arange(4) / 2).sum(),
        ),
        # top-2 of softmax([0, 1, 2, 3]) renormalized
        (SamplingConfig(top_k=2), np.array([0, 0, 1, np.e]) / (1 + np.e)),
        # probs .032 .087 .237 .644: p=0.7 keeps the top two
        (SamplingConfig(top_p=0.7), np.array([0, 0, 1, np.e]) / (1 + np.e)),
    ],
)
def test_sampling_method_frequencies(sampling, expected):
    logits_bv = jnp.tile(jnp.arange(4.0)[None], (40_000, 1))
    tokens_b = np.asarray(sampling.method()(logits_bv, jax.random.split(jax.random.key(0), 40_000)))
    freq = np.bincount(tokens_b, minlength=4) / tokens_b.size
    np.testing.assert_allclose(freq, expected, atol=0.01)


def test_first_argmax_matches_jnp_argmax_with_ties():
    x = jnp.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [-jnp.inf, -1.0, -jnp.inf, -5.0]])
    np.testing.assert_array_equal(sampler_lib.first_argmax(x), [1, 0, 1])
    x = jax.random.normal(jax.random.key(0), (64, 512))
    np.testing.assert_array_equal(sampler_lib.first_argmax(x), jnp.argmax(x, axis=-1))


def test_categorical_matches_jax_categorical_per_row_key():
    # Gumbel-max with each row's own key: the same draw as jax.random.categorical.
    logits_bv = jax.random.normal(jax.random.key(1), (16, 50))
    rng_b = jax.random.split(jax.random.key(2), 16)
    expected = [int(jax.random.categorical(k, row)) for k, row in zip(rng_b, logits_bv)]
    np.testing.assert_array_equal(sampler_lib.categorical(logits_bv, rng_b), expected)


def test_sampling_config_from_dict_and_validation():
    cfg = SamplingConfig.from_dict({"temperature": 0.5, "top_k": 3})
    assert cfg.method() == sampler_lib.TopK(k=3, temperature=0.5)
    assert SamplingConfig.from_dict({"top_p": 0.9, "top_k": 5}).method() == sampler_lib.TopP(
        p=0.9, top_k=5
    )
    assert SamplingConfig(greedy=True, temperature=0.3).logprob_temperature == 1.0
    assert SamplingConfig.from_dict(None) == SamplingConfig()
    with pytest.raises(ValueError, match="topk"):
        SamplingConfig.from_dict({"topk": 3})
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=0.0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0.0)


def test_row_keys_draw_like_the_keys_they_replace(params, sampler):
    # One key per row: row b with key fold_in(rng, b) draws what the single key gives it.
    rng = jax.random.key(11)
    single = sampler(params, PROMPTS, rng=rng)
    rows = sampler_lib.row_keys(rng, len(PROMPTS))
    assert sampler_lib.is_row_keys(rows) and not sampler_lib.is_row_keys(rng)
    per_row = sampler(params, PROMPTS, rng=rows)
    np.testing.assert_array_equal(per_row.response_tokens, single.response_tokens)
    np.testing.assert_array_equal(per_row.response_logprobs, single.response_logprobs)
    # A row keeps its draws wherever it sits and whatever surrounds it.
    moved = sampler(params, [PROMPTS[3], [4] * 6, PROMPTS[1]], rng=rows[jnp.array([3, 0, 1])])
    np.testing.assert_array_equal(moved.response_tokens[0], single.response_tokens[3])
    np.testing.assert_array_equal(moved.response_tokens[2], single.response_tokens[1])
    with pytest.raises(ValueError, match="3 row keys for 4 prompts"):
        sampler(params, PROMPTS, rng=rows[:3])


@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_row_keys_on_a_sharded_batch(params):
    mesh = sharding.make_mesh(2, 2, 2)
    kwargs = dict(eos_id=5, pad_id=PAD, max_prompt_len=16, max_new_tokens=16)
    prompts = PROMPTS + [[9, 8, 7]]  # 5 rows in a bucket of 8: three padding rows
    rows = jax.random.split(jax.random.key(2), len(prompts))
    ref = sampler_lib.Sampler(CONFIG, **kwargs)(params, prompts, rng=rows)
    sharded_params = jax.device_put(params, sharding.param_shardings(CONFIG, mesh))
    out = sampler_lib.Sampler(CONFIG, mesh=mesh, **kwargs)(sharded_params, prompts, rng=rows)
    np.testing.assert_array_equal(out.response_tokens, ref.response_tokens)
    np.testing.assert_allclose(out.response_logprobs, ref.response_logprobs, atol=1e-5)
