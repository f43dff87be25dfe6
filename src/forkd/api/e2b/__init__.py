"""The E2B layer: the daemon answers the unmodified ``e2b`` and ``e2b-code-interpreter`` SDKs.

The SDKs need only ``E2B_API_URL`` and ``E2B_SANDBOX_URL`` pointed at the
daemon and ``E2B_API_KEY`` set to its token. Everything runs on the daemon's
one port: ``dispatch`` sends a request carrying ``E2b-Sandbox-Id`` to the
in-sandbox protocol (``envd`` on port 49983, ``interpreter`` on 49999, by the
``E2b-Sandbox-Port`` header) and a request for an E2B control-plane path to
``control``; everything else goes on to forkd's own API.

Modules: ``dispatch`` (routing and the middleware), ``tokens`` (per-sandbox
access tokens), ``errors`` (the SDK's two error shapes), ``shapes`` (forkd
records as the SDK's models), ``control`` (the control-plane app, made of
routers: ``sandbox_routes`` for create, connect, kill, list, info, timeout, pause,
fork; ``templates``, ``template_tags``, ``snapshots``; their ``Depends`` in
``deps``, their request checks in ``inputs``), ``envd`` (``/health``, ``/files`` and the
Connect-RPC services), ``filesystem`` (the Connect filesystem service),
``interpreter`` (``/execute`` and ``/contexts``). What is not supported, and
why: docs/E2B.md.
"""
