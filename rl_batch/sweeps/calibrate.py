"""Calibrated throughput: every configuration's training step timed side by side.

A run's measured q (responses per training second) carries the host load of the minutes
it ran in: on a shared machine two configurations with identical compute per update
have measured q 143 and 180 responses/s in one sweep. ``calibrate_sweep`` times one
training step of each configuration of a sweep (the run loop's own code path:
``RolloutSource.next`` -> filter -> ``make_batch`` -> ``update_fn`` -> metrics to host,
from the warm-start policy, the run's resolved config and shapes) in one process,
interleaved: round r steps through the configurations in turn, one step each, starting
one further along each round (A B C, B C A, C A B, ...), until each has taken ``steps``
steps (a batch below half the median batch more, `visit_steps`: its short steps vary the
most; its extra steps are spread over the round, `round_order`). Every configuration
then sees the same host load, and the ratio of two step times is a side-by-side
measurement. A configuration's steps in one round are its "visit"; the spread over
rounds is kept. Configurations whose steps do the same work (their configs differ only in
the learning rate, e.g. the sqrt and fixed rules at one P x G: `compute_key`) are timed
once; the others' entries repeat its times and name it (``timed_as``).

A sweep's calibration is kept once made: it is redone only when the sweep has a
configuration it did not time or other calibration settings (``calibrate_sweep``), and the
one it replaces moves to ``<sweep>/calibrations/``; report.md names the one it uses.

Its rounds can come in two blocks (``sweep.calibrate_rounds_before``): that many before
the runs, the rest after them, 10-20 minutes apart on a CPU study. A shared host's
relative step times move on that scale (the B = 16 / B = 64 cost ratio of one 2-core
machine read 1.09-1.37 in eight calibrations of a day, each +-5 % within itself): rounds
timed in one sitting see one state of the host, and the analysis adds how far the
configurations' relative step times moved between the blocks to its intervals
(``rl_batch.analysis.intervals.block_drift``). The block before the runs also compiles
every configuration's programs into the runs' XLA cache.

``<sweep>/calibration.json`` (written here; its reader is ``artifacts.read_calibration``)::

    {"version": 1, "rounds": R, "steps": S, "host": ..., "load_start": [1, 5, 15 min],
     "load_end": [...], "wall_s": float, "written_at": ISO 8601 UTC,
     "round_blocks": [R block indices], "blocks": [{"rounds", "written_at", "wall_s",
                                                   "load_start", "load_end"}],
     "configs": {"PxG:rule": {"batch": B, "step_s": [R per-visit mean seconds],
                             "step_s_median": float, "run": run name used,
                             "steps_s": [R lists: each timed step's seconds],
                             "generate_s": [R per-visit mean seconds generating],
                             "gen_tokens_per_s": [R per-visit generated tokens/s],
                             "gen_concurrency": sequences decoded together,
                             "engine": "static" | "continuous", "slots": int,
                             "attn_block": int,
                             "prompts_step_s": {"P": [R]},  # batch schedules only
                             "timed_as": "PxG:rule"}},  # timed as that one's steps
     "gen_probe": {"C": {"gen_concurrency": C, "generate_s": [R], "gen_tokens_per_s": [R],
                         "engine": ..., "slots": ..., "attn_block": ...}}}

Every per-round list holds the rounds of all blocks in order; ``round_blocks`` says which
block each round is in (0: the first). Records written before blocks existed have neither
(one block). ``load_start`` and ``written_at`` are the first block's and the last's.

``engine``, ``slots`` and ``attn_block`` are the rollout engine the configuration's run
config selects (``sampling.*``, ``rl_batch.runs.sections.rollout_settings``; slots 0 = the
generation chunk): the generation time was measured with it. Records written before
they existed have none (the static engine).

A configuration with a batch-size schedule (``batch_schedule.kind`` not ``fixed``,
`rl_batch.runs.batch_schedule`) changes its P during a run: each P it can take (its
``buckets``) is timed as a fixed batch at that P (the LR rule applied there, as the
schedule does), in the same rotation, under ``prompts_step_s``; its ``step_s`` is the
largest P's. The analysis books each of a run's updates at the step time of the P it had.

``gen_probe`` (optional, ``sweep.calibrate_gen_probe``) times generation alone at
concurrencies past the grid's (the first configuration's rollout with ``C / G`` prompts),
in the same rotation, one call a visit (`PROBE_STEPS`): where a CPU's generation
throughput still rises at the largest training batch, the plateau that the critical
generation batch names lies beyond it.

The analysis turns a run's updates-to-target ``u*`` into calibrated training time
``T = u* x step_s_median`` of its configuration (``rl_batch.analysis.time_to_target``),
and takes the generation throughput per concurrency (the critical generation batch,
``rl_batch.analysis.cost_model``) from the same interleaved pass.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import statistics
import time
from typing import Any

import jax
import numpy as np
from ml_collections import ConfigDict

from rl_batch import artifacts, provenance
from rl_batch.models import sharding
from rl_batch.rollout import sources as rollout_source
from rl_batch.runs import config as config_lib
from rl_batch.runs import run as run_lib
from rl_batch.runs import sections
from rl_batch.runs.accounting import Counters, keep_mask
from rl_batch.runs.spec import RunSpec

log = logging.getLogger(__name__)

# A generation probe's visit: one call (a probe decodes 512-1024 sequences, a call as long
# as the largest batch's step; its tokens/s varies less than a short step's seconds).
PROBE_STEPS = 1
# Config fields that name a run or set only its learning rate: two configurations that
# differ in nothing else run the same programs on the same shapes (`compute_key`).
_NAME_OR_RATE = ("name", "run_dir", "seed", "lr", "lr_rule")
_DERIVED_RATE = ("lr", "lr_arithmetic")


@dataclasses.dataclass(frozen=True)
class StepTime:
    """One timed training step: the whole step, its generation part, tokens generated."""

    step_s: float
    generate_s: float
    gen_tokens: int


def gen_concurrency(c: ConfigDict) -> int:
    """Sequences one training rollout decodes together: P x G, capped by ``gen_batch``."""
    batch = int(c.prompts) * int(c.group_size)
    return min(batch, int(c.gen_batch)) if c.get("gen_batch", 0) else batch


def probe_config(c: ConfigDict, concurrency: int) -> ConfigDict:
    """``c`` with ``concurrency / group_size`` prompts decoded in one batch (a generation
    probe; a ValueError when the group size does not divide it)."""
    g = int(c.group_size)
    if concurrency < g or concurrency % g:
        raise ValueError(
            f"sweep.calibrate_gen_probe: concurrency {concurrency} is not a multiple of the "
            f"group size {g}"
        )
    probe = ConfigDict(c.to_dict())
    probe.prompts, probe.gen_batch = concurrency // g, 0
    return probe


def compute_key(spec: RunSpec) -> str:
    """The work of one training step of ``spec``: its resolved config (``config.json``)
    less the fields that only name the run or set its learning rate (`_NAME_OR_RATE`).
    Equal keys: the same programs on the same shapes with another LR value (e.g. the
    sqrt and fixed rules at one P x G), whose step times differ only by timing noise."""
    d = spec.to_json()
    for name in _NAME_OR_RATE:
        d.pop(name, None)
    d["derived"] = {k: v for k, v in d.get("derived", {}).items() if k not in _DERIVED_RATE}
    return json.dumps(d, sort_keys=True, default=str)


def schedule_buckets(spec: RunSpec) -> tuple[int, ...]:
    """The P values a configuration's batch schedule can take (empty: a fixed batch)."""
    schedule = spec.batch_schedule
    return () if schedule.kind == "fixed" else schedule.buckets


def bucket_config(c: ConfigDict, prompts: int) -> ConfigDict:
    """``c`` as a fixed batch of ``prompts`` prompts (one P of its batch schedule)."""
    fixed = ConfigDict(c.to_dict())
    fixed.prompts = prompts
    fixed.batch_schedule.kind = "fixed"
    return fixed


class _Stepper:
    """One configuration's learner and rollout source, stepping as the run loop does
    (``generate_only``: the rollout alone, its generation time as the step)."""

    def __init__(self, spec: RunSpec, generate_only: bool = False):
        c = spec.config
        self.c, self.generate_only = c, generate_only
        if c.get("xla_cache", False):  # the runs' compiled programs (as ``run.run`` reads them)
            run_lib.enable_xla_cache(c.work_dir)
        task = config_lib.make_task(c)
        tokenizer = config_lib.make_tokenizer(c)
        model_config = spec.model
        train_data, _ = run_lib.load_task_data(spec, tokenizer)
        mesh = sharding.make_mesh(
            data=c.mesh.data, fsdp=c.mesh.fsdp, tensor=c.mesh.tensor, expert=c.mesh.expert
        )
        self.algo = run_lib.make_algorithm(spec, mesh)
        self.state = self.algo.init_state(run_lib.initial_params(spec))
        self.rng = jax.random.key(c.seed)
        sampler = config_lib.make_sampler(spec, tokenizer, mesh)
        self.source = rollout_source.RolloutSource(
            spec.rollout, sampler, model_config, task, tokenizer, train_data, self.rng, mesh
        )
        self.counters = Counters()

    def step(self) -> StepTime:
        """One training step's seconds (what the run books as training time)."""
        t0 = time.perf_counter()
        job, ro, _ = self.source.next(self.algo.policy_params(self.state), self.counters)
        if self.generate_only:
            return StepTime(ro.time_generate_s, ro.time_generate_s, int(ro.gen_tokens))
        keep_p = keep_mask(ro, self.algo.filter_groups)
        if keep_p.any():
            batch = self.algo.make_batch(ro, keep_p)
            rng = jax.random.fold_in(jax.random.fold_in(self.rng, job.index), 1)
            self.state, metrics = self.algo.update_fn(self.state, batch, rng)
            jax.device_get(metrics)
        return StepTime(time.perf_counter() - t0, ro.time_generate_s, int(ro.gen_tokens))

    def close(self) -> None:
        self.source.close()


def calibrate(
    configs: dict[str, RunSpec],
    *,
    rounds: int = 3,
    steps: int = 2,
    gen_probe: tuple[int, ...] = (),
    log_fn=print,
    interleave: str = "step",
    then=None,
) -> dict[str, Any]:
    """Times one training step of each configuration, interleaved (see the module doc).

    Args:
      configs: ``"PxG:rule"`` -> the spec of one run of that configuration.
      rounds: visits per configuration (R >= 1).
      steps: timed steps per visit (their mean is the visit's value); a small batch's
        visit times more (`visit_steps`).
      gen_probe: concurrencies whose generation alone is timed in the same rotation (the
        first configuration's rollout with ``C / G`` prompts).
      log_fn: where progress lines go.
      interleave: ``"step"`` (`round_order`) or ``"visit"``: each configuration's steps
        of a round in a row, ``steps`` of each (the scheme before `visit_steps` and
        `round_order`, kept to compare the two: ``experiments.calibration_noise``).
      then: called with the record of these ``rounds`` once they are timed; it returns
        how many rounds to time next with the same compiled programs (0: none), as a
        later block (`append_block`): a calibration that waits through a sweep's runs
        (``calibrate_sweep``'s ``hold``) needs no second build and compile.

    Returns:
      The ``calibration.json`` record (its blocks joined).
    """
    if rounds < 1 or steps < 1:
        raise ValueError(f"calibration needs rounds >= 1 and steps >= 1, got {rounds}, {steps}")
    if interleave not in ("step", "visit"):
        raise ValueError(f"interleave={interleave!r}: expected 'step' or 'visit'")
    t_start = time.time()
    load_start = provenance.load_average()
    first = next(iter(configs.values())).inputs
    # (A probe is another batch of the first configuration: a config of its own, resolved.)
    probes = {
        f"gen@{c}": config_lib.resolve(probe_config(first, int(c))) for c in gen_probe
    }  # checked first
    # A scheduled configuration is timed at each P it can take, as fixed batches.
    timed = {}
    for key, spec in configs.items():
        buckets = schedule_buckets(spec)
        timed.update(
            {f"{key}#P{p}": config_lib.resolve(bucket_config(spec.inputs, p)) for p in buckets}
            if buckets
            else {key: spec}
        )
    # Configurations of equal compute (`compute_key`) are timed once: the first one's
    # steps stand for the others (their step-time ratio is 1, not timing noise).
    first_of: dict[str, str] = {}
    timed_as = {k: first_of.setdefault(compute_key(spec), k) for k, spec in timed.items()}
    keys = [k for k in timed if timed_as[k] == k] + list(probes)
    batches = {k: spec.batch for k, spec in timed.items()}
    per_visit = visit_steps(batches, steps) if interleave == "step" else {}
    per_visit.update({k: PROBE_STEPS for k in probes})
    steppers = {}
    try:
        for key in keys:  # build and compile (one untimed step each)
            steppers[key] = _Stepper(timed[key]) if key in timed else _Stepper(probes[key], True)
            steppers[key].step()
        per_visit = {k: per_visit.get(k, steps) for k in keys}

        def block(n: int, t0: float, load0: list[float]) -> dict[str, Any]:
            visits = _time_rounds(steppers, per_visit, n, interleave, log_fn)
            return _record(visits, configs, probes, gen_probe, timed_as, t0, load0, steps)

        record = block(rounds, t_start, load_start)
        more = then(record) if then is not None else 0
        if more:
            record = append_block(record, block(more, time.time(), provenance.load_average()))
        return record
    finally:
        for s in steppers.values():
            s.close()


def _time_rounds(steppers, per_visit, rounds, interleave, log_fn):
    """``rounds`` rounds of visits to every stepper (key -> its visits: a list per round
    of that round's StepTimes), each round's rotation starting one key later."""
    keys = list(steppers)
    visits: dict[str, list[list[StepTime]]] = {k: [] for k in keys}
    for r in range(rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        timed_steps: dict[str, list[StepTime]] = {k: [] for k in keys}
        if interleave == "step":
            sequence = round_order(order, per_visit)
        else:
            sequence = [k for k in order for _ in range(per_visit[k])]
        for key in sequence:
            timed_steps[key].append(steppers[key].step())
        for key in keys:
            visits[key].append(timed_steps[key])
        log_fn(f"[calibrate] round {r + 1}/{rounds} done")
    return visits


def _record(
    visits, configs, probes, gen_probe, timed_as, t_start, load_start, steps
) -> dict[str, Any]:
    """The ``calibration.json`` record of one block of rounds (``visits``: `_time_rounds`)."""
    rounds = len(next(iter(visits.values())))
    visits = {**visits, **{k: visits[rep] for k, rep in timed_as.items() if rep != k}}
    when = {
        "load_start": load_start,
        "load_end": provenance.load_average(),
        "wall_s": time.time() - t_start,
        "written_at": provenance.now(),
    }
    return {
        "version": artifacts.CALIBRATION_VERSION,
        "rounds": rounds,
        "steps": steps,
        "host": provenance.hardware(),
        **when,
        "round_blocks": [0] * rounds,
        "blocks": [{"rounds": rounds, **when}],
        "configs": {k: _config_record(k, configs[k], visits, timed_as) for k in configs},
        **(
            {
                "gen_probe": {
                    str(c): _probe_record(visits[f"gen@{c}"], probes[f"gen@{c}"], int(c))
                    for c in gen_probe
                }
            }
            if gen_probe
            else {}
        ),  # fmt: skip
    }


# Per-round lists of a configuration's (and a probe's) entry: a later block's join them.
_ROUND_LISTS = ("step_s", "steps_s", "generate_s", "gen_tokens_per_s")


def _blocks_meta(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's ``blocks`` (one made of its top-level fields when it has none)."""
    keys = ("load_start", "load_end", "wall_s", "written_at")
    return list(
        record.get("blocks") or [{"rounds": record["rounds"], **{k: record.get(k) for k in keys}}]
    )


def append_block(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """One ``calibration.json`` record of two calibrations of the same configurations and
    settings, timed apart (``first``: the block before the runs): every per-round list
    holds ``first``'s rounds then ``later``'s, the medians are the whole lists', and
    ``round_blocks`` / ``blocks`` name the block of each round (a ValueError when the two
    time different configurations or probes)."""
    if set(first["configs"]) != set(later["configs"]) or set(first.get("gen_probe", {})) != set(
        later.get("gen_probe", {})
    ):
        raise ValueError("calibration blocks of different configurations cannot be joined")
    n_first = int(first["rounds"])
    first_blocks = first.get("round_blocks") or [0] * n_first
    next_block = max(first_blocks) + 1

    def joined(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
        out = {**b, **{k: a[k] + b[k] for k in _ROUND_LISTS if k in a and k in b}}
        if "prompts_step_s" in a and "prompts_step_s" in b:
            out["prompts_step_s"] = {
                p: a["prompts_step_s"][p] + b["prompts_step_s"][p] for p in a["prompts_step_s"]
            }
        if "step_s" in out:
            out["step_s_median"] = statistics.median(out["step_s"])
        return out

    return {
        **later,
        "rounds": n_first + int(later["rounds"]),
        "load_start": first.get("load_start"),
        "wall_s": float(first.get("wall_s") or 0.0) + float(later["wall_s"]),
        "round_blocks": list(first_blocks) + [next_block] * int(later["rounds"]),
        "blocks": _blocks_meta(first) + _blocks_meta(later),
        "configs": {k: joined(first["configs"][k], v) for k, v in later["configs"].items()},
        **(
            {
                "gen_probe": {
                    c: joined(first["gen_probe"][c], v) for c, v in later["gen_probe"].items()
                }
            }
            if "gen_probe" in later
            else {}
        ),  # fmt: skip
    }


def visit_steps(batches: dict[str, int], steps: int) -> dict[str, int]:
    """Timed steps per visit of each configuration: ``steps``, times ``ceil(B_half / B)``
    for a batch B below ``B_half``, half the median batch (of ``batches``, key -> B).

    A small batch's step is short and its time varies the most (a step whose groups are
    all filtered skips its update; a burst of host load is a larger part of it): its
    visit then times as many responses as ``steps`` steps at ``B_half``, for about the
    length of the larger batches' visits, at little cost (its steps are the cheapest)."""
    if not batches:
        return {}
    half = statistics.median(batches.values()) / 2
    return {k: steps * max(1, math.ceil(half / b)) for k, b in batches.items()}


def round_order(order: list[str], counts: dict[str, int]) -> list[str]:
    """One calibration round's steps: the keys of ``order`` in turn, one step each, in
    ``max(counts)`` passes; a key with fewer steps (``counts[k]``) steps in evenly spaced
    passes. A burst of host load (seconds long on a shared machine) then falls on every
    configuration's steps alike instead of on one configuration's run of steps."""
    n_max = max(counts[k] for k in order)
    return [
        k
        for j in range(n_max)
        for k in order
        if (j + 1) * counts[k] // n_max > j * counts[k] // n_max
    ]


def _gen_tokens_per_s(visits: list[list[StepTime]]) -> list[float]:
    return [sum(t.gen_tokens for t in v) / max(sum(t.generate_s for t in v), 1e-12) for v in visits]


def engine_record(c: ConfigDict) -> dict[str, Any]:
    """The rollout engine a run config selects, as ``calibration.json`` records it:
    ``{"engine", "slots", "attn_block"}`` (``sections.rollout_settings``)."""
    sampling = sections.read(rollout_source.Sampling, c.sampling).method
    return {"engine": sampling.engine, "slots": sampling.slots, "attn_block": sampling.attn_block}


def _config_record(
    key: str,
    spec: RunSpec,
    all_visits: dict[str, list[list[StepTime]]],
    timed_as: dict[str, str],
) -> dict[str, Any]:
    """Configuration ``key``'s entry of ``calibration.json`` from its visits' step times
    (a scheduled one's: its largest P's, with each P's under ``prompts_step_s``);
    ``timed_as`` names the configuration whose steps were timed for it when not itself."""
    c = spec.inputs
    buckets = schedule_buckets(spec)
    main = f"{key}#P{buckets[-1]}" if buckets else key
    visits = all_visits[main]
    twin = timed_as.get(main, main).split("#")[0]
    step_s = [float(np.mean([t.step_s for t in v])) for v in visits]
    steps_s = [[float(t.step_s) for t in v] for v in visits]
    per_prompts = {
        str(p): [float(np.mean([t.step_s for t in v])) for v in all_visits[f"{key}#P{p}"]]
        for p in buckets
    }
    generate_s = [float(np.mean([t.generate_s for t in v])) for v in visits]
    return {
        "batch": spec.batch,
        "step_s": step_s,
        "step_s_median": statistics.median(step_s),
        "steps_s": steps_s,
        "run": c.name,
        "generate_s": generate_s,
        "gen_tokens_per_s": _gen_tokens_per_s(visits),
        "gen_concurrency": gen_concurrency(c),
        **engine_record(c),
        **({"prompts_step_s": per_prompts} if per_prompts else {}),
        **({"timed_as": twin} if twin != key else {}),
    }


def _probe_record(visits: list[list[StepTime]], spec: RunSpec, concurrency: int) -> dict[str, Any]:
    """One generation probe's entry of ``calibration.json``."""
    return {
        "gen_concurrency": concurrency,
        "generate_s": [float(np.mean([t.generate_s for t in v])) for v in visits],
        "gen_tokens_per_s": _gen_tokens_per_s(visits),
        **engine_record(spec.inputs),
    }


def engine_label(record: dict[str, Any]) -> str:
    """An entry's engine in words: ``static``, ``continuous 16 slots`` (0: ``all slots``),
    with ``blk<K>`` for blocked decode attention; ``static`` for a record without one."""
    engine = record.get("engine", "static")
    label = engine
    if engine == "continuous":
        label += f" {record.get('slots') or 'all'} slots"
    if record.get("attn_block"):
        label += f" blk{record['attn_block']}"
    return label


def sweep_configs(sweep_dir: str, grid: dict[str, Any] | None = None) -> dict[str, RunSpec]:
    """``"PxG:rule"`` -> the spec (``config.json``) of its first listed run
    (``artifacts.sweep_run_configs``), then, for configurations with none yet, ``grid``
    (``"PxG:rule"`` -> a spec as JSON: the grid's points before their runs) and the points
    timed ahead of their runs (``artifacts.read_calibration_ahead``)."""
    configs = artifacts.sweep_run_configs(sweep_dir)
    for more in (grid or {}, artifacts.read_calibration_ahead(sweep_dir)):
        configs.update({k: c for k, c in more.items() if k not in configs})
    if not configs:
        raise ValueError(f"{sweep_dir}: no run has a config.json to calibrate")
    return {k: config_lib.load_spec(c) for k, c in configs.items()}


STAGES = ("before", "after")


def calibrate_sweep(
    sweep_dir: str,
    *,
    rounds: int,
    steps: int,
    gen_probe: tuple[int, ...] = (),
    log_fn=print,
    force: bool = False,
    before: int = 0,
    stage: str = "after",
    grid: dict[str, Any] | None = None,
    hold=None,
) -> dict[str, Any]:
    """``calibrate`` each configuration of a sweep (its first run's config) and the
    generation probes; writes ``<sweep>/calibration.json`` and returns the record.

    An existing calibration.json that times every configuration with these settings is
    kept and returned (``artifacts.calibration_action``): T and q do not change when no
    configuration is new. One that is redone (or ``force``) is kept in
    ``<sweep>/calibrations/`` (``artifacts.archive_calibration``).

    Args:
      sweep_dir: the sweep directory.
      rounds, steps, gen_probe: the calibration's settings (`calibrate`).
      log_fn: where progress lines go.
      force: calibrate again even when the record serves.
      before: of ``rounds``, those timed in a block before the runs (0: all after them).
      stage: ``"before"`` the runs (their ``before`` rounds; a block already there is kept)
        or ``"after"`` them: the other rounds, joined to the block before the runs when it
        is there (`append_block`), else all ``rounds`` in one block.
      grid: ``"PxG:rule"`` -> spec JSON of configurations without a run yet (the grid's,
        before its runs).
      hold: stage ``"before"``: called once the block before the runs is written; it
        returns (when the runs have ended) whether to time the other rounds now, with the
        programs this process compiled (``rl_batch.sweeps.worker calibrate --hold``: a
        sweep on a CPU host saves the second block's build and compile). False: they are
        left to a stage ``"after"``, as without ``hold``.
    """
    if stage not in STAGES:
        raise ValueError(f"calibration stage {stage!r}: expected one of {STAGES}")
    artifacts.calibration_block_sizes(rounds, before)  # (a ValueError names a bad split)
    if stage == "before" and not before:
        raise ValueError("calibration stage 'before' needs rounds before the runs (before > 0)")
    keys = tuple(grid or ())
    action, why = artifacts.calibration_action(sweep_dir, rounds, steps, gen_probe, before, keys)
    path = os.path.join(sweep_dir, artifacts.CALIBRATION_FILE)
    if force:
        action, why = "redo", ["asked to"]
    if action == "keep" or (stage == "before" and action == "append"):
        what = "every configuration with these settings" if action == "keep" else "its block"
        log_fn(f"[calibrate] {path} kept: it times {what}")
        return artifacts.read_json(path)
    log_fn(f"[calibrate] calibrating: {'; '.join(why)}")
    configs = sweep_configs(sweep_dir, grid)
    first = artifacts.read_json(path) if action == "append" else None  # (stage "after")
    if first is not None and set(first["configs"]) <= set(configs):
        configs = {k: configs[k] for k in first["configs"]}
        later = calibrate(
            configs, rounds=rounds - before, steps=steps, gen_probe=gen_probe, log_fn=log_fn
        )
        record = append_block(first, later)
    else:

        def archive() -> None:  # (the calibration this one replaces)
            kept = artifacts.archive_calibration(sweep_dir)
            if kept:
                log_fn(f"[calibrate] the calibration it replaces is kept as {kept}")

        def written_then_held(record: dict[str, Any]) -> int:  # -> rounds to time next
            archive()
            artifacts.write_json_atomic(path, record)  # (on disk before the runs start)
            if hold is None or not hold():
                return 0
            log_fn(f"[calibrate] timing the {rounds - before} rounds after the runs")
            return rounds - before

        if stage == "before":
            record = calibrate(configs, rounds=before, steps=steps, gen_probe=gen_probe,
                               log_fn=log_fn, then=written_then_held)  # fmt: skip
        else:
            record = calibrate(configs, rounds=rounds, steps=steps, gen_probe=gen_probe,
                               log_fn=log_fn)  # fmt: skip
            archive()
    artifacts.write_json_atomic(path, record)
    return record


def describe(record: dict[str, Any]) -> str:
    """A calibration record as lines: each configuration's step times, each generation
    probe's tokens/s, and the host load around the whole measurement."""
    lines = []
    for key, v in record["configs"].items():
        spread = ", ".join(f"{s:.3f}" for s in v["step_s"])
        lines.append(
            f"{key:>12}  B={v['batch']:<5d} step {v['step_s_median']:.3f} s  [{spread}]  "
            f"engine {engine_label(v)}"
            + (f"  (timed as {v['timed_as']}: equal compute)" if "timed_as" in v else "")
        )
    for c, v in record.get("gen_probe", {}).items():
        spread = ", ".join(f"{x:.0f}" for x in v["gen_tokens_per_s"])
        lines.append(
            f"{'gen@' + c:>12}  generation alone, tokens/s [{spread}]  engine {engine_label(v)}"
        )
    lines.append(f"load {record['load_start']} -> {record['load_end']}, {record['wall_s']:.0f} s")
    return "\n".join(lines)
