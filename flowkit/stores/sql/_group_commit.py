"""Running ``SqlStore``'s write calls (``Op``): alone in a transaction (or as one statement in
autocommit), or *group-committed*: the writes that coroutines of one event loop issue together
share one transaction, each keeping its own atomicity and errors. How and why: docs/stores.md,
"Transactions and group commit"."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, cast

from ..._eager import others_ready
from ._connection import Conn
from ._database import Database
from ._postgres import GENERIC_PLANS_SQL, LOCK_ROWS_SQL

T = TypeVar("T")


class Op(Generic[T]):
    """One write call: ``rest(conn, result of first)`` in a write transaction.

    ``first``: an optional single statement ``(sql, params, RETURNING|ROWCOUNT|SELECT|ROWS)``
    run before ``rest`` (a PostgreSQL group commit sends its calls' first statements in one
    pipeline). ``key`` (the run id) orders a batch. ``locks``: the advisory locks (a singleton
    key's ``lock_name``) its transaction takes before any row lock, all calls' in name order.

    ``single(result of first)``: the call is complete once ``first`` ran (``rest`` only reads
    and decides), so alone it may run ``first`` in autocommit, one round trip; when ``single``
    says no, ``first`` changed nothing and the call runs again in a transaction. ``lite``: so
    on SQLite too, for a call whose ``rest`` emits no wake-up. A ``rest`` that runs after its
    statement committed must not write; what it must write then, it does in an ``After``."""

    __slots__ = ("first", "fut", "key", "lite", "locks", "rest", "single")

    def __init__(
        self,
        rest: Callable[[Conn, Any], T],
        first: tuple[str, Any, int] | None = None,
        key: str = "",
        *,
        single: Callable[[Any], bool] | None = None,
        locks: tuple[str, ...] = (),
        lite: bool = False,
    ) -> None:
        self.rest = rest
        self.first = first
        self.key = key
        self.locks = locks
        self.single = single if first is not None else None
        # (a call that needs advisory locks needs a transaction around its statements)
        self.lite = lite and self.single is not None and not locks
        self.fut: Any = None

    @property
    def releasing(self) -> bool:
        """A single statement under a key's advisory lock (``PgStatements.release_fast``): it
        locks a waiter's row too, without waiting, in the middle of its batch."""
        return self.single is not None and bool(self.locks)

    def __call__(self, c: Conn) -> T:
        """Run on ``c`` (inside a transaction)."""
        f = self.first
        if f is None:
            return self.rest(c, None)
        return self.rest(c, c.first(f))


class Deferred(Exception):
    """Raised (before writing) by a call of a PostgreSQL group commit that must take row
    locks out of the batch's run-id order: it runs again in a transaction of its own after the
    batch commits, so two processes' batches never wait for each other's rows in a cycle."""


class _Unclean(Exception):
    """A call of a batch failed after it wrote (or with a database error): the batch's
    transaction cannot be committed as it is."""


Outcome = tuple[BaseException | None, Any]


class After(Generic[T]):
    """A call's result that needs what its queued statements returned (``Conn.later(...,
    into=...)``): ``finish()`` builds it once the transaction committed."""

    __slots__ = ("finish",)

    def __init__(self, finish: Callable[[], T]) -> None:
        self.finish = finish


def _finish(outcome: Outcome) -> Outcome:
    exc, value = outcome
    if exc is None and isinstance(value, After):
        try:
            return None, value.finish()
        except Exception as err:  # (after the COMMIT: this call's alone)
            return err, None
    return outcome


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


class GroupCommit:
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
        self.db = db
        self.enabled = enabled
        # the writes of each event loop (each loop touches only its own ``_Queue``)
        self._queues: dict[asyncio.AbstractEventLoop, _Queue] = {}

    @property
    def stats(self) -> Any:
        """The current thread's counters (``Database.counts``)."""
        return self.db.counts

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

        def done(exc: BaseException | None, value: Any) -> None:
            if not fut.done():
                if exc is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(exc)

        self.db.submit(loop, fn, done, read=read, fut=fut)
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
            if not fut.done():
                if exc is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(exc)
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

    # -- one call alone -----------------------------------------------------------------------
    def run_write(self, fn: Callable[[Conn], T], *, single: bool = True) -> T:
        """``fn`` in a write transaction of its own (a single statement in autocommit, when
        ``fn`` is an ``Op`` that allows it: on PostgreSQL, and with ``Op.lite`` on SQLite;
        ``single=False``: the general way, after ``Op.single`` said no). A result that is
        ``After`` is finished once the transaction committed."""
        db = self.db
        if single and isinstance(fn, Op) and fn.single is not None:
            if fn.locks:
                got = None
                if db.pg:  # BEGIN, the locks, the statement and COMMIT: one round trip
                    with db.io:
                        c = db.connection()
                        if c.can_pipeline and not c.broken():
                            got = self._single_batch(c, [fn])
                        if got is not None:
                            exc, value = got[0]
                            if exc is not None:
                                raise exc
                            return cast(T, value)
            elif db.pg or fn.lite:
                done, out = self._run_single(fn)
                if done:
                    return cast(T, out)
        with db.io:
            for attempt in db.attempts():
                c = db.connection()
                try:
                    c.begin()
                    c.dirty = False
                    if isinstance(fn, Op):
                        c.lock_all(fn.locks)
                    out = fn(c)
                    c.commit()
                    self.stats["ops"] += 1
                except BaseException as exc:
                    c.rollback()
                    if not isinstance(exc, Exception):
                        raise
                    if db.retryable(c, exc, attempt):
                        continue
                    raise db.failed(c, exc) from exc
                return cast(T, out.finish() if isinstance(out, After) else out)
        raise AssertionError("unreachable")  # pragma: no cover

    def _run_single(self, op: Op[T]) -> tuple[bool, T | None]:
        """``op.first`` alone in autocommit, a transaction of one statement and one round
        trip: ``(True, result)`` when ``op.single`` accepts its result; ``(False, None)`` when
        not (the statement changed nothing). A statement the server refused because it had
        ended the session is sent again, once; any other failure may have committed."""
        assert op.first is not None and op.single is not None
        db = self.db
        with db.io:
            for attempt in db.attempts():
                c = db.connection()
                if c.broken():  # known before anything was sent: safe to replace
                    db.drop(c)
                    c = db.connection()
                c.statements = 0
                try:
                    got = c.first(op.first)
                except Exception as exc:
                    if db.terminated(c, exc, attempt):
                        continue
                    raise db.failed(c, exc) from exc
                if not op.single(got):
                    return False, None
                self.stats["write_tx"] += 1
                self.stats["single"] += 1
                c.wakes.clear()
                c.committed = True
                try:
                    out = op.rest(c, got)
                finally:
                    c.committed = False
                self.stats["ops"] += 1
                if c.wakes and not db.pg:  # pragma: no cover - a bug (see Op.lite)
                    raise AssertionError("a call run in autocommit on SQLite asked to wake")
                db.notify_after(c)
                return True, out
        raise AssertionError("unreachable")  # pragma: no cover

    def _solo(self, fn: Callable[[Conn], Any], *, single: bool = True) -> Outcome:
        try:
            return None, self.run_write(fn, single=single)
        except Exception as exc:
            return exc, None

    # -- a batch ------------------------------------------------------------------------------
    def run_batch(self, ops: Sequence[Op[Any]]) -> list[Outcome]:
        """Run the calls of one group commit in one transaction: first the advisory locks
        they declare (in name order), then (PostgreSQL) their first statements in run-id
        order. A call that fails clean keeps its exception and the batch goes on; one that
        fails after writing rolls the batch back, and every call runs again on its own. A
        failing ``COMMIT`` fails every call. A ``Deferred`` call runs on its own after."""
        out: list[Outcome | None] = [None] * len(ops)
        shared = list(range(len(ops)))
        solo: list[int] = []
        if self.db.pg:
            shared.sort(key=lambda i: ops[i].key)
        if len(shared) == 1:
            solo.insert(0, shared.pop())
        if shared:
            self.stats["batches"] += 1
            self.stats["batched_ops"] += len(shared)
            with self.db.io:
                res = self._shared([ops[i] for i in shared])
            if res is None:  # unclean: one transaction per call
                self.stats["batch_retries"] += 1
                solo = shared + solo
            else:
                for i, r in zip(shared, res, strict=True):
                    if isinstance(r[0], Deferred):
                        self.stats["deferred"] += 1
                        solo.append(i)
                    else:
                        out[i] = r
        for i in solo:
            out[i] = self._solo(ops[i])
        return [o if o is not None else (AssertionError("lost outcome"), None) for o in out]

    def _shared(self, ops: list[Op[Any]]) -> list[Outcome] | None:
        db = self.db
        if db.pg and len(ops) >= 2 and all(op.single is not None for op in ops):
            c = db.connection()
            if c.can_pipeline and not c.broken():
                done = self._single_batch(c, ops)
                if done is not None:
                    return done
        for attempt in db.attempts():
            c = db.connection()
            res: list[Outcome] = []
            try:
                c.begin()
                # every call's advisory locks before any row lock (sent with the first
                # statements)
                c.lock_all(name for op in ops for name in op.locks)
                firsts = None
                if c.can_pipeline and len(ops) >= 2:  # (one round trip for all: one less at 2)
                    try:
                        firsts = c.pipeline_firsts([op.first for op in ops])
                        c.pipelined = True
                    except db.dbapi_error as exc:
                        if c.statements or not c.broken():
                            raise _Unclean from exc
                        raise  # a broken connection before anything ran: retried below
                for k, op in enumerate(ops):
                    c.dirty = False
                    mark = c.mark()
                    try:
                        if firsts is None:
                            got = op(c)
                        else:
                            c.dirty = firsts[k][1]
                            got = op.rest(c, firsts[k][0])
                        res.append((None, got))
                    except Exception as exc:
                        # (a database error, even one of an earlier call's queued statement
                        # sent with this call's: the transaction is failed)
                        if c.dirty or isinstance(exc, db.dbapi_error):
                            raise _Unclean from exc
                        c.drop_later(mark)
                        res.append((exc, None))
                c.pipelined = False
                self._commit_batch(c)
                self.stats["ops"] += len(ops)
                return [_finish(r) for r in res]
            except _Unclean:
                c.pipelined = False
                c.rollback()
                return None
            except BaseException as exc:
                c.pipelined = False
                c.rollback()
                if not isinstance(exc, Exception):
                    raise
                if db.retryable(c, exc, attempt):
                    continue
                err = db.failed(c, exc)
                return [(err, None)] * len(ops)
        raise AssertionError("unreachable")  # pragma: no cover

    def _commit_batch(self, c: Conn) -> None:
        """The ``COMMIT`` of a group commit, with the statements its calls queued (PostgreSQL:
        one round trip). When it fails and the server is still there, nothing took effect
        (a failed statement aborts the rest of the pipeline): ``_Unclean``, each call runs
        again on its own. When the connection broke, the ``COMMIT`` may have taken effect:
        the error is every call's."""
        if not c.flushes_later():
            c.commit()
            return
        try:
            c.commit()
        except self.db.dbapi_error as exc:
            if not c.broken() or self.db.terminated(c, exc):
                raise _Unclean from exc
            raise

    def _single_batch(self, c: Conn, ops: list[Op[Any]]) -> list[Outcome] | None:
        """PostgreSQL, a batch of single-statement calls: ``BEGIN``, the calls' locks (in
        name order), every call's statement and ``COMMIT`` in one pipeline, one round trip. A
        call whose result ``single`` rejects changed nothing: it runs again on its own.
        ``None`` when the pipeline failed and nothing was committed: the caller runs the
        batch the general way, which sorts out whose error it was."""
        db = self.db
        c.begin()
        if any(op.releasing for op in ops):
            # a one-statement release: planned once, not at each of its first executions
            c.later(GENERIC_PLANS_SQL, None, wrote=False)
        c.lock_all(name for op in ops for name in op.locks)
        if len(ops) > 1 and any(op.releasing for op in ops):
            # A release locks its waiter's row mid-batch (without waiting): so that no later
            # statement of the batch waits for a row while it holds that one (a lock cycle
            # with another process), every row the batch writes is locked first, in order.
            ids = sorted({op.key for op in ops if op.key})
            c.later(LOCK_ROWS_SQL, {"ids": ids}, wrote=False)
        try:
            firsts = c.pipeline_firsts([op.first for op in ops], commit=True)
        except Exception as exc:
            c.rollback()
            if not isinstance(exc, db.dbapi_error):
                raise
            if not c.broken():
                return None  # the server rolled the failed transaction back: nothing applied
            if db.terminated(c, exc):
                return None  # the session ended before the pipeline was read
            # the connection broke with the COMMIT on its way: it may have been applied, so
            # running the calls again could apply them twice; each fails like a failed COMMIT
            db.drop(c)
            err = db.wrap(c, exc)
            return [(err, None)] * len(ops)
        c.dbapi.autocommit = True
        out: list[Outcome] = []
        again: list[int] = []
        c.wakes.clear()
        c.committed = True
        try:
            for k, op in enumerate(ops):
                got = firsts[k][0]
                assert op.single is not None
                if not op.single(got):
                    again.append(k)
                    out.append((None, None))
                    continue
                try:
                    out.append((None, op.rest(c, got)))
                except Exception as exc:  # (a rest that raises after its statement committed)
                    out.append((exc, None))
        finally:
            c.committed = False
        self.stats["ops"] += len(ops) - len(again)
        self.stats["single_batches"] += 1
        db.notify_after(c)
        out = [_finish(o) for o in out]
        for k in again:
            out[k] = self._solo(ops[k], single=False)
        return out


__all__ = ["After", "Deferred", "GroupCommit", "Op", "Outcome"]
