"""Shared test setup: CPU only, eight fake devices for sharding tests, and a suite that
stays out of the checkout's outputs.

The programs' default output directories (``sweeps/``, ``workdir/``) point at a
temporary directory for the session (``$RL_BATCH_DEFAULT_ROOT``, inherited by the xdist
workers and every process a test starts), so a finished study in the checkout neither
leaks into a test nor is touched by one. A test that writes into the checkout's
``sweeps/``, ``runs/``, ``workdir/`` or ``jobs/`` anyway fails (``_checkout_untouched``);
the session's end compares those trees in full (a write deep inside an existing run
directory shows there) and fails the session if any changed."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Eight host devices let mesh tests run on one CPU; single-device code is unaffected.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import shutil  # noqa: E402
import tempfile  # noqa: E402

# One persistent XLA compilation cache for the whole test session, shared by the xdist
# workers (they inherit the controller's environment) and by the processes tests start:
# the tiny models' programs compile once, not once per worker and subprocess. Every
# program is cached however fast it compiled (as rl_batch.runs.run.enable_xla_cache does). A
# cache hit returns the same executable, so no test's numbers change.
_OWN_CACHE = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="rl_batch_tests_xla_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


_OWN_ROOT = None
if "RL_BATCH_DEFAULT_ROOT" not in os.environ:
    _OWN_ROOT = tempfile.mkdtemp(prefix="rl_batch_tests_default_root_")
    os.environ["RL_BATCH_DEFAULT_ROOT"] = _OWN_ROOT

import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The checkout's output directories (.gitignore): no test may read or write them.
OUTPUT_DIRS = ("sweeps", "runs", "workdir", "jobs")


def _tree(max_depth: int | None = None) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of every path under the checkout's output directories (to
    ``max_depth`` levels below each: a new or replaced entry changes its directory)."""
    out = {}
    for name in OUTPUT_DIRS:
        top = os.path.join(REPO, name)
        for root, dirs, files in os.walk(top):
            depth = root[len(top) :].count(os.sep)
            if max_depth is not None and depth >= max_depth:
                dirs[:] = []
            for entry in [root, *(os.path.join(root, f) for f in files)]:
                try:
                    st = os.lstat(entry)
                except FileNotFoundError:
                    continue
                out[entry] = (st.st_mtime_ns, st.st_size)
    return out


def _changed(before: dict, after: dict) -> list[str]:
    paths = sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
    return [os.path.relpath(p, REPO) for p in paths]


_SESSION_BEFORE = _tree()


@pytest.fixture(autouse=True)
def _checkout_untouched():
    """Fails a test that created, replaced or removed anything in the checkout's output
    directories (the top three levels: a sweep, its files, its runs)."""
    before = _tree(max_depth=3)
    yield
    changed = _changed(before, _tree(max_depth=3))
    if changed:
        pytest.fail(
            f"this test wrote into the checkout's output directories: {changed[:5]}; write "
            "under tmp_path, or let the default directories ($RL_BATCH_DEFAULT_ROOT) be used "
            "(or another process, e.g. a study, wrote there while the test ran: run the "
            "suite after it, as the README orders them)"
        )


def pytest_sessionfinish(session, exitstatus):
    """Fails the session if anything under the checkout's output directories changed
    (in the controller of an xdist run, or the one process)."""
    del exitstatus
    if hasattr(session.config, "workerinput"):
        return
    changed = _changed(_SESSION_BEFORE, _tree())
    if changed:
        print(f"\nerror: the test session wrote into the checkout: {changed[:10]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    """Removes the session's compilation cache and default root (in the process that
    made them)."""
    del config
    for own in (_OWN_CACHE, _OWN_ROOT):
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)
