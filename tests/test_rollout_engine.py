"""Continuous batching and blocked decode attention against the static engine / einsum.

The static engine (one batch until every row is done, attention over all S slots) is the
reference: the continuous engine must give each row the same tokens and log-probs for the
same key, whatever slot and step the row lands in, and blocked attention must give the
einsum path's logits.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_batch.models import sharding
from rl_batch.models import transformer as model
from rl_batch.rollout import groups
from rl_batch.rollout import sampler as sampler_lib
from rl_batch.rollout.sampler import SamplingConfig
from tests.run_fixtures import TINY_MODEL

CONFIG = model.get_preset("tiny-1m")
PAD, NO_EOS = 0, CONFIG.vocab_size
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13, 14], [3], [20, 21, 22, 23, 24], [1, 2], [7] * 6]
# Forced per-row lengths with a long tail (max / mean = 30 / 9.8 ~ 3): row 0 ends after
# one token (never takes a slot), row 2 after 30.
LIMITS = [1, 4, 30, 7, 2, 15]


@pytest.fixture(scope="module")
def params():
    return model.init_params(CONFIG, 0)


@pytest.fixture(scope="module")
def sampler():
    return sampler_lib.Sampler(
        CONFIG, eos_id=NO_EOS, pad_id=PAD, max_prompt_len=8, max_new_tokens=32
    )


def assert_same_samples(out, ref, exact=False):
    """The same tokens; log-probs bit for bit when ``exact`` (the continuous engine with
    >= 2 slots against the static engine), else within fp32 rounding (another attention
    algorithm, or one slot: XLA's CPU backend runs M = 1 matmuls with other kernels)."""
    np.testing.assert_array_equal(out.response_tokens, ref.response_tokens)
    np.testing.assert_array_equal(out.response_mask, ref.response_mask)
    np.testing.assert_array_equal(out.lengths, ref.lengths)
    np.testing.assert_array_equal(out.prompt_tokens, ref.prompt_tokens)
    np.testing.assert_array_equal(out.prompt_mask, ref.prompt_mask)
    if exact:
        np.testing.assert_array_equal(out.response_logprobs, ref.response_logprobs)
    else:
        np.testing.assert_allclose(out.response_logprobs, ref.response_logprobs, atol=1e-5, rtol=0)


@pytest.mark.slow  # 7 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_per_row_limits_end_each_row_at_its_own_length(params, sampler):
    out = sampler(params, PROMPTS, rng=jax.random.key(0), max_new_tokens=LIMITS)
    np.testing.assert_array_equal(out.lengths, LIMITS)
    full = sampler(params, PROMPTS, rng=jax.random.key(0), max_new_tokens=30)
    for i, n in enumerate(LIMITS):  # a shorter limit cuts the same response
        np.testing.assert_array_equal(out.response_tokens[i, :n], full.response_tokens[i, :n])
        assert (out.response_tokens[i, n:] == PAD).all() and not out.response_mask[i, n:].any()
    assert sampler.last_stats["decode_steps"] == 29  # the longest row: 30 tokens
    with pytest.raises(ValueError, match="2 max_new_tokens for 6 prompts"):
        sampler(params, PROMPTS, rng=jax.random.key(0), max_new_tokens=[3, 4])
    with pytest.raises(ValueError, match="limit < 1"):
        sampler(params, PROMPTS, rng=jax.random.key(0), max_new_tokens=[0] * 6)


GREEDY, TEMPERATURE = SamplingConfig(greedy=True), SamplingConfig(temperature=1.3, top_k=20)


def slot_schedule(decode_lens, slots, min_slots, per_halving=1):
    """(decode steps, slot-steps) of the continuous engine, simulated in Python: queued
    rows (decode tokens each, in queue order) fill free slots in slot order before each
    step; once no row waits and the next width holds every busy slot, the busy ones move
    to the front of that narrower loop (``slot_widths``, checked by hand below)."""
    widths = sampler_lib.slot_widths(slots, min_slots, per_halving)
    queue, left = list(decode_lens), [0] * slots  # tokens left per slot
    steps = slot_steps = 0
    for i, width in enumerate(widths):
        left = sorted(left, key=lambda x: x == 0)[:width]
        narrower = widths[i + 1] if i + 1 < len(widths) else 0
        while queue or any(left):
            if not queue and narrower and sum(x > 0 for x in left) <= narrower:
                break
            for j in range(width):
                if left[j] == 0 and queue:
                    left[j] = queue.pop(0)
            steps, slot_steps = steps + 1, slot_steps + width
            left = [max(x - 1, 0) for x in left]
    return steps, slot_steps


def test_slot_schedule_by_hand():
    # 3 rows of 5, 1 and 2 decode tokens through 2 slots (no narrower loop: 2 // 2 < 2):
    # steps 1-2 hold rows 0 and 1, row 2 takes row 1's slot at step 2 ... row 0 ends
    # at step 5: 5 steps of 2 slots.
    assert slot_schedule([5, 1, 2], 2, 2) == (5, 10)
    # 4 slots, rows of 8, 1, 1, 1: after step 1 one slot is busy, the loop narrows to
    # 2 slots for 7 steps: 4 + 14 slot-steps instead of 32.
    assert slot_schedule([8, 1, 1, 1], 4, 2) == (8, 18)
    assert slot_schedule([8, 1, 1, 1], 4, 4) == (8, 32)
    # 4 slots with a width of 3 between the halvings: rows of 8, 8, 2, 1 narrow to 3
    # slots after step 1 (3 busy), to 2 after step 2: 4 + 3 + 2 x 6 slot-steps.
    assert slot_schedule([8, 8, 2, 1], 4, 2, 2) == (8, 19)
    assert slot_schedule([8, 8, 2, 1], 4, 2, 1) == (8, 4 * 2 + 2 * 6)


@pytest.mark.parametrize(
    "base,slots,block,per_halving,min_slots",
    [
        (GREEDY, 1, 0, 1, 2),
        (GREEDY, 3, 8, 1, 2),
        (TEMPERATURE, 2, 0, 1, 2),
        (TEMPERATURE, 64, 16, 1, 2),
        (GREEDY, 0, 0, 1, 2),
        (TEMPERATURE, 8, 0, 2, 2),  # widths 8, 6, 4, 3, 2
        (TEMPERATURE, 4, 16, 1, 1),  # widths 4, 2, 1
    ],
)
@pytest.mark.slow  # 34 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_continuous_gives_each_row_the_static_tokens(
    params, sampler, base, slots, block, per_halving, min_slots
):
    # EOS inside the vocabulary and forced limits: rows stop at very different lengths.
    stopping = sampler_lib.Sampler(
        CONFIG, eos_id=(9, 30), pad_id=PAD, max_prompt_len=8, max_new_tokens=32
    )
    limits = [1, 4, 32, 7, 2, 32]
    # The reference: the static engine with the same decode attention (einsum or blocked).
    ref_cfg = dataclasses.replace(base, attn_block=block)
    ref = stopping(params, PROMPTS, rng=jax.random.key(3), sampling=ref_cfg, max_new_tokens=limits)
    static_steps = stopping.last_stats["slot_steps"]
    cont = dataclasses.replace(
        base,
        engine="continuous",
        slots=slots,
        attn_block=block,
        widths_per_halving=per_halving,
        min_slots=min_slots,
    )
    out = stopping(params, PROMPTS, rng=jax.random.key(3), sampling=cont, max_new_tokens=limits)
    assert_same_samples(out, ref, exact=slots != 1 and min_slots != 1)
    stats = stopping.last_stats
    # (6 prompts bucket to 8 rows; slots=0: all of them decode at once)
    assert stats["engine"] == "continuous" and stats["slots"] == (min(slots, 8) or 8)
    assert stats["decode_tokens"] == int(ref.lengths.sum()) - len(PROMPTS)
    decode_lens = [int(n) - 1 for n in ref.lengths if n > 1]  # queued rows, in row order
    expected = slot_schedule(decode_lens, stats["slots"], cont.min_slots, cont.widths_per_halving)
    assert (stats["decode_steps"], stats["slot_steps"]) == expected
    if slots == 1:  # one slot never idles while rows wait: every slot-step is useful
        assert stats["slot_steps"] == stats["decode_tokens"]
    if 0 < slots <= 3:
        assert stats["slot_steps"] < static_steps


@pytest.mark.parametrize("slots", [3, 0])
@pytest.mark.slow  # 12 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_continuous_log_probs_are_the_static_ones_bit_for_bit(slots):
    # The run fixtures' model (head_dim 16): with a scatter into the cache, XLA's CPU
    # backend rounded the new key's RoPE differently from the static engine's
    # dynamic_update_slice (8 of 128 log-probs 1 ulp apart), and a GRPO run's ratio_mean
    # differed between the engines.
    config = model.get_preset("tiny-1m", **TINY_MODEL, vocab_size=16)
    params = model.init_params(config, 0)
    rng = np.random.RandomState(0)
    prompts = [rng.randint(1, 16, rng.randint(3, 8)).tolist() for _ in range(16)]
    smp = sampler_lib.Sampler(config, eos_id=2, pad_id=0, max_prompt_len=8, max_new_tokens=8)
    ref = smp(params, prompts, rng=jax.random.key(1))
    cont = SamplingConfig(engine="continuous", slots=slots)
    assert_same_samples(smp(params, prompts, rng=jax.random.key(1), sampling=cont), ref, True)


@pytest.mark.slow  # 5 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_continuous_row_keys_follow_the_row_not_the_slot(params, sampler):
    rows = jax.random.split(jax.random.key(5), len(PROMPTS))
    # (min_slots 2: a one-slot loop rounds log-probs by other kernels, see above)
    cont = SamplingConfig(temperature=1.0, engine="continuous", slots=2, min_slots=2)
    ref = sampler(params, PROMPTS, rng=rows, max_new_tokens=LIMITS)
    out = sampler(params, PROMPTS, rng=rows, sampling=cont, max_new_tokens=LIMITS)
    assert_same_samples(out, ref, exact=True)
    # Reordered rows start in other slots at other steps and keep their draws.
    order = [2, 5, 0, 3, 1, 4]
    moved = sampler(
        params,
        [PROMPTS[i] for i in order],
        rng=rows[jnp.array(order)],
        sampling=cont,
        max_new_tokens=[LIMITS[i] for i in order],
    )
    np.testing.assert_array_equal(moved.response_tokens, ref.response_tokens[order])
    np.testing.assert_array_equal(moved.response_logprobs, ref.response_logprobs[order])


@pytest.mark.slow  # 13 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_continuous_matches_static_through_gen_batch(params, sampler):
    cont = SamplingConfig(temperature=1.0, engine="continuous", slots=2)
    prompts = [p for p in PROMPTS for _ in range(2)]  # groups of two members
    for gen_batch in (0, 4):
        kwargs = dict(rng=jax.random.key(9), gen_batch=gen_batch, max_new_tokens=12)
        ref = groups.generate(sampler, params, prompts, sampling=SamplingConfig(), **kwargs)
        out = groups.generate(sampler, params, prompts, sampling=cont, **kwargs)
        assert_same_samples(out, ref, exact=True)


@pytest.mark.parametrize("mesh_shape", [(8, 1, 1), (2, 2, 2)])
@pytest.mark.slow  # 21 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_continuous_on_a_sharded_batch_gives_the_static_samples(params, mesh_shape):
    # 12 prompts in a 16-row bucket: each data shard runs its own loop over its 16 / D
    # rows with 16 / D slots; rows keep their keys. Log-probs within fp32 rounding of the
    # unsharded engine's, as for the static engine on a mesh: a shard's matmuls have
    # fewer rows (its prefill too) and fsdp / tensor sharding sums them in another order.
    kwargs = dict(eos_id=(9, 30), pad_id=PAD, max_prompt_len=8, max_new_tokens=32)
    prompts, limits = PROMPTS * 2, [1, 4, 32, 7, 2, 32] * 2
    ref = sampler_lib.Sampler(CONFIG, **kwargs)(
        params, prompts, rng=jax.random.key(3), sampling=TEMPERATURE, max_new_tokens=limits
    )
    mesh = sharding.make_mesh(*mesh_shape)
    sharded = sampler_lib.Sampler(CONFIG, mesh=mesh, **kwargs)
    cont = dataclasses.replace(TEMPERATURE, engine="continuous", slots=16)
    out = sharded(
        jax.device_put(params, sharding.param_shardings(CONFIG, mesh)),
        prompts,
        rng=jax.random.key(3),
        sampling=cont,
        max_new_tokens=limits,
    )
    assert_same_samples(out, ref)
    stats = sharded.last_stats
    assert stats["slots"] == 16 and stats["decode_tokens"] == int(ref.lengths.sum()) - 12
    # Shard i holds bucket rows [i * 16 / D, (i + 1) * 16 / D) (rows 12-15: padding).
    lens = [int(n) - 1 for n in ref.lengths] + [0] * 4
    per = 16 // mesh_shape[0]
    parts = [[x for x in lens[i : i + per] if x > 0] for i in range(0, 16, per)]
    steps = [slot_schedule(part, per, cont.min_slots, cont.widths_per_halving) for part in parts]
    assert stats["decode_steps"] == max(s for s, _ in steps)
    assert stats["slot_steps"] == sum(s for _, s in steps)


def test_continuous_config_errors(params):
    with pytest.raises(ValueError, match="engine must be one of"):
        SamplingConfig(engine="paged")
    with pytest.raises(ValueError, match="slots must be an int >= 0"):
        SamplingConfig(engine="continuous", slots=-1)
    with pytest.raises(ValueError, match="attn_block"):
        SamplingConfig(attn_block=-1)
    with pytest.raises(ValueError, match="min_slots must be an int >= 1"):
        SamplingConfig(engine="continuous", min_slots=0)
    with pytest.raises(ValueError, match="widths_per_halving must be an int >= 1"):
        SamplingConfig(engine="continuous", widths_per_halving=0)
    assert sampler_lib.slot_widths(64, 2) == [64, 32, 16, 8, 4, 2]
    assert sampler_lib.slot_widths(6, 2) == [6, 3] and sampler_lib.slot_widths(8, 8) == [8]
    assert sampler_lib.slot_widths(8, 1) == [8, 4, 2, 1]
    assert sampler_lib.slot_widths(64, 2, 2) == [64, 48, 32, 24, 16, 12, 8, 6, 4, 3, 2]
    assert sampler_lib.slot_widths(6, 2, 2) == [6, 5, 3] and sampler_lib.slot_widths(3, 2, 2) == [3]
    assert sampler_lib.slot_widths(8, 2, 4) == [8, 7, 6, 5, 4, 3, 2]
    # The cache while 4 slots narrow: their next width's beside them (8 rows, I 32, R 480).
    for per_halving, narrower in ((1, 2), (2, 3)):
        cfg = SamplingConfig(engine="continuous", slots=4, widths_per_halving=per_halving)
        assert sampler_lib.kv_cache_slots(cfg, 8, 32, 480) == 8 * 32 + (4 + narrower) * 512
    cfg = SamplingConfig.from_dict({"engine": "continuous", "slots": 4, "attn_block": 16})
    assert (cfg.engine, cfg.slots, cfg.attn_block) == ("continuous", 4, 16)


# ------------------------------------------------------------------- blocked attention


@pytest.mark.parametrize("block", [1, 4, 5, 16, 64])
@pytest.mark.slow  # 6 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_blocked_attention_matches_einsum_reference(block):
    b, t, n, kv, h, s = 3, 1, 4, 2, 8, 24
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (b, t, n, h))
    k = jax.random.normal(keys[1], (b, kv, s, h))
    v = jax.random.normal(keys[2], (b, kv, s, h))
    # Left padding, filled up to a different slot per row; kv_len = the largest fill.
    filled_b = np.array([17, 9, 21])
    mask = np.zeros((b, t, s), bool)
    for i, (start, end) in enumerate([(3, 17), (0, 9), (6, 21)]):
        mask[i, :, start:end] = True
    ref = model._einsum_attention(q, k, v, jnp.asarray(mask))
    out = model._blocked_decode_attention(q, k, v, jnp.asarray(mask), filled_b.max(), block)
    np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # 9 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_blocked_attention_in_the_model_gives_einsum_logits(params, sampler):
    out = sampler(params, PROMPTS, rng=jax.random.key(0), sampling=SamplingConfig(greedy=True))
    p = out.prompt_tokens.shape[1]
    tokens_bt = np.concatenate([out.prompt_tokens, out.response_tokens], axis=1)
    mask_bt = np.concatenate([out.prompt_mask, out.response_mask], axis=1)
    s = tokens_bt.shape[1]
    positions_bt = model.positions_from_mask(jnp.asarray(mask_bt))
    cache = model.init_cache(CONFIG, len(PROMPTS), s)
    step = jax.jit(model.forward_with_cache, static_argnums=0, static_argnames="kv_block")
    _, cache = step(CONFIG, params, tokens_bt[:, :p], positions_bt[:, :p], mask_bt, cache, 0)
    for i in (0, 5, 20):  # decode one token at slot p + i against the filled cache
        at = p + i
        args = (tokens_bt[:, at : at + 1], positions_bt[:, at : at + 1], mask_bt, cache, at)
        kv_mask = np.where(np.arange(s) <= at, mask_bt, False)
        args = (args[0], args[1], kv_mask, cache, at)
        ref, _ = step(CONFIG, params, *args)
        for block in (8, 16):
            got, _ = step(CONFIG, params, *args, kv_len=at + 1, kv_block=block)
            np.testing.assert_allclose(got, ref, atol=1e-4, rtol=1e-5)
            np.testing.assert_array_equal(got.argmax(-1), ref.argmax(-1))
    blocked = sampler(
        params, PROMPTS, rng=jax.random.key(0), sampling=SamplingConfig(greedy=True, attn_block=8)
    )
    assert_same_samples(blocked, out)
    assert sampler.last_stats["slots_read"] < sampler_lib.static_slots_read(8, p, 32, 31, 0)


# ------------------------------------------------------------------- rollout metrics


def test_rollout_metrics_and_slot_stats_from_generate(params, sampler):
    calls = []
    cont = SamplingConfig(engine="continuous", slots=2)
    samples = groups.generate(
        sampler,
        params,
        PROMPTS,
        rng=jax.random.key(0),
        sampling=cont,
        gen_batch=4,
        max_new_tokens=12,
        call_stats=calls,
    )
    assert len(calls) == 2 and all(st["engine"] == "continuous" for st in calls)
    decode_tokens = sum(st["decode_tokens"] for st in calls)
    assert decode_tokens == int(samples.lengths.sum()) - len(PROMPTS)
    ro = groups.Rollout(
        examples=[{}] * 3,
        samples=samples,
        rewards_pg=np.zeros((3, 2), np.float32),
        time_generate_s=1.0,
        time_score_s=0.0,
        gen_tokens=int(samples.lengths.sum()),
        decode_tokens=decode_tokens,
        slot_steps=sum(st["slot_steps"] for st in calls),
    )
    metrics = groups.rollout_metrics(ro)
    assert metrics["gen_len_max"] == 12 and metrics["gen_len_mean"] == 12
    assert metrics["slot_utilisation"] == 1.0  # no EOS: every slot decodes to the end
    back = groups.rollout_from_json(groups.rollout_to_json(ro))
    assert (back.decode_tokens, back.slot_steps) == (ro.decode_tokens, ro.slot_steps)
    lengths = np.array([1, 2, 3, 4, 10, 30])
    short = dataclasses.replace(
        ro, samples=dataclasses.replace(samples, lengths=lengths), slot_steps=0
    )
    metrics = groups.rollout_metrics(short)
    assert "slot_utilisation" not in metrics  # unknown (partial rollout)
    assert metrics["gen_len_p50"] == 3.5 and metrics["gen_len_max"] == 30
    assert metrics["gen_len_p90"] == pytest.approx(np.percentile(lengths, 90))
