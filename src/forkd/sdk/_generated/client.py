# GENERATED from src/forkd/sdk/async_client.py by scripts/unasync_sdk.py — do not edit.
# Edit the async source, then run: python scripts/unasync_sdk.py
"""The REST client: :class:`Controller`, one method per route of the daemon's API (v1).

The routes are written a part per resource (``forkd.sdk._generated.routes``); this class is them all
together. It keeps one flat namespace on purpose: the seeds call ``Controller().spawn_sandboxes``,
``.branch_sandbox``, ... directly, so the class is as wide as the API (the parts stay small)."""

from __future__ import annotations

from forkd.sdk._http import DEFAULT_WAIT_SECS, UPLOAD_PIECE, Progress
from forkd.sdk._generated.routes.files import FileRoutes
from forkd.sdk._generated.routes.forks import ForkRoutes
from forkd.sdk._generated.routes.pools import PoolRoutes
from forkd.sdk._generated.routes.processes import ProcessRoutes
from forkd.sdk._generated.routes.sandboxes import SandboxRoutes
from forkd.sdk._generated.routes.secrets import SecretRoutes
from forkd.sdk._generated.routes.snapshots import SnapshotRoutes

__all__ = ["DEFAULT_WAIT_SECS", "UPLOAD_PIECE", "Controller", "Progress"]


class Controller(
    SnapshotRoutes,
    SandboxRoutes,
    ProcessRoutes,
    FileRoutes,
    ForkRoutes,
    PoolRoutes,
    SecretRoutes,
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

    Use it as a context manager, or call :meth:`close`, to release its
    connections.

    Example::

        from forkd import Controller

        with Controller() as c:
            [parent] = c.spawn_sandboxes("pyagent", n=1, live_fork=True)
            branch = c.branch_sandbox(parent["id"], tag="checkpoint", mode="diff")
            kids = c.spawn_sandboxes(branch["tag"], n=5)
    """
