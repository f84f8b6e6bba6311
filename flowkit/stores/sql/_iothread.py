"""The store's I/O threads: a ``Lane`` is one thread with its own connection that runs the
store's synchronous database work (``Job``) one at a time, so the event loop never waits for
the database; a caller awaits the outcome. A job that stays stuck on its connection past the
store's ``stall_timeout`` is abandoned: its callers get ``StoreUnavailableError``, the lane is
retired (its connection is invalidated once the stuck call returns, never reused) and a fresh
lane takes the jobs that were queued behind it. How and why: docs/stores.md, "How calls run"."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ._connection import log

if TYPE_CHECKING:
    from ._connection import Conn

Outcome = tuple[BaseException | None, Any]

QUEUED, STARTED, DONE = 0, 1, 2

IDLE_EXIT = 60.0
"""Seconds without a job after which a lane's thread closes its connection and exits (a
store nobody closes leaves no thread behind; the next call starts a fresh lane)."""


class Stats(Mapping[str, int]):
    """``Database.stats``: the counters of every lane (each thread counts into its own
    ``Counter``, so no increment is lost between threads), read as one live mapping."""

    def __init__(self) -> None:
        self._parts: list[collections.Counter[str]] = [collections.Counter()]  # [0]: folded
        self._lock = threading.Lock()

    def fold(self, part: collections.Counter[str]) -> None:
        """A lane's thread has exited: its counts join the totals' base (the list of parts
        does not grow with every lane a long-lived store starts and retires)."""
        with self._lock:
            if any(p is part for p in self._parts[1:]):
                self._parts = [p for p in self._parts if p is not part]
                self._parts[0] = self._parts[0] + part

    def part(self) -> collections.Counter[str]:
        """A new counter of one lane, included in the totals from now on."""
        c: collections.Counter[str] = collections.Counter()
        with self._lock:
            self._parts.append(c)
        return c

    def copy(self) -> collections.Counter[str]:
        out: collections.Counter[str] = collections.Counter()
        with self._lock:
            parts = list(self._parts)
        for p in parts:
            out.update(dict(p))
        return out

    def __getitem__(self, key: str) -> int:
        with self._lock:
            parts = list(self._parts)
        return sum(p.get(key, 0) for p in parts)

    def __iter__(self) -> Iterator[str]:
        return iter(self.copy())

    def __len__(self) -> int:
        return len(self.copy())

    def __sub__(self, other: Mapping[str, int]) -> collections.Counter[str]:
        return self.copy() - collections.Counter(other)

    def clear(self) -> None:
        with self._lock:
            for p in self._parts:
                p.clear()


class Job:
    """One piece of synchronous database work for a lane, submitted from an event loop:
    ``fn()`` runs on the lane's thread, then ``on_done(exc, value)`` on ``loop``. ``fut``: the
    caller's future, when a cancelled caller means the job need not run at all."""

    __slots__ = ("fn", "fut", "lane", "loop", "on_done", "settled", "started", "state", "timer")

    def __init__(
        self,
        fn: Callable[[], Any],
        loop: asyncio.AbstractEventLoop,
        on_done: Callable[[BaseException | None, Any], None],
        fut: asyncio.Future[Any] | None = None,
    ) -> None:
        self.fn = fn
        self.loop = loop
        self.on_done = on_done
        self.fut = fut
        self.lane: Lane | None = None
        self.state = QUEUED
        self.started = 0.0  # loop.time() when it started on the lane's thread
        self.timer: asyncio.TimerHandle | None = None
        # (an abandoned job) resolved on ``loop`` once its call has really returned: until
        # then a write of it may still commit (``StoreUnavailableError.unsettled``)
        self.settled: asyncio.Future[None] | None = None

    def finish(self, out: Outcome) -> None:
        """On the loop: hand the outcome over (once)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        on_done, self.on_done = self.on_done, _spent
        on_done(out[0], out[1])


def _spent(_exc: BaseException | None, _value: Any) -> None:
    pass


class Lane:
    """One I/O thread and the connection it owns (``conn``; ``io`` is its lock, taken only by
    that thread). Jobs run in submission order. ``retired``: abandoned with a stuck job; the
    thread closes its connection for good and exits once that job returns."""

    def __init__(
        self,
        name: str,
        counts: collections.Counter[str],
        *,
        thread: bool,
        stats: Stats | None = None,
    ) -> None:
        self.name = name
        self.stats = stats  # (``counts`` is folded into it when the thread exits)
        self.conn: Conn | None = None
        self.io = threading.RLock()
        self.counts = counts
        self.jobs: collections.deque[Job] = collections.deque()
        self.cond = threading.Condition(threading.Lock())
        self.retired = False
        self.stopping = False
        self.current: Job | None = None
        self.thread: threading.Thread | None = None
        self.owner: object | None = None  # the ``Database`` whose calls it runs
        if thread:
            self.thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        assert self.thread is not None
        self.thread.start()

    def load(self) -> int:
        """The jobs queued or running on this lane."""
        with self.cond:
            return len(self.jobs) + (self.current is not None)

    @property
    def usable(self) -> bool:
        """Still taking jobs (not retired, stopped or exited for idleness)."""
        return not (self.retired or self.stopping)

    def put(self, job: Job) -> bool:
        """Queue ``job``; ``False`` when this lane was retired or stopped meanwhile."""
        with self.cond:
            if self.retired or self.stopping:
                return False
            job.lane = self
            self.jobs.append(job)
            self.cond.notify()
        return True

    def retire(self) -> list[Job]:
        """(under ``cond``) Give this lane up: the jobs not started yet, for another lane."""
        self.retired = True
        moved = list(self.jobs)
        self.jobs.clear()
        self.cond.notify_all()
        return moved

    def stop(self, timeout: float | None) -> None:
        """Let the thread finish its queued jobs and close its connection; wait for it (at
        most ``timeout`` seconds: a stuck call is left to the thread)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        t = self.thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout)

    def _main(self) -> None:
        _here.lane = self  # (``current_lane``: this thread's connection is this lane's)
        try:
            while True:
                with self.cond:
                    while not self.jobs and not (self.stopping or self.retired):
                        if not self.cond.wait(IDLE_EXIT) and not self.jobs:
                            self.stopping = True  # idle: a fresh lane serves the next call
                    if self.retired or not self.jobs:
                        break
                    job = self.jobs.popleft()
                    fut = job.fut
                    if fut is not None and fut.cancelled():  # its caller gave up: skip it
                        job.state = DONE
                        _post(job, (None, None))
                        continue
                    job.state = STARTED
                    job.started = job.loop.time()
                    self.current = job
                try:
                    out: Outcome = (None, job.fn())
                except BaseException as exc:  # (handed to the caller, whatever it is)
                    out = (exc, None)
                with self.cond:
                    self.current = None
                    abandoned = job.state == DONE
                    job.state = DONE
                    retired = self.retired
                if not abandoned:
                    _post(job, out)
                elif job.settled is not None:
                    _resolve(job)
                if retired:
                    break
        finally:
            self._close()
            if self.stats is not None:
                self.stats.fold(self.counts)

    def _close(self) -> None:
        c, self.conn = self.conn, None
        if c is None:
            return
        if self.retired:
            c.discard()  # (it may be stuck in any state: never back to the pool)
        else:
            c.close()


_here = threading.local()


def current_lane() -> Lane | None:
    """The lane the calling thread serves (``None``: not an I/O thread)."""
    lane: Lane | None = getattr(_here, "lane", None)
    return lane


def retired_here() -> bool:
    """Whether the calling thread is a lane that was retired (its call abandoned): a wait it
    is in (SQLite's busy loop) should give up rather than write late."""
    lane = current_lane()
    return lane is not None and lane.retired


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _resolve(job: Job) -> None:
    """From a lane's thread: the abandoned ``job``'s call has returned (``Job.settled``)."""
    assert job.settled is not None
    with contextlib.suppress(RuntimeError):  # (the loop is closed: nobody waits any more)
        job.loop.call_soon_threadsafe(_settle, job.settled)


def _post(job: Job, out: Outcome) -> None:
    """From a lane's thread: ``job.finish(out)`` on its event loop."""
    try:
        job.loop.call_soon_threadsafe(job.finish, out)
    except RuntimeError:  # the loop is closed: nobody waits any more
        log.debug("a store call finished after its event loop closed")


__all__ = [
    "DONE",
    "QUEUED",
    "STARTED",
    "Job",
    "Lane",
    "Outcome",
    "Stats",
    "current_lane",
    "retired_here",
]
