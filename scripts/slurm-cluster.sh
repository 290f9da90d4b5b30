#!/usr/bin/env bash
# A multi-node Slurm cluster on this one machine, for the `slurm_cluster` tests and for trying
# runs that span nodes: slurmctld on the host and N slurmd (nodes c1..cN), each in its own network
# namespace with its own host name and address on a bridge, so that the tasks of one job on two
# nodes talk only over that network (never over a shared loopback), as on a real cluster.
#
#   scripts/slurm-cluster.sh start    start, as root; idempotent (restarts what a changed config needs)
#   scripts/slurm-cluster.sh stop     stop it, remove its namespaces and bridge (SLURM_CLUSTER_PURGE=1
#                                     also wipes its job state and accounting database)
#   scripts/slurm-cluster.sh status   exit 0 when every node accepts jobs
#
#   export SLURM_CONF=/etc/slurm-cluster/slurm.conf   # then sinfo, sbatch, scalectl use this cluster
#
# Adapted from the project's shared scripts slurm-cluster-start / slurm-cluster-stop (Slurm 22.05
# on Debian 12, no systemd, no cgroups).  Changes: one script with subcommands; accounting (its own
# MariaDB instance on 127.0.0.1:3307 and slurmdbd on 6829, so that `sacct` sees finished jobs); its
# own munged on its own socket; a check that network namespaces can be made (exit 3 with the reason
# when they cannot).  It shares nothing with the one-node cluster (scripts/slurm-local.sh), so that
# either can be started, stopped or purged while the other runs: own config (/etc/slurm-cluster),
# ports (slurmctld 6827, slurmd 6828, slurmdbd 6829, MariaDB 3307), state (/var/lib/slurm-cluster),
# logs (/var/log/slurm-cluster), pid files and sockets (/run/slurm-cluster); only the munge key
# file is read by both.
#
# Network: bridge scbr0 at 10.214.0.1 (the controller) and node ci at 10.214.0.(10+i), names in
# /etc/hosts (c1..c32, left there by stop).  No route, NAT or forwarding leaves the bridge: the
# nodes reach each other and the controller, nothing else.  Each node declares the machine's CPUs
# (they are shared, not split) and 1/N of 90% of its memory; the partition oversubscribes up to 4
# jobs per CPU, so that a job of 2 tasks per node runs on a 2-core machine beside another.
#
# Env: SLURM_CLUSTER_NODES (default 3, at most 32); SLURM_CLUSTER_WITH_DBD=0 skips accounting.
set -euo pipefail

N=${SLURM_CLUSTER_NODES:-3}
CONF_DIR=/etc/slurm-cluster; CONF=$CONF_DIR/slurm.conf
STATE=/var/lib/slurm-cluster; LOGS=/var/log/slurm-cluster; RUN=/run/slurm-cluster
BR=scbr0; NET=10.214.0; CTL_IP=$NET.1
MUNGE_SOCK=$RUN/munge/munge.socket
DB_PORT=3307; DBD_PORT=6829; DB_SOCK=$RUN/mysql/mysqld.sock
export SLURM_CONF=$CONF

T0=$(date +%s.%N)
log() { printf '[slurm-cluster %6.1fs] %s\n' "$(awk "BEGIN{print $(date +%s.%N) - $T0}")" "$*"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
need_root() { [ "$(id -u)" = 0 ] || { echo "slurm-cluster.sh $1: must run as root (it makes network namespaces and starts daemons)" >&2; exit 1; }; }
munge_ok() { munge --socket=$MUNGE_SOCK -n 2>/dev/null | unmunge --socket=$MUNGE_SOCK >/dev/null 2>&1; }

nodes_up() {   # how many nodes accept jobs
  command -v sinfo >/dev/null 2>&1 && [ -f $CONF ] || { echo 0; return; }
  sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 ~ /^(idle|mix|alloc|completing)/ {print $1}' | sort -u | wc -l
}

check_namespaces() {
  local why
  if ! why=$(unshare --net --uts true 2>&1); then
    echo "slurm-cluster.sh: network namespaces cannot be made here (unshare --net --uts: ${why:-refused}); the multi-node cluster needs them" >&2
    exit 3
  fi
  command -v ip >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1 || return 0
  if ! why=$( { ip link add scprobe0 type bridge && ip link del scprobe0; } 2>&1); then
    echo "slurm-cluster.sh: a network bridge cannot be made here (${why}); the multi-node cluster needs one" >&2
    exit 3
  fi
}

packages() {
  local PKGS="slurmctld slurmd slurm-client munge iproute2" missing="" p
  [ "${SLURM_CLUSTER_WITH_DBD:-1}" = 1 ] && PKGS="$PKGS slurmdbd mariadb-server"
  for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    log "installing:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  fi
}

start_munge() {   # its own munged on its own socket: stopping the one-node cluster's leaves this one
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge; dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
    chown munge:munge /etc/munge /etc/munge/munge.key; chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
  fi
  mkdir -p $RUN/munge $STATE/munge $LOGS/munge
  chown munge:munge $RUN/munge $STATE/munge $LOGS/munge; chmod 0755 $RUN/munge; chmod 0700 $STATE/munge $LOGS/munge
  if ! munge_ok; then
    alive $RUN/munge/munged.pid && kill "$(cat $RUN/munge/munged.pid)" && sleep 0.5
    rm -f $MUNGE_SOCK $MUNGE_SOCK.lock $RUN/munge/munged.pid
    runuser -u munge -- /usr/sbin/munged --socket=$MUNGE_SOCK --pid-file=$RUN/munge/munged.pid \
      --seed-file=$STATE/munge/munged.seed --log-file=$LOGS/munge/munged.log --key-file=/etc/munge/munge.key
    for _ in $(seq 50); do munge_ok && break; sleep 0.1; done
  fi
  munge_ok || { echo "munged did not start"; tail -5 $LOGS/munge/munged.log; exit 1; }
  log "munged up ($MUNGE_SOCK)"
}

start_network() {
  ip link show $BR >/dev/null 2>&1 || { ip link add $BR type bridge; ip addr add $CTL_IP/24 dev $BR; }
  ip link set $BR up
  local i ns
  for i in $(seq 1 "$N"); do
    ns=sc-c$i
    ip netns list | grep -qw "$ns" || ip netns add "$ns"
    if ! ip link show scv$i >/dev/null 2>&1; then
      ip link add scv$i type veth peer name scv${i}p
      ip link set scv${i}p netns "$ns"
      ip link set scv$i master $BR
    fi
    ip link set scv$i up
    ip netns exec "$ns" ip addr replace $NET.$((10 + i))/24 dev scv${i}p
    ip netns exec "$ns" ip link set scv${i}p up
    ip netns exec "$ns" ip link set lo up
  done
  grep -q '# slurm-cluster' /etc/hosts || {
    { echo "$CTL_IP scctl  # slurm-cluster"; for i in $(seq 1 32); do echo "$NET.$((10 + i)) c$i  # slurm-cluster"; done; } >> /etc/hosts; }
  log "network: bridge $BR ($CTL_IP), nodes c1..c$N at $NET.11..$NET.$((10 + N))"
}

start_accounting() {   # its own MariaDB instance and slurmdbd
  mkdir -p $STATE/mysql $LOGS/mysql $RUN/mysql; chown mysql:mysql $STATE/mysql $LOGS/mysql $RUN/mysql
  if [ ! -d $STATE/mysql/mysql ]; then
    mariadb-install-db --no-defaults --user=mysql --datadir=$STATE/mysql --auth-root-authentication-method=socket \
      --skip-test-db >/dev/null
  fi
  if ! mariadb-admin --no-defaults --socket=$DB_SOCK ping >/dev/null 2>&1; then
    setsid /usr/sbin/mariadbd --no-defaults --user=mysql --datadir=$STATE/mysql --socket=$DB_SOCK \
      --port=$DB_PORT --bind-address=127.0.0.1 --pid-file=$RUN/mysql/mysqld.pid --log-error=$LOGS/mysql/mysqld.log \
      --innodb-buffer-pool-size=16M --skip-name-resolve </dev/null >/dev/null 2>&1 &
    for _ in $(seq 300); do mariadb-admin --no-defaults --socket=$DB_SOCK ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
  mariadb-admin --no-defaults --socket=$DB_SOCK ping >/dev/null 2>&1 || { echo "MariaDB did not start"; tail -5 $LOGS/mysql/mysqld.log; exit 1; }
  mariadb --no-defaults --socket=$DB_SOCK -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpass';
      GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  cat > $CONF_DIR/slurmdbd.conf.new <<EOF
# generated by scalectl scripts/slurm-cluster.sh
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=slurmpass
StorageLoc=slurm_acct_db
LogFile=$LOGS/slurmdbd.log
PidFile=$RUN/slurmdbd.pid
EOF
  chmod 600 $CONF_DIR/slurmdbd.conf.new   # slurmdbd refuses a world-readable slurmdbd.conf
  local changed=0
  cmp -s $CONF_DIR/slurmdbd.conf.new $CONF_DIR/slurmdbd.conf || { mv $CONF_DIR/slurmdbd.conf.new $CONF_DIR/slurmdbd.conf; changed=1; }
  rm -f $CONF_DIR/slurmdbd.conf.new
  if alive $RUN/slurmdbd.pid && [ $changed = 1 ]; then kill "$(cat $RUN/slurmdbd.pid)"; while alive $RUN/slurmdbd.pid; do sleep 0.1; done; fi
  alive $RUN/slurmdbd.pid || slurmdbd   # reads slurmdbd.conf beside $SLURM_CONF
  for _ in $(seq 100); do timeout 5 sacctmgr -n show cluster >/dev/null 2>&1 && break; sleep 0.1; done
  timeout 5 sacctmgr -n show cluster >/dev/null 2>&1 || { echo "slurmdbd did not start"; tail -5 $LOGS/slurmdbd.log; exit 1; }
  log "accounting up (MariaDB 127.0.0.1:$DB_PORT, slurmdbd 127.0.0.1:$DBD_PORT)"
}

write_conf() {   # prints 1 when slurm.conf changed
  local HW CPUS MEM ACCT NODE_LINES i
  HW=$(slurmd -C | head -1)
  get() { echo "$HW" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
  CPUS=$(get CPUs); MEM=$(( $(get RealMemory) * 9 / 10 / N ))
  if [ "${SLURM_CLUSTER_WITH_DBD:-1}" = 1 ]; then
    ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK"
  else
    ACCT="AccountingStorageType=accounting_storage/none"
  fi
  NODE_LINES=$(for i in $(seq 1 "$N"); do echo "NodeName=c$i NodeAddr=$NET.$((10 + i)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"; done)
  mkdir -p $CONF_DIR $STATE/ctld $LOGS $RUN
  for i in $(seq 1 "$N"); do mkdir -p $STATE/d-c$i; done
  cat > $CONF.new <<EOF
# generated by scalectl scripts/slurm-cluster.sh
ClusterName=nscluster
SlurmctldHost=$(hostname -s)($CTL_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=5,socket=$MUNGE_SOCK
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$ACCT
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
SlurmdTimeout=20
KillWait=5
MailProg=/bin/true
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
SlurmctldPort=6827
SlurmdPort=6828
$NODE_LINES
PartitionName=debug Nodes=c[1-$N] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  if cmp -s $CONF.new $CONF; then rm -f $CONF.new; echo 0; else mv $CONF.new $CONF; echo 1; fi
}

start() {
  need_root start
  [ "$N" -ge 1 ] && [ "$N" -le 32 ] || { echo "SLURM_CLUSTER_NODES=$N: give 1..32" >&2; exit 2; }
  packages
  check_namespaces
  start_munge
  start_network
  mkdir -p $CONF_DIR $LOGS $RUN
  local changed i pidf up=0
  changed=$(write_conf)
  log "slurm.conf ok (changed=$changed)"
  if [ "${SLURM_CLUSTER_WITH_DBD:-1}" = 1 ]; then start_accounting; fi
  if alive $RUN/slurmctld.pid && [ "$changed" = 1 ]; then
    kill "$(cat $RUN/slurmctld.pid)"; while alive $RUN/slurmctld.pid; do sleep 0.1; done
  fi
  alive $RUN/slurmctld.pid || slurmctld -f $CONF
  for _ in $(seq 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
  scontrol ping | grep -q 'is UP' || { tail -20 $LOGS/slurmctld.log; exit 1; }
  log "slurmctld up at $CTL_IP:6827"
  for i in $(seq 1 "$N"); do
    pidf=$RUN/slurmd-c$i.pid
    if alive "$pidf" && [ "$changed" = 1 ]; then kill "$(cat "$pidf")"; while alive "$pidf"; do sleep 0.1; done; fi
    # only the network namespace (`ip netns exec` would remount /sys and hide the cgroup mounts
    # slurmd needs) and a host name of its own (unshare --uts); slurmd forks into the background
    alive "$pidf" || nsenter --net=/run/netns/sc-c$i unshare --uts sh -c \
      "hostname c$i; SLURM_CONF=$CONF exec slurmd -f $CONF -N c$i"
  done
  for _ in $(seq 150); do
    up=$(nodes_up)
    [ "$up" -ge "$N" ] && break
    sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2 ~ /drain|down/ {print $1}' | sort -u |
      while read -r n; do scontrol update nodename="$n" state=resume 2>/dev/null || true; done
    sleep 0.2
  done
  [ "$up" -ge "$N" ] || { echo "only $up of $N nodes up"; sinfo -N; tail -5 $LOGS/slurmd-c1.log; exit 1; }
  log "$N nodes up"
  if [ "$(squeue -h -t PENDING,RUNNING 2>/dev/null | wc -l)" -gt 0 ]; then
    log "jobs already queued or running from before this start: srun smoke test skipped"
  else
    timeout 60 srun -N"$N" -t 1 hostname | sort | tr '\n' ' ' | sed 's/^/srun smoke test on every node: /'; echo
  fi
  sinfo -N
  log "export SLURM_CONF=$CONF"
}

stop_pidfile() {  # $1 pidfile
  local f=$1 pid
  [ -s "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "stopped $(basename "$f" .pid) ($pid)"
  fi
  rm -f "$f"
}

stop() {
  need_root stop
  set +e
  [ -f $CONF ] && alive $RUN/slurmctld.pid && scancel --user=root 2>/dev/null
  local f ns pid
  for f in $RUN/slurmd-*.pid; do [ -e "$f" ] && stop_pidfile "$f"; done
  stop_pidfile $RUN/slurmctld.pid
  stop_pidfile $RUN/slurmdbd.pid
  stop_pidfile $RUN/mysql/mysqld.pid
  stop_pidfile $RUN/munge/munged.pid
  for ns in $(ip netns list 2>/dev/null | awk '/^sc-c[0-9]+/ {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done   # job processes left there
    ip netns del "$ns" && echo "removed namespace $ns"
  done
  ip link show $BR >/dev/null 2>&1 && ip link del $BR && echo "removed bridge $BR"
  if [ "${SLURM_CLUSTER_PURGE:-0}" = 1 ]; then
    rm -rf $STATE/ctld $STATE/d-c* $STATE/mysql
    echo "purged the cluster's job state and accounting database"
  fi
  return 0
}

status() {
  local up want
  up=$(nodes_up)
  want=$(grep -c '^NodeName=' $CONF 2>/dev/null || echo 0)
  if [ "$want" -ge 1 ] && [ "$up" -ge "$want" ]; then sinfo -N; else echo "the namespace cluster is not up ($up of $want nodes accept jobs)"; exit 1; fi
}

case "${1:-}" in
  start) start;;
  stop) stop;;
  status) status;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2;;
esac
