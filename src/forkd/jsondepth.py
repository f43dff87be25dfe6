"""How deeply a JSON text nests, found without parsing it (stdlib only, no recursion).

Python's ``json`` and protobuf's JSON parser both recurse once per ``[`` or
``{``: a 40 KB body of nested arrays raises RecursionError in the one and
overflows the C stack in the other (a segfault: the whole daemon gone). So
every JSON text that reaches a parser from outside the daemon is scanned here
first and refused past ``forkd.bounds.MAX_JSON_DEPTH``: request bodies
(``api.limits``), Connect messages (``api.e2b.connect_bounds``) and the guest
agent's lines (``guest.transport``).

The scan counts ``[`` and ``{`` outside strings (a backslash escapes the next
byte inside one); a closer that matches nothing is ignored, so the count is
never below a real parser's depth. UTF-8 keeps every ASCII byte meaning
itself; a text in UTF-16 or UTF-32 (which ``json.loads`` accepts as bytes) is
also scanned as the text it decodes to.
"""

from __future__ import annotations

import json
import re

_OUTSIDE = re.compile(rb'[\[\]{}"]')
_INSIDE = re.compile(rb'["\\]')
_OPENERS = (ord("["), ord("{"))
_QUOTE = ord('"')
_BACKSLASH = ord("\\")


def deepest(data: bytes | bytearray, stop_above: int | None = None) -> int:
    """The deepest nesting in ``data`` (0 for a scalar); counting stops once past ``stop_above``."""
    depth = most = pos = 0
    end = len(data)
    in_string = False
    while pos < end:
        if in_string:
            match = _INSIDE.search(data, pos)
            if match is None:
                break
            at = match.start()
            if data[at] == _BACKSLASH:
                pos = at + 2
                continue
            in_string = False
            pos = at + 1
            continue
        match = _OUTSIDE.search(data, pos)
        if match is None:
            break
        at = match.start()
        pos = at + 1
        char = data[at]
        if char == _QUOTE:
            in_string = True
        elif char in _OPENERS:
            depth += 1
            if depth > most:
                most = depth
                if stop_above is not None and most > stop_above:
                    break
        elif depth:
            depth -= 1
    return most


def too_deep(data: bytes | bytearray, limit: int) -> bool:
    """Whether ``data`` nests deeper than ``limit``, read as bytes or as the text json would decode."""
    # A text cannot nest deeper than it has openers; counting them is C-speed, the scan is not, and
    # nearly every text (an agent's reply, a request body) has few. In UTF-16 or UTF-32 every opener
    # still has its byte, so the count is never below the depth there either.
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    if deepest(data, limit) > limit:
        return True
    if len(data) < 2:
        return False
    encoding = json.detect_encoding(bytes(data[:4]) if len(data) >= 4 else bytes(data))
    if encoding in ("utf-8", "utf-8-sig"):
        return False
    try:
        text = bytes(data).decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
    except UnicodeError:
        return False  # json.loads refuses it as well
    return deepest(text, limit) > limit


def refusal(limit: int) -> str:
    """The message a refused text is answered with."""
    return f"JSON nested deeper than {limit} levels is refused"


def loads(data: bytes | bytearray | str, limit: int) -> object:
    """``json.loads`` of a text from outside (a store, an archive), refused with ``ValueError`` past
    ``limit`` levels before the recursive parser sees it."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if too_deep(raw, limit):
        raise ValueError(refusal(limit))
    return json.loads(raw)
