"""Multi-controller JAX: ``jax.distributed.initialize`` from config, flags or environment.

Each process of a multi-host run executes the same program. The coordinator address,
process count and process id come from the run config (``distributed.*``), else from
the environment (``RL_BATCH_COORDINATOR``, ``RL_BATCH_NUM_PROCESSES``,
``RL_BATCH_PROCESS_ID``). On TPU VMs and SLURM clusters JAX detects them itself: set
``RL_BATCH_DISTRIBUTED=auto`` to call ``initialize()`` without arguments.

``initialize`` must come before any JAX call that starts the backend (even
``jax.device_count()``): programs that compute anything before ``run.run`` (the sweep
programs resolve every grid point first) call ``maybe_initialize`` at their start;
``run.run`` calls it again, which then does nothing.

Every process runs the same host code on the same host data (same seed, same prompts),
so host values that decide control flow agree everywhere; ``to_host`` brings arrays
that span several processes back to every process's host.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np


def settings(config=None) -> dict | None:
    """The ``initialize`` arguments for this process, or None for a single process.

    Config values (``distributed.*``) win over the ``RL_BATCH_*`` environment. One
    process (``num_processes`` of 1, or 0 and no coordinator) needs no ``initialize``,
    even with a coordinator address set: SLURM's "env" mode exports it for every job.

    Args:
      config: a run config with a ``distributed`` section, or None for the environment.

    Returns:
      ``{}`` for ``RL_BATCH_DISTRIBUTED=auto`` (JAX finds the cluster itself), the
      ``coordinator_address``/``num_processes``/``process_id`` arguments for several
      processes, or None for a single process.

    Raises:
      ValueError: naming every value when the settings ask for several processes but
        are incomplete (no coordinator, or a process id outside ``[0, num_processes)``).
    """
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
    if num == 1 or (not address and num <= 1):
        return None
    if not address or num < 1 or not 0 <= pid < num:
        raise ValueError(
            f"incomplete multi-process settings: coordinator_address={address!r}, "
            f"num_processes={num}, process_id={pid}"
        )
    return {"coordinator_address": address, "num_processes": num, "process_id": pid}


def maybe_initialize(config=None) -> bool:
    """Initializes ``jax.distributed`` once when the settings ask for several processes.

    Call it before any other JAX call of the program. Calling it again (``run.run``
    does, after a sweep program did) is a no-op, and so is calling it after the program
    initialized ``jax.distributed`` itself.

    Args:
      config: a run config with a ``distributed`` section, or None (see ``settings``).

    Returns:
      True when this process is one of several (``jax.distributed`` is initialized),
      False for a single process.

    Raises:
      ValueError: for incomplete settings (see ``settings``).
      RuntimeError: from JAX, when a JAX call already started the backend.
    """
    if jax.distributed.is_initialized():
        return True
    args = settings(config)
    if args is None:
        return False
    # CPU processes exchange collectives through gloo (the option only affects the CPU
    # backend, so it is harmless on accelerators); it must be set before the backend starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**args)
    return True


def launch_settings(config=None) -> tuple[int, int] | None:
    """``(num_processes, process_id)`` this process was started as, without initializing.

    For a program that starts the processes of a multi-process run as its children (a
    sweep with ``--isolate``) and must not join it itself: the children take the
    coordinator's port. With ``RL_BATCH_DISTRIBUTED=auto`` the values come from JAX's
    cluster detection (SLURM, Cloud TPU, ...), when it finds one.

    Args:
      config: a run config with a ``distributed`` section, or None (see ``settings``).

    Returns:
      ``(num_processes, process_id)``; ``(1, 0)`` for a single process; None when
      ``RL_BATCH_DISTRIBUTED=auto`` and no cluster is detected.
    """
    args = settings(config)
    if args is None:
        return 1, 0
    if args:
        return args["num_processes"], args["process_id"]
    return _detect_cluster()


def _detect_cluster() -> tuple[int, int] | None:
    """(process count, process id) from the cluster JAX's ``initialize()`` would detect."""
    try:  # JAX's cluster environments are not public API: any failure means "unknown".
        from jax._src.clusters import ClusterEnv

        for env in ClusterEnv._cluster_types:
            if not env.opt_in_only_method and env.is_env_present():
                return int(env.get_process_count()), int(env.get_process_id())
    except Exception:
        pass
    return None


def to_host(tree: Any) -> Any:
    """Numpy copies of a tree of arrays, on every process.

    An array sharded over devices of several processes cannot be read by one process
    alone (``jax.device_get`` raises); it is gathered with ``process_allgather``, a
    collective, so every process must call this with the same tree.

    Args:
      tree: a pytree of ``jax.Array`` (or numpy) leaves.

    Returns:
      The same tree with numpy leaves holding the global values.
    """

    def fetch(x):
        if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
            from jax.experimental import multihost_utils

            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(fetch, tree)


def rebuild(tree: Any) -> Any:
    """Well-formed copies of arrays placed on a mesh that spans several processes.

    In this jax (0.10), ``jax.device_put`` of a *device* array (not numpy) onto a
    replicated sharding over several processes builds an Array whose per-device buffers
    carry the global sharding: computations accept it, but orbax cannot save it ("the
    input arrays must have one shard each"). A jitted copy returns proper arrays with
    the same shardings. Every process must call it (it is a computation on the mesh);
    in a single process it returns ``tree`` unchanged.

    Args:
      tree: a pytree of ``jax.Array`` leaves.

    Returns:
      The same values, freshly computed on the same shardings.
    """
    if jax.process_count() == 1:
        return tree
    shardings = jax.tree.map(lambda x: x.sharding, tree)
    return jax.jit(lambda t: jax.tree.map(jax.numpy.copy, t), out_shardings=shardings)(tree)
