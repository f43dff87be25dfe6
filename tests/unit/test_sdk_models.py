"""The Python SDK's models are generated from the OpenAPI document the daemon serves.

scripts/gen_sdk_models.py writes src/forkd/sdk/_generated/models.py; the first test fails
when a schema changed without regenerating (or the module was edited by hand).
The others pin what the generation promises: a model per schema, and request
fields the hand-written methods do not name reaching them as typed keyword
arguments, a new one included, with no hand edit.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from forkd.sdk import AsyncController, Controller, Sandbox, models
from tests.fakes.daemon import FakeDaemon, clear_env, sandbox_info, snap_info

ROOT = Path(__file__).resolve().parents[2]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_sdk_models", ROOT / "scripts" / "gen_sdk_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = load_script()


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    served: dict[str, Any] = gen.served_openapi()
    return served


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_env(monkeypatch)


def test_the_models_are_generated_from_the_served_openapi() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_sdk_models.py"), "--check"],
        capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_every_schema_is_a_typed_dict_with_its_required_fields(openapi: dict[str, Any]) -> None:
    schemas = openapi["components"]["schemas"]
    for name, schema in schemas.items():
        model = getattr(models, name)
        hints = typing.get_type_hints(model)  # every annotation (and $ref) resolves
        assert set(hints) == set(schema.get("properties", {})), name
        assert model.__required_keys__ == frozenset(schema.get("required", [])), name
    assert set(models.__all__) >= set(schemas)


def named(method: Any) -> set[str]:
    return {p.name for p in inspect.signature(method).parameters.values()
            if p.kind is not p.VAR_KEYWORD} - {"self"}


@pytest.mark.parametrize(("request_name", "extra", "methods"), gen.EXTRAS)
def test_extras_are_the_optional_fields_the_methods_do_not_name(
    openapi: dict[str, Any], request_name: str, extra: str, methods: tuple[str, ...]
) -> None:
    schema = openapi["components"]["schemas"][request_name]
    optional = set(schema["properties"]) - set(schema.get("required", []))
    keys = set(typing.get_type_hints(getattr(models, extra)))
    for method in methods:
        for cls in (AsyncController, Controller):
            params = named(getattr(cls, method))
            assert not keys & params, f"{cls.__name__}.{method} names {keys & params} twice"
            missing = optional - keys - params
            assert not missing, f"{cls.__name__}.{method} cannot send {missing}"


def test_a_new_optional_request_field_reaches_the_sdk_by_regeneration_alone(openapi: dict[str, Any]) -> None:
    changed = copy.deepcopy(openapi)
    changed["components"]["schemas"]["SpawnRequest"]["properties"]["user"] = {
        "anyOf": [{"type": "string"}, {"type": "null"}], "description": "The guest user to run as.",
    }
    # A module name of its own (in no sys.modules): its forward references (a field typed with
    # another model, as fork_tree is) are then resolved in this namespace, not in builtins.
    namespace: dict[str, Any] = {"__name__": "regenerated_models"}
    exec(compile(gen.models_text(changed), "models.py", "exec"), namespace)
    assert typing.get_type_hints(namespace["SpawnExtra"], globalns=namespace)["user"] == str | None
    assert "user" not in namespace["SpawnRequest"].__required_keys__

    fake = FakeDaemon().on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
    fake.controller().spawn_sandboxes("py", **{"user": "agent"})  # what the regenerated types allow
    assert fake.bodies("POST", "/v1/sandboxes") == [{"snapshot_tag": "py", "n": 1, "user": "agent"}]


def test_extras_are_sent_as_given_and_none_is_left_out() -> None:
    sb = "sb-abcdef-0000"
    fake = (FakeDaemon()
            .on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
            .on("POST", f"/v1/sandboxes/{sb}/branch", httpx.Response(201, json=snap_info("b")))
            .on("POST", f"/v1/sandboxes/{sb}/fork", httpx.Response(201, json={
                "parent_id": sb, "snapshot_tag": "f", "children": [], "errors": []}))
            .on("POST", "/v1/snapshots", httpx.Response(201, json=snap_info())))
    c = fake.controller()
    c.spawn_sandboxes("py", 2, cpu_limit=0.5, pids_limit=None, prewarm=True)
    c.branch_sandbox(sb, measure_diff=True)
    c.create_snapshot("py", setup_timeout_secs=120, tap="tap1")
    c.fork_sandbox(sb, 2)
    assert fake.bodies("POST", "/v1/sandboxes") == [
        {"snapshot_tag": "py", "n": 2, "cpu_limit": 0.5, "prewarm": True}]
    assert fake.bodies("POST", f"/v1/sandboxes/{sb}/branch") == [{"measure_diff": True}]
    assert fake.bodies("POST", "/v1/snapshots") == [{"tag": "py", "setup_timeout_secs": 120, "tap": "tap1"}]
    assert fake.bodies("POST", f"/v1/sandboxes/{sb}/fork") == [{"count": 2}]


def test_the_object_layer_passes_extras_to_the_spawn() -> None:
    fake = FakeDaemon().on("POST", "/v1/sandboxes", httpx.Response(201, json=[sandbox_info()]))
    sb = Sandbox.create("py", controller=fake.controller(), live_fork=True, cpu_limit=0.25)
    assert sb.id == "sb-abcdef-0000"
    assert fake.bodies("POST", "/v1/sandboxes") == [
        {"snapshot_tag": "py", "n": 1, "live_fork": True, "cpu_limit": 0.25}]
