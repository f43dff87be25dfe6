"""forkd.jsondepth: the nesting scan in front of every parser of outside JSON (issue 24)."""

from __future__ import annotations

import json

import pytest

from forkd import bounds
from forkd.jsondepth import deepest, too_deep

LIMIT = bounds.MAX_JSON_DEPTH


@pytest.mark.parametrize(("text", "depth"), [
    (b"1", 0), (b'"[[["', 0), (b"[]", 1), (b'{"a": [1, {"b": []}]}', 4),
    (b'["\\"[[[", "\\\\", [[]]]', 3),  # escaped quotes and backslashes inside strings
    (b"]]]][[", 2),  # stray closers never lower the count below a real parser's
])
def test_deepest_counts_structure_outside_strings(text: bytes, depth: int) -> None:
    assert deepest(text) == depth


def test_the_bound_is_exact() -> None:
    assert not too_deep(b"[" * LIMIT + b"]" * LIMIT, LIMIT)
    assert too_deep(b"[" * (LIMIT + 1) + b"]" * (LIMIT + 1), LIMIT)
    assert too_deep(b"{" * 20000, LIMIT)  # unbalanced: refused all the same


def test_utf16_is_scanned_as_the_text_json_would_decode() -> None:
    # json.loads takes UTF-16 bytes. In UTF-16-LE, U+5C41 is the bytes 41 5C: a byte scan alone
    # reads an escape there, skips the closing quote and counts none of the brackets after it.
    data = ('["\u5c41", ' + "[" * 200 + "]" * 201).encode("utf-16-le")
    assert deepest(data) <= LIMIT
    assert len(json.loads(data)) == 2
    assert too_deep(data, LIMIT)


def test_a_large_ordinary_document_scans_fast() -> None:
    import time

    doc = json.dumps({"data": "A" * (1 << 20), "list": list(range(10000))}).encode()
    start = time.perf_counter()
    assert deepest(doc) == 2
    assert time.perf_counter() - start < 1.0
