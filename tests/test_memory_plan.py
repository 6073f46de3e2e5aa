"""The AOT memory planner: the fit arithmetic, and compiled estimates that show what
remat and chunked log-probs save (relative, on a tiny model with long sequences)."""

import json
import os
import subprocess
import sys

import pytest

from rl_batch.runs import memory_plan


def test_largest_fitting():
    # Peaks 10 + 4 * size: budget 30 fits size 5 (10 + 20), beyond the measured 1, 2.
    assert memory_plan.largest_fitting([1, 2], [14, 18], 30) == (5, True)
    assert memory_plan.largest_fitting([1, 2, 4], [14, 18, 26], 20) == (2, False)
    assert memory_plan.largest_fitting([1, 2], [14, 18], 13) == (0, False)
    assert memory_plan.largest_fitting([4], [26], 30) == (4, False)
    # Flat peaks (params-sized buffers set them): no line, the largest measured size.
    assert memory_plan.largest_fitting([2, 4], [102_010, 102_011], 141_000) == (4, False)
    assert memory_plan.is_flat([102_010, 102_011]) and not memory_plan.is_flat([14, 18])


_SCRIPT = """
import json, sys
from rl_batch.algorithms import learner
from rl_batch.runs import memory_plan
from rl_batch.algorithms import grpo as grpo_lib
from rl_batch.models import transformer as model_lib

base = model_lib.get_preset("tiny-1m", num_layers=4, vocab_size=4096, max_seq_len=1024)
optimizer = learner.make_optimizer(1e-3)
grpo = grpo_lib.GRPOConfig(micro_batches=2)
out = {}
for name, changes in json.loads(sys.argv[1]).items():
    mc = base.replace(**changes)
    m = memory_plan.update_memory(mc, grpo, optimizer, batch=4, prompt_len=32, response_len=480)
    out[name] = m.temp
pre, dec = memory_plan.sampler_memory(base, batch=4, prompt_len=256, response_len=8)
out["prefill_temp"] = pre.temp
print(json.dumps(out))
"""

_ENGINE_SCRIPT = """
# The sampler plans of both engines (a second line, in the same process).
from rl_batch.rollout import sampler as sampler_lib

mc = model_lib.get_preset("tiny-1m", num_layers=2, vocab_size=64, max_seq_len=1024)
out = {"slot_bytes": model_lib.kv_cache_bytes(mc, 1, 1)}
for name, engine, slots in (("static", "static", 0), ("continuous", "continuous", 2),
                           ("narrowing", "continuous", 4)):
    sampling = sampler_lib.SamplingConfig(engine=engine, slots=slots)
    m = memory_plan.sampler_call_memory(mc, sampling, batch=8, prompt_len=32, response_len=480)
    out[name] = {"peak": m.peak, "slots": sampler_lib.kv_cache_slots(sampling, 8, 32, 480)}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def compiled():
    """Compiled update temporaries of four settings and the two sampler engines' plans,
    in one process with the memory-aware CPU scheduler (as experiments.plan_memory runs)."""
    settings = {
        "plain": {},
        "remat": {"remat": "full"},
        "chunked": {"logits_chunk": 64},
        "both": {"remat": "full", "logits_chunk": 64},
    }
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_cpu_enable_concurrency_optimized_scheduler=false"
    )
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT + _ENGINE_SCRIPT, json.dumps(settings)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-2]), json.loads(lines[-1])


@pytest.fixture(scope="module")
def temps(compiled):
    """The update temporaries of four settings and the prefill's (see ``compiled``)."""
    return compiled[0]


@pytest.mark.slow  # 52 s (setup) on a loaded 2-core machine
def test_remat_and_chunking_lower_the_compiled_update_memory(temps):
    # [B/M=2, R=480, V=4096] fp32 logits are 16 MB; a 64-position block is 2 MB.
    logits_bytes = 2 * 480 * 4096 * 4
    assert temps["remat"] < temps["plain"]
    assert temps["chunked"] < temps["plain"] - logits_bytes
    assert temps["both"] < min(temps["remat"], temps["chunked"])


@pytest.mark.slow  # 57 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_prefill_has_no_prompt_logits(temps):
    # [B=4, P=256, V=4096] fp32 prompt logits would be 16 MB on their own.
    assert temps["prefill_temp"] < 4 * 256 * 4096 * 4


def _plan_cli(*flags, config="experiments/configs/grpo_cpu.py"):
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.plan_memory", f"--config={config}"]
        + ["--config.model.preset=tiny-1m", "--prompt_len=8", "--response_len=16"]
        # (At 1 or 2 sequences params-sized buffers set the tiny update's peak: flat, no
        # line to extrapolate. At 64 and 128 the activations show.)
        + ["--micro_seqs=64,128", "--gen_batches=2,4", *flags],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow  # 32 s on a loaded 2-core machine
def test_plan_cli_tables_and_refusal():
    """One run with room to spare, one with a device smaller than the params: the sweep
    table says which points fit and refuses them all on the small device."""
    one_point = ["--config.sweep.prompts=8", "--config.sweep.extra_points="]  # 8x8:sqrt
    roomy = _plan_cli("--device_memory=1e12", *one_point)
    assert "| sequences / micro-batch |" in roomy and "| gen_batch |" in roomy
    assert "sampler engine static, attn_block 0" in roomy
    rows = [line for line in roomy.splitlines() if line.startswith("| 8x8:sqrt")]
    assert len(rows) == 1 and "**no**" not in rows[0]
    # Params alone are ~4 MB: nothing fits, so one compiled size of each is enough.
    tight = _plan_cli("--device_memory=1e5", *one_point, "--micro_seqs=64", "--gen_batches=2")
    rows = [line for line in tight.splitlines() if line.startswith("| 8x8:sqrt")]
    assert len(rows) == 1 and rows[0].count("**no**") == 2


def test_sweep_refuses_points_that_do_not_fit(tmp_path):
    from experiments.configs import base
    from rl_batch.sweeps import sweep
    from tests.run_fixtures import tiny_run_config

    c = base.sweep_config(tiny_run_config(str(tmp_path / "work")))
    c.sweep.prompts, c.sweep.group_sizes = "4", "4"
    c.sweep.device_memory = 1e5  # the tiny model's params alone are larger
    started = []
    with pytest.raises(ValueError) as e:
        sweep.run_sweep(c, str(tmp_path / "sweep"), run_fn=started.append, log=lambda s: None)
    message = str(e.value)
    assert message.startswith("sweep points do not fit in memory")
    assert "p4_g4_sqrt_s0: the update needs" in message and "p4_g4_sqrt_s0: the sampler" in message
    assert not started
    _, resolved = sweep.plan(c, str(tmp_path / "sweep"), 1)
    assert sweep.check_memory(resolved, 1e12, str(tmp_path / "sweep")) == []


@pytest.mark.parametrize(
    "name, flags",
    [
        ("grpo_study", ["--config.init.source=scratch"]),
        ("grpo_gpu", []),
        ("grpo_tpu", ["--batch_shards=4", "--device_memory=95e9"]),
    ],
)
@pytest.mark.slow  # 6-38 s each on a loaded 2-core machine
def test_study_configs_plan_every_point(name, flags):
    """The accelerator configs' own micro_batch_seqs / gen_batch, through the planner's
    sweep table (tiny shapes: the real ones are in docs/memory.md): every grid
    point gets a micro-batch count and fits."""
    out = _plan_cli(*flags, config=f"experiments/configs/{name}.py")
    rows = [line for line in out.splitlines() if line.startswith("| ") and ":" in line[:20]]
    assert rows and all("**no**" not in row for row in rows), out


@pytest.mark.slow  # 57 s (the compiled fixture) in the fast tier at db28227
def test_the_sampler_plan_follows_the_continuous_engines_cache_layout(compiled):
    out = compiled[1]
    static, cont = out["static"], out["continuous"]
    # By hand: static B x (P + R) = 8 x 512 slots; continuous N x P + C x (P + R) = 8 x 32
    # + 2 x 512 (every row's prompt cache, and the 2 decode slots), + 1 x 512 while the 2
    # slots narrow to 1.
    assert static["slots"] == 4096 and cont["slots"] == 8 * 32 + 3 * 512
    # The compiled programs hold those caches: each peak covers its cache, and the
    # continuous program (sample_continuous, not the static prefill + decode) saves at
    # least half of the 2304 slots' bytes it does not allocate.
    # 4 slots narrow to 2 (``_compact``): both caches at once, 8 x 32 + (4 + 2) x 512.
    assert out["narrowing"]["slots"] == 8 * 32 + 6 * 512
    for m in (static, cont, out["narrowing"]):
        assert m["peak"] >= m["slots"] * out["slot_bytes"]
    saved = (static["slots"] - cont["slots"]) * out["slot_bytes"]
    assert static["peak"] - cont["peak"] >= saved / 2
