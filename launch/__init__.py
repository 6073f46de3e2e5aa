"""Launching runs and sweeps beyond one process, and merging what the jobs wrote.

- ``launch/local.sh``: one run, one grid point or a whole sweep on this machine, optionally
  as N cooperating processes.
- ``launch/tpu_vm.sh``: the same on every worker of a Cloud TPU VM slice.
- ``launch.make_jobs``: writes a job script per scheduler (a SLURM job array with one task
  per grid point, a TPU-slice loop, a local loop) and ``runs.json``.
- ``launch.collect``: merges run directories written by separate jobs into one sweep
  directory and rebuilds its ``sweep.json``.

See ``launch/README.md``.
"""
