"""Start a new task next instead of behind everything already ready on the event loop."""

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
