"""SQLite: WAL mode, ``BEGIN IMMEDIATE``, the store's own wait for another process's write lock
(``WaitingCursor``), its connection (``SqliteConn``) and its statements (``SqliteStatements``).

Why and how: docs/stores.md, "SQLite: the embedded default"."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ..._core.run import ADMITTED_TAG, SINGLETON_TAG_PREFIX
from ..base import Update
from ._connection import Conn, log
from ._iothread import retired_here
from ._rows import dumps
from ._schema import WAITING_SQL
from ._statements import ACTIVE, HANDABLE, Statements, common_release, leased
from ._wakeup import SQLITE_EMIT

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for another process' write lock before failing (by default:
``sqlite:///path?busy_timeout=<ms>`` sets it per store)."""

BUSY_TIMEOUT_PARAM = "busy_timeout"
"""The URL query parameter of the busy timeout in milliseconds."""

READ_ONLY = "flowkit_read_only"
"""The execution option of a SQLAlchemy connection that only reads (a deferred ``BEGIN``)."""

_SQLITE_BUSY = 5
_SQLITE_BUSY_SNAPSHOT = 517  # (extended) a snapshot too old to write from: waiting cannot help
_BUSY_PAUSE_FIRST = 50e-6
_BUSY_PAUSE_MAX = 1e-3
_sleep = time.sleep  # (tests replace it to see the pauses without sleeping)


def _enable_wal(cur: Any) -> None:
    """Put the database file in WAL mode (persistent: once one connection did, the others
    find it so). When several connections open a fresh file at once, SQLite refuses all but
    one switch at once ("database is locked", without waiting): try again after a pause, for
    about the busy timeout."""
    pause, waited = 0.005, 0.0
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
                return
            cur.execute("PRAGMA journal_mode = WAL").fetchall()
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if waited >= SQLITE_BUSY_TIMEOUT_MS / 1000:
                raise
        time.sleep(pause)  # (connecting blocks anyway; no engine clock is involved)
        waited += pause
        pause = min(pause * 2, 0.1)


def _busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked": another connection holds the lock
    (not another ``SQLITE_BUSY``, such as a ``COMMIT`` refused while statements run)."""
    code = getattr(exc, "sqlite_errorcode", _SQLITE_BUSY)
    return bool(
        code & 0xFF == _SQLITE_BUSY
        and code != _SQLITE_BUSY_SNAPSHOT
        and "database is locked" in str(exc)
    )


class WaitingCursor(sqlite3.Cursor):
    """The cursor of the store's own SQLite connection, which has no busy timeout: a
    statement that finds another process holding the write lock is tried again here, after
    50 µs at first, then at most every millisecond, for up to ``SQLITE_BUSY_TIMEOUT_MS`` (finer
    than SQLite's own busy handler). Only what SQLite allows to be retried is: a statement
    outside a transaction (``BEGIN IMMEDIATE``, an autocommit write), or ``COMMIT``."""

    busy_ms: float | None = None  # this connection's busy timeout (None: the default)

    def execute(self, sql: str, parameters: Any = (), /) -> WaitingCursor:
        inside = self.connection.in_transaction  # (before: a failure may end the transaction)
        try:
            super().execute(sql, parameters)
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or (inside and sql != "COMMIT"):
                raise
            self._wait(sql, parameters, exc)
        return self

    def _wait(self, sql: str, parameters: Any, exc: sqlite3.OperationalError) -> None:
        # (the store's I/O blocks its event loop anyway; no engine clock is involved: the
        # pauses are summed, as SQLite's own handler does, so a wait lasts at least that long)
        pause, waited = _BUSY_PAUSE_FIRST, 0.0
        limit = (SQLITE_BUSY_TIMEOUT_MS if self.busy_ms is None else self.busy_ms) / 1000
        while waited < limit and not retired_here():  # (abandoned: give up, nothing written)
            _sleep(pause)
            waited += pause
            pause = min(pause * 2, _BUSY_PAUSE_MAX)
            try:
                super().execute(sql, parameters)
                return
            except sqlite3.OperationalError as again:
                if not _busy(again):
                    raise
                exc = again
        raise exc


def busy_timeout_ms(options: dict[str, Any]) -> int:
    """The busy timeout (ms) of ``busy_timeout`` in ``options`` (the URL's), or the default."""
    given = options.get(BUSY_TIMEOUT_PARAM)
    if given is None:
        return SQLITE_BUSY_TIMEOUT_MS
    from ...errors import UnsupportedDatabaseError

    try:
        value = int(str(given))
    except ValueError:
        value = -1
    if value < 0:
        raise UnsupportedDatabaseError(
            f"{BUSY_TIMEOUT_PARAM}={given!r}: give a number of milliseconds (0 or more)"
        )
    return value


def setup_engine(engine: sa.Engine, options: dict[str, Any] | None = None) -> None:
    """SQLAlchemy's SQLite connections: a busy timeout (``options``' ``busy_timeout``, from
    the URL, or ``SQLITE_BUSY_TIMEOUT_MS``), WAL, and ``BEGIN IMMEDIATE`` for every
    transaction that may write (the recipe of SQLAlchemy's SQLite docs): a read-then-write
    takes the write lock before it reads, so two processes never both read "slot free"."""
    busy = busy_timeout_ms(options or {})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module: it would otherwise BEGIN
        # lazily (deferred, and only before DML); we emit our own BEGIN in "begin" below.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {busy}")
            _enable_wal(cur)  # readers never block the writer
        finally:
            cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


class SqliteConn(Conn):
    """SQLite: ``BEGIN IMMEDIATE`` transactions, wake-ups as a counter row (``_wakeup``)."""

    waits = False  # it waits for another process's lock itself (``WaitingCursor``)

    def open(self) -> Any:
        dbapi = self.dbapi
        # In WAL mode only: in another journal mode (an in-memory database) an autocommit
        # write with RETURNING commits in ``fetchall``, which could meet a reader's lock
        # there, outside ``WaitingCursor.execute``.
        self.waits = str(dbapi.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
        # (the timeout the engine's connect set: the URL's or the default)
        self.busy_ms = int(dbapi.execute("PRAGMA busy_timeout").fetchone()[0])
        if self.waits:
            dbapi.execute("PRAGMA busy_timeout = 0")
            cur = dbapi.cursor(WaitingCursor)
            cur.busy_ms = self.busy_ms
            return cur
        return dbapi.cursor()

    def reset(self) -> None:
        if self.waits:  # (back to SQLAlchemy's pool: its users wait in SQLite's way)
            try:
                self.dbapi.execute(f"PRAGMA busy_timeout = {self.busy_ms}")
            except Exception:  # closing a broken connection
                log.debug("resetting the busy timeout failed", exc_info=True)

    def begin(self) -> None:
        self.statements = 0
        self.reset_tx()
        self.stats["write_tx"] += 1
        self.sql = "BEGIN IMMEDIATE"
        self.cur.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        if self.wakes:  # the transaction's one wake-up, right before its COMMIT
            self.wakes.clear()
            self.stats["wakeups"] += 1
            self.statements += 1
            self.stats["statements"] += 1
            self.sql = SQLITE_EMIT
            self.cur.execute(SQLITE_EMIT)
        self.sql = "COMMIT"
        self.cur.execute("COMMIT")

    def rollback(self) -> None:
        self.reset_tx()
        try:
            if self.dbapi.in_transaction:
                self.cur.execute("ROLLBACK")
        except Exception:  # the original error matters, not this one
            log.debug("rollback failed", exc_info=True)


class SqliteStatements(Statements):
    """SQLite's spelling: ``:name`` parameters, JSON as text, ``json_each`` membership."""

    WAITING_INDEX = " INDEXED BY ix_flowkit_runs_waiting"  # (else it picks the queue index)
    # (else it may pick ix_flowkit_runs_due and read every due run of every version)
    VERSION_INDEX = " INDEXED BY ix_flowkit_runs_version"
    # (without statistics SQLite would read the leased runs by status: every parked run too)
    LEASED_INDEX = " INDEXED BY ix_flowkit_runs_leased"
    DUE_INDEX = " INDEXED BY ix_flowkit_runs_due"

    def p(self, name: str) -> str:
        return f":{name}"

    def j(self, name: str) -> str:
        return f":{name}"

    def in_list(self, column: str, name: str) -> str:
        return f"{column} IN (SELECT value FROM json_each({self.p(name)}))"

    def in_list_param(self, values: Sequence[str]) -> Any:
        return dumps(list(values))

    def in_versions(self, name: str) -> str:
        # (a row value IN a list: SQLite looks each pair up in ix_flowkit_runs_version)
        return (
            f"(workflow, workflow_version) IN (SELECT json_extract(value, '$[0]'),"
            f" json_extract(value, '$[1]') FROM json_each({self.p(name)}))"
        )

    def versions_params(
        self, params: dict[str, Any], name: str, pairs: Sequence[tuple[str, str]]
    ) -> None:
        params[name] = dumps([[w, v] for w, v in pairs])

    def waits_for(self, name: str) -> str:
        return f"EXISTS (SELECT 1 FROM json_each(waiting_signals) WHERE value = {self.p(name)})"

    def carries_tag(self) -> str:
        return f"EXISTS (SELECT 1 FROM json_each(tags) WHERE value = {self.p('tag')})"

    def tag_params(self, params: dict[str, Any], tag: str) -> None:
        params["tag"] = tag

    def drop_marker(self) -> list[str]:
        # (the marker's position in the array; an unmarked run keeps its tags)
        mark = (
            f"SELECT fullkey FROM json_each(flowkit_runs.tags)"
            f" WHERE value = '{ADMITTED_TAG}' LIMIT 1"
        )
        return [f"tags = coalesce(json_remove(tags, ({mark})), tags)", "admitted = 0"]

    def key_holders(self, q: str) -> str:
        # (``+status``: SQLite must not prefer ix_flowkit_runs_singleton over the queue index)
        return q.replace(" status IN (", " +status IN (", 1)

    def append_sql(self, n: int) -> tuple[str, bool, bool]:
        """One event: one ``INSERT ... SELECT`` from the run row, returning the seq (the
        ``flowkit_events_last_seq`` trigger moves ``last_seq`` and ``updated_at``): the whole
        call. More: the row's ``UPDATE ... RETURNING last_seq``, which the caller follows
        with the insert (``insert_events``) in its transaction."""
        p = self.p
        if n == 1:
            where = f"id = {p('id')}{self.ns} AND lease_owner = {p('owner')} AND status = 'running'"
            sql = (
                f"INSERT INTO flowkit_events (run_id, seq, type, at, body)"
                f" SELECT id, last_seq + 1, {p('t0')}, {p('a0')},"
                f" json_set({p('b0')}, '$.seq', last_seq + 1)"
                f" FROM flowkit_runs WHERE {where} RETURNING seq"
            )
            return sql, True, False
        return self.append_update(n, "max"), False, True  # (max: never backwards)

    def release_lite(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        """A common release (``common_release``) with little Python, or ``None`` when it
        needs the general path: the releasing run's conditional ``UPDATE ... RETURNING`` (no
        row: a precondition failed and nothing was written), and the parameters of
        ``release_waiter``, which reads the key's oldest waiter once the run is released."""
        n = u.notify
        if n is None or owner is None or not common_release(u, n):
            return None
        shape, params, _inline = self.commit_shape(run_id, owner, now, u)
        key = ("release", *shape)
        sql = self._commits.get(key)
        if sql is None:
            sql = self.commit_sql(shape, releasing=True)
            self._commits[key] = sql
        waiter: dict[str, Any] = {
            "wf": n.workflow,
            "key": n.tag[len(SINGLETON_TAG_PREFIX) :],
            "tag": n.tag,
            "now": now,
        }
        if self.namespace is not None:
            waiter["ns"] = self.namespace
        return sql, params, waiter

    def __init__(self, namespace: str | None) -> None:
        super().__init__(namespace)
        self.release_waiter = self._release_waiter()

    def _release_waiter(self) -> str:
        """The oldest waiter of a key (``singleton.waiters``: active, not admitted, not
        cancelling, by ``(created_at, id)``), its columns then whether it can be handed the
        slot (``rules.hand_off_ok``) and whether the key has no holder, then one row per event
        of its history (``seq``, ``body``; ``NULL`` for none). No rows: no waiter. The waiter
        is the first entry of ``ix_flowkit_runs_waiting``; a holder, of
        ``ix_flowkit_runs_queue``."""
        p, ns = self.p, self.ns
        key_rows = (
            f"workflow = {p('wf')} AND singleton_key = {p('key')}{ns} AND {self.carries_tag()}"
        )
        holders = (
            f"SELECT 1 FROM flowkit_runs WHERE {key_rows} AND admitted = 1"
            f" AND +status IN ({ACTIVE})"
        )
        handable = f"status IN ({HANDABLE}) AND NOT {leased(p('now'))}"
        oldest = (
            f"SELECT {self.COLS}, {handable} AS handable, NOT EXISTS ({holders}) AS free"
            f" FROM flowkit_runs INDEXED BY ix_flowkit_runs_waiting WHERE {key_rows}"
            f" AND admitted = 0 AND {WAITING_SQL} ORDER BY created_at, {self.BY_ID} LIMIT 1"
        )
        return (
            f"SELECT w.*, e.seq, e.body FROM ({oldest}) AS w"
            f" LEFT JOIN flowkit_events e ON e.run_id = w.id ORDER BY e.seq"
        )


__all__ = [
    "BUSY_TIMEOUT_PARAM",
    "READ_ONLY",
    "SQLITE_BUSY_TIMEOUT_MS",
    "SqliteConn",
    "SqliteStatements",
    "WaitingCursor",
    "setup_engine",
]
