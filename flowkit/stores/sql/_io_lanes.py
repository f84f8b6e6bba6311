"""The I/O lanes of a ``Database`` (``Lanes``, mixed into it): which lane runs a call, the
current thread's connection and lock, and abandoning a call that stalled on its connection.
Apart from ``Database`` so that what runs where reads on its own (docs/stores.md, "How calls
run"); the threads themselves are ``_iothread``."""

from __future__ import annotations

import asyncio
import collections
import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import StoreUnavailableError
from ._connection import Conn, log
from ._iothread import DONE, QUEUED, Job, Lane, Stats, current_lane

LANES = {"postgresql": {"write": 4, "read": 4}, "sqlite": {"write": 1, "read": 1}}
"""How many I/O threads (each with a connection) a store runs at most, per kind: on
PostgreSQL several write batches and several reads are in flight at once (their round trips
overlap); SQLite has one writer per file anyway. Lanes start on demand and exit when idle."""


class Lanes:
    """Mixed into ``Database``, which sets ``stats`` and ``stall_timeout`` and calls
    ``_open_lanes``: the lanes (``_iothread.Lane``: one thread and its own ``Conn`` each), up to
    ``max_lanes`` of each kind, and the inline lane of calls run on the caller's thread."""

    stats: Stats
    stall_timeout: float

    if TYPE_CHECKING:

        @property
        def shown_url(self) -> str: ...

    def _open_lanes(self, *, pg: bool, threaded: bool) -> None:
        self.threaded = threaded  # whether the async face uses the I/O threads
        self.read_lane = True  # reads on lanes of their own (not behind write batches)
        # how many lanes of each kind at most (each with a connection: see ``LANES``)
        self.max_lanes = dict(LANES["postgresql" if pg else "sqlite"])
        self._inline = Lane("flowkit-inline", self.stats.part(), thread=False)
        self._lanes: dict[str, list[Lane]] = {"read": [], "write": []}
        self._retired: list[Lane] = []  # abandoned lanes whose stuck call has not returned
        self._lanes_lock = threading.Lock()
        self._serial = itertools.count(1)

    def _here(self) -> Lane:
        lane = current_lane()
        return lane if lane is not None and lane.owner is self else self._inline

    @property
    def conn(self) -> Conn | None:
        """The connection of the lane the current thread serves (``None``: not open yet)."""
        return self._here().conn

    @conn.setter
    def conn(self, c: Conn | None) -> None:
        self._here().conn = c

    @property
    def io(self) -> threading.RLock:
        """The lock of the current thread's connection: one transaction at a time on it."""
        return self._here().io

    @property
    def counts(self) -> collections.Counter[str]:
        """The current thread's part of ``stats``, to count into."""
        return self._here().counts

    def connections(self) -> list[Conn]:
        """Every open connection of the store (tests)."""
        with self._lanes_lock:
            lanes = [self._inline, *(lane for ls in self._lanes.values() for lane in ls)]
        return [lane.conn for lane in lanes if lane.conn is not None]

    def lanes(self, kind: str) -> list[Lane]:
        """The live lanes of ``kind`` (``"read"``/``"write"``; tests, benchmarks)."""
        with self._lanes_lock:
            return [lane for lane in self._lanes[kind] if lane.usable]

    def _lane(self, kind: str) -> Lane:
        """The lane of ``kind`` a job goes to: an idle one, else a new one while there are
        fewer than ``max_lanes[kind]``, else the least loaded (it waits there)."""
        with self._lanes_lock:
            lanes = self._lanes[kind] = [lane for lane in self._lanes[kind] if lane.usable]
            best = min(lanes, key=Lane.load, default=None)
            if best is not None and (best.load() == 0 or len(lanes) >= self.max_lanes[kind]):
                return best
            lane = Lane(
                f"flowkit-{kind}-{next(self._serial)}",
                self.stats.part(),
                thread=True,
                stats=self.stats,
            )
            lane.owner = self
            lanes.append(lane)
            lane.start()
            return lane

    def submit(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Callable[[], Any],
        on_done: Callable[[BaseException | None, Any], None],
        *,
        read: bool = False,
        fut: asyncio.Future[Any] | None = None,
    ) -> None:
        """Run ``fn()`` on a write lane (``read``: a read lane; ``_lane`` picks which), then
        ``on_done(exc, value)`` on ``loop``. Without I/O threads (an in-memory database) both
        run now."""
        job = Job(fn, loop, on_done, fut)
        if not self.threaded:
            try:
                out: tuple[BaseException | None, Any] = (None, fn())
            except Exception as exc:
                out = (exc, None)
            job.finish(out)
            return
        kind = "read" if read and self.read_lane else "write"
        while not self._lane(kind).put(job):
            pass  # (retired or stopped meanwhile: a fresh lane takes it)
        if self.stall_timeout:
            job.timer = loop.call_later(self.stall_timeout, self._check, job)

    def _check(self, job: Job) -> None:
        """(on the job's loop) Abandon ``job`` if it has been running on its connection for
        ``stall_timeout``: its caller gets ``StoreUnavailableError`` now, its lane is retired
        and a fresh one runs what was queued behind it."""
        lane = job.lane
        assert lane is not None
        bound = self.stall_timeout
        with lane.cond:
            if job.state == DONE:
                return
            left = bound if job.state == QUEUED else job.started + bound - job.loop.time()
            if left > 0 or lane.current is not job:
                job.timer = job.loop.call_later(max(left, 0.001), self._check, job)
                return
            settled: asyncio.Future[None] = job.loop.create_future()
            job.settled = settled
            job.state = DONE  # abandoned: the thread discards what the call returns
            moved = lane.retire()
        _cancel(lane)
        with self._lanes_lock:
            kind = next((k for k, ls in self._lanes.items() if lane in ls), None)
            if kind is not None:
                self._lanes[kind].remove(lane)
            self._retired = [
                r for r in self._retired if r.thread is not None and r.thread.is_alive()
            ]
            self._retired.append(lane)
        for queued in moved:
            target = self._lane(kind or "write")
            while not target.put(queued):
                target = self._lane(kind or "write")
        log.warning(
            "a call to the flowkit database %s stalled for %.1f s: its connection is abandoned",
            self.shown_url,
            bound,
        )
        job.timer = None
        err = StoreUnavailableError(
            f"the flowkit database {self.shown_url} did not answer within {bound:g} s "
            "(stall_timeout): the call was abandoned; a write may still have committed"
        )
        err.unsettled = settled  # (the worker waits for it before it reads the run again)
        job.finish((err, None))

    def _close_lanes(self) -> None:
        """Stop every lane and close the inline lane's connection (``Database.dispose``)."""
        with self._lanes_lock:
            lanes = [lane for ls in self._lanes.values() for lane in ls] + self._retired
            self._lanes = {"read": [], "write": []}
            self._retired = []
        # (an abandoned call gets the same bound to return: closing never waits forever)
        for lane in lanes:
            lane.stop(self.stall_timeout or None)
        with self._inline.io:
            c, self._inline.conn = self._inline.conn, None
            if c is not None:
                c.close()


def _libpq_cancels_safely() -> bool:
    """libpq 17 or later (before, ``cancel_safe`` falls back to the blocking ``cancel``)."""
    try:
        from psycopg import pq

        return bool(pq.version() >= 170000)
    except Exception:  # (psycopg 2, or no psycopg at all)
        return False


def _cancel(lane: Lane) -> None:
    """Ask the server to cancel what the abandoned ``lane``'s connection is running, so a
    write waiting for a lock rolls back instead of committing later: psycopg 3's
    ``cancel_safe`` (libpq 17's cancellation, which waits with the GIL released and within a
    timeout: the older ``cancel`` holds the GIL while it connects, and would freeze the
    process on a stalled link), on a thread of its own, best effort. Without it nothing is
    sent (SQLite's busy wait gives up by itself: ``retired_here``)."""
    c = lane.conn
    cancel = getattr(c.dbapi, "cancel_safe", None) if c is not None else None
    if cancel is None or not callable(cancel) or not _libpq_cancels_safely():
        return

    def run() -> None:
        try:
            cancel(timeout=5.0)
        except Exception:  # (the server may be unreachable: the socket timeouts end it)
            log.debug("cancelling an abandoned call failed", exc_info=True)

    threading.Thread(target=run, name="flowkit-cancel", daemon=True).start()


__all__ = ["LANES", "Lanes"]
