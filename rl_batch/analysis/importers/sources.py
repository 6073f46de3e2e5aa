"""Readers of other frameworks' logs: each gives a run's rows of scalars and its config.

A reader returns a `Logged`: rows (dicts of key -> float; ``"__step__"`` is the
writer's own step, ``"__wall__"`` a wall-clock time when the writer keeps one) in the
order written, the run's config (nested dict) and the file read. Each source is read
with the library made for it:

- TensorBoard event files (``events.out.tfevents.*`` from ``torch.utils.tensorboard``,
  tensorboardX or ``tf.summary``): ``tensorboard``'s ``EventAccumulator``.
- W&B offline runs (``run-<id>.wandb``): records decoded with the ``wandb`` package's
  own protobuf schema (``wandb.proto.wandb_internal_pb2.Record``; wandb >= 0.19 keeps no
  Python reader of its own, so the record framing, a LevelDB log, is walked here).
- W&B exported history: CSV (``csv``) or parquet (``pyarrow``).
- Hugging Face Trainer ``trainer_state.json`` (``log_history``; TRL's GRPOTrainer).
- verl's file logger (``VERL_FILE_LOGGER_PATH``): JSON lines ``{"step": s, "data": {...}}``
  (flat lines with a ``step`` key are read too). verl writes them with ``orjson``, which
  writes NaN and inf as ``null`` (verl/utils/tracking.py ``FileLogger``, read at
  b178a3c, 0.8.0.dev): a null is kept as NaN so that the import can refuse it by name.

A damaged file of any source (truncated, not the format its name says, a record that
does not decode) is one `ImportProblem` line naming the file (`read_source`).
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import math
import os
import struct
from typing import Any

from rl_batch.analysis.importers.keymap import NATIVE_STEP, ImportProblem

WALL = "__wall__"
SOURCES = ("tensorboard", "wandb", "wandb_history", "trainer_state", "verl_jsonl")


@dataclasses.dataclass
class Logged:
    """One run's logs as rows of scalars.

    Attributes:
      rows: key -> value per logged row, in file order (``NATIVE_STEP``, ``WALL`` extra).
      config: the run's config as the source keeps it ({} when it keeps none).
      path: the file (or directory) read, for messages.
      source: one of `SOURCES`.
      start_wall: wall-clock time the writer started (None when unknown).
    """

    rows: list[dict[str, float]]
    config: dict[str, Any]
    path: str
    source: str
    start_wall: float | None = None

    def keys(self) -> set[str]:
        """Every key some row carries."""
        return {k for r in self.rows for k in r}


def _number(v: Any) -> float | None:
    """A finite-or-not float of a scalar value; None for text, lists, booleans as such."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def _numeric_row(raw: dict[str, Any]) -> dict[str, float]:
    """The scalar entries of a logged dict (nested dicts flattened with '/').

    A ``null`` is kept as NaN, not dropped: a logger that writes NaN or inf as null
    (verl's file logger, through orjson; TRL for a metric with no valid value) logged
    the key at that step, and the import refuses a non-finite value it uses, naming it.
    """
    out: dict[str, float] = {}
    for k, v in raw.items():
        if isinstance(v, dict):
            out.update({f"{k}/{kk}": vv for kk, vv in _numeric_row(v).items()})
            continue
        if v is None:
            out[str(k)] = math.nan
            continue
        x = _number(v)
        if x is not None and not (isinstance(v, str) and v.strip() == ""):
            out[str(k)] = x
    return out


# ------------------------------------------------------------------ TensorBoard


def read_tensorboard(path: str) -> Logged:
    """Scalars of every event file under ``path`` (a file or a directory), one row per
    (event, tag), with the event's step and wall time."""
    from tensorboard.backend.event_processing import event_accumulator, tag_types
    from tensorboard.util import tensor_util

    files = (
        [path]
        if os.path.isfile(path)
        else sorted(glob.glob(os.path.join(path, "**", "events.out.tfevents.*"), recursive=True))
    )
    if not files:
        raise ImportProblem(f"{path}: no TensorBoard event file (events.out.tfevents.*)")
    rows: list[dict[str, float]] = []
    start = None
    for f in files:
        check_event_file(f)
        acc = event_accumulator.EventAccumulator(
            f, size_guidance={tag_types.SCALARS: 0, tag_types.TENSORS: 0}
        )
        acc.Reload()
        try:
            first = acc.FirstEventTimestamp()
            start = first if start is None else min(start, first)
        except ValueError:
            pass
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            for e in acc.Scalars(tag):
                rows.append({NATIVE_STEP: float(e.step), WALL: e.wall_time, tag: e.value})
        for tag in tags.get("tensors", []):  # tf.summary v2 writes scalars as tensors
            for e in acc.Tensors(tag):
                arr = tensor_util.make_ndarray(e.tensor_proto)
                if arr.size == 1 and arr.dtype.kind in "fiub":
                    rows.append(
                        {NATIVE_STEP: float(e.step), WALL: e.wall_time, tag: float(arr.item())}
                    )
    rows.sort(key=lambda r: (r[NATIVE_STEP], r[WALL]))
    return Logged(rows, {}, path, "tensorboard", start)


def check_event_file(path: str) -> None:
    """Walks an event file's records with their CRCs (TensorBoard's record reader).

    ``EventAccumulator`` stops at a truncated or corrupt record and keeps what came
    before it, without a word: a damaged file would lose its later steps silently.

    Raises:
      ImportProblem: a truncated record or a failed CRC, naming the file and record.
    """
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    reader = pywrap_tensorflow.PyRecordReader_New(path.encode(), 0, b"", None)
    n = 0
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return
        except errors.DataLossError as e:
            what = str(e.message).replace(repr(path.encode()), "").strip()  # "b'<path>' has ..."
            raise ImportProblem(
                f"{path}: damaged TensorBoard event file at record {n + 1} ({what})"
            ) from None
        n += 1


# ------------------------------------------------------------------ W&B offline

_WANDB_HEADER = b":W&B"
_WANDB_HEADER_LEN = 7  # ":W&B", 2-byte magic, 1-byte version
_BLOCK = 32768  # LevelDB log blocks
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _wandb_chunks(path: str):
    """The record payloads of a ``.wandb`` file (LevelDB log framing: 7-byte headers of
    crc32, length, type; records split over 32 KiB blocks)."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.startswith(_WANDB_HEADER):
        raise ImportProblem(f"{path}: not a W&B run file (no ':W&B' header)")
    pos, pending = _WANDB_HEADER_LEN, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer: padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        if len(chunk) < length:
            raise ImportProblem(f"{path}: truncated W&B record at byte {pos}")
        pos += 7 + length
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            yield pending + chunk
        elif kind == 0 and length == 0:
            pos += _BLOCK - pos % _BLOCK if pos % _BLOCK else 0  # zero padding
        else:
            raise ImportProblem(f"{path}: malformed W&B record at byte {pos}")
    if pos < len(data) and any(data[pos:]):
        raise ImportProblem(f"{path}: truncated W&B record at byte {pos}")


def wandb_records(path: str):
    """The records of a ``.wandb`` file as the wandb package's own protobufs
    (``wandb_internal_pb2.Record``), in file order."""
    from wandb.proto import wandb_internal_pb2 as pb

    for chunk in _wandb_chunks(path):
        yield pb.Record.FromString(chunk)


def _wandb_key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def read_wandb_offline(path: str) -> Logged:
    """History rows and config of an offline W&B run (a ``.wandb`` file or its run dir)."""
    if os.path.isdir(path):
        pattern = os.path.join(path, "**", "*.wandb")
        found = sorted({os.path.realpath(p) for p in glob.glob(pattern, recursive=True)})
        if len(found) != 1:  # (wandb's latest-run link names the same file twice)
            raise ImportProblem(f"{path}: expected one W&B .wandb file, found {len(found)}")
        path = found[0]
    rows: list[dict[str, float]] = []
    config: dict[str, Any] = {}
    start = None
    for rec in wandb_records(path):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            start = rec.run.start_time.seconds + rec.run.start_time.nanos * 1e-9 or None
            updates = rec.run.config.update
        elif kind == "config":
            updates = rec.config.update
        elif kind == "history":
            raw = {_wandb_key(i): json.loads(i.value_json) for i in rec.history.item}
            row = _numeric_row(raw)
            if "_step" in row:
                row[NATIVE_STEP] = row["_step"]
            if "_timestamp" in row:
                row[WALL] = row["_timestamp"]
            rows.append(row)
            continue
        else:
            continue
        for u in updates:
            key = _wandb_key(u)
            if key != "_wandb":
                config[key] = json.loads(u.value_json)
    return Logged(rows, _unwrap_wandb_config(config), path, "wandb", start)


def _unwrap_wandb_config(config: dict[str, Any]) -> dict[str, Any]:
    """W&B's exported ``config.yaml`` keeps ``{"key": {"value": v}}``; plain elsewhere."""
    if config and all(isinstance(v, dict) and set(v) <= {"value", "desc"} for v in config.values()):
        return {k: v.get("value") for k, v in config.items()}
    return config


def read_wandb_history(path: str) -> Logged:
    """An exported W&B history table: CSV (a header of keys) or parquet."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        raw_rows = pq.read_table(path).to_pylist()
    else:
        with open(path, newline="") as f:
            raw_rows = list(csv.DictReader(f))
    rows = []
    for raw in raw_rows:
        row = {
            k: x
            for k, x in ((k, _number(v)) for k, v in raw.items() if v not in ("", None))
            if x is not None and not math.isnan(x)
        }
        if "_step" in row:
            row[NATIVE_STEP] = row["_step"]
        if "_timestamp" in row:
            row[WALL] = row["_timestamp"]
        rows.append(row)
    return Logged(rows, {}, path, "wandb_history")


# ------------------------------------------------------------------ HF Trainer / TRL


def _checkpoint_number(name: str) -> int:
    """N of ``checkpoint-N`` (-1 for another name)."""
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1


def read_trainer_state(path: str) -> Logged:
    """``trainer_state.json``'s ``log_history`` (one row per logged dict; its ``step`` is
    the optimizer step). A directory: its own file, else its last ``checkpoint-*``'s."""
    if os.path.isdir(path):
        top = os.path.join(path, "trainer_state.json")
        found = sorted(
            glob.glob(os.path.join(path, "checkpoint-*", "trainer_state.json")),
            key=lambda p: _checkpoint_number(os.path.basename(os.path.dirname(p))),
        )
        path = top if os.path.exists(top) else (found[-1] if found else top)
    if not os.path.exists(path):
        raise ImportProblem(f"{path}: no trainer_state.json")
    with open(path) as f:
        try:
            state = json.load(f)
        except json.JSONDecodeError as e:
            raise ImportProblem(f"{path}: malformed JSON: {e}") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise ImportProblem(f"{path}: no 'log_history' list")
    rows = []
    for i, raw in enumerate(history):
        if not isinstance(raw, dict):
            raise ImportProblem(f"{path}: log_history[{i}] is not a JSON object")
        row = _numeric_row(raw)
        if "step" in row:
            row[NATIVE_STEP] = row["step"]
        rows.append(row)
    return Logged(rows, {}, path, "trainer_state")


# ------------------------------------------------------------------ verl


def read_verl_jsonl(path: str) -> Logged:
    """verl's file-logger JSON lines (``{"step": s, "data": {...}}``, or flat lines)."""
    rows = []
    with open(path) as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as e:
                raise ImportProblem(f"{path}:{i}: malformed JSON line: {e}") from None
            if not isinstance(raw, dict):
                raise ImportProblem(f"{path}:{i}: expected a JSON object")
            data = raw.get("data") if isinstance(raw.get("data"), dict) else raw
            row = _numeric_row(data)
            step = _number(raw.get("step"))
            if step is not None:
                row[NATIVE_STEP] = step
            rows.append(row)
    return Logged(rows, {}, path, "verl_jsonl")


# ------------------------------------------------------------------ detection

READERS = {
    "tensorboard": read_tensorboard,
    "wandb": read_wandb_offline,
    "wandb_history": read_wandb_history,
    "trainer_state": read_trainer_state,
    "verl_jsonl": read_verl_jsonl,
}


def detect_source(path: str) -> str:
    """Which reader a run path needs, from its file names.

    Raises:
      ImportProblem: nothing readable there.
    """
    name = os.path.basename(path)
    if os.path.isfile(path):
        if name.startswith("events.out.tfevents."):
            return "tensorboard"
        if name.endswith(".wandb"):
            return "wandb"
        if name.endswith((".csv", ".parquet")):
            return "wandb_history"
        if name == "trainer_state.json":
            return "trainer_state"
        if name.endswith((".jsonl", ".json")):
            return "verl_jsonl"
        raise ImportProblem(f"{path}: not a log file this importer reads")
    if not os.path.isdir(path):
        raise ImportProblem(f"{path}: no such file or directory")

    def has(pattern: str) -> bool:
        return bool(glob.glob(os.path.join(path, "**", pattern), recursive=True))

    for pattern, source in (
        ("trainer_state.json", "trainer_state"),
        ("*.wandb", "wandb"),
        ("events.out.tfevents.*", "tensorboard"),
    ):
        if has(pattern):
            return source
    raise ImportProblem(
        f"{path}: no trainer_state.json, .wandb file or TensorBoard event file; name the "
        "log file itself for JSON lines, CSV or parquet"
    )


def read_source(path: str, source: str | None = None) -> Logged:
    """`Logged` of a run path, its reader chosen by `detect_source` unless given."""
    source = source or detect_source(path)
    if source not in READERS:
        raise ImportProblem(f"source {source!r}: expected one of {SOURCES}")
    try:
        return READERS[source](path)
    except ImportProblem:
        raise
    except _damaged_input_errors() as e:
        text = " ".join(str(e).split())[:200] or type(e).__name__
        raise ImportProblem(
            f"{path}: damaged or unreadable {source} input ({type(e).__name__}: {text})"
        ) from None


def _damaged_input_errors() -> tuple[type[BaseException], ...]:
    """What the readers' libraries raise on a damaged file (a truncated or corrupt
    record, a file that is not what its name says): each is one line, not a traceback."""
    types: list[type[BaseException]] = [
        ValueError,  # JSON, CSV values, pyarrow's ArrowInvalid
        OSError,
        UnicodeDecodeError,
        struct.error,
        csv.Error,
        KeyError,
        IndexError,
        TypeError,  # a record of another shape than the schema's
    ]
    try:
        from google.protobuf.message import DecodeError

        types.append(DecodeError)
    except ImportError:
        pass
    try:
        import pyarrow

        types.append(pyarrow.ArrowException)
    except ImportError:
        pass
    return tuple(types)
