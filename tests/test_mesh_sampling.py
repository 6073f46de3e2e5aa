"""Sampling on a device mesh runs to the end: no collective inside a per-shard loop.

Each ``data`` shard decodes its own rows in its own ``lax.while_loop`` and stops when
they are done, so shards run different numbers of steps. A collective inside that loop
that spans shards (or, on XLA's CPU runtime, any collective-permute: it meets all the
devices of its pairs at once) waits forever for a shard that has left the loop: the
process aborts with an XLA rendezvous timeout. Top-p once did exactly that on a
``data`` x ``tensor`` mesh (reversing the sorted, vocab-sharded logits was a
collective-permute over the tensor pairs).

Two checks:

* the compiled programs of both engines (8 fake devices from ``tests/conftest.py``) have
  no collective-permute inside a loop, and every other collective in a loop stays within
  one ``data`` shard (checked on the HLO: it fails without hanging);
* a subprocess with 4 fake devices (``experiments.gpu_check --mesh_check``, the mesh case
  of ``launch/gpu_check.sh``) samples on ``data`` x ``tensor`` and ``data`` x
  ``fsdp`` meshes with top-p and top-k + top-p at per-row lengths that differ across the
  shards, under a timeout, and its tokens equal the unsharded run's; a second one
  (``stop_id_cases``) does the same with rows ended by sampled stop ids, on those two
  meshes and a MoE model's ``data`` x ``expert`` mesh.
"""

import dataclasses
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments.gpu_check import MESH_LIMITS as LIMITS
from rl_batch.models import sharding
from rl_batch.models import transformer as model
from rl_batch.rollout import sampler as sampler_lib
from rl_batch.rollout.sampler import SamplingConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = model.get_preset("tiny-1m")
PAD = 0
PROMPTS = [[5, 6, 7], [8, 9, 10, 11], [3], [20, 21, 22, 23, 24], [1, 2], [7] * 6, [9, 8], [3] * 7]

METHODS = {
    "top_p": SamplingConfig(temperature=0.8, top_p=0.9),
    "top_k_top_p": SamplingConfig(temperature=0.8, top_k=20, top_p=0.9),
}
TIMEOUT_S = 300  # a deadlock aborts after XLA's 40 s rendezvous timeout, or hangs here

# --------------------------------------------------------------------------- HLO check

_COLLECTIVE = re.compile(
    r"=\s*\S+\s+(all-reduce|all-gather|all-to-all|reduce-scatter|collective-permute|"
    r"collective-broadcast)(-start)?\("
)


def _computations(hlo: str) -> dict[str, list[str]]:
    """HLO module text -> {computation name: its instruction lines}."""
    comps, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if head and not line.startswith(" "):
            name = head.group(1)
            comps[name] = []
        elif name is not None and line.startswith(" "):
            comps[name].append(line)
    return comps


def _loop_computations(comps: dict[str, list[str]]) -> set[str]:
    """Every computation run inside a while loop (bodies, conditions and what they call)."""
    called = re.compile(
        r"(?:calls|to_apply|body|condition|true_computation|false_computation)=%?([\w.\-]+)"
    )
    branches = re.compile(r"branch_computations=\{([^}]*)\}")

    def callees(lines):
        out = set()
        for line in lines:
            out.update(called.findall(line))
            for group in branches.findall(line):
                out.update(x.strip().lstrip("%") for x in group.split(","))
        return out

    todo = set()
    for lines in comps.values():
        for line in lines:
            if " while(" in line:
                todo.update(re.findall(r"(?:body|condition)=%?([\w.\-]+)", line))
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        todo.update(callees(comps[name]) - seen)
    return seen


def _groups(line: str) -> list[list[int]]:
    """The device groups of one collective (explicit lists or the iota form)."""
    explicit = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", line)
    if explicit:
        return [
            [int(x) for x in g.split(",") if x]
            for g in re.findall(r"\{([\d,]*)\}", explicit.group(1))
        ]
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if iota:
        shape = [int(x) for x in iota.group(1).split(",")]
        dims = [int(x) for x in iota.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if iota.group(3):
            ids = ids.transpose([int(x) for x in iota.group(3).split(",")])
        return ids.reshape(shape).tolist()
    return []


def loop_collectives(hlo: str) -> list[str]:
    """The collective instructions inside while loops of a compiled HLO module."""
    comps = _computations(hlo)
    lines = [line for name in _loop_computations(comps) for line in comps[name]]
    return [line.strip() for line in lines if _COLLECTIVE.search(line)]


def assert_loop_collectives_stay_in_shards(hlo: str, mesh: jax.sharding.Mesh) -> None:
    """No collective-permute in a loop; every other loop collective within a data shard."""
    shard_of = {i: int(np.unravel_index(i, mesh.devices.shape)[0]) for i in range(mesh.size)}
    for line in loop_collectives(hlo):
        assert "collective-permute" not in line, f"collective-permute inside a loop: {line[:300]}"
        for group in _groups(line):
            shards = {shard_of[i] for i in group}
            assert len(shards) == 1, f"a loop collective spans data shards {shards}: {line[:300]}"


def test_hlo_check_finds_a_cross_shard_collective_in_a_loop():
    # The check itself: a loop whose body all-reduces over ``data`` must be caught, and
    # one that reduces over ``tensor`` only must pass.
    mesh = sharding.make_mesh(2, 1, 4)
    P = jax.sharding.PartitionSpec

    def program(axis):
        def local(x):
            def body(c):
                return c[0] + 1, c[1] + jax.lax.psum(c[1], axis)

            return jax.lax.while_loop(lambda c: c[0] < 3, body, (0, x))[1]

        fn = jax.shard_map(
            local, mesh=mesh, in_specs=P("data", "tensor"), out_specs=P("data", "tensor")
        )
        return jax.jit(fn).lower(np.ones((2, 4), np.float32)).compile().as_text()

    with pytest.raises(AssertionError, match="spans data shards"):
        assert_loop_collectives_stay_in_shards(program("data"), mesh)
    assert loop_collectives(program("tensor")), "expected an all-reduce inside the loop"
    assert_loop_collectives_stay_in_shards(program("tensor"), mesh)


def _compiled(engine: str, mesh, sampling: SamplingConfig, config=CONFIG) -> str:
    """HLO text of the engine's decode program on ``mesh`` (8 rows, I = 8, R = 32)."""
    sampler = sampler_lib.Sampler(
        config, mesh=mesh, eos_id=config.vocab_size, pad_id=PAD, max_prompt_len=8, max_new_tokens=32
    )
    params = jax.device_put(model.init_params(config, 0), sharding.param_shardings(config, mesh))
    tokens, mask = sampler.pad_prompts(PROMPTS, 8, 8)
    tokens, mask = jax.device_put((tokens, mask), sharding.sampler_batch_sharding(mesh))
    limit = np.asarray(LIMITS, np.int32)
    static = dict(response_len=32, eos_id=sampler.eos_ids, pad_id=PAD, sampling=sampling)
    static.update(cache_dtype=None, record_routing=False)
    if engine == "static":
        state = sampler._prefill(config, params, tokens, mask, jax.random.key(0), limit, **static)
        return sampler._decode.lower(config, params, state).compile().as_text()
    sampling = dataclasses.replace(sampling, engine="continuous", slots=8)
    static["sampling"] = sampling
    lowered = sampler._continuous.lower(
        config, params, tokens, mask, jax.random.key(0), limit, slots=8, **static
    )
    return lowered.compile().as_text()


@pytest.mark.parametrize("engine", ["static", "continuous"])
@pytest.mark.parametrize("mesh_shape", [(2, 1, 4), (2, 2, 2)], ids=["dxt", "dxfxt"])
@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.slow  # 53 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_no_cross_shard_collective_in_the_decode_loop(engine, mesh_shape, method):
    mesh = sharding.make_mesh(*mesh_shape)
    hlo = _compiled(engine, mesh, METHODS[method])
    assert " while(" in hlo
    assert_loop_collectives_stay_in_shards(hlo, mesh)


@pytest.mark.parametrize("engine", ["static", "continuous"])
@pytest.mark.parametrize(
    "sampling",
    [SamplingConfig(greedy=True), SamplingConfig(temperature=0.8), SamplingConfig(top_k=20)],
)
@pytest.mark.slow  # 14 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_other_methods_keep_loop_collectives_in_shards(sampling, engine):
    mesh = sharding.make_mesh(2, 1, 4)
    assert_loop_collectives_stay_in_shards(_compiled(engine, mesh, sampling), mesh)


@pytest.mark.slow  # 23 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_moe_on_a_data_x_expert_x_tensor_mesh_keeps_loop_collectives_in_shards():
    config = model.get_preset("tiny-moe")
    mesh = sharding.make_mesh(2, 1, 2, expert=2)
    for engine in ("static", "continuous"):
        hlo = _compiled(engine, mesh, METHODS["top_k_top_p"], config=config)
        assert_loop_collectives_stay_in_shards(hlo, mesh)


# ------------------------------------------------------------------ run to the end


@pytest.mark.slow
def test_top_p_on_data_x_tensor_and_data_x_fsdp_runs_to_the_end(tmp_path):
    env = dict(os.environ)
    env.update(
        JAX_PLATFORMS="cpu",
        XLA_FLAGS="--xla_force_host_platform_device_count=4",
        PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
    )
    out_path = tmp_path / "results.json"
    cmd = [sys.executable, "-m", "experiments.gpu_check", "--mesh_check", f"--out={out_path}"]
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"mesh sampling hung for {TIMEOUT_S} s (a collective inside a loop?)")
    assert proc.returncode == 0, (
        f"rc {proc.returncode} (134: XLA rendezvous abort)\n{proc.stderr[-3000:]}"
    )
    results = json.loads(out_path.read_text())["cases"]
    assert len(results) == 8
    for case, r in results.items():
        # Rows end at their own limits, so the two data shards run 29 and 19 steps.
        assert r["lengths"] == LIMITS, case
        assert r["same_tokens"] and r["same_mask"], case
        assert r["logprob_diff"] < 1e-5, case


# Rows that end on sampled stop ids (16 of the 64 ids: a row stops after about 4 tokens),
# as a rollout's rows end on EOS: 16 rows, so each of the two data shards holds 8 and
# the longest of them differs between the shards (checked: the loops run apart).
STOP_IDS = tuple(range(1, 64, 4))
STOP_CASES = {  # case -> (preset, make_mesh sizes (data, fsdp, tensor, expert), method)
    "top_p/data_x_tensor": ("tiny-1m", (2, 1, 2, 1), "top_p"),
    "top_k_top_p/data_x_fsdp": ("tiny-1m", (2, 2, 1, 1), "top_k_top_p"),
    "top_p/moe_data_x_expert": ("tiny-moe", (2, 1, 1, 2), "top_p"),
}


def stop_id_cases(out_path: str) -> None:
    """The ``STOP_CASES`` with both engines on the first 4 devices against one device;
    writes {"case/engine": {per_shard_steps, same_tokens, same_mask}} as JSON (run in a
    subprocess by the test below, so that a deadlock cannot hang the test session)."""
    results = {}
    rows = PROMPTS * 2
    kwargs = dict(eos_id=STOP_IDS, pad_id=PAD, max_prompt_len=8, max_new_tokens=32)
    for case, (preset, (data, fsdp, tensor, expert), method) in STOP_CASES.items():
        config = model.get_preset(preset)
        params = model.init_params(config, 0)
        mesh = sharding.make_mesh(data, fsdp, tensor, jax.devices()[:4], expert=expert)
        sharded = jax.device_put(params, sharding.param_shardings(config, mesh))
        for engine in ("static", "continuous"):
            sampling = dataclasses.replace(METHODS[method], engine=engine, slots=4)
            call = dict(rng=jax.random.key(1), sampling=sampling)
            ref = sampler_lib.Sampler(config, **kwargs)(params, rows, **call)
            out = sampler_lib.Sampler(config, mesh=mesh, **kwargs)(sharded, rows, **call)
            results[f"{case}/{engine}"] = dict(
                per_shard_steps=[int(x.max()) for x in np.split(out.lengths, data)],
                same_tokens=bool((out.response_tokens == ref.response_tokens).all()),
                same_mask=bool((out.response_mask == ref.response_mask).all()),
            )
    with open(out_path, "w") as f:
        json.dump(results, f)


@pytest.mark.slow  # 124 s alone at 5359c6e (2 cores shared, load about 2.5)
def test_rows_ended_by_sampled_stop_ids_run_to_the_end_on_every_mesh_kind(tmp_path):
    # The setting: top-p (alone and after top-k) on data x tensor, data x fsdp and
    # a MoE model's data x expert mesh, rows ended by sampled stop ids, both engines.
    env = dict(os.environ)
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    out_path = tmp_path / "stop_ids.json"
    child = f"from tests.test_mesh_sampling import stop_id_cases; stop_id_cases({str(out_path)!r})"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", child],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"mesh sampling hung for {TIMEOUT_S} s (a collective inside a loop?)")
    assert proc.returncode == 0, (
        f"rc {proc.returncode} (134 or -6: XLA rendezvous abort)\n{proc.stderr[-3000:]}"
    )
    results = json.loads(out_path.read_text())
    assert len(results) == 2 * len(STOP_CASES)
    for case, r in results.items():
        steps = r["per_shard_steps"]
        assert steps[0] != steps[1], f"{case}: the shards ran the same steps {steps}"
        assert max(steps) < 32, f"{case}: no row ended on a stop id {steps}"
        assert r["same_tokens"] and r["same_mask"], case
