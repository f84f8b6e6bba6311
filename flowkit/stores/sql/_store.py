"""``SqlStore``: the store on SQLite files and PostgreSQL.

Every store call is one function of the store's DBAPI connection (``_engine.Conn``) running
prebuilt SQL (``_sql``): reads run at once, outside any write transaction (each statement sees
the latest committed state; a call that reads twice reads in an order that keeps it
linearizable). Writes go through ``Database.write``, which group-commits: writes issued
concurrently by coroutines of one event loop share one transaction, each keeping its own
atomicity and errors; a write that nothing else could join (a sequential caller) runs at once
without yielding, and ``SqlStore(..., group_commit=False)`` runs every write that way (the
deterministic mode ``flowkit_testing.TestEnv`` needs). Results are handed out only after the
``COMMIT``.

Concurrency between processes is the database's job (see ``_engine`` for the SQLite and
PostgreSQL setup): every read-then-write runs in one transaction that first serializes its
competitors (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: the key's advisory lock, then row locks).
A step's record (``append_events``) is one statement (SQLite: an ``INSERT ... SELECT`` from the
run row, in autocommit); ``claim`` and the common ``commit``\\ s are one conditional ``UPDATE
... WHERE <preconditions> RETURNING``; a ``commit`` that misses (or needs more: consuming a
signal, notify-on-release) locks the run row (``SELECT ... FOR UPDATE``) and decides in Python
with the shared rules of ``flowkit.stores.memory``. Lock order is always advisory locks (in
name order), then row locks in run-id order, so two processes' transactions cannot deadlock;
a release also locks its waiter's row, but never waits for it (``SKIP LOCKED``), and after
the rows its transaction waits for (a batch with a one-statement release locks all of them
first, in one statement).

Wake-ups across processes (``_wakeup``): a transaction that leaves a run claimable now (a new
``pending`` run, a released lease, a signal or cancel that makes a parked run due) or stamps a
singleton waiter awake emits one wake-up with its ``COMMIT``; ``watch`` calls a callback when
any store object on the database emitted one. Commits that keep their lease (a step's record)
emit nothing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from ... import singleton as _sg
from ..._history import Event
from ..._run import ADMITTED_TAG, SINGLETON_TAG_PREFIX, Run, RunStatus
from ...errors import (
    RunIdTakenError,
    RunNotFoundError,
    SingletonQueueFullError,
)
from ..base import Admission, CommitResult, ConflictError, HandOff, InboxSignal, QueueCap, Update
from ..rules import (
    admit_new,
    admitted_event,
    apply_update,
    check_commit,
    claimable,
    due_time,
    plan_release,
)
from . import _rows as rows
from ._engine import RETURNING, ROWCOUNT, ROWS, SELECT, After, Conn, Database, Deferred, Op
from ._schema import runs
from ._sql import LAST_SEQ, RUN_COLS, Sql, dumps


def _always(_result: Any) -> bool:
    """``Op.single``: the first statement is the whole call, whatever it returned."""
    return True


def _hit(row: Any) -> bool:
    """``Op.single``: the whole call when its conditional write matched its row."""
    return row is not None


def _released(found: Any) -> bool:
    """``Op.single`` of ``Sql.release_fast``: the release was applied (its run's row came
    back)."""
    return bool(found) and found[0][0] == 0


_TAGS = RUN_COLS.index("tags")
_NAMESPACE = RUN_COLS.index("namespace")


def _wake_if_free(c: Conn, run: Run, now: float) -> None:
    """Emit a wake-up with ``c``'s transaction when it leaves ``run`` claimable now by any
    worker. A run with a lease owner is never woken: a step's commit keeps the lease (even one
    that expired meanwhile: its owner is still at work), so the hot path costs nothing."""
    if run.lease_owner is None and claimable(run, now):
        c.wakeup(run.namespace)


log = logging.getLogger("flowkit")


class SqlStore:
    """A durable store on SQLite and PostgreSQL (see ``flowkit.stores.base.Store`` for the
    contract).

    ``url`` is ``sqlite:///path/to/file.db`` (safe for several processes on one file) or
    ``postgresql+psycopg://user:pw@host/db`` (many workers on many hosts). The schema is
    created on first use. ``namespace`` scopes the store like ``MemoryStore(namespace)``.

    ``admits_on_create``: ``create_run`` takes an ``Admission`` (``base.AdmitsOnCreate``) and
    decides it in the insert's transaction, under the key's advisory lock on PostgreSQL.
    ``appends_events``: ``append_events`` records a running step in one statement
    (``base.AppendsEvents``).

    ``group_commit`` (default on) lets concurrent writes of one event loop share a transaction;
    ``False`` runs each write at once in its own transaction and never yields to the event loop
    inside a call (reproducible interleavings for ``flowkit_testing.TestEnv``). It is shared by
    the store's scoped views (the ``group_commit`` attribute can be changed at any time).

    ``wakeups`` (default on) lets ``watch`` listen for the wake-ups other processes emit
    (PostgreSQL: a ``LISTEN`` connection; SQLite: a check every 10 ms); ``False`` leaves
    workers to their timer poll, e.g. behind a PgBouncer in transaction mode, which cannot
    ``LISTEN``. Writes emit wake-ups either way. Shared by the scoped views."""

    admits_on_create = True
    records_admission = True
    appends_events = True

    def __init__(
        self,
        url: str,
        *,
        namespace: str | None = None,
        group_commit: bool = True,
        wakeups: bool = True,
        _db: Database | None = None,
    ) -> None:
        self._db = (
            _db if _db is not None else Database(url, group_commit=group_commit, wakeups=wakeups)
        )
        self.url = url
        self.namespace = namespace
        self._dialect = self._db.dialect
        self._pg = self._dialect == "postgresql"
        self._sql = Sql(self._dialect, namespace)

    @property
    def group_commit(self) -> bool:
        return self._db.group_commit

    @group_commit.setter
    def group_commit(self, on: bool) -> None:
        self._db.group_commit = bool(on)

    @property
    def wakeups(self) -> bool:
        return self._db.wakeups

    def watch(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback()`` on the running event loop when a wake-up is emitted: some write
        on this database (by any process or store object, this one included) left a run of
        this store's namespace claimable now, or woke a singleton waiter. Returns the function
        that stops it. Optional in the store protocol (``flowkit.stores.base``): workers
        subscribe their ``poke``. The watcher (one connection per store object and event loop)
        starts with the first callback and stops with the last, or with ``close``; it logs and
        retries its failures, it never raises into the caller. A no-op when ``wakeups`` is
        off, on an in-memory SQLite database and without psycopg 3.2."""
        return self._db.watch(callback, self.namespace)

    def scoped(self, namespace: str) -> SqlStore:
        """A view over the same database that reads and writes only ``namespace``."""
        return SqlStore(self.url, namespace=namespace, _db=self._db)

    def close(self) -> None:
        """Close pooled connections and stop the wake-up watchers (shared with scoped views)."""
        self._db.dispose()

    def __repr__(self) -> str:
        return f"SqlStore({self._db.shown_url!r}, namespace={self.namespace!r})"

    # -- helpers ----------------------------------------------------------------------
    def _params(self, **kw: Any) -> dict[str, Any]:
        if self.namespace is not None:
            kw["ns"] = self.namespace
        return kw

    def _fetch(self, c: Conn, run_id: str, *, lock: bool = False) -> Any:
        q = self._sql.get_run_locked if lock else self._sql.get_run
        return c.one(q, self._params(id=run_id))

    def _lock_key(self, c: Conn, workflow: str, tag: str) -> None:
        """The key's advisory lock (PostgreSQL), which the call must have declared in its
        ``Op.locks``: then its transaction holds it already, taken before any row lock."""
        c.lock(rows.lock_name(workflow, tag))

    @staticmethod
    def _key_locks(workflow: str, tag: str) -> tuple[str, ...]:
        """``Op.locks`` of a call that serializes on one singleton key."""
        return (rows.lock_name(workflow, tag),)

    def _sharing(self, c: Conn, workflow: str, tag: str) -> list[Run]:
        q, params = self._sql.sharing(workflow, tag)
        return [r for r in map(self._sql.to_run, c.all(q, params)) if tag in r.tags]

    def _locked_with_sharing(
        self, c: Conn, run_id: str, workflow: str, tag: str
    ) -> tuple[Any, list[Run]]:
        """The run's row, locked, and the active runs sharing ``tag`` (as ``_sharing``): one
        statement (``Sql.locked_with_sharing``)."""
        q, params = self._sql.locked_with_sharing(run_id, workflow, tag)
        return self._split(c.all(q, params), tag)

    def _split(self, found: Sequence[Any], tag: str) -> tuple[Any, list[Run]]:
        """The rows of ``Sql.locked_with_sharing``: the run's row (or ``None``) and the runs
        sharing ``tag``."""
        row: Any = None
        sharing: list[Run] = []
        to_run = self._sql.to_run
        for r in found:
            if r[0] == 0:
                row = tuple(r[1:])
            else:
                other = to_run(r[1:])
                if tag in other.tags:
                    sharing.append(other)
        if row is not None and all(r.id != row[0] for r in sharing):
            me = to_run(row)  # (a waiter behind the ones read: it decides about itself)
            if me.status.active and tag in me.tags:
                sharing.append(me)
        return row, sharing

    def _write_changes(
        self,
        c: Conn,
        old: Run,
        new: Run,
        *,
        later: bool = False,
        into: list[tuple[str, dict[str, Any]]] | None = None,
        **extra: Any,
    ) -> None:
        """Write the columns that changed from ``old`` to ``new`` (and ``extra``): at once,
        queued (``later``), or as a part of a joined statement (``into``, ``Sql.joined``)."""
        changes = rows.changed_values(old, new) | extra
        if changes:
            cols = sorted(changes)
            params = self._sql.column_params(changes)
            params["id"] = old.id
            if into is not None:
                into.append((self._sql.update(cols), params))
            else:
                (c.later if later else c.write)(self._sql.update(cols), params)

    def _append(
        self,
        c: Conn,
        run_id: str,
        first_seq: int,
        evs: Sequence[Event],
        *,
        later: bool = False,
        into: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> None:
        """Insert ``evs`` at ``first_seq`` (past ``last_seq`` of the locked run row); the
        primary key ``(run_id, seq)`` still refuses a second writer of the same position.
        ``later`` and ``into`` as for ``_write_changes``."""
        if evs:
            params: dict[str, Any] = {"id": run_id}
            self._sql.event_params(params, first_seq, evs)
            if into is not None:
                into.append((self._sql.insert_events(len(evs)), params))
            else:
                (c.later if later else c.write)(self._sql.insert_events(len(evs)), params)

    def _run_or_none(self, c: Conn, row: Any) -> Run | None:
        return None if row is None else self._sql.to_run(row)

    def _events(self, c: Conn, run_id: str) -> list[Event] | None:
        found = c.all(self._sql.load_events, self._params(id=run_id))
        if not found:
            return None
        to_event = self._sql.to_event
        return [to_event(seq, body) for seq, body in found if seq is not None]

    # -- the contract ------------------------------------------------------------------
    async def create_run(
        self,
        run: Run,
        events: Sequence[Event],
        *,
        queue_cap: QueueCap | None = None,
        admission: Admission | None = None,
    ) -> tuple[Run, bool]:
        if self.namespace is not None and run.namespace is None:
            run = dataclasses.replace(run, namespace=self.namespace)
        if queue_cap is not None or admission is not None:
            return await self._create_keyed(run, events, queue_cap, admission)
        values = self._sql.run_params(run, len(events))
        sql = self._sql
        # an existing id (even one a concurrent transaction is inserting) is no error: the
        # insert does nothing and the existing run is returned
        both = self._pg and bool(events)
        if both:  # PostgreSQL: the run and its events in one statement (one round trip)
            sql.event_params(values, 1, events)
            first = (sql.create_with_events(len(events)), values, ROWCOUNT)
        else:
            first = (sql.insert_run_new, values, ROWCOUNT)

        def rest(c: Conn, inserted: int) -> tuple[Run, bool]:
            if not inserted:
                return self._existing(c, run.id), False
            if not both:
                self._append(c, run.id, 1, events)
            self._created(c, run)
            return run, True

        # (without events, ``rest`` only reads: one statement on every dialect)
        single = _always if both or not events else None
        return await self._db.write(Op(rest, first, run.id, single=single))

    async def _create_keyed(
        self,
        run: Run,
        events: Sequence[Event],
        cap: QueueCap | None,
        admission: Admission | None,
    ) -> tuple[Run, bool]:
        """``create_run`` serialized with the key's other claims (a queue cap, an admission at
        creation) in a transaction of its own: 1. the key's advisory lock (PostgreSQL; SQLite
        holds its write lock already), 2. in one round trip with it: the id, the key's count
        (for the cap) and its active runs (for the admission), 3. decide with the shared rules
        (``memory.admit_new``), 4. insert the run and its events (they go out with the
        ``COMMIT``: the second and last round trip)."""
        sql = self._sql
        keyed = [k for k in (cap, admission) if k is not None]
        locks = sorted({rows.lock_name(k.workflow, k.tag) for k in keyed})
        # the admission's read of the key's runs counts them for the cap too (same key)
        counted = admission is not None and (
            cap is None or (cap.workflow, cap.tag) == (admission.workflow, admission.tag)
        )
        stmts: list[tuple[str, Any]] = [(sql.get_any_run, {"id": run.id})]
        if cap is not None and not counted:
            stmts.append(self._count_stmt(cap))
        if admission is not None:
            stmts.append(sql.sharing(admission.workflow, admission.tag))

        def op(c: Conn, _: None) -> tuple[Run, bool]:
            # (the key locks, declared below, went out with these reads: one round trip)
            got = c.reads(stmts)
            if got[0]:
                return self._existing_row(got[0][0]), False
            sharing: list[Run] = []
            if admission is not None:
                sharing = [r for r in map(sql.to_run, got[-1]) if admission.tag in r.tags]
            if cap is not None:
                n = len(sharing) if counted else self._count_of(cap, got[1])
                if n >= cap.capacity:
                    raise SingletonQueueFullError(
                        cap.workflow, cap.key, cap.max_queue_depth, cap.limit
                    )
            stored, evs = run, list(events)
            if admission is not None:
                stored, evs = admit_new(run, events, admission, sharing)
            c.later(sql.insert_run, sql.run_params(stored, len(evs)))
            self._append(c, stored.id, 1, evs, later=True)
            self._created(c, stored)
            return stored, True

        return await self._db.write(Op(op, None, run.id, locks=tuple(locks)))

    @staticmethod
    def _created(c: Conn, run: Run) -> None:
        """A new run nobody holds (a client's start) is claimable: wake the workers."""
        _wake_if_free(c, run, run.updated_at)

    def _count_stmt(self, cap: QueueCap) -> tuple[str, Any]:
        """The statement counting the active runs sharing ``cap``'s tag (``_count_of``)."""
        if cap.tag.startswith(SINGLETON_TAG_PREFIX):
            params = self._params(wf=cap.workflow, key=cap.tag[len(SINGLETON_TAG_PREFIX) :])
            return self._sql.count_key, params
        return self._sql.sharing(cap.workflow, cap.tag)

    def _count_of(self, cap: QueueCap, found: list[Any]) -> int:
        """The count from the rows of ``_count_stmt``."""
        if cap.tag.startswith(SINGLETON_TAG_PREFIX):
            return int(found[0][0])
        return sum(cap.tag in r.tags for r in map(self._sql.to_run, found))

    def _existing(self, c: Conn, run_id: str) -> Run:
        row = c.one(self._sql.get_any_run, {"id": run_id})
        if row is None:  # pragma: no cover - the insert conflicted with a committed row
            raise RunNotFoundError(run_id)
        return self._existing_row(row)

    def _existing_row(self, row: Any) -> Run:
        """``create_run`` of an id that exists: idempotent here, taken in another namespace."""
        run = self._sql.to_run(row)
        if self.namespace is not None and run.namespace != self.namespace:
            raise RunIdTakenError(run.id)
        return run

    async def get_run(self, run_id: str) -> Run | None:
        def op(c: Conn) -> Run | None:
            row = self._fetch(c, run_id)
            return None if row is None else self._sql.to_run(row)

        return await self._db.read(op)

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        limit: int | None = None,
    ) -> list[Run]:
        r = runs.c
        q = sa.select(runs).where(rows.visible(self.namespace))
        if workflow is not None:
            q = q.where(r.workflow == workflow)
        if status is not None:
            q = q.where(r.status == RunStatus(status).value)
        if tag is not None:
            q = q.where(rows.has_tag_sql(self._dialect, tag))
        q = q.order_by(r.created_at, r.id.collate("C") if self._pg else r.id)  # (code points)
        if limit is not None:
            q = q.limit(limit)
        with self._db.tx(write=False) as conn:
            out = [rows.to_run(row) for row in conn.execute(q)]
        return out if tag is None else [run for run in out if tag in run.tags]

    async def load_events(self, run_id: str) -> list[Event]:
        def op(c: Conn) -> list[Event]:
            evs = self._events(c, run_id)
            if evs is None:
                raise RunNotFoundError(run_id)
            return evs

        return await self._db.read(op)

    async def claim(self, run_id: str, owner: str, now: float, lease_expires: float) -> Run | None:
        params = self._params(id=run_id, owner=owner, until=lease_expires, now=now)
        first = (self._sql.claim, params, RETURNING)
        return await self._db.write(Op(self._run_or_none, first, run_id, single=_always))

    async def release_leases(self, owner: str, now: float) -> list[str]:
        params = self._params(owner=owner, now=now)
        q = self._sql.release_owned

        def op(c: Conn, _: None) -> list[str]:
            return sorted(str(r[0]) for r in c.all(q, params))

        return await self._db.write(Op(op, None, owner))

    async def renew_lease(self, run_id: str, owner: str, lease_expires: float) -> Run | None:
        params = self._params(id=run_id, owner=owner, until=lease_expires)
        first = (self._sql.renew, params, RETURNING)
        return await self._db.write(Op(self._run_or_none, first, run_id, single=_always))

    async def commit(
        self, run_id: str, owner: str | None, now: float, update: Update
    ) -> CommitResult:
        fast = self._sql.commit_fast(run_id, owner, now, update)
        sql = self._sql
        whole = None
        n = len(update.events)
        first: tuple[str, Any, int] | None
        if fast is not None:  # the whole change in one conditional UPDATE
            first = (fast[0], fast[1], RETURNING)
            inline = fast[2]

            def rest(c: Conn, row: Any) -> CommitResult:
                if row is not None:
                    last = int(row[LAST_SEQ])
                    if not inline:
                        self._append(c, run_id, last - n + 1, update.events)
                    new = sql.to_run(row)
                    _wake_if_free(c, new, now)
                    return CommitResult(new, tuple(range(last - n + 1, last + 1)))
                # it missed: lock the row and decide (and raise) in Python; in a PostgreSQL
                # batch not here, as that lock would come out of the batch's run-id order
                if c.pipelined:
                    raise Deferred
                return self._commit_locked(c, run_id, owner, now, update)

        elif (whole := sql.release_fast(run_id, owner, now, update)) is not None:
            # (PostgreSQL) a common release in one statement: the slot, handed over
            first = (whole[0], whole[1], ROWS)

            def rest(c: Conn, row: Any) -> CommitResult:  # (all the rows of ``first``)
                if not _released(row):  # a precondition failed: nothing was written
                    if c.pipelined:
                        raise Deferred
                    return self._commit_locked(c, run_id, owner, now, update)
                c.dirty = True  # (it wrote: a failure from here on fails its transaction)
                return self._fast_released(c, row, len(update.events), now)

        elif (lean := sql.release_lite(run_id, owner, now, update)) is not None:
            # (SQLite) a common release: the run's row, then its key's oldest waiter
            first = (lean[0], lean[1], RETURNING)
            waiter = lean[2]

            def rest(c: Conn, row: Any) -> CommitResult:
                if row is None:  # a precondition failed: nothing was written
                    return self._commit_locked(c, run_id, owner, now, update)
                return self._lean_released(c, row, update, waiter, now)

        elif update.notify is None:  # the general path, the row lock first (in order)
            first = (sql.get_run_locked, self._params(id=run_id), SELECT)

            def rest(c: Conn, row: Any) -> CommitResult:
                return self._commit_locked(c, run_id, owner, now, update, row=(row,))

        else:  # a release with notify: the key's lock, then its row with the key's runs
            rn = update.notify
            # (the waiters a release can wake: as many as slots can be free, one if unknown)
            wake = rn.limit if rn.limit is not None else 1
            first = (*sql.locked_with_sharing(run_id, rn.workflow, rn.tag, wake), ROWS)

            def rest(c: Conn, row: Any) -> CommitResult:  # (all the rows of ``first``)
                row, sharing = self._split(row, rn.tag)
                return self._commit_locked(
                    c, run_id, owner, now, update, row=(row,), sharing=sharing
                )

        # a release with notify holds the key's advisory lock (taken before any row lock of
        # its transaction, which it may share with other calls). The fast path is complete
        # when its UPDATE matched (PostgreSQL: events inserted by the same statement), so it
        # can run as one statement in autocommit; the one-statement release with its lock
        single: Callable[[Any], bool] | None = None
        if whole is not None:
            single = _released
        elif fast is not None and (fast[2] or not n):
            single = _hit
        rel = update.notify
        locks = () if rel is None else self._key_locks(rel.workflow, rel.tag)
        op = Op(rest, first, run_id, single=single, locks=locks)
        return await self._db.write(op)

    async def append_events(
        self, run_id: str, owner: str, now: float, events: Sequence[Event]
    ) -> tuple[int, ...] | None:
        """``base.AppendsEvents``: one statement on its own (an autocommit ``INSERT`` on
        SQLite, one round trip on PostgreSQL) when nothing shares its group commit."""
        n = len(events)
        if not n:
            return None
        sql, whole = self._sql.append(n)
        params: dict[str, Any] = {"id": run_id, "owner": owner}
        if self._sql.namespace is not None:
            params["ns"] = self._sql.namespace
        if self._pg or not whole:
            params["now"] = now
            params["n"] = n
        if whole:  # the seqs are the statement's (bodies get theirs in the database)
            self._sql.event_params(params, 0, events)
            for i in range(n):
                del params[f"s{i}"]

        def rest(c: Conn, row: Any) -> tuple[int, ...] | None:
            if row is None:
                return None
            last = int(row[-1])  # SQLite's one event: its seq; else the row's new last_seq
            if not whole:  # (SQLite, several events) the insert at the reserved seqs
                self._append(c, run_id, last - n + 1, events)
            return tuple(range(last - n + 1, last + 1))

        if whole and self._db.idle():  # (a step of a run alone: the common case)
            row = self._db.returning_now(sql, params)
            if row is None:
                return None
            last = int(row[-1])
            return tuple(range(last - n + 1, last + 1))
        first = (sql, params, RETURNING)
        op = Op(rest, first, run_id, single=_always if whole else None, lite=whole)
        return await self._db.write(op)

    def _commit_locked(
        self,
        c: Conn,
        run_id: str,
        owner: str | None,
        now: float,
        update: Update,
        row: tuple[Any] | None = None,
        sharing: list[Run] | None = None,
    ) -> CommitResult:
        """The general commit: lock the row (unless ``row`` holds it, already locked),
        decide with ``apply_update``, write the changed columns. Every precondition is checked
        before the first write. A release (``update.notify``) may come with the key's runs,
        read with its row lock (``sharing``)."""
        n = update.notify
        sql = self._sql
        if n is not None:  # advisory lock before any row lock: the admission lock order
            self._lock_key(c, n.workflow, n.tag)
            if row is None:  # the key's runs come with the row lock (one round trip)
                locked, sharing = self._locked_with_sharing(c, run_id, n.workflow, n.tag)
                row = (locked,)
        row = self._fetch(c, run_id, lock=True) if row is None else row[0]
        if row is None:
            raise RunNotFoundError(run_id)
        run = sql.to_run(row)
        last_seq = int(row[LAST_SEQ])
        check_commit(run, owner, now, update)
        if update.consume_signal is not None:
            gone = c.write(sql.consume_signal, {"sid": update.consume_signal, "id": run_id})
            if gone != 1:
                raise ConflictError(f"signal #{update.consume_signal} already consumed")
        names: set[str] = set()
        if update.waiting_signals:
            found = c.all(
                sql.signal_names,
                {"id": run_id, "names": sql.in_list_param(update.waiting_signals)},
            )
            names = {r[0] for r in found}
        new = apply_update(run, update, now, inbox_names=names)
        # the writes go out with the next statement that reads (PostgreSQL: one round trip,
        # and one statement for the row, its events and a hand-off: ``joined``)
        joined: list[tuple[str, dict[str, Any]]] | None = None
        if c.can_pipeline and not c.committed:
            joined = []
        if update.events:
            last = {"last_seq": last_seq + len(update.events)}
            self._write_changes(c, run, new, later=True, into=joined, **last)
        else:
            self._write_changes(c, run, new, later=True, into=joined)
        self._append(c, run_id, last_seq + 1, update.events, later=True, into=joined)
        _wake_if_free(c, new, now)
        seqs = tuple(range(last_seq + 1, last_seq + 1 + len(update.events)))
        # per waiter, in plan order: a hand-off, a woken waiter's id, or a hand-off whose
        # statements go out with others (PostgreSQL), read after the COMMIT
        planned: list[HandOff | str | _PendingHandOff] = []
        if n is not None:
            if sharing is None:
                sharing = self._sharing(c, n.workflow, n.tag)
            else:  # read before this commit's own change: see the run as it now is
                sharing = [
                    r
                    for r in (new if r.id == run_id else r for r in sharing)
                    if r.status.active and n.tag in r.tags
                ]
            for w, admitted in plan_release(sharing, n, now):
                if admitted is not None:
                    if w.id == run_id and joined:  # (its own row: its writes go first)
                        c.later(*sql.joined(joined))
                        joined.clear()
                    got = self._hand_off(c, w, admitted, now, joined if w.id != run_id else None)
                    if got is not None:
                        planned.append(got)
                        continue
                # woken, not handed: it admits itself (a miss above: another process's
                # poller claimed it, or it was cancelled, in the meantime)
                c.later(sql.wake_waiter, {"id": w.id, "now": now})
                c.wakeup(w.namespace)
                planned.append(w.id)
        if joined:  # (no hand-off took them along)
            c.later(*sql.joined(joined))

        def result() -> CommitResult:
            done = [p.finish() if isinstance(p, _PendingHandOff) else p for p in planned]
            woken = tuple(p for p in done if isinstance(p, str))
            return CommitResult(new, seqs, woken, tuple(p for p in done if isinstance(p, HandOff)))

        if any(isinstance(p, _PendingHandOff) for p in planned):
            return After(result)  # type: ignore[return-value]  # (Database.write finishes it)
        return result()

    def _fast_released(self, c: Conn, found: Sequence[Any], n: int, now: float) -> CommitResult:
        """The result of an applied ``Sql.release_fast`` from its rows. A waiter it handed the
        slot to comes with its history; one it could not (another transaction held its row)
        is woken after the commit; an unreadable history undoes the hand-off after the
        commit (both as ``_PendingHandOff`` does)."""
        sql = self._sql
        k = len(RUN_COLS) + 1
        new = sql.to_run(found[0][1:k])
        last = int(found[0][LAST_SEQ + 1])
        seqs = tuple(range(last - n + 1, last + 1))
        planned = found[-1]
        if planned[0] != 2:  # nobody to wake: no waiter, or no free slot
            return CommitResult(new, seqs)
        waiter = sql.to_run(planned[1:k])
        if planned[k] == 1:  # not to be handed (leased elsewhere, blocked): woken (stamped)
            c.wakeup(waiter.namespace)
            return CommitResult(new, seqs, (waiter.id,))
        pending = _PendingHandOff(self, waiter, now)
        handed = [r[1:] for r in found if r[0] == 1]
        pending.updated.append((handed, len(handed)))

        def result() -> CommitResult:
            got = pending.finish()
            if isinstance(got, str):
                return CommitResult(new, seqs, (got,))
            return CommitResult(new, seqs, (), (got,))

        return After(result)  # type: ignore[return-value]  # (Database.write finishes it)

    def _lean_released(
        self, c: Conn, row: Any, update: Update, waiter: dict[str, Any], now: float
    ) -> CommitResult:
        """The rest of ``Sql.release_lite`` (SQLite), once its ``UPDATE`` released the run
        (``row``): its events, then the key's oldest waiter, handed the slot (admitted and
        leased to ``Notify.claim_owner``) when it is free to take, else woken. The same
        decision as ``plan_release`` over the key's rows, read under SQLite's write lock; a
        waiter whose history this code cannot read is woken, not handed."""
        sql = self._sql
        run_id = row[0]
        n = len(update.events)
        last = int(row[LAST_SEQ])
        self._append(c, run_id, last - n + 1, update.events)
        new = sql.to_run(row)
        seqs = tuple(range(last - n + 1, last + 1))
        found = c.all(sql.release_waiter, waiter)
        k = len(RUN_COLS)
        if not found or not found[0][k + 1]:  # no waiter, or the slot is not free
            return CommitResult(new, seqs)
        w = found[0]
        rn = update.notify
        assert rn is not None
        if w[k]:  # handable: not leased, not blocked
            try:
                to_event = sql.to_event
                evs = tuple(to_event(r[k + 2], r[k + 3]) for r in found if r[k + 2] is not None)
            except Exception:
                log.warning("not handing over %s: its history cannot be read", w[0], exc_info=True)
            else:
                params = {
                    "id": w[0],
                    "tags": dumps([*sql.loads(w[_TAGS]), ADMITTED_TAG]),
                    "admitted": True,
                    "owner": rn.claim_owner,
                    "until": rn.lease_expires,
                    "now": now,
                }
                handed = c.returning(sql.hand_off, params)
                if handed is not None:
                    adm = self._admitted(c, handed, rn.tag, now)
                    hand = HandOff(sql.to_run(handed), (*evs, adm))
                    return CommitResult(new, seqs, (), (hand,))
        c.write(sql.wake_waiter, {"id": w[0], "now": now})
        c.wakeup(w[_NAMESPACE])
        return CommitResult(new, seqs, (w[0],))

    def _hand_off(
        self,
        c: Conn,
        waiter: Run,
        admitted: Run,
        now: float,
        joined: list[tuple[str, dict[str, Any]]] | None = None,
    ) -> HandOff | _PendingHandOff | None:
        """Apply a planned hand-off if the waiter is still free to take (not leased, not
        cancelling, not admitted: on PostgreSQL another process's poller may have claimed it
        since it was read), with its history; ``None`` on a miss.

        The conditional update and the history read share a round trip. On PostgreSQL they
        are one statement, queued (``_PendingHandOff``): a group commit sends every release's
        hand-off in one round trip, a release alone with its ``COMMIT``; a miss is woken
        after the ``COMMIT``. ``joined``: the releasing call's own writes, not yet queued
        (``Sql.joined``): they become part of the hand-off's statement. A history this code
        cannot read (a newer flowkit's event, a
        damaged row) must not fail the holder's release: the hand-off is then undone
        (``None``: the waiter is woken instead)."""
        sql = self._sql
        tag = next(t for t in admitted.tags if t.startswith(SINGLETON_TAG_PREFIX))
        params = {
            "id": admitted.id,
            "tags": dumps(list(admitted.tags)),
            "admitted": True,
            "owner": admitted.lease_owner,
            "until": admitted.lease_expires,
            "now": now,
            "adm": sql.admitted_body(tag, now),
        }
        if c.can_pipeline and not c.committed:
            pending = _PendingHandOff(self, waiter, now)
            if joined:  # the releasing run's writes go with it: one statement for all
                q, params = sql.joined([*joined, (sql.hand_off, params)], handing=True)
                joined.clear()
                c.later(q, params, into=pending.updated)
            else:
                c.later(sql.hand_off_history, params, into=pending.updated)
            return pending
        found, updated = c.reads(
            [(sql.load_events, self._params(id=admitted.id)), (sql.hand_off, params)],
            wrote=True,
        )
        if not updated:
            return None
        handed = sql.to_run(updated[0])
        try:
            to_event = sql.to_event
            evs = tuple(to_event(seq, body) for seq, body in found if seq is not None)
        except Exception:
            log.warning(
                "not handing over %s: its history cannot be read", admitted.id, exc_info=True
            )
            # as it was, before the hand-off (whose seq it gives back)
            self._write_changes(c, handed, waiter, last_seq=int(updated[0][LAST_SEQ]) - 1)
            return None
        return HandOff(handed, (*evs, self._admitted(c, updated[0], tag, now)))

    def _admitted(self, c: Conn, row: Any, tag: str, now: float) -> Event:
        """Append a handed waiter's ``singleton_admitted`` at the seq its hand-off took."""
        seq = int(row[LAST_SEQ])
        ev = admitted_event(tag, now).model_copy(update={"seq": seq})
        self._append(c, row[0], seq, [ev])
        return ev

    def _wake_missed(self, waiter: Run, now: float) -> None:
        """After the releasing transaction committed (``_PendingHandOff``): wake a waiter
        whose hand-off missed (another process's poller took it meanwhile, or it was
        cancelled), if it is still parked. A hint: if this fails, its re-check timer stays."""
        sql = self._sql

        def woke(c: Conn, n: Any) -> None:
            if n:
                c.wakeup(waiter.namespace)

        first = (sql.wake_waiter, {"id": waiter.id, "now": now}, ROWCOUNT)
        try:
            self._db.run_write(Op(woke, first, waiter.id))
        except Exception:
            log.warning("waking %s after a missed hand-off failed", waiter.id, exc_info=True)

    def _undo_hand_off(self, handed: Run, waiter: Run, now: float) -> bool:
        """After the releasing transaction committed (``_PendingHandOff``): give a handed
        waiter whose history cannot be read back its parked state, woken, in a transaction
        of its own, if it is still as the hand-off left it. Whether it was undone."""
        sql = self._sql

        def undo(c: Conn, row: Any) -> bool:
            if row is None:
                return False
            current = sql.to_run(row)
            if (current.lease_owner, current.status) != (handed.lease_owner, RunStatus.RUNNING):
                return False  # (changed since: a cancel request; leave it to its holder)
            self._write_changes(c, current, waiter)
            # its singleton_admitted goes with the hand-off (nothing was appended after it)
            seq = int(row[LAST_SEQ])
            if c.write(sql.drop_admitted, {"id": waiter.id, "seq": seq}):
                c.write(sql.unbump, {"id": waiter.id, "seq": seq})
            c.write(sql.wake_waiter, {"id": waiter.id, "now": now})
            c.wakeup(waiter.namespace)
            return True

        first = (sql.get_run_locked, self._params(id=handed.id), SELECT)
        return self._db.run_write(Op(undo, first, handed.id))

    async def due_runs(
        self, now: float, limit: int, workflows: Sequence[str] | None = None
    ) -> list[str]:
        sql = self._sql
        if workflows is None:
            q, params = sql.due_runs, self._params(now=now, limit=limit)
        else:
            wfs = sql.in_list_param(workflows)
            q, params = sql.due_runs_of, self._params(now=now, limit=limit, wfs=wfs)

        def op(c: Conn) -> list[Run]:
            return [sql.to_run(r) for r in c.all(q, params)]

        found = [r for r in await self._db.read(op) if claimable(r, now)]
        found.sort(key=lambda r: (due_time(r) or 0.0, r.created_at, r.id))
        return [r.id for r in found]

    async def next_due_at(self, exclude_lease_owners: Sequence[str] = ()) -> float | None:
        sql = self._sql
        skip = [o for o in exclude_lease_owners if o]
        if skip:
            q, params = sql.next_due_skip, self._params(skip=sql.in_list_param(skip))
        else:
            q, params = sql.next_due, self._params()
        return await self._next_due(q, params)

    async def next_due_after(
        self, now: float, exclude_lease_owners: Sequence[str] = ()
    ) -> float | None:
        sql = self._sql
        skip = [o for o in exclude_lease_owners if o]
        if skip:
            q = sql.next_due_after_skip
            params = self._params(now=now, skip=sql.in_list_param(skip))
        else:
            q, params = sql.next_due_after, self._params(now=now)
        return await self._next_due(q, params)

    async def _next_due(self, q: str, params: dict[str, Any]) -> float | None:
        sql = self._sql

        def op(c: Conn) -> Any:
            return c.one(q, params)

        row = await self._db.read(op)
        return None if row is None else due_time(sql.to_run(row))

    async def deliver_signal(self, run_id: str, name: str, payload: Any, now: float) -> Run:
        sql = self._sql
        params = self._params(id=run_id, name=name, now=now, payload=dumps(payload))
        both = self._pg

        def rest(c: Conn, row: Any) -> Run:
            # the conditional UPDATE made it due now if suspended waiting for `name` (it also
            # locks the row, ordering this with the run's commits)
            if row is None:
                raise RunNotFoundError(run_id)
            if not both:
                c.write(sql.insert_signal, params)
            run = sql.to_run(row)
            _wake_if_free(c, run, now)  # it waited for this signal (or nobody holds it)
            return run

        stmt = sql.deliver_and_insert if both else sql.deliver
        single = _hit if both else None
        return await self._db.write(Op(rest, (stmt, params, RETURNING), run_id, single=single))

    async def peek_signal(self, run_id: str, name: str) -> InboxSignal | None:
        sql = self._sql

        def op(c: Conn) -> Any:
            return c.one(sql.peek_signal, {"id": run_id, "name": name})

        row = await self._db.read(op)
        return None if row is None else InboxSignal(int(row[0]), row[1], sql.loads(row[2]))

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
        *,
        admitted_at: float | None = None,
    ) -> bool:
        _sg.check_limit(limit)  # (before the transaction: a limit of 0 would park the run)

        def op(c: Conn, found: Any) -> bool:
            # 1. serialize competing claims of this key (PostgreSQL, ``Op.locks``; SQLite
            #    holds its write lock already), 2. lock our own row against a concurrent
            #    cancel, 3. read only the active runs of this key (2 and 3 are one statement,
            #    sent with 1), 4. decide with the shared helpers and persist (the write goes
            #    out with the COMMIT).
            row, sharing = self._split(found, tag)
            if row is None:
                raise RunNotFoundError(run_id)
            run = self._sql.to_run(row)
            tags = _sg.admission_tags(sharing, run_id, tag, workflow, limit)
            if tags is not None:
                if list(run.tags) != tags:
                    new = dataclasses.replace(run, tags=tuple(tags))
                    if admitted_at is not None and ADMITTED_TAG not in run.tags:
                        seq = int(row[LAST_SEQ]) + 1  # its singleton_admitted, with the marker
                        self._write_changes(c, run, new, later=True, last_seq=seq)
                        self._append(c, run_id, seq, [admitted_event(tag, admitted_at)], later=True)
                    else:
                        self._write_changes(c, run, new, later=True)
                return True
            patch = _sg.denial_patch(sharing, run_id, tag, workflow, retry_wake_at)
            if patch:
                self._write_changes(c, run, dataclasses.replace(run, **patch), later=True)
            return False

        first = (*self._sql.locked_with_sharing(run_id, workflow, tag, limit), ROWS)
        return await self._db.write(Op(op, first, run_id, locks=self._key_locks(workflow, tag)))


class _PendingHandOff:
    """A hand-off whose statement was queued (PostgreSQL): the conditional update with the
    waiter's history, read once the releasing transaction committed."""

    __slots__ = ("now", "store", "updated", "waiter")

    def __init__(self, store: SqlStore, waiter: Run, now: float) -> None:
        self.store = store
        self.waiter = waiter
        self.now = now
        self.updated: list[Any] = []  # [(rows, rowcount)] once run

    def finish(self) -> HandOff | str:
        """The hand-off, or the waiter's id when it was only woken."""
        store, waiter, sql = self.store, self.waiter, self.store._sql
        rows = self.updated[0][0]
        if not rows:  # a miss: wake it, if it is still parked
            store._wake_missed(waiter, self.now)
            return waiter.id
        handed = sql.to_run(rows[0])
        try:
            to_event = sql.to_event
            k = len(RUN_COLS)  # (each row: the run's columns, then an event's seq and body)
            evs = tuple(to_event(r[k], r[k + 1]) for r in rows if r[k] is not None)
        except Exception:
            log.warning("not handing over %s: its history cannot be read", waiter.id, exc_info=True)
            if store._undo_hand_off(handed, waiter, self.now):
                return waiter.id
            raise
        return HandOff(handed, evs)


__all__ = ["SqlStore"]
