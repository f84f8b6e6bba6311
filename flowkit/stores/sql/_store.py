"""``SqlStore``: the store on SQLAlchemy 2 Core, for SQLite files and PostgreSQL.

Why a sync engine, called inline from the ``async`` methods: every method is one short
transaction, and running it on the event loop's thread (no ``to_thread``, no async driver) keeps
each call atomic with respect to the other coroutines of the process, exactly like
``MemoryStore``, and keeps ``flowkit_testing.TestEnv`` deterministic (its ``settle()`` sees no
half-finished database call parked in a thread pool). The price is that the loop is blocked for
the duration of a transaction (sub-millisecond on SQLite, one round trip or a few on
PostgreSQL), which is what a durable store costs anyway.

Concurrency between processes is the database's job:

* SQLite: WAL mode, a busy timeout, and ``BEGIN IMMEDIATE`` for every transaction that may
  write. Admission (and every other read-then-write) thereby takes the database's write lock
  *before* it reads, so two processes can never both read "slot free" and both write "admitted".
  Pure reads use a deferred ``BEGIN`` and never wait for writers (WAL snapshots).
* PostgreSQL (READ COMMITTED): admission of one key, and a ``create_run`` with a queue cap, take
  ``pg_advisory_xact_lock(hashtextextended('workflow:key', 0))`` first, so competing claims of a
  key are serialized inside one transaction while different keys never wait for each other.
  ``claim`` is one conditional ``UPDATE ... WHERE <claimable> RETURNING``; ``commit`` locks the
  run row (``SELECT ... FOR UPDATE``) before it checks the lease owner. Lock order is always
  advisory lock, then row locks, so these transactions cannot deadlock each other.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
import sqlalchemy as sa

from ... import singleton as _sg
from ..._history import Event
from ..._run import Run, RunStatus
from ...errors import LeaseLostError, RunNotFoundError, SingletonQueueFullError
from ..base import CommitResult, ConflictError, InboxSignal, QueueCap, Update
from ..memory import _claimable, _due_time, apply_update
from . import _rows as rows
from ._schema import (
    StoreUnavailableError,
    UnsupportedDatabaseError,
    ensure_schema,
    events,
    runs,
    signals,
)

R = runs.c
SQLITE_BUSY_TIMEOUT_MS = 30_000
_READ_ONLY = "flowkit_read_only"
_DRIVERS = {"sqlite": ("pysqlite",), "postgresql": ("psycopg", "psycopg2")}


def _json_dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def _setup_sqlite(engine: sa.Engine) -> None:
    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module: it would otherwise BEGIN
        # lazily (deferred, and only before DML); we emit our own BEGIN in "begin" below.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        try:
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA journal_mode = WAL")  # readers never block the writer
        finally:
            cur.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        # BEGIN IMMEDIATE takes the write lock before the first read: admission, commit and
        # claim read state and then write based on it, and with a deferred BEGIN two processes
        # could both read the same "free slot" before either writes. Lock waits are bounded by
        # busy_timeout. Read-only transactions keep a deferred BEGIN (a WAL snapshot).
        read_only = conn.get_execution_options().get(_READ_ONLY, False)
        conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")


def create_engine(url: str) -> sa.Engine:
    """A SQLAlchemy engine for a supported URL, or ``UnsupportedDatabaseError``."""
    try:
        u = sa.engine.make_url(url)
    except sa.exc.ArgumentError:
        raise UnsupportedDatabaseError(f"not a database URL: {url!r}") from None
    backend, driver = u.get_backend_name(), u.get_driver_name()
    if backend not in _DRIVERS or driver not in _DRIVERS[backend]:
        raise UnsupportedDatabaseError(
            f"SqlStore supports sqlite:///path and postgresql+psycopg://..., "
            f"not {u.drivername!r} (URL {u.render_as_string(hide_password=True)!r})"
        )
    kwargs: dict[str, Any] = {"json_serializer": _json_dumps, "json_deserializer": orjson.loads}
    if backend == "postgresql":
        kwargs["pool_pre_ping"] = True
    try:
        engine = sa.create_engine(u, **kwargs)
    except (ImportError, sa.exc.NoSuchModuleError) as exc:
        hint = " (pip install 'flowkit[postgres]')" if backend == "postgresql" else ""
        raise UnsupportedDatabaseError(
            f"cannot load the database driver for {u.drivername!r}: {exc}{hint}"
        ) from exc
    if backend == "sqlite":
        _setup_sqlite(engine)
    return engine


@dataclasses.dataclass
class _Shared:
    """What scoped views of one store share: the engine and the schema check."""

    engine: sa.Engine
    schema_ready: bool = False
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


class SqlStore:
    """A durable store on SQLAlchemy 2 (see ``flowkit.stores.base.Store`` for the contract).

    ``url`` is ``sqlite:///path/to/file.db`` (safe for several processes on one file) or
    ``postgresql+psycopg://user:pw@host/db`` (many workers on many hosts). The schema is
    created on first use. ``namespace`` scopes the store like ``MemoryStore(namespace)``."""

    def __init__(self, url: str, *, namespace: str | None = None, _shared: Any = None) -> None:
        self._shared: _Shared = _shared if _shared is not None else _Shared(create_engine(url))
        self.url = url
        self.namespace = namespace
        self._dialect = self._shared.engine.dialect.name

    def scoped(self, namespace: str) -> SqlStore:
        """A view over the same database that reads and writes only ``namespace``."""
        return SqlStore(self.url, namespace=namespace, _shared=self._shared)

    def close(self) -> None:
        """Close pooled connections (shared with scoped views)."""
        self._shared.engine.dispose()

    def __repr__(self) -> str:
        shown = self._shared.engine.url.render_as_string(hide_password=True)
        return f"SqlStore({shown!r}, namespace={self.namespace!r})"

    # -- transactions ------------------------------------------------------------------
    def _connect(self) -> sa.Connection:
        try:
            return self._shared.engine.connect()
        except sa.exc.DBAPIError as exc:
            shown = self._shared.engine.url.render_as_string(hide_password=True)
            raise StoreUnavailableError(
                f"cannot connect to the flowkit database {shown}: {exc.orig}"
            ) from exc

    def _ensure_schema(self) -> None:
        sh = self._shared
        if sh.schema_ready:
            return
        with sh.lock:
            if sh.schema_ready:
                return
            with self._connect() as conn, conn.begin():
                ensure_schema(conn)
            sh.schema_ready = True

    @contextmanager
    def _tx(self, *, write: bool = True) -> Iterator[sa.Connection]:
        """One transaction; ``write`` ones take SQLite's write lock up front."""
        self._ensure_schema()
        with self._connect() as conn:
            if not write:
                conn.execution_options(**{_READ_ONLY: True})
            with conn.begin():
                yield conn

    def _lock_key(self, conn: sa.Connection, workflow: str, tag: str) -> None:
        """Serialize admission-related work on one singleton key (PostgreSQL; on SQLite
        ``BEGIN IMMEDIATE`` already serialized the whole transaction)."""
        if self._dialect == "postgresql":
            conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:k, 0))"),
                {"k": rows.lock_name(workflow, tag)},
            )

    def _fetch(self, conn: sa.Connection, run_id: str, *, lock: bool = False) -> Run | None:
        q = sa.select(runs).where(R.id == run_id, rows.visible(self.namespace))
        row = conn.execute(q.with_for_update() if lock else q).first()
        return None if row is None else rows.to_run(row)

    def _get(self, conn: sa.Connection, run_id: str, *, lock: bool = False) -> Run:
        run = self._fetch(conn, run_id, lock=lock)
        if run is None:
            raise RunNotFoundError(run_id)
        return run

    def _write(self, conn: sa.Connection, old: Run, new: Run) -> None:
        changes = rows.changed_values(old, new)
        if changes:
            conn.execute(sa.update(runs).where(R.id == old.id).values(**changes))

    def _sharing(self, conn: sa.Connection, workflow: str, tag: str) -> list[Run]:
        q = rows.sharing_sql(self._dialect, workflow, tag, self.namespace)
        return [r for r in map(rows.to_run, conn.execute(q)) if tag in r.tags]

    def _append(self, conn: sa.Connection, run_id: str, evs: Sequence[Event]) -> tuple[int, ...]:
        if not evs:
            return ()
        last = conn.execute(
            sa.select(sa.func.coalesce(sa.func.max(events.c.seq), 0)).where(
                events.c.run_id == run_id
            )
        ).scalar_one()
        new_rows = rows.event_rows(run_id, int(last) + 1, evs)
        conn.execute(sa.insert(events), new_rows)
        return tuple(r["seq"] for r in new_rows)

    # -- the contract ------------------------------------------------------------------
    async def create_run(
        self, run: Run, events: Sequence[Event], *, queue_cap: QueueCap | None = None
    ) -> tuple[Run, bool]:
        try:
            with self._tx() as conn:
                if queue_cap is not None:
                    self._lock_key(conn, queue_cap.workflow, queue_cap.tag)
                row = conn.execute(sa.select(runs).where(R.id == run.id)).first()
                if row is not None:
                    return rows.to_run(row), False
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
                conn.execute(sa.insert(runs).values(**rows.run_values(run)))
                self._append(conn, run.id, events)
        except sa.exc.IntegrityError:
            # A concurrent create of the same id won the insert (PostgreSQL): idempotent.
            with self._tx(write=False) as conn:
                row = conn.execute(sa.select(runs).where(R.id == run.id)).first()
            if row is None:
                raise
            return rows.to_run(row), False
        return run, True

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
        status = sa.case(
            (R.status == RunStatus.CANCELLING.value, R.status), else_=RunStatus.RUNNING.value
        )
        stmt = (
            sa.update(runs)
            .where(R.id == run_id, rows.visible(self.namespace), rows.claimable_sql(now))
            .values(
                status=status,
                wake_at=None,
                lease_owner=owner,
                lease_expires=lease_expires,
                updated_at=now,
            )
            .returning(*runs.c)
        )
        with self._tx() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else rows.to_run(row)

    async def renew_lease(self, run_id: str, owner: str, lease_expires: float) -> Run | None:
        stmt = (
            sa.update(runs)
            .where(R.id == run_id, R.lease_owner == owner, R.status.in_(rows.ACTIVE))
            .values(lease_expires=lease_expires)
            .returning(*runs.c)
        )
        with self._tx() as conn:
            row = conn.execute(stmt).first()
        return None if row is None else rows.to_run(row)

    async def commit(
        self, run_id: str, owner: str | None, now: float, update: Update
    ) -> CommitResult:
        n = update.notify
        with self._tx() as conn:
            if n is not None:  # advisory lock before any row lock: the admission lock order
                self._lock_key(conn, n.workflow, n.tag)
            run = self._get(conn, run_id, lock=True)
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
            self._write(conn, run, new)
            seqs = self._append(conn, run_id, update.events)
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
        found = [r for r in found if _claimable(r, now)]
        found.sort(key=lambda r: (_due_time(r) or 0.0, r.created_at, r.id))
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
        return None if row is None else _due_time(rows.to_run(row))

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
            self._lock_key(conn, workflow, tag)
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


__all__ = ["SqlStore", "create_engine"]
