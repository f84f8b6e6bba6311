"""Live updates (``GET /events``): one ``flowkit._client.browse.watch_changes`` per app, started
with the first browser that listens, rung into every listening browser's queue; each browser gets
``event: change`` soon after a write and a keep-alive comment every ``keepalive`` seconds. A
stream ends when its browser goes away or the app shuts down (``close``), so a server stopping
never waits on an open page."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ..._client.browse import watch_changes

__all__ = ["Changes"]

KEEPALIVE = 15.0


class Changes:
    """The app's doorbell: a watcher of the store fanned out to one queue per browser."""

    def __init__(self, store: Any, *, interval: float = 1.0, keepalive: float = KEEPALIVE) -> None:
        self.store = store
        self.interval = interval
        self.keepalive = keepalive
        self._queues: set[asyncio.Queue[None]] = set()
        self._stop: Callable[[], Awaitable[None]] | None = None
        self._starting: asyncio.Lock | None = None
        self._closed: asyncio.Event | None = None

    @property
    def listeners(self) -> int:
        """How many browsers listen now."""
        return len(self._queues)

    def _closed_event(self) -> asyncio.Event:
        if self._closed is None:
            self._closed = asyncio.Event()
        return self._closed

    async def _ensure_watching(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._stop is None and not self._closed_event().is_set():
                self._stop = await watch_changes(self.store, self._ring, interval=self.interval)

    def _ring(self) -> None:
        for q in self._queues:
            if q.empty():  # (one pending change per browser is enough: it refetches the page)
                q.put_nowait(None)

    def close_streams(self) -> None:
        """End every open stream (called as the server begins to shut down; thread-unsafe
        callers use ``loop.call_soon_threadsafe``)."""
        self._closed_event().set()

    async def close(self) -> None:
        """End every stream and stop the watcher."""
        self.close_streams()
        stop, self._stop = self._stop, None
        if stop is not None:
            await stop()

    async def stream(
        self,
        disconnected: Callable[[], Awaitable[bool]],
        delta: Callable[[], Awaitable[list[str]]] | None = None,
    ) -> AsyncIterator[str]:
        """One browser's event stream (text/event-stream lines): ``event: change`` after each
        change; with ``delta``, its messages instead (what changed, for a run's page), and
        once at once, for what changed between the page's rendering and this stream."""
        closed = self._closed_event()
        if closed.is_set():
            return
        await self._ensure_watching()
        queue: asyncio.Queue[None] = asyncio.Queue(maxsize=1)
        self._queues.add(queue)
        try:
            yield "retry: 2000\n: connected\n\n"
            if delta is not None:
                for message in await _safely(delta):
                    yield message
            while not closed.is_set():
                got = asyncio.ensure_future(queue.get())
                ended = asyncio.ensure_future(closed.wait())
                try:
                    done, _ = await asyncio.wait(
                        {got, ended}, timeout=self.keepalive, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    for t in (got, ended):
                        if not t.done():
                            t.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await t
                if closed.is_set() or await disconnected():
                    break
                if got in done and delta is not None:
                    for message in await _safely(delta):
                        yield message
                elif got in done:
                    yield "event: change\ndata: {}\n\n"
                else:
                    yield ": keep-alive\n\n"
        finally:
            self._queues.discard(queue)
            if not self._queues:  # (the last browser left: stop reading the store)
                task = asyncio.ensure_future(self._stop_if_idle())
                _idle_stops.add(task)
                task.add_done_callback(_idle_stops.discard)

    async def _stop_if_idle(self) -> None:
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._queues or self._stop is None:
                return  # (a browser came back meanwhile)
            stop, self._stop = self._stop, None
            await stop()


async def _safely(delta: Callable[[], Awaitable[list[str]]]) -> list[str]:
    """``delta()``; nothing when the store failed (a blip: the next change tries again)."""
    try:
        return await delta()
    except Exception:
        log.debug("reading what changed for a live page failed", exc_info=True)
        return []


log = logging.getLogger("flowkit")

_idle_stops: set[asyncio.Future[None]] = set()
"""Watchers being stopped after their last browser left (a task needs a reference)."""
