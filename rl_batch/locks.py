"""One writer per run or sweep directory, and children that die with their parent.

`DirectoryLock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<dir>/.lock`` and writes the
holder (host, pid, start time, what it is doing) into it. The OS drops the lock when the
holder dies, however it dies (SIGKILL included), so a crashed run never leaves a stale
lock to clean up; a second writer stops at once with a `DirectoryLocked` error that names
the holder. ``flock`` is advisory and per host: two hosts writing one directory on a
network file system are not guarded against (a sweep's points run in different
directories; process 0 is the only writer of a multi-process run).

`die_with_parent` makes a child process (a sweep point run with ``--isolate``) receive
SIGTERM when the parent named in ``RL_BATCH_PARENT_PID`` dies, however it dies.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from collections.abc import Iterator

LOCK_FILE = ".lock"
PARENT_PID_ENV = "RL_BATCH_PARENT_PID"


@contextlib.contextmanager
def held(path: str) -> Iterator[None]:
    """Waits for, then holds, an exclusive ``flock`` on the file ``path`` (created, with
    its directory): processes that build one shared cache (a task's data, a warm start)
    take turns, and the later ones find it built."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class DirectoryLocked(RuntimeError):
    """Another process holds the directory's lock."""


class DirectoryLock:
    """An exclusive lock on a directory (a context manager; `release` to give it up).

    Args:
      directory: the directory (created if missing).
      what: what the holder is doing, shown to a second writer (e.g. ``"run"``).
    """

    def __init__(self, directory: str, what: str):
        self.directory = os.path.abspath(directory)
        self.what = what
        self.path = os.path.join(self.directory, LOCK_FILE)
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        """Takes the lock, or raises `DirectoryLocked` naming the holder."""
        os.makedirs(self.directory, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise DirectoryLocked(
                f"{self.directory} is in use by {holder}: wait for it to finish or stop it "
                "(one writer per directory)"
            ) from None
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "what": self.what,
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Gives the lock up (the file stays; its content is the last holder)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """``"<what> (pid P on HOST since T)"`` from the lock file, or what could be read."""
    try:
        raw = os.pread(fd, 4096, 0).decode(errors="replace")
        h = json.loads(raw)
        return f"{h['what']} (pid {h['pid']} on {h['host']} since {h['since']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (holder not recorded yet)"


def die_with_parent() -> bool:
    """SIGTERM for this process when the parent in ``RL_BATCH_PARENT_PID`` dies (Linux).

    Returns whether it was arranged: False without the variable or off Linux. If the
    parent is already gone (it died before the call), this process stops now.
    """
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return False
    try:
        import ctypes
        import signal

        if ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM) != 0:
            return False  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(parent):  # the parent died before prctl: no signal will come
        os.kill(os.getpid(), signal.SIGTERM)
    return True
