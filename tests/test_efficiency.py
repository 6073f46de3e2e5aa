"""System efficiency of runs: throughput metrics, no recompilation, generation chunks."""

import jax
import pytest

from rl_batch import artifacts
from rl_batch.models import flops
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import groups as rollout_lib
from rl_batch.rollout.sampler import SamplingConfig
from rl_batch.runs import config as config_lib
from rl_batch.runs import run as run_lib
from tests.run_fixtures import tiny_run_config


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


@pytest.mark.slow  # 38 s in the fast tier at b3308b3 (2 cores, load 2-5)
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


def _tiny_parts(work_dir):
    spec = config_lib.resolve(tiny_run_config(work_dir, "unused"))
    tokenizer = config_lib.make_tokenizer(spec.config)
    model_config = spec.model
    train, _ = run_lib.load_task_data(spec, tokenizer)
    sampler = config_lib.make_sampler(spec, tokenizer)
    params = model_lib.init_params(model_config, 0)
    return spec.config, tokenizer, model_config, train, sampler, params


@pytest.mark.slow  # 11 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_chunked_rollout_returns_every_response_and_counts(work_dir):
    c, tokenizer, _, train, sampler, params = _tiny_parts(work_dir)
    task = config_lib.make_task(c)
    examples = [train[i] for i in range(4)]
    ro = rollout_lib.rollout(
        sampler,
        params,
        task,
        tokenizer,
        examples,
        4,
        rng=jax.random.key(0),
        sampling=SamplingConfig(),
        gen_batch=6,  # 16 responses in chunks of 6, 6 and 4
    )
    s = ro.samples
    assert s.response_tokens.shape[0] == s.prompt_tokens.shape[0] == 16
    assert ro.rewards_pg.shape == (4, 4)
    assert ro.gen_tokens == int(s.lengths.sum()) == int(s.response_mask.sum())
    assert (s.lengths >= 1).all()
    # Row p * G + g holds prompt p: every group repeats its prompt.
    prompts = s.prompt_tokens.reshape(4, 4, -1)
    assert (prompts == prompts[:, :1]).all() and not (prompts[0, 0] == prompts[1, 0]).all()
    # The chunk's sampler call was bucketed to 8 rows (the last chunk to 4).
    assert sampler.last_stats["batch_bucket"] == 4


def test_kv_memory_bound_by_hand(work_dir):
    c, _, model_config, _, sampler, _ = _tiny_parts(work_dir)
    # 1 layer x (k, v) x 1 KV head x 16 dims x 4 bytes = 128 bytes per slot.
    assert rollout_lib.kv_cache_bytes(model_config, 1, 1) == 128
    # Prompt bucket 7 (capped at the longest prompt) + response bucket 4 = 11 slots;
    # a chunk of 6 rounds up to 8 rows: 8 x 11 x 128 bytes.
    need = 8 * 11 * 128
    assert rollout_lib.check_kv_memory(sampler, 16, 6, need, "training rollout") == need
    assert rollout_lib.check_kv_memory(sampler, 16, 0, 0, "training rollout") == 16 * 11 * 128
    with pytest.raises(ValueError, match=r"chunk of 6 sequences.*max_kv_bytes=11263.*gen_batch=6"):
        rollout_lib.check_kv_memory(sampler, 16, 6, need - 1, "training rollout")
    # The continuous engine: every row's 7 prompt slots, plus 2 decode slots x 11:
    # (8 x 7 + 2 x 11) x 128 bytes (min_slots 2: the 2 slots never narrow).
    cont = SamplingConfig(engine="continuous", slots=2, min_slots=2)
    need_c = (8 * 7 + 2 * 11) * 128
    assert rollout_lib.check_kv_memory(sampler, 16, 6, 0, "x", cont) == need_c
    # slots=0 decodes all 8 rows at once and narrows to 4 (then 2, 1) slots at the tail:
    # the 4-slot cache is made while the 8-slot one still lives.
    every = SamplingConfig(engine="continuous")
    need_every = (8 * 7 + (8 + 4) * 11) * 128
    assert rollout_lib.check_kv_memory(sampler, 16, 6, 0, "x", every) == need_every
    with pytest.raises(ValueError, match=r"7 prompt slots \+ 8 decode slots \(\+ 4 narrowing\)"):
        rollout_lib.check_kv_memory(sampler, 16, 6, need_every - 1, "training rollout", every)
    with pytest.raises(ValueError, match=r"8 rows x 7 prompt slots \+ 2 decode slots x 11"):
        rollout_lib.check_kv_memory(sampler, 16, 6, need_c - 1, "training rollout", cont)


def test_a_run_whose_generation_chunk_exceeds_the_kv_bound_stops_at_start(work_dir, tmp_path):
    config = tiny_run_config(work_dir, str(tmp_path / "run"), gen_batch=0, max_kv_bytes=10_000)
    with pytest.raises(ValueError, match="training rollout: a generation chunk of 16"):
        run_lib.run(config, progress=False)


@pytest.mark.parametrize("max_staleness", [1, 2])
@pytest.mark.slow  # 10 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_async_rollout_trains_on_batches_of_an_older_policy(work_dir, tmp_path, max_staleness):
    run_dir = str(tmp_path / "run")
    config = tiny_run_config(
        work_dir,
        run_dir,
        budget_responses=80,
        # A random policy earns no reward (zero advantages); weight decay still moves the
        # params every update, so a stale behaviour policy differs from the updated one.
        weight_decay=1.0,
        **{"async_rollout.enabled": True, "async_rollout.max_staleness": max_staleness},
    )
    summary = run_lib.run(config, progress=False)
    assert summary["status"] == "finished" and summary["responses_cum"] == 80
    updates = artifacts.read_metrics(run_dir, "update")
    # The first batches come from the initial policy; then each is max_staleness behind.
    expected = [min(i, max_staleness) for i in range(5)]
    assert [u["staleness"] for u in updates] == expected
    # A stale behaviour policy: the ratio to the sampler's log-probs departs from 1.
    assert updates[0]["ratio_max"] - 1 < 1e-5  # generated by the policy it updates
    assert min(u["ratio_max"] for u in updates[max_staleness:]) - 1 > 5e-5
    assert updates[-1]["time_train_cum_s"] == pytest.approx(summary["time_train_s"])
    assert summary["time_learner_wait_s"] > 0
    assert len(set(u["compilations"] for u in updates)) == 1
