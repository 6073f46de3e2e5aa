"""One writer per directory: a second process stops at once, a dead holder frees the lock."""

import os
import signal
import subprocess
import sys
import time

import pytest

from rl_batch.locks import LOCK_FILE, DirectoryLock, DirectoryLocked

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOLD = """
import sys, time
from rl_batch.locks import DirectoryLock
lock = DirectoryLock(sys.argv[1], "test holder").acquire()
print("held", flush=True)
time.sleep(60)
"""


def _holder(directory):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(DirectoryLocked, match=rf"test holder \(pid {proc.pid} on "):
            DirectoryLock(str(tmp_path), "second").acquire()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # The holder died without releasing: the OS dropped its lock.
    with DirectoryLock(str(tmp_path), "third") as lock:
        assert lock.held
        assert '"what": "third"' in open(tmp_path / LOCK_FILE).read()
    assert not lock.held


def test_release_lets_the_next_writer_in(tmp_path):
    a = DirectoryLock(str(tmp_path / "d"), "a").acquire()
    with pytest.raises(DirectoryLocked, match="a \\(pid"):
        DirectoryLock(str(tmp_path / "d"), "b").acquire()
    a.release()
    DirectoryLock(str(tmp_path / "d"), "b").acquire().release()


# A sweep parent's child (processes.run_child): it dies with the parent and gets its SIGTERM.
CHILD = """
import os, signal, sys, time
from rl_batch.locks import die_with_parent
assert die_with_parent()
def on_term(signum, frame):
    open(sys.argv[1] + ".tmp", "w").write("terminated")
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])  # (the test sees all of it or nothing)
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
print("child up", flush=True)
time.sleep(60)
"""
PARENT = """
import sys
import time
from rl_batch.sweeps import processes
print("parent up", flush=True)
sys.exit(processes.run_child([sys.executable, "-c", sys.argv[1], sys.argv[2]], sys.argv[3]))
"""


def _parent(tmp_path):
    mark, log = tmp_path / "mark", tmp_path / "child.log"
    proc = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(mark), str(log)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "parent up"
    for _ in range(600):  # until the child is up (its line in the log)
        if log.exists() and "child up" in log.read_text():
            break
        time.sleep(0.05)
    return proc, mark


def _wait_for(path, tries=600):
    for _ in range(tries):
        if path.exists():
            return path.read_text()
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGKILL, -9)])
@pytest.mark.slow  # 7 s in the fast tier at b3308b3 (2 cores, load 2-5)
def test_the_child_of_a_stopped_parent_stops_too(tmp_path, sig, code):
    proc, mark = _parent(tmp_path)
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == code
    assert _wait_for(mark) == "terminated"  # SIGTERM passed on, or sent at the parent's death


# A calibration child that holds (processes.HeldChild): "held", then a line on its stdin.
HELD = """
import sys
print("building", flush=True)  # (its log)
if sys.argv[1] == "hold":
    sys.__stdout__.write("held\\n")
    sys.__stdout__.flush()
    print("released:", sys.stdin.readline().strip() or "(end of input)", file=sys.stderr)
sys.exit(3)
"""


@pytest.mark.parametrize("mode, go", [("hold", True), ("hold", False), ("end", None)])
def test_a_held_child_waits_for_its_release(tmp_path, mode, go):
    from rl_batch.sweeps import processes

    log = tmp_path / "child.log"
    child = processes.HeldChild.start([sys.executable, "-c", HELD, mode], str(log))
    if mode == "end":  # it ended without holding: its exit status
        assert child == 3 and "released" not in log.read_text()
        return
    assert isinstance(child, processes.HeldChild) and child.proc.poll() is None
    assert child.release(go) == 3
    assert ("released: after" if go else "released: (end of input)") in log.read_text()


def test_a_second_sweep_on_one_directory_is_refused(tmp_path):
    from rl_batch.sweeps import sweep
    from tests.test_sweep import _sweep_config

    holder = _holder(tmp_path)
    started = []
    try:
        c = _sweep_config(str(tmp_path / "work"), prompts="4", group_sizes="4")
        with pytest.raises(DirectoryLocked, match="in use by test holder"):
            sweep.run_sweep(c, str(tmp_path), run_fn=started.append, log=lambda s: None)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert not started and not os.path.exists(tmp_path / "sweep.json")


def test_a_second_run_on_one_directory_is_refused_before_it_writes(tmp_path):
    from rl_batch.runs import run as run_lib
    from tests.run_fixtures import tiny_run_config

    run_dir = tmp_path / "run"
    holder = _holder(run_dir)
    try:
        with pytest.raises(DirectoryLocked, match="in use by test holder"):
            run_lib.run(tiny_run_config(str(tmp_path / "work"), str(run_dir)), progress=False)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert sorted(os.listdir(run_dir)) == [LOCK_FILE]  # no config.json, no metrics


_TAKE_TURNS = """
import sys, time
from rl_batch.locks import held
path, log, name = sys.argv[1:]
with held(path):
    with open(log, "a") as f:
        f.write(name + " in\\n")
    time.sleep(0.3)
    with open(log, "a") as f:
        f.write(name + " out\\n")
"""


def test_builders_of_one_cache_take_turns(tmp_path):
    # What lets a sweep start every point at once: the processes that would build one
    # cache (task data, a warm start) wait for each other, never overlap.
    lock, log = str(tmp_path / "cache" / "x.lock"), str(tmp_path / "log")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(__file__))}
    procs = [
        subprocess.Popen([sys.executable, "-c", _TAKE_TURNS, lock, log, name], env=env)
        for name in ("a", "b", "c")
    ]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    lines = open(log).read().split()
    pairs = [lines[i : i + 4] for i in range(0, len(lines), 4)]
    assert len(lines) == 12 and all(p[0] == p[2] and p[1:4:2] == ["in", "out"] for p in pairs)
