"""A write call (``Op``) and how one runs in a transaction, synchronously on the thread of its
lane (``Batches``): alone, as one statement in autocommit, or with others in one shared
transaction, each keeping its own atomicity and errors. Apart from the async scheduling
(``_group_commit``), which decides what goes together. How and why: docs/stores.md,
"Transactions and group commit"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar, cast

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


class Batches:
    """The synchronous side of the write calls of the store objects on one ``Database``: a
    call in a transaction of its own (``run_write``) or a batch of calls in one
    (``run_batch``), on the current thread's connection. ``GroupCommit`` adds the async face."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @property
    def stats(self) -> Any:
        """The current thread's counters (``Database.counts``)."""
        return self.db.counts

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


__all__ = ["After", "Batches", "Deferred", "Op", "Outcome"]
