#!/bin/bash
# local-cluster.sh - a real two-node Slurm cluster on 127.0.0.1, for the workbook's job tests.
#
# Usage (as root; no systemd needed):
#     bash scripts/slurm/local-cluster.sh up       # install (Debian), configure, start; waits until idle
#     bash scripts/slurm/local-cluster.sh status   # daemons, nodes and queue
#     bash scripts/slurm/local-cluster.sh down     # cancel jobs, stop the daemons it started (by PID)
# or `make slurm-up` / `make slurm-down`.
#
# What you get: munged, one slurmctld and two slurmd (node1 and node2, ports 6818 and 6819) on this
# machine, partition "debug" (the default) with both nodes, each claiming 64 CPUs and 8 GPUs. The GPUs
# are fake (gres.conf points at symlinks to /dev/null): Slurm accepts --gpus, --gres=gpu:N and
# --gpus-per-node and sets CUDA_VISIBLE_DEVICES, while the training itself runs on the CPU.
# Everything the cluster writes (config copies, state, logs, PIDs) lives in $WORKBOOK_SLURM_DIR
# (default /tmp/workbook-slurm); slurm.conf and gres.conf go to /etc/slurm, where sinfo/sbatch look.
# `up` is idempotent: it does nothing but wait for idle nodes when the same cluster is already running.
set -euo pipefail

STATE=${WORKBOOK_SLURM_DIR:-/tmp/workbook-slurm}
CONF_DIR=/etc/slurm
NODES=(node1 node2)
NODE_PORTS=(6818 6819)
MARKER="# written by the workbook's scripts/slurm/local-cluster.sh"

log() { echo "local-cluster: $*"; }
die() { echo "local-cluster: error: $*" >&2; exit 1; }

need_root() {
    [[ $(id -u) -eq 0 ]] || die "run as root (it installs Debian packages and starts daemons as root); \
without root, run the job tests on a machine where you are root, or on a real cluster with sbatch"
}

# ---------------------------------------------------------------------------------------- install
install_packages() {
    local missing=()
    for exe in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/sbin/munged; do
        [[ -x $exe ]] || missing+=("$exe")
    done
    ((${#missing[@]} == 0)) && return 0
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get: install Slurm (slurmctld, \
slurmd, client) and munge with your package manager"
    log "installing slurmctld slurmd slurm-client munge (Debian packages)"
    # The package lists of a fresh image may be empty or old: update them when the install fails.
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            slurmctld slurmd slurm-client munge >"$STATE/log/apt.log" 2>&1; then
        apt-get update -q >>"$STATE/log/apt.log" 2>&1
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            slurmctld slurmd slurm-client munge >>"$STATE/log/apt.log" 2>&1 \
            || die "apt-get install failed; see $STATE/log/apt.log"
    fi
}

# ---------------------------------------------------------------------------------------- config
write_hosts() {
    # Jobs resolve node names (torchrun's rendezvous endpoint is the first node's name).
    local node
    for node in "${NODES[@]}"; do
        grep -qE "^[^#]*[[:space:]]$node([[:space:]]|\$)" /etc/hosts || echo "127.0.0.1 $node" >>/etc/hosts
    done
}

write_fake_gpus() {
    # gres.conf needs character devices: symlinks to /dev/null pass the check.
    mkdir -p "$STATE/dev"
    local i
    for i in 0 1 2 3 4 5 6 7; do ln -sfn /dev/null "$STATE/dev/gpu$i"; done
}

slurm_conf() {
    cat <<EOF
$MARKER
# A two-node test cluster on one machine: no systemd, no cgroups, daemons bound to 127.0.0.1 only.
ClusterName=workbook
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmctldPort=6817
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again this many seconds after its requeue (the default is 120 s),
# and the schedulers look at pending jobs every 2 s instead of every 30-60 s.
AuthInfo=cred_expire=5
SchedulerParameters=bf_interval=2,sched_interval=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
# No cgroups here: track processes through /proc and leave task binding alone.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
# Refuse impossible requests (too many GPUs, unknown partition) at submit instead of pending forever.
EnforcePartLimits=ALL
# Keep finished jobs in 'scontrol show job' for an hour; sacct -c reads the job completion file.
MinJobAge=3600
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/log/jobcomp.txt
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
# Nodes may claim more CPUs and GPUs than this machine has; they return to service after a restart.
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
# Slurm's default: the seconds between a job's SIGTERM (scancel, a time limit) and its SIGKILL. A run checkpoints in
# them; with 5 s, a checkpoint being written on a loaded 2-core node was cut off.
KillWait=30
SlurmdTimeout=300
InactiveLimit=0
NodeName=node[1-2] NodeHostname=$(hostname -s) NodeAddr=127.0.0.1 Port=[6818-6819] CPUs=64 RealMemory=256000 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
EOF
}

gres_conf() {
    cat <<EOF
$MARKER
NodeName=node[1-2] Name=gpu File=$STATE/dev/gpu[0-7]
EOF
}

# write_if_changed FILE CONTENT: returns 0 when FILE changed.
write_if_changed() {
    local target=$1 content=$2
    [[ -f $target && $(cat "$target") == "$content" ]] && return 1
    if [[ -f $target ]] && ! grep -qF "$MARKER" "$target"; then
        die "$target exists and was not written by this script: this machine seems to have its own Slurm; \
use that cluster (sbatch works already) or move $target away"
    fi
    printf '%s\n' "$content" >"$target"
}

write_config() {
    mkdir -p "$CONF_DIR" "$STATE"/{ctld,run,log} "${NODES[@]/#/$STATE/spool/}"
    write_fake_gpus
    write_hosts
    local changed=1
    write_if_changed "$CONF_DIR/slurm.conf" "$(slurm_conf)" && changed=0
    write_if_changed "$CONF_DIR/gres.conf" "$(gres_conf)" && changed=0
    return $changed
}

# ---------------------------------------------------------------------------------------- daemons
# pid_alive PIDFILE: the process of PIDFILE runs and is still the program the file is named after
# (after a reboot or a killed session the PID may belong to something else by now).
pid_alive() {
    local pid
    [[ -f $1 ]] && pid=$(cat "$1") && [[ -n $pid ]] || return 1
    local program
    program=$(basename "$1" .pid)
    program=${program%%-*}  # slurmd-node1.pid -> slurmd
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$program" ]] || return 1
    local stat
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
    local -a fields
    read -r -a fields <<<"${stat##*) }"
    [[ ${fields[0]} != Z ]]  # a zombie has ended
}

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return 0; fi
    [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key && chown munge:munge /etc/munge/munge.key; }
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    chown munge:munge /run/munge /var/log/munge /var/lib/munge
    log "starting munged as user munge"
    runuser -u munge -- /usr/sbin/munged
    cp /run/munge/munged.pid "$STATE/run/munged.pid"
    wait_for "munge credentials" 10 bash -c 'munge -n | unmunge >/dev/null 2>&1'
}

start_slurm() {
    if ! pid_alive "$STATE/run/slurmctld.pid"; then
        log "starting slurmctld"
        # -c: a clean start, without the jobs of an earlier run (a killed session may have left some)
        /usr/sbin/slurmctld -c
    fi
    wait_for "slurmctld to answer" 20 scontrol ping
    local i
    for i in "${!NODES[@]}"; do
        if ! pid_alive "$STATE/run/slurmd-${NODES[$i]}.pid"; then
            log "starting slurmd ${NODES[$i]} on port ${NODE_PORTS[$i]}"
            /usr/sbin/slurmd -N "${NODES[$i]}"
        fi
    done
}

# wait_for WHAT SECONDS COMMAND...: retry COMMAND every half second.
wait_for() {
    local what=$1 seconds=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "gave up waiting for $what after ${seconds}s; logs are in $STATE/log"
        sleep 0.5
    done
}

nodes_registered() { [[ $(sinfo -h -N -o %N 2>/dev/null | wc -l) -ge ${#NODES[@]} ]]; }

nodes_ready() {
    # Every node idle, or busy with jobs (mixed/allocated) when `up` is called with jobs running.
    local states
    states=$(sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
    [[ $(grep -cE ' (idle|mix|alloc)$' <<<"$states") -eq ${#NODES[@]} ]]
}

resume_nodes() {
    # A node left down or drained by an earlier run comes back.
    if sinfo -h -N -o '%t' | grep -qE 'down|drain|fail'; then
        scontrol update NodeName="node[1-2]" State=RESUME 2>/dev/null || true
    fi
}

stop_pidfile() {
    local pidfile=$1 name=$2 pid
    pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    log "stopping $name (PID $pid)"
    kill "$pid"
    local deadline=$((SECONDS + 15))
    while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
    rm -f "$pidfile"
}

# ---------------------------------------------------------------------------------------- commands
cmd_up() {
    need_root
    mkdir -p "$STATE/log"
    install_packages
    if write_config && pid_alive "$STATE/run/slurmctld.pid"; then
        log "configuration changed: restarting the cluster"
        stop_daemons
    fi
    start_munge
    start_slurm
    wait_for "slurmd to register" 30 nodes_registered
    resume_nodes
    wait_for "both nodes idle (sinfo)" 30 nodes_ready
    log "up: $(sinfo -h -o '%P %D nodes %t' | tr '\n' ' ')(state in $STATE)"
}

stop_daemons() {
    local node
    for node in "${NODES[@]}"; do stop_pidfile "$STATE/run/slurmd-$node.pid" "slurmd $node"; done
    stop_pidfile "$STATE/run/slurmctld.pid" slurmctld
}

cmd_down() {
    need_root
    if pid_alive "$STATE/run/slurmctld.pid"; then
        local jobs
        jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
        if [[ -n ${jobs// /} ]]; then
            log "cancelling jobs $jobs"
            # shellcheck disable=SC2086  # one argument per job id
            scancel $jobs || true
            sleep 2
        fi
    fi
    stop_daemons
    stop_pidfile "$STATE/run/munged.pid" munged
    log "down"
}

cmd_status() {
    local name pidfile
    for name in slurmctld "${NODES[@]/#/slurmd-}" munged; do
        pidfile=$STATE/run/$name.pid
        if pid_alive "$pidfile"; then echo "$name: running (PID $(cat "$pidfile"))"; else echo "$name: stopped"; fi
    done
    if scontrol ping >/dev/null 2>&1; then
        sinfo -N -o '%N %P %t %c %G'
        squeue
    else
        echo "slurmctld does not answer: start the cluster with: bash $0 up"
        return 1
    fi
}

case ${1:-} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: bash $0 up|down|status" >&2; exit 2 ;;
esac
