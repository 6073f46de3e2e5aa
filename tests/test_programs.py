"""Compiled programs kept across runs of one process (``rl_batch.runs.programs``)."""

import pytest

from rl_batch import artifacts
from rl_batch.runs import programs
from rl_batch.runs import run as run_lib
from tests.run_fixtures import assert_same_records, deterministic, tiny_run_config


@pytest.fixture
def keep():
    """Turns keeping on for one test (and off, with nothing kept, after it)."""
    yield programs.keep
    programs.keep(0)


def test_key_ignores_what_enters_no_program(tmp_path):
    c = tiny_run_config(str(tmp_path), str(tmp_path / "a"), seed=1, name="a")
    same = tiny_run_config(str(tmp_path), str(tmp_path / "b"), seed=2, name="b")
    assert programs.key(c) == programs.key(same)
    assert programs.key(c) != programs.key(tiny_run_config(str(tmp_path), prompts=8))
    assert programs.key(c) != programs.key(tiny_run_config(str(tmp_path), lr_ref=2e-3))
    # PPO draws its critic from the seed when its state is made: the seed is part of it.
    ppo = [tiny_run_config(str(tmp_path), algo="ppo", seed=s) for s in (1, 2)]
    assert programs.key(ppo[0]) != programs.key(ppo[1])


def _two_seeds(work_dir: str, out: str) -> list[list[dict]]:
    records = []
    for seed in (1, 2):
        run_dir = f"{out}/s{seed}"
        run_lib.run(tiny_run_config(work_dir, run_dir, seed=seed), progress=False)
        records.append(deterministic(artifacts.read_metrics(run_dir)))
    return records


@pytest.mark.slow  # 9 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_kept_programs_give_the_metrics_of_fresh_ones(tmp_path, keep, monkeypatch):
    work_dir = str(tmp_path / "work")
    fresh = _two_seeds(work_dir, str(tmp_path / "fresh"))
    built = []
    make_algorithm = run_lib.make_algorithm
    monkeypatch.setattr(run_lib, "make_algorithm", lambda *a: built.append(1) or make_algorithm(*a))
    keep(4)
    kept = _two_seeds(work_dir, str(tmp_path / "kept"))
    assert len(built) == 1  # the second seed reused the first one's learner
    assert fresh[0] != fresh[1]  # (two different runs)
    for a, b in zip(fresh, kept):
        assert_same_records(a, b, rel=0, abs=0)


def test_keep_evicts_the_oldest(tmp_path, keep):
    keep(2)
    built = []

    def build(name):
        return lambda: built.append(name) or programs.Programs(name, None, None)

    configs = {p: tiny_run_config(str(tmp_path), prompts=p) for p in (2, 4, 8)}
    for p in (2, 4, 2, 8, 4, 2):
        assert programs.get(configs[p], build(p)).algo == p
    # 2, 4 built; 2 kept; 8 evicts 4; 4 rebuilt (evicts 2); 2 rebuilt.
    assert built == [2, 4, 8, 4, 2]
    keep(0)
    programs.get(configs[8], build(8))
    assert built[-1] == 8  # off: always built
