#!/usr/bin/env bash
# Run E2B's own Python SDK tests, unchanged, against a throwaway forkd daemon (issue 20).
#
#   scripts/e2b_conformance.sh SUITE [PYTEST ARGS...]
#
# SUITE is an extracted `packages/python-sdk` of github e2b-dev/E2B (this script fetches nothing
# and none of that suite belongs in this repository), e.g.
#   git --git-dir=<mirror> archive HEAD packages/python-sdk | tar -x -C /tmp/e2b-suite
#   scripts/e2b_conformance.sh /tmp/e2b-suite/packages/python-sdk
# The PYTEST ARGS pick the tests (default: the sync directories that reach a server:
# tests/sync/api_sync tests/sync/sandbox_sync tests/sync/template_sync); give test paths or -k.
#
# E2B's code-interpreter suite (`python/` of github e2b-dev/code-interpreter) runs the same way,
# with its SDK and its template:
#   E2B_PIP='e2b-code-interpreter==2.9.1' E2B_VENV=/tmp/e2b-ci-venv \
#   FORKD_TEMPLATES='code-interpreter-v1=code-interpreter' \
#   scripts/e2b_conformance.sh /tmp/ci-suite/python tests/sync tests/charts tests/images
# (E2B_PIP: the SDK packages to install, default e2b==E2B_VERSION; FORKD_TEMPLATES: the snapshots
# to make first, TAG=IMAGE[+nic] comma-separated, default base=default; +nic gives the snapshot a
# network device, which SDKs before 2.46 need: they ask for allow_internet_access by default.) Compare with the SDK version
# the suite was written for: an older suite's mocks fail against a newer SDK's signatures.
#
# It makes a virtualenv (E2B_VENV, default /tmp/e2b-venv) with the pinned e2b SDK and the suite's
# test dependencies, starts `forkd daemon` on a free port with a scratch data dir (FORKD_PYTHON is
# the interpreter that runs forkd from this checkout's src/), snapshots `base`, runs pytest with
# E2B_API_URL / E2B_SANDBOX_URL / E2B_API_KEY pointing at the daemon, prints pass/fail counts per
# directory, and stops the daemon. The junit report and the daemon's log stay in the data dir.
set -euo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
SUITE="$(cd "${1:?usage: $0 SUITE [PYTEST ARGS...]}" && pwd)"
shift
E2B_VERSION="${E2B_VERSION:-2.63.0}"
E2B_PIP="${E2B_PIP:-e2b==$E2B_VERSION}"
TEMPLATES="${FORKD_TEMPLATES:-base=default}"
VENV="${E2B_VENV:-/tmp/e2b-venv}"
FORKD_PYTHON="${FORKD_PYTHON:-$HERE/.venv/bin/python}"
[[ -x "$FORKD_PYTHON" ]] || FORKD_PYTHON=python3
TIMEOUT="${E2B_TEST_TIMEOUT:-120}"
if [[ $# -eq 0 ]]; then
    set -- tests/sync/api_sync tests/sync/sandbox_sync tests/sync/template_sync
fi

STAMP="$VENV/.sdk-$(printf '%s' "$E2B_PIP" | tr -c 'A-Za-z0-9.=_-' '_')"
if [[ ! -f "$STAMP" ]]; then
    python3 -m venv "$VENV"
    # shellcheck disable=SC2086  # E2B_PIP is a list of requirement specs
    "$VENV/bin/pip" install -q $E2B_PIP 'pytest>=9,<10' 'pytest-asyncio>=1.3,<2' \
        'pytest-timeout>=2.4,<3' 'pytest-dotenv>=0.5.2,<0.6' 'python-dotenv>=1,<2'
    touch "$STAMP"
fi

DATA="$(mktemp -d /tmp/fkd-e2b-XXXXXX)"  # short: unix socket paths are limited
# E2B's key format (e2b_ and 40 hex digits): SDKs before 2.46 refuse any other key client-side.
TOKEN="e2b_$(python3 -c 'import secrets; print(secrets.token_hex(20))')"
printf '%s\n' "$TOKEN" >"$DATA/token"
chmod 600 "$DATA/token"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
URL="http://127.0.0.1:$PORT"
export FORKD_IMAGES_DIR="${FORKD_IMAGES_DIR:-$HOME/.local/share/forkd/images}"

PYTHONPATH="$HERE/src" "$FORKD_PYTHON" -c "from forkd.cli.main import app; app()" daemon --bind "127.0.0.1:$PORT" \
    --data-dir "$DATA" --token-file "$DATA/token" >"$DATA/daemon.log" 2>&1 &
DAEMON=$!
stop_daemon() {
    kill -TERM "$DAEMON" 2>/dev/null || true
    wait "$DAEMON" 2>/dev/null || true
}
trap stop_daemon EXIT
for _ in $(seq 900); do
    curl -fsS "$URL/healthz" >/dev/null 2>&1 && break
    kill -0 "$DAEMON" 2>/dev/null || { tail -20 "$DATA/daemon.log"; exit 1; }
    sleep 0.1
done
IFS=, read -ra PAIRS <<<"$TEMPLATES"
for pair in "${PAIRS[@]}"; do
    tag="${pair%%=*}" image="${pair#*=}" nic=false
    if [[ "$image" == *+nic ]]; then image="${image%+nic}" nic=true; fi
    echo "daemon $URL (data $DATA); snapshotting $tag (image $image, nic $nic)..." >&2
    curl -fsS -X POST "$URL/v1/snapshots" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
        -d "{\"tag\": \"$tag\", \"image\": \"$image\", \"nic\": $nic, \"boot_wait_secs\": 300}" >/dev/null
done

cd "$SUITE"
set +e
env -u E2B_DOMAIN -u E2B_DEBUG E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL" E2B_API_KEY="$TOKEN" \
    "$VENV/bin/pytest" -p no:cacheprovider -q -rfE --timeout "$TIMEOUT" \
    --junitxml "$DATA/junit.xml" "$@"
STATUS=$?
set -e

python3 - "$DATA/junit.xml" <<'EOF'
import collections, sys, xml.etree.ElementTree as ET
counts = collections.defaultdict(collections.Counter)
for case in ET.parse(sys.argv[1]).iter("testcase"):
    # tests.sync.sandbox_sync.commands.test_run[.Class]: counted by the suite's directory
    parts = case.get("classname", "").split(".")
    where = ".".join(parts[: 4 if len(parts) > 4 and not parts[3].startswith("test_") else 3])
    if any(case.find(t) is not None for t in ("failure", "error")):
        outcome = "failed"
    elif case.find("skipped") is not None:
        outcome = "skipped"
    else:
        outcome = "passed"
    counts[where][outcome] += 1
print(f"{'directory':50} passed failed skipped")
for where, c in sorted(counts.items()):
    print(f"{where:50} {c['passed']:6} {c['failed']:6} {c['skipped']:7}")
total = sum(counts.values(), collections.Counter())
print(f"{'total':50} {total['passed']:6} {total['failed']:6} {total['skipped']:7}")
EOF
echo "junit: $DATA/junit.xml, daemon log: $DATA/daemon.log" >&2
exit "$STATUS"
