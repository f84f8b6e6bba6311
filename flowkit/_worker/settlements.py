"""In-process settlement notifications, so ``Engine.result`` wakes as soon as a run settles.

Engines that share a bus (``TestEnv`` gives its instances one) hear each other; a run settled
anywhere else is found by ``result``'s fallback reads of the store."""

from __future__ import annotations

import asyncio

from .._core.run import Run


class Settlements:
    """Futures keyed by run id, resolved when any engine on this bus settles the run."""

    def __init__(self) -> None:
        self._waiters: dict[str, list[asyncio.Future[Run | None]]] = {}
        self._history: dict[str, list[asyncio.Future[None]]] = {}

    def waiter(self, run_id: str) -> asyncio.Future[Run | None]:
        """A future resolved with the settled run's snapshot, or ``None``: look again (the
        run left an activation unsettled, or settled without a snapshot at hand)."""
        fut: asyncio.Future[Run | None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(run_id, []).append(fut)
        return fut

    def discard(self, run_id: str, fut: asyncio.Future[Run | None]) -> None:
        lst = self._waiters.get(run_id)
        if lst and fut in lst:
            lst.remove(fut)
            if not lst:
                del self._waiters[run_id]

    def settled(self, run_id: str, run: Run | None = None) -> None:
        """Wake the waiters of ``run_id``, handing them the settled snapshot when known."""
        waiters = self._waiters.pop(run_id, None)
        if waiters is not None:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(run)

    # -- history notifications (``_history_wait``: published values, update replies) ----
    def history_waiter(self, run_id: str) -> asyncio.Future[None]:
        """A future resolved when an engine on this bus records an event of ``run_id`` that
        someone may wait for (``recorded``): read the history again."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._history.setdefault(run_id, []).append(fut)
        return fut

    def discard_history(self, run_id: str, fut: asyncio.Future[None]) -> None:
        lst = self._history.get(run_id)
        if lst and fut in lst:
            lst.remove(fut)
            if not lst:
                del self._history[run_id]

    def recorded(self, run_id: str) -> None:
        """An engine on this bus recorded an event of ``run_id`` that readers wait for
        (``event_set``, ``update_replied``): wake its history waiters."""
        waiters = self._history.pop(run_id, None)
        if waiters is not None:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
