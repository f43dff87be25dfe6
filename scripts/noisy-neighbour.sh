#!/usr/bin/env bash
# A second forkd daemon with NIC sandboxes, and stress-ng on every core, on this host:
# the neighbour issue 24 asks `.ci/run` to pass beside. Nothing here leaves the host.
#
#   scripts/noisy-neighbour.sh start [N]   # a daemon on its own data dir, N NIC sandboxes (default 4)
#   scripts/noisy-neighbour.sh stop        # its sandboxes, the daemon, stress-ng, its data dir
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${NEIGHBOUR_DIR:-/tmp/forkd-neighbour}
PORT=${NEIGHBOUR_PORT:-18999}
URL="http://127.0.0.1:$PORT"
FORKD=.venv/bin/forkd

api() {  # METHOD PATH [JSON]
    curl -sf -X "$1" -H "Authorization: Bearer $(cat "$DIR/token")" -H 'Content-Type: application/json' \
        "$URL$2" ${3:+-d "$3"}
}

case "${1:-}" in
start)
    n=${2:-4}
    command -v stress-ng >/dev/null || apt-get install -y -q --no-install-recommends stress-ng >/dev/null
    mkdir -p "$DIR"
    head -c 32 /dev/urandom | base64 | tr -d '\n' > "$DIR/token"
    chmod 600 "$DIR/token"
    FORKD_IMAGES_DIR=${FORKD_IMAGES_DIR:-$HOME/.local/share/forkd/images} \
        setsid "$FORKD" daemon --bind "127.0.0.1:$PORT" --data-dir "$DIR/data" --token-file "$DIR/token" \
        > "$DIR/daemon.log" 2>&1 < /dev/null &
    echo $! > "$DIR/daemon.pid"
    for _ in $(seq 1 100); do curl -sf "$URL/healthz" >/dev/null && break; sleep 0.5; done
    api POST /v1/snapshots '{"tag":"nic","nic":true,"boot_wait_secs":240}' >/dev/null
    api POST /v1/sandboxes "{\"snapshot_tag\":\"nic\",\"n\":$n,\"per_child_netns\":true}" >/dev/null
    setsid stress-ng --cpu 2 --timeout 3h > "$DIR/stress.log" 2>&1 < /dev/null &
    echo $! > "$DIR/stress.pid"
    echo "neighbour: daemon pid $(cat "$DIR/daemon.pid") on $URL with $n NIC sandboxes; stress-ng pid $(cat "$DIR/stress.pid")"
    ;;
stop)
    [ -f "$DIR/stress.pid" ] && kill "$(cat "$DIR/stress.pid")" 2>/dev/null || true
    pkill -f "stress-ng --cpu 2 --timeout 3h" 2>/dev/null || true
    if [ -f "$DIR/daemon.pid" ]; then
        kill "$(cat "$DIR/daemon.pid")" 2>/dev/null || true  # SIGTERM: it kills its sandboxes
        for _ in $(seq 1 120); do kill -0 "$(cat "$DIR/daemon.pid")" 2>/dev/null || break; sleep 0.5; done
    fi
    rm -rf "$DIR"
    echo "neighbour stopped"
    ;;
*)
    sed -n '2,6p' "$0"
    exit 2
    ;;
esac
