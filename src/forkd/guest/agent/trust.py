"""Trusting the sandbox's egress CA: the restore's ``trust`` input, put where the guest's TLS
clients look, so that the daemon can intercept HTTPS to hosts with header rules (host/egress_tls.py).

The CA is the sandbox's own; the daemon sends only its certificate (RestoreInputs checked it is
one PEM certificate). It goes into its own file and at the end of each trust bundle the image
has, after a mark, in place of what an earlier restore put there: a fork's child drops its
parent's CA for its own. The agent's environment then names the bundle, so what exec and eval
start (OpenSSL, Python's ssl, requests, Node) trusts it.
"""

from __future__ import annotations

import os
from pathlib import Path

# Where the sandbox's egress CA goes (RestoreInputs.trust): its own file, and the end of each
# trust bundle the image has (Debian/Ubuntu/Alpine, RHEL, Alpine's and BSDs' name), after a mark.
TRUST_PEM = Path("/etc/ssl/certs/forkd-egress-ca.pem")
TRUST_BUNDLES = (Path("/etc/ssl/certs/ca-certificates.crt"), Path("/etc/pki/tls/certs/ca-bundle.crt"),
                 Path("/etc/ssl/cert.pem"))
TRUST_MARK = "# forkd: this sandbox's egress CA (header rules)\n"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.forkd")
    tmp.write_text(text)
    tmp.chmod(0o644)
    os.replace(tmp, path)


def trust_ca(pem: str, bundles: tuple[Path, ...] = TRUST_BUNDLES, own: Path = TRUST_PEM) -> Path:
    """Trust ``pem`` (checked by RestoreInputs): written to ``own``, and put at the end of each
    bundle the image has in place of what an earlier restore put there (a forked child's parent's
    CA goes); the agent's environment points the usual variables at the bundle, so what exec and
    eval start (OpenSSL, Python's ssl, requests, Node) trusts it. Returns the bundle."""
    own.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(own, pem)
    done: list[Path] = []
    for bundle in bundles:
        if not bundle.exists() or (real := bundle.resolve()) in done:
            continue
        text = real.read_text(errors="replace")
        text = text.split(TRUST_MARK, 1)[0]
        _write_atomically(real, text + ("" if text.endswith("\n") or not text else "\n") + TRUST_MARK + pem)
        done.append(real)
    if not done:  # an image without a trust store: this CA alone is what it trusts
        bundles[0].parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(bundles[0], TRUST_MARK + pem)
        done.append(bundles[0])
    os.environ.update({"SSL_CERT_FILE": str(done[0]), "REQUESTS_CA_BUNDLE": str(done[0]),
                       "NODE_EXTRA_CA_CERTS": str(own)})
    return done[0]
