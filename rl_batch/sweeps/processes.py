"""The processes of a sweep: which process writes, the children that run points, and
the protocol between them (kept apart from the grid, ``rl_batch.sweeps.sweep``).

- `join_processes`: this process's place in a multi-process sweep (`Processes`), joined
  before any JAX call; with ``--isolate`` counted by a short-lived child
  (`child_local_device_count`) so that this process never holds the accelerators.
- `run_child`: a child whose output goes to a log, that dies with this process and
  gets the SIGTERM this one receives; `HeldChild`: one that waits through the runs.
- `run_point_process`: one point in a child (``rl_batch.sweeps.worker run``), or in a
  `Worker` (``rl_batch.sweeps.worker serve``) that runs points one after another; the
  other end of the worker protocol is `serve_points`. `Workers`: one per pool thread.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Sequence

import jax
from ml_collections import ConfigDict

from rl_batch import artifacts, distributed, locks
from rl_batch.runs import config as config_lib
from rl_batch.runs.spec import RunSpec

# The processes a sweep starts (its points, their workers, calibration, the memory check).
WORKER = (sys.executable, "-m", "rl_batch.sweeps.worker")


@dataclasses.dataclass(frozen=True)
class Processes:
    """This process's place in a (possibly multi-process) sweep; see ``join_processes``."""

    writer: bool  # whether this process writes the sweep's files and prints progress
    # Devices of each run, for ``plan``: None (count them with jax.device_count()) when
    # the points run in this process; counted by a child process with ``isolate``.
    device_count: int | None
    process_id: int = 0  # this process's index (0 where unknown)


def join_processes(base: ConfigDict, *, isolate: bool = False) -> Processes:
    """Joins a multi-process sweep before any JAX call; says which process writes.

    Settings come from ``base.distributed`` or the ``RL_BATCH_*`` environment (see
    ``rl_batch.distributed``); a single process needs nothing. Points run in this
    process (the default) join ``jax.distributed`` here, since ``plan`` counts the
    devices, which starts the backend, and ``jax.distributed.initialize`` must come
    first; ``run.run``'s own call then does nothing. With ``isolate``, this process
    only starts each point's worker children (``rl_batch.sweeps.worker``), which inherit the
    environment and join the run themselves: this one must not (it would hold the
    coordinator's port), so its index and the process count come from the settings,
    and nor may it start JAX's backend (it would hold the accelerators its children
    need for the whole sweep): the device count comes from a short-lived child process
    (``child_local_device_count``).

    Args:
      base: the sweep config.
      isolate: the points run in child processes.

    Returns:
      Whether this process writes (process 0), its index, and the device count for
      ``plan``.

    Raises:
      ValueError: for incomplete multi-process settings.
    """
    if not isolate:
        distributed.maybe_initialize(base)
        index = jax.process_index()  # (right only once jax.distributed has joined)
        return Processes(writer=index == 0, device_count=None, process_id=index)
    launched = distributed.launch_settings(base)
    if launched is None:
        logging.warning(
            "RL_BATCH_DISTRIBUTED=auto but no cluster detected: this process cannot tell "
            "whether it is process 0, so it writes the sweep's files"
        )
        launched = (1, 0)
    num_processes, process_id = launched
    # The children's mesh spans every process's devices (the same number on each host).
    # Counted in a short-lived process: starting JAX's backend here would hold the
    # accelerators (a TPU's chips, most of each GPU's memory) for the whole sweep.
    return Processes(
        writer=process_id == 0,
        device_count=child_local_device_count() * num_processes,
        process_id=process_id,
    )


_PROBE = "import jax; print(jax.local_device_count())"
_PROBE_TIMEOUT_S = 600  # a TPU's or a cluster's backend can take minutes to start


def child_local_device_count() -> int:
    """The local device count a child process of this one sees, counted without
    starting JAX's backend here.

    For the parent of ``--isolate`` children, which must leave the accelerators to
    them: a ``python -c`` child with this process's environment starts JAX, counts its
    local devices and exits, releasing them. (Its GPU memory is not preallocated.)

    Raises:
      RuntimeError: when the counting process fails (with its output), as the runs'
        processes would.
    """
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=_PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(
            f"counting the devices of the sweep's runs ({sys.executable} -c {_PROBE!r}) "
            f"did not finish in {_PROBE_TIMEOUT_S}s"
        ) from e
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].strip().isdigit():
        raise RuntimeError(
            f"counting the devices of the sweep's runs ({sys.executable} -c {_PROBE!r}) "
            f"failed with exit {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return int(lines[-1])


# The children this process runs now (run_child's and the workers'), so that an
# interrupted sweep can stop them all (`terminate_children`).
_LIVE: set[subprocess.Popen] = set()
_LIVE_LOCK = threading.Lock()
# Set by `terminate_children` (cleared when a sweep starts): a child that ends now was
# stopped, not failed.
stopping = threading.Event()


def _track(proc: subprocess.Popen | None, live: bool = True) -> None:
    if proc is not None:
        with _LIVE_LOCK:
            (_LIVE.add if live else _LIVE.discard)(proc)


def terminate_children() -> None:
    """Sends SIGTERM to every live child: each stops its run as on Ctrl-C (the run
    records "interrupted"; ``--resume`` or a rerun continues it)."""
    stopping.set()
    with _LIVE_LOCK:
        live = [p for p in _LIVE if p.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGTERM)


def run_child(cmd: list[str], log_path: str) -> int:
    """Runs ``cmd`` with its output appended to ``log_path``; returns its exit status.

    The child gets SIGTERM if this process dies (even by SIGKILL) when it calls
    `locks.die_with_parent` (``rl_batch.sweeps.worker`` does), and a SIGTERM sent to this
    process is passed on to it (this process then waits for it and exits 143), so the
    child is never left training a run that a rerun would start a second time.
    """
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_child_env())
    return _wait(proc, proc.wait)


def _child_env() -> dict[str, str]:
    return {**os.environ, locks.PARENT_PID_ENV: str(os.getpid())}


def _wait(proc: subprocess.Popen, wait, done: bool = True):
    """``wait()`` (``proc.wait`` or a read from it) with a SIGTERM to this process passed on
    to ``proc`` (this process then exits 143 once ``wait`` returns); ``proc`` is stopped if
    ``wait`` raises, and also when it returns unless it is not ``done``."""
    _track(proc)
    forward = threading.current_thread() is threading.main_thread()
    terminated = []
    if forward:
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):  # (no wait here: the main thread is in one)
            terminated.append(signum)
            proc.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGTERM, on_term)
    ok = False
    try:
        result = wait()
        if terminated:
            raise SystemExit(128 + terminated[0])
        ok = True
        return result
    finally:
        if forward:
            signal.signal(signal.SIGTERM, previous)
        if not ok or done:
            if proc.poll() is None:  # (an exception here: the child must not outlive it)
                proc.terminate()
                proc.wait()
            _track(proc, live=False)


class HeldChild:
    """A child (``rl_batch.sweeps.worker calibrate --hold``) that does a first part, says
    ``held`` on its stdout and waits through the sweep's runs for a line on its stdin
    (`release`), keeping what it built (its compiled programs). Started with `start`,
    which returns the exit status instead when the child ends without holding. Its
    output goes to a log; it dies with this process and gets the SIGTERM this one gets
    (`run_child`)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    @classmethod
    def start(cls, cmd: list[str], log_path: str) -> HeldChild | int:
        """Runs ``cmd`` until it holds (a HeldChild) or ends (its exit status)."""
        with open(log_path, "a") as log:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                env=_child_env(), text=True,
            )  # fmt: skip

            def until_held() -> bool:  # (other lines on its stdout go to the log)
                for line in proc.stdout:
                    if line.strip() == "held":
                        return True
                    log.write(line)
                    log.flush()
                return False

            if _wait(proc, until_held, done=False):
                return cls(proc)
        proc.stdout.close()
        return _wait(proc, proc.wait)

    def release(self, go: bool) -> int:
        """``go``: the child does its second part (``after``); else it ends. Returns its
        exit status."""
        proc = self.proc
        try:
            if go:
                proc.stdin.write("after\n")
                proc.stdin.flush()
            proc.stdin.close()
        except BrokenPipeError:  # (it has died: its status says how)
            pass
        proc.stdout.close()
        return _wait(proc, proc.wait)


def run_point_process(spec: RunSpec, log_path: str, worker: Worker | None = None) -> None:
    """Runs one point in a child process (``rl_batch.sweeps.worker run``) from its spec
    as JSON (in ``worker``, a process that runs points one after another, when one is
    given)."""
    cfg_path = os.path.join(spec.inputs.run_dir, "requested_config.json")
    artifacts.write_json_atomic(cfg_path, spec.to_json())
    if worker is not None:
        worker.run(cfg_path, log_path)
        return
    cmd = [*WORKER, "run", cfg_path]
    returncode = run_child(cmd, log_path)
    if returncode != 0:
        raise RuntimeError(f"subprocess exited with {returncode}; see {log_path}")


class Worker:
    """A child process (``rl_batch.sweeps.worker serve``) that runs points one at a time.

    A sweep's concurrent points each used to start a process of their own; on a 2-core
    CPU the import and the first-call compiles were a fifth of a short run's wall time.
    A worker keeps both across the points it runs, and with ``keep_programs`` > 0 the
    compiled programs of its last configurations (``rl_batch.runs.programs``). The protocol
    (`serve_points` is the other end): one JSON line ``{"config_json": path, "log":
    path, "keep_programs": n}`` per point on the child's stdin; one JSON line ``{"ok":
    bool, "error": str}`` back on its stdout once the point has ended. The point's own
    output (progress bar, warnings, a traceback) is appended to its log, as a child of
    its own would write it. A child that dies takes only its current point with it
    (recorded as failed, as before); the next point starts a new child. ``stderr_path``
    receives what the child prints between points.
    """

    def __init__(
        self, stderr_path: str, keep_programs: int = 0, cpus: frozenset[int] | None = None
    ):
        self.stderr_path, self.keep_programs, self.cpus = stderr_path, keep_programs, cpus
        self.proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        env = {**os.environ, locks.PARENT_PID_ENV: str(os.getpid())}
        cpus = self.cpus
        with open(self.stderr_path, "a") as err:
            return subprocess.Popen(
                [*WORKER, "serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                text=True,
                # Before the child imports jax: XLA sizes its thread pools to these CPUs.
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )

    def run(self, cfg_path: str, log_path: str) -> None:
        """Runs one point; raises RuntimeError (naming ``log_path``) if it failed."""
        if self.proc is None or self.proc.poll() is not None:
            _track(self.proc, live=False)
            self.proc = self._start()
            _track(self.proc)
        try:
            request = {
                "config_json": cfg_path,
                "log": log_path,
                "keep_programs": self.keep_programs,
            }
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        except BrokenPipeError:
            reply = ""
        if not reply:  # the child died in the point
            code = self.proc.wait()
            self.proc = None
            raise RuntimeError(f"worker process exited with {code}; see {log_path}")
        answer = json.loads(reply)
        if not answer["ok"]:
            raise RuntimeError(f"{answer['error']}; see {log_path}")

    def close(self) -> None:
        """Ends the child (end of input: it exits after its current point)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()
        _track(self.proc, live=False)
        self.proc = None


def serve_points(requests, replies) -> None:
    """The child side of `Worker`: runs each requested point in this process.

    Args:
      requests: lines of ``{"config_json": path, "log": path, "keep_programs": n}`` (a
        text stream; ``keep_programs``: ``rl_batch.runs.programs.keep``, 0 when absent).
      replies: where each point's ``{"ok", "error"}`` line goes (a text stream that is
        not this process's stdout: fds 1 and 2 are the point's log while it runs).
    """
    from rl_batch.runs import programs  # Imported late: jax reads XLA_FLAGS at import.
    from rl_batch.runs import run as run_lib

    for line in requests:
        request = json.loads(line)
        saved = [os.dup(1), os.dup(2)]
        with open(request["log"], "a") as log_file:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(log_file.fileno(), 1)
            os.dup2(log_file.fileno(), 2)
            ok, error, stop = True, "", False
            try:
                spec = config_lib.load_spec(artifacts.read_json(request["config_json"]))
                programs.keep(request.get("keep_programs", 0))
                summary = run_lib.run(spec, resume=True, progress=True)
                print(f"{summary['status']}: N*={summary['n_star']} q={summary['q']}")
            except KeyboardInterrupt as e:  # a SIGTERM: the run recorded "interrupted"
                ok, error, stop = False, f"interrupted ({e})", True
            except Exception as e:  # noqa: BLE001 (the parent records it; the next point runs)
                traceback.print_exc()
                ok, error = False, f"{type(e).__name__}: {e}"
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
        replies.write(json.dumps({"ok": ok, "error": error}) + "\n")
        replies.flush()
        if stop:
            return


def cpu_slices(count: int, cpus: Sequence[int] | None = None) -> list[frozenset[int]] | None:
    """``count`` disjoint, equal slices of ``cpus`` (default: the CPUs this process may run
    on), one per concurrent worker; None where there are fewer CPUs than workers or the
    OS cannot pin (then the workers share every CPU).

    Pinned, each worker's XLA sizes its thread pools to its own slice: two workers on 2
    cores no longer run 2 + 2 compute threads that preempt each other
    (``docs/cpu_study.md``, the measurement).
    """
    if cpus is None:
        if not hasattr(os, "sched_getaffinity"):
            return None
        cpus = sorted(os.sched_getaffinity(0))
    size = len(cpus) // count if count > 0 else 0
    if count < 2 or size < 1:
        return None
    return [frozenset(cpus[i * size : (i + 1) * size]) for i in range(count)]


class Workers:
    """One `Worker` per thread of a sweep's pool (None for every thread when disabled),
    the i-th worker started pinned to ``cpu_slices[i]`` when given."""

    def __init__(
        self,
        stderr_path: str,
        enabled: bool,
        keep_programs: int = 0,
        cpu_slices: Sequence[frozenset[int]] | None = None,
    ):
        self.stderr_path, self.enabled, self.keep_programs = stderr_path, enabled, keep_programs
        self.cpu_slices = list(cpu_slices or [])
        self._local, self._all, self._lock = threading.local(), [], threading.Lock()

    def mine(self) -> Worker | None:
        """This thread's worker. The main thread (it runs points only in a sweep of one
        point, or of one point at a time) has none unless the workers are pinned (then
        one on the first slice, so that every point of the sweep computes with the same
        thread count: XLA's CPU results depend on it in their last bits)."""
        main = threading.current_thread() is threading.main_thread()
        if not self.enabled or (main and not self.cpu_slices):
            return None
        if getattr(self._local, "worker", None) is None:
            with self._lock:
                i = len(self._all)
                cpus = self.cpu_slices[i] if i < len(self.cpu_slices) else None
                self._local.worker = Worker(self.stderr_path, self.keep_programs, cpus)
                self._all.append(self._local.worker)
        return self._local.worker

    def close(self) -> None:
        """Ends every worker started so far (a later `mine` starts new ones)."""
        with self._lock:
            started, self._all = self._all, []
        for w in started:
            w.close()
