"""The dashboard's live updates in process (``flowkit._ui._sse.Changes``, on each store): one
watcher fanned out to every listening browser, ``change`` after a write from another store
object, keep-alive comments, streams that end when the browser leaves or the app closes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from store_kit import Backend
from ui_kit import WORKFLOWS

from flowkit import Engine
from flowkit._ui._sse import Changes


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
