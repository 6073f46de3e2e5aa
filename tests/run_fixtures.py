"""A tiny run config shared by the run, sweep and resume tests (seconds on a CPU)."""

import numbers
import socket

import jax
import numpy as np
import pytest

from experiments.configs import base
from rl_batch.models import flops
from rl_batch.models import transformer as model_lib

# Metrics that depend on wall time or on what this process compiled: they differ between
# two runs of the same computation. Throughput rates divide by wall time.
TIMING = ("time_", "eval_time", "compilations", *flops.RATE_KEYS)

TINY_MODEL = {
    "num_layers": 1,
    "hidden_size": 32,
    "num_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 16,
    "intermediate_size": 64,
}


def tiny_run_config(work_dir: str, run_dir: str = "", **changes):
    """A GRPO run of a few updates on 2-digit addition from a random model."""
    c = base.run_config()
    c.work_dir = work_dir
    c.run_dir = run_dir
    c.task.kwargs = {"n_digits": 2}
    c.task.n_train = 256
    c.task.n_validation = 32
    c.model.overrides = dict(TINY_MODEL)
    c.init.source = "scratch"
    c.prompts, c.group_size = 4, 4
    c.lr_ref, c.batch_ref = 1e-3, 16
    c.budget_responses = 64
    c.eval_every_responses = 32
    c.eval_prompts = 8
    c.eval_k = 2
    c.filter_groups = False  # a random model rarely solves anything: keep every group
    c.checkpoint_every = 2
    c.target = 0.01
    return set_fields(c, changes)


def set_fields(c, changes):
    """Sets dotted config keys (``{"ppo.kl_coef": 0.1}``) in place; returns ``c``."""
    for key, value in changes.items():
        node = c
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return c


# A 2-layer GQA model for the learner and sharding tests (4 query heads, 2 KV heads).
LEARNER_MODEL = model_lib.get_preset(
    "tiny-1m",
    num_layers=2,
    hidden_size=32,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=64,
)


def numpy_params(config, seed: int = 0):
    """Params drawn with numpy like ``model.init_params`` (normal(0.02) weights, unit norm
    scales), without NNX initialisation, which costs seconds of dispatch on a CPU."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: (
            np.ones(s.shape, np.float32)
            if len(s.shape) == 1
            else rng.normal(0.0, 0.02, s.shape).astype(np.float32)
        ),
        model_lib.abstract_params(config),
    )


def free_port() -> int:
    """A TCP port free on localhost now (for a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def deterministic(records, kind=None):
    """``records`` (of one ``kind`` when given) without their timing fields."""
    return [
        {k: v for k, v in r.items() if not k.startswith(TIMING)}
        for r in records
        if kind is None or r["kind"] == kind
    ]


def assert_close(x, y, rel, abs, where=()):
    """Numbers equal within (rel, abs); strings, bools, None and other values exactly.

    Lists and dicts are compared element by element; ``where`` names the failing element.
    """
    if isinstance(x, dict) and isinstance(y, dict):
        assert x.keys() == y.keys(), where
        for key in x:
            assert_close(x[key], y[key], rel, abs, (*where, key))
    elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        assert len(x) == len(y), where
        for i, (xi, yi) in enumerate(zip(x, y)):
            assert_close(xi, yi, rel, abs, (*where, i))
    elif _is_number(x) and _is_number(y):
        assert x == pytest.approx(y, rel=rel, abs=abs, nan_ok=True), where
    else:
        assert x == y, where


def assert_same_records(a, b, rel, abs, what=""):
    """Two lists of metric records agree record by record (see ``assert_close``)."""
    assert len(a) == len(b), (what, len(a), len(b))
    for x, y in zip(a, b):
        assert_close(x, y, rel, abs, (what, x.get("kind"), x.get("step")))


def _is_number(v) -> bool:
    return isinstance(v, numbers.Number) and not isinstance(v, bool)
