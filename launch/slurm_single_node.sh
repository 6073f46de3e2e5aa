#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, for tests: munged, slurmctld and slurmd on
# localhost, all as root. Installs slurm-wlm and munge with apt-get when slurmctld is
# missing, writes a minimal slurm.conf for this host, starts the daemons and waits until
# the node is idle. Idempotent: if the node already answers as idle, nothing is done.
#
#   sudo launch/slurm_single_node.sh          # bring it up (prints the node's state)
#   sudo launch/slurm_single_node.sh --stop   # stop the daemons it started
#
# Environment: SLURM_SINGLE_NODE_DIR (state, spool and logs; default /var/spool/rl_batch_slurm),
# SLURM_SINGLE_NODE_TIMEOUT (seconds to wait for the node, default 60).
# Exit status: 0 when the node is idle; 2 when the packages cannot be installed; 1 for any
# other failure, with the reason (and the daemons' log tails) on stderr.
set -euo pipefail

STATE_DIR="${SLURM_SINGLE_NODE_DIR:-/var/spool/rl_batch_slurm}"
TIMEOUT="${SLURM_SINGLE_NODE_TIMEOUT:-60}"
CONF=/etc/slurm/slurm.conf
HOST="$(hostname -s)"

log() { echo "slurm_single_node: $*" >&2; }
die() {
  log "$1"
  for f in "$STATE_DIR"/slurmctld.log "$STATE_DIR"/slurmd.log /var/log/munge/munged.log; do
    [[ -f $f ]] && { log "--- tail of $f"; tail -n 20 "$f" >&2; }
  done
  exit "${2:-1}"
}

node_state() { sinfo -h -n "$HOST" -o %T 2>/dev/null | head -n 1 || true; }

if [[ ${1:-} == --stop ]]; then
  for d in slurmd slurmctld; do
    pid_file="$STATE_DIR/$d.pid"
    if [[ -f $pid_file ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
      kill "$(cat "$pid_file")" && log "stopped $d"
    fi
  done
  exit 0
fi

[[ $(id -u) == 0 ]] || die "must run as root (it installs packages and starts daemons as root)"

if command -v sinfo >/dev/null && [[ -f $CONF ]] && [[ $(node_state) == idle* ]]; then
  log "already up: node $HOST is $(node_state)"
  exit 0
fi

# --- packages
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
  || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || die "slurmctld is missing and there is no apt-get" 2
  log "installing slurm-wlm and munge with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt_out="$({ apt-get update -qq && apt-get install -y -qq --no-install-recommends \
    slurm-wlm munge; } 2>&1)"; then
    echo "$apt_out" | tail -n 20 >&2
    die "apt-get install slurm-wlm munge failed" 2
  fi
  command -v slurmctld >/dev/null || die "apt-get ran but slurmctld is still missing" 2
fi

# --- this host's name must resolve: the job scripts reach the coordinator by it
if ! getent hosts "$HOST" >/dev/null; then
  log "adding '127.0.0.1 $HOST' to /etc/hosts (the name did not resolve)"
  echo "127.0.0.1 $HOST" >>/etc/hosts
fi

# --- munge
mkdir -p /etc/munge /var/log/munge /var/lib/munge /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
  log "creating /etc/munge/munge.key"
  if command -v mungekey >/dev/null; then
    mungekey --create --keyfile=/etc/munge/munge.key --force
  else
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
fi
if id munge >/dev/null 2>&1; then
  MUNGE_USER=munge
  chown -R munge:munge /etc/munge /var/log/munge /var/lib/munge /run/munge
else
  MUNGE_USER=root
fi
chmod 0700 /etc/munge /var/log/munge /var/lib/munge
chmod 0755 /run/munge
chmod 0400 /etc/munge/munge.key
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  log "starting munged (as $MUNGE_USER)"
  if [[ $MUNGE_USER == root ]]; then
    munged --force || die "munged did not start"
  else
    runuser -u munge -- munged || die "munged did not start"
  fi
  for _ in $(seq 50); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break
    sleep 0.1
  done
  munge -n </dev/null | unmunge >/dev/null 2>&1 || die "munge credentials do not round-trip"
fi

# --- slurm.conf for this host, never over one this script did not write (a real cluster's)
MARK="# Written by launch/slurm_single_node.sh"
if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
  die "$CONF exists and was not written by this script; not touching it (a real cluster?)"
fi
# --- slurm.conf for this host (CPUs, sockets, cores as slurmd itself detects them)
mkdir -p /etc/slurm "$STATE_DIR/ctld" "$STATE_DIR/d"
hw="$(slurmd -C | sed -n 1p | tr ' ' '\n' \
  | grep -E '^(CPUs|Boards|SocketsPerBoard|CoresPerSocket|ThreadsPerCore)=' | tr '\n' ' ')"
[[ -n $hw ]] || hw="CPUs=$(nproc)"
cat >"$CONF.new" <<EOF
$MARK: one node ($HOST), one partition, all as root.
ClusterName=rl_batch_test
SlurmctldHost=$HOST(127.0.0.1)
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/d
SlurmctldPidFile=$STATE_DIR/slurmctld.pid
SlurmdPidFile=$STATE_DIR/slurmd.pid
SlurmctldLogFile=$STATE_DIR/slurmctld.log
SlurmdLogFile=$STATE_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
JobRequeue=1
SlurmdTimeout=300
MinJobAge=600
KillWait=5
InactiveLimit=0
NodeName=$HOST NodeAddr=127.0.0.1 $hw State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
mv "$CONF.new" "$CONF"

# --- daemons (a running one from an earlier call is reconfigured, not restarted)
running() { [[ -f $STATE_DIR/$1.pid ]] && kill -0 "$(cat "$STATE_DIR/$1.pid")" 2>/dev/null; }
if running slurmctld; then
  scontrol reconfigure || true
else
  log "starting slurmctld"
  slurmctld -i || die "slurmctld did not start"
fi
for _ in $(seq 50); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
scontrol ping 2>/dev/null | grep -q UP || die "slurmctld does not answer scontrol ping"
if ! running slurmd; then
  log "starting slurmd"
  slurmd || die "slurmd did not start"
fi

deadline=$((SECONDS + TIMEOUT))
while ((SECONDS < deadline)); do
  state="$(node_state)"
  case "$state" in
    idle* | mixed* | alloc*) log "up: node $HOST is $state"; sinfo >&2; exit 0 ;;
    down* | drain*) scontrol update nodename="$HOST" state=resume 2>/dev/null || true ;;
  esac
  sleep 1
done
die "node $HOST did not become idle within ${TIMEOUT}s (state: '$(node_state)'; \
$(scontrol show node "$HOST" 2>&1 | grep -o 'Reason=.*' || true))"
