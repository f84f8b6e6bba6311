"""``SqlStore``'s answers to the dashboard's reads (``BrowsesRuns``: ``Browsing``, mixed into
the store) and its change stamp (``ChangeStamp``). Each read is one statement (``lane``: three,
in one read call) on the indexes the engine keeps anyway: a page walks
``ix_flowkit_runs_created`` backwards, the counts group ``ix_flowkit_runs_due`` (or
``ix_flowkit_runs_version`` for one workflow), the lanes read the active runs only and one
lane its holders on ``ix_flowkit_runs_queue`` and its waiters on ``ix_flowkit_runs_waiting``
(in the singleton gate's FIFO order); the counts the dashboard asks for are bounded
(``limit``: a seek of ``ix_flowkit_runs_due`` per status). docs/stores.md, "Browsing"."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from ..._core.browse_types import EventPage, Lane, LaneSummary
from ..._core.run import ACTIVE_STATUSES, Run, RunStatus
from ..._core.search_terms import Term
from ...errors import RunNotFoundError
from .. import limits as _limits
from ._database import Database
from ._group_commit import GroupCommit
from ._rows import has_tag, run_from_mapping, to_event, visible
from ._schema import BY_ID, WAITING_SQL, events, runs
from ._search_sql import LIST_COLUMNS, term_clause
from ._statements import Statements

_ACTIVE = sorted(s.value for s in ACTIVE_STATUSES)
_STAMP_LOCK = threading.Lock()


def _order(r: Run) -> tuple[float, str]:
    return (r.created_at, r.id)


class Browsing:
    """Mixed into ``SqlStore`` (which sets ``namespace``, ``_db``, ``_gc`` and ``_sql``)."""

    namespace: str | None
    _db: Database
    _gc: GroupCommit
    _sql: Statements

    def _filters(
        self, workflow: str | None, tag: str | None, search: Sequence[Term]
    ) -> list[sa.ColumnElement[bool]]:
        r = runs.c
        where = [visible(self.namespace)]
        if workflow is not None:
            where.append(r.workflow == workflow)
        if tag is not None:
            where.append(has_tag(self._db.dialect, tag))
        where += [term_clause(t) for t in search]
        return where

    def browse_query(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        search: Sequence[Term] = (),
        before: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> sa.Select[Any]:
        """The ``browse_runs`` statement (public for the plan tests: ``EXPLAIN`` it)."""
        r = runs.c
        q = sa.select(*LIST_COLUMNS).where(*self._filters(workflow, tag, search))
        if status is not None:
            q = q.where(r.status == RunStatus(status).value)
        if before is not None:  # keyset paging down ix_flowkit_runs_created (no OFFSET)
            at, rid = before
            q = q.where(r.created_at <= at, sa.or_(r.created_at < at, r.id < rid))
        by_id: sa.ColumnElement[Any] = sa.literal_column(BY_ID[self._db.dialect])
        return q.order_by(r.created_at.desc(), by_id.desc()).limit(max(limit, 0))

    def count_query(
        self,
        *,
        workflow: str | None = None,
        tag: str | None = None,
        search: Sequence[Term] = (),
        limit: int | None = None,
    ) -> sa.Select[Any] | sa.CompoundSelect[Any]:
        """The ``count_runs`` statement (public for the plan tests). With ``limit``: one
        count per status of at most ``limit + 1`` rows (``LIMIT`` in a subquery that seeks
        ``ix_flowkit_runs_due`` by status), so its work is bounded whatever the store holds;
        without, one ``GROUP BY`` of every run passing the filters."""
        r = runs.c
        where = self._filters(workflow, tag, search)
        if limit is None:
            return sa.select(r.status, sa.func.count()).where(*where).group_by(r.status)
        parts = []
        for status in RunStatus:
            some = (
                sa.select(sa.literal_column("1").label("one"))
                .select_from(runs)
                .where(*where, r.status == status.value)
                .limit(max(limit, 0) + 1)
                .subquery()
            )
            label: Any = sa.literal_column(f"'{status.value}'").label("status")
            parts.append(sa.select(label, sa.func.count().label("n")).select_from(some))
        return sa.union_all(*parts)

    def lanes_query(self) -> sa.Select[Any]:
        """The ``lanes`` statement (public for the plan tests): the active singleton runs,
        grouped by lane."""
        r = runs.c
        waiter = sa.not_(r.admitted)
        return (
            sa.select(
                r.workflow,
                r.singleton_key,
                sa.func.sum(sa.case((r.admitted, 1), else_=0)),
                sa.func.sum(sa.case((waiter, 1), else_=0)),
                sa.func.min(sa.case((waiter, r.created_at), else_=None)),
            )
            .where(visible(self.namespace), r.status.in_(_ACTIVE), r.singleton_key.is_not(None))
            .group_by(r.workflow, r.singleton_key)
        )

    def lane_queries(
        self, workflow: str, key: str, limit: int
    ) -> tuple[sa.Select[Any], sa.Select[Any], sa.Select[Any], sa.Select[Any]]:
        """The ``lane`` statements (public for the plan tests): its holders (on
        ``ix_flowkit_runs_queue``), its first ``limit`` waiters and their count (on
        ``ix_flowkit_runs_waiting``: the predicate spelled exactly as the index's), and its
        cancelling waiters (few: the gate skips them, the dashboard shows them)."""
        r = runs.c
        by_id: sa.ColumnElement[Any] = sa.literal_column(BY_ID[self._db.dialect])
        lane = [visible(self.namespace), r.workflow == workflow, r.singleton_key == key]
        holders = (
            sa.select(*LIST_COLUMNS)
            .where(*lane, r.admitted.is_(True), r.status.in_(_ACTIVE))
            .order_by(r.created_at, by_id)
        )
        gate = sa.text(f"admitted = {self._sql.FALSE} AND {WAITING_SQL}")
        waiters = (
            sa.select(*LIST_COLUMNS)
            .where(*lane, gate)
            .order_by(r.created_at, by_id)
            .limit(max(limit, 0))
        )
        count = sa.select(sa.func.count()).select_from(runs).where(*lane, gate)
        cancelling = sa.select(*LIST_COLUMNS).where(
            *lane, r.status == RunStatus.CANCELLING.value, r.admitted.is_(False)
        )
        return holders, waiters, count, cancelling

    async def _browse_read(self, fn: Any) -> Any:
        db = self._db

        def read() -> Any:
            with db.tx(write=False) as conn:
                return fn(conn)

        return await self._gc.call(read)

    async def browse_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        search: Sequence[Term] = (),
        before: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[Run]:
        """``BrowsesRuns.browse_runs``: one statement."""
        q = self.browse_query(
            workflow=workflow, status=status, tag=tag, search=search, before=before, limit=limit
        )
        found: list[Run] = await self._browse_read(
            lambda conn: [run_from_mapping(row) for row in conn.execute(q)]
        )
        return found if tag is None else [run for run in found if tag in run.tags]

    async def count_runs(
        self,
        *,
        workflow: str | None = None,
        tag: str | None = None,
        search: Sequence[Term] = (),
        limit: int | None = None,
    ) -> dict[RunStatus, int]:
        """``BrowsesRuns.count_runs``: one statement (``count_query``)."""
        q = self.count_query(workflow=workflow, tag=tag, search=search, limit=limit)
        rows = await self._browse_read(lambda conn: list(conn.execute(q)))
        counts = dict.fromkeys(RunStatus, 0)
        for status, n in rows:
            counts[RunStatus(status)] += int(n)
        return counts

    async def lanes(self, *, limit: int = 500) -> list[LaneSummary]:
        """``BrowsesRuns.lanes``: one ``GROUP BY`` of the active singleton runs."""
        q = self.lanes_query()
        rows = await self._browse_read(lambda conn: list(conn.execute(q)))
        out = [
            LaneSummary(
                wf,
                key,
                holders=int(h or 0),
                waiting=int(w or 0),
                oldest_waiting_since=None if oldest is None else float(oldest),
            )
            for wf, key, h, w, oldest in rows
        ]
        out.sort(key=lambda s: (-s.waiting, s.workflow, s.key))
        return out[: max(limit, 0)]

    async def lane(self, workflow: str, key: str, *, limit: int = 200) -> Lane:
        """``BrowsesRuns.lane``: holders, then waiters in the gate's FIFO order."""
        holders_q, waiters_q, count_q, cancelling_q = self.lane_queries(workflow, key, limit)

        def read(conn: sa.Connection) -> Lane:
            holders = [run_from_mapping(row) for row in conn.execute(holders_q)]
            waiters = [run_from_mapping(row) for row in conn.execute(waiters_q)]
            waiting = int(conn.execute(count_q).scalar_one())
            cancelling = [run_from_mapping(row) for row in conn.execute(cancelling_q)]
            if cancelling:
                waiters = sorted(waiters + cancelling, key=_order)[: max(limit, 0)]
            return Lane(workflow, key, holders, waiters, waiting + len(cancelling))

        found: Lane = await self._browse_read(read)
        return found

    async def events_page(
        self,
        run_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int = 100,
        types: Sequence[str] = (),
    ) -> EventPage:
        """``PagesEvents.events_page``: the run's row, the count and bounds of its events and
        one page of them, each on the primary key ``(run_id, seq)``."""
        if not _limits.storable(run_id):
            raise RunNotFoundError(run_id)
        e = events.c
        exists = sa.select(runs.c.id).where(runs.c.id == run_id, visible(self.namespace))
        where: list[sa.ColumnElement[bool]] = [e.run_id == run_id]
        if types:
            where.append(e.type.in_(list(types)))
        bounds = sa.select(sa.func.count(), sa.func.min(e.seq), sa.func.max(e.seq)).where(*where)
        page = sa.select(e.seq, sa.cast(e.body, sa.Text)).where(*where)
        n = max(limit, 0)
        if after is not None:
            page = page.where(e.seq > after).order_by(e.seq).limit(n)
        else:
            if before is not None:
                page = page.where(e.seq < before)
            page = page.order_by(e.seq.desc()).limit(n)

        def read(conn: sa.Connection) -> EventPage | None:
            if conn.execute(exists).first() is None:
                return None
            count, first, last = conn.execute(bounds).one()
            rows = list(conn.execute(page))
            if after is None:
                rows.reverse()
            got = [to_event(int(seq), body) for seq, body in rows]
            return EventPage(got, int(count or 0), first, last)

        found: EventPage | None = await self._browse_read(read)
        if found is None:
            raise RunNotFoundError(run_id)
        return found

    async def change_stamp(self) -> object:
        """``ChangeStamp.change_stamp``. PostgreSQL: the current snapshot (its ``xmax``
        moves on with every transaction that writes anywhere on the server, and a write in
        progress is in its list until it commits). SQLite: ``PRAGMA data_version`` on a
        connection of its own that never writes (so every commit of this process's
        connections and of others' changes it), with this process's write count."""
        db = self._db
        if db.pg:

            def snap(conn: sa.Connection) -> object:
                return conn.execute(sa.text("SELECT txid_current_snapshot()::text")).scalar()

            return await self._browse_read(snap)
        if not db.threaded:  # (an in-memory database: no other connection sees it)
            counts = db.stats.copy()
            return (counts["write_tx"], counts["ops"], counts["single"])
        return await self._gc.call(lambda: _data_version(db))


def _data_version(db: Database) -> int:
    with _STAMP_LOCK:
        conn = db.stamp_conn
        if conn is None:
            fairy = db.engine.raw_connection()
            fairy.detach()  # (its own: the pool's connections serve the lanes)
            conn = db.stamp_conn = fairy.dbapi_connection
        row = conn.execute("PRAGMA data_version").fetchone()
        return int(row[0])


__all__ = ["Browsing"]
