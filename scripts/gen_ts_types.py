#!/usr/bin/env python3
"""Generate the TypeScript SDK's types from the daemon's served OpenAPI document.

    sdk/typescript/openapi.json                <- create_app().openapi(), what `GET /openapi.json` serves
    sdk/typescript/src/generated/schema.ts     <- openapi-typescript (npm) run on that document
    sdk/typescript/src/generated/options.ts    <- every JSON request body as camelCase options,
                                                  and the snake_case name each is sent under

The SDK's request bodies and answers are typed with ``components["schemas"][...]``
from ``schema.ts``, so a field the daemon renames or drops breaks ``tsc`` instead
of drifting silently. The option objects callers write (``SpawnOptions``,
``ForkOptions``, ...) are ``options.ts``'s ``<Schema>Options``, and the
hand-written ``src/wire.ts`` turns one into its request body with ``WIRE_NAMES``:
a new field of a request model reaches the TypeScript SDK, typed and sendable,
by regenerating these files alone. Nothing else is written into ``src/generated/``,
and ``--check`` refuses a file there that this script does not write.

Usage::

    python scripts/gen_ts_types.py           # rewrite the files
    python scripts/gen_ts_types.py --check   # exit 1 with a diff if any is stale

Needs the SDK's npm packages (``npm ci`` in sdk/typescript; ``make node-deps``).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TS = ROOT / "sdk" / "typescript"
OPENAPI = TS / "openapi.json"
GENERATED = TS / "src" / "generated"
SCHEMA = GENERATED / "schema.ts"
OPTIONS = GENERATED / "options.ts"
GENERATOR = TS / "node_modules" / ".bin" / "openapi-typescript"
WIDTH = 100
SNAKE = re.compile(r"[a-z][a-z0-9]*(_[a-z0-9]+)*")

OPTIONS_HEADER = """\
// GENERATED from the daemon's OpenAPI document by scripts/gen_ts_types.py: do not edit.
// Change the models in src/forkd/api/schemas/, then run: python scripts/gen_ts_types.py

/**
 * Every JSON request body of the REST API as the camelCase options callers write
 * (`<Schema>Options`), and `WIRE_NAMES`: the snake_case name each option is sent
 * under. `toWire` (src/wire.ts) turns options into the body, so every field of a
 * request model can be sent from TypeScript without a hand-written line.
 */

import type { components } from "./schema.js";

type Schemas = components["schemas"];"""


def served_openapi() -> dict[str, Any]:
    """The document the daemon serves (without a token: auth only adds the 401s and the scheme)."""
    from forkd.api.app import create_app
    from forkd.api.settings import Settings

    return create_app(Settings()).openapi()


def openapi_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


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


# ------------------------------------------------------------------ options.ts


def _ref_name(schema: dict[str, Any]) -> str:
    return str(schema["$ref"]).rsplit("/", 1)[-1]


def body_schemas(document: dict[str, Any]) -> list[str]:
    """The schemas of every JSON request body (``Req | null`` bodies included), and every object
    schema their fields refer to (as ``network`` does to ``NetworkPolicy``), sorted."""
    names: set[str] = set()
    for operations in document["paths"].values():
        for operation in operations.values():
            content = (operation.get("requestBody") or {}).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            if schema is None:
                continue
            for option in schema.get("anyOf", [schema]):
                if "$ref" in option:
                    names.add(_ref_name(option))
    schemas = document["components"]["schemas"]
    pending = sorted(names)
    while pending:
        for field in schemas[pending.pop()].get("properties", {}).values():
            ref = nested_ref(field)
            if ref is not None and ref not in names:
                names.add(ref)
                pending.append(ref)
    return sorted(names)


def nested_ref(field: dict[str, Any]) -> str | None:
    """The object schema a field holds (``X``, ``X | null`` or a list of ``X``), whose keys are
    camelCased too."""
    for option in field.get("anyOf", [field]):
        if "$ref" in option:
            return _ref_name(option)
        if option.get("type") == "array" and "$ref" in option.get("items", {}):
            return _ref_name(option["items"])
    return None


def is_list(field: dict[str, Any]) -> bool:
    return any(o.get("type") == "array" for o in field.get("anyOf", [field]))


def camel(name: str) -> str:
    if not SNAKE.fullmatch(name):
        raise SystemExit(f"request field {name!r} is not snake_case: give it a camelCase rule here")
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _doc(text: str, indent: str) -> list[str]:
    text = " ".join(text.replace("*/", "*\\/").split())
    if len(indent) + len(text) + 7 <= WIDTH:
        return [f"{indent}/** {text} */"]
    lines = textwrap.wrap(text, WIDTH - len(indent) - 3, break_long_words=False, break_on_hyphens=False)
    return [f"{indent}/**", *(f"{indent} * {line}" for line in lines), f"{indent} */"]


def fields_of(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """``(camelCase, snake_case, field schema)`` of each field, in snake_case order."""
    out = [(camel(snake), snake, field) for snake, field in sorted(schema.get("properties", {}).items())]
    names = [c for c, _, _ in out]
    if len(set(names)) != len(names):
        raise SystemExit(f"two fields of {schema.get('title')} have the same camelCase name: {names}")
    return out


def options_text(document: dict[str, Any]) -> str:
    schemas = document["components"]["schemas"]
    names = body_schemas(document)
    out = [OPTIONS_HEADER]
    for name in names:
        schema = schemas[name]
        required = set(schema.get("required", []))
        out.append("")
        out.extend(_doc(f"`{name}` in camelCase. {schema.get('description', '')}".strip(), ""))
        out.append(f"export interface {name}Options {{")
        for key, snake, field in fields_of(schema):
            if field.get("description"):
                out.extend(_doc(field["description"], "  "))
            ref = nested_ref(field)
            if ref is None:
                kind = f'Schemas["{name}"]["{snake}"]'
            else:
                nullable = any(o.get("type") == "null" for o in field.get("anyOf", []))
                kind = f"{ref}Options" + ("[]" if is_list(field) else "") + (" | null" if nullable else "")
            out.append(f"  {key}{'' if snake in required else '?'}: {kind};")
        out.append("}")
    out.append("")
    out.append("/** Each request schema's options, by the schema's name. */")
    out.append("export interface RequestOptions {")
    out.extend(f"  {name}: {name}Options;" for name in names)
    out.append("}")
    out.append("")
    out.append("/** A field's wire name, or `[wire name, schema]` for a field that is itself options. */")
    out.append("export type WireName<S extends keyof RequestOptions> =")
    out.append("  | keyof Schemas[S]")
    out.append("  | readonly [keyof Schemas[S], keyof RequestOptions];")
    out.append("")
    out.append("/** The snake_case name each camelCase option is sent under, by schema. */")
    out.append("export const WIRE_NAMES = {")
    for name in names:
        out.append(f"  {name}: {{")
        for key, snake, field in fields_of(schemas[name]):
            ref = nested_ref(field)
            out.append(f'    {key}: "{snake}",' if ref is None else f'    {key}: ["{snake}", "{ref}"],')
        out.append("  },")
    # The exact keys of each options type, each naming a field of its schema: tsc rejects a hand edit.
    out.append("} as const satisfies {")
    out.append("  readonly [S in keyof RequestOptions]: {")
    out.append("    readonly [K in keyof RequestOptions[S]]-?: WireName<S>;")
    out.append("  };")
    out.append("};")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------- main


def diff(path: Path, want: str | None) -> list[str]:
    have = path.read_text() if path.exists() else ""
    rel = str(path.relative_to(ROOT))
    if want is None:
        return [f"{rel}: not written by scripts/gen_ts_types.py: src/generated/ holds generated files only\n"]
    return list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), rel, f"{rel} (generated)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report stale files (exit 1)")
    args = parser.parse_args(argv)
    document = served_openapi()
    openapi = openapi_text(document)
    wanted: dict[Path, str | None] = {
        OPENAPI: openapi, SCHEMA: schema_text(openapi), OPTIONS: options_text(document),
    }
    if args.check:
        strays = {p: None for p in GENERATED.rglob("*") if p.is_file() and p not in wanted}
        stale = [line for path, text in {**wanted, **strays}.items() for line in diff(path, text)]
        if stale:
            sys.stdout.writelines(stale[:200])
            print("\nthe TypeScript SDK's types are stale: run `python scripts/gen_ts_types.py`")
            return 1
        return 0
    GENERATED.mkdir(exist_ok=True)
    for path, text in wanted.items():
        assert text is not None
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
