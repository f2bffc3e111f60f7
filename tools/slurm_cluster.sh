#!/usr/bin/env bash
# A one-machine Slurm cluster for trying and testing examples/slurm/ (Debian's slurmctld, slurmd
# and munge; tools/setup.sh installs them when missing, nothing else is installed).
#
#   tools/slurm_cluster.sh start    # writes a config, starts munged, slurmctld, slurmd; waits
#                                   # until the node is idle; prints the line to export
#   tools/slurm_cluster.sh status   # sinfo of the cluster; exit 0 if it is up, 3 if not
#   tools/slurm_cluster.sh stop     # kills the daemons, removes config, key, state and logs
#
# then, in the shell that submits:
#   export SLURM_CONF=/tmp/gossipcc-slurm/slurm.conf    # what `start` prints
#   sbatch --nodes=1 --ntasks=4 --ntasks-per-node=4 --wait examples/slurm/train.sbatch
#
# The cluster: one node named after this host (`hostname -s`) declaring CPUs=4 (the
# GOSSIPCC_SLURM_CPUS variable; more slots than cores is fine: SlurmdParameters=config_overrides
# makes slurmctld trust the declared count), one partition "debug" (the default),
# select/cons_tres with CR_CPU, proctrack/pgid, task/none, no cgroups, no accounting.
# Everything lives under one directory (GOSSIPCC_SLURM_DIR, default /tmp/gossipcc-slurm):
# slurm.conf, a freshly generated munge key and munge's socket, slurmctld's state, slurmd's
# spool, pid files and logs. It uses its own ports (GOSSIPCC_SLURM_PORT and the next one,
# default 16817-16818) and its own munge socket, so a system Slurm or munge on this host is
# neither needed nor touched; clients find the cluster through SLURM_CONF only.
#
# Needs root (slurmd starts job steps as the submitting user). Idempotent: `start` on a healthy
# cluster says so and returns; `start` over the remains of a broken one stops it first;
# `stop` with nothing running returns 0. A failed `start` stops whatever it had started (trap)
# and prints the daemons' log tails, so no daemon outlives it.
#
# Exit codes: 0 ok; 1 error (the message says which and shows the logs); 3 (status) not
# running; 77 this machine cannot run the cluster (not root, or a daemon refused to start for
# a reason of the machine: permissions, kernel limits) -- one line on stderr says why, and
# tests skip with that line.
set -euo pipefail

DIR=${GOSSIPCC_SLURM_DIR:-/tmp/gossipcc-slurm}
CPUS=${GOSSIPCC_SLURM_CPUS:-4}
CTLD_PORT=${GOSSIPCC_SLURM_PORT:-16817}
SLURMD_PORT=$((CTLD_PORT + 1))
START_TIMEOUT_S=${GOSSIPCC_SLURM_START_TIMEOUT_S:-30}
CANNOT_RUN=77
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HOST=$(hostname -s)
export PATH="$PATH:/usr/sbin:/sbin"   # slurmctld, slurmd, munged; test environments may lack it

say() { echo "slurm_cluster: $*" >&2; }

# pid_of NAME: the pid in NAME's pid file if that process is alive, is NAME and is this
# cluster's (its command line names DIR): pids are reused, and a system munged may run.
pid_of() {
  local f="$DIR/run/$1.pid" pid
  [ -s "$f" ] || return 1
  pid=$(tr -dc '0-9' <"$f")
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -F -- "$1" | grep -q -F -- "$DIR/" || return 1
  echo "$pid"
}

kill_daemon() {  # kill_daemon NAME: SIGTERM, up to 10 s, then SIGKILL
  local pid i
  pid=$(pid_of "$1") || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  say "$1 (pid $pid) ignored SIGTERM for 10 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
}

descendants() {  # descendants PID: every process below PID
  ps -eo pid=,ppid= | awk -v root="$1" '
    { parent[$1] = $2 }
    END { n = 1; q[1] = root
          for (i = 1; i <= n; i++) for (p in parent) if (parent[p] == q[i]) { q[++n] = p; print p } }'
}

# Kills what runs as this cluster's daemons, job steps first (slurmstepd and the tasks it
# started belong to the job; slurmd's stop does not end them), then removes the directory.
MARKER=.gossipcc-slurm-cluster   # in DIR: what `stop` may delete is ours

do_stop() {
  local pid
  if [ -d "$DIR" ] && [ ! -e "$DIR/$MARKER" ] && [ -n "$(ls -A "$DIR")" ]; then
    say "$DIR is not a directory of this script (no $MARKER); leaving it alone"
    exit 1
  fi
  if [ -d "$DIR" ] && pid=$(pid_of slurmctld) && [ -r "$DIR/slurm.conf" ]; then
    SLURM_CONF="$DIR/slurm.conf" timeout 10 scancel --quiet --user="$(id -un)" 2>/dev/null || true
  fi
  # slurmstepd processes of this cluster (their command line has no config path, but their
  # environment names this cluster's SLURM_CONF: slurmd passes its own) and the tasks under
  # them, collected before any is killed (killed, a stepd's tasks would move to init).
  local p victims=()
  for p in $(pgrep -x slurmstepd 2>/dev/null || true); do
    if { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "SLURM_CONF=$DIR/slurm.conf"; then
      victims+=("$p" $(descendants "$p"))
    fi
  done
  if [ ${#victims[@]} -gt 0 ]; then kill -KILL "${victims[@]}" 2>/dev/null || true; fi
  kill_daemon slurmd
  kill_daemon slurmctld
  kill_daemon munged
  rm -rf "$DIR"
}

log_tails() {
  local f
  for f in "$DIR"/log/*.log; do
    [ -s "$f" ] || continue
    echo "--- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
}

# A daemon that exited during start: the machine's fault (exit 77, one line) when its log
# says permission/kernel trouble, else ours (exit 1 with the logs).
daemon_died() {  # daemon_died NAME
  local log="$DIR/log/$1.log" reason
  reason=$(grep -E -i 'operation not permitted|permission denied|not supported|cannot allocate|cgroup|setrlimit|capabilit' "$log" 2>/dev/null \
    | tail -n 1 | sed -E 's/^\[[^]]*\] *//; s/^[0-9-]+ [0-9:]+ [+0-9]+ *//' || true)
  if [ -n "$reason" ]; then
    FAIL_CODE=$CANNOT_RUN
    echo "slurm_cluster: $1 cannot run on this machine: ${reason}" >&2
  else
    say "$1 exited during start (log: $log)"
    log_tails
  fi
  exit "${FAIL_CODE:-1}"
}

write_config() {
  mkdir -p "$DIR"/{etc,munge,run,log,ctld_state,slurmd_spool,tmp}
  : >"$DIR/$MARKER"
  chmod 0700 "$DIR/etc"
  chmod 0755 "$DIR" "$DIR/munge"
  mungekey --create --keyfile="$DIR/etc/munge.key" --bits=1024 >/dev/null 2>&1 \
    || { say "mungekey failed"; exit 1; }
  chmod 0400 "$DIR/etc/munge.key"
  : >"$DIR/etc/plugstack.conf"
  cat >"$DIR/slurm.conf" <<EOF
# Written by tools/slurm_cluster.sh for a one-machine test cluster; removed by its stop.
ClusterName=gossipcc
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=${DIR}/munge/munge.socket
StateSaveLocation=${DIR}/ctld_state
SlurmdSpoolDir=${DIR}/slurmd_spool
SlurmctldPidFile=${DIR}/run/slurmctld.pid
SlurmdPidFile=${DIR}/run/slurmd.pid
SlurmctldLogFile=${DIR}/log/slurmctld.log
SlurmdLogFile=${DIR}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
TmpFS=${DIR}/tmp
PlugStackConfig=${DIR}/etc/plugstack.conf
# No cgroups, no accounting: nothing that needs more of the kernel than a container gives.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The node declares more CPUs than this machine may have; trust the declaration.
SlurmdParameters=config_overrides
ReturnToService=2
# sbatch --wait polls the job every 2 s, 8 s, 32 s... while the interval is below MinJobAge/2
# (so a finished job is not purged before it looks): at MinJobAge=30 it polls at 2, 10, 42 s
# (the default, 300, as sparsely); at 5 every 2 s.
MinJobAge=5
KillWait=5
NodeName=${HOST} NodeAddr=127.0.0.1 CPUs=${CPUS} State=UNKNOWN
PartitionName=debug Nodes=${HOST} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

node_state() {
  SLURM_CONF="$DIR/slurm.conf" timeout 5 sinfo --noheader --Node --nodes="$HOST" --format=%T 2>/dev/null \
    | head -n 1 | tr -d ' *'
}

is_up() {
  [ -r "$DIR/slurm.conf" ] && pid_of munged >/dev/null && pid_of slurmctld >/dev/null \
    && pid_of slurmd >/dev/null && [ -n "$(node_state)" ]
}

# start_daemon NAME COMMAND...: runs it (it daemonises and writes its pid file); fails if the
# pid file does not name a live NAME within 10 s.
start_daemon() {
  local name=$1 i; shift
  "$@" >>"$DIR/log/$name.start.log" 2>&1 || { cat "$DIR/log/$name.start.log" >>"$DIR/log/$name.log"; daemon_died "$name"; }
  for i in $(seq 100); do
    pid_of "$name" >/dev/null && return 0
    sleep 0.1
  done
  cat "$DIR/log/$name.start.log" >>"$DIR/log/$name.log" 2>/dev/null || true
  daemon_died "$name"
}

do_start() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "slurm_cluster: needs root (slurmd runs job steps as the submitting user); running as $(id -un)" >&2
    exit $CANNOT_RUN
  fi
  if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null \
      || ! command -v munged >/dev/null || ! command -v mungekey >/dev/null; then
    say "Slurm or munge missing; installing them with tools/setup.sh"
    "$HERE/setup.sh"
  fi
  if is_up; then
    say "already running (${DIR}); export SLURM_CONF=${DIR}/slurm.conf"
    echo "export SLURM_CONF=${DIR}/slurm.conf"
    return 0
  fi
  do_stop   # the remains of an earlier cluster, if any
  FAIL_CODE=1
  trap 'rc=$?; if [ $rc -ne 0 ]; then do_stop; fi' EXIT
  trap 'exit 130' INT TERM
  write_config
  export SLURM_CONF="$DIR/slurm.conf"

  start_daemon munged munged --key-file="$DIR/etc/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/run/munged.seed" --force
  start_daemon slurmctld slurmctld -f "$SLURM_CONF"
  start_daemon slurmd slurmd -f "$SLURM_CONF" -N "$HOST"

  local deadline=$((SECONDS + START_TIMEOUT_S)) state=""
  while [ $SECONDS -lt $deadline ]; do
    for d in munged slurmctld slurmd; do pid_of "$d" >/dev/null || daemon_died "$d"; done
    state=$(node_state)
    case "$state" in
      idle) break ;;
    esac
    sleep 0.3
  done
  if [ "$state" != idle ]; then
    say "node ${HOST} not idle after ${START_TIMEOUT_S} s (state: '${state:-none}')"
    log_tails
    exit 1
  fi
  trap - EXIT INT TERM
  say "up: node ${HOST}, ${CPUS} CPUs, partition debug (${DIR})"
  echo "export SLURM_CONF=${DIR}/slurm.conf"
}

do_status() {
  if is_up; then
    SLURM_CONF="$DIR/slurm.conf" sinfo --Node --long
    echo "export SLURM_CONF=${DIR}/slurm.conf"
    return 0
  fi
  local d
  for d in munged slurmctld slurmd; do
    if [ -d "$DIR" ] && p=$(pid_of "$d"); then say "$d running (pid $p)"; fi
  done
  say "not running (${DIR})"
  return 3
}

case "${1:-}" in
  start) do_start ;;
  stop) do_stop ;;
  status) do_status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
