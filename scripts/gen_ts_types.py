#!/usr/bin/env python3
"""Generate the TypeScript SDK's types from the daemon's served OpenAPI document.

    sdk/typescript/openapi.json   <- create_app().openapi(), what `GET /openapi.json` serves
    sdk/typescript/src/schema.ts  <- openapi-typescript (npm) run on that document

The SDK's request bodies and answers are typed with ``components["schemas"][...]``
from ``schema.ts``, so a field the daemon renames or drops breaks ``tsc`` instead
of drifting silently.

Usage::

    python scripts/gen_ts_types.py           # rewrite both files
    python scripts/gen_ts_types.py --check   # exit 1 with a diff if either is stale

Needs the SDK's npm packages (``npm ci`` in sdk/typescript; ``make node-deps``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TS = ROOT / "sdk" / "typescript"
OPENAPI = TS / "openapi.json"
SCHEMA = TS / "src" / "schema.ts"
GENERATOR = TS / "node_modules" / ".bin" / "openapi-typescript"


def served_openapi() -> dict[str, Any]:
    """The document the daemon serves (without a token: auth only adds the 401s and the scheme)."""
    from forkd.api.app import create_app
    from forkd.api.settings import Settings

    return create_app(Settings()).openapi()


def openapi_text() -> str:
    return json.dumps(served_openapi(), indent=2, sort_keys=True) + "\n"


def schema_text(openapi: str) -> str:
    if not GENERATOR.exists():
        sys.exit(f"{GENERATOR} is missing: run `make node-deps` (npm ci in sdk/typescript) first")
    with tempfile.TemporaryDirectory() as tmp:
        source, target = Path(tmp) / "openapi.json", Path(tmp) / "schema.ts"
        source.write_text(openapi)
        subprocess.run(
            [str(GENERATOR), str(source), "--output", str(target), "--default-non-nullable", "false"],
            check=True, cwd=TS, stdout=subprocess.DEVNULL,
        )
        return target.read_text()


def diff(path: Path, want: str) -> list[str]:
    have = path.read_text() if path.exists() else ""
    rel = str(path.relative_to(ROOT))
    return list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), rel, f"{rel} (generated)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1)")
    args = parser.parse_args(argv)
    openapi = openapi_text()
    wanted = {OPENAPI: openapi, SCHEMA: schema_text(openapi)}
    if args.check:
        stale = [line for path, text in wanted.items() for line in diff(path, text)]
        if stale:
            sys.stdout.writelines(stale[:200])
            print("\nthe TypeScript SDK's types are stale: run `python scripts/gen_ts_types.py`")
            return 1
        return 0
    for path, text in wanted.items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
