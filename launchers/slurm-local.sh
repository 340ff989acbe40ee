#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, from Debian's packages, to run lorabench's SLURM
# path (hydra/launcher=slurm) end to end: submission, sacct, requeue and preemption, failures.
#
#   sudo launchers/slurm-local.sh up       # install if missing (apt-get), start munge, slurmdbd, slurmctld, slurmd
#   sudo launchers/slurm-local.sh status   # sinfo and the daemons
#   sudo launchers/slurm-local.sh down     # stop the daemons (the packages stay installed)
#
# The cluster: one node (this host) in partition `cpu`, all its cores, its memory less 2 GiB for the
# system; accounting through slurmdbd and a local MariaDB, so `sacct` lists the jobs; daemons run as
# root, with no cgroups (containers often have none). With it up, a multirun needs only:
#   python train.py -m hydra/launcher=slurm hydra.launcher.partition=cpu hydra.launcher.gpus_per_node=0 \
#       hydra.launcher.cpus_per_task=1 hydra.launcher.mem_gb=4 seq_len=64,96 batch=2,4 train.max_steps=8
# (launchers/README.md). Root is needed: it writes /etc/slurm and starts system daemons.
set -euo pipefail
state=/var/lib/lorabench-slurm
log=$state/log
host=$(hostname -s)

need_root() { [ "$(id -u)" = 0 ] || { echo "slurm-local.sh: run as root (it installs packages and starts daemons)" >&2; exit 2; }; }

install() {
  command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v mariadbd >/dev/null && return
  echo "installing slurm-wlm, slurmdbd, munge and mariadb-server (Debian packages)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server >/dev/null
}

write_conf() {
  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 2048 ))  # MiB, 2 GiB left to the system
  mkdir -p /etc/slurm "$state/ctld" "$state/d" "$log"
  cat > /etc/slurm/slurm.conf <<EOF
# Written by lorabench's launchers/slurm-local.sh: a one-node cluster on $host.
ClusterName=lorabench
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$log/slurmctld.log
SlurmdLogFile=$log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$host
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=5
# A requeued job (scontrol requeue, preemption, submitit's time-limit requeue) may start again at once.
JobRequeue=1
KillWait=30
SchedulerType=sched/backfill
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=300
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=cpu Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
  cat > /etc/slurm/slurmdbd.conf <<EOF
AuthType=auth/munge
DbdHost=$host
SlurmUser=root
PidFile=$state/slurmdbd.pid
LogFile=$log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=lorabench-local
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
}

wait_for() {  # seconds, description, command...
  local n=$1 what=$2; shift 2
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "slurm-local.sh: $what did not come up in $n s (logs: $log)" >&2; return 1
}

up() {
  need_root
  install
  write_conf
  mkdir -p /run/munge && chown munge:munge /run/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null;
                                   chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
  wait_for 10 munge munge -n
  if ! pgrep -x mariadbd >/dev/null; then
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    (mariadbd --user=mysql --skip-networking=0 --bind-address=127.0.0.1 >"$log/mariadb.log" 2>&1 &)
    wait_for 30 MariaDB mysqladmin ping
  fi
  mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'lorabench-local';
            CREATE DATABASE IF NOT EXISTS slurm_acct_db; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
  pgrep -x slurmdbd >/dev/null || slurmdbd
  wait_for 30 slurmdbd sacctmgr -i list cluster
  sacctmgr -i -Q add cluster lorabench >/dev/null 2>&1 || true
  pgrep -x slurmctld >/dev/null || slurmctld
  wait_for 30 slurmctld scontrol ping
  pgrep -x slurmd >/dev/null || slurmd
  wait_for 30 "node $host" bash -c "sinfo -h -N -o %t | grep -Eq '^(idle|mix|alloc)'"
  status
}

stop() {  # a daemon by name, waiting until it has exited (a second `up` right after must not see it)
  pkill -x "$1" 2>/dev/null || return 0
  for _ in $(seq 30); do pgrep -x "$1" >/dev/null || return 0; sleep 0.5; done
  pkill -9 -x "$1" 2>/dev/null || true
}

down() {
  need_root
  for d in slurmd slurmctld slurmdbd; do stop $d; done
  mysqladmin shutdown >/dev/null 2>&1 || true
  stop mariadbd
  stop munged
  echo "slurm-local: stopped"
}

status() {
  if scontrol ping >/dev/null 2>&1; then
    sinfo
    echo "daemons: $(for d in munged mariadbd slurmdbd slurmctld slurmd; do pgrep -x $d >/dev/null && printf '%s ' $d; done)"
  else
    echo "slurm-local: not running (start it with: sudo launchers/slurm-local.sh up)"
    return 1
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: launchers/slurm-local.sh up|down|status" >&2; exit 2 ;;
esac
