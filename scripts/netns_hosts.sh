#!/usr/bin/env bash
# Two "hosts" on this machine for multi-node tests: two network namespaces joined to each
# other by one veth pair and to nothing else, so nothing sent from them can leave the
# machine. Each has its own address and an interface named pb0 in it; the root namespace
# gets no interface of the test network, only a blackhole route for its range, a second
# guard should anything there try to reach it.
#
#   scripts/netns_hosts.sh up   NAME   # namespaces NAME0, NAME1: 10.231.0.1 and 10.231.0.2
#   scripts/netns_hosts.sh down NAME   # kills every process inside, removes both (idempotent)
#   scripts/netns_hosts.sh ssh NAME [ssh options] HOST COMMAND...   # what ssh would do
#
# Run a command on "host" i: ip netns exec NAMEi COMMAND (parabench: --host-exec
# 'ip netns exec NAME{node}' --hosts 10.231.0.1,10.231.0.2 --ifname pb0). Needs root.
set -euo pipefail
usage() {  # one line and exit 2, as any bad input here; ${1:?} said "line 15: 1:" and 1
    echo "usage: $0 up|down|ssh NAME" >&2
    exit 2
}
[ $# -ge 2 ] && [ -n "$2" ] || usage
action=$1
name=$2
net=10.231.0

down() {
    for i in 0 1; do
        if ip netns list | grep -qw "${name}${i}"; then
            pids=$(ip netns pids "${name}${i}" || true)
            [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
            ip netns del "${name}${i}" || true
        fi
        rm -rf "/etc/netns/${name}${i}"
    done
    ip route del blackhole "${net}.0/24" 2>/dev/null || true
}

case "$action" in
up)
    down
    trap down ERR
    ip route replace blackhole "${net}.0/24"
    ip netns add "${name}0"
    ip netns add "${name}1"
    # veth ends are created in the root namespace and moved out at once, then renamed
    ip link add "${name}a" type veth peer name "${name}b"
    ip link set "${name}a" netns "${name}0"
    ip link set "${name}b" netns "${name}1"
    for i in 0 1; do
        end=$([ "$i" = 0 ] && echo a || echo b)
        ip -n "${name}${i}" link set "${name}${end}" name pb0
        ip -n "${name}${i}" addr add "${net}.$((i + 1))/24" dev pb0
        ip -n "${name}${i}" link set pb0 up
        ip -n "${name}${i}" link set lo up
        # what this machine's name resolves to inside host i: its own address, as on a real
        # host (`ip netns exec` puts /etc/netns/NAME/hosts over /etc/hosts); Horovod 0.28.1's
        # process-set contexts reach their peers by that address, not by the interface
        mkdir -p "/etc/netns/${name}${i}"
        printf '127.0.0.1 localhost\n%s %s\n' "${net}.$((i + 1))" "$(hostname)" \
            >"/etc/netns/${name}${i}/hosts"
    done
    ;;
down)
    down
    ;;
ssh)
    # `ssh [options] HOST [options] COMMAND...` between the hosts, for launchers that reach
    # other nodes with ssh (horovodrun): COMMAND runs with sh in the namespace that owns
    # HOST's address, in a fresh environment (PATH and HOME only), as sshd gives it: what
    # the command needs it must carry itself. A test puts an executable `ssh` calling this
    # first on PATH.
    shift 2
    host=
    while [ $# -gt 0 ]; do
        case "$1" in
        -o | -p | -i | -l) shift 2 ;;
        -*) shift ;;
        *)
            [ -n "$host" ] && break
            host=$1
            shift
            ;;
        esac
    done
    case "$host" in
    "${net}.1") exec ip netns exec "${name}0" env -i PATH="$PATH" HOME="${HOME:-/root}" sh -c "$*" ;;
    "${net}.2") exec ip netns exec "${name}1" env -i PATH="$PATH" HOME="${HOME:-/root}" sh -c "$*" ;;
    *)
        echo "ssh: no namespace host $host (these are ${net}.1 and ${net}.2)" >&2
        exit 255
        ;;
    esac
    ;;
*)
    usage
    ;;
esac
