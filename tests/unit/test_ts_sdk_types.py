"""The TypeScript SDK's generated types match the OpenAPI document the daemon serves.

Regenerates sdk/typescript/openapi.json, src/generated/schema.ts (openapi-typescript from
npm, installed by `make node-deps`) and src/generated/options.ts (the camelCase options and
their snake_case names) and diffs them against the committed files; a file in src/generated/
that the generator does not write fails too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_typescript_types_are_generated_from_the_served_openapi() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_ts_types.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
