#!/usr/bin/env bash
# The virtualenv of published clients the compatibility tests run unchanged: forkd 0.5.3's SDK,
# forkd-mcp 0.2.1 (and the mcp client that drives it) and the E2B SDKs, pinned in
# tests/clients/requirements.txt. Idempotent: rebuilt only when that file changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${CLIENTS_VENV:-.venv-clients}"
REQS=tests/clients/requirements.txt
STAMP="$VENV/.installed"
if [[ -f "$STAMP" && "$STAMP" -nt "$REQS" ]]; then
    exit 0
fi
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q -r "$REQS"
touch "$STAMP"
