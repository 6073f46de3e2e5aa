"""Dynamic-sampling filter: hand-made reward tables."""

import numpy as np
import pytest

from rl_batch.rollout.filtering import dynamic_sampling_filter


def test_drops_groups_with_equal_rewards():
    rewards_pg = np.array(
        [
            [1.0, 1.0, 1.0],  # all solved: dropped
            [0.0, 1.0, 0.0],  # mixed: kept
            [0.0, 0.0, 0.0],  # all failed: dropped
            [0.5, 0.5, 0.5],  # equal non-binary: dropped
            [1.0, 0.0, 1.0],  # mixed: kept
        ]
    )
    result = dynamic_sampling_filter(rewards_pg)
    np.testing.assert_array_equal(result.keep_p, [False, True, False, False, True])
    assert result.keep_p.dtype == bool
    assert (result.prompts_generated, result.prompts_retained) == (5, 2)
    assert (result.responses_generated, result.responses_retained) == (15, 6)
    assert result.keep_fraction == pytest.approx(0.4)


def test_tolerance_for_continuous_rewards():
    rewards_pg = np.array([[0.5, 0.5 + 1e-9], [0.2, 0.9]])
    np.testing.assert_array_equal(dynamic_sampling_filter(rewards_pg).keep_p, [True, True])
    loose = dynamic_sampling_filter(rewards_pg, atol=1e-6)
    np.testing.assert_array_equal(loose.keep_p, [False, True])
    assert loose.responses_retained == 2


def test_group_of_one_is_always_dropped_and_empty_batch():
    single = dynamic_sampling_filter(np.array([[1.0], [0.0]]))
    assert single.prompts_retained == 0 and single.responses_generated == 2
    empty = dynamic_sampling_filter(np.zeros((0, 4)))
    assert (empty.prompts_generated, empty.responses_retained, empty.keep_fraction) == (0, 0, 0.0)


def test_bad_input():
    with pytest.raises(ValueError, match=r"\[P, G\], got shape \(4,\)"):
        dynamic_sampling_filter(np.ones(4))
    with pytest.raises(ValueError, match="NaN"):
        dynamic_sampling_filter(np.array([[0.0, np.nan]]))
