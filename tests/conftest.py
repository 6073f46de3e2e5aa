"""Shared test setup: CPU only, eight fake devices for sharding tests."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Eight host devices let mesh tests run on one CPU; single-device code is unaffected.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
