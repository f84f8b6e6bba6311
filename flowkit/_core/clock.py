"""Time enters flowkit through one ``Clock``; ``SystemClock`` is the only wall-clock reader."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """Seconds since the Unix epoch as a float, and a way to wait until a given instant."""

    def now(self) -> float:
        """The current time (microsecond precision is enough everywhere in flowkit)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once ``now() >= deadline``."""
        ...


class SystemClock:
    """The real clock: ``time.time()`` and ``asyncio.sleep``."""

    def now(self) -> float:
        return round(time.time(), 6)

    async def sleep_until(self, deadline: float) -> None:
        delay = deadline - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
