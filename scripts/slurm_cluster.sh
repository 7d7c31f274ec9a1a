#!/usr/bin/env bash
# A one-host SLURM cluster for tests: slurmctld and two slurmd on this machine as nodes n1
# and n2 (NodeAddr 127.0.0.1, their own ports), munge with a key of its own, every file
# under DIR. Client commands need SLURM_CONF=DIR/slurm.conf.
#
#   scripts/slurm_cluster.sh install     # apt-get install slurm-wlm where it is missing
#   scripts/slurm_cluster.sh up   DIR    # start it; returns once both nodes are idle
#   scripts/slurm_cluster.sh down DIR    # cancel every job, stop the daemons (idempotent)
#
# Needs root (slurmd starts jobs as their users). Ports: slurmctld 16817, slurmd 16818/16819.
set -euo pipefail
action=${1:?usage: $0 install | up DIR | down DIR}

if [ "$action" = install ]; then
    command -v slurmctld >/dev/null && exit 0
    [ "$(id -u)" = 0 ] || { echo "installing slurm-wlm needs root" >&2; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q slurm-wlm >/dev/null 2>&1 ||
        { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm >/dev/null; }
    exit 0
fi

dir=${2:?usage: $0 up|down DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
export SLURM_CONF=$dir/slurm.conf

stop() {
    if [ -f "$dir/slurmctld.pid" ]; then
        # every job cancelled, and gone from the queue (slurmd kills their steps), before the
        # daemons stop: a step left to a dead slurmd would run on
        jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [ -n "$jobs" ]; then
            scancel --full --quiet $jobs 2>/dev/null || true
            for _ in $(seq 1 40); do
                [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
                sleep 0.5
            done
        fi
    fi
    for f in slurmd-n1 slurmd-n2 slurmctld munged; do
        if [ -f "$dir/$f.pid" ]; then
            kill "$(cat "$dir/$f.pid")" 2>/dev/null || true
        fi
    done
    sleep 1
    for f in slurmd-n1 slurmd-n2 slurmctld munged; do
        if [ -f "$dir/$f.pid" ]; then
            kill -9 "$(cat "$dir/$f.pid")" 2>/dev/null || true
            rm -f "$dir/$f.pid"
        fi
    done
}

if [ "$action" = down ]; then
    stop
    exit 0
fi
[ "$action" = up ] || { echo "usage: $0 install | up DIR | down DIR" >&2; exit 2; }

stop
cores=$(nproc)
mkdir -p "$dir/state" "$dir/spool-n1" "$dir/spool-n2" "$dir/munge" "$dir/log"
chmod 700 "$dir/munge"
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1 count=1024 status=none
chmod 400 "$dir/munge/munge.key"
cat >"$SLURM_CONF" <<EOF
ClusterName=parabench
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool-%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MailProg=/bin/true
SchedulerType=sched/builtin
SelectType=select/linear
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
KillWait=5
InactiveLimit=0
SlurmdTimeout=30
NodeName=n1 NodeAddr=127.0.0.1 NodeHostname=localhost Port=16818 CPUs=$cores Sockets=1 CoresPerSocket=$cores ThreadsPerCore=1 State=UNKNOWN
NodeName=n2 NodeAddr=127.0.0.1 NodeHostname=localhost Port=16819 CPUs=$cores Sockets=1 CoresPerSocket=$cores ThreadsPerCore=1 State=UNKNOWN
PartitionName=test Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
munged --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N n1
slurmd -f "$SLURM_CONF" -N n2
for _ in $(seq 1 60); do
    if [ "$(sinfo -h -N -o %t 2>/dev/null | grep -c idle)" = 2 ]; then
        exit 0
    fi
    sleep 0.5
done
echo "the cluster did not come up: $(sinfo -N 2>&1 | tr '\n' ' ')" >&2
tail -5 "$dir/log/"*.log >&2 || true
stop
exit 1
