"""A run's metrics lines: ``metrics.jsonl`` and ``generations.jsonl``, kept in step with
the checkpoints (cut back to the checkpoint's step on resume, rebuilt from its copy when
damaged).
"""

from __future__ import annotations

import json
import logging
import os

from rl_batch import artifacts
from rl_batch.runs import tracking

log = logging.getLogger(__name__)


def _truncate_metrics(path: str, step: int) -> None:
    """Drops metrics written after the checkpoint at ``step`` (they will be redone)."""
    if not os.path.exists(path):
        return
    _rewrite_metrics(path, [r for r in artifacts.iter_jsonl(path) if r.get("step", 0) <= step])


def _rewrite_metrics(path: str, records: list[dict]) -> None:
    """Replaces the metrics file with ``records``, atomically."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True, default=artifacts.json_default) + "\n")
    os.replace(tmp, path)


def _metrics_damage(path: str, step: int, saved: list[dict]) -> str:
    """What is wrong with the metrics file up to ``step`` against the checkpoint's copy
    (``""`` when it holds exactly those lines)."""
    if not os.path.exists(path):
        return "missing"
    try:
        lines = [r for r in artifacts.iter_jsonl(path) if r.get("step", 0) <= step]
    except ValueError as e:  # a malformed line, named with its number
        return str(e).removeprefix(f"{path}:").strip()

    def text(records):  # (NaN != NaN: compare the JSON text)
        return [json.dumps(r, sort_keys=True) for r in records]

    lines, saved = text(lines), text(saved)
    if lines == saved:
        return ""
    if len(lines) != len(saved):
        return f"{len(lines)} lines up to step {step} where the checkpoint has {len(saved)}"
    first = next(i for i, (a, b) in enumerate(zip(lines, saved)) if a != b)
    return f"line {first + 1} differs from the checkpoint's copy"


class MetricsLog:
    """The run's metrics lines: appended to ``metrics.jsonl`` (process 0) and kept in memory.

    Every process holds the same lines: they decide when validation (a collective) runs
    and give ``summary.json`` its N*, T and q. A resumed run starts with the lines up to its
    checkpoint (process 0 may still be cutting later ones away). Process 0 also sends each
    new line to the ``tracker``'s dashboards and writes sampled validation generations to
    ``generations.jsonl`` (cut back to the checkpoint on resume, like the metrics).
    """

    def __init__(
        self,
        run_dir: str,
        is_writer: bool,
        resumed_step: int | None,
        saved: list[dict] | None = None,
        tracker: tracking.Tracker | None = None,
    ):
        """``saved``: the checkpoint's copy of the lines up to ``resumed_step`` (older
        checkpoints have none: the file is then cut back to that step and trusted)."""
        self.path = os.path.join(run_dir, artifacts.METRICS_FILE)
        self.generations_path = os.path.join(run_dir, artifacts.GENERATIONS_FILE)
        self.is_writer = is_writer
        self.tracker = tracker if is_writer else None
        self.records: list[dict] = []
        if is_writer:
            _truncate_metrics(self.generations_path, -1 if resumed_step is None else resumed_step)
        if resumed_step is not None and saved is not None:
            self.records = list(saved)
            if is_writer:
                damage = _metrics_damage(self.path, resumed_step, saved)
                if damage:
                    log.warning(
                        "%s: %s; rebuilt from checkpoint %d", self.path, damage, resumed_step
                    )
                _rewrite_metrics(self.path, saved)
        elif resumed_step is not None:
            if is_writer:
                _truncate_metrics(self.path, resumed_step)
            self.records = [r for r in artifacts.read_metrics(run_dir) if r["step"] <= resumed_step]
        elif is_writer and os.path.exists(self.path):
            os.remove(self.path)  # A fresh start: stale metrics of a crashed first step.

    def write(self, record: dict) -> None:
        self.records.append(record)
        if self.is_writer:
            artifacts.append_jsonl(self.path, record)
            if self.tracker is not None:
                self.tracker.log_record(record)

    def write_generations(self, step: int, rows: list[dict]) -> None:
        """Appends one validation's (or training rollout's) sampled generations (process 0)."""
        if not self.is_writer:
            return
        for row in rows:
            artifacts.append_jsonl(self.generations_path, row)
        if self.tracker is not None:
            self.tracker.log_generations(step, rows)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()

    @property
    def last_eval(self) -> dict | None:
        return next((r for r in reversed(self.records) if r["kind"] == "eval"), None)
