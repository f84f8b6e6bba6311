"""A run's page stays bounded however long its history or however many its children
(docs/ui.md "Pages"): the timeline shows the newest events with links to earlier and later
pages by sequence number, the children are paged by ``(created_at, id)``; walking the links
shows every event and every child once. On each store (memory, a SQLite file, PostgreSQL)."""

from __future__ import annotations

import re
from typing import Any

from ui_kit import client, parse

from flowkit._core.run import Run, RunStatus
from flowkit.cli.ui._views import CHILDREN_PAGE, EVENT_PAGE
from flowkit.events import RunStarted, StepCompleted

T0 = 1_767_225_600.0
STEPS = 450
KIDS = 2 * CHILDREN_PAGE + 7


def _run(run_id: str, parent: str | None = None, at: float = T0) -> Run:
    return Run(
        id=run_id,
        workflow="long",
        workflow_version="1",
        status=RunStatus.SUSPENDED,
        input={"n": 1},
        created_at=at,
        updated_at=at,
        parent_id=parent,
    )


async def _long_run(store: Any) -> None:
    """A run of ``STEPS`` steps (written straight to the store: no engine needed)."""
    run = _run("long")
    events: list[Any] = [RunStarted(workflow="long", version="1", input={"n": 1}, at=T0)]
    events += [
        StepCompleted(
            pos=f"{i}", name="one", attempt=1, result={"i": i, "text": "x" * 40}, at=T0 + i / 10
        )
        for i in range(1, STEPS + 1)
    ]
    _, created = await store.create_run(run, events)
    assert created


def _link(html: str, id: str) -> str | None:
    m = re.search(rf'<a id="{id}" [^>]*href="([^"]+)"', html)
    return None if m is None else m.group(1).replace("&amp;", "&")


def _seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'<li class="event"[^>]*data-seq="(\d+)"', html)]


async def test_a_long_history_is_paged(store: Any) -> None:
    await _long_run(store)
    total = STEPS + 1
    async with client(store) as c:
        first = await c.get("/runs/long")
        assert first.status_code == 200
        # bounded: the newest page only (this history rendered whole was 360 kB; a page of
        # it stays under a third of that, however long the history grows)
        assert len(first.content) < 120_000, len(first.content)
        doc = parse(first.text)
        assert _seqs(first.text) == list(range(total - EVENT_PAGE + 1, total + 1))
        assert doc.by_id("event-count").text == str(total)  # type: ignore[union-attr]
        timeline = doc.by_id("timeline")
        assert timeline is not None and timeline.get("data-follow") == "true"
        assert timeline.get("data-last-seq") == str(total)
        assert doc.by_id("events-later") is None and doc.by_id("events-newest") is None
        assert doc.by_id("events-first").get("href") == "/runs/long?after=0"  # type: ignore[union-attr]
        # walk back with "Earlier": every event once, newest page first
        seen: list[int] = []
        url: str | None = "/runs/long"
        pages = 0
        while url:
            r = await c.get(url)
            assert r.status_code == 200
            page = _seqs(r.text)
            assert 1 <= len(page) <= EVENT_PAGE
            seen = page + seen
            if pages:
                assert 'data-follow="false"' in r.text
                assert '<a id="events-newest" class="button secondary" href="/runs/long">' in r.text
            url = _link(r.text, "events-earlier")
            pages += 1
        assert seen == list(range(1, total + 1))
        assert pages == -(-total // EVENT_PAGE)
        # and forward with "Later" from the first page
        seen, url = [], "/runs/long?after=0"
        while url:
            r = await c.get(url)
            seen += _seqs(r.text)
            url = _link(r.text, "events-later")
        assert seen == list(range(1, total + 1))
        last = parse(r.text).by_id("timeline")
        assert last is not None and last.get("data-follow") == "true"  # (the end: followed)
        for bad in ("before=x", "after=-1", "before=1&after=2"):
            r = await c.get(f"/runs/long?{bad}")
            assert r.status_code == 400, bad
            assert parse(r.text).by_id("page-error") is not None


async def test_children_are_paged(store: Any) -> None:
    _, created = await store.create_run(
        _run("fan"), [RunStarted(workflow="long", version="1", at=T0)]
    )
    assert created
    for i in range(KIDS):
        kid = _run(f"kid-{i:03d}", parent="fan", at=T0 + 1 + i // 3)
        await store.create_run(kid, [RunStarted(workflow="long", version="1", at=kid.created_at)])
    want = sorted((await store.list_runs(parent_id="fan")), key=lambda r: (r.created_at, r.id))
    assert len(want) == KIDS
    seen: list[str] = []
    url: str | None = "/runs/fan"
    async with client(store) as c:
        while url:
            r = await c.get(url)
            assert r.status_code == 200
            doc = parse(r.text)
            kids = [li.get("data-run-id") or "" for li in doc.by_id("run-children").all("li")]  # type: ignore[union-attr]
            assert 1 <= len(kids) <= CHILDREN_PAGE
            seen += kids
            assert (doc.by_id("children-first") is not None) == (url != "/runs/fan")
            nxt = doc.by_id("children-next")
            url = None if nxt is None else nxt.get("href")
    assert seen == [r.id for r in want]
