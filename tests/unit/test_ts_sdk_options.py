"""Every field of every request model can be sent from the TypeScript SDK.

The SDK's option objects and their snake_case names are generated into
sdk/typescript/src/generated/options.ts (scripts/gen_ts_types.py). Here the committed
mapping is read back and compared with the request schemas of the document the daemon
serves, independently of the generator; then node runs the SDK's offline test, which
calls each method with every field set and checks the body it sends.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from forkd.api.app import create_app
from forkd.api.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
TS = ROOT / "sdk" / "typescript"
OPTIONS = TS / "src" / "generated" / "options.ts"


def request_schemas(document: dict[str, Any]) -> set[str]:
    """Every JSON request body's schema (a ``Req | null`` body too)."""
    names: set[str] = set()
    for operations in document["paths"].values():
        for operation in operations.values():
            content = (operation.get("requestBody") or {}).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            for option in (schema or {}).get("anyOf", [schema] if schema else []):
                if "$ref" in option:
                    names.add(option["$ref"].rsplit("/", 1)[-1])
    return names


def wire_names() -> dict[str, dict[str, str]]:
    """``WIRE_NAMES`` of options.ts: schema -> {camelCase option: snake_case field}."""
    text = OPTIONS.read_text()
    block = text[text.index("export const WIRE_NAMES = {"):text.index("} as const satisfies")]
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] = {}
    for line in block.splitlines()[1:]:
        if m := re.fullmatch(r"  (\w+): \{", line):
            current = out.setdefault(m[1], {})
        elif m := re.fullmatch(r'    (\w+): (?:"(\w+)"|\["(\w+)", "\w+"\]),', line):
            current[m[1]] = m[2] or m[3]
    return out


def test_every_field_of_every_request_body_has_a_camelcase_option() -> None:
    document = create_app(Settings()).openapi()
    schemas = document["components"]["schemas"]
    mapping = wire_names()
    assert request_schemas(document) <= set(mapping), sorted(request_schemas(document) - set(mapping))
    for name in request_schemas(document):
        sent = set(mapping[name].values())
        fields = set(schemas[name].get("properties", {}))
        assert sent == fields, f"{name}: unsendable {sorted(fields - sent)}, unknown {sorted(sent - fields)}"
        for option, field in mapping[name].items():
            assert option == re.sub(r"_([a-z0-9])", lambda m: m[1].upper(), field), (name, option, field)


def test_the_spawn_fields_that_had_drifted_are_options() -> None:
    spawn = wire_names()["SpawnRequest"]
    assert spawn["diskQuotaMib"] == "disk_quota_mib"
    assert spawn["hibernateOnTimeout"] == "hibernate_on_timeout"
    assert spawn["prewarm"] == "prewarm"


def test_the_typescript_sdk_sends_every_request_field() -> None:
    """tsc builds the SDK and its tests; node runs test/options.test.ts (no daemon)."""
    npm = shutil.which("npm")
    assert npm and (TS / "node_modules").is_dir(), "run `make node-deps` (npm ci in sdk/typescript) first"
    for script in ("build", "build:test", "test:offline"):
        out = subprocess.run([npm, "run", "--silent", script], cwd=TS, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, f"npm run {script}:\n{out.stdout[-6000:]}{out.stderr[-2000:]}"
