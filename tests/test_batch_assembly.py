"""Batch assembly from a rollout with non-zero rewards: GRPO and PPO ``make_batch``.

The end-to-end tests run random policies with zero rewards (zero advantages), which
would hide a sign flip or a wrong row order here: these build a rollout by hand.
"""

import jax
import numpy as np
import pytest

from rl_batch.models import sharding
from rl_batch.rollout.groups import Rollout
from rl_batch.rollout.sampler import SampleOutput
from rl_batch.runs import accounting
from rl_batch.runs import config as config_lib
from rl_batch.runs import run as run_lib
from tests.run_fixtures import tiny_run_config

P, G, PL, R = 3, 2, 3, 4


def _rollout(rewards_pg, complete_p=None):
    """Row p * G + g: prompt tokens all p + 1, response tokens 10 * p + g + 1, lengths
    g + 2 (so every row differs), log-probs -0.1 * (row + 1) on real tokens."""
    rows = [(p, g) for p in range(P) for g in range(G)]
    lengths = np.array([g + 2 for _, g in rows], np.int32)
    mask = np.arange(R)[None, :] < lengths[:, None]
    samples = SampleOutput(
        prompt_tokens=np.array([[p + 1] * PL for p, _ in rows], np.int32),
        prompt_mask=np.ones((P * G, PL), bool),
        response_tokens=np.where(mask, np.array([[10 * p + g + 1] for p, g in rows]), 0),
        response_mask=mask,
        response_logprobs=np.where(mask, -0.1 * (np.arange(P * G)[:, None] + 1), 0.0).astype(
            np.float32
        ),
        lengths=lengths,
    )
    return Rollout(
        examples=[{"prompt": str(p)} for p in range(P)],
        samples=samples,
        rewards_pg=np.asarray(rewards_pg, np.float32),
        time_generate_s=0.0,
        time_score_s=0.0,
        gen_tokens=int(lengths.sum()),
        complete_p=complete_p,
    )


@pytest.fixture(scope="module")
def mesh():
    return sharding.make_mesh(devices=jax.devices()[:1])  # B = 6 rows on one device


def _config(tmp_path, **changes):
    c = tiny_run_config(str(tmp_path), str(tmp_path / "run"), prompts=P, group_size=G, **changes)
    return config_lib.resolve(c, device_count=1)


def test_grpo_batch_signs_row_order_and_dropped_groups(tmp_path, mesh):
    c = _config(tmp_path, filter_groups=True)
    algo = run_lib.make_algorithm(c, mesh)
    # Prompt 0: the first response is right; prompt 1: none (filtered); prompt 2: the second.
    ro = _rollout([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    keep_p = accounting.keep_mask(ro, algo.filter_groups)
    np.testing.assert_array_equal(keep_p, [True, False, True])
    batch = algo.make_batch(ro, keep_p)
    adv = np.asarray(batch.advantages)
    # Unbiased std of (1, 0) is 1/sqrt(2): advantages +-0.7071 (eps 1e-6 in the std).
    np.testing.assert_allclose(adv, [0.70711, -0.70711, 0, 0, -0.70711, 0.70711], atol=1e-4)
    assert adv[0] > 0 and adv[5] > 0  # the rewarded responses are pushed up
    # Rows are prompt-major and keep the rollout's tokens and log-probs.
    np.testing.assert_array_equal(np.asarray(batch.prompt_tokens)[:, -1], [1, 1, 2, 2, 3, 3])
    # Prompts left-padded (masked) to the run's longest: one update shape every step.
    width = c.max_prompt_len
    assert batch.prompt_tokens.shape == (P * G, width) and width > PL
    np.testing.assert_array_equal(
        np.asarray(batch.prompt_mask), np.arange(width)[None, :].repeat(P * G, 0) >= width - PL
    )
    np.testing.assert_array_equal(np.asarray(batch.response_tokens)[:, 0], [1, 2, 11, 12, 21, 22])
    np.testing.assert_array_equal(batch.old_logprobs, ro.samples.response_logprobs)
    # The filtered group's rows weigh nothing; the others keep their response masks.
    mask = np.asarray(batch.response_mask)
    assert not mask[2:4].any()
    np.testing.assert_array_equal(mask[[0, 1, 4, 5]], ro.samples.response_mask[[0, 1, 4, 5]])
    assert batch.ref_logprobs is None


def test_partial_rollout_trains_only_finished_groups():
    ro = _rollout([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]], complete_p=np.array([True, False, True]))
    np.testing.assert_array_equal(accounting.keep_mask(ro, True), [True, False, True])
    np.testing.assert_array_equal(accounting.keep_mask(ro, False), [True, False, True])


def test_ppo_batch_rewards_per_sequence(tmp_path, mesh):
    c = _config(tmp_path, algo="ppo")
    algo = run_lib.make_algorithm(c, mesh)
    ro = _rollout([[1.0, 0.0], [0.5, 0.0], [0.0, 1.0]])
    keep_p = np.array([True, False, True])
    batch = algo.make_batch(ro, keep_p)
    np.testing.assert_array_equal(np.asarray(batch.rewards), [1, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(np.asarray(batch.response_tokens)[:, 0], [1, 2, 11, 12, 21, 22])
    assert not np.asarray(batch.response_mask)[2:4].any()
    np.testing.assert_array_equal(batch.old_logprobs, ro.samples.response_logprobs)
