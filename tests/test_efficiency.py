"""System efficiency of runs: throughput metrics, no recompilation, generation chunks."""

import pytest

from rl_batch import artifacts, flops
from rl_batch import run as run_lib
from tests.run_fixtures import tiny_run_config


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


def test_a_run_logs_throughput_and_compiles_only_before_its_first_step(work_dir, tmp_path):
    run_dir = str(tmp_path / "run")
    # Countdown prompts are 9 or 10 tokens ("3 5 7:42" vs "3 5 7:9"): one bucket.
    config = tiny_run_config(
        work_dir, run_dir, budget_responses=80, **{"task.name": "countdown", "task.kwargs": {}}
    )
    summary = run_lib.run(config, progress=False)
    updates = artifacts.read_metrics(run_dir, "update")
    assert len(updates) == 5
    for u in updates:
        for key in flops.RATE_KEYS + ("update_tokens", "compilations"):
            assert u[key] is not None, key
        assert u["gen_tokens_per_s"] == pytest.approx(u["gen_tokens"] / u["time_generate_s"])
        assert 0 < u["gen_time_share"] < 1
        # Every row's real prompt tokens plus its generated tokens.
        assert u["update_tokens"] > u["gen_tokens"]
    # Prompts of different lengths share one bucket: no step compiles anything new.
    counts = [u["compilations"] for u in updates]
    assert counts[0] > 0 and len(set(counts)) == 1, counts
    assert summary["gen_tokens_per_s"] == pytest.approx(
        sum(u["gen_tokens"] for u in updates) / summary["time_generate_s"]
    )
    assert summary["update_tokens_per_s"] == pytest.approx(
        sum(u["update_tokens"] for u in updates) / summary["time_update_s"]
    )
    assert summary["responses_per_s"] == pytest.approx(80 / summary["time_train_s"])
