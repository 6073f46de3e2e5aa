"""Synthetic run and sweep directories with known answers, for the analysis tests.

Curves: ``acc(n) = a_max - (a_max - a0) exp(-n / tau)`` against retained responses n.
Time per update: ``DECODE_STEPS * (GEN_A_S + GEN_B_S * B) + UPDATE_S_PER_RESPONSE * B``
(generation saturating in the batch, update linear), so ``q(B) = B / time_per_update(B)``
Each response has ``PROMPT_TOKENS`` prompt and ``DECODE_STEPS`` generated tokens, so an
update processes ``B (PROMPT_TOKENS + DECODE_STEPS)`` tokens (``update_tokens``)
and the generation plateau (90% of the asymptote) is at ``9 GEN_A_S / GEN_B_S = 900``.
Gradient norms follow ``|g_B|^2 = G2 + TRACE_SIGMA / B`` (noise scale 256).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from rl_batch import artifacts
from rl_batch.analysis import noise_scale

GEN_A_S = 0.05
GEN_B_S = 0.0005
DECODE_STEPS = 32
PROMPT_TOKENS = 16
UPDATE_S_PER_RESPONSE = 0.001
G2 = 1.0
TRACE_SIGMA = 256.0
TAU0 = 2000.0
BUDGET = 12000
EVAL_EVERY = 256
TARGET = 0.8

# (prompts, group_size, lr_rule, tau multiplier): invariance up to B = 256, then worse.
STANDARD_CONFIGS = (
    (8, 8, "sqrt", 1.0),
    (16, 8, "sqrt", 1.0),
    (32, 8, "sqrt", 1.05),
    (64, 8, "sqrt", 1.6),
    (128, 8, "sqrt", 2.5),
    (8, 16, "sqrt", 1.0),  # Same B = 128 as (16, 8).
    (16, 8, "fixed", 1.67),
    (64, 8, "fixed", 10.0),  # Never reaches the target within the budget.
)
SEED_TAU_FACTORS = (0.99, 1.01)


def step_time_s(c: float) -> float:
    """Seconds per decode step at concurrency c."""
    return GEN_A_S + GEN_B_S * c


def time_per_update_s(batch: int) -> float:
    return DECODE_STEPS * step_time_s(batch) + UPDATE_S_PER_RESPONSE * batch


def q_of(batch: int) -> float:
    """Responses per training second at a batch."""
    return batch / time_per_update_s(batch)


def accuracy(n: float, tau: float, a_max: float = 1.0, a0: float = 0.0) -> float:
    return a_max - (a_max - a0) * math.exp(-n / tau)


def write_run(
    run_dir: str,
    *,
    prompts: int,
    group_size: int,
    tau: float,
    lr_rule: str = "sqrt",
    seed: int = 0,
    algo: str = "grpo",
    budget: int = BUDGET,
    eval_every: int = EVAL_EVERY,
    a_max: float = 1.0,
    a0: float = 0.0,
    warmup_updates: int = 0,
    status: str = "finished",
    noise_fields: bool = True,
    noise_names: tuple[str, str, str, str] = noise_scale.FIELD_SCHEMES[0],
    critic: bool = False,
    update_tokens: bool = True,
    config_extra: dict[str, Any] | None = None,
    prompts_per_update: tuple[int, ...] = (),
) -> None:
    """Writes config.json, metrics.jsonl and summary.json of one synthetic run.

    ``update_tokens=False`` writes update lines without ``update_tokens`` (older metrics
    files); ``config_extra`` is merged into config.json (e.g. ``model.preset``);
    ``prompts_per_update`` gives the actor updates' P in turn (a batch schedule; the last
    repeats), ``prompts`` being the configured (largest) P.
    """
    os.makedirs(run_dir, exist_ok=True)
    batch = prompts * group_size
    tpu = time_per_update_s(batch)
    artifacts.write_json_atomic(
        os.path.join(run_dir, artifacts.CONFIG_FILE),
        {
            "algo": algo,
            "seed": seed,
            "batch": {"prompts": prompts, "group_size": group_size},
            "optim": {"lr_rule": lr_rule},
            **(config_extra or {}),
        },
    )
    path = os.path.join(run_dir, artifacts.METRICS_FILE)
    if os.path.exists(path):
        os.remove(path)
    lines: list[dict[str, Any]] = []
    n = t = 0.0
    step = 0
    # As in a run, an update line's step counts the updates so far (1 for the first).
    for _ in range(warmup_updates):  # Critic warm-up: counters run, the actor is frozen.
        n += batch
        t += tpu
        step += 1
        lines.append(
            {
                "kind": "update",
                "phase": "critic_warmup",
                "step": step,
                "responses_cum": n,
                "time_train_cum_s": t,
                "batch_responses": batch,
                "critic_grad_norm": 1.0,
            }
        )
    lines.append(
        {
            "kind": "eval",
            "step": step,
            "responses_cum": n,
            "time_train_cum_s": t,
            "eval_accuracy": a0,
            "eval_k": 4,
        }
    )
    offset, next_eval = n, eval_every
    while n - offset < budget:
        if prompts_per_update:
            p_u = prompts_per_update[min(step - warmup_updates, len(prompts_per_update) - 1)]
            batch, tpu = p_u * group_size, time_per_update_s(p_u * group_size)
        n += batch
        t += tpu
        step += 1
        rec = {
            "kind": "update",
            "step": step,
            "responses_cum": n,
            "responses_generated_cum": n,
            "prompts": batch // group_size,
            "group_size": group_size,
            "batch_responses": batch,
            "lr": 1e-4,
            "reward_mean": 0.5,
            "time_generate_s": DECODE_STEPS * step_time_s(batch),
            "time_score_s": 0.0,
            "time_update_s": UPDATE_S_PER_RESPONSE * batch,
            "time_train_cum_s": t,
            "gen_tokens": batch * DECODE_STEPS,
            **({"update_tokens": batch * (PROMPT_TOKENS + DECODE_STEPS)} if update_tokens else {}),
            "grad_norm": math.sqrt(G2 + TRACE_SIGMA / batch),
            "loss": 0.0,
            "clip_frac": 0.0,
            "kl": 0.0,
        }
        if warmup_updates:
            rec["phase"] = "train"
        if critic:
            rec["critic_grad_norm"] = math.sqrt(4.0 + 64.0 / batch)
        if noise_fields:
            b = batch // 8
            small, big, n_small, n_big = noise_names
            rec.update(
                {
                    small: G2 + TRACE_SIGMA / b,
                    big: G2 + TRACE_SIGMA / batch,
                    n_small: b,
                    n_big: batch,
                }
            )
        lines.append(rec)
        if n - offset >= next_eval:
            acc = accuracy(n - offset, tau, a_max, a0)
            lines.append(
                {
                    "kind": "eval",
                    "step": step,
                    "responses_cum": n,
                    "time_train_cum_s": t,
                    "eval_accuracy": acc,
                    "eval_k": 4,
                }
            )
            while next_eval <= n - offset:
                next_eval += eval_every
    with open(path, "w") as f:  # One write: append_jsonl's fsync per line is slow here.
        f.writelines(json.dumps(rec, sort_keys=True) + "\n" for rec in lines)
    artifacts.write_json_atomic(
        os.path.join(run_dir, artifacts.SUMMARY_FILE), {"status": status, "steps": step}
    )


def run_name(prompts: int, group_size: int, lr_rule: str, seed: int) -> str:
    return f"P{prompts}_G{group_size}_{lr_rule}_s{seed}"


def _sweep_entry(
    name: str, prompts: int, group_size: int, lr_rule: str, seed: int, status: str
) -> dict[str, Any]:
    """One run's entry in sweep.json."""
    return {
        "name": name,
        "prompts": prompts,
        "group_size": group_size,
        "batch": prompts * group_size,
        "lr_rule": lr_rule,
        "lr": 1e-4,
        "seed": seed,
        "status": status,
        "error": None,
    }


def write_sweep(
    sweep_dir: str,
    configs=STANDARD_CONFIGS,
    seed_factors=SEED_TAU_FACTORS,
    target: float = TARGET,
    reference: str | None = "P8_G8_sqrt_s0",
    budget: int = BUDGET,
    eval_every: int = EVAL_EVERY,
    algo: str = "grpo",
    **run_kwargs: Any,
) -> str:
    """Writes a synthetic sweep; returns its directory."""
    runs = []
    for prompts, group, rule, mult, *critic in configs:  # critic: a PPO critic variant
        critic = critic[0] if critic else ""
        scale, critic_rule = artifacts.parse_critic_variant(critic)
        extra = {"ppo": {"critic_batch_scale": scale, "critic_lr_rule": critic_rule}}
        for seed, factor in enumerate(seed_factors):
            name = run_name(prompts, group, rule, seed) + (f"_{critic}" if critic else "")
            write_run(
                os.path.join(sweep_dir, artifacts.RUNS_DIR, name),
                prompts=prompts,
                group_size=group,
                lr_rule=rule,
                seed=seed,
                algo=algo,
                tau=TAU0 * mult * factor,
                budget=budget,
                eval_every=eval_every,
                **{"config_extra": extra, **run_kwargs},
            )
            entry = _sweep_entry(name, prompts, group, rule, seed, "finished")
            runs.append({**entry, "critic": critic})
    artifacts.write_json_atomic(
        os.path.join(sweep_dir, artifacts.SWEEP_FILE),
        {
            "name": "synthetic",
            "algo": algo,
            "target": target,
            "reference": reference,
            "budget_responses": budget,
            "eval_every_responses": eval_every,
            "runs": runs,
        },
    )
    return sweep_dir


def add_seed(
    sweep_dir: str,
    *,
    prompts: int,
    group_size: int,
    seed: int,
    tau: float,
    budget: int,
    lr_rule: str = "sqrt",
    status: str = "running",
) -> str:
    """Writes (or rewrites) one seed of a ``write_sweep`` sweep with ``status`` (by
    default a seed still running, stopped at ``budget`` responses so far) and records
    it in sweep.json; returns its run name."""
    name = run_name(prompts, group_size, lr_rule, seed)
    write_run(
        os.path.join(sweep_dir, artifacts.RUNS_DIR, name),
        prompts=prompts,
        group_size=group_size,
        lr_rule=lr_rule,
        tau=tau,
        seed=seed,
        budget=budget,
        status=status,
    )
    path = os.path.join(sweep_dir, artifacts.SWEEP_FILE)
    raw = artifacts.read_json(path)
    entries = [r for r in raw["runs"] if r["name"] == name]
    for r in entries:
        r["status"] = status
    if not entries:
        raw["runs"].append(_sweep_entry(name, prompts, group_size, lr_rule, seed, status))
    artifacts.write_json_atomic(path, raw)
    return name


def throughput_json(batches=tuple(2**i for i in range(13))) -> dict[str, Any]:
    """Throughput-file object whose generation follows ``step_time_s`` exactly."""
    gen = []
    for c in batches:
        time_s = DECODE_STEPS * step_time_s(c)
        gen.append(
            {
                "batch": c,
                "tokens_per_s": c * DECODE_STEPS / time_s,
                "time_s": time_s,
                "new_tokens": DECODE_STEPS,
            }
        )
    upd = [{"batch": b, "time_s": 0.02 + 1e-5 * b * 48, "tokens": b * 48} for b in (64, 128, 256)]
    return {"device": "synthetic", "generation": gen, "update": upd}
