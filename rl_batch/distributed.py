"""Multi-controller JAX: ``jax.distributed.initialize`` from config, flags or environment.

Each process of a multi-host run executes the same program. The coordinator address,
process count and process id come from the run config (``distributed.*``), else from
the environment (``RL_BATCH_COORDINATOR``, ``RL_BATCH_NUM_PROCESSES``,
``RL_BATCH_PROCESS_ID``). On TPU VMs and SLURM clusters JAX detects them itself: set
``RL_BATCH_DISTRIBUTED=auto`` to call ``initialize()`` without arguments.
"""

from __future__ import annotations

import os

import jax

_initialized = False


def settings(config=None) -> dict | None:
    """The ``initialize`` arguments for this process, or None for a single process."""
    d = config.distributed if config is not None and "distributed" in config else None
    address = (d.coordinator_address if d else "") or os.environ.get("RL_BATCH_COORDINATOR", "")
    num = (d.num_processes if d else 0) or int(os.environ.get("RL_BATCH_NUM_PROCESSES", "0"))
    pid = (
        d.process_id
        if d and d.process_id >= 0
        else int(os.environ.get("RL_BATCH_PROCESS_ID", "-1"))
    )
    if os.environ.get("RL_BATCH_DISTRIBUTED") == "auto":
        return {}
    if not address and num <= 1:
        return None
    if not address or num < 1 or not 0 <= pid < num:
        raise ValueError(
            f"incomplete multi-process settings: coordinator_address={address!r}, "
            f"num_processes={num}, process_id={pid}"
        )
    return {"coordinator_address": address, "num_processes": num, "process_id": pid}


def maybe_initialize(config=None) -> bool:
    """Initializes ``jax.distributed`` once when the settings ask for several processes."""
    global _initialized
    if _initialized:
        return True
    args = settings(config)
    if args is None:
        return False
    jax.distributed.initialize(**args)
    _initialized = True
    return True
