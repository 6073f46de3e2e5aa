"""One synthetic sweep with known N*, q and T, written by other frameworks' writers.

The reference is `analysis_fixtures.write_sweep` in our own format; each writer below
turns every reference run's metric lines into another framework's log, written by the
library that framework uses (tensorboardX, wandb offline, ``transformers.TrainerState``
with TRL's ``GRPOConfig``) or as verl's file logger writes them, so an import must give
back the analysis of the reference sweep.

verl's lines follow its source at commit b178a3c (0.8.0.dev; the same in 0.6.0 and
0.7.0): ``verl/utils/tracking.py`` ``FileLogger.log`` writes
``orjson.dumps({"step": step, "data": data})`` per line (orjson writes NaN and inf as
``null``), and ``verl/trainer/ppo/ray_trainer.py`` ``fit()`` times ``testing`` and
``save_checkpoint`` outside ``marked_timer("step")``. verl <= 0.5 timed both inside the
step (moved out by verl PR #3117, first released in 0.6.0). `verl_rows` writes either.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import analysis_fixtures as af

from rl_batch import artifacts
from rl_batch.analysis.importers import convert

# (prompts, group_size, lr_rule, tau multiplier): invariance to B = 256, two shapes at
# B = 128, a fixed-LR point; small enough to write through wandb in seconds.
CONFIGS = (
    (8, 8, "sqrt", 1.0),
    (16, 8, "sqrt", 1.0),
    (32, 8, "sqrt", 1.05),
    (64, 8, "sqrt", 1.6),
    (8, 16, "sqrt", 1.0),
    (16, 8, "fixed", 1.67),
)
EVAL_KEY_VERL = "val-core/synthetic/acc/mean@4"
VERL_TESTING_S = 7.5  # seconds of each validation (timing_s/testing)
# Of the reference's update seconds, verl's update_actor timer holds this share; the rest
# is old_log_prob / adv / update_weights, timed inside the step but in no phase we map:
# it must come back as idle/other (time_idle_s) so that the shares add up to the step.
VERL_ACTOR_SHARE = 0.75
LR_REF, B_REF = 1e-4, 64  # the LR of the smallest batch; sqrt rule: LR x sqrt(B / B_REF)
TRL_WORLD_SIZE = 2
TRL_ACCUMULATION = 2


def write_reference(sweep_dir: str) -> str:
    """The known-answer sweep in our own format (no noise-scale fields), N* read at the
    update that realizes the crossing (``target_crossing="update"``, as sweeps write now
    and as an import does)."""
    # Outside runs share no random numbers, so neither do these (no paired ratios).
    extra = {"rollout_keys": convert.ROLLOUT_KEYS}
    af.write_sweep(sweep_dir, configs=CONFIGS, noise_fields=False, config_extra=extra)
    path = os.path.join(sweep_dir, artifacts.SWEEP_FILE)
    artifacts.write_json_atomic(path, {**artifacts.read_json(path), "target_crossing": "update"})
    return sweep_dir


def reference_runs(sweep_dir: str) -> list[tuple[str, dict[str, Any], list[dict[str, Any]]]]:
    """(name, sweep.json entry, metric lines) of each reference run."""
    raw = artifacts.read_json(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
    return [
        (
            e["name"],
            e,
            artifacts.read_metrics(os.path.join(sweep_dir, artifacts.RUNS_DIR, e["name"])),
        )
        for e in raw["runs"]
    ]


def outside_lr(entry: dict[str, Any]) -> float:
    """The LR an outside run of a reference entry trained with: ``LR_REF`` at the
    smallest batch, scaled by its rule (the fixed-LR point keeps ``LR_REF``)."""
    batch = entry["prompts"] * entry["group_size"]
    return LR_REF * ((batch / B_REF) ** 0.5 if entry["lr_rule"] == "sqrt" else 1.0)


def verl_rows(
    records: list[dict[str, Any]], lr: float = LR_REF, testing_in_step: bool = False
) -> list[tuple[int, dict[str, float]]]:
    """(step, data) per logged step, with verl's metric names (an eval after update s is
    in step s's data; one before training at step 0).

    ``testing_in_step``: verl <= 0.5, whose ``timing_s/step`` holds ``timing_s/testing``;
    else verl >= 0.6, which times validation outside the step.
    """
    rows: dict[int, dict[str, float]] = {}
    for r in records:
        s = int(r["step"])
        d = rows.setdefault(s, {})
        if r["kind"] == "eval":
            d[EVAL_KEY_VERL] = r["eval_accuracy"]
            if s > 0:
                d["timing_s/testing"] = VERL_TESTING_S
                if testing_in_step:
                    d["timing_s/step"] += VERL_TESTING_S
            continue
        actor = VERL_ACTOR_SHARE * r["time_update_s"]
        d.update(
            {
                "training/global_step": s,
                "timing_s/gen": r["time_generate_s"],
                "timing_s/reward": r["time_score_s"],
                "timing_s/old_log_prob": r["time_update_s"] - actor,
                "timing_s/update_actor": actor,
                "timing_s/step": r["time_generate_s"] + r["time_score_s"] + r["time_update_s"],
                "actor/grad_norm": r["grad_norm"],
                "actor/lr": lr,
                "actor/pg_loss": r["loss"],
                "critic/score/mean": r["reward_mean"],
                "perf/throughput": r["batch_responses"] / 1.0,
            }
        )
    return sorted(rows.items())


def verl_config(entry: dict[str, Any]) -> dict[str, Any]:
    """verl's config of a reference run (data.train_batch_size prompts, rollout.n)."""
    return {
        "data": {"train_batch_size": entry["prompts"], "seed": entry["seed"]},
        "actor_rollout_ref": {
            "rollout": {"n": entry["group_size"]},
            "actor": {"optim": {"lr": outside_lr(entry)}},
        },
        "lr_rule": entry["lr_rule"],
    }


def verl_keymap(tmp_dir: str) -> str:
    """The shipped verl key map with lr_rule read from each run's config (a user edit)."""
    from rl_batch.analysis.importers import load_keymap

    km = load_keymap("verl")
    km.pop("_path")
    km["lr_rule"] = {"config": "lr_rule"}
    path = os.path.join(tmp_dir, "verl_keymap.json")
    with open(path, "w") as f:
        json.dump(km, f)
    return path


def verl_line(step: int, data: dict[str, Any]) -> str:
    """One line as verl's ``FileLogger.log`` writes it: ``orjson.dumps({"step": step,
    "data": data})``, NaN and inf as ``null`` (what orjson writes for them)."""
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()
    }
    return json.dumps({"step": step, "data": clean}, separators=(",", ":")) + "\n"


def write_verl_jsonl(
    sweep_dir: str, out_dir: str, testing_in_step: bool = False, version: str | None = None
) -> list[str]:
    """verl file-logger lines + config.json per run; returns the metrics files.
    ``version``: written into config.json as ``verl_version`` (verl itself records none)."""
    paths = []
    for name, entry, records in reference_runs(sweep_dir):
        run_dir = os.path.join(out_dir, name)
        os.makedirs(run_dir, exist_ok=True)
        config = verl_config(entry)
        if version is not None:
            config["verl_version"] = version
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(config, f)
        path = os.path.join(run_dir, "metrics.jsonl")
        rows = verl_rows(records, outside_lr(entry), testing_in_step)
        with open(path, "w") as f:
            f.writelines(verl_line(s, d) for s, d in rows)
        paths.append(path)
    return paths


def write_wandb_offline(sweep_dir: str, out_dir: str) -> list[str]:
    """One offline W&B run per reference run (``wandb.init`` / ``log``, verl's names and
    config, ``step=`` the global step as verl logs); returns the run directories."""
    import wandb

    saved = {k: os.environ.get(k) for k in ("WANDB_MODE", "WANDB_SILENT")}
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
    try:
        return _write_wandb_runs(wandb, sweep_dir, out_dir)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _write_wandb_runs(wandb, sweep_dir: str, out_dir: str) -> list[str]:
    paths = []
    for name, entry, records in reference_runs(sweep_dir):
        run_root = os.path.join(out_dir, name)
        os.makedirs(run_root, exist_ok=True)
        run = wandb.init(project="import-test", name=name, dir=run_root, config=verl_config(entry))
        for s, d in verl_rows(records, outside_lr(entry)):
            run.log(d, step=s)
        run.finish()
        paths.append(run_root)
    return paths


def generic_keymap(tmp_dir: str) -> str:
    """The generic map filled in for our own names, time from event timestamps."""
    from rl_batch.analysis.importers import load_keymap

    km = load_keymap("generic")
    km.pop("_path")
    km["eval_accuracy"] = ["eval/accuracy"]
    km["lr_rule"] = {"config": "lr_rule"}
    km["metrics"] = {"grad_norm": ["train/grad_norm"]}
    path = os.path.join(tmp_dir, "generic_keymap.json")
    with open(path, "w") as f:
        json.dump(km, f)
    return path


TB_START = 1.7e9  # wall-clock second of the first update's start in the event files


def write_tensorboard(sweep_dir: str, out_dir: str) -> list[str]:
    """tensorboardX event files per run, each scalar at the wall time its update ended
    (``walltime=``), and a config.json; returns the run directories."""
    from tensorboardX import SummaryWriter

    paths = []
    for name, entry, records in reference_runs(sweep_dir):
        run_dir = os.path.join(out_dir, name)
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump({k: entry[k] for k in ("prompts", "group_size", "seed", "lr_rule")}, f)
        w = SummaryWriter(os.path.join(run_dir, "tb"))
        for r in records:
            wall = TB_START + r["time_train_cum_s"]
            if r["kind"] == "eval":
                w.add_scalar("eval/accuracy", r["eval_accuracy"], r["step"], walltime=wall)
            else:
                w.add_scalar("train/grad_norm", r["grad_norm"], r["step"], walltime=wall)
                w.add_scalar("train/lr", r["lr"], r["step"], walltime=wall)
        w.close()
        paths.append(run_dir)
    return paths


def trl_args(entry: dict[str, Any], out: str) -> dict[str, Any]:
    """TRL 1.16's own ``GRPOConfig(...).to_dict()`` for a reference entry (what a user
    saves as training_args.json), plus ``lr_rule`` (a user's note, read by the map).

    Per-device batch x accumulation x processes (``TRL_WORLD_SIZE``, passed as an
    override: the saved arguments lack it) = P x G completions per optimizer step.
    """
    from trl import GRPOConfig

    batch = entry["prompts"] * entry["group_size"]
    config = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=batch // (TRL_WORLD_SIZE * TRL_ACCUMULATION),
        gradient_accumulation_steps=TRL_ACCUMULATION,
        num_generations=entry["group_size"],
        learning_rate=outside_lr(entry),
        seed=entry["seed"],
        report_to=[],
        use_cpu=True,
    )
    return {**config.to_dict(), "lr_rule": entry["lr_rule"]}


def trl_history(records: list[dict[str, Any]], lr: float, step_time: bool) -> list[dict]:
    """``log_history`` as TRL 1.16's GRPOTrainer logs it with ``logging_steps=1``:
    ``loss``, ``grad_norm``, ``learning_rate``, ``reward``, ``step_time`` (the seconds
    of the step's training_step calls: here the reference's step) and ``step``;
    evaluations (``eval_on_start`` included) as ``eval_reward``."""
    history = []
    for r in records:
        if r["kind"] == "eval":
            history.append({"eval_reward": r["eval_accuracy"], "step": r["step"]})
            continue
        line = {
            "loss": r["loss"],
            "grad_norm": r["grad_norm"],
            "learning_rate": lr,
            "reward": r["reward_mean"],
            "step": r["step"],
        }
        if step_time:
            line["step_time"] = r["time_generate_s"] + r["time_score_s"] + r["time_update_s"]
        history.append(line)
    return history


def write_trainer_state(sweep_dir: str, out_dir: str, step_time: bool = True) -> list[str]:
    """``trainer_state.json`` per run as TRL's GRPOTrainer logs it (``TrainerState``'s
    own writer), TRL's ``GRPOConfig`` saved as training_args.json; returns the output
    directories. ``step_time=False``: a TRL older than the ``step_time`` metric."""
    from transformers import TrainerState

    paths = []
    for name, entry, records in reference_runs(sweep_dir):
        out = os.path.join(out_dir, name)
        n_updates = sum(r["kind"] == "update" for r in records)
        ckpt = os.path.join(out, f"checkpoint-{n_updates}")
        os.makedirs(ckpt, exist_ok=True)
        with open(os.path.join(out, "training_args.json"), "w") as f:
            json.dump(trl_args(entry, out), f)
        history = trl_history(records, outside_lr(entry), step_time)
        state = TrainerState(global_step=n_updates, max_steps=n_updates, log_history=history)
        state.save_to_json(os.path.join(ckpt, "trainer_state.json"))
        paths.append(out)
    return paths


# ------------------------------------------------------------------ a verl example by hand

# Two verl runs worked by hand (docs/import.md walks the first). Per update: timing_s/gen,
# timing_s/reward, timing_s/update_actor, timing_s/old_log_prob (no phase of ours:
# idle/other) and timing_s/step, their sum; evaluations (val-core/.../acc/mean@4) by step
# with timing_s/testing = 10 s after training starts.
#   b32:  P = 8,  G = 4, B = 32,  LR 1e-6; 55 s per update = 30 + 2 + 12 + 11 (other)
#         evals 0.2 (step 0), 0.5 (step 2, 64 responses), 0.8 (step 4, 128 responses)
#         target 0.6: N* = 64 + 64 x (0.6 - 0.5) / (0.8 - 0.5) = 85.333 responses,
#         T = N* x 55 s / 32 = 146.667 s; shares 30/55, 2/55, 12/55, 11/55.
#   b128: P = 32, G = 4, B = 128, LR 2e-6 (sqrt rule: 1e-6 x sqrt(128 / 32)); 100 s per
#         update = 40 + 4 + 40 + 16 (other); evals 0.2, 0.55 (step 1), 0.7 (step 2)
#         N* = 128 + 128 x 0.05 / 0.15 = 170.667, T = N* x 100 / 128 = 133.333 s.
EXAMPLE = {
    "b32": {
        "prompts": 8,
        "n": 4,
        "lr": 1e-6,
        "phases": {"gen": 30.0, "reward": 2.0, "update_actor": 12.0, "old_log_prob": 11.0},
        "evals": {0: 0.2, 2: 0.5, 4: 0.8},
        "steps": 4,
    },
    "b128": {
        "prompts": 32,
        "n": 4,
        "lr": 2e-6,
        "phases": {"gen": 40.0, "reward": 4.0, "update_actor": 40.0, "old_log_prob": 16.0},
        "evals": {0: 0.2, 1: 0.55, 2: 0.7},
        "steps": 2,
    },
}
EXAMPLE_TESTING_S = 10.0
EXAMPLE_KEY = "val-core/gsm8k/acc/mean@4"


def example_rows(run: str, testing_in_step: bool = False) -> list[tuple[int, dict]]:
    """(step, data) of an `EXAMPLE` run as verl's fit() logs them (validation inside
    timing_s/step for verl <= 0.5, outside for >= 0.6)."""
    ex = EXAMPLE[run]
    rows = [(0, {EXAMPLE_KEY: ex["evals"][0]})]  # the validation before training
    for s in range(1, ex["steps"] + 1):
        d = {f"timing_s/{k}": v for k, v in ex["phases"].items()}
        d["timing_s/step"] = sum(ex["phases"].values())
        d.update({"training/global_step": s, "actor/grad_norm": 0.5, "actor/lr": ex["lr"]})
        if s in ex["evals"]:
            d[EXAMPLE_KEY] = ex["evals"][s]
            d["timing_s/testing"] = EXAMPLE_TESTING_S
            if testing_in_step:
                d["timing_s/step"] += EXAMPLE_TESTING_S
        rows.append((s, d))
    return rows


def write_example(
    root: str,
    run: str,
    name: str | None = None,
    testing_in_step: bool = False,
    config_extra: dict | None = None,
    rows: list[tuple[int, dict]] | None = None,
) -> str:
    """An `EXAMPLE` run as verl's file logger writes it, with its config.json (the run's
    resolved Hydra config, as the docs ask); returns the metrics.jsonl path."""
    ex = EXAMPLE[run]
    run_dir = os.path.join(root, name or f"{run}_s0")
    os.makedirs(run_dir, exist_ok=True)
    config = {
        "data": {"train_batch_size": ex["prompts"], "seed": 0},
        "actor_rollout_ref": {"rollout": {"n": ex["n"]}, "actor": {"optim": {"lr": ex["lr"]}}},
        **(config_extra or {}),
    }
    with open(os.path.join(run_dir, "config.json"), "w") as f:
        json.dump(config, f)
    path = os.path.join(run_dir, "metrics.jsonl")
    with open(path, "w") as f:
        f.writelines(verl_line(s, d) for s, d in (rows or example_rows(run, testing_in_step)))
    return path
