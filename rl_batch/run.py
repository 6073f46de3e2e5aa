"""One training run: prompts -> G responses -> rewards -> filter -> update -> validate.

``run(config)`` executes one resolved configuration and writes the run directory of
``rl_batch.artifacts`` (config.json, metrics.jsonl, checkpoints/, summary.json). The
protocol: one optimizer update per rollout batch; validation at fixed
intervals of cumulative *retained* responses; generation, scoring, update and
host-side glue are timed separately, while evaluation, compilation and checkpointing
are timed but excluded from training time.

A run resumes from its latest checkpoint: the metrics file is cut back to that step
and, with the same seed, the resumed run reproduces the uninterrupted one (the rng of
every rollout is derived from the seed and the rollout index, the data order from the
seed). With asynchronous rollout, the batches in flight at a save were started from
*older* params than the checkpoint's, so they cannot be regenerated from it: the save
waits for them (learner wait, counted as training time: the next updates would have
waited for them anyway) and stores them with the checkpoint (``rollouts_in_flight``),
and the resumed run trains on them first, with the same prompts, samples, rng and
staleness as the uninterrupted run. They are stored as base64 arrays in the
checkpoint's JSON metadata: fine for small models, but at study scale (thousands of
responses of thousands of tokens) a batch is gigabytes of JSON per checkpoint; storing
their generating params instead would cost a params copy per batch in flight.
A run that finishes waits for its batches in flight the same way (outside training
time) so that a longer run can resume from its last checkpoint. Resuming such a
checkpoint without async rollout draws those batches again from the checkpoint's
params (same prompts and rng); the time the save waited for them stays counted.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import logging
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from rl_batch import artifacts, distributed, flops, learner, partial_rollout, provenance, sharding
from rl_batch import config as config_lib
from rl_batch import model as model_lib
from rl_batch import rollout as rollout_lib
from rl_batch.analysis.time_to_target import first_crossing
from rl_batch.checkpoint import Checkpointer
from rl_batch.filtering import dynamic_sampling_filter
from rl_batch.losses import group_advantages
from rl_batch.sampler import Sampler, SamplingConfig
from rl_batch.tasks.tfds_builders import load_split

log = logging.getLogger(__name__)

# Fields that must match for a run directory to be resumed with a config.
_IDENTITY_FIELDS = ("algo", "seed", "prompts", "group_size", "lr", "lr_rule", "task", "model")


@dataclasses.dataclass
class Counters:
    """Host-side progress, saved with every checkpoint."""

    step: int = 0  # optimizer updates done
    rollouts: int = 0  # rollout batches generated (>= step: all-filtered batches skip)
    data_position: int = 0  # prompts consumed from the training order
    responses_cum: int = 0  # retained responses used in updates
    responses_generated_cum: int = 0
    # Where the sample axis starts (PPO: after the critic warm-up; GRPO: at 0): the
    # optimizer updates and training time spent before the first policy update.
    policy_start_step: int = -1
    policy_start_time_s: float = -1.0
    next_eval: int = 0  # responses_cum at which the next validation runs
    time_train_cum_s: float = 0.0
    time_generate_s: float = 0.0
    time_score_s: float = 0.0
    time_update_s: float = 0.0
    time_idle_s: float = 0.0
    time_eval_s: float = 0.0
    time_compile_s: float = 0.0
    time_checkpoint_s: float = 0.0
    skipped_updates: int = 0
    consecutive_skips: int = 0
    consecutive_empty: int = 0  # rollouts in a row whose groups were all filtered out
    evals_at_target: int = 0
    # Tokens (and their FLOPs) of the generation timed in time_generate_s: the numerator
    # of the run's generation throughput. A token counts once (partial rollout: in the
    # iteration that decoded it); a rollout whose time was booked as compilation adds
    # neither tokens nor time.
    gen_tokens_cum: int = 0
    gen_flops_cum: float = 0.0
    update_tokens_cum: int = 0  # prompt + response tokens processed by updates
    update_flops_cum: float = 0.0
    time_learner_wait_s: float = 0.0  # learner waiting for a rollout (all of it when sync)
    time_generator_idle_s: float = 0.0  # generator not generating or scoring


class _InFlight(NamedTuple):
    """A rollout batch drawn and generated (async: maybe still generating), not yet used."""

    index: int  # counters.rollouts when drawn: its rng is fold_in(base_rng, index)
    position: int  # counters.data_position when drawn (its first training prompt)
    gen_step: int  # optimizer step of the params that generated it (partial: the oldest)
    result: Any  # the Rollout; async: a Future of it


def _done(ro: rollout_lib.Rollout) -> concurrent.futures.Future:
    """A finished future holding ``ro`` (a rollout in flight restored from a checkpoint)."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(ro)
    return future


def _training_order(n: int, seed: int, position: int, count: int) -> np.ndarray:
    """Indices of the next ``count`` training prompts: a fresh permutation per epoch."""
    out = []
    while len(out) < count:
        epoch, offset = divmod(position + len(out), n)
        perm = np.random.default_rng([seed, epoch]).permutation(n)
        out.extend(perm[offset : offset + count - len(out)].tolist())
    return np.asarray(out)


def _check_resumable(run_dir: str, c: ConfigDict) -> None:
    path = os.path.join(run_dir, artifacts.CONFIG_FILE)
    if not os.path.exists(path):
        return
    old = artifacts.read_json(path)
    new = c.to_dict()
    diffs = [d for f in _IDENTITY_FIELDS for d in _leaf_diffs(old.get(f), new.get(f), f)]
    if diffs:
        raise ValueError(
            f"{run_dir} holds a run with a different config ({'; '.join(diffs)}); "
            "use a new run_dir or delete it"
        )


def _leaf_diffs(old: Any, new: Any, name: str) -> list[str]:
    """``"name.key: old -> new"`` for every leaf that differs between two config values."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [
            d
            for key in sorted(old.keys() | new.keys())
            for d in _leaf_diffs(old.get(key), new.get(key), f"{name}.{key}")
        ]
    return [] if old == new else [f"{name}: {old!r} -> {new!r}"]


def _truncate_metrics(path: str, step: int) -> None:
    """Drops metrics written after the checkpoint at ``step`` (they will be redone)."""
    if not os.path.exists(path):
        return
    kept = [r for r in artifacts.iter_jsonl(path) if r.get("step", 0) <= step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in kept:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    os.replace(tmp, path)


def load_task_data(c: ConfigDict, tokenizer) -> tuple[Any, Any]:
    """(train, validation) random-access sequences of example dicts.

    Synthetic tasks come from their TFDS splits (prepared in ``<work_dir>/data`` on first
    use); math data from the local files named by ``task.train_file`` and
    ``task.validation_file``, prompts rendered with the tokenizer's chat template.
    """
    if c.task.name in config_lib.SYNTHETIC_TASKS:
        data_dir = os.path.join(os.path.abspath(c.work_dir), "data")
        kwargs = dict(
            c.task.kwargs.to_dict(), n_train=c.task.n_train, n_validation=c.task.n_validation
        )
        return (
            load_split(c.task.name, "train", data_dir, **kwargs),
            load_split(c.task.name, "validation", data_dir, **kwargs),
        )
    from rl_batch.tasks.math_data import load_math_file

    def load(path):
        # Prompts over the sampler's budget fail here, naming the file and line.
        examples = load_math_file(
            path,
            fmt=c.task.format,
            tokenizer=tokenizer,
            max_prompt_tokens=c.derived.max_prompt_len,
        )
        return [ex.to_dict() for ex in examples]

    return load(c.task.train_file), load(c.task.validation_file)


def initial_params(c: ConfigDict, model_config: model_lib.ModelConfig) -> Any:
    """The starting policy named by ``config.init``."""
    source = c.init.source
    if source == "scratch":
        return model_lib.init_params(model_config, c.seed)
    if source == "pretrain":
        from rl_batch import pretrain

        return pretrain.base_params(c)
    if source == "hf":
        from rl_batch import hf

        _, params = hf.load_hf_checkpoint(c.init.path, dtype=model_config.param_dtype)
        return params
    # A checkpoint directory of an earlier run: take its params only.
    return Checkpointer(c.init.path).restore_params(model_lib.abstract_params(model_config))


class _Progress:
    """A one-line progress display: responses, reward, accuracy, ETA."""

    def __init__(self, total: int, name: str, enabled: bool):
        self.enabled = enabled and jax.process_index() == 0
        self.total, self.name, self.t0 = total, name, time.time()
        self.accuracy: float | None = None  # the latest validation accuracy
        self._bar = None
        if self.enabled:
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=name or "run", unit="resp", leave=True)
            except ImportError:
                self._bar = None

    def update(self, counters: Counters, reward: float, accuracy: float | None) -> None:
        if not self.enabled:
            return
        if accuracy is not None:
            self.accuracy = accuracy
        acc = "-" if self.accuracy is None else f"{self.accuracy:.3f}"
        if self._bar is not None:
            self._bar.n = min(counters.responses_cum, self.total)
            self._bar.set_postfix_str(f"step {counters.step} reward {reward:.3f} acc {acc}")
            self._bar.refresh()
        else:
            print(
                f"[{self.name}] {counters.responses_cum}/{self.total} reward {reward:.3f} acc {acc}"
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _summary(c: ConfigDict, counters: Counters, evals: list[dict], status: str) -> dict:
    # Time and updates count from the first policy update (after any critic warm-up).
    t0 = max(counters.policy_start_time_s, 0.0)
    s0 = max(counters.policy_start_step, 0)
    xs = [e["responses_cum"] for e in evals]
    ys = [e["eval_accuracy"] for e in evals]
    times = [max(e["time_train_cum_s"] - t0, 0.0) for e in evals]
    steps = [max(e["step"] - s0, 0) for e in evals]
    n_star = first_crossing(xs, ys, c.target) if evals else None
    summary: dict[str, Any] = {
        "status": status,
        "name": c.name,
        "target": c.target,
        "reached": n_star is not None,
        "n_star": n_star,
        "steps": counters.step,
        "responses_cum": counters.responses_cum,
        "responses_generated_cum": counters.responses_generated_cum,
        "final_eval_accuracy": ys[-1] if ys else None,
        "best_eval_accuracy": max(ys) if ys else None,
        "initial_eval_accuracy": ys[0] if ys else None,
        "skipped_updates": counters.skipped_updates,
    }
    for key in (
        "time_train_cum_s",
        "time_generate_s",
        "time_score_s",
        "time_update_s",
        "time_idle_s",
        "time_eval_s",
        "time_compile_s",
        "time_checkpoint_s",
    ):
        summary[key.replace("_cum", "")] = getattr(counters, key)
    summary.update(_run_throughput(counters))
    if n_star is not None:
        t_star = float(np.interp(n_star, xs, times))
        summary["time_to_target_s"] = t_star
        summary["updates_to_target"] = float(np.interp(n_star, xs, steps))
        summary["q"] = n_star / t_star if t_star > 0 else None
    else:
        summary["time_to_target_s"] = None
        summary["updates_to_target"] = None
        policy_time = counters.time_train_cum_s - t0
        summary["q"] = counters.responses_cum / policy_time if policy_time > 0 else None
        summary["n_star_text"] = artifacts.NOT_REACHED
    return summary


def _run_throughput(counters: Counters) -> dict[str, Any]:
    """Whole-run throughput (tokens/s, FLOP/s vs the matmul rate) from the counters."""
    return flops.step_throughput(
        gen_tokens=counters.gen_tokens_cum,
        gen_flops=counters.gen_flops_cum,
        time_generate_s=counters.time_generate_s,
        update_tokens=counters.update_tokens_cum,
        upd_flops=counters.update_flops_cum,
        time_update_s=counters.time_update_s,
        responses=counters.responses_cum,
        step_time_s=counters.time_train_cum_s,
        matmul_flops_per_s=flops.measure_matmul_flops(),
    ) | {
        "time_learner_wait_s": counters.time_learner_wait_s,
        "time_generator_idle_s": counters.time_generator_idle_s,
    }


def run(config: ConfigDict, *, resume: bool = True, progress: bool = True) -> dict[str, Any]:
    """Runs one configuration to its budget (or to a confirmed target) and returns the summary.

    Args:
      config: a run config (resolved or not; it is resolved and validated here).
      resume: continue from the latest checkpoint in ``run_dir`` when there is one.
      progress: show a progress bar.

    Returns:
      The summary written to ``<run_dir>/summary.json``.
    """
    distributed.maybe_initialize(config)
    c = config_lib.resolve(config)
    if not c.run_dir:
        raise ValueError("run_dir is empty: set --config.run_dir")
    run_dir = os.path.abspath(c.run_dir)
    is_writer = jax.process_index() == 0
    # Every process checks (process 0 writes only once its check passed), so a mismatch
    # stops all of them instead of leaving the others waiting in a collective.
    _check_resumable(run_dir, c)
    if is_writer:
        os.makedirs(run_dir, exist_ok=True)
        artifacts.write_json_atomic(os.path.join(run_dir, artifacts.CONFIG_FILE), c.to_dict())
        provenance.start_session(run_dir)
    metrics_path = os.path.join(run_dir, artifacts.METRICS_FILE)

    task = config_lib.make_task(c)
    tokenizer = config_lib.make_tokenizer(c)
    model_config = config_lib.make_model_config(c)
    train_data, val_data = load_task_data(c, tokenizer)
    val_examples = [val_data[i] for i in range(min(c.eval_prompts, len(val_data)))]

    mesh = sharding.make_mesh(
        data=c.mesh.data, fsdp=c.mesh.fsdp, tensor=c.mesh.tensor, expert=c.mesh.get("expert", 1)
    )
    algo = make_algorithm(c, model_config, mesh)
    # (Multi-process: rebuilt so that a checkpoint of the initial state can be saved.)
    state = distributed.rebuild(algo.init_state(initial_params(c, model_config)))
    update_fn = algo.update_fn

    # Asynchronous rollout: one background thread generates (and scores) the next batches
    # with a snapshot of the params of the last finished update, ``max_staleness`` ahead.
    async_cfg = c.get("async_rollout", {}) or {}
    depth = int(async_cfg.get("max_staleness", 1)) if async_cfg.get("enabled", False) else 0

    counters = Counters()
    carry: list[partial_rollout.Group] = []  # partial rollout: unfinished groups
    in_flight: list[dict] = []  # async: the rollouts in flight at the checkpoint
    ckpt = Checkpointer(os.path.join(run_dir, artifacts.CHECKPOINT_DIR), cleanup_tmp=True)
    if resume and ckpt.latest_step() is not None:
        tree, meta = ckpt.restore({"state": state})
        state = tree["state"]
        counters = Counters(**meta["counters"])
        carry = partial_rollout.from_json(meta.get("partial_carry", []))
        in_flight = meta.get("rollouts_in_flight", [])
        if in_flight and not depth:
            # Resumed without async rollout: draw those batches again (same prompts and
            # rng), generated from the checkpoint's params.
            counters.rollouts = in_flight[0]["index"]
            counters.data_position = in_flight[0]["position"]
            in_flight = []
        if is_writer:
            _truncate_metrics(metrics_path, counters.step)
        log.info("resumed %s at step %d", run_dir, counters.step)
    elif is_writer and os.path.exists(metrics_path):
        os.remove(metrics_path)  # A fresh start: stale metrics of a crashed first step.

    sampling = SamplingConfig(
        temperature=c.sampling.temperature, top_k=c.sampling.top_k, top_p=c.sampling.top_p
    )
    sampler = config_lib.make_sampler(c, tokenizer, model_config, mesh)
    partial = c.partial_rollout.enabled
    if partial:  # continues responses: prompt + tokens so far, a few tokens at a time
        partial_sampler = Sampler(
            model_config,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
            max_prompt_len=c.derived.max_prompt_len + c.derived.max_new_tokens,
            max_new_tokens=c.partial_rollout.tokens_per_iter,
            mesh=mesh if mesh.size > 1 else None,
        )
        # The batch keeps the shapes of a whole rollout (no recompiles of the update).
        _, batch_prompt_len, batch_response_len = sampler.buckets(
            c.prompts * c.group_size, c.derived.max_prompt_len, c.derived.max_new_tokens
        )
    for what, n in (
        ("training rollout", c.prompts * c.group_size),
        ("validation", len(val_examples) * c.eval_k),
    ):
        rollout_lib.check_kv_memory(sampler, n, c.gen_batch, c.get("max_kv_bytes", 0), what)
    base_rng = jax.random.key(c.seed)
    # Every process holds the same evals: they decide when validation (a collective) runs.
    # A fresh start has none; a resumed run ignores records after its checkpoint (process 0
    # may still be cutting them away).
    evals = []
    if counters.rollouts:
        evals = [r for r in artifacts.read_metrics(run_dir, "eval") if r["step"] <= counters.step]

    def write(record: dict) -> None:
        if is_writer:
            artifacts.append_jsonl(metrics_path, record)

    def save_checkpoint() -> None:
        """Saves the state, the counters and the rollouts not yet trained on."""
        if ckpt.latest_step() == counters.step:
            return  # This step is already on disk.
        # Async: the batches in flight came from older params than the state's; they are
        # saved themselves (the resumed run trains on them as the uninterrupted run does),
        # so wait for them: the learner's wait, as before validation (training time unless
        # the budget is spent and this run will not train on them).
        if pending:
            waited = drain()
            if counters.responses_cum < c.budget_responses:
                counters.time_train_cum_s += waited
                counters.time_learner_wait_s += waited
        t0 = time.perf_counter()
        meta = {"counters": dataclasses.asdict(counters)}
        meta["partial_carry"] = partial_rollout.to_json(carry)
        meta["rollouts_in_flight"] = [
            {
                "index": job.index,
                "position": job.position,
                "gen_step": job.gen_step,
                "rollout": rollout_lib.rollout_to_json(job.result.result()),
            }
            for job in pending
        ]
        ckpt.save(counters.step, {"state": state}, meta)
        counters.time_checkpoint_s += time.perf_counter() - t0

    def run_eval() -> dict:
        rng = jax.random.fold_in(jax.random.fold_in(base_rng, 1), counters.step)
        m = rollout_lib.evaluate(
            sampler,
            algo.policy_params(state),
            task,
            tokenizer,
            val_examples,
            k=c.eval_k,
            rng=rng,
            sampling=sampling,
            greedy=c.eval_greedy,
            gen_batch=c.gen_batch,
        )
        counters.time_eval_s += m["time_eval_s"]
        record = {
            "kind": "eval",
            "step": counters.step,
            "responses_cum": counters.responses_cum,
            "responses_generated_cum": counters.responses_generated_cum,
            "time_train_cum_s": counters.time_train_cum_s,
            **m,
        }
        write(record)
        evals.append(record)
        counters.next_eval = counters.responses_cum + c.eval_every_responses
        counters.evals_at_target += int(m["eval_accuracy"] >= c.target)
        return record

    # Compile the sampler and the update outside of training time (the protocol).
    t0 = time.perf_counter()
    matmul_rate = flops.measure_matmul_flops()  # once per process: the FLOP/s yardstick
    warm_examples = [train_data[i] for i in range(c.prompts)]
    warm = rollout_lib.rollout(
        sampler,
        algo.policy_params(state),
        task,
        tokenizer,
        warm_examples,
        c.group_size,
        rng=jax.random.key(0),
        sampling=sampling,
        gen_batch=c.gen_batch,
    )
    # One throw-away update on a copy of the state (the update donates its input).
    scratch = jax.tree.map(jnp.copy, state)
    keep_all = np.ones(c.prompts, bool)
    jax.block_until_ready(update_fn(scratch, algo.make_batch(warm, keep_all), base_rng))
    del scratch
    counters.time_compile_s += time.perf_counter() - t0

    if not evals:
        run_eval()
    bar = _Progress(c.budget_responses, c.name, progress)
    status = "running"
    last_reward = 0.0
    executor = concurrent.futures.ThreadPoolExecutor(1, "rollout") if depth else None
    # Async: the rollouts drawn and not yet trained on, oldest first (a resumed run starts
    # with those of its checkpoint, already generated).
    pending: collections.deque[_InFlight] = collections.deque()
    for job in in_flight:
        ro = rollout_lib.rollout_from_json(job["rollout"])
        pending.append(_InFlight(job["index"], job["position"], job["gen_step"], _done(ro)))

    def start_partial_rollout() -> _InFlight:
        """Continues the carried groups and starts new ones (gen_step: the oldest finished)."""
        index, position = counters.rollouts, counters.data_position
        rng = jax.random.fold_in(base_rng, index)
        n_new = c.prompts - len(carry)
        idx = _training_order(len(train_data), c.seed, position, n_new)
        counters.data_position += n_new
        counters.rollouts += 1
        groups = carry + [
            partial_rollout.new_group(tokenizer, train_data[int(i)], c.group_size, counters.step)
            for i in idx
        ]
        t0, compiled = time.perf_counter(), partial_sampler.num_compilations
        work = partial_rollout.advance(
            partial_sampler,
            algo.policy_params(state),
            groups,
            eos_id=tokenizer.eos_id,
            max_new_tokens=c.derived.max_new_tokens,
            tokens_per_iter=c.partial_rollout.tokens_per_iter,
            rng=jax.random.fold_in(rng, 0),
            sampling=sampling,
        )
        time_generate = time.perf_counter() - t0
        ro = partial_rollout.to_rollout(
            groups,
            task,
            tokenizer,
            prompt_len=batch_prompt_len,
            response_len=batch_response_len,
            pad_id=tokenizer.pad_id,
        )
        # Only this iteration's work: ro.samples also holds the carried groups' tokens.
        ro.time_generate_s, ro.gen_tokens, ro.gen_flops = (
            time_generate,
            work.gen_tokens,
            work.gen_flops,
        )
        if partial_sampler.num_compilations != compiled:  # a new (batch, length) bucket
            ro.time_generate_s, ro.time_compile_s = 0.0, time_generate
        carry[:] = [g for g in groups if not g.complete]
        done_steps = [g.started_at_step for g in groups if g.complete]
        return _InFlight(index, position, min(done_steps, default=counters.step), ro)

    def start_rollout() -> _InFlight:
        """Draws the next prompts and generates them (async: submits them to the thread)."""
        if partial:
            return start_partial_rollout()
        index, position = counters.rollouts, counters.data_position
        rng = jax.random.fold_in(base_rng, index)
        idx = _training_order(len(train_data), c.seed, position, c.prompts)
        examples = [train_data[int(i)] for i in idx]
        counters.data_position += c.prompts
        counters.rollouts += 1
        params = algo.policy_params(state)
        if executor is not None:  # The update donates its state: generate from a copy.
            params = jax.block_until_ready(jax.tree.map(jnp.copy, params))
        args = (sampler, params, task, tokenizer, examples, c.group_size)
        kwargs = dict(rng=jax.random.fold_in(rng, 0), sampling=sampling, gen_batch=c.gen_batch)
        if executor is None:
            return _InFlight(index, position, counters.step, rollout_lib.rollout(*args, **kwargs))
        future = executor.submit(rollout_lib.rollout, *args, **kwargs)
        return _InFlight(index, position, counters.step, future)

    def drain() -> float:
        """Waits for the rollouts in flight (validation, checkpoints); the seconds waited."""
        t0 = time.perf_counter()
        concurrent.futures.wait([job.result for job in pending])
        return time.perf_counter() - t0

    try:
        while counters.responses_cum < c.budget_responses:
            t_step = time.perf_counter()
            if executor is None:
                job = start_rollout()
                ro = job.result
                learner_wait = time.perf_counter() - t_step
            else:
                while len(pending) < depth:
                    pending.append(start_rollout())
                job = pending.popleft()
                ro = job.result.result()
                learner_wait = time.perf_counter() - t_step
                if len(pending) < depth:  # (a resume with a smaller depth uses its backlog)
                    pending.append(start_rollout())  # overlaps the update below
            rng = jax.random.fold_in(base_rng, job.index)
            staleness = counters.step - job.gen_step
            if algo.filter_groups:
                keep_p = dynamic_sampling_filter(ro.rewards_pg).keep_p
            else:
                keep_p = np.ones(c.prompts, bool)
            if ro.complete_p is not None:  # partial rollout: only finished groups train
                keep_p = keep_p & ro.complete_p
            retained = int(keep_p.sum()) * c.group_size
            # Responses that ended in this rollout (partial rollout: finished groups only).
            generated = c.group_size * (
                c.prompts if ro.complete_p is None else int(ro.complete_p.sum())
            )
            counters.responses_generated_cum += generated
            counters.time_generate_s += ro.time_generate_s
            counters.time_score_s += ro.time_score_s
            costs = flops.rollout_costs(model_config, ro.samples)
            # Work the algorithm does besides forward + backward (GRPO's reference pass).
            extra_update_flops = getattr(algo, "extra_update_flops", None)
            if extra_update_flops is not None:
                costs["update_flops"] += extra_update_flops(costs)
            if ro.gen_flops is not None:  # partial: the samples also hold earlier tokens
                costs["gen_tokens"], costs["gen_flops"] = ro.gen_tokens, ro.gen_flops
            if not ro.time_compile_s:  # (else its time is compilation, not generation)
                counters.gen_tokens_cum += costs["gen_tokens"]
                counters.gen_flops_cum += costs["gen_flops"]
            last_reward = float(ro.rewards_pg.mean())

            t_update = 0.0
            metrics: dict[str, Any] = {}
            if retained > 0:
                # (Device work ``make_batch`` dispatches, e.g. GRPO's reference pass, runs
                # asynchronously: the update waits for it, so it is timed with the update.)
                batch = algo.make_batch(ro, keep_p)
                t0 = time.perf_counter()
                state, metrics = update_fn(state, batch, jax.random.fold_in(rng, 1))
                metrics = jax.device_get(metrics)
                t_update = time.perf_counter() - t0
                counters.time_update_s += t_update
                counters.update_tokens_cum += costs["update_tokens"]
                counters.update_flops_cum += costs["update_flops"]
                skipped = bool(metrics.get("skipped", 0))
                counters.skipped_updates += int(skipped)
                counters.consecutive_skips = counters.consecutive_skips + 1 if skipped else 0
                counters.step += 1
                if skipped:
                    log.warning(
                        "update %d skipped: non-finite loss or gradients (%d in a row, the run "
                        "stops at %d)",
                        counters.step,
                        counters.consecutive_skips,
                        c.max_consecutive_skips,
                    )
                # The sample axis counts responses the policy learned from (not PPO's
                # critic warm-up, not a skipped update).
                if not skipped and algo.trains_policy(metrics):
                    if counters.policy_start_step < 0:
                        counters.policy_start_step = counters.step - 1
                        counters.policy_start_time_s = counters.time_train_cum_s
                    counters.responses_cum += retained
            # Compilation met during the step is timed but not training time.
            step_time = time.perf_counter() - t_step - ro.time_compile_s
            counters.time_compile_s += ro.time_compile_s
            busy = ro.time_generate_s + ro.time_score_s
            if executor is not None:  # generation overlaps the update: learner-side idle
                busy = learner_wait
            idle = max(step_time - busy - t_update, 0.0)
            counters.time_idle_s += idle
            counters.time_train_cum_s += step_time
            generator_idle = max(step_time - ro.time_generate_s - ro.time_score_s, 0.0)
            counters.time_learner_wait_s += learner_wait
            counters.time_generator_idle_s += generator_idle

            if retained > 0:
                write(
                    {
                        "kind": "update",
                        "step": counters.step,
                        "responses_cum": counters.responses_cum,
                        "responses_generated_cum": counters.responses_generated_cum,
                        "prompts": c.prompts,
                        "group_size": c.group_size,
                        "batch_responses": retained,
                        "batch_generated": generated,
                        "lr": c.lr,
                        "reward_mean": last_reward,
                        "reward_retained_mean": float(ro.rewards_pg[keep_p].mean()),
                        "time_generate_s": ro.time_generate_s,
                        "time_score_s": ro.time_score_s,
                        "time_update_s": t_update,
                        "time_idle_s": idle,
                        "time_train_cum_s": counters.time_train_cum_s,
                        "gen_tokens": costs["gen_tokens"],
                        **flops.step_throughput(
                            gen_tokens=costs["gen_tokens"],
                            gen_flops=costs["gen_flops"],
                            time_generate_s=ro.time_generate_s,
                            update_tokens=costs["update_tokens"],
                            upd_flops=costs["update_flops"],
                            time_update_s=t_update,
                            responses=retained,
                            step_time_s=step_time,
                            matmul_flops_per_s=matmul_rate,
                        ),
                        # Jit traces so far (sampler + update): constant after the warm-up.
                        "staleness": staleness,
                        "time_learner_wait_s": learner_wait,
                        "time_generator_idle_s": generator_idle,
                        "compilations": sampler.num_compilations + flops.jit_cache_size(update_fn),
                        **{k: float(np.asarray(v)) for k, v in metrics.items()},
                        # PPO's critic warm-up lines are set aside by the analysis.
                        "phase": "train" if algo.trains_policy(metrics) else "critic_warmup",
                    }
                )
            counters.consecutive_empty = 0 if retained else counters.consecutive_empty + 1
            if counters.consecutive_empty >= c.max_empty_rollouts:
                save_checkpoint()
                raise RuntimeError(
                    f"{counters.consecutive_empty} rollout batches in a row had no group with "
                    f"differing rewards (mean reward {last_reward:.3f}): the policy is "
                    "too weak or too strong for this task; warm-start it or change the task"
                )
            if counters.consecutive_skips >= c.max_consecutive_skips:
                save_checkpoint()
                raise FloatingPointError(
                    f"{counters.consecutive_skips} consecutive updates had non-finite loss or "
                    f"gradients (step {counters.step}); stopped with a checkpoint in "
                    f"{ckpt.directory}"
                )

            accuracy = None
            if counters.responses_cum >= counters.next_eval:
                if pending:  # Validation alone on the device; the wait is training time.
                    waited = drain()
                    counters.time_train_cum_s += waited
                    counters.time_learner_wait_s += waited
                accuracy = run_eval()["eval_accuracy"]
                if c.stop_at_target and counters.evals_at_target >= c.confirm_evals:
                    bar.update(counters, last_reward, accuracy)
                    break
            if counters.step and counters.step % c.checkpoint_every == 0 and retained > 0:
                save_checkpoint()
            bar.update(counters, last_reward, accuracy)
        # The rollouts in flight go into the last checkpoint (a longer run resumed from it
        # trains on them); they are generated past the budget: not training time.
        if pending:
            drain()
        if not evals or evals[-1]["responses_cum"] != counters.responses_cum:
            run_eval()
        save_checkpoint()
        status = "finished"
    except BaseException as e:
        status = "failed" if not isinstance(e, KeyboardInterrupt) else "interrupted"
        if is_writer:
            summary = _summary(c, counters, evals, status)
            summary["error"] = f"{type(e).__name__}: {e}"
            artifacts.write_json_atomic(os.path.join(run_dir, artifacts.SUMMARY_FILE), summary)
        raise
    finally:
        bar.close()
        if executor is not None:  # (a failed run drops the rollouts still queued)
            executor.shutdown(wait=True, cancel_futures=True)
        if is_writer:
            provenance.end_session(run_dir, status)
    summary = _summary(c, counters, evals, status)
    if is_writer:
        artifacts.write_json_atomic(os.path.join(run_dir, artifacts.SUMMARY_FILE), summary)
    ckpt.close()
    return summary


class GRPO:
    """The GRPO pieces of the run loop: state, batch and update.

    Another algorithm plugs into ``run`` by providing the same members (see
    ``rl_batch.ppo.PPO``): ``filter_groups``, ``init_state(params)``,
    ``policy_params(state)``, ``make_batch(rollout, keep_p)``, ``update_fn`` and
    ``trains_policy(metrics)``.
    """

    def __init__(self, c: ConfigDict, model_config: model_lib.ModelConfig, mesh):
        self.config, self.model_config, self.mesh = c, model_config, mesh
        self.filter_groups = c.filter_groups
        self.optimizer = learner.make_optimizer(
            lr=c.lr,
            b1=c.b1,
            b2=c.b2,
            eps=c.eps,
            weight_decay=c.weight_decay,
            max_grad_norm=c.max_grad_norm or None,
        )
        self.grpo_config = learner.GRPOConfig(
            clip_low=c.grpo.clip_low,
            clip_high=c.grpo.clip_high,
            kl_coef=c.grpo.kl_coef,
            loss_agg=c.grpo.loss_agg,
            advantage=c.grpo.advantage,
            micro_batches=c.grpo.micro_batches,
            num_minibatches=c.grpo.num_minibatches,
            num_epochs=c.grpo.num_epochs,
            temperature=c.sampling.temperature,
            router_aux_loss_coef=c.grpo.get("router_aux_loss_coef", 0.0),
            routing_replay=c.grpo.get("routing_replay", False),
        )
        self.update_fn = learner.make_update_fn(
            model_config, self.grpo_config, self.optimizer, mesh
        )
        # KL to a reference (``grpo.kl_coef > 0``): the initial policy, kept frozen; its
        # log-probs join every batch (``Batch.ref_logprobs``). Computed as many rows at a
        # time as an update micro-batch holds (B / num_minibatches / micro_batches), so
        # its [rows, R, V] logits fit wherever the update's do.
        self.ref_params = None
        self._ref_logprobs_fn = None
        if c.grpo.kl_coef:
            self._ref_logprobs_fn = learner.make_logprobs_fn(
                model_config,
                mesh,
                c.sampling.temperature,
                micro_batches=c.grpo.num_minibatches * c.grpo.micro_batches,
            )

    def init_state(self, params) -> learner.TrainState:
        """The train state from the initial policy (also the KL reference, if any).

        A resumed run calls this with the same initial policy before restoring its
        checkpoint, so its reference is the same as the uninterrupted run's.
        """
        state = learner.init_train_state(self.model_config, params, self.optimizer, mesh=self.mesh)
        if self._ref_logprobs_fn is not None:  # a copy: updates donate the state's buffers
            self.ref_params = jax.tree.map(lambda x: jnp.array(x, copy=True), state.params)
        return state

    @staticmethod
    def policy_params(state: learner.TrainState):
        return state.params

    def extra_update_flops(self, costs: dict[str, float]) -> float:
        """FLOPs ``make_batch`` adds to an update (``costs``: ``flops.rollout_costs``):
        the reference policy's forward over the batch's tokens with a KL term, else 0."""
        if self._ref_logprobs_fn is None:
            return 0.0
        return costs["update_flops"] / flops.UPDATE_FLOPS_MULTIPLIER

    @staticmethod
    def trains_policy(metrics: dict) -> bool:
        del metrics
        return True

    def make_batch(self, ro: rollout_lib.Rollout, keep_p: np.ndarray) -> learner.Batch:
        """Group-relative advantages; dropped groups get an all-False response mask."""
        advantages_pg = (
            np.asarray(group_advantages(ro.rewards_pg, mode=self.config.grpo.advantage))
            * keep_p[:, None]
        )
        batch = rollout_batch(ro, advantages_pg.reshape(-1), keep_p, self.mesh)
        if self.ref_params is not None:
            batch = batch.replace(ref_logprobs=self._ref_logprobs_fn(self.ref_params, batch))
        return batch


def make_algorithm(c: ConfigDict, model_config: model_lib.ModelConfig, mesh):
    """The learner of ``c.algo``."""
    if c.algo == "ppo":
        from rl_batch import ppo

        return ppo.PPO(c, model_config, mesh)
    return GRPO(c, model_config, mesh)


def rollout_batch(
    ro: rollout_lib.Rollout, advantages_b: np.ndarray, keep_p: np.ndarray, mesh
) -> learner.Batch:
    """The learner's batch from a rollout (row p * G + g), sharded over the mesh.

    Responses of dropped groups (``keep_p`` False) get an all-False response mask, so
    they weigh nothing in the loss while every batch keeps one shape (no recompiles).
    """
    s = ro.samples
    g = ro.rewards_pg.shape[1]
    response_mask = np.asarray(s.response_mask, bool) & np.repeat(keep_p, g)[:, None]
    batch = learner.Batch(
        prompt_tokens=jnp.asarray(s.prompt_tokens, jnp.int32),
        prompt_mask=jnp.asarray(s.prompt_mask, bool),
        response_tokens=jnp.asarray(s.response_tokens, jnp.int32),
        response_mask=jnp.asarray(response_mask),
        old_logprobs=jnp.asarray(s.response_logprobs, jnp.float32),
        advantages=jnp.asarray(advantages_b, jnp.float32),
        routed_experts=None if s.routed_experts is None else jnp.asarray(s.routed_experts),
    )
    return sharding.shard_batch(batch, mesh)
