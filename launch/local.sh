#!/usr/bin/env bash
# Runs one training run, one sweep grid point or a whole sweep on this machine, optionally
# as N cooperating JAX processes (multi-controller on localhost, e.g. a multi-process CPU run).
#
# Usage:
#   launch/local.sh [OPTIONS] train CONFIG RUN_DIR [FLAG ...]
#   launch/local.sh [OPTIONS] sweep CONFIG SWEEP_DIR [FLAG ...]
#   launch/local.sh [OPTIONS] point CONFIG SWEEP_DIR RUN_NAME [FLAG ...]
#   launch/local.sh [OPTIONS] list  CONFIG [SWEEP_DIR] [FLAG ...]  (the grid the points of
#                            SWEEP_DIR run: an extension recorded there for it included)
#
# Options:
#   -n N, --num_processes=N  start N processes (default 1). For train, process i gets
#                            --coordinator_address=localhost:PORT --num_processes=N --process_id=i;
#                            for sweep/point (whose programs take no such flags) it gets
#                            RL_BATCH_COORDINATOR, RL_BATCH_NUM_PROCESSES, RL_BATCH_PROCESS_ID
#   --port=PORT              coordinator port for N > 1 (default 12321)
#   --log_dir=DIR            where processes 1..N-1 write their logs (default: a new temp dir);
#                            process 0 writes to this terminal
#   --dist_env               train too gets the RL_BATCH_* environment instead of flags
#   --algo=grpo|ppo          sweep program (default: ppo if CONFIG's file name contains "ppo")
#   --dry_run                print the commands instead of running them
#   -h, --help               this text
#
# FLAG ... is passed through to the program, e.g. --config.seed=1 or --resume.
# Environment: PYTHON (default python3). With N > 1, JAX_PLATFORMS defaults to cpu, because
# N processes on one host would otherwise compete for the same accelerator.
#
# Examples:
#   launch/local.sh train experiments/configs/grpo_cpu.py /tmp/run0 --config.seed=1
#   launch/local.sh -n 2 train experiments/configs/grpo_cpu.py /tmp/run_2proc
#   launch/local.sh point experiments/configs/grpo_cpu.py /tmp/sweep p64_g8_sqrt_s0
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() {
  echo "launch/local.sh: $*" >&2
  exit 2
}

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
NUM_PROCESSES=1
PORT=12321
LOG_DIR=""
DIST_ENV=0
ALGO=""
DRY_RUN=0

while (($#)); do
  case "$1" in
    -n) [[ $# -ge 2 ]] || die "-n needs a value"; NUM_PROCESSES="$2"; shift 2 ;;
    --num_processes=*) NUM_PROCESSES="${1#*=}"; shift ;;
    --port=*) PORT="${1#*=}"; shift ;;
    --log_dir=*) LOG_DIR="${1#*=}"; shift ;;
    --dist_env) DIST_ENV=1; shift ;;
    --algo=*) ALGO="${1#*=}"; shift ;;
    --dry_run) DRY_RUN=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) break ;;
  esac
done

case "$ALGO" in
  "" | grpo | ppo) ;;
  *) die "--algo must be grpo or ppo, got '$ALGO'" ;;
esac
[[ "$NUM_PROCESSES" =~ ^[1-9][0-9]*$ ]] || die "-n must be a positive integer, got '$NUM_PROCESSES'"
[[ "$PORT" =~ ^[0-9]+$ ]] || die "--port must be a number, got '$PORT'"
(($#)) || die "missing COMMAND (train, sweep, point or list); see --help"

# The sweep program for CONFIG: --algo wins, else the config file's name decides.
sweep_module() {
  local algo="$ALGO"
  if [[ -z "$algo" ]]; then
    case "$(basename "$1")" in
      *ppo*) algo=ppo ;;
      *) algo=grpo ;;
    esac
  fi
  echo "experiments.${algo}_sweep"
}

COMMAND="$1"
shift
case "$COMMAND" in
  train)
    [[ $# -ge 2 ]] || die "usage: train CONFIG RUN_DIR [FLAG ...]"
    CMD=("$PYTHON" -m experiments.train "--config=$1" "--config.run_dir=$2" "${@:3}")
    ;;
  sweep)
    [[ $# -ge 2 ]] || die "usage: sweep CONFIG SWEEP_DIR [FLAG ...]"
    DIST_ENV=1
    CMD=("$PYTHON" -m "$(sweep_module "$1")" "--config=$1" "--sweep_dir=$2" "${@:3}")
    ;;
  point)
    [[ $# -ge 3 ]] || die "usage: point CONFIG SWEEP_DIR RUN_NAME [FLAG ...]"
    DIST_ENV=1
    CMD=("$PYTHON" -m "$(sweep_module "$1")" "--config=$1" "--sweep_dir=$2" "--only=$3" "${@:4}")
    ;;
  list)
    [[ $# -ge 1 ]] || die "usage: list CONFIG [SWEEP_DIR] [FLAG ...]"
    if [[ $# -ge 2 && "$2" != -* ]]; then
      CMD=("$PYTHON" -m "$(sweep_module "$1")" "--config=$1" "--sweep_dir=$2" --list_runs "${@:3}")
    else
      CMD=("$PYTHON" -m "$(sweep_module "$1")" "--config=$1" --list_runs "${@:2}")
    fi
    NUM_PROCESSES=1
    ;;
  *) die "unknown COMMAND '$COMMAND' (train, sweep, point or list)" ;;
esac

# Paths stay relative to the caller's directory; the package is found through PYTHONPATH
# whether or not it was pip-installed.
export PYTHONPATH="${REPO_DIR}${PYTHONPATH:+:${PYTHONPATH}}"

if ((NUM_PROCESSES == 1)); then
  if ((DRY_RUN)); then
    printf '%q ' "${CMD[@]}"
    echo
    exit 0
  fi
  exec "${CMD[@]}"
fi

export JAX_PLATFORMS="${JAX_PLATFORMS:-cpu}"
COORDINATOR="localhost:${PORT}"
if [[ -z "$LOG_DIR" ]]; then
  if ((DRY_RUN)); then LOG_DIR="<log_dir>"; else LOG_DIR="$(mktemp -d -t rl_batch_local.XXXXXX)"; fi
fi
((DRY_RUN)) || mkdir -p "$LOG_DIR"

# The command line of process $1.
process_cmd() {
  if ((DIST_ENV)); then
    PROC_ENV=(env "RL_BATCH_COORDINATOR=$COORDINATOR" "RL_BATCH_NUM_PROCESSES=$NUM_PROCESSES"
      "RL_BATCH_PROCESS_ID=$1")
    PROC_CMD=("${PROC_ENV[@]}" "${CMD[@]}")
  else
    PROC_CMD=("${CMD[@]}" "--coordinator_address=$COORDINATOR"
      "--num_processes=$NUM_PROCESSES" "--process_id=$1")
  fi
}

if ((DRY_RUN)); then
  for ((i = 0; i < NUM_PROCESSES; i++)); do
    process_cmd "$i"
    printf '%q ' "${PROC_CMD[@]}"
    ((i == 0)) || printf '> %q 2>&1' "$LOG_DIR/process_$i.log"
    echo
  done
  exit 0
fi

PIDS=()
# Ends the processes this script started (and only those).
stop_all() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
}
trap 'stop_all; exit 130' INT TERM

echo "launch/local.sh: $NUM_PROCESSES processes, coordinator $COORDINATOR," \
  "logs of processes 1..$((NUM_PROCESSES - 1)) in $LOG_DIR" >&2
for ((i = 0; i < NUM_PROCESSES; i++)); do
  process_cmd "$i"
  if ((i == 0)); then
    "${PROC_CMD[@]}" &
  else
    "${PROC_CMD[@]}" >"$LOG_DIR/process_$i.log" 2>&1 &
  fi
  PIDS+=("$!")
done

# The first process to fail takes the others down: the survivors would otherwise wait in a
# collective until the coordinator's heartbeat timeout.
RC=0
for ((n = 0; n < NUM_PROCESSES; n++)); do
  wait -n || RC=$?
  if ((RC != 0)); then
    echo "launch/local.sh: a process exited with status $RC; stopping the others (logs in $LOG_DIR)" >&2
    stop_all
    wait || true
    break
  fi
done
trap - INT TERM
exit "$RC"
