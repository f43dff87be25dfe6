"""What E2B's control-plane routes need from their app, injected with ``Depends`` as ``/v1``'s
are (api/deps.py): the runtime, the sandboxes' access tokens, the BRANCH gate and the template
builds. ``create_control_app`` (control.py) puts them on the control app's ``state``; a route
names what it uses (``RuntimeDep``, ...), so no route closes over the app's construction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request

from forkd.api.e2b.tokens import AccessTokens
from forkd.api.limits import BranchGate
from forkd.errors import Busy

if TYPE_CHECKING:
    from forkd.api.e2b.templates import E2BTemplates
    from forkd.controller.runtime import Runtime


class LiveRuntime:
    """The daemon's runtime once it has one: a call before the lifespan made it is ``503``
    (``Busy``), in the SDK's error shape. Also what a template build calls in the background,
    outside any request."""

    def __init__(self, source: Callable[[], Runtime | None]) -> None:
        self._source = source

    def __call__(self) -> Runtime:
        current = self._source()
        if current is None:
            raise Busy("the daemon is still starting; retry shortly")
        return current


# ``async def`` as api/deps.py's: a plain ``def`` dependency would cost a thread hand-off.
async def get_runtime(request: Request) -> Runtime:
    live: LiveRuntime = request.app.state.e2b_runtime
    return live()


async def get_tokens(request: Request) -> AccessTokens:
    tokens: AccessTokens = request.app.state.e2b_tokens
    return tokens


async def get_gate(request: Request) -> BranchGate:
    gate: BranchGate = request.app.state.e2b_gate
    return gate


async def get_templates(request: Request) -> E2BTemplates:
    templates: E2BTemplates = request.app.state.e2b_templates
    return templates


# FastAPI reads a dependency's parameter type only for the dependency, so at run time the
# runtime's annotation need not import the controller (which pulls in the VMM).
if TYPE_CHECKING:
    RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
    TemplatesDep = Annotated[E2BTemplates, Depends(get_templates)]
else:
    RuntimeDep = Annotated[object, Depends(get_runtime)]
    TemplatesDep = Annotated[object, Depends(get_templates)]
TokensDep = Annotated[AccessTokens, Depends(get_tokens)]
GateDep = Annotated[BranchGate, Depends(get_gate)]

__all__ = ["GateDep", "LiveRuntime", "RuntimeDep", "TemplatesDep", "TokensDep", "get_gate", "get_runtime",
           "get_templates", "get_tokens"]
