"""The fleet gateway: one endpoint that serves forkd's REST API in front of many hosts.

Clients and SDKs talk to it exactly as to one daemon. It keeps no state of its
own beyond the membership it reads from etcd:

* ``POST /v1/sandboxes`` goes to a host holding the snapshot, else to the
  least-loaded host (which pulls the snapshot from the object store first);
  ``X-Forkd-Host: <host-id>`` pins it to one host (time-travel fork: branch on
  host A, fork on host B). A host that cannot be reached is skipped.
* per-sandbox calls (``/v1/sandboxes/<id>/...``) go to the host the id names
  (``sb-<host>-…``); once that host has left the fleet they answer 404 "gone".
* lists (``GET /v1/sandboxes``, ``/v1/snapshots``, ``/v1/pools``) merge every
  host's answer; per-snapshot calls go to a host holding it; a snapshot
  delete goes to every host holding it.
* snapshots created or branched through the gateway are pushed to the object
  store by their host (``--publish``, on by default), so any host can fork them.
* a fork with ``spread: true`` puts its children on several hosts (``spread.py``).
* a named volume stays on the host that made it: its calls, and the spawns and
  snapshots that mount it, go there (``volumes.py``).
* E2B's control plane and envd traffic go the same ways (``e2b.py``).

The modules: ``settings`` (what the gateway is started with), ``answers`` (its
own answers), ``proxy`` (one call to one host, never hanging), ``core``
(dispatch and the /v1 routes), ``e2b``, ``spread``, ``volumes`` and ``app``
(the ASGI app).

No request hangs: every proxied call has a connect timeout and an overall
timeout, and is cut short when its host leaves the fleet. Every answer the
gateway makes itself is ``{"error": ...}`` like the daemon's; proxied answers
carry ``X-Forkd-Host`` naming the host that served them.
"""

from forkd.gateway.app import create_gateway_app
from forkd.gateway.core import Gateway
from forkd.gateway.proxy import HostFailed
from forkd.gateway.settings import GatewaySettings

__all__ = ["Gateway", "GatewaySettings", "HostFailed", "create_gateway_app"]
