"""What every group of MCP tools shares: reaching the daemon, turning its errors
into tool errors, the tools' hints and their common argument types."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field

from forkd.errors import ForkdError
from forkd.sdk import AsyncController
from forkd.sdk.errors import ForkdAPIError

T = TypeVar("T")

SandboxId = Annotated[str, Field(description="Sandbox id, e.g. sb-67a1b3-0000.")]
Env = dict[str, str]
Command = Annotated[str | list[str], Field(
    description="A shell command line (run with /bin/sh -c), or an argv list.")]
Cwd = Annotated[str | None, Field(description="Working directory.")]
ExtraEnv = Annotated[Env | None, Field(description="Extra environment variables.")]

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False)
CREATES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
DESTROYS = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


async def call(ctx: Context[Any, Any], op: Callable[[AsyncController], Awaitable[T]]) -> T:
    """Run ``op`` against the daemon; its errors become tool errors the model can read."""
    controller: AsyncController = ctx.request_context.lifespan_context
    try:
        return await op(controller)
    except ForkdAPIError as exc:
        raise ToolError(f"forkd daemon answered {exc.status}: {exc.message}") from exc
    except ForkdError as exc:
        raise ToolError(str(exc)) from exc
