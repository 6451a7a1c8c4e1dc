#!/usr/bin/env bash
# sbench test cluster: a REAL 2-node SLURM cluster (with slurmdbd/MariaDB
# accounting) on one machine, for tests and CI.
#
#   cluster.sh start                 install what is missing, start everything, wait until healthy
#   cluster.sh stop                  stop all daemons, remove namespaces and bridge
#   cluster.sh status                print a summary; exit 0 only if everything is healthy
#   cluster.sh kill-node  nodeN      SIGKILL nodeN's slurmd (fault injection)
#   cluster.sh start-node nodeN      start nodeN's slurmd again and resume the node
#   cluster.sh restart-node nodeN    stop nodeN's slurmd cleanly, then start-node
#
# Layout: the controller (slurmctld, slurmdbd, MariaDB, munged) runs on the host
# on bridge sbbr0 (198.18.0.1); node1/node2 are slurmd's inside network
# namespaces sbn1/sbn2 (198.18.0.11/.12, interface eth0 in each).
#
# Environment:
#   SBENCH_CLUSTER_DIR      state root (default /var/lib/sbench-cluster). Commands
#                           other than `start` fall back to the dir recorded in
#                           /etc/slurm/slurm.conf, so stop/status find the cluster.
#   SBENCH_CLUSTER_LOGDIR   logs (default /var/log/sbench-cluster, or $SBENCH_CLUSTER_DIR/log)
#   SBENCH_CLUSTER_TIMEOUT  seconds to wait for daemons/nodes (default 60)
set -euo pipefail
# Daemons and admin tools live in sbin, often missing from CI/sudo PATHs.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$PATH
# Everything (daemons, checks, users' clients) must read /etc/slurm/slurm.conf.
unset SLURM_CONF

CLUSTER=sbench
BRIDGE=sbbr0
CTL_IP=198.18.0.1
# SBENCH_CLUSTER_NODES (default 2, at most 50) namespaced nodes node1..nodeN at 198.18.0.(10+i). Commands
# other than `start` act on as many nodes as the current slurm.conf declares.
NNODES=${SBENCH_CLUSTER_NODES:-}
# SBENCH_CLUSTER_MAX_ARRAY_SIZE (default 20): MaxArraySize, small so that every test's campaign meets the limit
# a production cluster sets (SLURM's default is 1001). Association limits (MaxSubmitJobs) are enforced; start
# clears root's, and a test or bench sets its own with sacctmgr.
MAX_ARRAY_SIZE=${SBENCH_CLUSTER_MAX_ARRAY_SIZE:-20}
if ! [[ $MAX_ARRAY_SIZE =~ ^[0-9]+$ ]] || ((MAX_ARRAY_SIZE < 2)); then
  echo "[cluster] ERROR: SBENCH_CLUSTER_MAX_ARRAY_SIZE must be a number >= 2, got '$MAX_ARRAY_SIZE'" >&2
  exit 2
fi
if [[ -z $NNODES && ${1:-} != start && -f /etc/slurm/slurm.conf ]] && grep -q 'sbench tests/cluster' /etc/slurm/slurm.conf; then
  NNODES=$(grep -c '^NodeName=' /etc/slurm/slurm.conf || true)
fi
NNODES=${NNODES:-2}
if ! [[ $NNODES =~ ^[0-9]+$ ]] || ((NNODES < 1 || NNODES > 50)); then
  echo "[cluster] ERROR: SBENCH_CLUSTER_NODES must be 1..50, got '$NNODES'" >&2
  exit 2
fi
NODES=()
declare -A NODE_IP=() NODE_NS=() NODE_VETH=()   # NODE_VETH: host-side veth ends
for ((i = 1; i <= NNODES; i++)); do
  NODES+=("node$i")
  NODE_IP[node$i]=198.18.0.$((10 + i))
  NODE_NS[node$i]=sbn$i
  NODE_VETH[node$i]=sbv$i
done
PKGS=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server iproute2 procps)
SLURM_ETC=/etc/slurm
MARKER="# managed by sbench tests/cluster/cluster.sh"
TIMEOUT=${SBENCH_CLUSTER_TIMEOUT:-60}
CTL_HOST=$(hostname -s 2>/dev/null || hostname)

log()  { echo "[cluster] $*"; }
warn() { echo "[cluster] WARNING: $*" >&2; }
# die MSG [LOGFILE...]: loud failure with the tail of the relevant logs.
die() {
  local msg=$1; shift
  echo "[cluster] ERROR: $msg" >&2
  local f
  for f in "$@"; do
    [[ -f $f ]] || continue
    echo "----- tail -n 25 $f -----" >&2
    tail -n 25 "$f" >&2 || true
  done
  exit 1
}

# ---------------------------------------------------------------- locations
resolve_dirs() {
  local recorded=""
  # Non-start commands act on whatever cluster the current slurm.conf describes.
  if [[ -z ${SBENCH_CLUSTER_DIR:-} && $1 != start && -f $SLURM_ETC/slurm.conf ]]; then
    recorded=$(sed -n 's/^# sbench-cluster-dir=//p' "$SLURM_ETC/slurm.conf" | head -n1)
  fi
  DIR=${SBENCH_CLUSTER_DIR:-${recorded:-/var/lib/sbench-cluster}}
  if [[ -n ${SBENCH_CLUSTER_LOGDIR:-} ]]; then LOGDIR=$SBENCH_CLUSTER_LOGDIR
  elif [[ $DIR == /var/lib/sbench-cluster ]]; then LOGDIR=/var/log/sbench-cluster
  else LOGDIR=$DIR/log
  fi
  if [[ -z ${SBENCH_CLUSTER_LOGDIR:-} && $1 != start && -f $SLURM_ETC/slurm.conf ]]; then
    local rl; rl=$(sed -n 's/^# sbench-cluster-logdir=//p' "$SLURM_ETC/slurm.conf" | head -n1)
    [[ -n $rl ]] && LOGDIR=$rl
  fi
}

# ---------------------------------------------------------------- processes
# live_pids COMM [CMDLINE-REGEX]: pids of non-zombie processes named COMM.
# Daemons here get reparented to a PID 1 that never reaps, so dead daemons
# linger as zombies that still match `pgrep -x`; skip state Z.
live_pids() {
  local comm=$1 re=${2:-} p st cmd
  for p in $(pgrep -x "$comm" 2>/dev/null || true); do
    st=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
    [[ -n $st && $st != Z && $st != X ]] || continue
    if [[ -n $re ]]; then
      cmd=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || continue
      [[ $cmd =~ $re ]] || continue
    fi
    echo "$p"
  done
}

# stop_procs COMM [CMDLINE-REGEX]: SIGTERM, wait up to 10 s, then SIGKILL.
stop_procs() {
  local pids i
  pids=$(live_pids "$@")
  [[ -z $pids ]] && return 0
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < 20; i++)); do
    [[ -z $(live_pids "$@") ]] && return 0
    sleep 0.5
  done
  pids=$(live_pids "$@")
  [[ -n $pids ]] && { warn "$1 did not exit on SIGTERM, sending SIGKILL to $pids"; kill -KILL $pids 2>/dev/null || true; sleep 0.5; }
  return 0
}

# wait_for SECONDS CMD...: poll until CMD succeeds.
wait_for() {
  local secs=$1 end; shift
  end=$((SECONDS + secs))
  while ((SECONDS < end)); do
    "$@" && return 0
    sleep 1
  done
  "$@"
}

# Start a daemon fully detached: new session (so a test's Ctrl-C or killpg does
# not hit it), no inherited stdout (else `$(cluster.sh start)` would hang) and
# not the lock fd 9 (else the daemon holds our lock forever).
spawn() { setsid -f "$@" </dev/null >>"$LOGDIR/spawn.log" 2>&1 9>&-; }

# ---------------------------------------------------------------- packages
ensure_packages() {
  local missing=() p
  for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing missing packages: ${missing[*]}"
  # Keep package scripts from starting daemons: this script starts them itself.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod 755 "$policy"; made_policy=1
  fi
  local rc=0 aptlog=$LOGDIR/apt.log
  mkdir -p "$LOGDIR"
  { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"; } >>"$aptlog" 2>&1 || rc=$?
  ((made_policy)) && rm -f "$policy"
  ((rc == 0)) || die "apt-get install failed (rc=$rc)" "$aptlog"
  log "packages installed (log: $aptlog)"
}

# ---------------------------------------------------------------- config files
DB_PASS_FILE() { echo "$DIR/etc/dbpass"; }

gen_slurm_conf() {
  cat <<EOF
$MARKER
# sbench-cluster-dir=$DIR
# sbench-cluster-logdir=$LOGDIR
ClusterName=$CLUSTER
# Hostname plus explicit address: slurmd's in the netns reach the controller on
# the bridge (the hostname itself resolves to 127.0.0.1, i.e. the netns' own lo).
SlurmctldHost=$CTL_HOST($CTL_IP)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$DIR/state/slurmctld
SlurmdSpoolDir=$DIR/spool/slurmd-%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups in the test VM/containers.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
MailProg=/bin/true
# Nodes declare far more than the host has; trust slurm.conf instead of draining.
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
GresTypes=gpu
# Fast failure detection for fault-injection tests; a node that comes back
# with a valid registration returns to service by itself.
SlurmdTimeout=30
ReturnToService=2
KillWait=5
MinJobAge=300
MaxArraySize=$MAX_ARRAY_SIZE
MaxJobCount=20000
JobRequeue=1
PreemptType=preempt/none
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$CTL_IP
AccountingStorageTRES=gres/gpu
AccountingStorageEnforce=associations,limits
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=task=1
JobCompType=jobcomp/none
$(for n in "${NODES[@]}"; do echo "NodeName=$n NodeAddr=${NODE_IP[$n]} CPUs=96 RealMemory=1000000 Gres=gpu:8 State=UNKNOWN"; done)
PartitionName=cpu Nodes=node[1-$NNODES] Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=node[1-$NNODES] MaxTime=INFINITE State=UP
EOF
}

gen_gres_conf() {
  cat <<EOF
$MARKER
# Fake device nodes stand in for /dev/nvidia* (see ensure_files).
NodeName=node[1-$NNODES] Name=gpu File=$DIR/gpus/nvidia[0-7]
EOF
}

gen_slurmdbd_conf() {
  cat <<EOF
$MARKER
AuthType=auth/munge
DbdHost=$CTL_HOST
SlurmUser=root
LogFile=$LOGDIR/slurmdbd.log
PidFile=$DIR/run/slurmdbd.pid
StorageType=accounting_storage/mysql
# "localhost" = the MariaDB unix socket.
StorageHost=localhost
StorageUser=slurm
StoragePass=$(cat "$(DB_PASS_FILE)")
StorageLoc=slurm_acct_db
EOF
}

# install_conf PATH MODE GENERATOR: write if different; keep a copy of a
# foreign file. Returns 0 if the file changed.
install_conf() {
  local path=$1 mode=$2 gen=$3 tmp
  tmp=$(mktemp)
  "$gen" >"$tmp"
  if [[ -f $path ]] && cmp -s "$tmp" "$path"; then
    rm -f "$tmp"; chmod "$mode" "$path"; return 1
  fi
  if [[ -f $path ]] && ! grep -qF "$MARKER" "$path"; then
    local bak=$path.pre-sbench
    [[ -e $bak ]] && bak=$path.pre-sbench.$(date +%s)
    cp -p "$path" "$bak"
    log "saved existing $path as $bak"
  fi
  install -m "$mode" -o root -g root "$tmp" "$path"
  rm -f "$tmp"
  log "wrote $path"
  return 0
}

SLURM_CONF_CHANGED=0
DBD_CONF_CHANGED=0
CTLD_STARTED=0
ensure_files() {
  mkdir -p "$DIR"/{etc,run,state/slurmctld,gpus} "$LOGDIR" "$SLURM_ETC"
  chmod 700 "$DIR/etc"
  local n i
  for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/slurmd-$n"; done
  # Fake GPUs. Character devices (NVIDIA's major 195, never opened by anything)
  # make slurmd accept them and export CUDA_VISIBLE_DEVICES to jobs; with plain
  # files slurmd logs "not a valid character or block device" and jobs get an
  # empty CUDA_VISIBLE_DEVICES. Plain files are the fallback where mknod is denied.
  for i in 0 1 2 3 4 5 6 7; do
    [[ -c $DIR/gpus/nvidia$i ]] && continue
    rm -f "$DIR/gpus/nvidia$i"
    mknod "$DIR/gpus/nvidia$i" c 195 "$i" 2>/dev/null || : >"$DIR/gpus/nvidia$i"
  done
  if [[ ! -s $(DB_PASS_FILE) ]]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$(DB_PASS_FILE)")
  fi
  if install_conf "$SLURM_ETC/slurm.conf" 644 gen_slurm_conf; then SLURM_CONF_CHANGED=1; fi
  if install_conf "$SLURM_ETC/gres.conf" 644 gen_gres_conf; then SLURM_CONF_CHANGED=1; fi
  # slurmdbd refuses a config readable by others (it holds the DB password).
  if install_conf "$SLURM_ETC/slurmdbd.conf" 600 gen_slurmdbd_conf; then DBD_CONF_CHANGED=1; fi
  return 0
}

# ---------------------------------------------------------------- network
ns_ok() { [[ -e /var/run/netns/$1 ]] && nsenter --net="/var/run/netns/$1" true 2>/dev/null; }

ensure_network() {
  ip link show "$BRIDGE" &>/dev/null || { log "creating bridge $BRIDGE ($CTL_IP/24)"; ip link add "$BRIDGE" type bridge; }
  ip addr replace "$CTL_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  local n ns veth
  for n in "${NODES[@]}"; do
    ns=${NODE_NS[$n]} veth=${NODE_VETH[$n]}
    if ! ns_ok "$ns"; then
      # A stale name (e.g. file left after a reboot) blocks `ip netns add`.
      ip netns del "$ns" 2>/dev/null || rm -f "/var/run/netns/$ns"
      log "creating netns $ns"
      ip netns add "$ns"
    fi
    if ! ip -n "$ns" link show eth0 &>/dev/null; then
      ip link del "$veth" 2>/dev/null || true   # half-created pair from an earlier run
      ip link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "${NODE_IP[$n]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route replace default via "$CTL_IP"
  done
  # Hosts with a FORWARD policy of DROP (docker) would drop node1<->node2 traffic,
  # since bridged frames pass through iptables when br_netfilter is loaded.
  if command -v iptables >/dev/null && ! iptables -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; then
    iptables -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null || true
  fi
  ensure_hosts
}

ensure_hosts() {
  local want=() n line stale=0
  for n in "${NODES[@]}"; do want+=("${NODE_IP[$n]} $n # sbench-cluster"); done
  for line in "${want[@]}"; do grep -qxF "$line" /etc/hosts || stale=1; done
  ((stale)) || return 0
  # Rewrite in place (not sed -i): /etc/hosts is often a bind mount in containers.
  local content
  content=$(grep -v -E '# sbench-cluster$' /etc/hosts || true)
  printf '%s\n' "$content" "${want[@]}" >/etc/hosts
  log "added ${NODES[*]} to /etc/hosts"
}

teardown_network() {
  local n
  # Every sbn<i> namespace and sbv<i> link, also those of a larger cluster started before.
  for n in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^sbn[0-9]+$' || true); do
    ip netns del "$n" 2>/dev/null || true
  done
  for n in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E '^sbv[0-9]+$' || true); do
    ip link del "$n" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if command -v iptables >/dev/null; then
    iptables -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null || true
  fi
}

# ---------------------------------------------------------------- munge
munge_ok() { timeout 5 munge -n 2>/dev/null | timeout 5 unmunge >/dev/null 2>&1; }

ensure_munge() {
  munge_ok && return 0
  log "starting munged"
  stop_procs munged
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
  if [[ ! -s /etc/munge/munge.key ]]; then
    log "creating /etc/munge/munge.key"
    mungekey --create --keyfile=/etc/munge/munge.key --force 2>/dev/null \
      || dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 400 /etc/munge/munge.key
  # --force: take over a stale socket left by a dead munged.
  spawn runuser -u munge -- /usr/sbin/munged --force
  wait_for 15 munge_ok || die "munged is not working" /var/log/munge/munged.log
}

# ---------------------------------------------------------------- mariadb
mysql_ok() { timeout 5 mysqladmin --no-defaults --socket=/run/mysqld/mysqld.sock ping &>/dev/null; }

ensure_mariadb() {
  if ! mysql_ok; then
    log "starting MariaDB"
    stop_procs mysqld_safe
    stop_procs mariadbd
    stop_procs mysqld
    install -d -o mysql -g mysql -m 0755 /run/mysqld
    if [[ ! -d /var/lib/mysql/mysql ]]; then
      log "initialising /var/lib/mysql"
      mariadb-install-db --user=mysql --datadir=/var/lib/mysql >>"$LOGDIR/mariadb.log" 2>&1 \
        || die "mariadb-install-db failed" "$LOGDIR/mariadb.log"
    fi
    touch "$LOGDIR/mariadb.log"; chown mysql:mysql "$LOGDIR/mariadb.log"
    # Debian's config logs to syslog, which does not exist here: log to a file.
    spawn mysqld_safe --bind-address=127.0.0.1 --skip-syslog --log-error="$LOGDIR/mariadb.log"
    wait_for "$TIMEOUT" mysql_ok || die "MariaDB did not come up" "$LOGDIR/mariadb.log"
  fi
  # Idempotent: database, user, password (the password file may be new).
  local pass; pass=$(cat "$(DB_PASS_FILE)")
  timeout 30 mysql --protocol=socket -uroot <<SQL || die "could not set up slurm_acct_db (root needs unix_socket access to MariaDB)" "$LOGDIR/mariadb.log"
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$pass';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$pass';
GRANT ALL PRIVILEGES ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL
}

# ---------------------------------------------------------------- slurmdbd
dbd_ok() { timeout 10 sacctmgr -n list cluster format=cluster%30 &>/dev/null; }
dbd_has_cluster() { timeout 10 sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; }

ensure_slurmdbd() {
  if ((DBD_CONF_CHANGED)) && [[ -n $(live_pids slurmdbd) ]]; then
    log "slurmdbd.conf changed: restarting slurmdbd"
    stop_procs slurmdbd
  fi
  if ! dbd_ok; then
    ensure_mariadb
    log "starting slurmdbd"
    stop_procs slurmdbd
    spawn slurmdbd
    wait_for "$TIMEOUT" dbd_ok || die "slurmdbd is not answering" "$LOGDIR/slurmdbd.log" "$LOGDIR/mariadb.log"
  fi
  if ! dbd_has_cluster; then
    log "registering cluster $CLUSTER in accounting"
    timeout 30 sacctmgr -i add cluster "$CLUSTER" >/dev/null || die "sacctmgr add cluster failed" "$LOGDIR/slurmdbd.log"
  fi
  # A test that set a submit or per-job limit and died before clearing it must not limit the next run.
  timeout 30 sacctmgr -i modify user where name=root cluster="$CLUSTER" set MaxSubmitJobs=-1 MaxJobs=-1 \
    GrpSubmitJobs=-1 MaxWall=-1 MaxTRESPerJob=node=-1,cpu=-1 >/dev/null 2>&1 || true
  timeout 30 sacctmgr -i modify qos where name=normal set MaxWall=-1 MaxTRESPerJob=node=-1,cpu=-1 >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------- slurmctld
ctld_ok() { timeout 10 scontrol ping 2>/dev/null | grep -q 'is UP'; }

ensure_slurmctld() {
  if ((SLURM_CONF_CHANGED)) && [[ -n $(live_pids slurmctld) ]]; then
    log "slurm.conf changed: restarting slurmctld"
    stop_procs slurmctld
  fi
  ctld_ok && return 0
  log "starting slurmctld"
  stop_procs slurmctld
  spawn slurmctld
  wait_for "$TIMEOUT" ctld_ok || die "slurmctld is not answering" "$LOGDIR/slurmctld.log"
  CTLD_STARTED=1
}

# Jobs a fresh slurmctld recovered from its saved state were left by an earlier run that died before its own
# clean-up (a held array, a pending feeder): they would hold slots of the user's submit quota and of the nodes.
clear_left_jobs() {
  local ids
  ids=$(timeout 10 squeue -h -o '%F' 2>/dev/null | sort -u | tr '\n' ' ' || true)
  [[ -z ${ids// /} ]] && return 0
  log "cancelling job(s) left in the queue by an earlier run: $ids"
  # shellcheck disable=SC2086
  timeout 30 scancel $ids 2>/dev/null || true
}

# ---------------------------------------------------------------- slurmd / nodes
valid_node() { [[ -n ${NODE_IP[${1:-}]:-} ]] || die "unknown node '${1:-}' (expected one of: ${NODES[*]})"; }
slurmd_pids() { live_pids slurmd "(^| )-N $1( |$)"; }

# node_state NODE: e.g. idle, mixed, down*, drained, idle* (empty if unknown)
node_state() { timeout 10 sinfo -h -N -n "$1" -o '%T' 2>/dev/null | head -n1; }
node_usable() { [[ $(node_state "$1") =~ ^(idle|mixed|allocated|completing)$ ]]; }

start_slurmd() {
  local n=$1
  [[ -n $(slurmd_pids "$n") ]] && return 0
  ns_ok "${NODE_NS[$n]}" || ensure_network
  log "starting slurmd $n in netns ${NODE_NS[$n]}"
  # nsenter only switches the network namespace; `ip netns exec` would also
  # remount /sys, which breaks slurmd.
  spawn nsenter --net="/var/run/netns/${NODE_NS[$n]}" -- slurmd -N "$n"
}

# Resume nodes that are down/drained but responding (leftovers of earlier runs
# or of kill-node); nodes still marked '*' have not re-registered yet.
resume_if_needed() {
  local n=$1 st
  st=$(node_state "$n")
  if [[ $st =~ (down|drain|fail) && $st != *'*' ]]; then
    log "resuming $n (was $st)"
    timeout 10 scontrol update nodename="$n" state=resume 2>/dev/null || true
  fi
}

slurmd_start_time() { timeout 10 scontrol show node "$1" 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' | cut -d= -f2; }

# wait_nodes NODE...: until every node is idle/mixed/allocated (resuming
# down/drained ones). With NEWER_THAN=<ISO time> also require that the node's
# slurmd registered at or after that time (the controller still reports the
# old state for a moment after a restart).
wait_nodes() {
  local end=$((SECONDS + TIMEOUT)) n all
  while :; do
    all=1
    for n in "$@"; do
      if node_usable "$n"; then
        [[ -z ${NEWER_THAN:-} || ! $(slurmd_start_time "$n") < $NEWER_THAN ]] && continue
        all=0; continue
      fi
      all=0
      resume_if_needed "$n"
    done
    ((all)) && return 0
    ((SECONDS < end)) || break
    sleep 1
  done
  timeout 10 sinfo -N -l >&2 || true
  local logs=("$LOGDIR/slurmctld.log")
  for n in "$@"; do
    node_usable "$n" || { timeout 10 scontrol show node "$n" | grep -E 'State=|Reason=' >&2 || true; logs+=("$LOGDIR/slurmd-$n.log"); }
  done
  die "nodes not idle after ${TIMEOUT}s: $(for n in "$@"; do printf '%s=%s ' "$n" "$(node_state "$n")"; done)" "${logs[@]}"
}

ensure_slurmds() {
  local n
  if ((SLURM_CONF_CHANGED)); then
    for n in "${NODES[@]}"; do
      [[ -n $(slurmd_pids "$n") ]] && { log "slurm.conf changed: restarting slurmd $n"; stop_procs slurmd "(^| )-N $n( |$)"; }
    done
  fi
  for n in "${NODES[@]}"; do
    # A process that exists but whose node is not responding is half-dead.
    if [[ -n $(slurmd_pids "$n") ]] && [[ $(node_state "$n") == *'*' ]]; then
      log "slurmd $n is running but not responding: restarting it"
      stop_procs slurmd "(^| )-N $n( |$)"
    fi
    start_slurmd "$n"
  done
  wait_nodes "${NODES[@]}"
}

# ---------------------------------------------------------------- health
# health [verbose]: 0 if every component works.
health() {
  local verbose=${1:-0} ok=0 ctld=0 n st
  say() { ((verbose)) && printf '  %-10s %s\n' "$1" "$2"; return 0; }
  if munge_ok; then say munge ok; else say munge FAIL; ok=1; fi
  if mysql_ok; then say mariadb ok; else say mariadb FAIL; ok=1; fi
  if dbd_has_cluster; then say slurmdbd "ok (cluster $CLUSTER registered)"; else say slurmdbd "FAIL (sacctmgr list cluster)"; ok=1; fi
  if ctld_ok; then ctld=1; say slurmctld "ok ($CTL_HOST $CTL_IP)"; else say slurmctld "FAIL (scontrol ping)"; ok=1; fi
  for n in "${NODES[@]}"; do
    st=""; ((ctld)) && st=$(node_state "$n")
    if [[ -n $(slurmd_pids "$n") ]] && [[ $st =~ ^(idle|mixed|allocated|completing)$ ]]; then
      say "$n" "$st (${NODE_IP[$n]}, netns ${NODE_NS[$n]})"
    else
      say "$n" "FAIL (state=${st:-?}, slurmd pid=$(slurmd_pids "$n" | tr '\n' ' '))"; ok=1
    fi
  done
  return $ok
}

# ---------------------------------------------------------------- commands
# A test that changed partition cpu (its MaxTime, MaxNodes, state or QOS) and died before setting it back must not
# limit the next run: slurmctld keeps such changes in its saved state.
reset_partitions() {
  timeout 10 scontrol update PartitionName=cpu QOS= MaxTime=INFINITE MaxNodes=UNLIMITED State=UP >/dev/null 2>&1 \
    || warn "could not reset partition cpu's limits"
}

cmd_start() {
  local t0=$SECONDS
  ensure_packages
  ensure_files
  # Fast path: an unchanged, healthy cluster is left untouched.
  local all_ns=1 n
  for n in "${NODES[@]}"; do ns_ok "${NODE_NS[$n]}" || all_ns=0; done
  if ((SLURM_CONF_CHANGED == 0 && DBD_CONF_CHANGED == 0 && all_ns)) && health 0; then
    ensure_hosts
    reset_partitions
    log "already running and healthy"
    return 0
  fi
  ensure_network
  ensure_munge
  ensure_slurmdbd
  ensure_slurmctld
  ensure_slurmds
  ((CTLD_STARTED)) && clear_left_jobs
  reset_partitions
  log "cluster $CLUSTER is up ($((SECONDS - t0))s); logs in $LOGDIR"
  health 1
}

cmd_stop() {
  local n p
  for n in "${NODES[@]}"; do
    [[ -n $(slurmd_pids "$n") ]] && log "stopping slurmd $n"
    stop_procs slurmd "(^| )-N $n( |$)"
    # Job steps and their processes live in the namespace too.
    if ns_ok "${NODE_NS[$n]}"; then
      p=$(ip netns pids "${NODE_NS[$n]}" 2>/dev/null || true)
      if [[ -n $p ]]; then
        kill -TERM $p 2>/dev/null || true
        sleep 1
        p=$(ip netns pids "${NODE_NS[$n]}" 2>/dev/null || true)
        [[ -n $p ]] && kill -KILL $p 2>/dev/null || true
      fi
    fi
  done
  [[ -n $(live_pids slurmctld) ]] && log "stopping slurmctld"
  stop_procs slurmctld
  [[ -n $(live_pids slurmdbd) ]] && log "stopping slurmdbd"
  stop_procs slurmdbd
  if [[ -n $(live_pids mysqld_safe)$(live_pids mariadbd)$(live_pids mysqld) ]]; then
    log "stopping MariaDB"
    timeout 30 mysqladmin --no-defaults --socket=/run/mysqld/mysqld.sock -uroot shutdown &>/dev/null || true
    stop_procs mysqld_safe
    stop_procs mariadbd
    stop_procs mysqld
  fi
  [[ -n $(live_pids munged) ]] && log "stopping munged"
  stop_procs munged
  log "removing netns sbn1/sbn2 and bridge $BRIDGE"
  teardown_network
  log "stopped"
}

cmd_status() {
  echo "sbench cluster ($DIR, logs $LOGDIR):"
  if health 1; then echo "status: healthy"; return 0; fi
  echo "status: NOT healthy"; return 1
}

cmd_kill_node() {
  local n=$1 pids; valid_node "$n"
  pids=$(slurmd_pids "$n")
  [[ -z $pids ]] && { log "slurmd $n is not running"; return 0; }
  log "SIGKILL slurmd $n (pid $(echo $pids))"
  kill -KILL $pids
}

cmd_start_node() {
  local n=$1; valid_node "$n"
  ctld_ok || die "slurmctld is not running; use '$0 start'" "$LOGDIR/slurmctld.log"
  local since=""
  [[ -z $(slurmd_pids "$n") ]] && since=$(date +%FT%T)
  start_slurmd "$n"
  NEWER_THAN=$since wait_nodes "$n"
  log "$n is $(node_state "$n")"
}

cmd_restart_node() {
  local n=$1; valid_node "$n"
  log "stopping slurmd $n"
  stop_procs slurmd "(^| )-N $n( |$)"
  cmd_start_node "$n"
}

usage() {
  echo "usage: $0 start|stop|status|restart-node NODE|kill-node NODE|start-node NODE" >&2
  exit 2
}

main() {
  (($# >= 1)) || usage
  local cmd=$1
  case $cmd in -h|--help|help) usage ;; esac
  ((EUID == 0)) || die "must run as root"
  resolve_dirs "$cmd"
  # Serialise commands that change things (e.g. parallel CI jobs both calling start).
  if [[ $cmd != status ]]; then
    exec 9>/run/sbench-cluster.lock
    flock -w 600 9 || die "timed out waiting for another cluster.sh (lock /run/sbench-cluster.lock)"
  fi
  case $cmd in
    start)        cmd_start ;;
    stop)         cmd_stop ;;
    status)       cmd_status ;;
    kill-node)    (($# == 2)) || usage; cmd_kill_node "$2" ;;
    start-node)   (($# == 2)) || usage; cmd_start_node "$2" ;;
    restart-node) (($# == 2)) || usage; cmd_restart_node "$2" ;;
    *) usage ;;
  esac
}

main "$@"
