"""What software and hardware produced a run: ``<run>/provenance.json``.

The file holds one record per session of the run (a fresh start, then one per resume),
since a resumed run may continue on another machine or with other packages::

    {"sessions": [{"started_at", "ended_at", "status", "load_start", "load_end",
                   "software": {...}, "git": {...}, "hardware": {...}}, ...]}

``software`` maps each package that decides the numbers (`PACKAGES`, plus ``python``)
to its installed version; ``git`` is ``{"commit", "dirty"}`` of the checkout the
project was imported from, read when this process imported it (``None`` outside a git
checkout); ``hardware`` holds the JAX device platform, kind and count, the process count,
the CPU model and core count and the host name. ``load_start`` and ``load_end`` are the
host's 1, 5 and 15 minute load averages when the session started and ended: the context
of every timing in it.

This module owns the file: `start_session` and `end_session` write it (process 0 of a
run), `read` and `describe_sweep` read it for the analysis. It also owns
``<sweep>/commands.jsonl``: one line per invocation of a sweep program (`record_command`:
its arguments, start and end time, wall seconds of its runs (the warm start included, the
analysis written after them not), host load at both ends, status), so that the wall time
of a whole study is a recorded number.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import shlex
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from rl_batch import artifacts

FILE = "provenance.json"
COMMANDS_FILE = "commands.jsonl"
PACKAGES = (
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "numpy",
    "tokenizers",
    "math-verify",
)
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def software() -> dict[str, str | None]:
    """Python's version and the installed version of each of `PACKAGES` (None: absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_state(repo: str = _REPO) -> dict[str, Any] | None:
    """``{"commit", "dirty"}`` of the checkout at ``repo`` now; None when it is not one.

    Records use `imported_git_state`: the checkout may change while a process runs.
    """

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", repo, *args], capture_output=True, text=True, timeout=30, check=True
        ).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


_IMPORTED_GIT = git_state()  # the code this process imported (not a later checkout)


def imported_git_state() -> dict[str, Any] | None:
    """`git_state` of the project's checkout when this process imported it."""
    return _IMPORTED_GIT


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else `platform.processor`)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    """The JAX devices this process sees and the host they run on."""
    import jax  # (here: the analysis reads provenance files without starting a backend)

    devices = jax.devices()
    return {
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "process_count": jax.process_count(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        # The CPUs this process may run on (a pinned sweep worker: its slice): XLA sizes
        # its CPU thread pools to them, and its float results depend on that count.
        "cpus_allowed": sorted(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "hostname": socket.gethostname(),
    }


def load_average() -> list[float] | None:
    """The host's 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read(run_dir: str) -> list[dict[str, Any]]:
    """The sessions recorded in ``<run_dir>/provenance.json`` ([] when there is none)."""
    path = os.path.join(run_dir, FILE)
    if not os.path.exists(path):
        return []
    data = artifacts.read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("sessions"), list):
        raise ValueError(f"{path}: expected an object with a 'sessions' list")
    return data["sessions"]


def start_session(run_dir: str) -> dict[str, Any]:
    """Appends a session record (software, git, hardware, start load) and returns it."""
    session = {
        "started_at": now(),
        "load_start": load_average(),
        "software": software(),
        "git": imported_git_state(),
        "hardware": hardware(),
        "ended_at": None,
        "load_end": None,
        "status": "running",
    }
    _write(run_dir, [*read(run_dir), session])
    return session


def end_session(run_dir: str, status: str) -> None:
    """Records the end time, load and status of the run's last session."""
    sessions = read(run_dir)
    if not sessions:
        return
    sessions[-1] |= {"ended_at": now(), "load_end": load_average(), "status": status}
    _write(run_dir, sessions)


def record_command(
    sweep_dir: str,
    argv: Sequence[str],
    started_at: str,
    wall_s: float,
    load_start: list[float] | None,
    status: str,
    module: str | None = None,
) -> None:
    """Appends one invocation of a sweep program (``module``: its ``python -m`` name) to
    ``<sweep_dir>/commands.jsonl``."""
    record = {
        "argv": list(argv),
        "module": module,
        "started_at": started_at,
        "ended_at": now(),
        "wall_s": round(wall_s, 1),
        "load_start": load_start,
        "load_end": load_average(),
        "status": status,
        "git": imported_git_state(),
    }
    os.makedirs(sweep_dir, exist_ok=True)
    artifacts.append_jsonl(os.path.join(sweep_dir, COMMANDS_FILE), record)


def read_commands(sweep_dir: str) -> list[dict[str, Any]]:
    """The invocations recorded in ``<sweep_dir>/commands.jsonl`` ([] when none)."""
    path = os.path.join(sweep_dir, COMMANDS_FILE)
    return list(artifacts.iter_jsonl(path)) if os.path.exists(path) else []


def describe_last_command(sweep_dir: str) -> tuple[str, str]:
    """(the last finished sweep invocation as a ``python -m`` command, its wall time,
    start and 1-minute host load at start/end), from ``commands.jsonl``."""
    done = [c for c in read_commands(sweep_dir) if c["status"] == "finished"]
    if not done:
        return "(not recorded)", "wall time not recorded"
    c = done[-1]
    argv = list(c["argv"])
    # (A record without ``module``: the program as it was started.)
    head = ["python", "-m", c["module"]] if c.get("module") else ["python", *argv[:1]]
    cmd = shlex.join([*head, *argv[1:]])
    load = "/".join(f"{x[0]:.1f}" for x in (c.get("load_start"), c.get("load_end")) if x)
    when = f"{c['wall_s'] / 60:.1f} min wall, started {c['started_at']}"
    return cmd, f"{when}; host load (1 min) at start/end {load}"


def _write(run_dir: str, sessions: list[dict[str, Any]]) -> None:
    artifacts.write_json_atomic(os.path.join(run_dir, FILE), {"sessions": sessions})


def identity(session: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a session that must agree between runs compared in one sweep.

    Flat ``"software.jax"``-style keys: package versions, the git commit and dirty flag,
    device platform, kind and count, process count, CPU model and core count. Host name
    and load are context, not identity.
    """
    out = {f"software.{k}": v for k, v in (session.get("software") or {}).items()}
    git = session.get("git") or {}
    out["git.commit"] = git.get("commit")
    out["git.dirty"] = git.get("dirty")
    hw = session.get("hardware") or {}
    for k in ("platform", "device_kind", "device_count", "process_count"):
        out[f"hardware.{k}"] = hw.get(k)
    out["hardware.cpu_model"] = hw.get("cpu_model")
    out["hardware.cpu_count"] = hw.get("cpu_count")
    return out


def describe_sweep(runs: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Markdown lines: what produced a sweep's runs, and a warning for each difference.

    Args:
      runs: run name -> its sessions (`read`).

    Returns:
      The fields every session shares, printed once; then one warning per field whose
      value differs between sessions (naming the runs of each value); then the range of
      host load averages. Runs without a provenance file are named.
    """
    missing = sorted(name for name, sessions in runs.items() if not sessions)
    values: dict[str, dict[Any, list[str]]] = {}
    loads: list[float] = []
    for name, sessions in sorted(runs.items()):
        for s in sessions:
            for key, v in identity(s).items():
                names = values.setdefault(key, {}).setdefault(_hashable(v), [])
                if name not in names:
                    names.append(name)
            loads += [x[0] for x in (s.get("load_start"), s.get("load_end")) if x]
    if not values:
        return ["No run recorded its provenance (`provenance.json`).", ""]
    common = {k: next(iter(v)) for k, v in values.items() if len(v) == 1}
    out = ["Software and hardware of every run (`provenance.json`):", ""]
    out += [f"- {k}: {_show(v)}" for k, v in common.items()]
    if loads:
        out.append(
            f"- host load average (1 min) at session starts and ends: {min(loads):.2f} to "
            f"{max(loads):.2f} (timings taken under a load above the core count are slower)"
        )
    out.append("")
    for k, v in values.items():
        if len(v) > 1:
            parts = "; ".join(f"{_show(val)} ({', '.join(names)})" for val, names in v.items())
            out.append(f"**Warning:** runs of this sweep differ in {k}: {parts}.\n")
    if missing:
        out.append(f"No provenance recorded for: {', '.join(missing)}.\n")
    return out


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def _show(v: Any) -> str:
    return "not recorded" if v is None else str(v)
