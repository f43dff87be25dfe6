"""An httpx transport that runs the daemon's ASGI app in-process, for the synchronous SDK."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient


class ViaTestClient(httpx.BaseTransport):
    """Sends the SDK's requests through Starlette's TestClient (runs the ASGI app)."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url.copy_with(scheme="http", host="testserver", port=None)
        reply = self.client.request(
            request.method, str(url), headers=dict(request.headers), content=request.read()
        )
        return httpx.Response(reply.status_code, headers=reply.headers, content=reply.content)
