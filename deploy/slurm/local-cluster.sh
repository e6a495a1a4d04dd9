#!/usr/bin/env bash
# A two-node Slurm cluster on this one host, for CI and for trying deploy/slurm/train.sbatch without a cluster.
#
#   deploy/slurm/local-cluster.sh start    install (apt) when missing, configure, start, wait until both nodes answer
#   deploy/slurm/local-cluster.sh status   sinfo and the daemons' pids
#   deploy/slurm/local-cluster.sh stop     stop slurmd n1/n2, slurmctld and the munged this script started
#
# The recipe is the one measured in ENVIRONMENT.md ("Slurm", 2026-12-01): Debian bookworm's slurm-wlm 22.05 and
# munge, slurm.conf with proctrack/linuxproc and task/none (no cgroup setup needed: these machines run without
# systemd, in a sandbox whose cgroup tree Slurm cannot manage), select/cons_tres, SlurmUser=root, and two slurmd
# daemons on one host told apart by -N and their Port (Slurm's "multiple slurmd" layout, which Debian builds
# without --enable-multiple-slurmd need not have: NodeAddr + a distinct Port per NodeName is enough for 22.05).
# Everything Slurm writes (state, spool, logs, pids) goes under ROCMFT_SLURM_DIR (default /var/tmp/rocmft-slurm).
# The configuration is written to /etc/slurm/slurm.conf, where sinfo/sbatch/srun look by default (man slurm.conf:
# the file's location is set at build time or by SLURM_CONF), so that a plain `sbatch` works as on a real cluster;
# an existing slurm.conf this script did not write is never replaced.
#
# Root only: the daemons run as root (SlurmUser=root) and apt installs the packages. As another user it prints why
# and exits 0 with "skipped", so `make test` still runs everything else (tests/test_slurm.py then skips).
set -euo pipefail

ROOT=${ROCMFT_SLURM_DIR:-/var/tmp/rocmft-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by rocmft deploy/slurm/local-cluster.sh"
NODES=(n1 n2)
PORTS=(17001 17002)
# Each node: 2 CPUs and 8 GiB, enough for two tasks of one CPU (task mode, --ntasks-per-node=2). Both nodes share
# this host's cores and memory, so the cluster overcommits them; config_overrides makes slurmd report the
# configured values instead of draining a node whose hardware is smaller than slurm.conf says
# (man slurm.conf, SlurmdParameters=config_overrides).
CPUS=2
MEMORY_MB=8192
# Long enough that `scontrol show job` still answers for a job that ended (state, exit code): without slurmdbd
# there is no sacct, and Slurm forgets a finished job MinJobAge seconds after it ends (man slurm.conf, default 300).
MIN_JOB_AGE=3600
WAIT_S=${ROCMFT_SLURM_WAIT_S:-90}

say() { echo "local-cluster: $*"; }

usage() {
  echo "usage: $0 {start|stop|status}" >&2
  exit 2
}

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sinfo >/dev/null; then
    return
  fi
  say "installing slurm-wlm and munge from Debian's archive"
  flock "${APT_LOCK:-/tmp/rocmft-apt.lock}" sh -c 'apt-get update -q &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurm-wlm munge'
}

# Node names resolve through /etc/hosts, as a real cluster's names resolve through its DNS or hosts file: the job
# layout's rendezvous host is the first name of SLURM_STEP_NODELIST (rocmft.facts.scheduler.first_host), `n1`, and
# torch's TCPStore connects to that name. Mapping n1 and n2 to 127.0.0.1 (where both slurmd listen, NodeAddr) is the
# least surprising way: every program on the host (torch, ping, ssh) sees the same names, nothing in rocmft or the
# job script special-cases the local cluster, and a job runs exactly as it would on real nodes.
ensure_hosts() {
  local name missing=()
  for name in "${NODES[@]}"; do
    getent hosts "$name" >/dev/null || missing+=("$name")
  done
  if ((${#missing[@]})); then
    say "adding ${missing[*]} to /etc/hosts (127.0.0.1, where the local slurmd daemons listen)"
    echo "127.0.0.1 ${missing[*]} $MARK" >>/etc/hosts
  fi
}

write_config() {
  if [[ -e $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
    say "$CONF exists and was not written by this script: not replacing it (is another Slurm configured here?)" >&2
    exit 1
  fi
  mkdir -p /etc/slurm "$ROOT"/{state,log,run} "$ROOT"/spool/{n1,n2}
  local host
  host=$(hostname)
  cat >"$CONF.new" <<EOF
$MARK (a two-node cluster on one host)
ClusterName=rocmft-local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$ROOT/state
SlurmdSpoolDir=$ROOT/spool/%n
SlurmctldPidFile=$ROOT/run/slurmctld.pid
SlurmdPidFile=$ROOT/run/slurmd-%n.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd-%n.log
SlurmctldPort=16817
# linuxproc tracks a step's processes by parent pid, task/none binds nothing: neither needs cgroups
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
MinJobAge=$MIN_JOB_AGE
# a node whose slurmd stopped (local-cluster.sh stop) is back in service when its slurmd registers again
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[0]} CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=${PORTS[1]} CPUs=$CPUS RealMemory=$MEMORY_MB State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  mv "$CONF.new" "$CONF"
}

start_munge() {
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    return
  fi
  if [[ ! -s /etc/munge/munge.key ]]; then
    say "writing /etc/munge/munge.key"
    mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=128 status=none
  fi
  chown root:root /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown root:root /run/munge /var/lib/munge /var/log/munge
  # as root, with the key owned by root (ENVIRONMENT.md): no systemd here to start it as the munge user
  munged --force --pid-file="$ROOT/run/munged.pid" --socket=/run/munge/munge.socket.2
  for _ in $(seq 20); do
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && return
    sleep 0.5
  done
  say "munged does not answer (munge -n | unmunge)" >&2
  exit 1
}

show_logs() {
  local log
  for log in "$ROOT"/log/*.log; do
    [[ -f $log ]] || continue
    echo "----- last lines of $log"
    tail -n 25 "$log"
  done
}

start() {
  if [[ $(id -u) -ne 0 ]]; then
    say "skipped: the daemons run as root (SlurmUser=root) and apt installs the packages; run as root to start it"
    exit 0
  fi
  install_packages
  ensure_hosts
  write_config
  start_munge
  pid_alive "$ROOT/run/slurmctld.pid" || slurmctld
  local i
  for i in "${!NODES[@]}"; do
    pid_alive "$ROOT/run/slurmd-${NODES[i]}.pid" || slurmd -N "${NODES[i]}"
  done
  local deadline=$((SECONDS + WAIT_S)) up down
  while ((SECONDS < deadline)); do
    # idle on a fresh start; allocated/mixed/completing when `start` runs again while jobs run (idempotent)
    up=$(sinfo --noheader --responding --states=idle,allocated,mixed,completing --Node --format=%N 2>/dev/null \
      | sort -u | tr '\n' ' ')
    if [[ $up == "n1 n2 " ]]; then
      say "ready: n1 and n2 up ($CONF, state and logs in $ROOT)"
      return
    fi
    # a node slurmctld set down (its slurmd was stopped, or did not answer in time) is resumed by hand
    down=$(sinfo --noheader --responding --states=down,drain --Node --format=%N 2>/dev/null | sort -u | paste -sd,)
    [[ -z $down ]] || scontrol update nodename="$down" state=resume || true
    sleep 1
  done
  say "n1 and n2 are not both up after ${WAIT_S}s:" >&2
  sinfo --Node --long >&2 || true
  show_logs >&2
  exit 1
}

stop() {
  if [[ $(id -u) -ne 0 ]]; then
    say "skipped: not root"
    exit 0
  fi
  local pidfile
  for pidfile in "$ROOT"/run/slurmd-*.pid "$ROOT/run/slurmctld.pid" "$ROOT/run/munged.pid"; do
    if pid_alive "$pidfile"; then
      kill "$(cat "$pidfile")"
      say "stopped $(basename "$pidfile" .pid)"
    fi
  done
}

status() {
  local pidfile
  for pidfile in "$ROOT"/run/*.pid; do
    [[ -e $pidfile ]] || continue
    if pid_alive "$pidfile"; then
      echo "$(basename "$pidfile" .pid): running (pid $(cat "$pidfile"))"
    else
      echo "$(basename "$pidfile" .pid): not running"
    fi
  done
  sinfo --Node --long
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) usage ;;
esac
