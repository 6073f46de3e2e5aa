"""Experiment tracking: a run's metrics lines and sampled generations sent to dashboards.

``metrics.jsonl`` (``rl_batch.runs.metrics_log.MetricsLog``) stays the source of truth: every line
written there is also handed, once and in order, to the backends that ``config.tracking``
names (a comma list), with the line's ``step``:

- ``jsonl``: nothing more (metrics.jsonl is always written); the default.
- ``tensorboard``: event files in ``<run_dir>/tensorboard`` (``tensorboardX``, no
  TensorFlow), one scalar ``<kind>/<key>`` per number of a line (`scalars`: an eval
  line's ``eval_accuracy`` is ``eval/accuracy``) at the line's step, generations as text,
  the resolved config as text (``config``, once); and the same scalars at the line's
  cumulative retained responses (``responses_cum``) in ``<run_dir>/tensorboard/responses``
  (TensorBoard shows it as a run of its own, ``.../tensorboard/responses``): curves of
  different batch sizes compare on responses, not on steps. A sweep's runs are
  ``<sweep_dir>/runs/<name>``: ``tensorboard --logdir=<sweep_dir>`` shows them side by
  side (as ``runs/<name>/tensorboard``).
- ``wandb``: a Weights & Biases run in ``<run_dir>/wandb``, offline unless
  ``$WANDB_MODE`` says otherwise, its id kept in ``<run_dir>/wandb_id`` so that a resumed
  run continues the same W&B run; the resolved config as the run's config, the sweep's
  name as its group (`sweep_name`); generations as a table. Each row also carries
  ``responses`` (the line's ``responses_cum``), declared with ``define_metric`` as the
  x-axis of every chart (the step stays selectable).

A backend named but not installed is a one-line error of ``config.resolve`` (before any
compute). On resume, the lines up to the checkpoint are not sent again; the lines after
it are redone, so they are sent again at the same steps: TensorBoard is told to purge
the earlier copies (``purge_step``), W&B may hold both copies of those steps (harmless:
metrics.jsonl holds the redone lines only). A backend that fails while the run trains
is dropped with a warning; the run goes on (metrics.jsonl has every line).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from rl_batch import artifacts

log = logging.getLogger(__name__)

TENSORBOARD_DIR = "tensorboard"
WANDB_DIR = "wandb"
WANDB_ID_FILE = "wandb_id"


class Backend(Protocol):
    """A dashboard: receives the numbers of each metrics line (with its cumulative
    retained responses, None when the line has none) and the generations."""

    def log_metrics(
        self, step: int, metrics: Mapping[str, float], responses: int | None = None
    ) -> None: ...

    def log_generations(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None: ...

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a backend is built from.

    Attributes:
      run_dir: the run directory (backends write under it).
      name: the run's name (``config.name``, else the directory's).
      config: the resolved config as a dict (W&B records it).
      resumed_step: the checkpoint step the run resumed from, None for a fresh start.
    """

    run_dir: str
    name: str
    config: Mapping[str, Any]
    resumed_step: int | None = None


def sweep_name(run_dir: str) -> str | None:
    """The sweep a run belongs to: ``<sweep_dir>``'s name when ``run_dir`` is
    ``<sweep_dir>/runs/<name>`` of a sweep (``rl_batch.sweeps.sweep`` wrote ``sweep.json`` there,
    or ``sweep_point.json`` in the run of an ``--only`` job); None for a lone run."""
    run_dir = os.path.abspath(run_dir)
    runs = os.path.dirname(run_dir)
    sweep_dir = os.path.dirname(runs)
    if os.path.basename(runs) != artifacts.RUNS_DIR:
        return None
    if not (
        os.path.exists(os.path.join(sweep_dir, artifacts.SWEEP_FILE))
        or os.path.exists(os.path.join(run_dir, "sweep_point.json"))
    ):
        return None
    return os.path.basename(sweep_dir)


def config_markdown(config: Mapping[str, Any]) -> str:
    """The resolved config as text: indented JSON in a markdown code block."""
    text = json.dumps(config, indent=2, sort_keys=True, default=str)
    return "```json\n" + text + "\n```"


RESPONSES_KEY = "responses"  # W&B's responses axis; the TensorBoard responses logdir


def scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a metrics line as ``{"<kind>/<key>": value}`` (``step``, ``kind``
    and non-numeric values such as ``eval_metric`` left out; booleans as 0/1). A key that
    already starts with ``<kind>_`` loses that prefix: ``eval/accuracy``, not
    ``eval/eval_accuracy``."""
    kind = record.get("kind", "metrics")
    out = {}
    for key, value in record.items():
        if key in ("step", "kind") or isinstance(value, str) or value is None:
            continue
        if isinstance(value, (bool, int, float)) or (
            hasattr(value, "item") and getattr(value, "size", 2) == 1
        ):
            name = key[len(kind) + 1 :] if key.startswith(f"{kind}_") else key
            out[f"{kind}/{name}"] = float(value)
    return out


def responses_of(record: Mapping[str, Any]) -> int | None:
    """A metrics line's cumulative retained responses (None when it carries none)."""
    value = record.get("responses_cum")
    return None if value is None or isinstance(value, str) else int(value)


def generations_key(rows: Sequence[Mapping[str, Any]]) -> str:
    """The dashboard name of a batch of generations: ``generations`` for a validation's,
    ``train_generations`` for a training rollout's (``config.log_generations_every``)."""
    return "train_generations" if rows and rows[0].get("source") == "train" else "generations"


def _table(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """(columns, one row per response): prompt, response, reward and, when the rows
    carry them, the response length in tokens."""
    lengths = all("lengths" in row for row in rows)
    columns = ["prompt", "response", "reward"] + (["length"] if lengths else [])
    data = [
        [row["prompt"], response, reward] + ([row["lengths"][i]] if lengths else [])
        for row in rows
        for i, (response, reward) in enumerate(zip(row["responses"], row["rewards"]))
    ]
    return columns, data


def generations_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table of sampled generations (one row per response)."""

    def cell(x: Any) -> str:
        text = f"{x:g}" if isinstance(x, float) else str(x)
        return text.replace("|", "\\|").replace("\n", "<br>")

    columns, data = _table(rows)
    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell(x) for x in line) + " |" for line in data]
    return "\n".join(lines)


class TensorBoard:
    """Event files in ``<run_dir>/tensorboard`` (tensorboardX's writer)."""

    def __init__(self, info: RunInfo):
        from tensorboardX import SummaryWriter

        # purge_step: TensorBoard hides what an earlier session wrote at or after the
        # first step this one redoes (the steps after the checkpoint).
        purge = None if info.resumed_step is None else info.resumed_step + 1
        self.writer = SummaryWriter(
            logdir=os.path.join(info.run_dir, TENSORBOARD_DIR), purge_step=purge
        )
        self._make_writer = SummaryWriter
        self._responses_dir = os.path.join(info.run_dir, TENSORBOARD_DIR, RESPONSES_KEY)
        self._resumed = info.resumed_step is not None
        self.by_responses = None  # the responses-stepped writer, opened at the first line
        if info.resumed_step is None:  # the resolved config, once (a resumed run keeps it)
            self.writer.add_text("config", config_markdown(info.config), global_step=0)
            self.writer.flush()

    def _responses_writer(self, responses: int) -> Any:
        """The writer of the responses-stepped scalars. A resumed run's first line is the
        first one redone, so the earlier copies from its responses on are purged (the
        step writer's ``purge_step`` would count steps, not responses)."""
        if self.by_responses is None:
            purge = responses if self._resumed else None
            self.by_responses = self._make_writer(logdir=self._responses_dir, purge_step=purge)
        return self.by_responses

    def log_metrics(
        self, step: int, metrics: Mapping[str, float], responses: int | None = None
    ) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()  # a crash loses no line (flush_secs would wait 2 minutes)
        if responses is not None:
            writer = self._responses_writer(responses)
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, global_step=responses)
            writer.flush()

    def log_generations(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        tag = generations_key(rows)
        self.writer.add_text(tag, generations_markdown(rows), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        if self.by_responses is not None:
            self.by_responses.close()


class WandB:
    """A Weights & Biases run in ``<run_dir>/wandb``, offline unless ``$WANDB_MODE`` is set."""

    def __init__(self, info: RunInfo):
        import wandb

        self.wandb = wandb
        id_file = os.path.join(info.run_dir, WANDB_ID_FILE)
        if os.path.exists(id_file):  # a resumed run continues its W&B run
            with open(id_file) as f:
                run_id = f.read().strip()
        else:
            run_id = uuid.uuid4().hex[:16]
            with open(id_file, "w") as f:
                f.write(run_id + "\n")
        os.makedirs(os.path.join(info.run_dir, WANDB_DIR), exist_ok=True)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rl_batch"),
            name=info.name,
            id=run_id,
            resume="allow",
            dir=os.path.join(info.run_dir, WANDB_DIR),
            config=dict(info.config),
            group=sweep_name(info.run_dir),  # a sweep's runs side by side
            mode=os.environ.get("WANDB_MODE", "offline"),
        )
        # Every chart's default x-axis: cumulative retained responses (curves of
        # different batch sizes compare on it); the step stays selectable.
        self.run.define_metric(RESPONSES_KEY)
        self.run.define_metric("*", step_metric=RESPONSES_KEY)

    def log_metrics(
        self, step: int, metrics: Mapping[str, float], responses: int | None = None
    ) -> None:
        row = dict(metrics) if responses is None else {**metrics, RESPONSES_KEY: responses}
        self.run.log(row, step=step)

    def log_generations(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        columns, data = _table(rows)
        table = self.wandb.Table(columns=columns, data=data)
        self.run.log({generations_key(rows): table}, step=step)

    def close(self) -> None:
        self.run.finish()


# name -> (the package it needs, or None; the backend's constructor, or None for jsonl).
BACKENDS: dict[str, tuple[str | None, Callable[[RunInfo], Backend] | None]] = {
    "jsonl": (None, None),
    "tensorboard": ("tensorboardX", TensorBoard),
    "wandb": ("wandb", WandB),
}


def backend_names(spec: Any) -> list[str]:
    """The backends of a ``config.tracking`` value: comma-separated, each once, in order."""
    names = [n.strip() for n in str(spec).split(",")]
    return list(dict.fromkeys(n for n in names if n))


def config_errors(spec: Any) -> list[str]:
    """One message per problem of a ``config.tracking`` value: not a string, an unknown
    backend, or a backend whose package is not installed."""
    if not isinstance(spec, str):
        return [f"tracking={spec!r}: expected a comma list of {', '.join(BACKENDS)}"]
    errors = []
    for name in backend_names(spec):
        if name not in BACKENDS:
            errors.append(
                f"tracking={spec!r}: unknown backend {name!r}; known: {', '.join(BACKENDS)}"
            )
            continue
        package = BACKENDS[name][0]
        if package is not None and not _installed(package):
            errors.append(
                f"tracking={spec!r}: backend {name!r} needs the package {package}, which is "
                f"not installed (pip install {package})"
            )
    return errors


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported (without importing it)."""
    if package in sys.modules:
        return True
    return importlib.util.find_spec(package) is not None


class Tracker:
    """Sends metrics lines and generations to its backends; a backend that fails is
    dropped (with a warning) and the run goes on."""

    def __init__(self, backends: Mapping[str, Backend]):
        self.backends = dict(backends)

    def _each(self, call: Callable[[Backend], None]) -> None:
        for name, backend in list(self.backends.items()):
            try:
                call(backend)
            except Exception as e:  # a dashboard never stops the run
                log.warning(
                    "tracking backend %r failed (%s: %s); dropped", name, type(e).__name__, e
                )
                del self.backends[name]

    def log_record(self, record: Mapping[str, Any]) -> None:
        """Sends one metrics line's numbers at its ``step``."""
        if self.backends:
            step, metrics, responses = int(record["step"]), scalars(record), responses_of(record)
            self._each(lambda b: b.log_metrics(step, metrics, responses))

    def log_generations(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Sends one validation's (or training rollout's) sampled generations."""
        if self.backends and rows:
            self._each(lambda b: b.log_generations(step, rows))

    def close(self) -> None:
        self._each(lambda b: b.close())
        self.backends = {}


def make_tracker(spec: Any, info: RunInfo) -> Tracker:
    """The tracker of ``config.tracking`` (no backend for ``jsonl``).

    Raises:
      ValueError: an unknown backend or a missing package (``config_errors``).
    """
    errors = config_errors(spec)
    if errors:
        raise ValueError("; ".join(errors))
    backends = {}
    for name in backend_names(spec):
        make = BACKENDS[name][1]
        if make is not None:
            backends[name] = make(info)
    return Tracker(backends)
