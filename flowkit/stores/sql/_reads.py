"""``SqlStore``'s read calls (``Reads``, mixed into it): a run, its history, what is due and
a pending signal (the listing: ``_search_sql``), each one read on a read lane outside any
write transaction. Apart from the writes (``_store``) because none of them takes part in a
group commit."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..._core.run import Run
from ...errors import RunNotFoundError
from ...events import Event
from .. import limits as _limits
from ..base import InboxSignal, WorkflowVersions
from ..rules import claimable, due_time
from . import _runs as runs
from ._connection import Conn
from ._database import Database
from ._group_commit import GroupCommit
from ._rows import loads, to_event, to_run
from ._statements import Statements

_FIELD = re.compile(r"[a-z_]{1,64}")
"""An event type or a field name of its body (spelled into ``latest_event``'s SQL)."""


class Reads:
    """Mixed into ``SqlStore`` (which sets ``namespace``, ``_db``, ``_gc`` and ``_sql``)."""

    namespace: str | None
    _db: Database
    _gc: GroupCommit
    _sql: Statements

    async def get_run(self, run_id: str) -> Run | None:
        if not _limits.storable(run_id):  # (no such run: PostgreSQL refuses to look NUL up)
            return None

        def op(c: Conn) -> Run | None:
            row = c.one(self._sql.get_run, self._sql.params(id=run_id))
            return None if row is None else to_run(row)

        return await self._gc.read(op)

    async def load_events(self, run_id: str) -> list[Event]:
        if not _limits.storable(run_id):
            raise RunNotFoundError(run_id)

        def op(c: Conn) -> list[Event]:
            evs = runs.history(self._sql, c, run_id)
            if evs is None:
                raise RunNotFoundError(run_id)
            return evs

        return await self._gc.read(op)

    async def latest_event(self, run_id: str, type: str, field: str, value: str) -> Event | None:
        """``base.LatestEvent``: one indexed read of the run's events, newest first, the
        JSON field compared in SQL (``LIMIT 1``): the whole history is never loaded."""
        if not _limits.storable(run_id) or not _limits.storable(value):
            return None
        if not _FIELD.fullmatch(field) or not _FIELD.fullmatch(type):
            raise ValueError(f"latest_event: not an event field {field!r} / type {type!r}")
        sql = self._sql
        if self._db.dialect == "postgresql":
            pick = f"e.body ->> '{field}'"
        else:
            pick = f"json_extract(e.body, '$.{field}')"
        q = (
            f"SELECT e.seq, e.body{sql.TEXT} FROM flowkit_runs r"
            f" JOIN flowkit_events e ON e.run_id = r.id"
            f" WHERE r.id = {sql.p('id')}{sql.ns.replace('namespace', 'r.namespace')}"
            f" AND e.type = {sql.p('type')} AND {pick} = {sql.p('value')}"
            " ORDER BY e.seq DESC LIMIT 1"
        )
        params = sql.params(id=run_id, type=type, value=value)

        def op(c: Conn) -> Event | None:
            row = c.one(q, params)
            return None if row is None else to_event(int(row[0]), row[1])

        return await self._gc.read(op)

    async def due_runs(
        self,
        now: float,
        limit: int,
        workflows: Sequence[str] | None = None,
        *,
        versions: WorkflowVersions | None = None,
    ) -> list[str]:
        sql = self._sql
        if versions is not None:
            pairs = sorted({(w, v) for w, v in versions if workflows is None or w in workflows})
            if not pairs:
                return []
            q, params = sql.due_runs_vers, self._sql.params(now=now, limit=limit)
            sql.versions_params(params, "vers", pairs)
        elif workflows is None:
            q, params = sql.due_runs, self._sql.params(now=now, limit=limit)
        else:
            wfs = sql.in_list_param(workflows)
            q, params = sql.due_runs_of, self._sql.params(now=now, limit=limit, wfs=wfs)

        def op(c: Conn) -> list[Run]:
            return [to_run(r) for r in c.all(q, params)]

        found = [r for r in await self._gc.read(op) if claimable(r, now)]
        found.sort(key=lambda r: (due_time(r) or 0.0, r.created_at, r.id))
        return [r.id for r in found]

    async def next_due_at(self, exclude_lease_owners: Sequence[str] = ()) -> float | None:
        sql = self._sql
        skip = [o for o in exclude_lease_owners if o]
        if skip:
            q, params = sql.next_due_skip, self._sql.params(skip=sql.in_list_param(skip))
        else:
            q, params = sql.next_due, self._sql.params()
        return await self._next_due(q, params)

    async def next_due_after(
        self, now: float, exclude_lease_owners: Sequence[str] = ()
    ) -> float | None:
        sql = self._sql
        skip = [o for o in exclude_lease_owners if o]
        if skip:
            q = sql.next_due_after_skip
            params = self._sql.params(now=now, skip=sql.in_list_param(skip))
        else:
            q, params = sql.next_due_after, self._sql.params(now=now)
        return await self._next_due(q, params)

    async def _next_due(self, q: str, params: dict[str, Any]) -> float | None:
        def op(c: Conn) -> Any:
            return c.one(q, params)

        row = await self._gc.read(op)
        return None if row is None or row[0] is None else float(row[0])

    async def peek_signal(self, run_id: str, name: str) -> InboxSignal | None:
        if not (_limits.storable(run_id) and _limits.storable(name)):
            return None
        sql = self._sql

        def op(c: Conn) -> Any:
            return c.one(sql.peek_signal, {"id": run_id, "name": name})

        row = await self._gc.read(op)
        return None if row is None else InboxSignal(int(row[0]), row[1], loads(row[2]))


__all__ = ["Reads"]
