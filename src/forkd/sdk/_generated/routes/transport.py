# GENERATED from src/forkd/sdk/async_routes/transport.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""The connection every route part sends through: httpx, the token, errors mapped, streams."""

from __future__ import annotations

import collections.abc
import ssl
from types import TracebackType
from typing import IO, Any, Self

import httpx

from forkd.sdk._http import (
    DEFAULT_TIMEOUT,
    UPLOAD_PIECE,
    Call,
    Progress,
    headers,
    parse_response,
    resolve_token,
    resolve_url,
    resolve_verify,
    stream_event,
    timeout_for,
    translate,
)
from forkd.sdk.types import (
    JSONDict,
)


class Transport:
    """One daemon's address and connection pool; how a call is sent and its answer read."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        *,
        verify: bool | str | ssl.SSLContext | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = resolve_url(url)
        self.timeout = timeout
        # Kept for the WebSocket calls (a terminal), which do not go through httpx.
        self._token = resolve_token(token)
        self._verify = resolve_verify(verify)
        self._client = httpx.Client(
            base_url=self.url,
            headers=headers(self._token),
            timeout=timeout,
            verify=self._verify,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"

    # ----------------------------------------------------------------- plumbing

    def close(self) -> None:
        """Close the connection pool. The controller is unusable afterwards."""
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, call: Call) -> Any:
        try:
            response = self._client.request(
                call.method,
                call.path,
                json=call.json,
                params=call.params or None,
                timeout=timeout_for(call, self.timeout),
            )
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
        return parse_response(call, response)

    def _pieces(
        self, source: IO[bytes], progress: Progress | None
    ) -> collections.abc.Iterator[bytes]:
        """An upload body read from ``source`` a piece at a time, never whole."""
        done = 0
        while chunk := source.read(UPLOAD_PIECE):
            done += len(chunk)
            if progress is not None:
                progress(done)
            yield chunk

    def _stream(self, call: Call) -> collections.abc.Generator[JSONDict, None, None]:
        """An NDJSON response, one event at a time, as the daemon writes them.

        An ``{"type": "error"}`` line (the stream broke after it had begun) raises
        :class:`~forkd.sdk.errors.ServerError`, unless the call has ``error_events``.
        """
        try:
            with self._client.stream(
                call.method, call.path, json=call.json, params=call.params or None,
                timeout=timeout_for(call, self.timeout),
            ) as response:
                if not response.is_success:
                    response.read()
                    parse_response(call, response)  # raises the mapped error
                for line in response.iter_lines():
                    if line.strip():
                        yield stream_event(call, line)
        except httpx.HTTPError as exc:
            raise translate(exc, self.url, call) from exc
