"""``python -m forkd.api``: run the REST daemon. Flags override ``FORKD_*`` variables."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from forkd.api.server import serve
from forkd.api.settings import ConfigError, Settings, parse_bind


def _parser(defaults: Settings) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m forkd.api", description=__doc__)
    p.add_argument("--bind", default=defaults.bind, help="host:port (default %(default)s; FORKD_BIND)")
    p.add_argument(
        "--token-file",
        type=Path,
        default=defaults.token_file,
        help="file holding the bearer token (FORKD_TOKEN_FILE)",
    )
    p.add_argument(
        "--tls-cert", type=Path, default=defaults.tls_cert, help="PEM certificate (FORKD_TLS_CERT)"
    )
    p.add_argument("--tls-key", type=Path, default=defaults.tls_key, help="PEM private key (FORKD_TLS_KEY)")
    p.add_argument(
        "--data-dir", type=Path, default=defaults.data_dir, help="state directory (FORKD_DATA_DIR)"
    )
    p.add_argument(
        "--keep-sandboxes",
        action=argparse.BooleanOptionalAction,
        default=defaults.keep_sandboxes,
        help="leave sandboxes running on shutdown (FORKD_KEEP_SANDBOXES)",
    )
    p.add_argument(
        "--audit-log",
        type=Path,
        default=defaults.audit_log,
        help="audit log path (default <data-dir>/audit.log)",
    )
    p.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    p.add_argument(
        "--branch-concurrency",
        type=int,
        default=defaults.branch_concurrency,
        help="max concurrent BRANCH calls (default %(default)s; FORKD_BRANCH_CONCURRENCY)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        defaults = Settings.from_env()
        args = _parser(defaults).parse_args(argv)
        host, port = parse_bind(args.bind)
        settings = replace(
            defaults,
            host=host,
            port=port,
            token_file=args.token_file,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            data_dir=args.data_dir,
            keep_sandboxes=args.keep_sandboxes,
            audit_log=args.audit_log,
            max_body_bytes=args.max_body_bytes,
            branch_concurrency=args.branch_concurrency,
        )
        serve(settings, log_level=args.log_level)
    except ConfigError as exc:
        print(f"forkd: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
