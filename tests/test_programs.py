"""Compiled programs kept across runs of one process (``rl_batch.runs.programs``)."""

import pytest
from ml_collections import ConfigDict

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


def _params_file(tmp_path, c) -> str:
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import pretrain
    from tests.run_fixtures import numpy_params

    path = str(tmp_path / "base.npz")
    pretrain.write_params_file(path, numpy_params(config_lib.resolve(c).model, seed=7))
    return path


def test_the_warm_start_key_names_a_file_and_nothing_seeded(tmp_path):
    from rl_batch.runs import config as config_lib

    c = tiny_run_config(str(tmp_path))
    assert run_lib.warm_start_key(config_lib.resolve(c)) is None  # scratch: the seed's
    c.init.source, c.init.path = "params", _params_file(tmp_path, c)
    key = run_lib.warm_start_key(config_lib.resolve(c))
    assert key[:2] == ("params", c.init.path)
    with open(c.init.path, "ab") as f:  # (a rewritten file is another warm start)
        f.write(b"\0")
    assert run_lib.warm_start_key(config_lib.resolve(c)) != key


@pytest.mark.slow  # two pairs of tiny runs
def test_seeds_of_one_configuration_score_their_warm_start_once(tmp_path, keep, monkeypatch):
    from rl_batch.algorithms import exact_eval

    c = tiny_run_config(str(tmp_path / "work"), eval_metric="p_ref", eval_ref_prompts=16)
    c.init.source, c.init.path = "params", _params_file(tmp_path, c)
    passes = []
    logp = exact_eval.ReferenceScorer.logp
    monkeypatch.setattr(
        exact_eval.ReferenceScorer, "logp", lambda self, p: passes.append(1) or logp(self, p)
    )

    def two_seeds(out):
        records = []
        for seed in (1, 2):
            r = ConfigDict(c.to_dict())
            r.run_dir, r.seed = f"{out}/s{seed}", seed
            run_lib.run(r, progress=False)
            records.append(artifacts.read_metrics(f"{out}/s{seed}"))
        return records

    fresh = two_seeds(str(tmp_path / "fresh"))
    fresh_passes = len(passes)
    keep(4)
    passes.clear()
    kept = two_seeds(str(tmp_path / "kept"))
    evals = [sum(r["kind"] == "eval" for r in recs) for recs in kept]
    assert fresh_passes == sum(evals) and len(passes) == sum(evals) - 1
    for a, b in zip(fresh, kept):  # the same values, the kept one's without a pass
        assert_same_records(deterministic(a), deterministic(b), rel=0, abs=0)
    assert kept[1][0]["eval_p_ref"] == fresh[1][0]["eval_p_ref"] == fresh[0][0]["eval_p_ref"]
