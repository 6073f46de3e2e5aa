"""experiments.learner_speed: both tables from a tiny config, and its flag checks."""

import pytest
from run_fixtures import tiny_run_config

from experiments import learner_speed


def _tiny(work_dir):
    """The test model on its small task (the default model's update compiles for ~1 min)."""
    return tiny_run_config(str(work_dir), eval_metric="p_ref", eval_ref_prompts=6)


@pytest.mark.slow  # 16 s on an idle 2-core AMD EPYC (115 s with the default model)
def test_the_update_table_has_one_row_per_batch_and_micro_batch_size(tmp_path):
    rows = learner_speed.update_rows(_tiny(tmp_path), [4], [0, 8], rounds=1)
    assert [r[:2] for r in rows] == [["4 x 4", "0"], ["4 x 4", "8"]]
    assert rows[0][-1] == "1.000 [1.000, 1.000]"  # (the first setting against itself)
    assert all(float(r[2]) > 0 for r in rows)


def test_the_p_ref_table_times_each_call_size_and_checks_the_sums_agree(tmp_path):
    rows = learner_speed.ref_rows(_tiny(tmp_path), [6, 2], rounds=2)
    assert [r[:2] for r in rows] == [["6", "6"], ["2", "6"]]
    assert float(rows[1][-1]) < 1e-4  # log p within float rounding of one call of all 6


@pytest.mark.parametrize("text", ["", "a", "4,-1"])
def test_bad_lists_are_one_error(text):
    with pytest.raises(ValueError, match="expected comma-separated integers"):
        learner_speed._ints(text, "prompts")
