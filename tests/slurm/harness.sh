#!/usr/bin/env bash
# A real SLURM on one host, for the tests under tests/slurm/ (Debian/Ubuntu, run as root).
#
#   bash tests/slurm/harness.sh up       # install if needed, start munged, slurmctld, slurmd(s)
#   eval "$(bash tests/slurm/harness.sh env)"   # point sbatch/squeue/scontrol at it
#   bash tests/slurm/harness.sh status
#   bash tests/slurm/harness.sh down     # cancel jobs, stop what `up` started (by PID)
#
# Emulates N nodes with one slurmd each (own name, port and spool) on 127.0.0.1; the node names
# go into /etc/hosts so that a rank can reach the first node as its rendezvous. Fake GPUs are
# GRES backed by dummy character devices (AutoDetect=off); `SlurmdParameters=config_overrides`
# lets a 2-core machine advertise more CPUs and GPUs than it has. No cgroups, no systemd, no
# accounting database (so no sacct: poll squeue, which keeps ended jobs for MinJobAge).
# Three partitions on the same nodes: debug (the default; preempted jobs are requeued), spot
# (preempted jobs are cancelled) and urgent (preempts both).
#
# The cluster is self-contained: its config lives under $FID_SLURM_ROOT/etc (SLURM_CONF), its
# daemons use their own ports, and `down` stops only the daemons it started. Only munged is
# shared (one per host; reused if running), and /etc/slurm/slurm.conf: Snakemake's SLURM
# plugin strips SLURM_CONF from the jobs it starts, so an `srun` inside them finds only the
# default path. `up` links that path to this cluster's config when it is free (never over a
# real file) and `down` removes the link if it is ours; `status` says where it points.
#
# Tunables (environment):
#   FID_SLURM_ROOT           config, state, logs, spool       (default /tmp/fid-slurm)
#   FID_SLURM_NODES          emulated nodes                   (default 2: fidnode1, fidnode2)
#   FID_SLURM_CPUS           CPUs advertised per node         (default 4)
#   FID_SLURM_GPUS           fake GPUs per node (0: none)     (default 2)
#   FID_SLURM_MEM_MB         RealMemory per node              (default 4096)
#   FID_SLURM_PORT           slurmctld port; slurmds follow   (default 6917)
#   FID_SLURM_REQUEUE_DELAY  seconds a requeued job is held   (default 120, SLURM's own)
#   FID_SLURM_KILL_WAIT      KillWait: SIGTERM to SIGKILL      (default 30, SLURM's own)
#   FID_SLURM_GRACE_TIME     GraceTime of partition debug      (default 30)
#   FID_SLURM_NO_INSTALL=1   never apt-get install (fail instead)
set -euo pipefail

ROOT=${FID_SLURM_ROOT:-/tmp/fid-slurm}
NNODES=${FID_SLURM_NODES:-2}
CPUS=${FID_SLURM_CPUS:-4}
NGPU=${FID_SLURM_GPUS:-2}
MEM_MB=${FID_SLURM_MEM_MB:-4096}
PORT=${FID_SLURM_PORT:-6917}
REQUEUE_DELAY=${FID_SLURM_REQUEUE_DELAY:-120}
KILL_WAIT=${FID_SLURM_KILL_WAIT:-30}
GRACE_TIME=${FID_SLURM_GRACE_TIME:-30}
CONF=$ROOT/etc/slurm.conf
DEFAULT_CONF=/etc/slurm/slurm.conf
HOSTS_TAG="# fid-slurm-harness"
export SLURM_CONF=$CONF

NODES=()
for i in $(seq 1 "$NNODES"); do NODES+=("fidnode$i"); done
NODELIST=$(IFS=,; echo "${NODES[*]}")

say() { echo "[harness] $*" >&2; }
die() { say "$*"; exit 1; }

need_root() { [ "$(id -u)" -eq 0 ] || die "must run as root (slurmd runs jobs as root here)"; }

install() {
  local missing=()
  for cmd in slurmctld slurmd sbatch munged; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
  [ "${#missing[@]}" -eq 0 ] && return 0
  [ "${FID_SLURM_NO_INSTALL:-0}" = 1 ] && die "missing ${missing[*]} and FID_SLURM_NO_INSTALL=1"
  command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
  say "installing slurmctld slurmd slurm-client munge with apt-get"
  apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >"$ROOT/apt.log" 2>&1 \
    || { tail -n 20 "$ROOT/apt.log" >&2; die "apt-get install failed"; }
}

configure() {
  local i=0 node gres gpus="" nodes="" first last d
  mkdir -p "$ROOT"/{etc,state,log,dev}
  for node in "${NODES[@]}"; do
    mkdir -p "$ROOT/spool/$node"
    gres=""
    if [ "$NGPU" -gt 0 ]; then
      first=$((i * NGPU)) last=$((i * NGPU + NGPU - 1))
      # SLURM 22.05 ignores GPUs without a device file: char devices 1,3 (what /dev/null is).
      for d in $(seq "$first" "$last"); do
        [ -c "$ROOT/dev/gpu$d" ] || { rm -f "$ROOT/dev/gpu$d"; mknod "$ROOT/dev/gpu$d" c 1 3; }
      done
      gpus+="NodeName=$node Name=gpu Type=fake File=$ROOT/dev/gpu[$first-$last]"$'\n'
      gres="Gres=gpu:fake:$NGPU"
    fi
    nodes+="NodeName=$node NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT + 1 + i))"
    nodes+=" CPUs=$CPUS RealMemory=$MEM_MB $gres State=UNKNOWN"$'\n'
    i=$((i + 1))
  done
  printf 'AutoDetect=off\n%s' "$gpus" >"$ROOT/etc/gres.conf"
  cat >"$CONF" <<EOF
# Written by tests/slurm/harness.sh; rewritten at every \`up\`.
ClusterName=fidtest
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire is also how long a requeued job is held before it may start again.
AuthInfo=cred_expire=$REQUEUE_DELAY
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool/%n
SlurmctldPidFile=$ROOT/slurmctld.pid
SlurmdPidFile=$ROOT/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
# squeue shows ended jobs (and their exit codes) this long: there is no sacct here.
MinJobAge=600
# SIGTERM to SIGKILL at a time limit, scancel or requeue: 30 s is SLURM's default and most
# clusters'.
KillWait=$KILL_WAIT
InactiveLimit=0
# Preemption by partition priority, as on clusters with a scavenger/spot partition: a job in
# 'urgent' (PriorityTier 10) takes the nodes of jobs in 'debug' (requeued; SIGTERM, then
# GRACE_TIME seconds before SIGKILL and the requeue) or 'spot' (cancelled: GraceTime 0, SLURM's
# default, so the job ends PREEMPTED at once and its tasks get SIGTERM, SIGKILL after KillWait).
# 'spot' takes jobs of at most 30 minutes (a longer one pends for PartitionTimeLimit).
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$([ "$NGPU" -gt 0 ] && echo GresTypes=gpu || true)
${nodes}PartitionName=debug Nodes=$NODELIST Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE_TIME
PartitionName=spot Nodes=$NODELIST MaxTime=30 State=UP PriorityTier=1 PreemptMode=CANCEL GraceTime=0
PartitionName=urgent Nodes=$NODELIST MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
EOF
  # srun inside Snakemake's jobs reads only the default path (see the header)
  if [ ! -e "$DEFAULT_CONF" ] || [ "$(readlink "$DEFAULT_CONF")" = "$CONF" ]; then
    mkdir -p "$(dirname "$DEFAULT_CONF")" && ln -sfn "$CONF" "$DEFAULT_CONF"
  fi
  # The emulated nodes' names must resolve: the first one is the ranks' rendezvous.
  if ! grep -q "$HOSTS_TAG" /etc/hosts; then
    echo "127.0.0.1 ${NODES[*]} $HOSTS_TAG" >>/etc/hosts
  fi
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  munge_works && return 0
  [ -s /etc/munge/munge.key ] || mungekey --create --force
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge/munge.key
  chmod 0755 /run/munge
  chmod 0400 /etc/munge/munge.key
  runuser -u munge -- /usr/sbin/munged || die "munged did not start"
  cp /run/munge/munged.pid "$ROOT/munged.pid"  # ours: `down` stops it
  for _ in $(seq 50); do munge_works && return 0; sleep 0.1; done
  die "munged does not answer"
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

idle_nodes() { sinfo -h -t idle -o %D 2>/dev/null | awk '{n += $1} END {print n + 0}'; }

up() {
  local t0=$SECONDS node
  need_root
  mkdir -p "$ROOT"
  install
  configure
  start_munge
  # A fresh start forgets the jobs of an earlier session (job ids restart at 1, and a slurmd
  # must not remember their credentials as revoked).
  if ! alive "$ROOT/slurmctld.pid"; then
    rm -rf "${ROOT:?}/state"/*
    slurmctld -f "$CONF" || die "slurmctld did not start"
  fi
  for node in "${NODES[@]}"; do
    if ! alive "$ROOT/slurmd-$node.pid"; then
      rm -rf "${ROOT:?}/spool/$node"/*
      slurmd -f "$CONF" -N "$node" || die "slurmd $node did not start"
    fi
  done
  for _ in $(seq 120); do
    if [ "$(idle_nodes)" -eq "$NNODES" ]; then
      say "up in $((SECONDS - t0)) s: ${NODES[*]}, $CPUS CPUs, $NGPU fake GPUs, ${MEM_MB} MB each"
      return 0
    fi
    # A node seen before may come back DOWN or DRAINED: give it back to the scheduler.
    if sinfo -h -t down,drain,inval -o %N 2>/dev/null | grep -q .; then
      scontrol update nodename="$NODELIST" state=resume 2>/dev/null || true
    fi
    sleep 0.5
  done
  sinfo -N -l >&2 || true
  tail -n 15 "$ROOT"/log/*.log >&2 || true
  die "the nodes did not become idle within 60 s"
}

stop() {  # PIDFILE...: SIGTERM to all at once, then wait up to 10 s, then SIGKILL
  local f pid pids=()
  for f in "$@"; do
    pid=$(cat "$f" 2>/dev/null) || continue  # a daemon removes its own file as it stops
    rm -f "$f"
    kill "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 100); do
    [ "${#pids[@]}" -eq 0 ] && return 0
    local left=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && left+=("$pid"); done
    pids=("${left[@]+"${left[@]}"}")
    sleep 0.1
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

down() {
  if alive "$ROOT/slurmctld.pid"; then
    scancel --quiet --full --signal=KILL --user="$(id -un)" 2>/dev/null || true
    # Give the nodes a moment to kill the job steps before their slurmd goes.
    for _ in $(seq 20); do [ -z "$(squeue -h -t running,completing 2>/dev/null)" ] && break; sleep 0.5; done
  fi
  stop "$ROOT"/slurmd-*.pid "$ROOT/slurmctld.pid"
  stop "$ROOT/munged.pid"
  if [ -L "$DEFAULT_CONF" ] && [ "$(readlink "$DEFAULT_CONF")" = "$CONF" ]; then rm -f "$DEFAULT_CONF"; fi
  if grep -q "$HOSTS_TAG" /etc/hosts 2>/dev/null; then
    # Rewrite in place: /etc/hosts is often a bind mount that cannot be renamed over.
    grep -v "$HOSTS_TAG" /etc/hosts >"$ROOT/hosts.tmp" && cat "$ROOT/hosts.tmp" >/etc/hosts
    rm -f "$ROOT/hosts.tmp"
  fi
  say "down"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) alive "$ROOT/slurmctld.pid" || die "not running"; sinfo -N -o "%N %T %c %m %G"; squeue -t all
          echo "$DEFAULT_CONF -> $(readlink -f "$DEFAULT_CONF" 2>/dev/null || echo missing)" ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
