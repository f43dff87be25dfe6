"""The FastAPI application factory."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal

from fastapi import Depends, FastAPI
from fastapi.openapi.utils import get_openapi

from forkd.api import (
    code_routes,
    diff_routes,
    file_routes,
    fork_routes,
    image_routes,
    pool_routes,
    process_routes,
    secret_routes,
    template_routes,
    terminal_routes,
    travel_routes,
    ui,
    volume_routes,
    workspace_routes,
)
from forkd.api.audit import AuditLog, AuditMiddleware
from forkd.api.auth import UNAUTHENTICATED_PATHS, BearerAuthMiddleware, load_token
from forkd.api.deps import reject_unknown_query
from forkd.api.e2b.dispatch import E2BDispatch, error_shape
from forkd.api.e2b.tokens import AccessTokens, load_or_make_key
from forkd.api.fast_path import FastPath
from forkd.api.handlers import install_exception_handlers
from forkd.api.limits import BodySizeLimitMiddleware, BranchGate, SingleHeadersMiddleware
from forkd.api.metrics import Metrics
from forkd.api.port_proxy import PortClients, PortProxy
from forkd.api.routes import status_router, v1
from forkd.api.schemas import ErrorBody
from forkd.api.settings import Settings
from forkd.config import API_VERSION, VERSION
from forkd.controller.results import PoolReport

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime
    from forkd.fleet.hosts import HostRecord

log = logging.getLogger(__name__)

_UNAUTHORIZED = {
    "description": "Missing or invalid bearer token.",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
}


def _count(app: FastAPI, what: str) -> int:
    runtime = app.state.runtime
    if runtime is None:
        return 0
    return len(getattr(runtime, what)())


def _count_sandboxes(app: FastAPI, which: Literal["listed", "paused"]) -> int:
    runtime: Runtime | None = app.state.runtime
    return runtime.count_sandboxes()[which] if runtime is not None else 0


def _hibernation(app: FastAPI) -> dict[str, Any]:
    """The Hibernator's counters (controller/hibernation.py); none from a runtime without one."""
    hibernation = getattr(app.state.runtime, "hibernation", None)
    return hibernation.counts() if hibernation is not None else {}


def _costs(app: FastAPI) -> dict[str, int]:
    """The live sandboxes' shared, private and disk bytes (controller/costs.py); none before start."""
    runtime: Runtime | None = app.state.runtime
    return runtime.costs.totals() if runtime is not None else {}


def _pools(app: FastAPI) -> list[PoolReport]:
    runtime: Runtime | None = app.state.runtime
    return runtime.pools.all() if runtime is not None else []


def _refill_times(app: FastAPI) -> list[tuple[str, float]]:
    runtime: Runtime | None = app.state.runtime
    return runtime.pools.take_refill_times() if runtime is not None else []


def _openapi_factory(app: FastAPI, auth: bool) -> Any:
    """Make the served OpenAPI describe what the app really does.

    FastAPI documents 422 for validation errors; forkd answers 400 with
    ``{"error"}``, so 422 and its schemas are removed. The bearer scheme is
    declared globally (with /healthz exempt) and 401 documented on every
    protected operation, because auth is middleware FastAPI cannot see.
    """

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, description=app.description, routes=app.routes
        )
        components = schema.setdefault("components", {})
        schemas = components.setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        schemas.setdefault("ErrorBody", ErrorBody.model_json_schema())
        if auth:
            components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
        for path, item in schema.get("paths", {}).items():
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                if path in UNAUTHENTICATED_PATHS:
                    operation["security"] = []
                elif auth:
                    responses.setdefault("401", _UNAUTHORIZED)
        app.openapi_schema = schema
        return schema

    return openapi


def host_record(rt: Any, host_id: str, url: str, capacity: int | None) -> HostRecord:
    """What this daemon tells the fleet now: what it holds and how busy it is."""
    from forkd.fleet.hosts import MAX_TAGS, MAX_VOLUMES, HostRecord, default_capacity, mem_available_mib

    ready = [s.tag for s in rt.list_snapshots() if s.status == "ready"]
    return HostRecord(
        host_id=host_id, url=url, capacity=capacity or default_capacity(),
        sandboxes=rt.count_sandboxes()["listed"], snapshots=ready[-MAX_TAGS:],
        pools={p["tag"]: int(p["ready"]) for p in rt.pools.all() if p.get("size")},
        mem_available_mib=mem_available_mib(), store=rt.travel.store is not None,
        updated_at_unix=time.time(), volumes=[v.name for v in rt.volumes.all()][-MAX_VOLUMES:])


async def _join_fleet(rt: Any, settings: Settings) -> Any:
    """Register this daemon in the fleet (etcd) and keep its record current (fleet/member.py)."""
    from forkd.fleet.etcd import EtcdClient
    from forkd.fleet.member import FleetMember

    assert settings.host_id is not None
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per etcd keepalive
    host_id, url = settings.host_id, settings.reachable_url
    member = FleetMember(EtcdClient(settings.etcd),
                         lambda: host_record(rt, host_id, url, settings.capacity), settings.lease_ttl)
    await member.start()
    return member


def create_app(settings: Settings | None = None, runtime: Runtime | None = None) -> FastAPI:
    """Build the daemon's ASGI app.

    ``runtime``: an already-opened runtime (tests, embedding). When omitted the
    lifespan opens one on ``settings.data_dir`` and closes it on shutdown,
    keeping the sandboxes alive if ``settings.keep_sandboxes``. An injected
    runtime is the caller's to close.

    Raises ConfigError if the token file is missing, empty or a placeholder.
    """
    settings = settings or Settings()
    token = load_token(settings.token_file) if settings.token_file is not None else None
    audit = AuditLog(settings.audit_log_path())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = app.state.runtime is None
        if owned:
            from forkd.controller.runtime import Runtime

            data = settings.data()
            log.info("opening runtime on %s", data.root)
            from forkd.image.oci import Registries

            rt = await Runtime.open(data, store=settings.store, host_id=settings.host_id,
                                    disk_quota_mib=settings.disk_quota_mib, limits=settings.host_limits(),
                                    registries=Registries(settings.registry_mirrors, settings.registry_auth))
            if settings.pools:
                await rt.pools.preset(settings.pools)
            app.state.runtime = rt
            if settings.etcd and settings.host_id:
                app.state.fleet_member = await _join_fleet(rt, settings)
        try:
            yield
        finally:
            if app.state.fleet_member is not None:
                await app.state.fleet_member.stop()  # leave the fleet before the sandboxes go
            if owned and app.state.runtime is not None:
                log.info("closing runtime (keep_sandboxes=%s)", settings.keep_sandboxes)
                await app.state.runtime.close(keep_sandboxes=settings.keep_sandboxes)
                app.state.runtime = None
            await app.state.port_clients.aclose()
            audit.close()

    app = FastAPI(
        title="forkd",
        version=VERSION,
        description=(
            f"forkd REST API {API_VERSION}: fork warm QEMU microVMs copy-on-write and branch "
            'running ones. Every 4xx/5xx body is `{"error": "<message>"}`.'
        ),
        lifespan=lifespan,
        dependencies=[Depends(reject_unknown_query)],
        # forkd exports Prometheus metrics (/metrics), not OpenTelemetry; left on, FastAPI asks
        # OpenTelemetry's global providers on every request whether anyone is listening.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.settings = settings
    app.state.runtime = runtime
    app.state.fleet_member = None
    app.state.port_clients = PortClients()
    app.state.branch_gate = BranchGate(settings.branch_concurrency)
    app.state.metrics = Metrics(
        count_snapshots=lambda: _count(app, "list_snapshots"),
        count_sandboxes=lambda: _count_sandboxes(app, "listed"),
        count_paused=lambda: _count_sandboxes(app, "paused"),
        hibernation=lambda: _hibernation(app),
        costs=lambda: _costs(app),
        pools=lambda: _pools(app),
        refill_times=lambda: _refill_times(app),
    )
    app.include_router(status_router)
    app.include_router(v1)
    app.include_router(fork_routes.router)
    app.include_router(diff_routes.router)
    app.include_router(pool_routes.router)
    app.include_router(file_routes.router)
    app.include_router(process_routes.router)
    app.include_router(terminal_routes.router)
    app.include_router(code_routes.router)
    app.include_router(workspace_routes.router)
    app.include_router(volume_routes.router)
    app.include_router(secret_routes.router)
    app.include_router(travel_routes.router)
    app.include_router(template_routes.router)
    app.include_router(image_routes.router)
    app.include_router(ui.make_router())
    install_exception_handlers(app)

    # add_middleware wraps: the last added runs first. Request order is
    # audit -> port proxy -> single headers -> E2B dispatch -> auth -> body limit -> fast path ->
    # routes, so
    # rejected requests are still audited, a routing or credential header that
    # comes twice is refused before anything reads it, and unauthenticated
    # callers never get their bodies read. The body limit bounds size and JSON
    # nesting before any parser runs (the E2B apps: the same, and Connect's own).
    # The E2B apps (api/e2b) authenticate by their own credentials: the API key,
    # or a sandbox's access token (an HMAC of its id under the daemon's secret).
    # Innermost: the plain JSON routes are served without FastAPI's routing and dependency
    # machinery, by FastAPI's own route, models and handlers (api/fast_path.py).
    if settings.fast_path:
        app.add_middleware(FastPath, owner=app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_body_bytes,
                       exempt=lambda scope: file_routes.streams_body(scope)
                       or template_routes.streams_body(scope))
    if token is not None:
        app.add_middleware(BearerAuthMiddleware, token=token)
    secret = token.encode() if token is not None else (lambda: load_or_make_key(settings.data().root))
    tokens = AccessTokens(secret)
    app.add_middleware(E2BDispatch, runtime=lambda: app.state.runtime, tokens=tokens,
                       api_key=token, gate=app.state.branch_gate, max_body_bytes=settings.max_body_bytes,
                       max_file_bytes=settings.max_file_bytes,
                       uploads=settings.data().root / "e2b-uploads")
    app.add_middleware(SingleHeadersMiddleware, shape_of=error_shape)
    # Traffic for a sandbox's port (Host: {port}-{id}.<domain>) is relayed before any of the above:
    # it carries the sandbox's traffic token or nothing, and its body is the guest's business.
    app.add_middleware(PortProxy, runtime=lambda: app.state.runtime, tokens=tokens, api_token=token,
                       max_body_bytes=settings.max_file_bytes, clients=app.state.port_clients)
    app.add_middleware(AuditMiddleware, audit=audit)

    app.openapi = _openapi_factory(app, auth=token is not None)  # type: ignore[method-assign]
    return app
