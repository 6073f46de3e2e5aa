"""Shared test setup: CPU only, eight fake devices for sharding tests."""

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


def pytest_unconfigure(config):
    """Removes the session's compilation cache (in the process that made it)."""
    del config
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
