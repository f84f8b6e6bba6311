"""Waiting for something to appear in a run's history (``engine.get_event``'s first value,
``engine.update``'s reply): read, and read again when this process records such an event
(``Settlements.recorded``), when an engine on the bus settles the run or lets it go unsettled (its
final commit may carry deferred events: ``Settlements.settled``), when the store's wake-ups say
another process wrote (``Watchable``: SqlStore emits one for a write that records
``event_set`` or ``update_replied``), or after a poll that backs off: wake-ups are hints,
and a lost one costs at most ``POLL_MAX``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._core.run import Run
from .._worker.settlements import Settlements
from ..errors import RunNotFoundError
from ..events import Event
from ..stores.base import Store

T = TypeVar("T")

POLL_MIN = 0.02
"""Seconds before the first fallback read; each further one waits twice as long."""
POLL_MAX = 1.0
"""The longest pause between two fallback reads."""


async def latest_event(
    store: Store, run_id: str, type: str, field: str, value: str
) -> Event | None:
    """The run's newest event of ``type`` whose string ``field`` equals ``value`` (the newest
    ``event_set`` of a key, the ``update_replied`` of an update id), or ``None``. A store
    with ``latest_event`` (``LatestEvent``: MemoryStore, SqlStore, CodecStore) reads just
    that event; any other store's whole history is loaded and searched."""
    find = getattr(store, "latest_event", None)
    if callable(find):
        found: Event | None = await find(run_id, type, field, value)
        return found
    for ev in reversed(await store.load_events(run_id)):
        if ev.type == type and getattr(ev, field, None) == value:
            return ev
    return None


async def wait_for_history(
    store: Store, bus: Settlements, run_id: str, pick: Callable[[Run], Awaitable[T | None]]
) -> T:
    """Until ``pick(run)`` (given the run as it is now; it reads what it needs of its
    history, e.g. with ``latest_event``) answers something other than ``None``: return it.
    The caller bounds the wait (``asyncio.timeout``); ``RunNotFoundError`` for an unknown
    run."""
    pause = POLL_MIN
    # the store's wake-ups, watched for the whole wait (a watcher started and stopped per
    # read would reconnect each time, and a connect fires its callbacks: a busy loop)
    current: list[asyncio.Future[None]] = []

    def wake() -> None:
        if current and not current[0].done():
            current[0].set_result(None)

    watch = getattr(store, "watch", None)
    stop: Callable[[], None] | None = watch(wake) if callable(watch) else None
    try:
        while True:
            fut = bus.history_waiter(run_id)  # first, so a record cannot slip between
            current[:] = [fut]
            settled = bus.waiter(run_id)
            try:
                run = await store.get_run(run_id)
                if run is None:
                    raise RunNotFoundError(run_id)
                got = await pick(run)
                if got is not None:
                    return got
                waits: set[asyncio.Future[Any]] = {fut, settled}
                await asyncio.wait(waits, timeout=pause, return_when=asyncio.FIRST_COMPLETED)
            finally:
                bus.discard_history(run_id, fut)
                bus.discard(run_id, settled)
            pause = min(pause * 2, POLL_MAX)
    finally:
        if stop is not None:
            stop()


__all__ = ["POLL_MAX", "POLL_MIN", "latest_event", "wait_for_history"]
