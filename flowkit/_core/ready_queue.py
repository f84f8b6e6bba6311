"""The one module that peeks at asyncio's ready queue (the loop's private ``_ready`` deque).

``start_next`` starts a task ahead of other ready work; ``others_ready`` tells whether anything
else is ready to run. On a loop without that deque both fall back to safe answers."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def start_next(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """``asyncio.ensure_future(coro)``, with the task's first step moved to the front of the
    loop's ready queue: it runs right after the current callback, as the continuation of the
    work that created it (a step the body awaits, a run a release just handed over), not
    after every other run's ready work. Python 3.12's eager tasks go further (they start
    synchronously); on a loop without asyncio's ``_ready`` deque this is plain scheduling."""
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", None)
    before = len(ready) if isinstance(ready, collections.deque) else -1
    task = loop.create_task(coro)
    if isinstance(ready, collections.deque) and len(ready) == before + 1 and before > 0:
        ready.appendleft(ready.pop())  # the handle create_task just scheduled
    return task


def others_ready(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether callbacks are ready to run on ``loop`` after the current one (``True`` when
    the loop does not say: the caller must then assume other work may run before it)."""
    ready = getattr(loop, "_ready", None)
    return ready is None or len(ready) > 0


__all__ = ["others_ready", "start_next"]
