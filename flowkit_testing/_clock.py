"""``VirtualClock``: time that moves only when told to, and never backwards."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import UTC, datetime

DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


class VirtualClock:
    """A ``flowkit.Clock`` for tests: ``now()`` is fixed until ``jump``/``advance``."""

    def __init__(self, start: float | datetime = DEFAULT_START) -> None:
        self._now = round(start.timestamp() if isinstance(start, datetime) else float(start), 6)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ids = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (deadline, next(self._ids), fut))
        await fut

    def next_deadline(self) -> float | None:
        """The earliest deadline anyone is sleeping until."""
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)
        return self._sleepers[0][0] if self._sleepers else None

    def jump(self, to: float) -> None:
        """Set the time to ``to`` (>= now) and wake every sleeper due by then, in order."""
        to = round(to, 6)
        if to < self._now:
            raise ValueError(f"virtual time cannot go backwards ({to} < {self._now})")
        self._now = to
        while self._sleepers and self._sleepers[0][0] <= to:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (firing sleepers; nothing else runs yet)."""
        if seconds < 0:
            raise ValueError("advance needs seconds >= 0")
        self.jump(self._now + seconds)
