"""The MCP tool that runs a cell on a sandbox's Jupyter kernel: ``run_code``.

It reads the daemon's NDJSON events (``POST /v1/sandboxes/{id}/code``, see
docs/API.md "Code on a Jupyter kernel") to the end and hands the model one
text block (stdout, stderr, results, the error) and an image block per
``image/png`` result, the plot it drew; the same, less the images' bytes, is
the structured output (:class:`~forkd.mcp.models.CellOutput`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent
from pydantic import Field

from forkd.mcp.models import CellError, CellOutput
from forkd.mcp.tooling import CREATES, SandboxId, call
from forkd.sdk import AsyncController


def fold(events: list[dict[str, Any]]) -> tuple[CellOutput, list[str]]:
    """A cell's events as its output and its PNG images (base64, in the order shown)."""
    out = CellOutput(stdout="", stderr="")
    pngs: list[str] = []
    for event in events:
        kind = event.get("type")
        if kind in ("stdout", "stderr"):
            setattr(out, kind, getattr(out, kind) + str(event.get("text") or ""))
        elif kind == "result":
            data = event.get("data") or {}
            if "text/plain" in data:
                out.results.append(str(data["text/plain"]))
                if event.get("is_main_result"):
                    out.text = str(data["text/plain"])
            if "image/png" in data:
                pngs.append(str(data["image/png"]))
        elif kind == "error":
            out.error = CellError(name=str(event.get("name") or ""), value=str(event.get("value") or ""),
                                  traceback=[str(t) for t in event.get("traceback") or []])
        elif kind == "end":
            out.execution_count = event.get("execution_count")
            out.timed_out = bool(event.get("timed_out"))
            if event.get("error"):  # the stream itself broke after it had begun
                out.stderr += f"\n[forkd: the cell's stream broke: {event['error']}]"
    out.images = len(pngs)
    return out, pngs


def as_text(out: CellOutput) -> str:
    """The cell's output as a model reads it: each part that is there, under its name."""
    parts = []
    if out.stdout:
        parts.append(f"stdout:\n{out.stdout}")
    if out.stderr:
        parts.append(f"stderr:\n{out.stderr}")
    shown = [r for r in out.results if r != out.text]
    if shown:
        parts.append("displayed:\n" + "\n".join(shown))
    if out.text is not None:
        parts.append(f"result:\n{out.text}")
    if out.error is not None:
        parts.append(f"error: {out.error.name}: {out.error.value}\n" + "\n".join(out.error.traceback))
    if out.timed_out:
        parts.append("timed out: the kernel was interrupted")
    if out.images:
        parts.append(f"{out.images} image(s) follow")
    return "\n\n".join(parts) or "(no output)"


def code_tools(server: MCPServer[AsyncController]) -> None:
    @server.tool(annotations=CREATES)
    async def run_code(
        ctx: Context[Any, Any],
        sandbox_id: SandboxId,
        code: Annotated[str, Field(description="The cell: Python (IPython: magics, !shell, display()), "
                                   "or bash / JavaScript / R with `language`.")],
        language: Annotated[Literal["python", "bash", "javascript", "r"], Field(
            description="The kernel's language.")] = "python",
        context: Annotated[str | None, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description=(
            "The kernel to run on, one per context (default: the language's default kernel)."))] = None,
        timeout_secs: Annotated[float, Field(gt=0, le=86400, description=(
            "Interrupt the cell after this long."))] = 300,
    ) -> Annotated[CallToolResult, CellOutput]:
        """Run a cell on a Jupyter kernel in the sandbox (its image must have one, e.g. the
        code-interpreter template) and return what it printed, its result, its error, and
        every plot or image it displayed as an image (PNG). Variables persist between cells of
        the same context, like a notebook. Use this for data work and plots (matplotlib,
        pandas); for a quick Python expression in the plain interpreter, eval_python."""

        async def cell(c: AsyncController) -> list[dict[str, Any]]:
            return [dict(e) async for e in c.code_stream(
                sandbox_id, code, language=language, context=context, timeout=timeout_secs)]

        out, pngs = fold(await call(ctx, cell))
        content: list[ContentBlock] = [TextContent(type="text", text=as_text(out))]
        content += [ImageContent(type="image", data=png, mime_type="image/png") for png in pngs]
        return CallToolResult(content=content, structured_content=out.model_dump(mode="json"))
