"""In-process settlement notifications, so ``Engine.result`` wakes as soon as a run settles.

Engines that share a bus (``TestEnv`` gives its instances one) hear each other; across
processes ``result`` falls back to polling the store."""

from __future__ import annotations

import asyncio
from typing import Any


class Bus:
    """Futures keyed by run id, resolved when any engine on this bus settles the run."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[Any]]] = {}

    def waiter(self, run_id: str) -> asyncio.Future[Any]:
        """A future resolved with the settled run's snapshot (or ``None``)."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(run_id, []).append(fut)
        return fut

    def discard(self, run_id: str, fut: asyncio.Future[Any]) -> None:
        lst = self._waiters.get(run_id)
        if lst and fut in lst:
            lst.remove(fut)
            if not lst:
                del self._waiters[run_id]

    def settled(self, run_id: str, run: Any = None) -> None:
        """Wake the waiters of ``run_id``, handing them the settled snapshot when known."""
        for fut in self._waiters.pop(run_id, ()):
            if not fut.done():
                fut.set_result(run)
