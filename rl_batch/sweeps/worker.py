"""The processes a sweep starts, as one library entry point (never ``experiments.*``).

    python -m rl_batch.sweeps.worker run SPEC_JSON        # one point, resumed if begun
    python -m rl_batch.sweeps.worker serve                # points sent on stdin (Worker)
    python -m rl_batch.sweeps.worker calibrate SWEEP_DIR --rounds=R --steps=S [--gen_probe=..]
        [--before=B --stage=before|after --grid=GRID_JSON [--hold]]
    python -m rl_batch.sweeps.worker memory CHECK_JSON --device_memory=BYTES

``run`` and ``serve`` read each point's ``RunSpec`` JSON (``spec.to_json()``, written by
the sweep) and never resolve it again. ``memory`` runs CPU-only (the sweep sets
``JAX_PLATFORMS=cpu``) and prints the points that do not fit as a JSON list on its last
line. ``calibrate --stage=before --hold`` on a CPU backend, once its block before the
runs is written, says ``held`` on its stdout and waits for a line on its stdin: ``after``
(the runs have ended) times the other rounds with the programs it compiled; anything
else, or the end of its input, ends it (``processes.HeldChild`` is the other end). On an
accelerator it ends at once (the runs need the device's memory). Each stops on SIGTERM
as on Ctrl-C (a run records "interrupted") and dies with its parent
(``locks.die_with_parent``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _run(path: str) -> int:
    from rl_batch import artifacts
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import run as run_lib

    spec = config_lib.load_spec(artifacts.read_json(path))
    try:
        summary = run_lib.run(spec, resume=True, progress=True)
    except artifacts.DiskFullError as e:  # one line: the directory, and that a rerun resumes
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{summary['status']}: N*={summary['n_star']} q={summary['q']}")
    return 0


def _serve() -> int:
    from rl_batch.sweeps import processes

    replies = os.fdopen(os.dup(1), "w")  # the protocol; stray output goes to stderr
    os.dup2(2, 1)
    processes.serve_points(sys.stdin, replies)
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    from rl_batch import artifacts
    from rl_batch.sweeps import calibrate

    probe = tuple(int(x) for x in args.gen_probe.split(",") if x.strip())
    grid = artifacts.read_json(args.grid) if args.grid else None
    hold = None
    if args.hold:
        replies = os.fdopen(os.dup(1), "w")  # the protocol; the log gets stdout from here on
        os.dup2(2, 1)

        def hold() -> bool:
            import jax

            if jax.default_backend() != "cpu":
                return False
            replies.write("held\n")
            replies.flush()
            return sys.stdin.readline().strip() == "after"

    record = calibrate.calibrate_sweep(
        args.sweep_dir, rounds=args.rounds, steps=args.steps, gen_probe=probe,
        before=args.before, stage=args.stage, grid=grid, hold=hold,
    )  # fmt: skip
    print(calibrate.describe(record))
    return 0


def _memory(path: str, device_memory: float) -> int:
    from rl_batch import artifacts
    from rl_batch.runs import config as config_lib
    from rl_batch.runs import memory_plan

    specs = {k: config_lib.load_spec(v) for k, v in artifacts.read_json(path).items()}
    print(json.dumps(memory_plan.check_run_specs(specs, device_memory)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parses ``argv`` and runs the chosen process; returns its exit status."""
    parser = argparse.ArgumentParser(prog="python -m rl_batch.sweeps.worker")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="run one point").add_argument("spec_json")
    sub.add_parser("serve", help="run the points a sweep sends on stdin")
    cal = sub.add_parser("calibrate", help="time every configuration of a sweep")
    cal.add_argument("sweep_dir")
    cal.add_argument("--rounds", type=int, default=3)
    cal.add_argument("--steps", type=int, default=2)
    cal.add_argument("--gen_probe", default="")
    cal.add_argument("--before", type=int, default=0, help="of the rounds, timed before the runs")
    cal.add_argument("--stage", choices=("before", "after"), default="after")
    cal.add_argument("--grid", default="", help="JSON: configuration -> spec, without a run yet")
    cal.add_argument("--hold", action="store_true", help="wait through the runs (see above)")
    mem = sub.add_parser("memory", help="which points do not fit a device")
    mem.add_argument("check_json")
    mem.add_argument("--device_memory", type=float, required=True)
    args = parser.parse_args(argv)

    from absl import logging as absl_logging

    from rl_batch import locks

    absl_logging.set_verbosity(absl_logging.WARNING)  # (orbax logs every checkpoint at INFO)
    signal.signal(signal.SIGTERM, _interrupt)
    locks.die_with_parent()
    if args.command == "run":
        return _run(args.spec_json)
    if args.command == "serve":
        return _serve()
    if args.command == "calibrate":
        return _calibrate(args)
    return _memory(args.check_json, args.device_memory)


if __name__ == "__main__":
    sys.exit(main())
