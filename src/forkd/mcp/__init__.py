"""forkd's own MCP server (``forkd mcp``): the daemon's sandboxes as MCP tools.

It is a client of the daemon like the CLI: every tool is one or two REST calls
through :class:`forkd.sdk.AsyncController`, and every structured output is the
REST API's own response schema (:mod:`forkd.api.schemas`).
"""

from forkd.mcp.server import build_server

__all__ = ["build_server"]
