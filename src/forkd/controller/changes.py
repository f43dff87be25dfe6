"""`SandboxChanges`: the ``Runtime.diffs`` sub-API: a sandbox's changes found (diffs.py), shown
as JSON, a patch or a tar (diff_render.py), and applied to another sandbox (applies.py)."""

from __future__ import annotations

from pathlib import Path

from forkd.controller import diff_render
from forkd.controller.agent_gateway import AgentGateway
from forkd.controller.applies import ChangeApplier
from forkd.controller.diffs import SandboxDiffs
from forkd.controller.files import SandboxFiles
from forkd.controller.results import ApplyResult, FsDiff
from forkd.controller.sandboxes import SandboxTable
from forkd.controller.snapshots import SnapshotStore
from forkd.errors import InvalidRequest

FORMATS = ("json", "patch", "tar")


class SandboxChanges:
    def __init__(self, table: SandboxTable, snapshots: SnapshotStore, agents: AgentGateway,
                 files: SandboxFiles, tmp: Path) -> None:
        self._diffs = SandboxDiffs(table, snapshots, agents, tmp)
        self._applier = ChangeApplier(self._diffs, files, agents)

    async def diff(self, sandbox_id: str, against: str = "parent", *, include: list[str] | None = None,
                   exclude: list[str] | None = None) -> FsDiff:
        return await self._diffs.diff(sandbox_id, against, include=include, exclude=exclude)

    async def render(self, sandbox_id: str, against: str, fmt: str, *, include: list[str] | None = None,
                     exclude: list[str] | None = None) -> bytes:
        """The changes as a unified patch (``patch``) or a tar of the changed files (``tar``)."""
        if fmt not in ("patch", "tar"):
            raise InvalidRequest(f"format is one of {', '.join(FORMATS)}")
        async with self._diffs.opened(sandbox_id, against, include=include, exclude=exclude) as opened:
            return await (diff_render.patch(opened) if fmt == "patch" else diff_render.tar(opened))

    async def apply(self, target: str, source: str, paths: list[str] | None = None) -> ApplyResult:
        return await self._applier.apply(target, source, paths)
