"""What the routes need from the app: the runtime, metrics and the branch gate.

The routes are typed against the real ``forkd.controller.runtime.Runtime`` (no copy of its
interface is kept here); tests run them on a real runtime over the test doubles of QEMU and the
guest agent (tests/fakes/app.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.requests import HTTPConnection

from forkd.api.limits import BranchGate
from forkd.api.metrics import Metrics
from forkd.errors import Busy, InvalidRequest

if TYPE_CHECKING:
    from forkd.controller.runtime import Runtime


# The dependencies are ``async def`` on purpose: FastAPI runs a plain ``def`` dependency in
# its thread pool, a thread hand-off per request that cost more daemon CPU than the route.
async def get_runtime(request: HTTPConnection) -> Runtime:
    # HTTPConnection: a WebSocket route (api/terminal_routes.py) asks for it too.
    runtime: Runtime | None = request.app.state.runtime
    if runtime is None:
        # Only reachable between process start and the end of lifespan start-up.
        raise Busy("the daemon is still starting; retry shortly")
    return runtime


# FastAPI reads a dependency's parameter type only for the dependency, so at run time the
# runtime's annotation need not import the controller (which pulls in the VMM); mypy checks
# every route against the real ``Runtime``.
if TYPE_CHECKING:
    RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
else:
    RuntimeDep = Annotated[object, Depends(get_runtime)]


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


async def get_branch_gate(request: Request) -> BranchGate:
    gate: BranchGate = request.app.state.branch_gate
    return gate


async def reject_unknown_query(request: HTTPConnection) -> None:
    """400 for a query parameter the route does not take (a typo must not be silently ignored,
    e.g. ``?cascde=true`` on a DELETE, or a misspelt list filter that would list everything)."""
    if not request.scope.get("query_string"):  # most requests: nothing to parse
        return
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    allowed = _query_names(route.dependant)
    unknown = sorted(set(request.query_params.keys()) - allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        raise InvalidRequest(f"unknown query parameter {unknown[0]!r}; this route takes: {takes}")


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route takes, its dependencies' included."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
