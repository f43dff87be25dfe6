"""Structured outputs of the MCP tools that the REST API has no single schema for.

The others return the API's response models (:mod:`forkd.api.schemas`) as they are.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from forkd.api.schemas import SandboxInfo, SnapshotInfo


class SnapshotList(BaseModel):
    snapshots: list[SnapshotInfo] = Field(description="Every registered snapshot.")


class SandboxList(BaseModel):
    sandboxes: list[SandboxInfo] = Field(description="The sandboxes, each with its id.")


class Deleted(BaseModel):
    deleted: str = Field(description="The snapshot tag or sandbox id that is gone.")


class FileContent(BaseModel):
    path: str
    size: int = Field(description="Size of the file in bytes.")
    encoding: str = Field(description="'utf-8' (content is the text) or 'base64' (content is binary data).")
    content: str = Field(description="The first `returned` bytes of the file.")
    returned: int = Field(description="Bytes in `content` (decoded).")
    truncated: bool = Field(
        description="True if the file is larger than max_bytes and only its start is here.")
