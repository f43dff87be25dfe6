"""E2B's sandbox list paged across the fleet (gateway/e2b_pages.py): every host's sandboxes come
exactly once, in E2B's order, whatever the page size; a token is checked before it is used."""

from __future__ import annotations

import base64
import datetime as dt
import json
import random

import pytest

from forkd.gateway.e2b_pages import DONE, BadToken, Cursor, HostPage, merge


def listed(host: str, n: int, rng: random.Random) -> list[dict[str, object]]:
    """A host's list as it answers it: newest first, some start times shared with other hosts."""
    times = sorted((rng.choice([0, 1, 2, 3, 1.5]) * 60 + rng.randrange(30) for _ in range(n)), reverse=True)
    return [{"sandboxID": f"sb-{host}-{i}", "startedAt":
             dt.datetime.fromtimestamp(1_700_000_000 + t, dt.UTC).isoformat().replace("+00:00", "Z")}
            for i, t in enumerate(times)]


def page_through(lists: dict[str, list[dict[str, object]]], limit: int, ascending: bool = False,
                 ) -> list[list[dict[str, object]]]:
    """What the gateway does, host by host, until no next token: each host asked from its offset."""
    pages, token = [], None
    while True:
        cursor = Cursor.decode(token)
        answers = {}
        for host, items in lists.items():
            at = cursor.offset(host)
            if at == DONE:
                continue
            mine = items[::-1] if ascending else items
            answers[host] = HostPage(mine[at:at + limit], more=at + limit < len(mine))
        page, following = merge(answers, cursor, limit, ascending=ascending, unreachable=[])
        pages.append(page)
        if following is None:
            return pages
        token = following.encode()


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 100])
@pytest.mark.parametrize("ascending", [False, True])
def test_every_sandbox_comes_once_in_order_whatever_the_page_size(limit: int, ascending: bool) -> None:
    rng = random.Random(limit * 10 + ascending)
    lists = {"h1": listed("h1", 9, rng), "h2": listed("h2", 4, rng), "h3": listed("h3", 0, rng)}
    pages = page_through(lists, limit, ascending)
    seen = [item["sandboxID"] for page in pages for item in page]
    assert sorted(seen) == sorted(str(i["sandboxID"]) for items in lists.values() for i in items)
    assert len(seen) == len(set(seen)) == 13
    assert all(len(page) <= limit for page in pages) and all(pages[:-1])
    times = [dt.datetime.fromisoformat(str(i["startedAt"])) for page in pages for i in page]
    assert times == sorted(times, reverse=not ascending)


def test_a_host_that_did_not_answer_keeps_its_place_for_the_next_page() -> None:
    first = {"sandboxID": "a", "startedAt": "2026-01-01T00:00:01Z"}
    answered = {"h1": HostPage([first, {"sandboxID": "b", "startedAt": "2026-01-01T00:00:00Z"}], more=False)}
    page, following = merge(answered, Cursor({"h2": 4}), 1, ascending=False, unreachable=["h2"])
    assert page == [first]
    assert following is not None and following.offsets == {"h1": 1, "h2": 4}
    # Once every host that answers is read to its end, there is no next page (the answer names the
    # host that did not answer, x-forkd-unreachable), rather than empty pages for ever.
    assert merge({}, Cursor({"h1": DONE, "h2": 4}), 10, ascending=False, unreachable=["h2"])[1] is None


def _token(data: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


@pytest.mark.parametrize(("token", "message"), [
    ("not base64 !", "not a token this gateway gave"),
    (_token([1, 2]), "at most"),
    (_token({"h1": "3"}), "bad entry for host 'h1'"),
    (_token({"h1": True}), "bad entry"),
    (_token({"h1": 1.5}), "bad entry"),
    (_token({"h1": -2}), "bad entry"),
    (_token({"h1": 1 << 40}), "bad entry"),
    (_token({"H/1": 0}), "bad entry"),
    (_token({f"h{i}": 0 for i in range(257)}), "at most 256 hosts"),
    ("A" * 5000, "longer than"),
])
def test_a_token_the_gateway_did_not_give_is_refused(token: str, message: str) -> None:
    with pytest.raises(BadToken, match=message):
        Cursor.decode(token)


def test_a_token_round_trips() -> None:
    cursor = Cursor({"h1": 3, "h2": DONE})
    assert Cursor.decode(cursor.encode()) == cursor and Cursor.decode(None) == Cursor()
