"""Waiting for something to appear in a run's history (``engine.get_event``'s first value,
``engine.update``'s reply): read, and read again when this process records such an event
(``Bus.recorded``), when the store's wake-ups say another process wrote (``Watchable``), or
after a poll that backs off: wake-ups are hints, and a lost one costs at most ``POLL_MAX``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from ._bus import Bus
from ._run import Run
from .errors import RunNotFoundError
from .events import Event
from .stores.base import Store

T = TypeVar("T")

POLL_MIN = 0.02
"""Seconds before the first fallback read; each further one waits twice as long."""
POLL_MAX = 1.0
"""The longest pause between two fallback reads."""


async def wait_for_history(
    store: Store, bus: Bus, run_id: str, pick: Callable[[Run, list[Event]], T | None]
) -> T:
    """Until ``pick(run, events)`` answers something other than ``None``: return it. The
    caller bounds the wait (``asyncio.timeout``); ``RunNotFoundError`` for an unknown run."""
    pause = POLL_MIN
    watch = getattr(store, "watch", None)
    while True:
        fut = bus.history_waiter(run_id)  # first, so a record cannot slip between
        stop: Callable[[], None] | None = None
        try:
            if callable(watch):
                stop = watch(_resolver(fut))
            run = await store.get_run(run_id)
            if run is None:
                raise RunNotFoundError(run_id)
            got = pick(run, await store.load_events(run_id))
            if got is not None:
                return got
            await asyncio.wait({fut}, timeout=pause)
        finally:
            bus.discard_history(run_id, fut)
            if stop is not None:
                stop()
        pause = min(pause * 2, POLL_MAX)


def _resolver(fut: asyncio.Future[None]) -> Callable[[], None]:
    """A wake-up callback that resolves ``fut`` (once)."""

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    return wake


__all__ = ["POLL_MAX", "POLL_MIN", "wait_for_history"]
