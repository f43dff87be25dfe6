"""forkd-mcp 0.2.1, unchanged, driven by an MCP client over stdio (the ``mcp`` package's client).

Starts the ``forkd-mcp`` server of this virtualenv (FORKD_URL / FORKD_TOKEN are passed on),
spawns, execs, evals, branches and kills through its tools, and prints one JSON object of the
answers (the test checks it). argv[1] is the tag of a ready snapshot.
"""

import asyncio
import json
import os
import sys
from pathlib import Path

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(tag: str) -> dict:
    server = StdioServerParameters(command=str(Path(sys.executable).with_name("forkd-mcp")),
                                   env={k: v for k, v in os.environ.items() if k.startswith("FORKD_")})
    out = {}
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        out["tools"] = sorted(t.name for t in (await session.list_tools()).tools)

        async def call(name: str, **args: object) -> object:
            result = await session.call_tool(name, args)
            if result.isError:
                return {"error": result.content[0].text}
            data = result.structuredContent
            if data is None:
                return json.loads(result.content[0].text)
            # FastMCP wraps a tool's non-object answer (a list) as {"result": ...}.
            return data["result"] if set(data) == {"result"} else data

        spawned = await call("spawn_sandboxes", snapshot_tag=tag, n=1)
        out["spawned"] = spawned
        sandbox = spawned[0]["id"]
        out["exec"] = await call("exec_command", sandbox_id=sandbox,
                                 args=["python3", "-c", "print(6 * 7)"])
        out["eval"] = await call("eval_code", sandbox_id=sandbox, code="sum(range(10))")
        out["branch"] = await call("branch_sandbox", sandbox_id=sandbox, tag="mcp-branch", diff=True)
        out["ping"] = await call("ping_sandbox", sandbox_id=sandbox)
        out["listed"] = [s["id"] for s in await call("list_sandboxes")]
        out["kill"] = await call("kill_sandbox", sandbox_id=sandbox)
        out["after_kill"] = [s["id"] for s in await call("list_sandboxes")]
        out["snapshots"] = [s["tag"] for s in await call("list_snapshots")]
    return out


print(json.dumps(asyncio.run(main(sys.argv[1]))))
