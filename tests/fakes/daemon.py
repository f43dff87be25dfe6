"""A fake forkd daemon for SDK and CLI unit tests, served through ``httpx.MockTransport``.

:class:`FakeDaemon` answers queued replies per ``(method, path)`` and records
every request, so a test pins both what the client sent and how it reads the
answer. :func:`sandbox_info` and :func:`snap_info` build the daemon's
SandboxInfo / SnapshotInfo bodies.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from forkd.sdk import AsyncController, Controller

Reply = httpx.Response | Callable[[httpx.Request], httpx.Response]

URL = "http://forkd.test"
SB = "sb-abcdef-0000"

# The environment the SDK reads; a test that leaves any of these set would
# reach whatever daemon the developer's shell points at.
CLIENT_ENV = ("FORKD_URL", "FORKD_TOKEN", "FORKD_TOKEN_FILE", "FORKD_CA_CERT")


def clear_env(monkeypatch: pytest.MonkeyPatch, *extra: str) -> None:
    """Unset the SDK's environment variables (and ``extra`` ones) for one test."""
    for name in (*CLIENT_ENV, *extra):
        monkeypatch.delenv(name, raising=False)


class FakeDaemon:
    """Routes ``(method, path)`` to queued replies and records every request.

    A route answers its replies in order and then repeats the last one, so one
    reply serves any number of polls. An unknown route answers 404 with the
    daemon's ``{"error": ...}`` body.
    """

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], list[Reply]] = {}
        self.requests: list[httpx.Request] = []
        self.made: list[tuple[str | None, str | None]] = []  # (url, token) per controller

    def on(self, method: str, path: str, *replies: Reply) -> FakeDaemon:
        self.routes.setdefault((method, path), []).extend(replies)
        return self

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        queue = self.routes.get((request.method, request.url.path))
        if not queue:
            return httpx.Response(404, json={"error": f"no route {request.method} {request.url.path}"})
        reply = queue.pop(0) if len(queue) > 1 else queue[0]
        return reply(request) if callable(reply) else reply

    # ------------------------------------------------------------ inspection

    def calls(self) -> list[tuple[str, str]]:
        """``(method, path)`` of every request so far."""
        return [(r.method, r.url.path) for r in self.requests]

    def body(self, index: int = -1) -> Any:
        """The decoded JSON body of one request (the last by default)."""
        return json.loads(self.requests[index].content)

    def bodies(self, method: str, path: str) -> list[Any]:
        """The decoded JSON bodies (``None`` when empty) of every request to one route."""
        return [
            json.loads(r.content) if r.content else None
            for r in self.requests
            if r.method == method and r.url.path == path
        ]

    # ---------------------------------------------------------------- clients

    def controller(self, url: str | None = None, token: str | None = None, **kwargs: Any) -> Controller:
        """A :class:`Controller` whose requests reach this fake; records ``(url, token)``."""
        self.made.append((url, token))
        return Controller(url=url or URL, token=token, transport=httpx.MockTransport(self), **kwargs)

    def async_controller(self, **kwargs: Any) -> AsyncController:
        """An :class:`AsyncController` whose requests reach this fake."""
        return AsyncController(url=URL, transport=httpx.MockTransport(self), **kwargs)


def sandbox_info(i: int = 0, tag: str = "py") -> dict[str, Any]:
    """The SandboxInfo of the ``i``-th child of one spawn from ``tag``."""
    return {
        "id": f"sb-abcdef-{i:04d}",
        "snapshot_tag": tag,
        "netns": None,
        "guest_addr": "unix:/x/agent.sock",
        "created_at_unix": 1717000000,
        "pid": 100 + i,
    }


def snap_info(tag: str = "py", **extra: Any) -> dict[str, Any]:
    """A SnapshotInfo; ``extra`` adds fields such as ``status`` or ``branched_from``."""
    return {"tag": tag, "dir": f"/d/{tag}", "created_at_unix": 1717000000, **extra}


def sandbox_routes(fake: FakeDaemon, n: int = 1) -> FakeDaemon:
    """``POST /v1/sandboxes`` that spawns what it is asked for, and kills of its first ``n`` ids."""

    def spawn(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        return httpx.Response(201, json=[sandbox_info(i, body["snapshot_tag"]) for i in range(body["n"])])

    fake.on("POST", "/v1/sandboxes", spawn)
    for i in range(max(n, 1)):
        fake.on("DELETE", f"/v1/sandboxes/sb-abcdef-{i:04d}", httpx.Response(204))
    return fake


__all__ = [
    "CLIENT_ENV",
    "SB",
    "URL",
    "FakeDaemon",
    "Reply",
    "clear_env",
    "sandbox_info",
    "sandbox_routes",
    "snap_info",
]


def serve_cli(monkeypatch: pytest.MonkeyPatch) -> FakeDaemon:
    """A FakeDaemon behind every Controller the CLI makes (and no SDK environment)."""
    from forkd.cli import context

    clear_env(monkeypatch)
    d = FakeDaemon()
    monkeypatch.setattr(context, "make_controller", lambda url, token, ca=None: d.controller(url, token))
    return d
