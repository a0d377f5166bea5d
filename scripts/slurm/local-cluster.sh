#!/usr/bin/env bash
# A one-machine SLURM cluster for the tests and for trying the sbatch scripts:
#   scripts/slurm/local-cluster.sh start    install (Debian, as root) if missing, configure, start, wait for the node
#   scripts/slurm/local-cluster.sh stop     stop the daemons it started
#   scripts/slurm/local-cluster.sh status   sinfo, or exit 1 when the cluster is down or its node drained
#   scripts/slurm/local-cluster.sh logs     the last lines of the daemons' logs (start shows them when it fails)
# Each is idempotent. The node is this machine with its real CPUs and memory, in one partition
# `cpu`. The config goes to /etc/slurm/slurm.conf, where every SLURM command looks; a slurm.conf
# this script did not write is a real cluster's and is never touched. Daemons run as root and keep
# their state, logs and pid files under $LWM_SLURM_STATE (default /var/lib/lwm-slurm).
set -euo pipefail

CONF=/etc/slurm/slurm.conf
MARK="# written by lwm scripts/slurm/local-cluster.sh"
STATE="${LWM_SLURM_STATE:-/var/lib/lwm-slurm}"
WAIT_S="${LWM_SLURM_WAIT_S:-60}"

die() { echo "local-cluster: $*" >&2; exit 1; }

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null &&
    command -v munged >/dev/null && return
  [ "$(id -u)" = 0 ] || die "SLURM is not installed and installing it needs root (apt-get install slurmctld slurmd slurm-client munge)"
  command -v apt-get >/dev/null || die "SLURM is not installed and there is no apt-get to install it with"
  echo "local-cluster: installing slurmctld slurmd slurm-client munge" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || die "apt-get update failed: no package source"
  # policy-rc.d 101: the packages' scripts start no daemon (this script does, with its own config)
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null ||
    { rm -f /usr/sbin/policy-rc.d; die "apt-get install slurmctld slurmd slurm-client munge failed"; }
  rm -f /usr/sbin/policy-rc.d
}

write_conf() {
  [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF" && die "$CONF exists and was not written by this script; not touching a real cluster's config"
  local host node
  host="$(hostname -s)"
  # the node as slurmd sees it (CPUs, sockets, cores, threads, RealMemory), under this host's name
  node="$(slurmd -C | head -1)"
  [[ "$node" == NodeName=* ]] || die "slurmd -C did not describe this machine: $node"
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
  cat >"$CONF.tmp" <<EOF
$MARK
ClusterName=lwm-local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
# a requeued job may start again once its old credential expired (default 120 s: the tests wait less)
AuthInfo=cred_expire=5
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
# seconds between SIGTERM and SIGKILL when a job is cancelled, requeued or preempted: a run saves meanwhile
# (more than SLURM's 30 on a loaded 2-core machine)
KillWait=60
MinJobAge=600
$node State=UNKNOWN
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$CONF.tmp" "$CONF"
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
  [ -s /etc/munge/munge.key ] || die "/etc/munge/munge.key is missing (the munge package makes it; reinstall munge)"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  running /run/munge/munged.pid || runuser -u munge -- munged
  for _ in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
  die "munged does not answer (see /var/log/munge/munged.log)"
}

node_idle() { [ "$(sinfo -h -N -o %T 2>/dev/null | head -1)" = idle ]; }
node_drained() { sinfo -h -N -o %T 2>/dev/null | head -1 | grep -q '^drain'; }
drain_reason() { sinfo -h -N -o %E 2>/dev/null | head -1; }

# SLURM drains a node on its own (its spool disk was full once, a job would not die) and keeps it
# drained after the cause is gone: every job then stays PENDING. The local node is put back in
# service, saying why it was out.
resume_drained() {
  node_drained || return 0
  echo "local-cluster: the node was drained ($(drain_reason)); resuming it" >&2
  scontrol update NodeName="$(sinfo -h -N -o %N | head -1)" State=RESUME
}

start() {
  if running "$STATE/slurmctld.pid" && running "$STATE/slurmd.pid" && node_idle; then sinfo; return; fi
  install_packages
  [ "$(id -u)" = 0 ] || die "starting slurmctld and slurmd needs root"
  write_conf
  start_munge
  running "$STATE/slurmctld.pid" || slurmctld
  running "$STATE/slurmd.pid" || slurmd
  resume_drained
  for _ in $(seq $((WAIT_S * 5))); do node_idle && { sinfo; return; }; sleep 0.2; done
  sinfo >&2 || true
  logs >&2 || true
  die "the node did not become idle within ${WAIT_S}s (logs above)"
}

logs() {
  # -n: with two files the old `tail -5` form is refused ("option used in invalid context")
  tail -n "${LWM_SLURM_LOG_LINES:-5}" "$STATE/slurmctld.log" "$STATE/slurmd.log"
}

stop_daemon() {
  local pidfile="$1"
  running "$pidfile" || return 0
  local pid
  pid="$(cat "$pidfile")"
  kill "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  die "$(basename "$pidfile" .pid) (pid $pid) did not stop in 10s"
}

stop() {
  stop_daemon "$STATE/slurmd.pid"
  stop_daemon "$STATE/slurmctld.pid"
  stop_daemon /run/munge/munged.pid
}

status() {
  running "$STATE/slurmctld.pid" && running "$STATE/slurmd.pid" || { echo "local-cluster: down" >&2; exit 1; }
  ! node_drained || { echo "local-cluster: the node is drained ($(drain_reason)); start resumes it" >&2; exit 1; }
  sinfo
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  logs) logs ;;
  *) die "usage: $0 start|stop|status|logs" ;;
esac
