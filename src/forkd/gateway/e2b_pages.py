"""E2B's sandbox list through the gateway, paged across hosts.

A page of the fleet's list is made of every host's next page: each host is asked for up to
``limit`` sandboxes from where its own list was left (its offset, as a single host's
``nextToken`` is), the answers are merged in E2B's order (by start time, newest first unless
``order=asc``), each host's in the order it gave, and the first ``limit`` kept. The page's
``x-next-token`` carries how far each host's list has been read: base64url of a small JSON object
``{host id: offset}``, with ``-1`` for a host read to its end. It is the SDK's to send back as it
is, and a client's like any input: bounded and checked before it is used.

As on one host, offsets are positions: a sandbox started or gone between two pages shifts the
rest of that host's list. A host that does not answer is named in ``x-forkd-unreachable`` and keeps
its offset in the token, so the next page asks it again; there is a next page only while a host
that answers has more (a host that is down does not make empty pages for ever). A host that joined
the fleet after the first page is read from its start.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from forkd.bounds import HOST_ID_RE

TOKEN_MAX = 4096  # characters of a next token: room for hundreds of hosts
HOSTS_MAX = 256
OFFSET_MAX = 1 << 31
DONE = -1  # a host whose list has been read to its end


class BadToken(ValueError):
    """A ``nextToken`` that is not one this gateway gave."""


@dataclass(frozen=True)
class Cursor:
    """How far each host's list has been read (absent: from its start)."""

    offsets: dict[str, int] = field(default_factory=dict)

    def offset(self, host_id: str) -> int:
        return self.offsets.get(host_id, 0)

    def encode(self) -> str:
        raw = json.dumps(self.offsets, separators=(",", ":"), sort_keys=True).encode()
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str | None) -> Cursor:
        """The cursor of a client's ``nextToken`` (none: the first page); BadToken if it is not
        one of this gateway's."""
        if not token:
            return cls()
        if len(token) > TOKEN_MAX:
            raise BadToken(f"nextToken is longer than {TOKEN_MAX} characters")
        try:
            data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        except (binascii.Error, ValueError):
            raise BadToken("nextToken is not a token this gateway gave (send back x-next-token as it "
                           "came)") from None
        if not isinstance(data, dict) or len(data) > HOSTS_MAX:
            raise BadToken(f"nextToken must name at most {HOSTS_MAX} hosts")
        for host_id, offset in data.items():
            good = type(offset) is int and DONE <= offset < OFFSET_MAX  # not a bool, not a float
            if not HOST_ID_RE.fullmatch(host_id) or not good:
                raise BadToken(f"nextToken has a bad entry for host {str(host_id)[:20]!r}")
        return cls(dict(data))


@dataclass(frozen=True)
class HostPage:
    """One host's answer: its sandboxes from its offset, and whether its list goes on after them."""

    items: list[dict[str, Any]]
    more: bool


def _started(item: dict[str, Any]) -> float:
    """A listed sandbox's ``startedAt`` as a time (ISO 8601 text, whose string order is not its time
    order where one has fractional seconds and another has none); 0 for one without a readable one."""
    try:
        return dt.datetime.fromisoformat(str(item.get("startedAt"))).timestamp()
    except (ValueError, OverflowError):
        return 0.0


def merge(pages: dict[str, HostPage], cursor: Cursor, limit: int, *, ascending: bool,
          unreachable: list[str]) -> tuple[list[dict[str, Any]], Cursor | None]:
    """The fleet's page (at most ``limit``, each host's items in its own order) and the cursor of
    the next one, None when every reachable host has been read to its end."""
    heads = {host_id: 0 for host_id in sorted(pages)}
    page: list[dict[str, Any]] = []
    while len(page) < limit:
        waiting = [h for h, i in heads.items() if i < len(pages[h].items)]
        if not waiting:
            break
        # The host whose next sandbox comes first in E2B's order; on a tie the first host by id
        # (min and max both keep the first of equals, and ``heads`` is in host id order).
        pick = (min if ascending else max)(waiting, key=lambda h: _started(pages[h].items[heads[h]]))
        page.append(pages[pick].items[heads[pick]])
        heads[pick] += 1
    offsets = dict(cursor.offsets)
    going_on = False
    for host_id, taken in heads.items():
        left = taken < len(pages[host_id].items) or pages[host_id].more
        offsets[host_id] = cursor.offset(host_id) + taken if left else DONE
        going_on = going_on or left
    for host_id in unreachable:
        offsets.setdefault(host_id, 0)  # asked again on the next page
    return page, Cursor(offsets) if going_on else None


__all__ = ["DONE", "BadToken", "Cursor", "HostPage", "merge"]
