"""E2B control-plane requests read and bounded: JSON bodies, integers in range, string maps, the
SDK's models' unknown fields, E2B's ``network`` as forkd's policy, the list's query. Each refusal
is an ``E2BError`` (400) naming the field, in the SDK's REST shape.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
from typing import Any

from e2b.api.client.types import Unset
from fastapi import Request

from forkd.api.e2b.errors import E2BError

UNSUPPORTED = "see docs/E2B.md for what forkd serves"


async def body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        raise E2BError(400, f"request body is not valid JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise E2BError(400, "request body must be a JSON object")
    return parsed


def integer(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise E2BError(400, f"{name} must be an integer between {low} and {high}")
    return value


def strings(value: object, name: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise E2BError(400, f"{name} must map strings to strings")
    return value


def no_unknown(model: Any) -> None:
    extra = sorted(model.additional_properties)
    if extra:
        raise E2BError(400, f"unknown field {extra[0]!r}")


def given(value: object) -> bool:
    """Whether an SDK model's field was sent (neither ``Unset`` nor null)."""
    return not isinstance(value, Unset) and value is not None


# Fields of E2B's network config that forkd does not serve: accepted when empty (the SDK may
# send them so), refused otherwise.
_E2B_NETWORK_UNSERVED = frozenset({"dnsServers", "egressProxy", "httpsPorts"})


def network(raw: object) -> dict[str, Any]:
    """E2B's ``network`` as forkd's network policy (host/egress.py); 400 for what forkd lacks.
    A sandbox's ports are public unless ``allowPublicTraffic`` is false, as in E2B (forkd's own
    default is the other way)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise E2BError(400, "network must be an object")
    # ``rules`` has the same shape in both ({host: [{"transform": {"headers": {...}}}]}).
    served = {"allowOut": "allow_out", "denyOut": "deny_out", "allowPublicTraffic": "allow_public_traffic",
              "maskRequestHost": "mask_request_host", "rules": "rules"}
    # A key outside E2B's schema is refused rather than skipped: a misspelled restriction
    # (``allow_public_traffic: false``, snake_case, which neither SDK sends) must never leave
    # the sandbox with a looser policy than its creator asked for.
    unknown = sorted(k for k in raw if k not in served and k not in _E2B_NETWORK_UNSERVED)
    if unknown:
        name = unknown[0][:64]
        camel = "".join(w.capitalize() if i else w for i, w in enumerate(name.split("_")))
        hint = f" (E2B's API spells it {camel})" if camel in served else ""
        raise E2BError(400, f"network.{name} is not a field of E2B's network{hint}: forkd takes allowOut, "
                       "denyOut, allowPublicTraffic, maskRequestHost and rules")
    other = sorted(k for k, v in raw.items() if k not in served and v not in (None, False, [], {}))
    if other:
        raise E2BError(400, f"network.{other[0]} is not supported by forkd (allowOut and denyOut, as "
                       "IPv4 networks or DNS names with optional ports, allowPublicTraffic, "
                       "maskRequestHost and rules with header transforms; "
                       f"{UNSUPPORTED})")
    ours = {ours: raw[theirs] for theirs, ours in served.items() if raw.get(theirs) is not None}
    ours.setdefault("allow_public_traffic", True)
    return ours


def as_int(value: str | None) -> int:
    try:
        return int(value or "")
    except ValueError:
        raise E2BError(400, f"{value!r} is not an integer") from None


def metadata_filter(raw: str | None) -> dict[str, str]:
    """The SDK sends ``metadata=`` as a URL-encoded ``k=v&k2=v2`` whose keys and values are quoted."""
    if not raw:
        return {}
    return {urllib.parse.unquote(k): urllib.parse.unquote(v)
            for k, v in urllib.parse.parse_qsl(raw, keep_blank_values=True)}


def started_after(raw: str | None) -> float | None:
    if not raw:
        return None
    try:
        return dt.datetime.fromisoformat(raw).timestamp()
    except ValueError:
        raise E2BError(400, f"startedAfter {raw!r} is not an ISO 8601 time") from None


__all__ = ["UNSUPPORTED", "as_int", "body", "given", "integer", "metadata_filter", "network", "no_unknown",
           "started_after", "strings"]
