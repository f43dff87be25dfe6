#!/usr/bin/env python3
"""Generate the Python SDK's request and response types from the daemon's served OpenAPI document.

    src/forkd/sdk/_generated/models.py  <- create_app().openapi()["components"]["schemas"]

imported as ``forkd.sdk.models`` (a hand-written re-export); ``_generated/`` holds only
generated modules, and ``scripts/unasync_sdk.py --check`` refuses a file there that no
generator writes.

Every schema becomes a ``TypedDict`` of the same name: required fields are
``Required[...]``, the rest may be missing (``total=False``), enums are
``Literal``s and a ``$ref`` is the referenced TypedDict. The SDK's answers stay
the plain dicts the daemon sends (``info["id"]`` keeps working); these types only
describe them, as ``sdk/typescript/src/generated/schema.ts`` does for the TypeScript SDK.

For the request bodies in ``EXTRAS`` it also writes a ``<Name>Extra`` TypedDict:
the request's optional fields that the hand-written ``AsyncController`` method
(its parts in ``src/forkd/sdk/async_routes/``, read with ``ast``) does not name as a
parameter. The method takes them as ``**options: Unpack[<Name>Extra]`` and sends
them as they are, so a new optional field of a request model (api/schemas/requests.py)
reaches the Python SDK, typed, by regenerating this file alone.

Usage::

    python scripts/gen_sdk_models.py           # rewrite the module
    python scripts/gen_sdk_models.py --check   # exit 1 with a diff if it is stale
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import keyword
import re
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "src" / "forkd" / "sdk" / "_generated" / "models.py"
# The hand-written client's route parts (AsyncController is their union), read with ``ast``.
ROUTES = ROOT / "src" / "forkd" / "sdk" / "async_routes"
WIDTH = 100
ANNOTATIONS: list[str] = []  # every annotation written, for the imports

# (request schema, generated TypedDict, the AsyncController methods that take it as **options).
EXTRAS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("CreateSnapshotRequest", "CreateSnapshotExtra", ("create_snapshot",)),
    ("SpawnRequest", "SpawnExtra", ("spawn_sandboxes",)),
    ("ForkRequest", "ForkExtra", ("fork_sandbox", "fork_tree")),
    ("BranchRequest", "BranchExtra", ("branch_sandbox",)),
    ("PoolRequest", "PoolExtra", ("set_pool",)),
    ("TemplateBuildRequest", "TemplateBuildExtra", ("build_template",)),
)

HEADER = '''\
# GENERATED from the daemon's OpenAPI document by scripts/gen_sdk_models.py — do not edit.
# Change the models in src/forkd/api/schemas/ (or the records in src/forkd/controller/results.py
# that its response models derive from), then run: python scripts/gen_sdk_models.py
"""The REST API's request and response bodies as ``TypedDict``s (generated).

One per schema of ``GET /openapi.json``. The controllers return the daemon's JSON
as plain dicts; these types describe them. ``*Extra`` are the optional request
fields a controller method does not name itself: it takes them as keyword
arguments and sends them unchanged.
"""

from typing import {imports}

'''


def served_openapi() -> dict[str, Any]:
    """The document the daemon serves (as scripts/gen_ts_types.py builds it)."""
    from forkd.api.app import create_app
    from forkd.api.settings import Settings

    return create_app(Settings()).openapi()


def _union(parts: Iterable[str]) -> str:
    out: list[str] = []
    for part in parts:
        for piece in part.split(" | "):
            if piece not in out:
                out.append(piece)
    if "Any" in out:
        return "Any"
    # None last, as written by hand.
    out.sort(key=lambda p: p == "None")
    return " | ".join(out)


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) else repr(value)


def py_type(schema: dict[str, Any]) -> str:
    """The Python annotation of one JSON schema."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _union(py_type(s) for s in schema[key])
    if "allOf" in schema and len(schema["allOf"]) == 1:
        return py_type(schema["allOf"][0])
    if "const" in schema:
        return f"Literal[{_literal(schema['const'])}]"
    if "enum" in schema:
        return "Literal[" + ", ".join(_literal(v) for v in schema["enum"]) + "]"
    kind = schema.get("type")
    if isinstance(kind, list):
        return _union(py_type({**schema, "type": k}) for k in kind)
    if kind == "string":
        return "str"
    if kind == "integer":
        return "int"
    if kind == "number":
        return "float"
    if kind == "boolean":
        return "bool"
    if kind == "null":
        return "None"
    if kind == "array":
        items = schema.get("items")
        return f"list[{py_type(items) if isinstance(items, dict) else 'Any'}]"
    if kind == "object":
        values = schema.get("additionalProperties")
        if isinstance(values, dict) and values:
            return f"dict[str, {py_type(values)}]"
        patterns = schema.get("patternProperties")
        if isinstance(patterns, dict) and patterns:
            return f"dict[str, {_union(py_type(s) for s in patterns.values())}]"
        return "dict[str, Any]"
    return "Any"


def _docstring(text: str, indent: str) -> list[str]:
    text = " ".join(text.replace('"""', "'''").replace("\\", "\\\\").split())
    if len(indent) + len(text) + 6 <= WIDTH:
        return [f'{indent}"""{text}"""']
    lines = textwrap.wrap(text, WIDTH - len(indent))
    return [f'{indent}"""{lines[0]}', *(f"{indent}{line}" for line in lines[1:]), f'{indent}"""']


def _fit(prefix: str, annotation: str) -> list[str]:
    """``prefix + annotation``, its longest bracket broken over lines if the line is too long."""
    line = prefix + annotation
    if len(line) <= WIDTH or "[" not in annotation:
        return [line]
    start = line.index("[", line.rindex("Literal[") if "Literal[" in line else line.index("[")) + 1
    end = line.index("]", start)
    inner = textwrap.wrap(line[start:end], WIDTH - 8, break_long_words=False, break_on_hyphens=False)
    return [line[:start], *(f"        {part}" for part in inner), f"    {line[end:]}"]


def refs(schema: Any) -> set[str]:
    """The schema names that ``schema`` refers to, at any depth."""
    if isinstance(schema, dict):
        out = {str(schema["$ref"]).rsplit("/", 1)[-1]} if "$ref" in schema else set()
        return out.union(*(refs(v) for v in schema.values()))
    if isinstance(schema, list):
        return set().union(*(refs(v) for v in schema))
    return set()


def in_order(schemas: dict[str, dict[str, Any]]) -> list[str]:
    """Schema names sorted, each after the ones it refers to (a cycle is broken where met)."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for ref in sorted(refs(schemas[name]) & set(schemas)):
            visit(ref)
        order.append(name)

    for name in sorted(schemas):
        visit(name)
    return order


def field_type(schema: dict[str, Any], required: bool, defined: set[str]) -> str:
    """A field's annotation; quoted where it names a model not yet defined (the module has no
    ``from __future__ import annotations``, which would hide ``Required`` from the runtime)."""
    text = py_type(schema)
    if refs(schema) - defined:
        text = f'"{text}"'
    return f"Required[{text}]" if required else text


def typed_dict(name: str, fields: dict[str, dict[str, Any]], required: set[str], doc: str,
               defined: set[str]) -> list[str]:
    """One ``class Name(TypedDict, total=False)`` (or the call form when a key is not a name)."""
    annotations = {key: field_type(schema, key in required, defined) for key, schema in fields.items()}
    ANNOTATIONS.extend(annotations.values())
    if any(not key.isidentifier() or keyword.iskeyword(key) for key in fields):
        items = ", ".join(f"{key!r}: {annotation}" for key, annotation in annotations.items())
        return [f"{name} = TypedDict({name!r}, {{{items}}}, total=False)", f"# {doc}"[:WIDTH]]
    out = [f"class {name}(TypedDict, total=False):", *_docstring(doc, "    ")]
    for key, annotation in annotations.items():
        out.append("")
        out += _fit(f"    {key}: ", annotation)
        description = fields[key].get("description")
        if description:
            out += _docstring(str(description), "    ")
    return out


def named_parameters(methods: Iterable[str], parts: Path = ROUTES) -> set[str]:
    """The parameters (not ``**``) that every one of ``methods`` of AsyncController names."""
    defs: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for source in sorted(parts.glob("*.py")):
        tree = ast.parse(source.read_text(encoding="utf-8"))
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            defs |= {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    names: set[str] = set()
    for method in methods:
        if method not in defs:
            raise SystemExit(f"AsyncController.{method} (EXTRAS in {__file__}) does not exist")
        args = defs[method].args
        names |= {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - {"self"}
    return names


def models_text(openapi: dict[str, Any]) -> str:
    schemas: dict[str, dict[str, Any]] = openapi["components"]["schemas"]
    ANNOTATIONS.clear()
    blocks: list[list[str]] = []
    defined: set[str] = set()
    for name in in_order(schemas):
        schema = schemas[name]
        doc = str(schema.get("description") or f"The ``{name}`` schema.")
        blocks.append(typed_dict(name, schema.get("properties", {}), set(schema.get("required", [])), doc,
                                 defined))
        defined.add(name)
    for request, extra, methods in EXTRAS:
        schema = schemas[request]
        named = named_parameters(methods)
        required = set(schema.get("required", []))
        fields = {k: v for k, v in schema.get("properties", {}).items() if k not in named | required}
        listed = " and ".join(f"``{m}``" for m in methods)
        verb = "takes" if len(methods) == 1 else "take"
        doc = (f"The optional fields of ``{request}`` that {listed} {verb} as keyword arguments "
               "(the rest are parameters of their own).")
        blocks.append(typed_dict(extra, fields, set(), doc, defined))  # a docstring alone when none is left
    names = sorted(schemas) + [extra for _, extra, _ in EXTRAS]
    body = "\n\n\n".join("\n".join(block) for block in blocks)
    exports = "\n".join(f'    "{n}",' for n in sorted(names))
    # Only the typing names some annotation uses (ruff: no unused imports).
    used = [n for n in ("Any", "Literal", "Required") if re.search(rf"\b{n}\b", " ".join(ANNOTATIONS))]
    header = HEADER.format(imports=", ".join([*used, "TypedDict"]))
    return f"{header}\n{body}\n\n\n__all__ = [\n{exports}\n]\n"


def diff(path: Path, want: str) -> list[str]:
    have = path.read_text(encoding="utf-8") if path.exists() else ""
    rel = str(path.relative_to(ROOT))
    return list(difflib.unified_diff(have.splitlines(True), want.splitlines(True), rel, f"{rel} (generated)"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only report a stale module (exit 1)")
    args = parser.parse_args(argv)
    want = models_text(served_openapi())
    if args.check:
        stale = diff(MODELS, want)
        if stale:
            sys.stdout.writelines(stale[:200])
            print("\nthe Python SDK's models are stale: run `python scripts/gen_sdk_models.py`")
            return 1
        return 0
    MODELS.write_text(want, encoding="utf-8")
    print(f"wrote {MODELS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
