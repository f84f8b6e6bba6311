"""``Conn``: the store's own DBAPI connection, on which every call of ``SqlStore`` runs.

Statements go straight to the driver (``sqlite3`` or psycopg), without SQLAlchemy's
compilation. ``_sqlite.SqliteConn`` and ``_postgres.PgConn`` add each database's transactions,
wake-ups and (PostgreSQL) pipelining."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Sequence
from typing import Any

log = logging.getLogger("flowkit")

RETURNING = 1  # Op.first's kind: a single-row write with RETURNING (the row, or None)
ROWCOUNT = 2  # a write without RETURNING (the number of rows it changed)
SELECT = 3  # a read (the first row, or None), e.g. a row lock
ROWS = 4  # a read of all its rows (a list), e.g. a row lock together with related rows

Later = tuple[str, Any, "list[Any] | None"]


class Conn:
    """The store's own DBAPI connection (a pooled one, kept checked out), used under the
    ``Database``'s lock. ``dirty`` records whether the current call wrote anything: a call of
    a group commit that fails *clean* (it raised before writing) leaves the batch usable."""

    can_pipeline = False  # (PostgreSQL) a batch's statements go out in one round trip

    def __init__(self, fairy: Any, stats: Any) -> None:
        self.fairy = fairy  # SQLAlchemy's pooled connection
        self.dbapi: Any = fairy.driver_connection
        self.stats = stats  # the database's counters
        self.dirty = False
        # the first statements of a batch's calls ran ahead in one pipeline (PostgreSQL): a
        # row lock a call's rest takes now would come out of the batch's run-id order
        self.pipelined = False
        self.sql = ""  # the last statement, for error messages
        self.statements = 0  # executed in the current transaction (or read)
        # namespaces of the runs the current transaction left claimable now (or whose
        # waiters it woke): one wake-up goes out with its COMMIT (``_wakeup``)
        self.wakes: set[str | None] = set()
        # statements whose results nobody reads (``later``), sent together with the next
        # statement that needs a result, or with the COMMIT (PostgreSQL)
        self._later: list[Later] = []
        self._sends = 0  # times the queue was sent (``mark``)
        self.last_rowcount = 0
        # the rest of a single-statement call runs after its statement committed: it must
        # not write (``_refuse_writes`` guards every write)
        self.committed = False
        # the advisory locks the current transaction holds (or has queued); once its calls'
        # declared locks are taken (``Op.locks``), no other may be: it would come after a
        # row lock, out of the order every transaction keeps
        self.held: set[str] = set()
        self.locks_closed = False
        self.cur: Any = self.open()

    # -- the dialect's part -------------------------------------------------------------------
    def open(self) -> Any:
        """Set the connection up for the store; its cursor."""
        return self.dbapi.cursor()

    def reset(self) -> None:
        """Give the connection back the settings the pool's other users expect."""

    def begin(self) -> None:
        raise NotImplementedError

    def commit(self) -> None:
        raise NotImplementedError

    def rollback(self) -> None:
        raise NotImplementedError

    def lock(self, name: str) -> None:
        """Take the transaction-scoped advisory lock ``name`` (PostgreSQL; SQLite's
        ``BEGIN IMMEDIATE`` holds the whole database already)."""

    def notify_now(self) -> None:
        """Outside a transaction: the wake-up of single-statement calls (PostgreSQL)."""
        raise AssertionError("a wake-up outside a transaction")  # pragma: no cover

    def _send_later(self, sql: str | None = None, params: Any = None) -> list[Any] | None:
        """Send the queued statements (and ``sql``, whose rows are returned) at once."""
        raise AssertionError("nothing is queued on this connection")  # pragma: no cover

    def pipeline_firsts(
        self, firsts: Sequence[tuple[str, Any, int] | None], *, commit: bool = False
    ) -> list[tuple[Any, bool]]:
        """(PostgreSQL) the first statements of a batch's calls in one round trip."""
        raise AssertionError("no pipeline on this connection")  # pragma: no cover

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        self.reset()
        with contextlib.suppress(Exception):  # closing a broken connection
            self.cur.close()
        with contextlib.suppress(Exception):
            if self.broken():
                self.fairy.invalidate()
            else:
                self.fairy.close()

    def discard(self) -> None:
        """Close for good, never back to the pool (an abandoned connection: its state is
        unknown)."""
        with contextlib.suppress(Exception):
            self.cur.close()
        with contextlib.suppress(Exception):
            self.fairy.invalidate()

    def broken(self) -> bool:
        c = self.dbapi
        return bool(getattr(c, "closed", False) or getattr(c, "broken", False))

    def reset_tx(self) -> None:
        """Forget the state of the last transaction (``begin``, ``rollback``)."""
        self.wakes.clear()
        self._later.clear()
        self.held.clear()
        self.locks_closed = False

    # -- statements -----------------------------------------------------------------------------
    def later(
        self, sql: str, params: Any, *, wrote: bool = True, into: list[Any] | None = None
    ) -> None:
        """A statement inside a transaction whose result the caller does not need now (a lock
        that blocks until granted, an ``UPDATE`` or ``INSERT`` that must simply happen). On
        PostgreSQL it is sent together with the next statement that returns something (or
        with the ``COMMIT``), saving a round trip; elsewhere it runs at once. ``into``
        receives ``(rows, rowcount)`` once it has run: a caller can read it after the
        ``COMMIT`` (``After``)."""
        if into is None:
            self.write(sql, params)  # (refused after a single statement committed)
        else:
            if wrote:
                self._refuse_writes()
            into.append(self._rows(sql, params))

    def _rows(self, sql: str, params: Any) -> tuple[list[Any], int]:
        """A statement at once: its rows (a read, or a write's ``RETURNING``) and rowcount."""
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        rows = list(cur.fetchall()) if cur.description is not None else []
        n = int(cur.rowcount)
        if n > 0:
            self.dirty = True
        return rows, n

    def reads(self, stmts: Sequence[tuple[str, Any]], *, wrote: bool = False) -> list[list[Any]]:
        """The rows of several statements, run in order (PostgreSQL: in one round trip with
        what ``later`` queued). ``wrote``: some of them write."""
        if wrote:
            self._refuse_writes()
        return [self.all(q, ps) for q, ps in stmts]

    def flushes_later(self) -> bool:
        """Whether statements are queued (``later``)."""
        return bool(self._later)

    def mark(self) -> tuple[int, int]:
        """Where the queue (``later``) stands: ``drop_later`` forgets what came after."""
        return self._sends, len(self._later)

    def drop_later(self, mark: tuple[int, int]) -> None:
        """Forget what ``later`` queued since ``mark``: the call that queued it failed clean
        (nothing it queued wrote). Once the queue was sent, what is left is the call's own."""
        if mark[0] != self._sends:
            self._later.clear()
        else:
            del self._later[mark[1] :]

    def one(self, sql: str, params: Any) -> Any:
        if self._later:
            got = self._send_later(sql, params)
            return got[0] if got else None
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        rows = cur.fetchall()  # to the end: sqlite3 keeps a read open until a statement is done
        return rows[0] if rows else None

    def all(self, sql: str, params: Any) -> list[Any]:
        if self._later:
            return self._send_later(sql, params) or []
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        return list(cur.fetchall())

    def write(self, sql: str, params: Any) -> int:
        """A write without ``RETURNING``: the number of rows it changed."""
        self._refuse_writes()
        if self._later:
            self._send_later(sql, params)
            n = self.last_rowcount
            if n:
                self.dirty = True
            return n
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        n = int(cur.rowcount)
        if n:
            self.dirty = True
        return n

    def returning(self, sql: str, params: Any) -> Any:
        """A single-row write with ``RETURNING``: the row, or ``None`` when none matched."""
        self._refuse_writes()
        if self._later:
            got = self._send_later(sql, params)
            if got:
                self.dirty = True
                return got[0]
            return None
        self.sql = sql
        cur = self.cur
        cur.execute(sql, params)
        self.statements += 1
        self.stats["statements"] += 1
        rows = cur.fetchall()
        if rows:
            self.dirty = True
            return rows[0]
        return None

    def _refuse_writes(self) -> None:
        if self.committed:
            raise AssertionError("a write after a single-statement call committed")

    def lock_all(self, names: Iterable[str]) -> None:
        """``lock`` each of ``names`` in name order (the one order every transaction uses),
        then refuse any other lock for the rest of the transaction."""
        for name in sorted(set(names)):
            self.lock(name)
        self.locks_closed = True

    def first(self, f: tuple[str, Any, int]) -> Any:
        """Run an ``Op``'s first statement: the row (``RETURNING``, ``SELECT``) or rowcount."""
        if f[2] == RETURNING:
            return self.returning(f[0], f[1])
        if f[2] == SELECT:
            return self.one(f[0], f[1])
        if f[2] == ROWS:
            return self.all(f[0], f[1])
        return self.write(f[0], f[1])

    def wakeup(self, namespace: str | None) -> None:
        """The current transaction leaves a run of ``namespace`` claimable now (or stamped a
        waiter awake): emit a wake-up when it commits (once per transaction)."""
        self.wakes.add(namespace)


__all__ = ["RETURNING", "ROWCOUNT", "ROWS", "SELECT", "Conn"]
