"""FLOP counts by hand, the matmul-rate probe, and per-step throughput arithmetic."""

import numpy as np
import pytest

from rl_batch.models import flops
from rl_batch.models import transformer as model_lib
from rl_batch.rollout.sampler import SampleOutput

# d=4, 2 layers, 2 heads of 2 dims, 1 KV head, MLP 8, vocab 10 (tied head).
SMALL = model_lib.ModelConfig(
    vocab_size=10,
    hidden_size=4,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    head_dim=2,
    intermediate_size=8,
)


def test_matmul_weights_by_hand():
    # Per layer: q 4*2*2 + k,v 2*4*1*2 + o 2*2*4 + MLP 3*4*8 = 16 + 16 + 16 + 96 = 144.
    # Two layers plus the tied LM head 4*10: 288 + 40 = 328.
    assert flops.matmul_weights(SMALL) == 328
    # = all parameters minus the norms (2 per layer of d, plus the final one): 348 - 20.
    assert SMALL.num_params == 348


def test_flops_per_token_by_hand():
    # 2 * 328 + attention 4 * L(2) * S(5) * N(2) * H(2) = 656 + 160.
    assert flops.model_flops_per_token(SMALL, 5) == 816
    assert flops.model_flops_per_token(SMALL, 0) == 656
    # Update: 3x forward per token: 7 tokens of width 5.
    assert flops.update_flops(SMALL, tokens=7, seq_len=5) == 3 * 7 * 816
    # Prefill 6 prompt tokens over P=3 slots, decode 4 tokens over S=5.
    got = flops.generation_flops(SMALL, prompt_tokens=6, gen_tokens=4, prompt_len=3, seq_len=5)
    assert got == 6 * (656 + 4 * 2 * 3 * 2 * 2) + 4 * 816


def test_rollout_costs_count_real_tokens_of_every_row():
    samples = SampleOutput(
        prompt_tokens=np.zeros((2, 3), np.int32),
        prompt_mask=np.array([[0, 1, 1], [1, 1, 1]], bool),  # 5 prompt tokens
        response_tokens=np.zeros((2, 2), np.int32),
        response_mask=np.array([[1, 1], [1, 0]], bool),  # 3 generated tokens
        response_logprobs=np.zeros((2, 2), np.float32),
        lengths=np.array([2, 1], np.int32),
    )
    costs = flops.rollout_costs(SMALL, samples)
    assert costs["gen_tokens"] == 3 and costs["update_tokens"] == 8
    assert costs["gen_flops"] == 5 * flops.model_flops_per_token(
        SMALL, 3
    ) + 3 * flops.model_flops_per_token(SMALL, 5)
    assert costs["update_flops"] == 3 * 8 * flops.model_flops_per_token(SMALL, 5)


def test_step_throughput_arithmetic():
    m = flops.step_throughput(
        gen_tokens=1000,
        gen_flops=4e9,
        time_generate_s=2.0,
        update_tokens=3000,
        upd_flops=6e9,
        time_update_s=1.0,
        responses=64,
        step_time_s=4.0,
        matmul_flops_per_s=1e10,
    )
    assert m["gen_tokens_per_s"] == 500 and m["update_tokens_per_s"] == 3000
    assert m["responses_per_s"] == 16 and m["gen_time_share"] == 0.5
    assert m["gen_flops_per_s"] == 2e9 and m["gen_matmul_frac"] == pytest.approx(0.2)
    assert m["update_flops_per_s"] == 6e9 and m["update_matmul_frac"] == pytest.approx(0.6)
    assert set(flops.RATE_KEYS) <= set(m)
    # No update time (an all-filtered step): rates are None, not a division error.
    m = flops.step_throughput(
        gen_tokens=10,
        gen_flops=1.0,
        time_generate_s=1.0,
        update_tokens=0,
        upd_flops=0.0,
        time_update_s=0.0,
        responses=0,
        step_time_s=1.0,
        matmul_flops_per_s=1.0,
    )
    assert m["update_tokens_per_s"] is None and m["update_matmul_frac"] is None


def test_matmul_rate_is_positive_and_cached():
    rate = flops.measure_matmul_flops(size=128, repeats=1)
    assert rate > 0
    assert flops.measure_matmul_flops(size=128, repeats=1) == rate  # the cached value
