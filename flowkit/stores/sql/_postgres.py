"""PostgreSQL: advisory locks, the pipeline (one round trip for many statements), wake-ups by
``pg_notify``, and the connection (``PgConn``); its statements are ``_pgstatements``
(``PgStatements``, re-exported here).

Why and how: docs/stores.md, "PostgreSQL: many workers on many hosts"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._connection import RETURNING, ROWCOUNT, ROWS, Conn, log
from ._pgconnect import peer_gone
from ._pgstatements import PgStatements
from ._wakeup import CHANNEL, payload

LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended(%(k)s, 0))"
"""A transaction-scoped advisory lock on a name (a singleton key's ``lock_name``)."""

LOCK_ROWS_SQL = (
    'SELECT id FROM flowkit_runs WHERE id = ANY(%(ids)s) ORDER BY id COLLATE "C" FOR UPDATE'
)
"""Lock the rows of these runs in run-id order (the rows a batch will write): code-point
order, the order in which a group commit sends its calls, whatever the database's collation;
two orders would let two batches lock in a cycle."""

GENERIC_PLANS_SQL = "SET LOCAL plan_cache_mode = force_generic_plan"
"""The transaction's prepared statements use their generic plan at once."""

NOTIFY_SQL = "SELECT pg_notify(%(c)s, %(p)s)"


def has_pipeline(dbapi: Any) -> bool:
    """psycopg 3 on libpq >= 14."""
    if not hasattr(dbapi, "pipeline"):
        return False
    try:
        from psycopg import capabilities

        return bool(capabilities.has_pipeline())
    except ImportError:  # pragma: no cover - older psycopg
        import psycopg

        return bool(psycopg.Pipeline.is_supported())


BEGIN_SQL = "BEGIN"
"""A write transaction's first statement: what psycopg sends (the server's default isolation,
READ COMMITTED, which the store's transactions are written for)."""


class PgConn(Conn):
    """PostgreSQL: reads in autocommit, queued statements sent in one pipeline with the next
    one that returns something (or the ``COMMIT``), the wake-up with the ``COMMIT``."""

    def open(self) -> Any:
        dbapi = self.dbapi
        # psycopg 3 sends the notification in the COMMIT's round trip (a literal statement)
        self._notify_literal = hasattr(dbapi, "pgconn")
        self._notify_sql: dict[str, str] = {}
        self.can_pipeline = has_pipeline(dbapi)
        dbapi.autocommit = True  # reads: one round trip, no BEGIN/COMMIT
        if hasattr(dbapi, "prepare_threshold") and not getattr(dbapi, "flowkit_pooled", False):
            # psycopg 3: prepare a statement on its first use, not its sixth: the store runs a
            # few statements many times, and the server parses a release's slowly (not behind
            # a transaction-mode pooler: ``_pgconnect.take_pooler``)
            dbapi.prepare_threshold = 0
        return dbapi.cursor()

    def broken(self) -> bool:
        """Closed, or (psycopg 3) found dead by a peek at its socket (``peer_gone``): a call
        can then reconnect before it sent anything, which is always safe to do."""
        return Conn.broken(self) or peer_gone(self.dbapi)

    def reset(self) -> None:
        if hasattr(self.dbapi, "prepare_threshold") and not getattr(
            self.dbapi, "flowkit_pooled", False
        ):
            # (the connection goes back to SQLAlchemy's pool: its users keep psycopg's default)
            try:
                self.dbapi.prepare_threshold = 5
            except Exception:  # pragma: no cover - a broken connection
                log.debug("resetting prepare_threshold failed", exc_info=True)

    # -- statements -----------------------------------------------------------------------------
    def later(
        self, sql: str, params: Any, *, wrote: bool = True, into: list[Any] | None = None
    ) -> None:
        if not self.can_pipeline or self.committed:
            Conn.later(self, sql, params, wrote=wrote, into=into)
            return
        self._later.append((sql, params, into))
        if wrote:
            self.dirty = True

    def reads(self, stmts: Sequence[tuple[str, Any]], *, wrote: bool = False) -> list[list[Any]]:
        if not self.can_pipeline or self.committed:
            return Conn.reads(self, stmts, wrote=wrote)
        if wrote:
            self._refuse_writes()
        out = self._pipeline(stmts)
        if wrote:
            self.dirty = True
        return out

    def lock(self, name: str) -> None:
        """The advisory lock ``name`` (a hash of it) unless this transaction holds it
        already; sent with the next statement (``later``)."""
        if name in self.held:
            return
        if self.locks_closed:
            raise AssertionError(f"advisory lock {name!r} not declared in the call's Op.locks")
        self.held.add(name)
        self.later(LOCK_SQL, {"k": name}, wrote=False)

    def _send_later(self, sql: str | None = None, params: Any = None) -> list[Any] | None:
        if sql is None:
            self._pipeline(())
            return None
        return self._pipeline(((sql, params),))[0]

    def _pipeline(
        self, stmts: Sequence[tuple[str, Any]], *, commit: bool = False
    ) -> list[list[Any]]:
        """What ``later`` queued, then ``stmts`` (and the ``COMMIT`` with ``commit``) in one
        pipeline: one round trip. The rows of each of ``stmts`` (``[]`` for a statement
        without rows); ``last_rowcount`` is the last one's. After an error nothing of the
        pipeline took effect for good: the transaction is failed."""
        queued, self._later = self._later, []
        self._sends += 1
        curs: list[Any] = []
        out: list[list[Any]] = []
        try:
            with self.dbapi.pipeline():
                for q, ps, _into in queued:
                    self.sql = q
                    cur = self.dbapi.cursor()
                    cur.execute(q, ps)
                    curs.append(cur)
                mine: list[Any] = []
                for q, ps in stmts:
                    self.sql = q
                    cur = self.dbapi.cursor()
                    curs.append(cur)
                    mine.append(cur)
                    cur.execute(q, ps)
                if commit:
                    self._commit_in_pipeline(curs)
            # (leaving the block syncs once and collects every result: one round trip; a
            # ``sync()`` inside it, or ``connection.commit()``, would cost a second one)
            for (_q, _ps, into), cur in zip(queued, curs, strict=False):
                if into is not None:
                    rows = list(cur.fetchall()) if cur.description is not None else []
                    into.append((rows, int(cur.rowcount)))
            for cur in mine:
                out.append(list(cur.fetchall()) if cur.description is not None else [])
                self.last_rowcount = int(cur.rowcount)
        finally:
            for cur in curs:
                cur.close()
        n = len(queued) + len(stmts)
        self.statements += n
        self.stats["statements"] += n
        return out

    def _commit_in_pipeline(self, curs: list[Any]) -> None:
        """Queue the transaction's ``COMMIT`` as a statement of the open pipeline. After a
        failed statement the server skips the rest of the pipeline, this ``COMMIT``
        included: nothing of it takes effect. (``connection.commit()`` would sync the
        pipeline by itself, and leaving the block would then sync it again.)"""
        self.sql = "COMMIT"
        cur = self.dbapi.cursor()
        curs.append(cur)
        cur.execute("COMMIT")

    def pipeline_firsts(
        self, firsts: Sequence[tuple[str, Any, int] | None], *, commit: bool = False
    ) -> list[tuple[Any, bool]]:
        """Send the first statement of every call of a batch in one pipeline, after what
        ``later`` queued (the transaction's ``BEGIN`` and locks; with ``commit`` also its
        ``COMMIT``), and collect ``(result, wrote)`` per call. After a database error the
        rest of the pipeline did not run."""
        dbapi = self.dbapi
        stats = self.stats
        curs: list[Any] = []
        queued, self._later = self._later, []
        self._sends += 1
        extra: list[Any] = []  # (the COMMIT's cursor)
        try:
            with dbapi.pipeline():
                for q, ps, _into in queued:
                    self.sql = q
                    cur = dbapi.cursor()
                    cur.execute(q, ps)
                    curs.append(cur)
                    self.statements += 1
                    stats["statements"] += 1
                mine = len(curs)
                for f in firsts:
                    if f is None:
                        curs.append(None)
                        continue
                    self.sql = f[0]
                    cur = dbapi.cursor()
                    cur.execute(f[0], f[1])
                    curs.append(cur)
                if commit:
                    self._commit_in_pipeline(extra)
            # (leaving the block syncs once: one round trip, see ``_pipeline``)
            out: list[tuple[Any, bool]] = []
            for f, cur in zip(firsts, curs[mine:], strict=True):
                if cur is None:
                    out.append((None, False))
                elif f is not None and f[2] == ROWS:
                    out.append((list(cur.fetchall()), False))
                elif f is not None and f[2] != ROWCOUNT:
                    rows = cur.fetchall()
                    wrote = bool(rows) and f[2] == RETURNING
                    out.append((rows[0] if rows else None, wrote))
                else:
                    n = int(cur.rowcount)
                    out.append((n, n > 0))
        finally:
            for cur in [*curs, *extra]:
                if cur is not None:
                    cur.close()
        sent = sum(cur is not None for cur in curs[len(queued) :])
        self.statements += sent
        stats["statements"] += sent
        return out

    # -- transactions ---------------------------------------------------------------------------
    def begin(self) -> None:
        self.statements = 0
        self.reset_tx()
        self.stats["write_tx"] += 1
        if self.can_pipeline:
            # The connection stays in autocommit and the transaction's BEGIN is queued: it goes
            # out with the first statements, in their round trip. (Left to psycopg, BEGIN is a
            # round trip of its own, even in a pipeline, which it syncs right after BEGIN.)
            self._later.append((BEGIN_SQL, None, None))
        else:
            self.dbapi.autocommit = False  # BEGIN goes out with the first statement

    def commit(self) -> None:
        if self._later == [(BEGIN_SQL, None, None)] and not self.wakes:
            self._later.clear()  # (nothing was sent: there is no transaction to commit)
            return
        if self._later:  # the queued writes, the wake-up and COMMIT in one round trip
            stmts: list[tuple[str, Any]] = []
            if self.wakes:
                stmts.append(self._notify_stmt())
            self._pipeline(stmts, commit=True)
            self.dbapi.autocommit = True
            return
        if self.wakes:
            self._emit()
        self.sql = "COMMIT"
        self.dbapi.commit()  # a no-op when the wake-up's statement committed already
        self.dbapi.autocommit = True

    def rollback(self) -> None:
        self.reset_tx()
        try:
            if not self.broken():
                self.dbapi.rollback()
                self.dbapi.autocommit = True
        except Exception:  # the original error matters, not this one
            log.debug("rollback failed", exc_info=True)

    # -- wake-ups (``_wakeup``) -----------------------------------------------------------------
    def _notify_stmt(self) -> tuple[str, Any]:
        """The statement of the pending wake-up (delivered when its transaction commits)."""
        data = payload(self.wakes)
        self.wakes.clear()
        self.stats["wakeups"] += 1
        return NOTIFY_SQL, {"c": CHANNEL, "p": data}

    def notify_now(self) -> None:
        """Outside a transaction (after a single-statement call): the wake-up on its own,
        one more round trip (``pg_notify`` in autocommit delivers at once)."""
        self.sql, params = self._notify_stmt()
        self.statements += 1
        self.stats["statements"] += 1
        self.cur.execute(self.sql, params)

    def _emit(self) -> None:
        """The transaction's one wake-up, right before its ``COMMIT``."""
        data = payload(self.wakes)
        self.wakes.clear()
        self.stats["wakeups"] += 1
        self.statements += 1
        self.stats["statements"] += 1
        if self._notify_literal:
            # NOTIFY and COMMIT in one simple-protocol query: no extra round trip
            self.sql = self._notify_commit_sql(data)
            self.cur.execute(self.sql, prepare=False)
        else:  # psycopg2
            self.sql = NOTIFY_SQL
            self.cur.execute(self.sql, {"c": CHANNEL, "p": data})

    def _notify_commit_sql(self, data: str) -> str:
        """``SELECT pg_notify(<channel>, <data>); COMMIT`` with literals quoted by psycopg."""
        sql = self._notify_sql.get(data)
        if sql is None:
            from psycopg import sql as pgsql

            sql = (
                pgsql.SQL("SELECT pg_notify({}, {}); COMMIT")
                .format(pgsql.Literal(CHANNEL), pgsql.Literal(data))
                .as_string(self.dbapi)
            )
            if len(self._notify_sql) < 256:
                self._notify_sql[data] = sql
        return sql


__all__ = [
    "GENERIC_PLANS_SQL",
    "LOCK_ROWS_SQL",
    "LOCK_SQL",
    "PgConn",
    "PgStatements",
    "has_pipeline",
]
