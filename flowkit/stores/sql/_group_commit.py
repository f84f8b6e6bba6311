"""Scheduling ``SqlStore``'s write calls (``Op``, ``_ops``) from the event loop: each runs at
once, or *group-committed*: the writes that coroutines of one event loop issue together share
one transaction (run by ``_ops.Batches`` on a write lane), each keeping its own atomicity and
errors. How and why: docs/stores.md, "Transactions and group commit"."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

from ..._core.ready_queue import others_ready
from ._connection import Conn
from ._database import Database
from ._ops import After, Batches, Deferred, Op, Outcome

T = TypeVar("T")


class _Queue:
    """One event loop's writes: ``pending`` wait for the next batch; ``flying``: its batches
    (and lone calls) on the write lanes, at most ``limit`` (the database's write lanes);
    ``busy``: that many, the next batch gathers; ``scheduled``: a flush is scheduled."""

    __slots__ = ("flying", "limit", "pending", "scheduled")

    def __init__(self, limit: int) -> None:
        self.pending: list[Op[Any]] = []
        self.flying = 0
        self.limit = max(1, limit)
        self.scheduled = False

    @property
    def busy(self) -> bool:
        return self.flying >= self.limit


def _settle(fut: asyncio.Future[Any], exc: BaseException | None, value: Any) -> None:
    """Hand a lane's outcome to the caller's future (unless the caller gave up)."""
    if not fut.done():
        if exc is None:
            fut.set_result(value)
        else:
            fut.set_exception(exc)


class GroupCommit(Batches):
    """The write calls of the store objects on one ``Database``. ``enabled`` (the store's
    ``group_commit``): concurrent calls share transactions, run on the database's I/O
    threads, *pipelined* (while the loop has a batch on each write lane, the writes issued
    meanwhile gather for the next); without, every call runs at once on the caller's thread in a
    transaction of its own and never yields to the event loop (``TestEnv`` needs that)."""

    SPLIT = 16
    """With several write lanes: pending writes this many go at once while a lane is free,
    without waiting for the rest of the ready coroutines, so that batches overlap instead of
    the loop's runs moving in lockstep (the loop works on some while others' batches fly)."""

    def __init__(self, db: Database, *, enabled: bool = True) -> None:
        super().__init__(db)
        self.enabled = enabled
        # the writes of each event loop (each loop touches only its own ``_Queue``)
        self._queues: dict[asyncio.AbstractEventLoop, _Queue] = {}

    # -- the async face -----------------------------------------------------------------------
    async def read(self, fn: Callable[[Conn], T]) -> T:
        """``fn`` on a connection outside a write transaction: on a read lane (inline
        without group commit). Cancelling the caller skips it if it has not started."""
        db = self.db
        if not self.enabled:
            return db.run_read(fn)
        return await self.call(lambda: db.run_read(fn), read=True)

    async def call(self, fn: Callable[[], T], *, read: bool = True) -> T:
        """``fn()`` on an I/O thread (a read lane, or a write lane), inline without
        group commit; the caller awaits it and may be cancelled."""
        if not self.enabled:
            return fn()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self.db.submit(loop, fn, functools.partial(_settle, fut), read=read, fut=fut)
        return await fut

    async def write(self, op: Op[T]) -> T:
        """Run ``op`` in a write transaction and return its result once it is committed.
        The call joins its loop's pending batch. While other coroutines of the loop are
        ready to run, the flush is scheduled behind them (``loop.call_soon``), so every write
        they issue joins (but ``SPLIT`` pending go at once while a write lane is free); while
        the loop has a batch on every write lane, the next one gathers until one returns. A
        call nothing could join goes at once."""
        if not self.enabled:
            return self.run_write(op)
        loop = asyncio.get_running_loop()
        q = self._queue(loop)
        op.fut = loop.create_future()
        q.pending.append(op)
        if q.scheduled:
            if q.limit > 1 and len(q.pending) >= self.SPLIT and not q.busy:
                self._drain(loop, q)  # (the scheduled flush takes what comes after)
        elif not q.busy:
            if others_ready(loop):
                q.scheduled = True
                loop.call_soon(self._flush, loop, q)
            else:
                self._drain(loop, q)
        return cast(T, await op.fut)

    def _queue(self, loop: asyncio.AbstractEventLoop) -> _Queue:
        q = self._queues.get(loop)
        if q is None:
            q = self._queues[loop] = _Queue(self.db.max_lanes["write"] if self.db.threaded else 1)
        return q

    async def direct(self, fn: Callable[[], T]) -> T:
        """``fn()`` (a lone write statement, ``Database.returning_now``) on a write lane as
        a batch of its own: the loop's next writes gather behind it."""
        if not self.enabled:
            return fn()
        loop = asyncio.get_running_loop()
        q = self._queue(loop)
        fut: asyncio.Future[T] = loop.create_future()
        q.flying += 1

        def done(exc: BaseException | None, value: Any) -> None:
            _settle(fut, exc, value)
            self._next(loop, q)

        self.db.submit(loop, fn, done)
        return await fut

    def idle(self) -> bool:
        """Nothing could join a write issued now: no group commit, or no batch of this event
        loop pending, a write lane free and no other coroutine ready to run."""
        if not self.enabled:
            return True
        loop = asyncio.get_running_loop()
        q = self._queues.get(loop)
        if q is not None and (q.busy or q.scheduled or q.pending):
            return False
        return not others_ready(loop)

    def _flush(self, loop: asyncio.AbstractEventLoop, q: _Queue) -> None:
        """The scheduled flush: what is pending goes now if a write lane is free (else as
        soon as one of the loop's batches returns)."""
        q.scheduled = False
        if not q.busy:
            self._drain(loop, q)

    def _drain(self, loop: asyncio.AbstractEventLoop, q: _Queue) -> None:
        """Send what is pending as one batch (``q`` is not ``busy``)."""
        ops = [op for op in q.pending if not op.fut.cancelled()]
        q.pending = []
        if not ops:
            self._forget(loop, q)
            return
        later: list[Op[Any]] = []
        if self.db.pg and any(op.releasing for op in ops):
            # A one-statement release hands its slot over in one round trip with the other
            # single-statement calls; calls that need more round trips must not hold its
            # handover up: they commit as the next batch, right after its callers were
            # handed their results (once: a stream of releases cannot keep postponing them).
            later = [op for op in ops if op.single is None]
            if later:
                ops = [op for op in ops if op.single is not None]
        self._send(loop, q, ops, later)

    def _send(
        self, loop: asyncio.AbstractEventLoop, q: _Queue, ops: list[Op[Any]], later: list[Op[Any]]
    ) -> None:
        """``ops`` as one group commit on a write lane; then ``later`` as the next, in the
        same slot of the loop's ``limit`` (the writes issued meanwhile may go on another)."""
        q.flying += 1

        def done(exc: BaseException | None, value: Any) -> None:
            live: list[Op[Any]]
            outcomes: list[Outcome]
            if exc is not None:  # abandoned (or a bug): every call gets the error
                live, outcomes = ops, [(exc, None) for _ in ops]
            else:
                live, outcomes = value
            self._hand_out(live, outcomes)
            if later:
                q.flying -= 1
                self._send(loop, q, later, [])
            else:
                self._next(loop, q)

        self.db.submit(loop, lambda: self._run(ops), done)

    def _next(self, loop: asyncio.AbstractEventLoop, q: _Queue) -> None:
        """A batch of ``loop`` returned: the writes issued meanwhile go now, as the next."""
        q.flying -= 1
        if q.scheduled:
            return
        if q.pending:
            self._drain(loop, q)
        else:
            self._forget(loop, q)

    def _forget(self, loop: asyncio.AbstractEventLoop, q: _Queue) -> None:
        """Drop the loop's queue once nothing of it is pending, scheduled or on a lane."""
        if not (q.flying or q.pending or q.scheduled) and self._queues.get(loop) is q:
            del self._queues[loop]

    def _run(self, ops: list[Op[Any]]) -> tuple[list[Op[Any]], list[Outcome]]:
        """(on a write lane) ``ops`` as one group commit, but for the calls whose callers
        gave up before it started: the calls run and their outcomes."""
        ops = [op for op in ops if not op.fut.cancelled()]
        if not ops:
            return ops, []
        try:
            return ops, self.run_batch(ops)
        except Exception as failure:  # pragma: no cover - a bug: never leave a caller waiting
            return ops, [(failure, None)] * len(ops)

    @staticmethod
    def _hand_out(ops: list[Op[Any]], outcomes: list[Outcome]) -> None:
        # callers resume in the order their futures complete: the calls that serialize on a
        # singleton key (a release handing its slot over, an admission) first
        done = sorted(zip(ops, outcomes, strict=True), key=lambda pair: not pair[0].locks)
        for op, (exc, value) in done:
            if op.fut.done():
                continue
            if exc is None:
                op.fut.set_result(value)
            else:
                op.fut.set_exception(exc)


__all__ = ["After", "Deferred", "GroupCommit", "Op", "Outcome"]
