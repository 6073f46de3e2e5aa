"""One synthetic sweep with known N*, q and T, written by other frameworks' writers.

The reference is `analysis_fixtures.write_sweep` in our own format; each writer below
turns every reference run's metric lines into another framework's log, written by the
library that framework uses (tensorboardX, wandb offline, ``transformers.TrainerState``)
or in verl's documented file-logger lines, so an import must give back the analysis of
the reference sweep.
"""

from __future__ import annotations

import json
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
VERL_TESTING_S = 7.5  # seconds of each validation, inside verl's timing_s/step
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


def verl_rows(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """(step, data) per logged step, with verl's metric names (an eval after update s is
    in step s's data; one before training at step 0)."""
    rows: dict[int, dict[str, float]] = {}
    for r in records:
        s = int(r["step"])
        d = rows.setdefault(s, {})
        if r["kind"] == "eval":
            d[EVAL_KEY_VERL] = r["eval_accuracy"]
            if s > 0:  # validation inside the step's timer, which the import takes out
                d["timing_s/testing"] = VERL_TESTING_S
                d["timing_s/step"] += VERL_TESTING_S
            continue
        d.update(
            {
                "training/global_step": s,
                "timing_s/gen": r["time_generate_s"],
                "timing_s/reward": r["time_score_s"],
                "timing_s/update_actor": r["time_update_s"],
                "timing_s/step": r["time_generate_s"] + r["time_score_s"] + r["time_update_s"],
                "actor/grad_norm": r["grad_norm"],
                "actor/lr": r["lr"],
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
            "actor": {"optim": {"lr": entry["lr"]}},
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


def write_verl_jsonl(sweep_dir: str, out_dir: str) -> list[str]:
    """verl file-logger lines + config.json per run; returns the metrics files."""
    paths = []
    for name, entry, records in reference_runs(sweep_dir):
        run_dir = os.path.join(out_dir, name)
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w") as f:
            json.dump(verl_config(entry), f)
        path = os.path.join(run_dir, "metrics.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps({"step": s, "data": d}) + "\n" for s, d in verl_rows(records))
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
        for s, d in verl_rows(records):
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


def write_trainer_state(sweep_dir: str, out_dir: str) -> list[str]:
    """``trainer_state.json`` per run as TRL's GRPOTrainer logs it (``TrainerState``'s
    own writer), its arguments in training_args.json; returns the output directories.

    Every update is logged (``logging_steps=1``) with TRL's names; evaluations (with
    ``eval_on_start``) as ``eval_reward``. Per-device batch x accumulation x processes
    (``TRL_WORLD_SIZE``, passed as an override) = P x G completions.
    """
    from transformers import TrainerState

    paths = []
    for name, entry, records in reference_runs(sweep_dir):
        out = os.path.join(out_dir, name)
        n_updates = sum(r["kind"] == "update" for r in records)
        ckpt = os.path.join(out, f"checkpoint-{n_updates}")
        os.makedirs(ckpt, exist_ok=True)
        batch = entry["prompts"] * entry["group_size"]
        args = {
            "per_device_train_batch_size": batch // (TRL_WORLD_SIZE * TRL_ACCUMULATION),
            "gradient_accumulation_steps": TRL_ACCUMULATION,
            "num_generations": entry["group_size"],
            "learning_rate": entry["lr"],
            "seed": entry["seed"],
            "lr_rule": entry["lr_rule"],
        }
        with open(os.path.join(out, "training_args.json"), "w") as f:
            json.dump(args, f)
        history = []
        for r in records:
            if r["kind"] == "eval":
                history.append({"eval_reward": r["eval_accuracy"], "step": r["step"]})
            else:
                history.append(
                    {
                        "loss": r["loss"],
                        "grad_norm": r["grad_norm"],
                        "learning_rate": r["lr"],
                        "reward": r["reward_mean"],
                        "step": r["step"],
                    }
                )
        state = TrainerState(global_step=n_updates, max_steps=n_updates, log_history=history)
        state.save_to_json(os.path.join(ckpt, "trainer_state.json"))
        paths.append(out)
    return paths
