#!/bin/sh
# Provision (or remove) the network namespaces forkd puts children in when they
# are forked with per_child_netns=true: forkd-child-0 .. forkd-child-<N-1>, each
# with loopback up and a tap device (default forkd-tap0) for a snapshot's NIC.
#
#   scripts/netns-setup.sh N [--tap NAME]     create (idempotent)
#   scripts/netns-setup.sh N --teardown       delete forkd-child-0 .. forkd-child-<N-1>
#   scripts/netns-setup.sh --teardown         delete every forkd-child-* namespace
#
# Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN) and iproute2. A snapshot taken with
# "tap": NAME can only be restored by a VM with the same NIC, so children need a
# tap called NAME: create the namespaces with --tap NAME.
set -eu

usage() {
    echo "usage: $0 N [--tap NAME] | [N] --teardown" >&2
    exit 2
}

n=""
tap="forkd-tap0"
teardown=0
while [ $# -gt 0 ]; do
    case "$1" in
        --teardown) teardown=1 ;;
        --tap)
            [ $# -ge 2 ] || usage
            tap="$2"
            shift
            ;;
        --tap=*) tap="${1#--tap=}" ;;
        -h | --help) usage ;;
        *)
            case "$1" in
                '' | *[!0-9]*) echo "$0: N must be a number, got '$1'" >&2; usage ;;
            esac
            n="$1"
            ;;
    esac
    shift
done

case "$tap" in
    '' | *[!A-Za-z0-9_.-]*) echo "$0: bad tap name '$tap'" >&2; exit 2 ;;
esac
if [ "${#tap}" -gt 15 ]; then
    echo "$0: tap name '$tap' is longer than 15 characters" >&2
    exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (creates network namespaces and tap devices)" >&2
    exit 1
fi
command -v ip >/dev/null || { echo "$0: iproute2 ('ip') is not installed" >&2; exit 1; }

has_netns() { [ -e "/run/netns/$1" ]; }

if [ "$teardown" -eq 1 ]; then
    if [ -n "$n" ]; then
        i=0
        while [ "$i" -lt "$n" ]; do
            if has_netns "forkd-child-$i"; then ip netns delete "forkd-child-$i"; fi
            i=$((i + 1))
        done
    else
        for path in /run/netns/forkd-child-*; do
            [ -e "$path" ] || continue
            ip netns delete "${path##*/}"
        done
    fi
    exit 0
fi

[ -n "$n" ] || usage
i=0
while [ "$i" -lt "$n" ]; do
    ns="forkd-child-$i"
    has_netns "$ns" || ip netns add "$ns"
    ip -netns "$ns" link set lo up
    if ! ip -netns "$ns" link show dev "$tap" >/dev/null 2>&1; then
        ip -netns "$ns" tuntap add dev "$tap" mode tap
    fi
    ip -netns "$ns" link set "$tap" up
    i=$((i + 1))
done
echo "forkd: $n network namespaces ready (forkd-child-0..forkd-child-$((n - 1)), tap $tap)"
