"""How a worker lives through store failures: the proof that a lease is still live by the
worker's own clock, which errors are transient, the bounded backoff between tries, and the
commit that ends a run whose writes keep failing the same way (docs/stores.md, "When the
store fails").

Everything here reads time from the injected clock and randomness from the injected RNG."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from typing import Any, TypeVar

from .._core.clock import Clock
from ..errors import StoreUnavailableError

T = TypeVar("T")

LEASE_MARGIN = 0.1
"""The fraction of ``lease_ttl`` a worker keeps in hand: a lease requested at ``t`` is taken
as provably live until ``t + 0.9 * lease_ttl``, so that a step never starts in the last tenth
of the lease (clock drift between hosts, the time a write takes to land)."""

BACKOFF_FIRST = 0.05
"""Seconds before the first retry after a failed store call; doubled each time ..."""
BACKOFF_MAX = 1.0
"""... up to this bound (each pause jittered by ±25% from the injected RNG)."""

MAX_STORE_FAILURES = 3
"""Default ``WorkerConfig.max_store_failures``: how many activations of one run may fail the
same non-transient way in a row before the run is ended (failed or blocked)."""


def is_transient(exc: BaseException) -> bool:
    """Whether a store call that raised ``exc`` may well succeed when tried again: the store
    is unreachable or slow (``StoreUnavailableError``, a connection or OS error, a timeout).
    Anything else (bad data, a codec error, a bug) fails the same way again."""
    # (ConnectionError and TimeoutError, asyncio's too, are OSErrors)
    return isinstance(exc, StoreUnavailableError | OSError)


class LeaseProof:
    """Until when this worker can prove, by its own clock, that it still holds one run's
    lease: the instant a claim or renewal *request was sent*, plus ``lease_ttl``, less the
    margin. The store may have granted more, never less, so nothing this worker does before
    that instant can overlap another instance's claim (clocks agreeing within the margin)."""

    __slots__ = ("_clock", "_span", "lost", "until")

    def __init__(self, clock: Clock, lease_ttl: float) -> None:
        self._clock = clock
        self._span = lease_ttl * (1.0 - LEASE_MARGIN)
        self.until = float("-inf")
        self.lost = False

    def granted(self, sent_at: float) -> None:
        """A claim or renewal sent at ``sent_at`` (by this clock) succeeded."""
        self.until = max(self.until, sent_at + self._span)

    def stored(self, lease_expires: float | None, ttl: float) -> None:
        """The store shows this worker's lease expiring at ``lease_expires``: a value this
        worker computed as (request time + ``ttl``), so the request time is known."""
        if lease_expires is not None:
            self.granted(lease_expires - ttl)

    def lose(self) -> None:
        """The store said the lease is gone: nothing is provable any more."""
        self.lost = True

    def live(self) -> bool:
        return not self.lost and self._clock.now() < self.until


class Backoff:
    """Pauses of ``BACKOFF_FIRST`` doubling to ``BACKOFF_MAX``, jittered, slept on the
    injected clock (``TestEnv``'s virtual clock drives them)."""

    def __init__(self, clock: Clock, rng: random.Random, cap: float = BACKOFF_MAX) -> None:
        self._clock = clock
        self._rng = rng
        self._cap = cap
        self._next = min(BACKOFF_FIRST, cap)

    def reset(self) -> None:
        self._next = min(BACKOFF_FIRST, self._cap)

    def pause(self) -> float:
        """The next pause (and double the one after)."""
        delay = self._next * self._rng.uniform(0.75, 1.25)
        self._next = min(self._next * 2, self._cap)
        return round(delay, 6)

    async def sleep(self) -> None:
        await self._clock.sleep_until(round(self._clock.now() + self.pause(), 6))


async def bounded(clock: Clock, call: Awaitable[T], seconds: float) -> T:
    """``call``'s result, or ``TimeoutError`` once ``seconds`` have passed on ``clock`` (the
    call is then cancelled). ``asyncio.wait_for`` on the injected clock: a stalled store call
    cannot hold its caller longer, and virtual time drives the bound in tests."""
    task = asyncio.ensure_future(call)
    timer = asyncio.ensure_future(clock.sleep_until(clock.now() + seconds))
    try:
        await asyncio.wait({task, timer}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        timer.cancel()
    if task.done():
        return task.result()
    task.cancel()
    task.add_done_callback(_read)
    raise TimeoutError(f"store call did not return within {seconds:g} s")


def _read(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned call's outcome so that it is never logged as unretrieved."""
    if not task.cancelled():
        task.exception()
