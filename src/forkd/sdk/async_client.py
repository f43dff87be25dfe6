"""The REST client: :class:`AsyncController`, one method per route of the daemon's API (v1).

The routes are written a part per resource (``forkd.sdk.async_routes``); this class is them all
together. It keeps one flat namespace on purpose: the seeds call ``Controller().spawn_sandboxes``,
``.branch_sandbox``, ... directly, so the class is as wide as the API (the parts stay small)."""

from __future__ import annotations

from forkd.sdk._http import DEFAULT_WAIT_SECS, UPLOAD_PIECE, Progress
from forkd.sdk.async_routes.files import AsyncFileRoutes
from forkd.sdk.async_routes.forks import AsyncForkRoutes
from forkd.sdk.async_routes.pools import AsyncPoolRoutes
from forkd.sdk.async_routes.processes import AsyncProcessRoutes
from forkd.sdk.async_routes.sandboxes import AsyncSandboxRoutes
from forkd.sdk.async_routes.secrets import AsyncSecretRoutes
from forkd.sdk.async_routes.snapshots import AsyncSnapshotRoutes

__all__ = ["DEFAULT_WAIT_SECS", "UPLOAD_PIECE", "AsyncController", "Progress"]


class AsyncController(
    AsyncSnapshotRoutes,
    AsyncSandboxRoutes,
    AsyncProcessRoutes,
    AsyncFileRoutes,
    AsyncForkRoutes,
    AsyncPoolRoutes,
    AsyncSecretRoutes,
):
    """Talks to a forkd daemon over its REST API (v1).

    Every method returns the daemon's JSON as plain ``dict``/``list``, typed with the
    ``TypedDict``s that scripts/gen_sdk_models.py generates from the daemon's OpenAPI
    document (:mod:`forkd.sdk.models`), and raises
    a :class:`~forkd.sdk.errors.ForkdAPIError` subclass on an error status, or
    :class:`~forkd.sdk.errors.ForkdConnectionError` if the daemon is not running.

    Args:
        url: daemon address; default ``$FORKD_URL``, else ``http://127.0.0.1:8889``.
        token: bearer token; default ``$FORKD_TOKEN``, else the contents of
            ``$FORKD_TOKEN_FILE``, else none (a daemon without ``--token-file``).
        timeout: seconds for ordinary requests. Snapshot builds, spawns,
            branches and evals wait without a read timeout, and exec waits for
            the command's own timeout plus a grace period.
        verify: TLS verification: ``True``, ``False``, an ``ssl.SSLContext`` or
            the path of a CA certificate (for a daemon serving a self-signed
            ``--tls-cert``); default ``$FORKD_CA_CERT`` if set, else system roots.
        transport: a custom httpx transport (tests use ``httpx.MockTransport``).

    Use it as a context manager, or call :meth:`aclose`, to release its
    connections.

    Example::

        from forkd import AsyncController

        async with AsyncController() as c:
            [parent] = await c.spawn_sandboxes("pyagent", n=1, live_fork=True)
            branch = await c.branch_sandbox(parent["id"], tag="checkpoint", mode="diff")
            kids = await c.spawn_sandboxes(branch["tag"], n=5)
    """
