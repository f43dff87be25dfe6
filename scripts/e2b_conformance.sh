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
#
# The daemon serves HTTPS with a throwaway CA made here (openssl), because E2B's SDK reaches a
# sandbox's port as https://{port}-{sandbox id}.{E2B_DOMAIN} (get_host): E2B_DOMAIN is
# forkd.localhost:PORT (two labels: TLS wildcards need them), the daemon's port proxy serves those
# hosts, its certificate names *.forkd.localhost, and the CA is trusted by the suite's
# virtualenv only (SSL_CERT_FILE, and its certifi bundle, which httpcore reads). `*.localhost` must
# resolve to 127.0.0.1 on the host (libnss-myhostname, or systemd-resolved); the script says so if
# it does not, and the get_host tests then fail. E2B_TLS=0 serves plain HTTP (no get_host).
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
export FORKD_IMAGES_DIR="${FORKD_IMAGES_DIR:-$HOME/.local/share/forkd/images}"
TLS_ARGS=() CURL_CA=() PYTEST_TLS=()
if [[ "${E2B_TLS:-1}" != 0 ]]; then
    URL="https://127.0.0.1:$PORT"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=forkd conformance CA" \
        -keyout "$DATA/ca.key" -out "$DATA/ca.pem" -addext basicConstraints=critical,CA:TRUE 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout "$DATA/tls.key" -out "$DATA/tls.csr" 2>/dev/null
    printf 'subjectAltName=DNS:localhost,DNS:*.forkd.localhost,IP:127.0.0.1\n' >"$DATA/san.ext"
    openssl x509 -req -in "$DATA/tls.csr" -CA "$DATA/ca.pem" -CAkey "$DATA/ca.key" -CAcreateserial -days 2 \
        -extfile "$DATA/san.ext" -out "$DATA/tls.pem" 2>/dev/null
    TLS_ARGS=(--tls-cert "$DATA/tls.pem" --tls-key "$DATA/tls.key")
    CURL_CA=(--cacert "$DATA/ca.pem")
    BUNDLE="$("$VENV/bin/python" -c 'import certifi; print(certifi.where())')"
    cat "$BUNDLE" "$DATA/ca.pem" >"$DATA/trust.pem"
    PYTEST_TLS=(SSL_CERT_FILE="$DATA/trust.pem" E2B_DOMAIN="forkd.localhost:$PORT")
    if ! getent hosts "1-probe.forkd.localhost" >/dev/null; then
        echo "warning: *.localhost does not resolve here, so get_host's tests fail: apt-get install" \
             "libnss-myhostname and add 'myhostname' to the hosts line of /etc/nsswitch.conf" >&2
    fi
else
    URL="http://127.0.0.1:$PORT"
fi

PYTHONPATH="$HERE/src" "$FORKD_PYTHON" -c "from forkd.cli.main import app; app()" daemon --bind "127.0.0.1:$PORT" \
    --data-dir "$DATA" --token-file "$DATA/token" "${TLS_ARGS[@]}" >"$DATA/daemon.log" 2>&1 &
DAEMON=$!
stop_daemon() {
    kill -TERM "$DAEMON" 2>/dev/null || true
    wait "$DAEMON" 2>/dev/null || true
}
trap stop_daemon EXIT
for _ in $(seq 900); do
    curl -fsS "${CURL_CA[@]}" "$URL/healthz" >/dev/null 2>&1 && break
    kill -0 "$DAEMON" 2>/dev/null || { tail -20 "$DATA/daemon.log"; exit 1; }
    sleep 0.1
done
IFS=, read -ra PAIRS <<<"$TEMPLATES"
for pair in "${PAIRS[@]}"; do
    tag="${pair%%=*}" image="${pair#*=}" nic=false
    if [[ "$image" == *+nic ]]; then image="${image%+nic}" nic=true; fi
    echo "daemon $URL (data $DATA); snapshotting $tag (image $image, nic $nic)..." >&2
    curl -fsS "${CURL_CA[@]}" -X POST "$URL/v1/snapshots" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
        -d "{\"tag\": \"$tag\", \"image\": \"$image\", \"nic\": $nic, \"boot_wait_secs\": 300}" >/dev/null
done

cd "$SUITE"
set +e
env -u E2B_DOMAIN -u E2B_DEBUG E2B_API_URL="$URL" E2B_SANDBOX_URL="$URL" E2B_API_KEY="$TOKEN" "${PYTEST_TLS[@]}" \
    "$VENV/bin/pytest" -p no:cacheprovider -q -rfE --timeout "$TIMEOUT" \
    --junitxml "$DATA/junit.xml" "$@"
STATUS=$?
set -e

python3 "$HERE/scripts/e2b_results.py" "$DATA/junit.xml"  # counts per directory, and the failures
echo "junit: $DATA/junit.xml, daemon log: $DATA/daemon.log" >&2
exit "$STATUS"
