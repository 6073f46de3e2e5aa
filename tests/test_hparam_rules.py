"""Batch-tied rules for hyperparameters beyond the LR (``hparam_rules``): the derived
values in the spec and config.json, their checks, old config.json files, the warm-up
schedule and a sweep variant that runs a rule (numbers worked by hand)."""

import json
import math
import os

import jax.numpy as jnp
import optax
import pytest
from ml_collections import ConfigDict

from experiments.configs import base
from rl_batch.algorithms import learner
from rl_batch.runs import config as config_lib
from rl_batch.sweeps import sweep
from tests.run_fixtures import set_fields, tiny_run_config


def _config(**changes):
    c = base.run_config()
    c.run_dir = "/tmp/unused"
    return set_fields(c, changes)


# B = 32 x 8 = 256 = 2 x batch_ref (128): k = 2.
K2 = {"prompts": 32, "group_size": 8}


def test_the_defaults_derive_what_the_code_did_before_the_rules():
    spec = config_lib.resolve(_config(**K2), 1)
    derived = spec.to_json()["derived"]
    assert (derived["b1"], derived["b2"], derived["eps"]) == (0.9, 0.999, 1e-8)
    assert (derived["clip_low"], derived["clip_high"]) == (0.2, 0.28)
    assert (derived["lr_warmup_updates"], derived["hparam_arithmetic"]) == (0, "")
    assert (spec.algorithm.clip_low, spec.algorithm.clip_high) == (0.2, 0.28)
    assert spec.lr_arithmetic == (
        "rule=sqrt: k = B / B_ref = 256 / 128 = 2; lr = lr_ref * sqrt(k) = 5e-05 * 1.41421 "
        "= 7.07107e-05"
    )
    # No warm-up: the optimizer gets the float LR itself (bit-identical programs).
    assert learner.warmup_lr(spec.optimizer.lr, spec.lr_warmup_updates) == spec.optimizer.lr


def test_each_rule_at_twice_the_reference_batch_by_hand():
    rules = {"hparam_rules.adam": "sde", "hparam_rules.clip": "sqrt"}
    rules["hparam_rules.warmup"] = "responses"
    spec = config_lib.resolve(_config(lr_warmup_updates=20, **rules, **K2), 1)
    d = spec.to_json()["derived"]
    # k = 2: b1 = 1 - 2 * 0.1 = 0.8, b2 = 1 - 2 * 0.001 = 0.998, eps = 1e-8 / sqrt(2).
    assert (d["b1"], d["b2"]) == (pytest.approx(0.8), pytest.approx(0.998))
    assert d["eps"] == pytest.approx(7.0710678e-9)
    assert d["lr"] == pytest.approx(5e-5 * math.sqrt(2))  # the LR rule is unchanged
    # clip * sqrt(2): 0.2 -> 0.282843, 0.28 -> 0.395980; the algorithm trains with them.
    assert (d["clip_low"], d["clip_high"]) == (pytest.approx(0.2828427), pytest.approx(0.3959798))
    assert spec.algorithm.clip_low == d["clip_low"]
    assert spec.inputs.grpo.clip_low == 0.2  # the input as configured
    # 20 updates of 128 responses = 2560 responses = 10 updates of 256.
    assert d["lr_warmup_updates"] == 10
    assert "rule=sqrt, adam=sde" in d["lr_arithmetic"]
    assert d["hparam_arithmetic"] == (
        "clip=sqrt: clip * sqrt(k): clip_low = 0.2 * 1.41421 = 0.282843, clip_high = 0.28 * "
        "1.41421 = 0.39598; warmup=responses: lr_warmup_updates = round(W * B_ref / B) = "
        "round(20 * 128 / 256) = 10"
    )
    # config.json reads back as the same spec, and resumes against itself.
    again = config_lib.load_spec(json.loads(json.dumps(spec.to_json())))
    assert again == spec
    assert config_lib.resume_diffs(json.loads(json.dumps(spec.to_json())), spec.to_json()) == []
    # "updates" keeps the warm-up at 20 updates at any batch.
    kept = config_lib.resolve(_config(lr_warmup_updates=20, **K2), 1)
    assert kept.lr_warmup_updates == 20


def test_ppo_clips_and_a_malladi_critic_beside_the_sde_rule():
    changes = {
        "algo": "ppo",
        "group_size": 1,
        "prompts": 256,
        "filter_groups": False,
        "hparam_rules.adam": "sde",
        "hparam_rules.clip": "sqrt",
        "ppo.critic_lr_rule": "malladi",
    }
    spec = config_lib.resolve(_config(**changes), 1)
    # k = 256 / 128 = 2: ppo's 0.2 / 0.2 -> 0.282843 both.
    assert spec.algorithm.clip_low == spec.algorithm.clip_high == pytest.approx(0.2828427)
    # Both networks at b1 = 0.8 (the critic by malladi itself, not twice).
    assert spec.optimizer.b1 == pytest.approx(0.8)
    assert spec.critic_optimizer.b1 == pytest.approx(0.8)


def test_the_rules_are_checked_with_one_line_naming_the_field():
    cases = [
        ({"hparam_rules.adam": "lion"}, "hparam_rules.adam='lion': expected one of"),
        ({"hparam_rules.clip": "linear"}, "hparam_rules.clip='linear': expected one of"),
        ({"hparam_rules.warmup": "tokens"}, "hparam_rules.warmup='tokens': expected one of"),
        ({"lr_warmup_updates": -3}, "lr_warmup_updates=-3: must be an int >= 0"),
        (
            {"hparam_rules.adam": "sde", "lr_rule": "malladi"},
            "hparam_rules.adam='sde' with lr_rule='malladi': malladi already scales",
        ),
        ({"hparam_rules.adam": "sde", "lr": 1e-4}, "hparam_rules.adam='sde' with lr=0.0001"),
    ]
    for changes, message in cases:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            config_lib.resolve(_config(**changes), 1)
    c = _config(**{"hparam_rules.clip": "sqrt"})
    c.hparam_rules.momentum = "sde"
    with pytest.raises(ValueError, match=r"hparam_rules.momentum: no such rule"):
        config_lib.resolve(c, 1)
    # (A batch schedule serves every rule, the clip's at each batch: tests/test_batch_schedule.py.)


def test_a_batch_schedule_applies_the_sde_rule_at_each_batch():
    changes = {
        "hparam_rules.adam": "sde",
        "batch_schedule.kind": "warmup",
        "batch_schedule.start_prompts": 4,
        "batch_schedule.responses": 512,
    }
    spec = config_lib.resolve(_config(**changes), 1)  # P = 16, G = 8: B = 128 = B_ref
    assert spec.optimizer.b1 == pytest.approx(0.9)
    # At P = 4: B = 32, k = 1/4: b1 = 1 - 0.025 = 0.975, eps = 1e-8 * 2.
    at = spec.optimizer_at(32)
    assert (at.b1, at.eps) == (pytest.approx(0.975), pytest.approx(2e-8))


def test_a_config_json_from_before_the_rules_loads_with_its_clips_and_no_warmup():
    path = os.path.join(os.path.dirname(__file__), "data", "config_62017dd.json")
    with open(path) as f:
        old = json.load(f)
    assert "hparam_rules" not in old and "clip_low" not in old["derived"]
    spec = config_lib.load_spec(old)
    assert (spec.clip_low, spec.clip_high) == (old["grpo"]["clip_low"], old["grpo"]["clip_high"])
    assert (spec.lr_warmup_updates, spec.hparam_arithmetic) == (0, "")
    # Resolved again from its inputs (the section missing), it derives the same.
    again = config_lib.resolve(ConfigDict({k: v for k, v in old.items() if k != "derived"}), 1)
    assert (again.clip_low, again.lr_warmup_updates) == (spec.clip_low, 0)
    # A run dir from before resumes under a config that sets a rule only when it keeps
    # the default; a rule off it is named.
    new = config_lib.resolve(_config(), 1).to_json()
    saved = json.loads(json.dumps(new))
    del saved["hparam_rules"], saved["lr_warmup_updates"]
    for key in ("clip_low", "clip_high", "lr_warmup_updates", "hparam_arithmetic"):
        del saved["derived"][key]
    assert config_lib.resume_diffs(saved, new) == []
    changed = config_lib.resolve(_config(**{"hparam_rules.clip": "sqrt"}), 1).to_json()
    diffs = {d.split(":")[0] for d in config_lib.resume_diffs(saved, changed)}
    assert diffs == {"hparam_rules.clip", "derived.hparam_arithmetic"}  # (k = 1: same clips)


def test_the_warmup_schedule_by_hand():
    # W = 4, lr = 0.1: updates 0..5 train at 0.025, 0.05, 0.075, 0.1, 0.1, 0.1.
    opt = learner.make_optimizer(learner.warmup_lr(0.1, 4))
    params = {"w": jnp.ones((2, 2))}
    state = opt.init(params)
    seen = []
    for _ in range(6):
        updates, state = opt.update({"w": jnp.ones((2, 2))}, state, params)
        params = optax.apply_updates(params, updates)
        seen.append(float(learner.current_lr(state)))
    assert seen == pytest.approx([0.025, 0.05, 0.075, 0.1, 0.1, 0.1])
    # Its state holds arrays only (the schedule's own count beside the hyperparameters):
    # a checkpoint of it saves and restores as any other.
    import jax

    assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(state))
    assert int(state.hyperparams_states["learning_rate"].count) == 6
    with pytest.raises(ValueError, match="warm-up updates must be an int >= 0"):
        learner.warmup_lr(0.1, -1)


def test_a_sweep_variant_runs_a_rule_at_its_points_batch(tmp_path):
    c = base.sweep_config(tiny_run_config("/tmp/unused"))  # batch_ref 16, clips 0.2 / 0.28
    c.sweep.prompts, c.sweep.group_sizes, c.sweep.seeds = "4,8", "4", "0"
    c.lr_warmup_updates = 6
    c.sweep.variants = {
        "adam-sde": {"hparam_rules": {"adam": "sde"}},
        "all-rules": {"hparam_rules": {"adam": "sde", "clip": "sqrt", "warmup": "responses"}},
    }
    c.sweep.extra_points = "8x4:sqrt@adam-sde,8x4:sqrt@all-rules"
    _, resolved = sweep.plan(c, str(tmp_path))
    plain, sde = resolved["p8_g4_sqrt_s0"], resolved["p8_g4_sqrt_adam-sde_s0"]
    every = resolved["p8_g4_sqrt_all-rules_s0"]
    # B = 32 = 2 x 16: the variant's betas/eps by the SDE rule, the plain point's as given.
    d = sde.to_json()["derived"]
    assert (d["b1"], d["b2"], d["eps"]) == (
        pytest.approx(0.8),
        pytest.approx(0.998),
        pytest.approx(1e-8 / math.sqrt(2)),
    )
    assert (d["clip_low"], d["clip_high"], d["lr_warmup_updates"]) == (0.2, 0.28, 6)
    assert (plain.optimizer.b1, plain.clip_low, plain.lr_warmup_updates) == (0.9, 0.2, 6)
    assert sde.optimizer.lr == plain.optimizer.lr  # the same LR rule
    d = every.to_json()["derived"]
    assert (d["clip_low"], d["clip_high"]) == (pytest.approx(0.2828427), pytest.approx(0.3959798))
    assert d["lr_warmup_updates"] == 3  # 6 x 16 / 32
    assert sde.inputs.variant == "adam-sde" and sde.inputs.hparam_rules.adam == "sde"
