"""A fork spread over the fleet: ``fork``/``fork-tree`` with ``spread: true`` put children on
several hosts in one call, and ``promote`` of such a tree's child cleans its siblings up on
every host.

How: the source's host forks its share (``fleet.placement.spread_plan``) and so makes the
branch; the gateway has it push the branch to the object store, and the other hosts start
their shares from it with ``POST /v1/sandboxes`` (they fetch its memory lazily, as any
store-only snapshot). A fork-tree's labels go with them (``fork_tree``), so each child is a
child of the one tree wherever it runs. Each host's share succeeds or fails on its own, and
the answer is the fork's usual one (children, one error per child that did not come up).

A source that mounts volumes keeps its children on its host: a volume stays on the host that
made it, and a snapshot with volumes is not pushed to the store.

The branch is kept (``keep_snapshot`` is forced on): children on other hosts read its memory
from the store for as long as they run, so it cannot go with its last local child. Delete it
through the gateway when the tree is done (``DELETE /v1/snapshots/{tag}``).
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from forkd.config import API_VERSION
from forkd.fleet.hosts import HostRecord
from forkd.fleet.placement import spread_plan
from forkd.gateway.answers import error, error_of
from forkd.gateway.proxy import HostFailed
from forkd.store.layout import host_of

if TYPE_CHECKING:
    from forkd.gateway.core import Gateway

SPREAD = "spread"
# A fork's fields that a spawn of its children elsewhere does not take as they are: the count and
# the per-child lists are split per host, the branch is the source host's to keep.
_FORK_ONLY = frozenset({"count", "child_env", "child_memory_limit_mib", "keep_snapshot", SPREAD})
TREE_KEY = "fork_tree_id"


class SpreadForks:
    def __init__(self, gateway: Gateway) -> None:
        self._gw = gateway

    @staticmethod
    def wanted(body: bytes) -> bool:
        """Whether a fork's body asks to be spread (anything else goes to the source's host as is,
        which answers a malformed body itself)."""
        try:
            data = json.loads(body) if body else None
        except ValueError:
            return False
        return isinstance(data, dict) and data.get(SPREAD) is True

    async def fork(self, source: HostRecord, sandbox_id: str, body: bytes, *, tree: bool) -> Response:
        gw = self._gw
        data: dict[str, Any] = json.loads(body)
        count = data.get("count", 1)
        plan = spread_plan(gw.alive(), source.host_id, count) if isinstance(count, int) else []
        if len(plan) >= 2 and await self._mounts_volumes(source, sandbox_id):
            plan = []  # its volumes are its host's (no store holds them): its children stay there
        if len(plan) < 2:
            # One host can hold them all (or the count is for the source's host to refuse): a
            # plain fork there, which takes spread as "wherever the fleet has room" = here.
            return await self._answer(source, "POST", f"/sandboxes/{sandbox_id}/{_route(tree)}", data)
        shares = _shares(data, plan)
        own = {**data, "count": plan[0][1], "keep_snapshot": True, **shares[0]}
        own.pop(SPREAD)
        try:
            first = await gw.proxy.call(
                source, "POST", f"/{API_VERSION}/sandboxes/{sandbox_id}/{_route(tree)}", body=own)
        except HostFailed as exc:
            return error(exc.status, str(exc))
        if first.status_code != 201:
            return _relay(first, source)
        report: dict[str, Any] = first.json()
        tag = str(report["snapshot_tag"])
        published = await gw.push(source, tag)
        offset = plan[0][1]
        starts = []
        for (host, n), share in zip(plan[1:], shares[1:], strict=True):
            spawn = {k: v for k, v in data.items() if k not in _FORK_ONLY}
            spawn.update(snapshot_tag=tag, **share)
            if tree:
                spawn["fork_tree"] = {"tree_id": report["tree_id"], "parent_id": report["parent_id"],
                                      "first_index": offset}
            starts.append(self._spawn(host, spawn, n, offset, published))
            offset += n
        for children, errors in await asyncio.gather(*starts):
            report["children"] += children
            report["errors"] += errors
        return JSONResponse(report, status_code=201, headers={"x-forkd-host": source.host_id})

    async def _mounts_volumes(self, source: HostRecord, sandbox_id: str) -> bool:
        """Whether the sandbox mounts volumes (as its host says; an unanswered ask: no, and the
        fork goes on to say what failed)."""
        try:
            info = await self._gw.proxy.call(source, "GET", f"/{API_VERSION}/sandboxes/{sandbox_id}")
        except HostFailed:
            return False
        try:
            return info.status_code == 200 and bool(info.json().get("volumes"))
        except (ValueError, AttributeError):
            return False

    async def _spawn(self, host: HostRecord, spawn: dict[str, Any], n: int, offset: int,
                     unpublished: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """One host's share: its children, or one error per child that did not come up."""
        def failed(why: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            return [], [{"index": offset + i, "error": f"on host {host.host_id}: {why}"} for i in range(n)]

        if unpublished is not None:
            return failed(f"the fork's branch could not be published to the object store: {unpublished}")
        children: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        # Children of one memory limit go in one spawn (they start together); a change of limit
        # starts another, so a per-child limit costs a request, never a wrong limit.
        for start, size, limit in _runs(spawn.pop("child_memory_limit_mib", None), n):
            part = {**spawn, "n": size}
            if limit is not None:
                part["memory_limit_mib"] = limit
            if "child_env" in spawn:
                part["child_env"] = spawn["child_env"][start:start + size]
            if "fork_tree" in spawn:
                part["fork_tree"] = {**spawn["fork_tree"], "first_index": offset + start}
            try:
                answer = await self._gw.proxy.call(host, "POST", f"/{API_VERSION}/sandboxes", body=part)
            except HostFailed as exc:
                errors += failed(str(exc))[1][start:start + size]
                continue
            if answer.status_code == 201:
                children += answer.json()
            else:
                why = error_of(answer.status_code, answer.content)
                errors += [{"index": offset + start + i, "error": f"on host {host.host_id}: {why}"}
                           for i in range(size)]
        return children, errors

    async def promote(self, host: HostRecord, winner: str, request: Request, body: bytes) -> Response:
        """Promote on the winner's host; then, for a tree spread over hosts, its siblings elsewhere
        are killed too (``cleanup_siblings``). ``replace_parent`` needs the winner on its parent's
        host: a sandbox id names its host, so another host's sandbox cannot take it."""
        gw = self._gw
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("replace_parent") is True:
            refusal = await self._cross_host_parent(host, winner)
            if refusal is not None:
                return refusal
        try:
            answer = await gw.proxy.forward(host, request, body)
        except HostFailed as exc:
            return error(exc.status, str(exc))
        if answer.status_code != 200 or not isinstance(data, dict) or data.get("cleanup_siblings") is False:
            return answer
        result: dict[str, Any] = json.loads(bytes(answer.body))
        tree_id = result.get("tree_id")
        others = [h for h in gw.alive() if h.host_id != host.host_id]
        if not isinstance(tree_id, str) or not others:
            return answer
        for deleted in await asyncio.gather(*(self._kill_tree(h, tree_id) for h in others)):
            result["deleted"] += deleted
        return JSONResponse(result, status_code=200, headers={"x-forkd-host": host.host_id})

    async def _cross_host_parent(self, host: HostRecord, winner: str) -> Response | None:
        try:
            info = await self._gw.proxy.call(host, "GET", f"/{API_VERSION}/sandboxes/{winner}")
        except HostFailed as exc:
            return error(exc.status, str(exc))
        if info.status_code != 200:
            return _relay(info, host)
        parent = (info.json().get("metadata") or {}).get("fork_parent_id")
        if isinstance(parent, str) and host_of(parent) not in (None, host.host_id):
            return error(409, f"replace_parent: the winner {winner} runs on host {host.host_id} but its "
                              f"parent {parent} on host {host_of(parent)}; a sandbox id names its host, so "
                              "the winner cannot take the parent's id. Promote without replace_parent, or "
                              "pick a winner on the parent's host")
        return None

    async def _kill_tree(self, host: HostRecord, tree_id: str) -> list[dict[str, Any]]:
        """Kill every child of ``tree_id`` on ``host``: one deletion report each."""
        proxy = self._gw.proxy
        try:
            listed = await proxy.call(host, "GET", f"/{API_VERSION}/sandboxes?metadata={TREE_KEY}={tree_id}",
                                      timeout=self._gw.settings.list_timeout)
        except HostFailed as exc:
            return [{"id": f"(host {host.host_id})", "deleted": False, "error": str(exc)}]
        if listed.status_code != 200:
            return [{"id": f"(host {host.host_id})", "deleted": False,
                     "error": error_of(listed.status_code, listed.content)}]
        reports: list[dict[str, Any]] = []
        for sandbox in listed.json():
            sandbox_id = str(sandbox.get("id"))
            try:
                gone = await proxy.call(host, "DELETE", f"/{API_VERSION}/sandboxes/{sandbox_id}")
            except HostFailed as exc:
                reports.append({"id": sandbox_id, "deleted": False, "error": str(exc)})
                continue
            if gone.status_code in (200, 204, 404):
                reports.append({"id": sandbox_id, "deleted": True})
            else:
                reports.append({"id": sandbox_id, "deleted": False,
                                "error": error_of(gone.status_code, gone.content)})
        return reports

    async def _answer(self, host: HostRecord, method: str, path: str, data: dict[str, Any]) -> Response:
        try:
            answer = await self._gw.proxy.call(host, method, f"/{API_VERSION}{path}", body=data)
        except HostFailed as exc:
            return error(exc.status, str(exc))
        return _relay(answer, host)


def _route(tree: bool) -> str:
    return "fork-tree" if tree else "fork"


def _shares(data: dict[str, Any], plan: list[tuple[HostRecord, int]]) -> list[dict[str, Any]]:
    """Each host's slice of the per-child lists, in the plan's order (the source's host first)."""
    shares: list[dict[str, Any]] = []
    start = 0
    for _, n in plan:
        share: dict[str, Any] = {}
        for name in ("child_env", "child_memory_limit_mib"):
            if isinstance(data.get(name), list):
                share[name] = data[name][start:start + n]
        shares.append(share)
        start += n
    return shares


def _runs(limits: Any, n: int) -> list[tuple[int, int, int | None]]:
    """``(start, size, limit)`` for each run of children with one memory limit (None: the common
    memory_limit_mib)."""
    if not isinstance(limits, list) or len(limits) != n:
        return [(0, n, None)]
    runs: list[tuple[int, int, int | None]] = []
    for i, limit in enumerate(limits):
        if runs and runs[-1][2] == limit:
            start, size, _ = runs[-1]
            runs[-1] = (start, size + 1, limit)
        else:
            runs.append((i, 1, limit))
    return runs


def _relay(answer: Any, host: HostRecord) -> Response:
    return Response(answer.content, status_code=answer.status_code,
                    headers={"content-type": answer.headers.get("content-type", "application/json"),
                             "x-forkd-host": host.host_id})


__all__ = ["SpreadForks"]
