"""Run-config validation: one clear error per bad field, derived values computed once."""

import dataclasses
import functools
import json
import math
import os
import re

import pytest
from ml_collections import ConfigDict

from experiments.configs import base, grpo_cpu
from rl_batch.algorithms import lr_rules
from rl_batch.runs import config as config_lib
from tests.run_fixtures import set_fields


def _config(**changes):
    c = base.run_config()
    c.run_dir = "/tmp/unused"
    return set_fields(c, changes)


def test_sqrt_rule_derives_the_lr():
    c = config_lib.resolve(_config(prompts=32, group_size=8, lr_ref=1e-4, batch_ref=64), 1)
    # B = 256 = 4 x B_ref, so lr = 1e-4 * sqrt(4) = 2e-4.
    assert math.isclose(c.optimizer.lr, 2e-4)
    assert c.inputs.lr is None  # the input: unset
    assert c.batch == 256
    assert "sqrt" in c.lr_arithmetic


def test_fixed_rule_keeps_the_reference_lr():
    c = config_lib.resolve(_config(prompts=32, lr_rule="fixed", lr_ref=1e-4, batch_ref=64), 1)
    assert math.isclose(c.optimizer.lr, 1e-4)


def test_explicit_lr_overrides_the_rule():
    c = config_lib.resolve(_config(lr=3e-4, lr_rule="malladi", prompts=32, group_size=8), 1)
    assert c.inputs.lr == c.optimizer.lr == 3e-4
    # A fixed LR trains with the Adam settings as given (the rule rescales none of them).
    assert (c.optimizer.b1, c.optimizer.b2, c.optimizer.eps) == (0.9, 0.999, 1e-8)


def test_surge_rule_needs_and_uses_the_noise_scale():
    # B = 32 x 8 = 256, B_ref = 64, B_noise = 256: lr = 1e-4 * f(64) / f(256) = 1e-4 * 2.5 / 2.
    changes = dict(prompts=32, group_size=8, lr_ref=1e-4, batch_ref=64, lr_rule="surge")
    c = config_lib.resolve(_config(lr_rule_noise_scale=256.0, **changes), 1)
    assert math.isclose(c.optimizer.lr, 1.25e-4)
    assert "B_noise = 256" in c.lr_arithmetic
    with pytest.raises(ValueError, match=r"^invalid config: lr_rule='surge': .*B_noise > 0") as e:
        config_lib.resolve(_config(**changes), 1)
    assert "\n" not in str(e.value)


def test_group_noise_is_checked_against_the_derived_micro_batches():
    ok = config_lib.resolve(
        _config(prompts=16, group_size=8, **{"grpo.micro_batches": 4, "grpo.group_noise": True}), 1
    )
    assert ok.algorithm.group_noise and ok.algorithm.group_size == 8
    with pytest.raises(ValueError, match=r"grpo.group_noise=True: .*micro_batches >= 4"):
        config_lib.resolve(_config(**{"grpo.micro_batches": 2, "grpo.group_noise": True}), 1)
    with pytest.raises(ValueError, match=r"grpo.group_noise=True: .*prompts \(6\) divisible"):
        config_lib.resolve(
            _config(prompts=6, **{"grpo.micro_batches": 8, "grpo.group_noise": True}), 1
        )


# A batch of 256 responses, twice the base config's batch_ref of 128 (k = 2).
BATCH_256 = {
    "grpo": {"prompts": 32, "group_size": 8},
    "ppo": {"algo": "ppo", "prompts": 256, "group_size": 1, "filter_groups": False},
}


def _resolve_again(spec):
    """A run's config.json resolved anew (its derived section ignored)."""
    return config_lib.resolve(ConfigDict(json.loads(json.dumps(spec.to_json()))), 1)


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_malladi_rule_scales_adam_once_however_often_resolved(algo):
    once = config_lib.resolve(_config(lr_rule="malladi", **BATCH_256[algo]), 1)
    twice = _resolve_again(once)
    # k = 2: lr = 5e-5 * sqrt(2), 1 - b -> 2 (1 - b), eps -> 1e-8 / sqrt(2).
    for c in (once, twice, _resolve_again(twice)):
        d = c.optimizer
        assert d.lr == pytest.approx(5e-5 * math.sqrt(2))
        assert (d.b1, d.b2, d.eps) == pytest.approx((0.8, 0.998, 1e-8 / math.sqrt(2)))
        i = c.inputs
        assert (i.lr, i.b1, i.b2, i.eps) == (None, 0.9, 0.999, 1e-8)  # the inputs
        assert "b1 = 1 - k * (1 - 0.9) = 1 - 2 * 0.1 = 0.8" in c.lr_arithmetic
        assert "b2 = 1 - k * (1 - 0.999) = 1 - 2 * 0.001 = 0.998" in c.lr_arithmetic
        if algo == "ppo":  # the critic's rule starts from the reference betas too
            critic = c.critic_rule
            assert c.critic_optimizer.lr == pytest.approx(1e-3 * math.sqrt(2))
            assert c.inputs.ppo.critic_lr is None
            assert (critic.ref_b1, critic.ref_b2, critic.ref_eps) == (0.9, 0.999, 1e-8)
            assert (critic.b1, critic.b2) == pytest.approx((0.8, 0.998))
            assert critic.eps == pytest.approx(1e-8 / math.sqrt(2))


@pytest.mark.parametrize("rule", lr_rules.RULES)
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
@pytest.mark.parametrize("fixed", [{}, {"lr": 3e-4, "ppo.critic_lr": 2e-3}])
def test_resolve_is_idempotent(rule, algo, fixed):
    once = config_lib.resolve(
        _config(lr_rule=rule, lr_rule_noise_scale=512.0, **BATCH_256[algo], **fixed), 1
    )
    assert _resolve_again(once).to_json() == once.to_json()
    # A run's config.json reads back as the spec that wrote it, without resolving.
    assert config_lib.load_spec(json.loads(json.dumps(once.to_json()))) == once


@pytest.mark.parametrize("rule", lr_rules.RULES)
@pytest.mark.parametrize("algo", ["grpo", "ppo"])
@pytest.mark.parametrize(
    "changes",
    [{}, {"lr": 3e-4, "ppo.critic_lr": 2e-3}, {"grpo.micro_batch_seqs": 64}],
)
def test_resolve_leaves_every_input_as_given(rule, algo, changes):
    given = _config(lr_rule=rule, lr_rule_noise_scale=512.0, **BATCH_256[algo], **changes)
    resolved = config_lib.resolve(given, 1).to_json()
    derived = resolved.pop("derived")
    assert resolved == json.loads(json.dumps(given.to_dict()))
    assert derived["lr"] > 0 and derived["micro_batches"] >= 1


def test_derived_micro_batches_come_from_the_memory_budget():
    c = config_lib.resolve(_config(prompts=32, group_size=8, **{"grpo.micro_batch_seqs": 64}), 1)
    assert c.micro_batches == 256 // 64 and c.inputs.grpo.micro_batches == 1  # the input
    assert config_lib.resolve(_config(**{"grpo.micro_batches": 2}), 1).micro_batches == 2


def test_resolve_recomputes_an_input_derived_section():
    stale = config_lib.resolve(_config(), 1).to_json()
    stale["derived"]["lr"] = 123.0  # stale: resolve does not read it
    assert config_lib.resolve(ConfigDict(stale), 1).optimizer.lr == pytest.approx(5e-5)


def test_a_spec_is_frozen_and_reads_back_from_its_json():
    spec = config_lib.resolve(_config(**BATCH_256["ppo"]), 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.batch = 1
    with pytest.raises(AttributeError):
        spec.inputs.prompts = 1
    back = config_lib.load_spec(json.loads(json.dumps(spec.to_json())))
    assert back == spec and back.algorithm == spec.algorithm and back.model == spec.model
    assert spec.config.derived.lr == spec.optimizer.lr  # the read-only view of the JSON


def test_a_field_changed_after_resolve_is_the_new_input():
    once = config_lib.resolve(_config(lr_rule="malladi", prompts=32, group_size=8), 1)
    changed = ConfigDict(once.to_json())
    changed.b1, changed.prompts = 0.95, 64  # B = 512: k = 4
    again = config_lib.resolve(changed, 1).optimizer
    assert again.lr == pytest.approx(5e-5 * 2)  # re-derived, not kept from k = 2
    assert again.b1 == pytest.approx(1 - 4 * 0.05)  # from the new reference b1
    assert again.b2 == pytest.approx(1 - 4 * 0.001)  # the original reference b2


def test_response_length_comes_from_the_task():
    c = config_lib.resolve(_config(), 1)
    # 3-digit addition: "abc+def=" (8 chars) + BOS. Scratchpad response: three column
    # steps "a+b+c=cs" (8 chars) joined by 2 commas, ">" and 4 answer digits = 31, + EOS.
    assert c.max_prompt_len == 9
    assert c.max_new_tokens == 32


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"lr": -1e-3}, "lr=-0.001: must be > 0"),
        ({"lr": -1.0}, "lr=-1.0: must be > 0, or None (unset) to derive it from lr_rule"),
        ({"lr_ref": -1e-3}, "lr_ref=-0.001"),
        ({"lr_ref": float("inf")}, "lr_ref=inf: must be finite and > 0"),
        ({"lr_ref": float("nan")}, "lr_ref=nan: must be finite and > 0"),
        ({"lr": float("inf")}, "lr=inf: must be > 0"),
        ({"group_size": 1}, "group_size=1: GRPO needs >= 2"),
        ({"task.name": "sudoku"}, "task.name='sudoku'"),
        ({"model.preset": "gpt-9"}, "model.preset='gpt-9'"),
        ({"lr_rule": "cubic"}, "lr_rule='cubic'"),
        ({"target": 1.5}, "target=1.5"),
        ({"init.source": "hf"}, "needs init.path"),
        ({"model.overrides": {"max_seq_len": 8}}, "exceed the model context max_seq_len=8"),
        ({"rollout_keys": "batch"}, "rollout_keys='batch': must be one of ('rollout', 'prompt')"),
        (
            {"rollout_keys": "prompt", "partial_rollout.enabled": True},
            'partial_rollout continues groups across rollouts: it needs rollout_keys="rollout"',
        ),
    ],
)
def test_bad_values_are_named(changes, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_lib.resolve(_config(**changes), 1)


PPO = {"algo": "ppo", "group_size": 1, "filter_groups": False}


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"grpo.loss_agg": "sum"}, "grpo.loss_agg='sum'"),
        ({"grpo.advantage": "ppo"}, "grpo.advantage='ppo'"),
        ({"grpo.clip_low": 1.0}, "grpo.clip_low=1.0"),
        ({"grpo.clip_low": -0.1}, "grpo.clip_low=-0.1"),
        ({"grpo.num_epochs": 0}, "grpo.num_epochs=0"),
        ({"checkpoint_every": 0}, "checkpoint_every=0: must be an int >= 1"),
        ({"checkpoint_min_s": -1.0}, "checkpoint_min_s=-1.0: must be a number >= 0"),
        ({"checkpoint_min_s": float("nan")}, "checkpoint_min_s=nan: must be a number >= 0"),
        ({"prune_at_target": "latest"}, "prune_at_target='latest': must be '' or a sweep"),
        ({"confirm_evals": 0}, "confirm_evals=0: must be an int >= 1"),
        ({"max_consecutive_skips": 0}, "max_consecutive_skips=0: must be an int >= 1"),
        ({"max_empty_rollouts": -1}, "max_empty_rollouts=-1: must be an int >= 1"),
        (
            {"async_rollout.enabled": True, "async_rollout.max_staleness": 0},
            "async_rollout.max_staleness=0: must be an int >= 1",
        ),
        ({"gen_batch": -1}, "gen_batch=-1: must be an int >= 0"),
        ({"max_new_tokens": -5}, "max_new_tokens=-5: must be an int >= 0"),
        ({"sampling.top_p": 0.0}, "sampling.top_p=0.0"),
        ({"sampling.top_p": 1.5}, "sampling.top_p=1.5"),
        ({"sampling.top_k": -1}, "sampling.top_k=-1"),
        ({"sampling.temperature": 0.0}, "sampling.temperature=0.0"),
        ({"seed": -1}, "seed=-1: must be an int >= 0"),
        ({"init.source": "checkpoint", "init.path": "/nonexistent/ckpt"}, "no such directory"),
        ({"max_new_tokens": 2}, "max_new_tokens=2: the task's responses take up to"),
        ({"pretrain.stop_metric": "greedy"}, "pretrain.stop_metric='greedy': expected"),
        ({"eval_metric": "pass"}, "eval_metric='pass': expected one of ('mean_at_k', 'p_ref')"),
        ({"eval_ref_prompts": -1}, "eval_ref_prompts=-1: must be >= 0"),
        ({"eval_ref_chunk": 0}, "eval_ref_chunk=0: must be an int >= 1"),
        ({"eval_metric": "p_ref", "eval_sampled_every": 0}, "eval_sampled_every=0: must be"),
        ({"eval_sampled_every": 2}, "eval_sampled_every=2 needs eval_metric='p_ref'"),
        ({"target": 0.4, "target_band_lo": 0.4}, "target_band_lo=0.4: must be below the target"),
        ({"target_crossing": "nearest"}, "target_crossing='nearest': expected one of"),
        ({"task.name": "math", "eval_metric": "p_ref"}, "eval_metric='p_ref' needs a task with"),
        ({"b1": 1.0}, "b1=1.0: must be in [0, 1)"),
        ({"eps": -1e-8}, "eps=-1e-08: must be >= 0"),
        ({**PPO, "ppo.critic_lr": -0.5}, "ppo.critic_lr=-0.5: must be > 0, or None (unset)"),
        ({**PPO, "ppo.critic_lr": 0.0}, "ppo.critic_lr=0.0: must be > 0, or None (unset)"),
        ({**PPO, "ppo.critic_lr_ref": float("inf")}, "ppo.critic_lr_ref=inf: must be finite"),
    ],
)
def test_bad_fields_are_rejected_by_key_and_value(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        config_lib.resolve(_config(**changes), 1)
    assert str(e.value).startswith("invalid config: ")


def test_every_bad_field_is_named_at_once():
    bad = {"checkpoint_every": 0, "sampling.top_k": -2, "grpo.loss_agg": "sum"}
    with pytest.raises(ValueError) as e:
        config_lib.resolve(_config(**bad), 1)
    for key, value in bad.items():
        assert f"{key}={value!r}" in str(e.value)


@pytest.mark.parametrize(
    "changes",
    [
        {"gen_batch": 0},  # the whole batch at once
        {"max_new_tokens": 0},  # the task's response length
        {"sampling.top_k": 0, "sampling.top_p": 1.0},  # filters off
        {"async_rollout.enabled": False, "async_rollout.max_staleness": 0},  # unused
        {"max_grad_norm": 0.0},  # clipping off
        {"lr": None},  # derived
        {**PPO, "ppo.critic_lr": None},  # derived
    ],
)
def test_documented_sentinels_are_accepted(changes):
    config_lib.resolve(_config(**changes), 1)


def test_a_rule_between_grpo_fields_is_judged_on_the_configured_values():
    # GSPO needs the sequence-mean aggregation: configured together they resolve; each
    # field used to be checked beside the other's default and GSPO could not be set.
    gspo = {"grpo.policy_loss": "gspo", "grpo.loss_agg": "seq_mean_token_mean"}
    assert config_lib.resolve(_config(**gspo), 1).algorithm.policy_loss == "gspo"
    with pytest.raises(ValueError) as e:
        config_lib.resolve(_config(**{"grpo.policy_loss": "gspo"}), 1)
    assert str(e.value) == (
        "invalid config: grpo.policy_loss='gspo': GRPOConfig.loss_agg='token_mean' is "
        "invalid: expected 'seq_mean_token_mean' with policy_loss='gspo' (a sequence mean)"
    )


def test_batch_must_divide_over_the_data_axis():
    with pytest.raises(ValueError, match=r"3 x 2 = 6 is not divisible by the data-parallel size 4"):
        config_lib.resolve(_config(prompts=3, group_size=2), 4)


def test_mesh_must_fit_the_devices():
    with pytest.raises(ValueError, match="does not fit 8 devices"):
        config_lib.resolve(_config(**{"mesh.data": 3}), 8)


def test_default_study_config_resolves():
    c = grpo_cpu.get_config()
    del c["sweep"]
    c.run_dir = "/tmp/unused"
    assert config_lib.resolve(c, 1).optimizer.lr > 0


@pytest.mark.parametrize(
    "name", ["grpo_cpu", "grpo_schedule_cpu", "grpo_long_cpu", "ppo_cpu", "grpo_gpu", "grpo_tpu"]
)
@pytest.mark.slow  # 9 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_every_study_grid_resolves(name, tmp_path):
    import importlib

    from rl_batch.sweeps import sweep

    config = importlib.import_module(f"experiments.configs.{name}").get_config()
    if name == "grpo_schedule_cpu":
        # The adaptive schedule reads q(B) from the default study's calibration; without
        # it the grid is refused in one line, before compute.
        with pytest.raises(ValueError, match="batch_schedule.calibration=.*: no such file"):
            sweep.plan(config, str(tmp_path / "without"))
        path = tmp_path / "calibration.json"
        configs = {f"{p}x8:sqrt": {"batch": 8 * p, "step_s_median": 0.1} for p in (2, 4, 8, 16)}
        path.write_text(json.dumps({"configs": configs}))
        config.sweep.variants["adaptive"]["batch_schedule"]["calibration"] = str(path)
    points, resolved = sweep.plan(config, str(tmp_path))
    assert points and all(r.optimizer.lr > 0 and r.inputs.lr is None for r in resolved.values())


def test_resume_compares_a_run_dirs_config_json_with_the_new_resolved_config():
    def resolved(devices=1, **changes):
        return config_lib.resolve(_config(lr_rule="malladi", **changes), devices).to_json()

    saved = json.loads(json.dumps(resolved()))  # a run dir's config.json
    assert config_lib.resume_diffs(saved, resolved()) == []
    # Its own config.json resolved again (experiments.train --config_json) resumes too.
    assert config_lib.resume_diffs(saved, config_lib.resolve(ConfigDict(saved), 1).to_json()) == []
    # More devices (derived.device_count may differ) resume ...
    assert config_lib.resume_diffs(saved, resolved(devices=2)) == []
    # ... a new lr_ref does not, and the effective LR it changes is named too.
    paths = {d.split(":")[0] for d in config_lib.resume_diffs(saved, resolved(lr_ref=1e-4))}
    assert {"lr_ref", "derived.lr"} <= paths and "lr" not in paths


def test_a_run_dir_from_before_a_field_existed_resumes_when_the_field_keeps_its_default():
    new = config_lib.resolve(_config(), 1).to_json()
    old = json.loads(json.dumps(new))
    for key in ("chat_template_kwargs", "eval_fraction", "split_seed", "system_prompt"):
        del old["task"][key]
    del old["tracking"], old["log_generations"]
    assert config_lib.resume_diffs(old, new) == []
    # A new value of such a field does not resume ...
    changed = config_lib.resolve(_config(**{"task.split_seed": 2}), 1).to_json()
    assert config_lib.resume_diffs(old, changed) == ["task.split_seed: 0 -> 2"]
    # ... and a math run (validation unshuffled before split_seed) does not either.
    old["task"]["name"] = new["task"]["name"] = "math"
    assert config_lib.resume_diffs(old, new) == ["task.split_seed: None -> 0"]


def test_the_rollout_engine_fields_are_checked_before_any_compute():
    cases = {
        "sampling.engine": ("paged", "sampling.engine='paged': SamplingConfig.engine must be"),
        "sampling.slots": (-1, "sampling.slots=-1: SamplingConfig.slots must be an int >= 0"),
        "sampling.attn_block": (-8, "sampling.attn_block=-8: SamplingConfig.attn_block must"),
        "sampling.min_slots": (0, "sampling.min_slots=0: SamplingConfig.min_slots must be"),
    }
    for key, (value, message) in cases.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            config_lib.resolve(_config(**{key: value}), 1)
    # On several devices the continuous engine splits its rows and slots over the data axis.
    two = config_lib.resolve(_config(**{"sampling.engine": "continuous"}), 2)
    assert two.to_json()["sampling"]["engine"] == "continuous"
    spec = config_lib.resolve(
        _config(
            **{"sampling.engine": "continuous", "sampling.slots": 8, "sampling.attn_block": 16}
        ),
        1,
    )
    saved = spec.to_json()["sampling"]  # config.json records them as configured
    assert (saved["engine"], saved["slots"], saved["attn_block"]) == ("continuous", 8, 16)


def test_a_run_dir_from_before_the_engine_fields_resumes_with_the_static_engine():

    new = config_lib.resolve(_config(), 1).to_json()
    old = json.loads(json.dumps(new))
    for key in ("engine", "slots", "attn_block", "min_slots"):
        del old["sampling"][key]
    assert config_lib.resume_diffs(old, new) == []
    # Its config.json loads and resolves again, and its rollouts use the static engine.
    for spec in (config_lib.load_spec(old), config_lib.resolve(ConfigDict(old), 1)):
        sampling = spec.rollout.sampling.method
        assert (sampling.engine, sampling.slots, sampling.attn_block) == ("static", 0, 0)
        assert sampling.min_slots == 1
    changed = config_lib.resolve(_config(**{"sampling.engine": "continuous"}), 1).to_json()
    assert config_lib.resume_diffs(old, changed) == ["sampling.engine: 'static' -> 'continuous'"]
    # The loop widths change no token: a run resumes with others.
    widths = {"sampling.min_slots": 4, "sampling.widths_per_halving": 2}
    assert config_lib.resume_diffs(old, config_lib.resolve(_config(**widths), 1).to_json()) == []


def test_a_config_json_written_at_62017dd_resumes_under_todays_defaults():
    """Every field added since (``ADDED_FIELDS``) reads as its old behaviour: a run
    directory of 62017dd (the base run config, resolved then) resumes with no change."""
    from experiments.configs import base

    path = os.path.join(os.path.dirname(__file__), "data", "config_62017dd.json")
    with open(path) as f:
        old = json.load(f)
    c = base.run_config()
    c.run_dir, c.work_dir = "/tmp/r", "/tmp/w"  # (as the file was written)
    assert config_lib.resume_diffs(old, config_lib.resolve(c, 1).to_json()) == []


@pytest.mark.parametrize(
    "name, module, overrides",
    [
        # (grpo_cpu's settings changed since: micro-batches of 32, 64-row p_ref calls
        # and a minute between checkpoints; every config's continuous engine narrows to
        # one slot.)
        (
            "grpo",
            "grpo_cpu",
            {
                "prompts": 8,
                "group_size": 8,
                "lr_rule": "sqrt",
                "grpo.micro_batch_seqs": 0,
                "eval_ref_chunk": 256,
                "checkpoint_min_s": 0.0,
                "sampling.min_slots": 2,
                "eval_sampled_every": 1,
            },
        ),  # fmt: skip
        ("ppo", "ppo_cpu", {"sampling.min_slots": 2}),
    ],
)
def test_a_config_json_written_at_35add6f_loads_and_resumes(name, module, overrides):
    """config.json files written by 35add6f (the behaviour check's reference and ppo_cpu
    runs, before the typed sections) read back as their specs and resume under today's
    config of the same point, with the settings changed since set back."""
    import importlib

    path = os.path.join(os.path.dirname(__file__), "data", f"config_35add6f_{name}.json")
    with open(path) as f:
        old = json.load(f)
    c = importlib.import_module(f"experiments.configs.{module}").get_config()
    c.run_dir, c.budget_responses, c.stop_at_target = old["run_dir"], 1024, False
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        functools.reduce(lambda node, name: node[name], parents, c)[leaf] = value
    new = config_lib.resolve(c, 1)
    if old["init"]["source"] == "params":  # (the same base policy file, in this checkout)
        assert os.path.basename(old["init"]["path"]) == os.path.basename(c.init.path)
        old["init"]["path"] = c.init.path
    assert config_lib.resume_diffs(old, new.to_json()) == []
    spec = config_lib.load_spec(old)
    assert spec.optimizer == new.optimizer and spec.rules == new.rules
    assert spec.critic_optimizer == new.critic_optimizer
    assert spec.derived() == new.derived() | {"python": old["derived"]["python"]}
    # Every typed section reads the old file as today's config of the point.
    assert spec.algorithm == new.algorithm and spec.rollout == new.rollout
    for name in ("task", "model_section", "init", "algo", "evaluation"):
        assert getattr(spec, name) == getattr(new, name), name
    assert spec.io == dataclasses.replace(new.io, work_dir=old["work_dir"])
