"""The run config's rollout engine: a GRPO run trains the same with either engine.

``sampling.engine="continuous"`` must change how fast rollouts are generated, never what
is learned: every metric of the run that is not a wall time or the engine's own use of
its decode slots must be equal (bit for bit: the continuous engine gives the static
engine's tokens and log-probs, tests/test_rollout_engine.py).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.run_fixtures import TIMING

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Fields that may differ between the engines, by name:
# - every field starting with one of run_fixtures.TIMING: wall times (``time_*``,
#   ``eval_time*``), the throughput rates that divide by them (``flops.RATE_KEYS``:
#   tokens/s, FLOP/s, matmul fractions, responses/s, generation time share) and
#   ``compilations`` (programs this process compiled: the engines have different ones);
# - ``slot_utilisation``: decode tokens / slot-steps of the rollout's sampler calls,
#   which is what the continuous engine changes.
ENGINE_USE = ("slot_utilisation",)


def _learned(records):
    """The records without the fields that may differ between the engines."""
    return [
        {k: v for k, v in r.items() if not k.startswith(TIMING) and k not in ENGINE_USE}
        for r in records
    ]


# Runs both engines in a process with one device (the test session has eight fake
# devices; on a mesh the log-probs are equal only to fp32 rounding): argv = work dir, out dir,
# config changes as JSON. Writes <out>/<engine>.json: the run's metric records.
_SCRIPT = """
import json, os, sys
from rl_batch import artifacts
from rl_batch.runs import run as run_lib
from tests.run_fixtures import tiny_run_config

work_dir, out, changes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for engine, slots in (("static", 0), ("continuous", 3)):
    run_dir = os.path.join(out, engine)
    fields = {**changes, "sampling.engine": engine, "sampling.slots": slots}
    run_lib.run(tiny_run_config(work_dir, run_dir, **fields), progress=False)
    saved = artifacts.read_json(os.path.join(run_dir, artifacts.CONFIG_FILE))["sampling"]
    assert (saved["engine"], saved["slots"]) == (engine, slots), saved
    with open(os.path.join(out, engine + ".json"), "w") as f:
        json.dump(artifacts.read_metrics(run_dir), f)
"""


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("work"))


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"rollout_keys": "prompt", "gen_batch": 8},
        {"partial_rollout.enabled": True, "partial_rollout.tokens_per_iter": 4},
    ],
    ids=["rollout-keys", "prompt-keys-gen-batch", "partial-rollout"],
)
@pytest.mark.slow  # 51 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_a_grpo_run_has_the_same_metrics_with_either_engine(work_dir, tmp_path, changes):
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-c", _SCRIPT, work_dir, str(tmp_path), json.dumps(changes)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    static, continuous = (
        json.loads((tmp_path / f"{engine}.json").read_text()) for engine in ("static", "continuous")
    )
    assert [r["kind"] for r in static] == [r["kind"] for r in continuous]
    assert sum(r["kind"] == "update" for r in static) == 4
    # Exactly equal, as JSON writes them (no tolerance).
    assert json.dumps(_learned(static)) == json.dumps(_learned(continuous))
    # Each run used its engine: 3 refilled slots idle at other steps than 16 rows do
    # (partial rollout books no slot use: its chunks resume rows across updates).
    updates = [(s, c) for s, c in zip(static, continuous) if s["kind"] == "update"]
    if "partial_rollout.enabled" in changes:
        assert not any("slot_utilisation" in c for _, c in updates)
    else:
        assert any(c["slot_utilisation"] != s["slot_utilisation"] for s, c in updates)
