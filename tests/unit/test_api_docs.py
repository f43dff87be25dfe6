"""docs/API.md is checked against the OpenAPI document the daemon serves.

Everything is derived from the served spec, so a new route, request model,
field, bound or default fails here until API.md describes it:

* every route is documented under a ``### METHOD /path`` heading, and every
  such heading is a served route;
* for every operation with a request body, each field of its model is a row
  of the field table in that operation's section (``| `name` | type | default |
  … |``), and no row names a field the model lacks;
* each row's type cell states the field's JSON type and its bounds
  (``128-16384`` with an en dash, ``> 0, ≤ 86400``, ``≥ 1024``, ``≤ 256 items``, ``non-empty``);
  the row names what its string pattern allows (``tag pattern``, ``no NUL``, …);
  the default cell states the schema's default (``required`` for required fields);
* query parameters appear with their defaults in the heading (``?cascade=false``),
  and path parameters' patterns are spelled out;
* an optional request body is said to be optional.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from forkd.api import code_routes, schemas
from forkd.api.app import create_app
from forkd.api.schemas import requests
from forkd.api.settings import Settings
from forkd.host import egress

DOC = Path(__file__).resolve().parents[2] / "docs" / "API.md"
HIDDEN = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
HEADING = re.compile(r"^#{2,4} (GET|POST|DELETE|PUT|PATCH) (\S+)[^\n]*$", re.M)
ROW = re.compile(r"^\| `(?P<name>[a-z_]+)` \| (?P<type>[^|]*(?:\\\|[^|]*)*) \| (?P<default>[^|]*) \|", re.M)

# How API.md says what each pattern of forkd.api.schemas allows.
PATTERN_WORDS = {
    schemas.TAG_PATTERN: "tag pattern",
    schemas.SANDBOX_ID_PATTERN: "sandbox id",
    schemas.TAP_PATTERN: "≤ 15 chars",
    schemas.MODULE_PATTERN: "module names",
    schemas.NO_NUL_PATTERN: "no NUL",
    schemas.NON_EMPTY_NO_NUL_PATTERN: "non-empty, no NUL",
    schemas.ENV_NAME_PATTERN: "no `=`, no NUL",
    schemas.TREE_ID_PATTERN: "fork-tree id",
    schemas.DIGEST_PATTERN: "64 hex digits",
    schemas.VAR_NAME_PATTERN: "a variable name",
    schemas.GUEST_PATH_PATTERN: "absolute, no NUL",
    schemas.IMAGE_REF_CHARS: "letters, digits, `._:/@[]-`",
    schemas.GUEST_USER_PATTERN: "a guest user's name",
    code_routes.CONTEXT_PATTERN: "context id",
    egress.ENTRY_PATTERN: "IPv4 address, CIDR or DNS name, optional :PORT or :FIRST-LAST",
    egress.MASK_HOST_PATTERN: "host name, optional :port",
    requests.HOSTNAME_PATTERN: "RFC 1123 host name",
}
EN_DASH = "\N{EN DASH}"  # ranges read 128–16384 in API.md  # noqa: RUF003
JSON_TYPE_WORDS = {
    "integer": "integer", "number": "number", "string": "string", "boolean": "bool",
    "array": "list", "object": "object",
}


@cache
def spec() -> dict[str, Any]:
    return create_app(Settings()).openapi()


@cache
def doc() -> str:
    return DOC.read_text()


def served_operations() -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, ops in spec()["paths"].items()
        if path not in HIDDEN
        for method in ops
    }


def documented_operations() -> set[tuple[str, str]]:
    return {(m.group(1), m.group(2).split("?")[0]) for m in HEADING.finditer(doc())}


def section(method: str, path: str) -> tuple[str, str]:
    """(heading line, body) of the operation's section: up to the next heading of any level."""
    for m in HEADING.finditer(doc()):
        if (m.group(1), m.group(2).split("?")[0]) == (method, path):
            rest = doc()[m.end():]
            end = re.search(r"^#{1,4} ", rest, re.M)
            return m.group(0), rest[: end.start() if end else len(rest)]
    raise AssertionError(f"docs/API.md has no section for {method} {path}")


def resolve(schema: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Follow a $ref and unwrap ``anyOf: [X, null]``; returns (schema, nullable)."""
    nullable = False
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"]
        nullable = len(options) < len(schema["anyOf"])
        assert len(options) == 1, f"cannot document a union: {schema}"
        merged = {k: v for k, v in schema.items() if k != "anyOf"}
        schema = {**options[0], **merged}
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = {**spec()["components"]["schemas"][name], **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema, nullable


def num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


@dataclass(frozen=True)
class BodyField:
    method: str
    path: str
    model: str
    name: str
    schema: dict[str, Any]
    required: bool

    def __str__(self) -> str:
        return f"{self.model}.{self.name} ({self.method} {self.path})"


def request_models() -> list[tuple[str, str, str, dict[str, Any], bool]]:
    """(method, path, model name, model schema, body required) for every operation with a body."""
    out = []
    for path, ops in spec()["paths"].items():
        for method, op in ops.items():
            body = op.get("requestBody")
            if body is None or "application/json" not in body["content"]:
                continue  # a raw upload (PUT .../files) has no fields to document
            raw = body["content"]["application/json"]["schema"]
            ref = raw.get("$ref") or next(s["$ref"] for s in raw["anyOf"] if "$ref" in s)
            model, _ = resolve(raw)
            out.append((method.upper(), path, ref.rsplit("/", 1)[-1], model, bool(body.get("required"))))
    return out


def body_fields() -> list[BodyField]:
    return [
        BodyField(method, path, name, field, prop, field in model.get("required", []))
        for method, path, name, model, _ in request_models()
        for field, prop in model["properties"].items()
    ]


def documented_rows(method: str, path: str) -> dict[str, re.Match[str]]:
    _, body = section(method, path)
    return {m.group("name"): m for m in ROW.finditer(body)}


def expected_bounds(prop: dict[str, Any]) -> list[str]:
    """What the type cell must say about the field's numeric and length bounds."""
    words = []
    low, high = prop.get("minimum"), prop.get("maximum")
    if "exclusiveMinimum" in prop:
        words.append(f"> {num(prop['exclusiveMinimum'])}")
        if high is not None:
            words.append(f"≤ {num(high)}")
    elif low is not None and high is not None:
        words.append(f"{num(low)}{EN_DASH}{num(high)}")
    elif low is not None:
        words.append(f"≥ {num(low)}")
    elif high is not None:
        words.append(f"≤ {num(high)}")
    if "maxItems" in prop:
        words.append(f"≤ {prop['maxItems']} items")
    if prop.get("minItems") == 1 or prop.get("minLength") == 1:
        words.append("non-empty")
    return words


def expected_patterns(prop: dict[str, Any]) -> list[str]:
    """Phrases for the patterns of the field, its items and (for objects) its keys and values."""
    found = []
    for part in (prop, prop.get("items", {}), prop.get("propertyNames", {}),
                 *prop.get("patternProperties", {}).values()):
        part, _ = resolve(part) if part else (part, False)
        if "pattern" in part:
            assert part["pattern"] in PATTERN_WORDS, (
                f"pattern {part['pattern']!r} has no wording in PATTERN_WORDS; say in API.md what it "
                "allows and add the phrase here")
            found.append(PATTERN_WORDS[part["pattern"]])
    return found


# ------------------------------------------------------------------- routes


def test_every_served_route_is_documented_and_vice_versa() -> None:
    served, documented = served_operations(), documented_operations()
    assert served - documented == set(), "routes missing from docs/API.md"
    assert documented - served == set(), "docs/API.md documents routes the daemon does not serve"


@pytest.mark.parametrize(("method", "path"), sorted(served_operations()))
def test_query_parameters_are_in_the_heading_with_their_defaults(method: str, path: str) -> None:
    heading, _ = section(method, path)
    for param in spec()["paths"][path][method.lower()].get("parameters", []):
        if param["in"] == "query":
            schema, _ = resolve(param["schema"])
            # An optional filter has no default: the heading names it with a placeholder.
            expected = (f"{param['name']}={json.dumps(schema['default'])}" if "default" in schema
                        else f"{param['name']}=")
            assert expected in heading, f"{method} {path}: heading should show ?{expected}"


def test_path_parameter_patterns_are_spelled_out() -> None:
    patterns = {
        param["schema"]["pattern"]
        for ops in spec()["paths"].values() for op in ops.values()
        for param in op.get("parameters", []) if param["in"] == "path" and "pattern" in param["schema"]
    }
    assert patterns, "no path parameter has a pattern"
    for pattern in patterns:
        assert f"`{pattern}`" in doc(), f"docs/API.md should give the path parameter pattern {pattern}"


# ----------------------------------------------------------- request bodies


def test_the_request_models_are_found() -> None:
    """The derivation itself: every *Request schema is some operation's body."""
    found = {name for _, _, name, _, _ in request_models()}
    declared = {n for n in spec()["components"]["schemas"] if n.endswith("Request")}
    assert found == declared
    assert {"CreateSnapshotRequest", "SpawnRequest", "ExecRequest", "EvalRequest", "BranchRequest"} <= found


@pytest.mark.parametrize(("method", "path", "model", "required"),
                         [(m, p, n, r) for m, p, n, _, r in request_models()])
def test_no_row_documents_a_field_the_model_lacks(method: str, path: str, model: str, required: bool) -> None:
    properties = spec()["components"]["schemas"][model]["properties"]
    stale = set(documented_rows(method, path)) - set(properties)
    assert not stale, f"{method} {path} documents fields {model} does not have: {sorted(stale)}"
    if not required:
        assert "optional" in section(method, path)[1], f"{method} {path}: say that the body is optional"


@pytest.mark.parametrize("field", body_fields(), ids=str)
def test_every_request_field_is_documented_with_its_type_bounds_and_default(field: BodyField) -> None:
    rows = documented_rows(field.method, field.path)
    assert field.name in rows, f"{field}: no `| `{field.name}` | … |` row in its API.md section"
    row = rows[field.name]
    type_cell, default_cell = row.group("type"), row.group("default").strip()
    whole_row = row.string[row.start(): row.string.find("\n", row.start())]
    prop, _ = resolve(field.schema)

    if "enum" in prop:
        for value in prop["enum"]:
            assert f'`"{value}"`' in type_cell, f"{field}: type cell lacks the value {value!r}"
    else:
        word = JSON_TYPE_WORDS[prop["type"]]
        assert word in type_cell, f"{field}: type cell {type_cell!r} should say {word!r}"
    for bound in expected_bounds(prop):
        assert bound in type_cell, f"{field}: type cell {type_cell!r} should state {bound!r}"
    for phrase in expected_patterns(prop):
        assert phrase in whole_row, f"{field}: row should say what the pattern allows ({phrase!r})"

    if field.required:
        assert default_cell == "required", f"{field}: default cell should be 'required'"
    else:
        assert default_cell != "required", f"{field}: the field is optional"
        if "default" in field.schema:
            expected = f"`{json.dumps(field.schema['default'])}`"
            assert default_cell.startswith(expected), f"{field}: default cell should be {expected}"
