"""The dashboard's live updates in process (``flowkit.cli.ui._sse.Changes``, on each store): one
watcher fanned out to every listening browser, ``change`` after a write from another store
object, keep-alive comments, streams that end when the browser leaves or the app closes; a
run page's stream sends what changed (new timeline rows, its state, its actions)."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from starlette.requests import Request
from store_kit import Backend
from ui_kit import TOKEN, WORKFLOWS, client, parse, until

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.cli.ui import _app, _views, create_app
from flowkit.cli.ui._app import _run_delta
from flowkit.cli.ui._sse import Changes


async def _next(stream: AsyncIterator[str], timeout: float = 20.0) -> str:
    return await asyncio.wait_for(anext(stream), timeout)


async def _never() -> bool:
    return False


async def test_a_write_from_another_store_rings_every_stream(backend: Backend) -> None:
    changes = Changes(backend.store, interval=0.05, keepalive=60)
    a, b = changes.stream(_never), changes.stream(_never)
    assert (await _next(a)).endswith(": connected\n\n")
    assert (await _next(b)).endswith(": connected\n\n")
    assert changes.listeners == 2
    other = backend.another()
    engine = Engine(other, WORKFLOWS, worker=False)
    await engine.start("echo", 1, "written-elsewhere")
    assert await _next(a) == "event: change\ndata: {}\n\n"
    assert await _next(b) == "event: change\ndata: {}\n\n"
    await changes.close()
    for s in (a, b):
        try:
            await _next(s)
        except StopAsyncIteration:
            pass
        else:
            raise AssertionError("a stream outlived close()")
    assert changes.listeners == 0


async def test_keep_alive_and_a_browser_that_leaves(backend: Backend) -> None:
    changes = Changes(backend.store, interval=0.05, keepalive=0.05)
    gone = False

    async def disconnected() -> bool:
        return gone

    s = changes.stream(disconnected)
    await _next(s)
    # (a SQL store's watcher may ring once as it starts; nothing else writes: keep-alives)
    seen = [await _next(s) for _ in range(3)]
    assert seen[1:] == [": keep-alive\n\n"] * 2
    gone = True
    try:
        await _next(s)
    except StopAsyncIteration:
        pass
    else:
        raise AssertionError("the stream outlived its browser")
    assert changes.listeners == 0
    await changes.close()
    late = changes.stream(_never)  # (after close: ends at once)
    try:
        await _next(late)
    except StopAsyncIteration:
        pass
    else:
        raise AssertionError("a stream opened after close()")


@workflow(name="grow")
class Grow:
    """Takes ``more`` signals: ``n`` runs ``n`` steps, ``None`` completes."""

    async def one(self, i: int) -> int:
        return i

    async def run(self, ctx: WorkflowCtx, inp: Any) -> str:
        while True:
            n = await ctx.wait_for_signal("more")
            if n is None:
                return "done"
            for i in range(n):
                await ctx.step(self.one, i)


def _messages(raw: list[str]) -> list[tuple[str, str | None, dict[str, Any]]]:
    """Server-sent events as (event, id, data)."""
    out = []
    for m in raw:
        fields = dict(line.split(": ", 1) for line in m.strip().split("\n"))
        out.append((fields["event"], fields.get("id"), json.loads(fields["data"])))
    return out


def _stream_request(url: str, last_event_id: str | None = None) -> Request:
    path, _, query = url.partition("?")
    headers = [] if last_event_id is None else [(b"last-event-id", last_event_id.encode())]
    return Request(
        {
            "type": "http",
            "method": "GET",
            "path": path,
            "query_string": query.encode(),
            "headers": headers,
        }
    )


async def test_a_run_page_gets_what_changed_not_the_page(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run page's stream (``/events?run=...``) sends the new timeline rows past the last
    the page has, its state part when it changed and its actions when the allowed set
    changed; nothing when nothing changed."""
    app = create_app(store, token=TOKEN)
    d = app.state.dashboard
    async with Engine(store, [Grow()], poll_interval=0.02) as engine:
        await engine.start("grow", None, "g")

        async def waits(n_events: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                run = await store.get_run("g")
                return bool(run.waiting_signals) and len(await store.load_events("g")) >= n_events

            return check

        await until(await waits(1), "the run to wait")
        async with client(store) as c:
            page = parse((await c.get("/runs/g")).text)
        live = page.by_id("run-live")
        assert live is not None
        url = (live.get("data-stream") or "").replace("&amp;", "&")
        last = int(page.by_id("timeline").get("data-last-seq") or 0)  # type: ignore[union-attr]
        assert url.startswith("/events?run=g&") and last >= 1
        delta = _run_delta(d, _stream_request(url))
        assert await delta() == []  # (nothing changed since the page was rendered)

        n = len(await store.load_events("g"))
        await engine.signal("g", "more", 3)
        await until(await waits(n + 4), "three steps")
        got = _messages(await delta())
        assert [m[0] for m in got] == ["events", "state"]  # (no actions: the same allowed)
        _, id_, data = got[0]
        seqs = [int(s) for s in re.findall(r'data-seq="(\d+)"', data["html"])]
        everything = await store.load_events("g")
        assert seqs == [e.seq for e in everything if e.seq > last]
        assert id_ == str(seqs[-1]) and data["last"] == seqs[-1]
        assert data["count"] == len(everything)
        assert data["html"].count('<li class="event"') == len(seqs)
        assert 'id="run-status"' in got[1][2]["html"] and "<html" not in got[1][2]["html"]
        assert await delta() == []  # (sent once)

        await engine.signal("g", "more", None)
        assert await engine.result("g", timeout=20) == "done"
    got = _messages(await delta())
    assert [m[0] for m in got] == ["events", "state", "actions"]
    assert "run_completed" in got[0][2]["html"]
    assert 'data-status="completed"' in got[1][2]["html"]
    assert 'id="no-actions"' in got[2][2]["html"] and "<form" not in got[2][2]["html"]

    # a reconnect resumes after the last event it got (Last-Event-ID), not the page's
    again = _messages(await _run_delta(d, _stream_request(url, str(seqs[-1])))())
    resumed = [int(s) for s in re.findall(r'data-seq="(\d+)"', again[0][2]["html"])]
    assert resumed[0] == seqs[-1] + 1
    # a page showing older events (follow=0) gets how many there are, no rows
    older = _messages(await _run_delta(d, _stream_request(url.replace("follow=1", "follow=0")))())
    assert older[0][0] == "events" and "html" not in older[0][2]
    assert older[0][2]["count"] == len(await store.load_events("g"))
    # a page far behind (more than MAX_PAGES_PER_CHANGE pages) gets the newest page instead
    monkeypatch.setattr(_views, "EVENT_PAGE", 2)
    monkeypatch.setattr(_app, "MAX_PAGES_PER_CHANGE", 1)
    far = _messages(await _run_delta(d, _stream_request(url.replace("after=", "after=0&x=")))())
    everything = await store.load_events("g")
    assert far[0][0] == "events" and far[0][2]["reset"] is True
    rows = [int(s) for s in re.findall(r'data-seq="(\d+)"', far[0][2]["html"])]
    assert rows == [e.seq for e in everything[-2:]]
