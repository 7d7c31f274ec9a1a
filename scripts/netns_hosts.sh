#!/usr/bin/env bash
# Two "hosts" on this machine for multi-node tests: two network namespaces joined to each
# other by one veth pair and to nothing else, so nothing sent from them can leave the
# machine. Each has its own address and an interface named pb0 in it; the root namespace
# gets no interface of the test network, only a blackhole route for its range, a second
# guard should anything there try to reach it.
#
#   scripts/netns_hosts.sh up   NAME   # namespaces NAME0, NAME1: 10.231.0.1 and 10.231.0.2
#   scripts/netns_hosts.sh down NAME   # kills every process inside, removes both (idempotent)
#
# Run a command on "host" i: ip netns exec NAMEi COMMAND (parabench: --host-exec
# 'ip netns exec NAME{node}' --hosts 10.231.0.1,10.231.0.2 --ifname pb0). Needs root.
set -euo pipefail
action=${1:?usage: $0 up|down NAME}
name=${2:?usage: $0 up|down NAME}
net=10.231.0

down() {
    for i in 0 1; do
        if ip netns list | grep -qw "${name}${i}"; then
            pids=$(ip netns pids "${name}${i}" || true)
            [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
            ip netns del "${name}${i}" || true
        fi
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
    done
    ;;
down)
    down
    ;;
*)
    echo "usage: $0 up|down NAME" >&2
    exit 2
    ;;
esac
