"""PostgreSQL: advisory locks, the pipeline (one round trip for many statements), wake-ups by
``pg_notify``, the connection (``PgConn``) and the statements (``PgStatements``: ``SKIP
LOCKED`` hand-offs, a release or a creation in one statement).

Why and how: docs/stores.md, "PostgreSQL: many workers on many hosts"."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..._run import ADMITTED_TAG, SINGLETON_TAG_PREFIX
from ..base import Update
from ._connection import RETURNING, ROWCOUNT, ROWS, Conn, log
from ._pgconnect import peer_gone
from ._rows import JSON_COLS, RUN_COLS, admitted_body, dumps
from ._schema import BY_ID, WAITING_SQL
from ._statements import ACTIVE, HANDABLE, Statements, common_release, leased
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
_ADMITTED_JSON = "'" + dumps([ADMITTED_TAG]) + "'"  # (a SQL literal)


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
        if hasattr(dbapi, "prepare_threshold"):
            # psycopg 3: prepare a statement on its first use, not its sixth: the store runs a
            # few statements many times, and the server parses a release's slowly
            dbapi.prepare_threshold = 0
        return dbapi.cursor()

    def broken(self) -> bool:
        """Closed, or (psycopg 3) found dead by a peek at its socket (``peer_gone``): a call
        can then reconnect before it sent anything, which is always safe to do."""
        return Conn.broken(self) or peer_gone(self.dbapi)

    def reset(self) -> None:
        if hasattr(self.dbapi, "prepare_threshold"):
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


class PgStatements(Statements):
    """PostgreSQL's spelling: ``%(name)s`` parameters, ``jsonb`` (read back as text), row locks
    that skip a waiter another transaction holds, and the statements that do in one round trip
    what SQLite does in several."""

    COLS = ", ".join(f"{c}::text" if c in JSON_COLS else c for c in RUN_COLS)
    BY_ID = BY_ID["postgresql"]
    TEXT = "::text"
    FOR_UPDATE = " FOR UPDATE"
    TRUE, FALSE = "true", "false"
    EMPTY_LIST = "'[]'::jsonb"
    CTE_WRITES = True

    def __init__(self, namespace: str | None) -> None:
        super().__init__(namespace)
        p, j = self.p, self.j
        self.deliver_and_insert = (
            f"WITH u AS ({self.deliver}), s AS (INSERT INTO flowkit_signals (run_id, name, payload)"
            f" SELECT u.id, {p('name')}, {j('payload')} FROM u) SELECT * FROM u"
        )
        # the hand-off, its ``singleton_admitted`` and the waiter's history in one statement
        # (the run's columns, then each event's seq and body; no rows on a miss)
        self.hand_off_history = self.handing(f"h AS ({self.hand_off})")
        self._joined: dict[tuple[tuple[str, ...], bool], str] = {}

    def p(self, name: str) -> str:
        return f"%({name})s"

    def j(self, name: str) -> str:
        return f"%({name})s::jsonb"

    def in_list(self, column: str, name: str) -> str:
        return f"{column} = ANY({self.p(name)})"

    def in_list_param(self, values: Sequence[str]) -> Any:
        return list(values)

    def waits_for(self, name: str) -> str:
        return f"waiting_signals ? {self.p(name)}"

    def carries_tag(self) -> str:
        return f"tags @> {self.p('tags')}::jsonb"

    def tag_params(self, params: dict[str, Any], tag: str) -> None:
        params["tags"] = dumps([tag])

    def unless_locked(self, cond: str) -> str:
        # another process's group commit may hold the waiter's row and wait for the
        # releaser's (a lock-order cycle): a locked waiter is skipped (it admits itself later)
        return f"id = (SELECT id FROM flowkit_runs WHERE {cond} FOR UPDATE SKIP LOCKED)"

    def drop_marker(self) -> list[str]:
        return [f"tags = tags - '{ADMITTED_TAG}'", "admitted = false"]

    # -- statements that carry their events ---------------------------------------------------
    def _values(self, n: int, *, seq: bool = True) -> str:
        p, j = self.p, self.j
        return ", ".join(
            f"({p(f's{i}') if seq else i}, {p(f't{i}')}, {p(f'a{i}')}::float8, {j(f'b{i}')})"
            for i in range(n)
        )

    def create_with_events(self, n: int) -> str:
        """The run's ``INSERT ... ON CONFLICT DO NOTHING`` and its ``n`` events in one
        statement; its row count is ``n`` when the run was created, 0 when the id existed."""
        key = ("create", n)
        sql = self._cache.get(key)
        if sql is None:
            sql = (
                f"WITH r AS ({self.insert_run_new} RETURNING id)"
                f" INSERT INTO flowkit_events (run_id, seq, type, at, body)"
                f" SELECT r.id, v.seq, v.type, v.at, v.body FROM r,"
                f" (VALUES {self._values(n)}) AS v(seq, type, at, body)"
            )
            if n <= 16:
                self._cache[key] = sql
        return sql

    def with_events(self, update: str, n: int) -> str:
        """A commit's ``UPDATE ... RETURNING`` and the insert of its ``n`` events at the seqs
        it assigned (``last_seq`` of the updated row); the rows are the update's (none when a
        precondition failed: then nothing was inserted)."""
        return f"WITH u AS ({update}), e AS ({self._events_of('u', n)}) SELECT * FROM u"

    def _events_of(self, cte: str, n: int) -> str:
        """The insert of ``n`` events (``event_params``, no seqs) of the run the query
        ``cte`` returned, at the seqs up to its new ``last_seq``."""
        seq = f"{cte}.last_seq - {n} + v.k + 1"
        return (
            f"INSERT INTO flowkit_events (run_id, seq, type, at, body)"
            f" SELECT {cte}.id, {seq}, v.type, v.at, jsonb_set(v.body, '{{seq}}', to_jsonb({seq}))"
            f" FROM {cte}, (VALUES {self._values(n, seq=False)}) AS v(k, type, at, body)"
        )

    def append_sql(self, n: int) -> tuple[str, bool, bool]:
        """The row's ``UPDATE`` and the insert of the events in one statement, returning
        ``(id, last_seq)``: the whole call."""
        return self.with_events(self.append_update(n, "GREATEST"), n), True, True

    # -- hand-offs ----------------------------------------------------------------------------
    def handing(self, ctes: str) -> str:
        """``ctes`` (which define ``h``, a hand-off's ``RETURNING``) followed by the insert of
        the handed waiter's ``singleton_admitted`` (body ``adm``, at the seq the hand-off
        took) and the select of the waiter's columns with its whole history."""
        ev = (
            f" ev AS (INSERT INTO flowkit_events (run_id, seq, type, at, body)"
            f" SELECT h.id, h.last_seq, 'singleton_admitted', h.updated_at,"
            f" jsonb_set({self.p('adm')}::jsonb, '{{seq}}', to_jsonb(h.last_seq)) FROM h"
            f" RETURNING run_id, seq, body)"
        )
        return (
            f"WITH {ctes},{ev} SELECT h.*, e.seq, e.body::text FROM h"
            f" LEFT JOIN flowkit_events e ON e.run_id = h.id"
            f" UNION ALL SELECT h.*, ev.seq, ev.body::text FROM h"
            f" JOIN ev ON ev.run_id = h.id ORDER BY seq"
        )

    def joined(
        self, parts: Sequence[tuple[str, dict[str, Any]]], *, handing: bool = False
    ) -> tuple[str, dict[str, Any]]:
        """Several writes of one call, each on rows none of the others writes, as one
        statement (its ``WITH`` queries; the parameters of part ``i`` renamed ``p<i>_``). All
        parts see one snapshot and all run to completion. With ``handing`` the last part is
        ``hand_off`` and the statement returns what ``hand_off_history`` does."""
        if len(parts) == 1 and not handing:
            return parts[0]
        key = (tuple(q for q, _ in parts), handing)
        sql = self._joined.get(key)
        if sql is None:
            *head, tail = [_renamed(q, f"p{i}_") for i, (q, _) in enumerate(parts)]
            ctes = ", ".join(f"w{i} AS ({q})" for i, q in enumerate(head))
            if handing:
                sql = self.handing(f"{ctes}, h AS ({tail})" if ctes else f"h AS ({tail})")
            else:
                sql = f"WITH {ctes} {tail}"
            if len(self._joined) < 64:
                self._joined[key] = sql
        params = {f"p{i}_{k}": v for i, (_, ps) in enumerate(parts) for k, v in ps.items()}
        if handing:
            params["adm"] = parts[-1][1]["adm"]
        return sql, params

    # -- a release in one statement -----------------------------------------------------------
    def release_fast(
        self, run_id: str, owner: str | None, now: float, u: Update
    ) -> tuple[str, dict[str, Any]] | None:
        """A common release (``common_release``) as one statement deciding as
        ``rules.plan_release`` does, or ``None``. Its rows (``k``, the run's columns, an
        event's ``seq`` and ``body``): ``k = 0`` the released run (none: nothing was written);
        ``k = 1`` the handed waiter, a row per event of its history; ``k = 2`` the waiter
        planned for, as it was (``seq`` 1: only woken). A waiter another transaction holds
        (``SKIP LOCKED``) is neither handed nor woken here: the caller wakes it later."""
        n = u.notify
        if n is None or owner is None or not common_release(u, n):
            return None
        shape, params, _inline = self.commit_shape(run_id, owner, now, u)
        params["wf"] = n.workflow
        params["key"] = n.tag[len(SINGLETON_TAG_PREFIX) :]
        params["tagj"] = dumps([n.tag])
        params["cowner"] = n.claim_owner
        params["until"] = n.lease_expires
        params["adm"] = admitted_body(n.tag, now)
        key = ("release", *shape)
        sql = self._commits.get(key)
        if sql is None:
            sql = self._release_sql(shape)
            self._commits[key] = sql
        return sql, params

    def _release_sql(self, shape: tuple[Any, ...]) -> str:
        p, ns = self.p, self.ns
        now = p("now")
        # ``(status || '')``: a status test that is no index condition, so the planner finds a
        # waiter's row by its id, never by a scan of every run with that status. The key's
        # holders: a range of ix_flowkit_runs_queue or ix_flowkit_runs_singleton; its oldest
        # waiter: the first entry of ix_flowkit_runs_waiting (its predicate word for word).
        status = "(status || '')"
        key_rows = (
            f"FROM flowkit_runs WHERE workflow = {p('wf')} AND singleton_key = {p('key')}{ns}"
            f" AND tags @> {p('tagj')}::jsonb AND id <> {p('id')}"
        )

        # (the waiter's row, locked unless another transaction holds it)
        def waiter(cond: str, check: str) -> str:
            return (
                f"id = (SELECT id FROM flowkit_runs WHERE id = (SELECT w.id FROM w, free"
                f" WHERE free.ok AND {cond}) AND {check} FOR UPDATE SKIP LOCKED)"
                f" AND EXISTS (SELECT 1 FROM me)"
            )

        handable = f"{status} IN ({HANDABLE}) AND NOT {leased(now)}"  # rules.hand_off_ok
        hand = waiter("w.handable", f"{handable} AND NOT admitted")
        wake = waiter("NOT w.handable", f"{status} = 'suspended'")
        waiter_cols = ", ".join(f"w.{c}" for c in RUN_COLS)
        return (
            f"WITH me AS ({self.commit_sql(shape, releasing=True)}),"
            f" e AS ({self._events_of('me', shape[-1])}),"
            f" free AS (SELECT NOT EXISTS (SELECT 1 {key_rows}"
            f" AND admitted = true AND status IN ({ACTIVE})) AS ok),"
            # the oldest waiter (singleton.waiters: active, not admitted, not cancelling)
            f" w AS (SELECT {self.COLS}, {handable} AS handable {key_rows}"
            f" AND admitted = false AND {WAITING_SQL} ORDER BY created_at, {self.BY_ID} LIMIT 1),"
            f" h AS (UPDATE flowkit_runs SET tags = tags || {_ADMITTED_JSON}::jsonb,"
            f" admitted = true, status = 'running', wake_at = NULL,"
            f" lease_owner = {p('cowner')}, lease_expires = {p('until')}, updated_at = {now},"
            f" last_seq = last_seq + 1 WHERE {hand} RETURNING {self.COLS}),"
            # (the handed waiter's singleton_admitted, in this transaction)
            f" ev AS (INSERT INTO flowkit_events (run_id, seq, type, at, body)"
            f" SELECT h.id, h.last_seq, 'singleton_admitted', h.updated_at,"
            f" jsonb_set({p('adm')}::jsonb, '{{seq}}', to_jsonb(h.last_seq)) FROM h"
            f" RETURNING run_id, seq, body),"
            f" wk AS (UPDATE flowkit_runs SET wake_at = {now}"
            f" WHERE {wake} RETURNING id)"
            f" SELECT 0 AS k, me.*, NULL::integer AS seq, NULL::text AS body FROM me"
            f" UNION ALL SELECT 1, h.*, e2.seq, e2.body::text FROM h"
            f" LEFT JOIN flowkit_events e2 ON e2.run_id = h.id"
            f" UNION ALL SELECT 1, h.*, ev.seq, ev.body::text FROM h JOIN ev ON ev.run_id = h.id"
            f" UNION ALL SELECT 2, {waiter_cols}, CASE WHEN w.handable THEN 0 ELSE 1 END, NULL"
            f" FROM w, free WHERE free.ok"
            f" ORDER BY k, seq"
        )


_PARAM = re.compile(r"%\((\w+)\)s")  # a named parameter of a statement


def _renamed(sql: str, prefix: str) -> str:
    """``sql`` with its named parameters prefixed (``PgStatements.joined``)."""
    return _PARAM.sub(lambda m: f"%({prefix}{m.group(1)})s", sql)


__all__ = [
    "GENERIC_PLANS_SQL",
    "LOCK_ROWS_SQL",
    "LOCK_SQL",
    "PgConn",
    "PgStatements",
    "has_pipeline",
]
