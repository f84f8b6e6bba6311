"""``SqlStore``: the store on SQLAlchemy 2 Core, for SQLite files and PostgreSQL.

Why a sync engine, called inline from the ``async`` methods: every method is one short
transaction, and running it on the event loop's thread (no ``to_thread``, no async driver) keeps
each call atomic with respect to the other coroutines of the process, exactly like
``MemoryStore``, and keeps ``flowkit_testing.TestEnv`` deterministic (its ``settle()`` sees no
half-finished database call parked in a thread pool). The price is that the loop is blocked for
the duration of a transaction (sub-millisecond on SQLite, one round trip or a few on
PostgreSQL), which is what a durable store costs anyway.

Concurrency between processes is the database's job (see ``_engine`` for the SQLite and
PostgreSQL setup): every read-then-write runs in one transaction that first serializes its
competitors (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: the key's advisory lock, then row locks).
``claim`` is one conditional ``UPDATE ... WHERE <claimable> RETURNING``; ``commit`` locks the run
row (``SELECT ... FOR UPDATE``) before it checks the lease owner. Lock order is always advisory
lock, then row locks, so these transactions cannot deadlock each other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ... import singleton as _sg
from ..._history import Event
from ..._run import Run, RunStatus
from ...errors import (
    LeaseLostError,
    RunIdTakenError,
    RunNotFoundError,
    SingletonQueueFullError,
)
from ..base import CommitResult, ConflictError, InboxSignal, QueueCap, Update
from ..memory import apply_update, claimable, due_time
from . import _rows as rows
from ._engine import Database
from ._schema import events, runs, signals

R = runs.c


_INSERT_EVENTS = sa.insert(events)
_INSERT_RUN = sa.insert(runs)
_ANY_RUN = sa.select(runs).where(runs.c.id == sa.bindparam("run_id"))  # in any namespace


class SqlStore:
    """A durable store on SQLAlchemy 2 (see ``flowkit.stores.base.Store`` for the contract).

    ``url`` is ``sqlite:///path/to/file.db`` (safe for several processes on one file) or
    ``postgresql+psycopg://user:pw@host/db`` (many workers on many hosts). The schema is
    created on first use. ``namespace`` scopes the store like ``MemoryStore(namespace)``."""

    def __init__(
        self, url: str, *, namespace: str | None = None, _db: Database | None = None
    ) -> None:
        self._db = _db if _db is not None else Database(url)
        self.url = url
        self.namespace = namespace
        self._dialect = self._db.dialect
        self._tx = self._db.tx
        # Built once: the hot statements skip construction and cache-key work on every call.
        self._q_run = sa.select(runs).where(
            R.id == sa.bindparam("run_id"), rows.visible(self.namespace)
        )
        self._q_run_locked = self._q_run.with_for_update()
        now = sa.bindparam("now", type_=R.updated_at.type)
        self._claim_stmt = (
            sa.update(runs)
            .where(
                R.id == sa.bindparam("run_id"),
                rows.visible(self.namespace),
                rows.claimable_sql(now),
            )
            .values(
                status=sa.case(
                    (R.status == RunStatus.CANCELLING.value, R.status),
                    else_=RunStatus.RUNNING.value,
                ),
                wake_at=None,
                lease_owner=sa.bindparam("owner"),
                lease_expires=sa.bindparam("until", type_=R.lease_expires.type),
                updated_at=now,
            )
            .returning(*runs.c)
        )
        self._renew_stmt = (
            sa.update(runs)
            .where(
                R.id == sa.bindparam("run_id"),
                R.lease_owner == sa.bindparam("owner"),
                R.status.in_(rows.ACTIVE),
            )
            .values(lease_expires=sa.bindparam("until", type_=R.lease_expires.type))
            .returning(*runs.c)
        )

    def scoped(self, namespace: str) -> SqlStore:
        """A view over the same database that reads and writes only ``namespace``."""
        return SqlStore(self.url, namespace=namespace, _db=self._db)

    def close(self) -> None:
        """Close pooled connections (shared with scoped views)."""
        self._db.dispose()

    def __repr__(self) -> str:
        return f"SqlStore({self._db.shown_url!r}, namespace={self.namespace!r})"

    # -- helpers ----------------------------------------------------------------------
    def _fetch(self, conn: sa.Connection, run_id: str, *, lock: bool = False) -> Run | None:
        row = self._fetch_row(conn, run_id, lock=lock)
        return None if row is None else rows.to_run(row)

    def _fetch_row(
        self, conn: sa.Connection, run_id: str, *, lock: bool = False
    ) -> sa.Row[Any] | None:
        q = self._q_run_locked if lock else self._q_run
        return conn.execute(q, {"run_id": run_id}).first()

    def _get(self, conn: sa.Connection, run_id: str, *, lock: bool = False) -> Run:
        run = self._fetch(conn, run_id, lock=lock)
        if run is None:
            raise RunNotFoundError(run_id)
        return run

    def _write(self, conn: sa.Connection, old: Run, new: Run, **extra: Any) -> None:
        changes = rows.changed_values(old, new) | extra
        if changes:
            conn.execute(sa.update(runs).where(R.id == old.id).values(**changes))

    def _sharing(self, conn: sa.Connection, workflow: str, tag: str) -> list[Run]:
        q = rows.sharing_sql(self._dialect, workflow, tag, self.namespace)
        return [r for r in map(rows.to_run, conn.execute(q)) if tag in r.tags]

    def _append(
        self, conn: sa.Connection, run_id: str, last_seq: int, evs: Sequence[Event]
    ) -> tuple[int, ...]:
        """Insert ``evs`` after ``last_seq`` (read from the locked run row); the primary key
        ``(run_id, seq)`` still refuses a second writer of the same position."""
        if not evs:
            return ()
        new_rows = rows.event_rows(run_id, last_seq + 1, evs)
        conn.execute(_INSERT_EVENTS, new_rows)
        return tuple(r["seq"] for r in new_rows)

    # -- the contract ------------------------------------------------------------------
    async def create_run(
        self, run: Run, events: Sequence[Event], *, queue_cap: QueueCap | None = None
    ) -> tuple[Run, bool]:
        try:
            with self._tx() as conn:
                if queue_cap is not None:
                    self._db.lock_key(conn, queue_cap.workflow, queue_cap.tag)
                row = conn.execute(_ANY_RUN, {"run_id": run.id}).first()
                if row is not None:
                    return self._existing(row), False
                if queue_cap is not None:
                    count = len(self._sharing(conn, queue_cap.workflow, queue_cap.tag))
                    if count >= queue_cap.capacity:
                        raise SingletonQueueFullError(
                            queue_cap.workflow,
                            queue_cap.key,
                            queue_cap.max_queue_depth,
                            queue_cap.limit,
                        )
                if self.namespace is not None and run.namespace is None:
                    run = dataclasses.replace(run, namespace=self.namespace)
                conn.execute(_INSERT_RUN, {**rows.run_values(run), "last_seq": len(events)})
                self._append(conn, run.id, 0, events)
        except sa.exc.IntegrityError:
            # A concurrent create of the same id won the insert (PostgreSQL): idempotent.
            with self._tx(write=False) as conn:
                row = conn.execute(_ANY_RUN, {"run_id": run.id}).first()
            if row is None:
                raise
            return self._existing(row), False
        return run, True

    def _existing(self, row: sa.Row[Any]) -> Run:
        """``create_run`` of an id that exists: idempotent here, taken in another namespace."""
        run = rows.to_run(row)
        if self.namespace is not None and run.namespace != self.namespace:
            raise RunIdTakenError(run.id)
        return run

    async def get_run(self, run_id: str) -> Run | None:
        with self._tx(write=False) as conn:
            return self._fetch(conn, run_id)

    async def list_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        limit: int | None = None,
    ) -> list[Run]:
        q = sa.select(runs).where(rows.visible(self.namespace))
        if workflow is not None:
            q = q.where(R.workflow == workflow)
        if status is not None:
            q = q.where(R.status == RunStatus(status).value)
        if tag is not None:
            q = q.where(rows.has_tag_sql(self._dialect, tag))
        q = q.order_by(R.created_at, R.id)
        if limit is not None:
            q = q.limit(limit)
        with self._tx(write=False) as conn:
            out = [rows.to_run(r) for r in conn.execute(q)]
        return out if tag is None else [r for r in out if tag in r.tags]

    async def load_events(self, run_id: str) -> list[Event]:
        with self._tx(write=False) as conn:
            self._get(conn, run_id)
            q = sa.select(events).where(events.c.run_id == run_id).order_by(events.c.seq)
            return [rows.to_event(r) for r in conn.execute(q)]

    async def claim(self, run_id: str, owner: str, now: float, lease_expires: float) -> Run | None:
        params = {"run_id": run_id, "owner": owner, "until": lease_expires, "now": now}
        with self._tx() as conn:
            row = conn.execute(self._claim_stmt, params).first()
        return None if row is None else rows.to_run(row)

    async def renew_lease(self, run_id: str, owner: str, lease_expires: float) -> Run | None:
        params = {"run_id": run_id, "owner": owner, "until": lease_expires}
        with self._tx() as conn:
            row = conn.execute(self._renew_stmt, params).first()
        return None if row is None else rows.to_run(row)

    async def commit(
        self, run_id: str, owner: str | None, now: float, update: Update
    ) -> CommitResult:
        n = update.notify
        with self._tx() as conn:
            if n is not None:  # advisory lock before any row lock: the admission lock order
                self._db.lock_key(conn, n.workflow, n.tag)
            row = self._fetch_row(conn, run_id, lock=True)
            if row is None:
                raise RunNotFoundError(run_id)
            run = rows.to_run(row)
            last_seq = int(row._mapping["last_seq"])
            if owner is not None:
                if run.lease_owner != owner:
                    raise LeaseLostError(run_id)
            elif not update.ignore_lease and run.leased(now):
                raise ConflictError(f"run {run_id!r} is leased by {run.lease_owner!r}")
            if update.expect_status is not None and run.status not in update.expect_status:
                raise ConflictError(f"run {run_id!r} is {run.status}")
            if update.consume_signal is not None:
                gone = conn.execute(
                    sa.delete(signals).where(
                        signals.c.id == update.consume_signal, signals.c.run_id == run_id
                    )
                )
                if gone.rowcount != 1:
                    raise ConflictError(f"signal #{update.consume_signal} already consumed")
            names: set[str] = set()
            if update.waiting_signals:
                names = set(
                    conn.execute(
                        sa.select(signals.c.name)
                        .distinct()
                        .where(
                            signals.c.run_id == run_id,
                            signals.c.name.in_(list(update.waiting_signals)),
                        )
                    ).scalars()
                )
            new = apply_update(run, update, now, inbox_names=names)
            if update.events:
                self._write(conn, run, new, last_seq=last_seq + len(update.events))
            else:
                self._write(conn, run, new)
            seqs = self._append(conn, run_id, last_seq, update.events)
            woken: list[str] = []
            if n is not None:
                sharing = self._sharing(conn, n.workflow, n.tag)
                for wid in _sg.waiters_to_wake(sharing, n.tag, n.workflow, n.limit):
                    conn.execute(
                        sa.update(runs)
                        .where(R.id == wid, R.status == RunStatus.SUSPENDED.value)
                        .values(wake_at=now)
                    )
                    woken.append(wid)
        return CommitResult(new, seqs, tuple(woken))

    async def due_runs(
        self, now: float, limit: int, workflows: Sequence[str] | None = None
    ) -> list[str]:
        due = rows.due_time_sql()
        q = sa.select(runs).where(rows.visible(self.namespace), rows.claimable_sql(now))
        if workflows is not None:
            q = q.where(R.workflow.in_(list(workflows)))
        q = q.order_by(due, R.created_at, R.id).limit(limit)
        with self._tx(write=False) as conn:
            found = [rows.to_run(r) for r in conn.execute(q)]
        found = [r for r in found if claimable(r, now)]
        found.sort(key=lambda r: (due_time(r) or 0.0, r.created_at, r.id))
        return [r.id for r in found]

    async def next_due_at(self, exclude_lease_owners: Sequence[str] = ()) -> float | None:
        due = rows.due_time_sql()
        q = sa.select(runs).where(
            rows.visible(self.namespace), R.status.in_(rows.ACTIVE), due.is_not(None)
        )
        skip = [o for o in exclude_lease_owners if o]
        if skip:
            q = q.where(sa.or_(R.lease_owner.is_(None), R.lease_owner.not_in(skip)))
        with self._tx(write=False) as conn:
            row = conn.execute(q.order_by(due).limit(1)).first()
        return None if row is None else due_time(rows.to_run(row))

    async def deliver_signal(self, run_id: str, name: str, payload: Any, now: float) -> Run:
        with self._tx() as conn:
            run = self._get(conn, run_id, lock=True)
            conn.execute(sa.insert(signals).values(run_id=run_id, name=name, payload=payload))
            if run.status is RunStatus.SUSPENDED and name in run.waiting_signals:
                new = dataclasses.replace(run, wake_at=now, updated_at=now)
                self._write(conn, run, new)
                run = new
        return run

    async def peek_signal(self, run_id: str, name: str) -> InboxSignal | None:
        q = (
            sa.select(signals)
            .where(signals.c.run_id == run_id, signals.c.name == name)
            .order_by(signals.c.id)
            .limit(1)
        )
        with self._tx(write=False) as conn:
            row = conn.execute(q).first()
        return None if row is None else InboxSignal(row.id, row.name, row.payload)

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
    ) -> bool:
        with self._tx() as conn:
            # 1. serialize competing claims of this key (PostgreSQL; SQLite holds its write
            #    lock already), 2. lock our own row against a concurrent cancel, 3. read only
            #    the active runs of this key, 4. decide with the shared helpers and persist.
            self._db.lock_key(conn, workflow, tag)
            run = self._get(conn, run_id, lock=True)
            sharing = self._sharing(conn, workflow, tag)
            tags = _sg.admission_tags(sharing, run_id, tag, workflow, limit)
            if tags is not None:
                if list(run.tags) != tags:
                    self._write(conn, run, dataclasses.replace(run, tags=tuple(tags)))
                return True
            patch = _sg.denial_patch(sharing, run_id, tag, workflow, retry_wake_at)
            if patch:
                self._write(conn, run, dataclasses.replace(run, **patch))
            return False


__all__ = ["SqlStore"]
