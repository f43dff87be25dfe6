"""docs/API.md is checked against the OpenAPI spec the daemon serves."""

from __future__ import annotations

import re
from pathlib import Path

from forkd.api.app import create_app
from forkd.api.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "API.md"
HIDDEN = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}


def served_operations() -> set[tuple[str, str]]:
    spec = create_app(Settings()).openapi()
    return {
        (method.upper(), path)
        for path, ops in spec["paths"].items()
        if path not in HIDDEN
        for method in ops
    }


def documented_operations() -> set[tuple[str, str]]:
    ops = set()
    for m in re.finditer(r"^#+ (GET|POST|DELETE|PUT|PATCH) (\S+)", DOC.read_text(), re.M):
        ops.add((m.group(1), m.group(2).split("?")[0]))
    return ops


def test_every_served_route_is_documented_and_vice_versa() -> None:
    served, documented = served_operations(), documented_operations()
    assert served - documented == set(), "routes missing from docs/API.md"
    assert documented - served == set(), "docs/API.md documents routes the daemon does not serve"


def test_documented_request_fields_exist_in_the_spec() -> None:
    spec = create_app(Settings()).openapi()
    schemas = spec["components"]["schemas"]
    for name in ("CreateSnapshotRequest", "SpawnRequest", "ExecRequest", "EvalRequest", "BranchRequest"):
        assert name in schemas, name
    text = DOC.read_text()
    for field in schemas["SpawnRequest"]["properties"]:
        assert f"`{field}`" in text or f'"{field}"' in text, f"SpawnRequest.{field} undocumented"
    for field in schemas["BranchRequest"]["properties"]:
        assert f"`{field}`" in text or f'"{field}"' in text, f"BranchRequest.{field} undocumented"
