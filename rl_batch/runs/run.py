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
seed; the rollouts in flight or carried at a save are part of the checkpoint, see
``rl_batch.rollout.sources``). A run that finishes waits for its batches in flight
(outside training time) so that a longer run can resume from its last checkpoint.

The pieces: ``rollout_source.RolloutSource`` (sync, async or partial rollout behind one
``next``), ``accounting.StepAccounting`` (one step's timings and counts into the
counters and its metrics line), ``Evaluator`` (validation) and ``MetricsLog``
(metrics.jsonl, ``rl_batch.runs.metrics_log``); ``run`` reads top to bottom: set up, compile, then
rollout -> update -> book -> validate -> checkpoint until the budget is spent.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import ConfigDict

from rl_batch import artifacts, distributed, locks, provenance, targets
from rl_batch.algorithms import exact_eval, grpo, learner
from rl_batch.algorithms.learner import Algorithm
from rl_batch.models import flops, sharding
from rl_batch.models import transformer as model_lib
from rl_batch.rollout import groups as rollout_lib
from rl_batch.rollout import sources as rollout_source
from rl_batch.rollout.sampler import Sampler
from rl_batch.runs import batch_schedule, retention, tracking
from rl_batch.runs import config as config_lib
from rl_batch.runs import programs as programs_lib
from rl_batch.runs.accounting import (
    STOP_TARGET,
    Counters,
    Step,
    StepAccounting,
    keep_mask,
    restored_counters,
    stop_reason,
    stuck_error,
)
from rl_batch.runs.checkpoint import Checkpointer, CheckpointMismatchError
from rl_batch.runs.metrics_log import MetricsLog
from rl_batch.runs.spec import RunSpec
from rl_batch.tasks.plugin import is_plugin
from rl_batch.tasks.tfds_builders import load_split

log = logging.getLogger(__name__)


def _resume_removed(spec: RunSpec) -> dict[str, Any] | None:
    """A finished run whose checkpoints were all removed (``rl_batch.runs.retention``):
    under a config that keeps it stopped, its summary (rebuilt from the counters and
    metrics lines kept in ``checkpoints/removed.json``; nothing is trained). Under one
    that trains it further, None, after a one-line warning: the run trains again from
    step 0 (the marker goes), as a fresh run of this config would. None too when the
    run's checkpoints were not removed."""
    run_dir = os.path.abspath(spec.io.run_dir)
    removed = retention.read_removed(run_dir)
    if removed is None:
        return None
    _check_resumable(run_dir, spec)
    c, is_writer = spec.config, jax.process_index() == 0
    counters = restored_counters(c, removed["counters"])
    counters.stopped = stop_reason(c, counters)
    if not counters.stopped:
        log.warning(
            "%s: its checkpoints were removed when it finished (step %d, "
            "sweep.keep_checkpoints=%s); this config trains it further: it trains again "
            "from step 0 (the same seed redoes the same steps, re-timed)",
            run_dir, removed["step"], removed.get("policy"),
        )  # fmt: skip
        if is_writer:
            retention.clear_removed(run_dir)
        return None
    if is_writer:
        artifacts.write_json_atomic(os.path.join(run_dir, artifacts.CONFIG_FILE), spec.to_json())
    # (The metrics file is checked against the kept copy and rebuilt from it if damaged.)
    metrics_log = MetricsLog(run_dir, is_writer, counters.step, removed.get("metrics"))
    summary = _summary(c, counters, metrics_log.records, "finished")
    if is_writer:
        artifacts.write_json_atomic(os.path.join(run_dir, artifacts.SUMMARY_FILE), summary)
    return summary


def _check_resumable(run_dir: str, spec: RunSpec) -> None:
    """Refuses a config that differs from the one ``run_dir``'s run trained with (a
    config.json left by a run that stopped before any metrics or checkpoint is not
    a run: it is replaced)."""
    path = os.path.join(run_dir, artifacts.CONFIG_FILE)
    ran = any(
        os.path.exists(os.path.join(run_dir, name))
        for name in (artifacts.METRICS_FILE, artifacts.CHECKPOINT_DIR)
    )
    if not os.path.exists(path) or not ran:
        return
    diffs = config_lib.resume_diffs(artifacts.read_json(path), spec.to_json())
    if diffs:
        raise ValueError(
            f"{run_dir} holds a run with a different config ({'; '.join(diffs)}); only "
            f"{', '.join(config_lib.RESUME_ALLOWED)} may change on resume: use a new run_dir "
            "or delete it"
        )


def load_task_data(spec: RunSpec, tokenizer) -> tuple[Any, Any]:
    """(train, validation) random-access sequences of example dicts of a resolved run.

    A user's task class (``task.name="module:Class"``) has its splits drawn in memory
    from its ``make_example`` (`rl_batch.tasks.plugin`). Synthetic tasks come from their
    TFDS splits (prepared in ``<work_dir>/data`` on first use); math data from the local
    files named by ``task.train_file`` and ``task.validation_file`` (or
    ``task.eval_fraction`` of the training file held out), prompts rendered with the
    tokenizer's chat template (``task.chat_template_kwargs``), validation rows shuffled by
    ``task.split_seed``.
    """
    c, t, max_prompt_len = spec.config, spec.task, spec.max_prompt_len
    if is_plugin(t.name):  # (a user's task class: drawn in memory)
        return t.plugin_splits(config_lib.make_task(c))
    if t.name in config_lib.SYNTHETIC_TASKS:
        data_dir = os.path.join(os.path.abspath(spec.io.work_dir), "data")
        kwargs = dict(t.kwargs, n_train=t.n_train, n_validation=t.n_validation)
        return (
            load_split(t.name, "train", data_dir, **kwargs),
            load_split(t.name, "validation", data_dir, **kwargs),
        )
    from rl_batch.tasks.math_data import DEFAULT_INSTRUCTION, hold_out, load_math_file, shuffled

    instruction = t.instruction
    template_kwargs = dict(t.chat_template_kwargs or {})

    def load(path):
        # Prompts over the sampler's budget fail here (or, with task.drop_long_prompts,
        # are dropped with a warning), naming the file and line.
        examples = load_math_file(
            path,
            fmt=t.format,
            tokenizer=tokenizer,
            instruction=DEFAULT_INSTRUCTION if instruction is None else instruction,
            system=t.system_prompt or None,
            max_prompt_tokens=max_prompt_len,
            drop_long_prompts=bool(t.drop_long_prompts),
            chat_template_kwargs=template_kwargs,
        )
        return [ex.to_dict() for ex in examples]

    seed, fraction = t.split_seed, t.eval_fraction
    # (Named by path and field: "<path> (task.train_file) has 0 examples, ...".)
    train_name = f"{t.train_file} (task.train_file)"
    val_name = f"{t.validation_file} (task.validation_file)"
    train = load(t.train_file)
    if fraction:
        train, val = hold_out(train, fraction, seed)
        val_name = f"task.eval_fraction={fraction} of {train_name}"
        train_name = f"{train_name} less task.eval_fraction={fraction}"
    else:
        val = load(t.validation_file)
    config_lib.check_data_sizes(c, len(train), len(val), train_name, val_name)
    return train, shuffled(val, seed)


def initial_params(spec: RunSpec) -> Any:
    """The starting policy named by the run's ``init`` section."""
    init, model_config = spec.init, spec.model
    source = init.source
    if source == "scratch":
        return model_lib.init_params(model_config, spec.rollout.seed)
    if source == "pretrain":
        from rl_batch.runs import pretrain

        return pretrain.base_params(spec)
    if source == "params":  # a base policy file (experiments.pretrain --export)
        from rl_batch.runs import pretrain

        return pretrain.load_params_file(init.path, model_config)
    if source == "hf":
        from rl_batch.models import hf

        _, params = hf.load_hf_checkpoint(
            init.path, dtype=model_config.param_dtype, scan_layers=model_config.scan_layers
        )
        return params
    # A checkpoint directory of an earlier run: its policy params only, read as host
    # arrays (no orbax sharding: the same under any process count), in either layer
    # layout (an earlier run may have stored its blocks stacked or per layer).
    like = model_lib.abstract_params(model_config)
    host = restore_either_layout(Checkpointer(init.path), model_config)
    return jax.tree.map(lambda x, a: jnp.asarray(x, dtype=a.dtype), host, like)


def restore_either_layout(ckpt: Checkpointer, model_config: model_lib.ModelConfig) -> Any:
    """The policy params of ``ckpt``'s latest step in ``model_config``'s layer layout,
    whichever layout (stacked or per layer, ``scan_layers``) they were stored in.

    Raises:
      CheckpointMismatchError: the stored params match neither layout of the model (the
        message compares them with ``model_config``'s own layout).
    """
    try:
        return ckpt.restore_policy_params(model_lib.abstract_params(model_config))
    except CheckpointMismatchError as mismatch:
        if model_config.num_experts:  # (MoE models have one layout)
            raise
        other = model_config.replace(scan_layers=not model_config.scan_layers)
        try:
            host = ckpt.restore_policy_params(model_lib.abstract_params(other))
        except CheckpointMismatchError:
            raise mismatch from None
    return model_lib.to_layout(model_config, host)


class _Progress:
    """A one-line progress display: responses, reward, accuracy, ETA."""

    def __init__(self, total: int, name: str, enabled: bool):
        self.enabled = enabled and jax.process_index() == 0
        self.total, self.name, self.t0 = total, name, time.time()
        self.accuracy: float | None = None  # the latest validation accuracy
        self._bar = None
        if self.enabled:
            try:
                from tqdm.auto import tqdm  # (widgets in a notebook, text in a terminal)

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
            # One render per step (set_postfix_str refreshes; a second refresh() would
            # print every step twice in a non-TTY log).
            self._bar.set_postfix_str(f"step {counters.step} reward {reward:.3f} acc {acc}")
        else:
            print(
                f"[{self.name}] {counters.responses_cum}/{self.total} reward {reward:.3f} acc {acc}"
            )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _summary(c: ConfigDict, counters: Counters, records: list[dict], status: str) -> dict:
    """``summary.json`` from the counters and the run's metric lines (all sessions)."""
    # N*, T, q and updates count from the first policy update (after any critic warm-up),
    # computed exactly as the analysis does (``rl_batch.targets``).
    crossing = c.get("target_crossing", "update")
    reach = targets.reach_of_records(records, c.target, crossing=crossing)
    ys = [r["eval_accuracy"] for r in records if r["kind"] == "eval"]
    summary: dict[str, Any] = {
        "status": status,
        "name": c.name,
        "target": c.target,
        "reached": reach.reached,
        "n_star": reach.n_star,
        "steps": counters.step,
        "responses_cum": counters.responses_cum,
        "responses_generated_cum": counters.responses_generated_cum,
        "final_eval_accuracy": ys[-1] if ys else None,
        "best_eval_accuracy": max(ys) if ys else None,
        "initial_eval_accuracy": ys[0] if ys else None,
        "skipped_updates": counters.skipped_updates,
        "stopped": counters.stopped or None,  # "target", "budget"; None while it trains
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
    summary["time_to_target_s"] = reach.time_to_target_s
    summary["updates_to_target"] = reach.updates_to_target
    summary["q"] = reach.q
    if not reach.reached:
        summary["n_star_text"] = artifacts.NOT_REACHED
    if c.get("target_band_lo") is not None:  # the whole-curve estimator the analysis uses
        band = targets.reach_of_records(records, c.target, c.target_band_lo, crossing)
        summary["target_band_lo"] = c.target_band_lo
        summary["n_star_band"] = band.n_star
        summary["time_to_band_s"] = band.time_to_target_s
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


class Evaluator:
    """Validation, booked into the counters: sampled mean@k on ``eval_prompts`` held-out
    prompts and, with ``eval_metric="p_ref"``, the exact p(reference response) on
    ``eval_ref_prompts`` of them (``rl_batch.algorithms.exact_eval``). ``eval_accuracy``, the
    validation accuracy that the target and N* are on, is the metric ``eval_metric``
    names (``eval_metric`` in the line); ``eval_mean_at_k`` is always the sampled one.

    The exact p_ref of the warm start (step 0) is scored once per scorer, i.e. once per
    configuration in a process that keeps programs (``rl_batch.runs.programs``), when the
    warm start does not depend on the seed (`warm_start_key`): a sweep's seeds share it."""

    def __init__(self, spec: RunSpec, sampler, task, tokenizer, val_data, base_rng, scorer):
        self.c, self.sampler, self.task, self.tokenizer = spec.evaluation, sampler, task, tokenizer
        self.gen_batch, self.log_generations = spec.rollout.gen_batch, spec.io.log_generations
        self.examples = [val_data[i] for i in range(min(self.c.eval_prompts, len(val_data)))]
        self.rng = jax.random.fold_in(base_rng, 1)
        sampling = spec.rollout.sampling
        self.sampling, self.stop_strings = sampling.method, sampling.stop_strings
        # (step, rows) -> None: takes the sampled generations of the first
        # ``log_generations`` prompts of each validation (`MetricsLog.write_generations`).
        self.on_generations = None
        self.scorer = scorer  # ``make_scorer``: exact p_ref, or None (sampled only)
        self.warm_start = warm_start_key(spec)

    def __call__(self, params, counters: Counters) -> dict:
        """Validates ``params``; returns the eval line (and schedules the next validation).

        With ``eval_sampled_every`` > 1 (p_ref runs), the sampled metrics (``eval_mean_at_k``,
        ``eval_pass_at_k``, ``eval_response_len``, logged generations) are in every that
        many lines, the first included; p_ref is in every line."""
        c = self.c
        rows: list[dict] = []
        n_rows = self.log_generations if self.on_generations is not None else 0

        def keep(ro: rollout_lib.Rollout) -> None:
            rows.extend(generation_rows(self.tokenizer, ro, n_rows, counters, "validation"))

        m: dict[str, Any] = {"time_eval_s": 0.0}
        if self.scorer is None or counters.evals % c.eval_sampled_every == 0:
            m = rollout_lib.evaluate(
                self.sampler,
                params,
                self.task,
                self.tokenizer,
                self.examples,
                k=c.eval_k,
                rng=jax.random.fold_in(self.rng, counters.step),
                sampling=self.sampling,
                greedy=c.eval_greedy,
                gen_batch=self.gen_batch,
                on_rollout=keep if n_rows else None,
                stop_strings=self.stop_strings,
            )
            m["eval_mean_at_k"] = m["eval_accuracy"]
        counters.evals += 1
        if self.scorer is not None:
            exact = self.scorer(params, self.warm_start if counters.step == 0 else None)
            m["time_eval_s"] += exact.pop("time_eval_ref_s")
            m.update(exact, eval_accuracy=exact["eval_p_ref"])
        counters.time_eval_s += m["time_eval_s"]
        counters.next_eval = counters.responses_cum + c.eval_every_responses
        counters.evals_at_target += int(m["eval_accuracy"] >= c.target)
        if rows:
            self.on_generations(counters.step, rows)
        return {
            "kind": "eval",
            "step": counters.step,
            "responses_cum": counters.responses_cum,
            "responses_generated_cum": counters.responses_generated_cum,
            "time_train_cum_s": counters.time_train_cum_s,
            "eval_metric": c.eval_metric,
            **m,
        }


def warm_start_key(spec: RunSpec) -> tuple | None:
    """What names a run's starting policy when it is read from a file (``init.source``
    params, hf or a checkpoint directory: the path, with its size and modification time),
    else None (``scratch`` and ``pretrain`` draw it from seeds)."""
    init = spec.init
    if init.source in ("scratch", "pretrain") or not os.path.exists(init.path):
        return None
    stat = os.stat(init.path)
    return (init.source, os.path.abspath(init.path), stat.st_size, stat.st_mtime_ns)


def make_scorer(spec: RunSpec, tokenizer, val_data):
    """The exact p_ref scorer of the first ``eval_ref_prompts`` validation prompts
    (``eval_metric="p_ref"``), else None."""
    evaluation = spec.evaluation
    if evaluation.eval_metric != "p_ref":
        return None
    n_ref = min(evaluation.eval_ref_prompts or len(val_data), len(val_data))
    return exact_eval.ReferenceScorer(
        spec.model,
        tokenizer,
        [val_data[i] for i in range(n_ref)],
        temperature=spec.rollout.sampling.temperature,
        chunk=evaluation.eval_ref_chunk,
    )


def generation_rows(
    tokenizer, ro: rollout_lib.Rollout, n: int, counters: Counters, source: str
) -> list[dict]:
    """One ``generations.jsonl`` line per prompt of the first ``n`` of ``ro``: its sampled
    responses, their rewards and lengths (generated tokens, the stop id included);
    ``source`` is ``"validation"`` or ``"train"`` (``log_generations_every``)."""
    texts = rollout_lib.decode_responses(tokenizer, ro.samples)
    lengths = np.asarray(ro.samples.lengths)
    k = ro.rewards_pg.shape[1]
    return [
        {
            "kind": "generation",
            "source": source,
            "step": counters.step,
            "responses_cum": counters.responses_cum,
            "prompt": ex["prompt"],
            "answer": ex.get("answer"),
            "responses": texts[p * k : (p + 1) * k],
            "rewards": [float(r) for r in ro.rewards_pg[p]],
            "lengths": [int(x) for x in lengths[p * k : (p + 1) * k]],
        }
        for p, ex in enumerate(ro.examples[:n])
    ]


def save_checkpoint(s: _Setup, state, counters: Counters) -> None:
    """Saves the state, the counters, the rollouts not yet trained on and a copy of the
    metrics lines so far (what a resumed run's ``metrics.jsonl`` is rebuilt from), once
    per step.

    Async: the batches in flight came from older params than the state's; they are saved
    themselves, so the save waits for them: the learner's wait, as before validation
    (training time unless the budget is spent and this run will not train on them).
    """
    ckpt, source, budget = s.ckpt, s.source, s.spec.io.budget_responses
    if ckpt.has_step(counters.step):
        return  # This step is already on disk (and not damaged).
    if source.in_flight:
        waited = source.drain()
        if counters.responses_cum < budget:
            counters.add_learner_wait(waited)
    t0 = time.perf_counter()
    meta = {
        "counters": dataclasses.asdict(counters),
        **source.checkpoint_meta(),
        "metrics": artifacts.json_roundtrip(s.log.records),
    }
    ckpt.save(counters.step, {"state": state}, meta)
    counters.time_checkpoint_s += time.perf_counter() - t0


class _Setup(NamedTuple):
    """Everything a run builds before its first step."""

    spec: RunSpec
    c: ConfigDict  # spec.config: the read-only view of the inputs (and derived values)
    run_dir: str
    is_writer: bool
    model_config: model_lib.ModelConfig
    train_data: Any
    algo: Algorithm
    state: Any
    counters: Counters
    ckpt: Checkpointer
    log: MetricsLog
    sampler: Sampler
    source: rollout_source.RolloutSource
    evaluator: Evaluator
    base_rng: jax.Array


def _set_up(spec: RunSpec, resume: bool) -> _Setup:
    """Writes config.json, loads the data and the policy, restores the latest checkpoint."""
    c, io = spec.config, spec.io
    if not io.run_dir:
        raise ValueError("run_dir is empty: set --config.run_dir")
    run_dir = os.path.abspath(io.run_dir)
    is_writer = jax.process_index() == 0
    # Every process checks (process 0 writes only once its check passed), so a mismatch
    # stops all of them instead of leaving the others waiting in a collective.
    _check_resumable(run_dir, spec)
    if is_writer:
        os.makedirs(run_dir, exist_ok=True)
        artifacts.write_json_atomic(os.path.join(run_dir, artifacts.CONFIG_FILE), spec.to_json())
        provenance.start_session(run_dir)

    task = config_lib.make_task(c)
    tokenizer = config_lib.make_tokenizer(c)
    model_config = spec.model
    train_data, val_data = load_task_data(spec, tokenizer)
    # ``expert``: MoE expert parallelism (for a dense model one more batch axis).
    mesh = sharding.make_mesh(
        data=c.mesh.data, fsdp=c.mesh.fsdp, tensor=c.mesh.tensor, expert=c.mesh.get("expert", 1)
    )
    # (Reused, compiled, from an earlier run of this configuration when the process
    # keeps programs: ``rl_batch.runs.programs``.)
    algo, sampler, scorer = programs_lib.get(
        c,
        lambda: programs_lib.Programs(
            make_algorithm(spec, mesh),
            config_lib.make_sampler(spec, tokenizer, mesh),
            make_scorer(spec, tokenizer, val_data),
        ),
    )
    # (Multi-process: rebuilt so that a checkpoint of the initial state can be saved.)
    state = distributed.rebuild(algo.init_state(initial_params(spec)))

    base_rng = jax.random.key(spec.rollout.seed)
    source = rollout_source.RolloutSource(
        spec.rollout, sampler, model_config, task, tokenizer, train_data, base_rng, mesh
    )
    counters = Counters()
    ckpt = Checkpointer(os.path.join(run_dir, artifacts.CHECKPOINT_DIR), cleanup_tmp=True)
    resumed_step, saved_metrics = None, None
    if resume and ckpt.latest_step() is not None:
        tree, meta = ckpt.restore({"state": state})
        state = tree["state"]
        counters = restored_counters(c, meta["counters"])
        source.restore(meta, counters)
        resumed_step, saved_metrics = counters.step, meta.get("metrics")
        log.info("resumed %s at step %d", run_dir, counters.step)
    evaluator = Evaluator(spec, sampler, task, tokenizer, val_data, base_rng, scorer)
    for what, n in (
        ("training rollout", spec.batch),
        ("validation", len(evaluator.examples) * spec.evaluation.eval_k),
    ):
        gen_batch = spec.rollout.gen_batch
        rollout_lib.check_kv_memory(sampler, n, gen_batch, io.max_kv_bytes, what, source.sampling)
    tracker = None
    if is_writer:  # (process 0 writes the files and feeds the dashboards)
        info = tracking.RunInfo(
            run_dir, io.name or os.path.basename(run_dir), c.to_dict(), resumed_step
        )
        tracker = tracking.make_tracker(io.tracking, info)
    metrics_log = MetricsLog(run_dir, is_writer, resumed_step, saved_metrics, tracker)
    if is_writer:
        evaluator.on_generations = metrics_log.write_generations
    return _Setup(
        spec, c, run_dir, is_writer, model_config, train_data, algo, state, counters, ckpt,
        metrics_log, sampler, source, evaluator, base_rng,
    )  # fmt: skip


def _compile(s: _Setup, state, counters: Counters) -> float:
    """Compiles the sampler and the update outside of training time (the protocol).

    Returns the process's measured matmul FLOP/s (the yardstick of the throughput lines).
    """
    c, algo = s.c, s.algo
    t0 = time.perf_counter()
    matmul_rate = flops.measure_matmul_flops()  # once per process
    if s.sampler.num_compilations and flops.jit_cache_size(algo.update_fn):
        # Kept programs (``rl_batch.runs.programs``): an earlier run of this configuration in
        # this process compiled them, the warm-up rollout's shapes included.
        counters.time_compile_s += time.perf_counter() - t0
        return matmul_rate
    # Every batch shape the run trains with: P, or each of a batch schedule's doublings.
    for prompts in s.spec.batch_schedule.buckets:
        warm = rollout_lib.rollout(
            s.sampler,
            algo.policy_params(state),
            s.evaluator.task,
            s.evaluator.tokenizer,
            [s.train_data[i] for i in range(prompts)],
            c.group_size,
            rng=jax.random.key(0),
            sampling=s.source.sampling,
            gen_batch=c.gen_batch,
        )
        # One throw-away update on a copy of the state (the update donates its input).
        scratch = jax.tree.map(jnp.copy, state)
        keep_all = np.ones(prompts, bool)
        batch = algo.make_batch(warm, keep_all)
        jax.block_until_ready(algo.update_fn(scratch, batch, s.base_rng))
        del scratch
    counters.time_compile_s += time.perf_counter() - t0
    return matmul_rate


def enable_xla_cache(work_dir: str) -> None:
    """JAX's persistent compilation cache in ``<work_dir>/xla_cache`` (every program,
    however fast it compiled), unless ``$JAX_COMPILATION_CACHE_DIR`` or the config has one."""
    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    jax.config.update(
        "jax_compilation_cache_dir", os.path.join(os.path.abspath(work_dir), "xla_cache")
    )
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def run(
    spec: RunSpec | ConfigDict, *, resume: bool = True, progress: bool = True
) -> dict[str, Any]:
    """Runs one configuration to its budget (or to a confirmed target) and returns the summary.

    Args:
      spec: the run's ``RunSpec`` (``rl_batch.runs.config.resolve``), used as it is; a
        plain run config is resolved here, once (a run started from Python).
      resume: continue from the latest checkpoint in ``run_dir`` when there is one.
      progress: show a progress bar.

    Returns:
      The summary written to ``<run_dir>/summary.json``.

    Raises:
      locks.DirectoryLocked: another process is writing ``run_dir`` (nothing is written).
    """
    if not isinstance(spec, RunSpec):
        distributed.maybe_initialize(spec)  # (before resolve counts the devices)
        spec = config_lib.resolve(spec)
    distributed.maybe_initialize(spec.inputs)
    io = spec.io
    if io.xla_cache:
        enable_xla_cache(io.work_dir)
    if not io.run_dir:
        raise ValueError("run_dir is empty: set --config.run_dir")
    # One writer per run directory (process 0 of a multi-process run is its only writer).
    lock = locks.DirectoryLock(io.run_dir, "run") if jax.process_index() == 0 else None
    if lock is not None:
        lock.acquire()
    try:
        return _run(spec, resume, progress)
    finally:
        if lock is not None:
            lock.release()


def _run(spec: RunSpec, resume: bool, progress: bool) -> dict[str, Any]:
    """`run` once the config is resolved and the run directory is this process's."""
    if resume:
        kept = _resume_removed(spec)
        if kept is not None:
            return kept
    s = _set_up(spec, resume)
    c = s.c
    algo, source, evaluator, metrics_log, ckpt = s.algo, s.source, s.evaluator, s.log, s.ckpt
    state, counters = s.state, s.counters
    # A resumed run that had stopped (its target confirmed, or its budget spent) stays
    # stopped unless this config extends it: nothing to compile or train then.
    counters.stopped = stop_reason(c, counters)
    matmul_rate = flops.measure_matmul_flops() if counters.stopped else _compile(s, state, counters)
    accounting = StepAccounting(spec, algo.extra_update_flops, matmul_rate, source.depth > 0)
    if metrics_log.last_eval is None:
        metrics_log.write(evaluator(algo.policy_params(state), counters))
    io, evaluation = spec.io, spec.evaluation
    bar = _Progress(io.budget_responses, io.name, progress)
    status, reward = "running", 0.0
    warm_start = None  # (what the advice of a run that is never rewarded names)
    if spec.init.source == "pretrain":
        from rl_batch.runs import pretrain

        warm_start = pretrain.warm_start_info(spec)
    _write_summary(s, counters, status)  # "running" until the run ends (or dies)
    saved_at = time.perf_counter()  # (``checkpoint_min_s`` counts from here or a save)
    try:
        while not counters.stopped:
            t_step = time.perf_counter()
            # This batch's P, and the LR and clip rules at its P x G (a batch schedule;
            # else fixed: the state's LR and the update's configured clip range).
            prompts, adam, clip = _scheduled_batch(spec, counters, metrics_log.records)
            if adam is not None:
                state = learner.with_adam_hparams(state, **dataclasses.asdict(adam))
            job, ro, learner_wait = source.next(algo.policy_params(state), counters, prompts)
            keep_p = keep_mask(ro, algo.filter_groups)
            staleness = counters.step - job.gen_step
            t_update, metrics = 0.0, {}
            if keep_p.any():
                # (Device work ``make_batch`` dispatches, e.g. GRPO's reference pass, runs
                # asynchronously: the update waits for it, so it is timed with the update.)
                batch = algo.make_batch(ro, keep_p)
                t0 = time.perf_counter()
                rng = jax.random.fold_in(jax.random.fold_in(s.base_rng, job.index), 1)
                state, metrics = algo.update_fn(state, batch, rng, clip)
                metrics = jax.device_get(metrics)
                t_update = time.perf_counter() - t0
            step = Step(
                ro, keep_p, staleness, metrics, bool(metrics) and algo.trains_policy(metrics),
                learner_wait, t_update, time.perf_counter() - t_step,
                s.sampler.num_compilations + flops.jit_cache_size(algo.update_fn),
            )  # fmt: skip
            record = accounting.book(counters, step)
            if record is not None:
                metrics_log.write(record)
                every = io.log_generations_every
                if every and counters.step % every == 0:  # (the first log_generations prompts)
                    n = max(io.log_generations, 1)
                    rows = generation_rows(evaluator.tokenizer, ro, n, counters, "train")
                    metrics_log.write_generations(counters.step, rows)
            reward = float(ro.rewards_pg.mean())
            error = stuck_error(c, counters, reward, ckpt.directory, warm_start)
            if error is not None:
                save_checkpoint(s, state, counters)
                raise error
            accuracy = None
            if counters.responses_cum >= counters.next_eval:
                if source.in_flight:  # Validation alone on the device; the wait is training.
                    counters.add_learner_wait(source.drain())
                metrics_log.write(evaluator(algo.policy_params(state), counters))
                accuracy = metrics_log.last_eval["eval_accuracy"]
                if (
                    evaluation.stop_at_target
                    and counters.evals_at_target >= evaluation.confirm_evals
                ):
                    counters.stopped = STOP_TARGET
            counters.stopped = stop_reason(c, counters)
            if counters.stopped:  # (its checkpoint follows the final validation)
                bar.update(counters, reward, accuracy)
                break
            due = counters.step and counters.step % io.checkpoint_every == 0
            if due and record is not None and time.perf_counter() - saved_at >= io.checkpoint_min_s:
                save_checkpoint(s, state, counters)
                saved_at = time.perf_counter()
                _write_summary(s, counters, status)
            bar.update(counters, reward, accuracy)
        # The rollouts in flight go into the last checkpoint (a longer run resumed from it
        # trains on them); they are generated past the budget: not training time.
        source.drain()
        last = metrics_log.last_eval
        if last is None or last["responses_cum"] != counters.responses_cum:
            metrics_log.write(evaluator(algo.policy_params(state), counters))
        pruned = retention.prunes_own_final_step(io.prune_at_target, counters.stopped)
        if not pruned:
            save_checkpoint(s, state, counters)
        elif s.is_writer:  # (what the sweep's prune would keep of the save it removes)
            records = artifacts.json_roundtrip(s.log.records)
            counters_now = dataclasses.asdict(counters)
            retention.write_removed(
                s.run_dir, io.prune_at_target, counters.step, counters_now, records
            )
        status = "finished"
    except BaseException as e:
        status = "failed" if not isinstance(e, KeyboardInterrupt) else "interrupted"
        _write_summary(s, counters, status, error=f"{type(e).__name__}: {e}")
        raise
    finally:
        bar.close()
        source.close()
        metrics_log.close()
        if s.is_writer:
            provenance.end_session(s.run_dir, status)
    summary = _write_summary(s, counters, status)
    ckpt.close()
    if pruned and s.is_writer:  # (after close: no save of this run is still in flight)
        retention.remove_saved_steps(s.run_dir)
    return summary


def _scheduled_batch(
    spec: RunSpec, counters: Counters, records: list[dict]
) -> tuple[int, Any, tuple[float, float] | None]:
    """The next rollout batch's prompts under the run's batch schedule, the policy's
    Adam settings at its P x G and the clip range there, ``(clip_low, clip_high)`` (both
    None for a fixed schedule: the state keeps its own LR, the update its configured
    clip range).

    A pure function of the counters and the metrics lines, which a checkpoint restores:
    a resumed run continues the schedule exactly (`rl_batch.runs.batch_schedule`).
    """
    schedule = spec.batch_schedule
    if schedule.kind == "fixed":
        return schedule.prompts, None, None
    history = batch_schedule.noise_history(records) if schedule.kind == "adaptive" else ()
    prompts = batch_schedule.prompts_at(schedule, counters.responses_cum, history)
    batch = prompts * schedule.group_size
    # (the LR warm-up at this batch: the optimizer of a scheduled run has none of its own)
    return prompts, spec.optimizer_at(batch, update=counters.step), spec.clip_at(batch)


def _write_summary(s: _Setup, counters: Counters, status: str, error: str | None = None) -> dict:
    """``summary.json`` of the run so far (written by process 0), returned."""
    summary = _summary(s.c, counters, s.log.records, status)
    if error is not None:
        summary["error"] = error
    if s.is_writer:
        artifacts.write_json_atomic(os.path.join(s.run_dir, artifacts.SUMMARY_FILE), summary)
    return summary


def make_algorithm(spec: RunSpec, mesh) -> Algorithm:
    """The learner of ``spec``'s algorithm, with its optimizers at the run's batch."""
    algo, optimizer = spec.algo, spec.rules.optimizer
    max_grad_norm = optimizer.max_grad_norm or None
    adam = dataclasses.asdict(spec.optimizer)
    if spec.batch_schedule.kind == "fixed":  # (a schedule's run loop sets the warm-up's LR)
        adam["lr"] = learner.warmup_lr(adam["lr"], spec.lr_warmup_updates)  # (0: lr itself)
    actor_optimizer = learner.make_optimizer(
        **adam,
        weight_decay=optimizer.weight_decay,
        max_grad_norm=max_grad_norm,
    )
    if algo.name == "ppo":
        from rl_batch.algorithms import ppo

        critic_optimizer = ppo.make_critic_optimizer(
            **dataclasses.asdict(spec.critic_optimizer),
            weight_decay=optimizer.weight_decay,
            max_grad_norm=max_grad_norm,
            batch_scale=spec.rules.critic.batch_scale,
        )
        return ppo.PPO(
            spec.algorithm,
            spec.model,
            mesh,
            actor_optimizer=actor_optimizer,
            critic_optimizer=critic_optimizer,
            prompt_len=spec.max_prompt_len,
            seed=spec.rollout.seed,
            critic_from_policy=algo.ppo.critic_from_policy,
        )
    return grpo.GRPO(
        spec.algorithm,
        spec.model,
        mesh,
        optimizer=actor_optimizer,
        prompt_len=spec.max_prompt_len,
        filter_groups=algo.filter_groups,
    )
