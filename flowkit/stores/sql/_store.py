"""``SqlStore``: the store on SQLite files and PostgreSQL, its contract methods.

Each call is one function of the store's connection running prebuilt statements (``_statements``
and the dialect modules); writes go through the group commit (``_group_commit``), the commits
that decide in Python through ``_commit``; the reads are ``_reads``. How and why:
docs/stores.md, "SqlStore"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ... import singleton as _sg
from ..._core.run import ADMITTED_TAG, SINGLETON_TAG_PREFIX, Run
from ..._core.search_terms import upserts
from ...errors import RunIdTakenError, RunNotFoundError, SingletonQueueFullError
from ...events import Event
from .. import limits as _limits
from ..base import (
    Admission,
    AdmittedAt,
    CommitResult,
    GateCheck,
    QueueCap,
    Update,
    WorkflowVersions,
    admission_time,
    moves_to_successor,
)
from ..codec._mark import (
    CodecMark,
    events_carry_payload,
    run_carries_payload,
    update_carries_payload,
)
from ..rules import admit_new, admitted_event
from . import _runs as runs
from ._browse_sql import Browsing
from ._commit import Commits, wake_if_free
from ._connection import RETURNING, ROWCOUNT, ROWS, Conn
from ._database import Database, check
from ._events import Events
from ._gated_sql import GatedClaims
from ._group_commit import GroupCommit, Op
from ._marker import CodecMarked
from ._reads import Reads
from ._rows import (
    LAST_SEQ,
    dumps,
    event_params,
    lock_name,
    run_params,
    to_run,
)
from ._schedules import Schedules
from ._search_sql import Pruning, write_search
from ._workers import Workers


def _always(_result: Any) -> bool:
    """``Op.single``: the first statement is the whole call, whatever it returned."""
    return True


def _not_none(value: Any) -> bool:
    return value is not None


def _hit(row: Any) -> bool:
    """``Op.single``: the whole call when its conditional write matched its row."""
    return row is not None


class SqlStore(CodecMarked, Reads, Pruning, Browsing, Workers, Schedules, Events, GatedClaims):
    """A durable store on SQLite and PostgreSQL (see ``flowkit.stores.base.Store`` for the
    contract): ``sqlite:///path/to/file.db`` (several processes on one file) or
    ``postgresql+psycopg://user:pw@host/db`` (many workers on many hosts); the schema is
    created on first use. ``namespace`` scopes it like ``MemoryStore(namespace)``.
    ``group_commit``: concurrent writes of one event loop share transactions (``False``: each
    runs at once and never yields, as ``TestEnv`` needs); ``wakeups``: ``watch`` listens for
    other processes' wake-ups; ``stall_timeout``: seconds a call may stay stuck on its
    connection before it is abandoned with ``StoreUnavailableError`` (default 10; ``0``:
    never; also the URL's ``flowkit_stall_timeout``). All are shared with the scoped views.
    With group commit the calls run on I/O threads and the event loop never waits for the
    database. See docs/stores.md."""

    admits_on_create = True
    records_admission = True
    appends_events = True
    claims_by_version = True
    records_workers = True
    records_schemas = True  # (``put_workflow_schemas``: ``_workers.Workers``)
    continues_as_new = True  # (``Update.successor``: the general commit, ``Commits.locked``)

    def __init__(
        self,
        url: str,
        *,
        namespace: str | None = None,
        group_commit: bool = True,
        wakeups: bool = True,
        stall_timeout: float | None = None,
        max_payload_bytes: int | None = None,
        _view_of: SqlStore | None = None,
    ) -> None:
        if namespace is not None:
            _limits.check_identifier("namespace", namespace, _limits.MAX_NAMESPACE_LENGTH)
        if max_payload_bytes is None:  # (a view: its store's)
            max_payload_bytes = (
                _view_of.max_payload_bytes if _view_of else _limits.DEFAULT_MAX_PAYLOAD_BYTES
            )
        self.max_payload_bytes: int = max_payload_bytes
        """The largest payload it keeps, in bytes of JSON (docs/stores.md, "Limits")."""
        if _view_of is None:
            self._db = Database(url, wakeups=wakeups, stall_timeout=stall_timeout)
            self._gc = GroupCommit(self._db, enabled=group_commit)
        else:
            # (another ``SqlStore``, of which this one is a namespace view: it shares them)
            self._db, self._gc = _view_of._db, _view_of._gc  # noqa: SLF001
        self.url = url
        self.namespace = namespace
        self._sql = self._db.statements(namespace)
        self._commits = Commits(self._sql, self._gc)
        self._mark = CodecMark()

    @classmethod
    def check(cls, url: str) -> None:
        """That ``url`` names an existing flowkit database, checked without creating or
        writing anything (opening a ``SqlStore`` creates the tables in any database): raises
        ``UnsupportedDatabaseError``, ``StoreUnavailableError`` or
        ``NotAFlowkitDatabaseError`` (``flowkit.errors``). For tools such as the CLI."""
        check(url)

    @property
    def group_commit(self) -> bool:
        return self._gc.enabled

    @group_commit.setter
    def group_commit(self, on: bool) -> None:
        self._gc.enabled = bool(on)

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
        return SqlStore(self.url, namespace=namespace, _view_of=self)

    def close(self) -> None:
        """Close pooled connections and stop the wake-up watchers (shared with scoped views)."""
        self._db.dispose()

    def __repr__(self) -> str:
        return f"SqlStore({self._db.shown_url!r}, namespace={self.namespace!r})"

    @staticmethod
    def _key_locks(workflow: str, tag: str) -> tuple[str, ...]:
        """``Op.locks`` of a call that serializes on one singleton key."""
        return (lock_name(workflow, tag),)

    @staticmethod
    def _run_or_none(c: Conn, row: Any) -> Run | None:
        return None if row is None else to_run(row)

    # -- the contract ------------------------------------------------------------------
    async def create_run(
        self,
        run: Run,
        events: Sequence[Event],
        *,
        queue_cap: QueueCap | None = None,
        admission: Admission | None = None,
    ) -> tuple[Run, bool]:
        if not self._mark.settled:
            gated = admission.gated if admission is not None else ()
            what = f"create run {run.id!r} with a payload"
            await self._plain(what, run_carries_payload, run, [*events, *gated])
        _limits.check_run(run, events, self.max_payload_bytes)
        if self.namespace is not None and run.namespace is None:
            run = dataclasses.replace(run, namespace=self.namespace)
        if queue_cap is not None or admission is not None:
            return await self._create_keyed(run, events, queue_cap, admission)
        values = run_params(run, len(events))
        sql = self._sql
        # an existing id (even one a concurrent transaction is inserting) is no error: the
        # insert does nothing and the existing run is returned; its search rows follow it
        searched = bool(run.search)
        both = sql.CTE_WRITES and bool(events) and not searched
        if both:  # PostgreSQL: the run and its events in one statement (one round trip)
            event_params(values, 1, events)
            first = (sql.create_with_events(len(events)), values, ROWCOUNT)
        else:
            first = (sql.insert_run_new, values, ROWCOUNT)

        def rest(c: Conn, inserted: int) -> tuple[Run, bool]:
            if not inserted:
                return self._existing(c, run.id), False
            if not both:
                runs.append(sql, c, run.id, 1, events)
            if searched:
                write_search(sql, c, run.id, run.search, replace=False)
            self._created(c, run)
            return run, True

        # (without events, ``rest`` only reads: one statement on every dialect)
        single = _always if (both or not events) and not searched else None
        return await self._gc.write(Op(rest, first, run.id, single=single))

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
        (``rules.admit_new``), 4. insert the run and its events (they go out with the
        ``COMMIT``: the second and last round trip)."""
        sql = self._sql
        keyed = [k for k in (cap, admission) if k is not None]
        locks = sorted({lock_name(k.workflow, k.tag) for k in keyed})
        # a singleton admission reads the key's holders and its ``limit`` oldest waiters
        # only (``locked_with_sharing``: all that decides about a new run, however deep the
        # queue); another tag's reads all its runs, and counts them for the cap too
        short = admission is not None and admission.tag.startswith(SINGLETON_TAG_PREFIX)
        counted = (
            admission is not None
            and not short
            and (cap is None or (cap.workflow, cap.tag) == (admission.workflow, admission.tag))
        )
        stmts: list[tuple[str, Any]] = [(sql.get_any_run, {"id": run.id})]
        if cap is not None and not counted:
            stmts.append(self._count_stmt(cap))
        if admission is not None and short:
            wf, tag = admission.workflow, admission.tag
            stmts.append(sql.locked_with_sharing(run.id, wf, tag, admission.limit))
        elif admission is not None:
            stmts.append(sql.sharing(admission.workflow, admission.tag))

        def op(c: Conn, _: None) -> tuple[Run, bool]:
            # (the key locks, declared below, went out with these reads: one round trip)
            got = c.reads(stmts)
            if got[0]:
                return self._existing_row(got[0][0]), False
            sharing: list[Run] = []
            if admission is not None and short:
                sharing = runs.split(got[-1], admission.tag)[1]
            elif admission is not None:
                sharing = [r for r in map(to_run, got[-1]) if admission.tag in r.tags]
            if cap is not None:
                n = len(sharing) if counted else self._count_of(cap, got[1])
                if n >= cap.capacity:
                    raise SingletonQueueFullError(
                        cap.workflow, cap.key, cap.max_queue_depth, cap.limit
                    )
            stored, evs = run, list(events)
            if admission is not None:
                stored, evs = admit_new(run, events, admission, sharing)
            c.later(sql.insert_run, run_params(stored, len(evs)))
            runs.append(sql, c, stored.id, 1, evs, later=True)
            if stored.search:
                write_search(sql, c, stored.id, stored.search, replace=False)
            self._created(c, stored)
            return stored, True

        return await self._gc.write(Op(op, None, run.id, locks=tuple(locks)))

    @staticmethod
    def _created(c: Conn, run: Run) -> None:
        """A new run nobody holds (a client's start) is claimable: wake the workers."""
        wake_if_free(c, run, run.updated_at)

    def _count_stmt(self, cap: QueueCap) -> tuple[str, Any]:
        """The statement counting the active runs sharing ``cap``'s tag (``_count_of``)."""
        if cap.tag.startswith(SINGLETON_TAG_PREFIX):
            params = self._sql.params(wf=cap.workflow, key=cap.tag[len(SINGLETON_TAG_PREFIX) :])
            return self._sql.count_key, params
        return self._sql.sharing(cap.workflow, cap.tag)

    def _count_of(self, cap: QueueCap, found: list[Any]) -> int:
        """The count from the rows of ``_count_stmt``."""
        if cap.tag.startswith(SINGLETON_TAG_PREFIX):
            return int(found[0][0])
        return sum(cap.tag in r.tags for r in map(to_run, found))

    def _existing(self, c: Conn, run_id: str) -> Run:
        row = c.one(self._sql.get_any_run, {"id": run_id})
        if row is None:  # pragma: no cover - the insert conflicted with a committed row
            raise RunNotFoundError(run_id)
        return self._existing_row(row)

    def _existing_row(self, row: Any) -> Run:
        """``create_run`` of an id that exists: idempotent here, taken in another namespace."""
        run = to_run(row)
        if self.namespace is not None and run.namespace != self.namespace:
            raise RunIdTakenError(run.id)
        return run

    async def claim(
        self,
        run_id: str,
        owner: str,
        now: float,
        lease_expires: float,
        *,
        versions: WorkflowVersions | None = None,
        gate: GateCheck | None = None,
    ) -> Run | None:
        if not self._mark.settled:
            await self._plain(f"claim run {run_id!r} (running it needs its payloads)", bool, True)
        params = self._sql.params(id=run_id, owner=owner, until=lease_expires, now=now)
        q = self._sql.claim
        if versions is not None:
            q = self._sql.claim_of
            self._sql.versions_params(params, "vers", sorted(set(versions)))
        if gate is not None:  # (a gated waiter's re-check decided in the claim: ``_gated_sql``)
            return await self._claim_gated(q, params, gate, versions)
        first = (q, params, RETURNING)
        return await self._gc.write(Op(self._run_or_none, first, run_id, single=_always))

    async def release_leases(self, owner: str, now: float) -> list[str]:
        params = self._sql.params(owner=owner, now=now)
        q = self._sql.release_owned

        def op(c: Conn, _: None) -> list[str]:
            return sorted(str(r[0]) for r in c.all(q, params))

        return await self._gc.write(Op(op, None, owner))

    async def renew_lease(self, run_id: str, owner: str, lease_expires: float) -> Run | None:
        params = self._sql.params(id=run_id, owner=owner, until=lease_expires)
        first = (self._sql.renew, params, RETURNING)
        return await self._gc.write(Op(self._run_or_none, first, run_id, single=_always))

    async def commit(
        self, run_id: str, owner: str | None, now: float, update: Update
    ) -> CommitResult:
        if not self._mark.settled:
            await self._plain(f"commit a payload to run {run_id!r}", update_carries_payload, update)
        _limits.check_update(update, self.max_payload_bytes)
        return await self._gc.write(self._commits.op(run_id, owner, now, update))

    async def append_events(
        self, run_id: str, owner: str, now: float, events: Sequence[Event]
    ) -> tuple[int, ...] | None:
        """``base.AppendsEvents``: one statement on its own (an autocommit ``INSERT`` on
        SQLite, one round trip on PostgreSQL) when nothing shares its group commit."""
        n = len(events)
        if not n or upserts(events):  # (the search map changes: ``commit`` applies it)
            return None
        if not self._mark.settled:
            await self._plain(f"append a payload to run {run_id!r}", events_carry_payload, events)
        _limits.check_events(events, self.max_payload_bytes)
        sql = self._sql
        stmt, whole, counted = sql.append(n)
        params: dict[str, Any] = {"id": run_id, "owner": owner}
        if sql.namespace is not None:
            params["ns"] = sql.namespace
        if counted:
            params["now"] = now
            params["n"] = n
        if whole:  # the seqs are the statement's (bodies get theirs in the database)
            event_params(params, 0, events)
            for i in range(n):
                del params[f"s{i}"]

        def rest(c: Conn, row: Any) -> tuple[int, ...] | None:
            if row is None:
                return None
            last = int(row[-1])  # SQLite's one event: its seq; else the row's new last_seq
            if not whole:  # (SQLite, several events) the insert at the reserved seqs
                runs.append(sql, c, run_id, last - n + 1, events)
            return tuple(range(last - n + 1, last + 1))

        if whole and self._gc.idle():  # (a step of a run alone: the common case)
            db = self._db
            row = await self._gc.direct(lambda: db.returning_now(stmt, params))
            if row is None:
                return None
            last = int(row[-1])
            return tuple(range(last - n + 1, last + 1))
        first = (stmt, params, RETURNING)
        op = Op(rest, first, run_id, single=_always if whole else None, lite=whole)
        return await self._gc.write(op)

    async def deliver_signal(self, run_id: str, name: str, payload: Any, now: float) -> Run:
        if not self._mark.settled:
            what = f"deliver signal {name!r} with a payload to run {run_id!r}"
            await self._plain(what, _not_none, payload)
        _limits.check_signal(name, payload, self.max_payload_bytes)
        sql = self._sql
        params = self._sql.params(id=run_id, name=name, now=now, payload=dumps(payload))
        both = sql.CTE_WRITES

        def rest(c: Conn, row: Any) -> Run:
            # the conditional UPDATE made it due now if suspended waiting for `name` (it also
            # locks the row, ordering this with the run's commits); it misses a run that
            # continued as new, whose signals go on to the last run of its chain
            target, prev = params, None
            while row is None:
                found = c.one(sql.get_run_locked, sql.params(id=target["id"]))
                if found is None:
                    if prev is None:
                        raise RunNotFoundError(run_id)
                    # (its successor was pruned: the signal stays with the last run there is)
                    c.write(sql.insert_signal, {**params, "id": prev.id})
                    return prev
                prev = to_run(found)
                if prev.continued_as is None or not moves_to_successor(name):
                    c.write(sql.insert_signal, {**params, "id": prev.id})
                    return prev  # (a signal that stays with its run: a child's wake-up)
                target = {**params, "id": prev.continued_as}
                row = c.first((stmt, target, RETURNING))
            if not both:
                c.write(sql.insert_signal, target)
            run = to_run(row)
            wake_if_free(c, run, now)  # it waited for this signal (or nobody holds it)
            return run

        stmt = sql.deliver_and_insert if both else sql.deliver
        single = _hit if both else None
        return await self._gc.write(Op(rest, (stmt, params, RETURNING), run_id, single=single))

    async def try_admit_singleton(
        self,
        run_id: str,
        tag: str,
        workflow: str,
        limit: int,
        retry_wake_at: float | None = None,
        *,
        admitted_at: AdmittedAt = None,
        recheck: bool = False,
    ) -> bool:
        _sg.check_limit(limit)  # (before the transaction: a limit of 0 would park the run)

        armed: list[list[Any]] = []  # (PostgreSQL: what each arming returned)

        def op(c: Conn, found: Any) -> bool:
            armed.clear()  # (a transaction tried again starts afresh)
            got = decide(c, found)
            if retry_wake_at is None:
                return got
            return self._commits.then_arm(got, armed, workflow, tag, limit, retry_wake_at)

        def decide(c: Conn, found: Any) -> bool:
            # 1. serialize competing claims of this key (PostgreSQL, ``Op.locks``; SQLite
            #    holds its write lock already), 2. lock our own row against a concurrent
            #    cancel, 3. read only the active runs of this key (2 and 3 are one statement,
            #    sent with 1), 4. decide with the shared helpers and persist (the write goes
            #    out with the COMMIT).
            row, sharing = runs.split(found, tag)
            if row is None:
                raise RunNotFoundError(run_id)
            run = to_run(row)
            tags = _sg.admission_tags(sharing, run_id, tag, workflow, limit)
            if tags is not None:
                if list(run.tags) != tags:
                    new = dataclasses.replace(run, tags=tuple(tags))
                    at = admission_time(admitted_at)  # (after the key's lock: see AdmittedAt)
                    if at is not None and ADMITTED_TAG not in run.tags:
                        seq = int(row[LAST_SEQ]) + 1  # its singleton_admitted, with the marker
                        runs.write_changes(self._sql, c, run, new, later=True, last_seq=seq)
                        ev = admitted_event(tag, at)
                        runs.append(self._sql, c, run_id, seq, [ev], later=True)
                    else:
                        runs.write_changes(self._sql, c, run, new, later=True)
                    after = [new if r.id == run_id else r for r in sharing]
                    arm(c, after)  # the waiter behind it is a head now
                return True
            # (a re-check behind the heads parks without a timer; a first denial keeps one)
            heads = limit if recheck else None
            patch = _sg.denial_patch(sharing, run_id, tag, workflow, retry_wake_at, heads)
            if patch:
                new = dataclasses.replace(run, **patch)
                runs.write_changes(self._sql, c, run, new, later=True)
                arm(c, [new if r.id == run_id else r for r in sharing])
            return False

        def arm(c: Conn, after: list[Run]) -> None:
            # (singleton.heads_to_arm over the rows read: the holders and limit + 1 oldest
            # waiters, enough to see every head once this run is admitted)
            if retry_wake_at is None:
                return
            for wid in _sg.heads_to_arm(after, tag, workflow, limit, retry_wake_at):
                if wid != run_id:
                    got = self._commits.arm_head(c, wid, retry_wake_at)
                    if got is not None:
                        armed.append(got)

        # (limit + 1 waiters: the heads once this run is admitted, see ``arm``)
        first = (*self._sql.locked_with_sharing(run_id, workflow, tag, limit + 1), ROWS)
        return await self._gc.write(Op(op, first, run_id, locks=self._key_locks(workflow, tag)))


__all__ = ["SqlStore"]
