#!/usr/bin/env bash
# Runs rl_batch on every worker (host) of a Cloud TPU VM slice, through
#   gcloud compute tpus tpu-vm ssh NAME --zone=ZONE --worker=all --command=...
# Every worker runs the same command at the same time, one JAX process per host. train,
# sweep and point run with RL_BATCH_DISTRIBUTED=auto: jax.distributed.initialize() is called
# without arguments and finds the other workers of the slice by itself.
#
# Usage (from a workstation with gcloud, in this checkout):
#   launch/tpu_vm.sh [OPTIONS] setup                     copy this checkout to every worker and
#                                                        pip install it there from the lock,
#                                                        with jax[tpu] of the locked jax
#   launch/tpu_vm.sh [OPTIONS] train CONFIG RUN_DIR [FLAG ...]
#   launch/tpu_vm.sh [OPTIONS] sweep CONFIG SWEEP_DIR [FLAG ...]
#   launch/tpu_vm.sh [OPTIONS] point CONFIG SWEEP_DIR RUN_NAME [FLAG ...]
#   launch/tpu_vm.sh [OPTIONS] list  CONFIG [SWEEP_DIR]  print the sweep grid (worker 0)
#   launch/tpu_vm.sh [OPTIONS] exec  COMMAND ...         any command, in the checkout, on every worker
#   launch/tpu_vm.sh [OPTIONS] fetch REMOTE_DIR LOCAL_DIR  copy a run/sweep directory from worker 0
#
# Options (each also read from the environment variable in brackets):
#   --tpu=NAME          [TPU_NAME]     the TPU VM (slice) name, required
#   --zone=ZONE         [TPU_ZONE]     its zone, required
#   --project=PROJECT   [TPU_PROJECT]  optional; gcloud's default project otherwise
#   --remote_dir=DIR    [TPU_REMOTE_DIR] checkout on each worker, relative to the remote home
#                                      directory unless absolute (default rl_batch)
#   --worker=W          [TPU_WORKER]   all (default), or e.g. 0 or 0,1
#   --algo=grpo|ppo                    sweep program (default: ppo if CONFIG's name contains "ppo")
#   --single_process                   leave RL_BATCH_DISTRIBUTED unset (each worker runs alone)
#   --detach                           start under nohup and return at once; each worker logs to
#                                      REMOTE_DIR/logs/<command>-<time>.log
#   --dry_run                          print the gcloud commands instead of running them
#   -h, --help
# Environment: GCLOUD (default gcloud), GCLOUD_FLAGS (extra flags for every gcloud call, e.g.
# "--internal-ip" or "--tunnel-through-iap"), REMOTE_PYTHON (default python3), PIP_FLAGS (extra
# pip flags for setup, e.g. a -f wheel index for libtpu).
#
# Paths given to train/sweep/point (CONFIG, RUN_DIR, SWEEP_DIR) are on the workers, relative to
# REMOTE_DIR. On a multi-host slice every worker must see the same run directory (checkpoints
# are written by all hosts): use a shared mount (e.g. gcsfuse or Filestore) for RUN_DIR/SWEEP_DIR.
#
# Example:
#   export TPU_NAME=my-v5e-16 TPU_ZONE=us-west4-a
#   launch/tpu_vm.sh setup
#   launch/tpu_vm.sh point experiments/configs/grpo_tpu.py /mnt/shared/sweep p256_g8_sqrt_s0
#   launch/tpu_vm.sh fetch /mnt/shared/sweep ./sweeps/grpo
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

die() {
  echo "launch/tpu_vm.sh: $*" >&2
  exit 2
}

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
GCLOUD="${GCLOUD:-gcloud}"
REMOTE_PYTHON="${REMOTE_PYTHON:-python3}"
TPU="${TPU_NAME:-}"
ZONE="${TPU_ZONE:-}"
PROJECT="${TPU_PROJECT:-}"
REMOTE_DIR="${TPU_REMOTE_DIR:-rl_batch}"
WORKER="${TPU_WORKER:-all}"
ALGO=""
DETACH=0
DRY_RUN=0
SINGLE_PROCESS=0

while (($#)); do
  case "$1" in
    --tpu=*) TPU="${1#*=}"; shift ;;
    --zone=*) ZONE="${1#*=}"; shift ;;
    --project=*) PROJECT="${1#*=}"; shift ;;
    --remote_dir=*) REMOTE_DIR="${1#*=}"; shift ;;
    --worker=*) WORKER="${1#*=}"; shift ;;
    --algo=*) ALGO="${1#*=}"; shift ;;
    --single_process) SINGLE_PROCESS=1; shift ;;
    --detach) DETACH=1; shift ;;
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
(($#)) || die "missing COMMAND (setup, train, sweep, point, list, exec or fetch); see --help"
[[ -n "$TPU" ]] || die "no TPU name: pass --tpu=NAME or set TPU_NAME"
[[ -n "$ZONE" ]] || die "no zone: pass --zone=ZONE or set TPU_ZONE"
[[ -n "$REMOTE_DIR" ]] || die "--remote_dir is empty"

# How train/sweep/point start Python on each worker.
if ((SINGLE_PROCESS)); then
  RUN_PY=("$REMOTE_PYTHON")
else
  RUN_PY=(env RL_BATCH_DISTRIBUTED=auto "$REMOTE_PYTHON")
fi

# gcloud flags shared by ssh and scp.
GCLOUD_COMMON=("--zone=$ZONE")
[[ -z "$PROJECT" ]] || GCLOUD_COMMON+=("--project=$PROJECT")
# Deliberately word-split: GCLOUD_FLAGS holds several flags.
# shellcheck disable=SC2206
GCLOUD_COMMON+=(${GCLOUD_FLAGS:-})

# Runs (or, with --dry_run, prints) one local command.
run() {
  if ((DRY_RUN)); then
    printf '%q ' "$@"
    echo
  else
    "$@"
  fi
}

# Joins the words "$@" into one string that a remote bash splits back into the same words.
quote_words() {
  local out="" word
  for word in "$@"; do
    out+="$(printf '%q' "$word") "
  done
  echo "${out% }"
}

# The remote directory as a shell word: relative to the remote home unless absolute.
remote_dir_word() {
  printf '%q' "$REMOTE_DIR"
}

# Runs the shell command string $1 on the selected workers, inside REMOTE_DIR.
on_workers() {
  local label="$1" command="$2" remote
  remote="cd $(remote_dir_word) && $command"
  if ((DETACH)); then
    local log
    log="logs/${label}-$(date +%Y%m%d-%H%M%S).log"
    remote="cd $(remote_dir_word) && mkdir -p logs && nohup bash -c $(printf '%q' "$command")"
    remote+=" > $(printf '%q' "$log") 2>&1 < /dev/null & echo \"\$(hostname): started, log"
    remote+=" $(printf '%q' "$REMOTE_DIR/$log")\""
  fi
  run "$GCLOUD" compute tpus tpu-vm ssh "$TPU" "${GCLOUD_COMMON[@]}" "--worker=$WORKER" \
    "--command=$remote"
}

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

setup() {
  local tarball
  if ((DRY_RUN)); then
    tarball="<tarball>"
  else
    tarball="$(mktemp -t rl_batch_src.XXXXXX).tgz"
    # Tracked and untracked-but-not-ignored files: what `git status` would show, no outputs.
    git -C "$REPO_DIR" ls-files -z --cached --others --exclude-standard \
      | (cd "$REPO_DIR" && tar czf "$tarball" --null -T -)
  fi
  run "$GCLOUD" compute tpus tpu-vm scp "$tarball" "$TPU:rl_batch_src.tgz" \
    "${GCLOUD_COMMON[@]}" "--worker=$WORKER"
  local dir
  dir="$(remote_dir_word)"
  local install="mkdir -p $dir && tar xzf rl_batch_src.tgz -C $dir && rm rl_batch_src.tgz"
  # The locked versions (requirements/lock.txt), with the TPU plugin of the locked jax.
  local jax_version
  jax_version="$(sed -n 's/^jax==\([^ ]*\).*/\1/p' "$REPO_DIR/requirements/lock.txt")"
  install+=" && cd $dir && $REMOTE_PYTHON -m pip install -q ${PIP_FLAGS:-} -e ."
  install+=" -c requirements/lock.txt 'jax[tpu]==$jax_version'"
  install+=" && $REMOTE_PYTHON -c 'import jax; print(jax.process_index(), jax.devices())'"
  run "$GCLOUD" compute tpus tpu-vm ssh "$TPU" "${GCLOUD_COMMON[@]}" "--worker=$WORKER" \
    "--command=$install"
  ((DRY_RUN)) || rm -f "$tarball"
}

COMMAND="$1"
shift
case "$COMMAND" in
  setup)
    setup
    ;;
  train)
    [[ $# -ge 2 ]] || die "usage: train CONFIG RUN_DIR [FLAG ...]"
    on_workers "train" "$(quote_words "${RUN_PY[@]}" -m experiments.train \
      "--config=$1" "--config.run_dir=$2" "${@:3}")"
    ;;
  sweep)
    [[ $# -ge 2 ]] || die "usage: sweep CONFIG SWEEP_DIR [FLAG ...]"
    on_workers "sweep" "$(quote_words "${RUN_PY[@]}" -m \
      "$(sweep_module "$1")" "--config=$1" "--sweep_dir=$2" "${@:3}")"
    ;;
  point)
    [[ $# -ge 3 ]] || die "usage: point CONFIG SWEEP_DIR RUN_NAME [FLAG ...]"
    on_workers "point-$3" "$(quote_words "${RUN_PY[@]}" -m \
      "$(sweep_module "$1")" "--config=$1" "--sweep_dir=$2" "--only=$3" "${@:4}")"
    ;;
  list)
    [[ $# -ge 1 ]] || die "usage: list CONFIG [SWEEP_DIR] [FLAG ...]"
    WORKER=0
    DETACH=0
    LIST_ARGS=(-m "$(sweep_module "$1")" "--config=$1")
    if [[ $# -ge 2 && "$2" != -* ]]; then LIST_ARGS+=("--sweep_dir=$2"); shift; fi
    on_workers "list" "$(quote_words "$REMOTE_PYTHON" "${LIST_ARGS[@]}" --list_runs "${@:2}")"
    ;;
  exec)
    [[ $# -ge 1 ]] || die "usage: exec COMMAND ..."
    on_workers "exec" "$(quote_words "$@")"
    ;;
  fetch)
    [[ $# -eq 2 ]] || die "usage: fetch REMOTE_DIR LOCAL_DIR"
    remote_path="$1"
    [[ "$remote_path" == /* ]] || remote_path="$REMOTE_DIR/$remote_path"
    ((DRY_RUN)) || mkdir -p "$2"
    run "$GCLOUD" compute tpus tpu-vm scp --recurse "$TPU:$remote_path" "$2" \
      "${GCLOUD_COMMON[@]}" --worker=0
    ;;
  *) die "unknown COMMAND '$COMMAND' (setup, train, sweep, point, list, exec or fetch)" ;;
esac
