"""Directory watchers on real inotify (the agent's code runs as well on the host as in a guest),
and the daemon's checks of what a guest answers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from forkd.controller.watches import _batch
from forkd.errors import GuestError
from forkd.guest.agent.watches import MAX_WATCHERS, Watches
from forkd.guest.protocol import CONFLICT, INVALID, NOT_FOUND, RequestError


def poll(watches: Watches, watcher: str, wait_ms: int = 500) -> list[tuple[str, str]]:
    answer = watches.handle({"op": "events", "watcher": watcher, "wait_ms": wait_ms})
    assert answer["overflowed"] is False
    return [(e["name"], e["type"]) for e in answer["events"]]


def test_events_are_named_relative_to_the_watched_directory_in_envds_terms(tmp_path: Path) -> None:
    watches = Watches()
    watcher = watches.handle({"op": "create", "path": str(tmp_path), "recursive": True})["watcher"]
    (tmp_path / "sub").mkdir()
    assert poll(watches, watcher) == [("sub", "create")]
    (tmp_path / "sub" / "a.txt").write_text("x")  # a file in a directory made after the watch began
    os.chmod(tmp_path / "sub" / "a.txt", 0o600)
    os.rename(tmp_path / "sub" / "a.txt", tmp_path / "b.txt")
    (tmp_path / "b.txt").unlink()
    assert poll(watches, watcher) == [("sub/a.txt", "create"), ("sub/a.txt", "write"), ("sub/a.txt", "chmod"),
                                      ("sub/a.txt", "rename"), ("b.txt", "create"), ("b.txt", "remove")]
    assert poll(watches, watcher, wait_ms=50) == []  # nothing new: an empty answer after the wait
    assert watches.handle({"op": "remove", "watcher": watcher}) == {"removed": True}
    with pytest.raises(RequestError) as gone:
        watches.handle({"op": "events", "watcher": watcher})
    assert gone.value.kind == NOT_FOUND


def test_an_upload_looks_like_envds_in_place_write(tmp_path: Path) -> None:
    """Uploads land by a rename of a temp file; a watcher reports them as envd (which writes in
    place) does, without the temp file: a new file is made, written and given its mode."""
    import base64

    from forkd.guest.agent.uploads import Uploads

    def upload(path: Path, data: bytes) -> None:
        uploads = Uploads()
        handle = uploads.write_open({"path": str(path)})["handle"]
        uploads.write({"handle": handle, "offset": 0, "data": base64.b64encode(data).decode()})
        uploads.write_close({"handle": handle, "commit": True})

    watches = Watches()
    watcher = watches.handle({"op": "create", "path": str(tmp_path), "recursive": True})["watcher"]
    upload(tmp_path / "new.txt", b"first")
    assert poll(watches, watcher) == [("new.txt", "create"), ("new.txt", "write"), ("new.txt", "chmod")]
    upload(tmp_path / "new.txt", b"second")
    assert poll(watches, watcher) == [("new.txt", "write"), ("new.txt", "chmod")]
    assert (tmp_path / "new.txt").read_bytes() == b"second"


def test_a_directory_made_between_polls_is_watched_before_the_next_poll(tmp_path: Path) -> None:
    """The reader adds a new directory's watch as its creation comes in, not at the next poll:
    a file written into it right after (E2B's make_dir, then write) is seen."""
    import time

    watches = Watches()
    watcher = watches.handle({"op": "create", "path": str(tmp_path), "recursive": True})["watcher"]
    (tmp_path / "nested").mkdir()
    time.sleep(0.2)  # a request's round trip, at the least
    (tmp_path / "nested" / "f.txt").write_text("x")
    assert poll(watches, watcher) == [("nested", "create"), ("nested/f.txt", "create"),
                                      ("nested/f.txt", "write")]


def test_a_plain_watch_sees_only_its_own_directory(tmp_path: Path) -> None:
    (tmp_path / "deep").mkdir()
    watches = Watches()
    watcher = watches.handle({"op": "create", "path": str(tmp_path)})["watcher"]
    (tmp_path / "deep" / "x").write_text("x")
    (tmp_path / "top").write_text("y")
    assert [name for name, _ in poll(watches, watcher)] == ["top", "top"]  # create, write


def test_a_tree_made_at_once_is_watched_all_the_way_down(tmp_path: Path) -> None:
    watches = Watches()
    watcher = watches.handle({"op": "create", "path": str(tmp_path), "recursive": True})["watcher"]
    os.makedirs(tmp_path / "a" / "b")  # b is made before a's watch can exist
    (tmp_path / "a" / "b" / "f").write_text("f")
    seen = poll(watches, watcher)
    assert ("a", "create") in seen
    more = poll(watches, watcher, wait_ms=100)
    (tmp_path / "a" / "b" / "g").write_text("g")
    assert ("a/b/g", "create") in seen + more + poll(watches, watcher)


@pytest.mark.parametrize("req, kind", [
    ({"op": "create", "path": "/no/such/dir"}, NOT_FOUND),
    ({"op": "create", "path": "relative"}, INVALID),
    ({"op": "events", "watcher": 7}, INVALID),
    ({"op": "events", "watcher": "w999"}, NOT_FOUND),
    ({"op": "nope", "watcher": "w1"}, NOT_FOUND),
])
def test_bad_requests_are_refused_with_a_kind(req: dict[str, Any], kind: str) -> None:
    with pytest.raises(RequestError) as refused:
        Watches().handle(req)
    assert refused.value.kind == kind


def test_a_file_is_not_a_directory_and_watchers_are_bounded(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    watches = Watches()
    with pytest.raises(RequestError) as not_dir:
        watches.handle({"op": "create", "path": str(tmp_path / "f")})
    assert not_dir.value.kind == INVALID
    made = [watches.handle({"op": "create", "path": str(tmp_path)})["watcher"] for _ in range(MAX_WATCHERS)]
    with pytest.raises(RequestError) as full:
        watches.handle({"op": "create", "path": str(tmp_path)})
    assert full.value.kind == CONFLICT and "stop one first" in str(full.value)
    watches.drop_all()  # a restored child: its parent's watchers are nobody's
    assert watches.handle({"op": "create", "path": str(tmp_path)})["watcher"] not in made


@pytest.mark.parametrize("answer", [
    {"events": "x"},
    {"events": [{"name": "a", "type": "explode"}]},
    {"events": [{"name": 5, "type": "create"}]},
    {"events": [{"name": "a" * 10_000, "type": "create"}]},
    {"events": [{"name": "a", "type": "create"}] * 1001},
])
def test_the_daemon_refuses_a_malformed_guest_answer(answer: dict[str, Any]) -> None:
    with pytest.raises(GuestError):
        _batch(answer)


def test_the_daemon_types_a_good_answer() -> None:
    batch = _batch({"events": [{"name": "a/b", "type": "write"}], "overflowed": True})
    assert [(e.name, e.type) for e in batch.events] == [("a/b", "write")] and batch.overflowed
