"""``SqlStore``'s durable schedules (``Schedules``, mixed into it): the rows of
``flowkit_schedules`` (``flowkit.stores.schedules.KeepsSchedules``). Each call is one
statement or one transaction; ``advance_schedule`` is a conditional ``UPDATE`` (the
compare-and-set that lets one worker take each tick)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ..schedules import ScheduleRecord
from ._connection import Conn
from ._database import Database
from ._group_commit import GroupCommit
from ._rows import loads
from ._schema import schedules as table
from ._statements import Statements

_COLS = [c.name for c in table.columns]


def _record(row: Any) -> ScheduleRecord:
    return ScheduleRecord(
        id=row.schedule_id,
        workflow=row.workflow,
        next_fire=float(row.next_fire),
        cron=row.cron,
        every=None if row.every is None else float(row.every),
        timezone=row.timezone,
        input=row.input,
        overlap=row.overlap,
        catchup_window=float(row.catchup_window),
        paused=bool(row.paused),
        last_run_id=row.last_run_id,
        created_at=float(row.created_at),
        updated_at=float(row.updated_at),
    )


def _from_tuple(row: Any) -> ScheduleRecord:
    """A row of ``_poll_sql``'s columns (a raw cursor's tuple), JSON input as text."""
    rec = dict(zip(_COLS, row, strict=True))
    raw = rec["input"]
    rec["input"] = loads(raw) if isinstance(raw, str | bytes) else raw
    return _record(_Rec(rec))


class _Rec:
    """Attribute access over a dict (what ``_record`` reads)."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)


class Schedules:
    """Mixed into ``SqlStore`` (which sets ``namespace``, ``_db``, ``_gc`` and ``_sql``)."""

    namespace: str | None
    _db: Database
    _gc: GroupCommit
    _sql: Statements

    keeps_schedules = True
    """It keeps durable schedules (``flowkit.stores.schedules.KeepsSchedules``)."""

    def _ns(self) -> str:
        return self.namespace or ""

    def _where(self, schedule_id: str) -> Any:
        return sa.and_(table.c.namespace == self._ns(), table.c.schedule_id == schedule_id)

    async def _write(self, fn: Any) -> Any:
        db = self._db

        def write() -> Any:
            with db.tx() as conn:
                return fn(conn)

        return await self._gc.call(write, read=False)

    async def _read(self, q: Any) -> list[ScheduleRecord]:
        db = self._db

        def read() -> list[ScheduleRecord]:
            with db.tx(write=False) as conn:
                return [_record(row) for row in conn.execute(q)]

        return await self._gc.call(read)

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        t = table
        row = {
            "namespace": self._ns(),
            "schedule_id": record.id,
            "workflow": record.workflow,
            "cron": record.cron,
            "every": record.every,
            "timezone": record.timezone,
            "input": record.input,
            "overlap": record.overlap,
            "catchup_window": record.catchup_window,
            "paused": record.paused,
            "next_fire": record.next_fire,
            "last_run_id": record.last_run_id,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
        }
        insert: Any = pg_insert if self._db.dialect == "postgresql" else sqlite_insert
        stmt = insert(t).values(**row)
        ex = stmt.excluded
        # one statement: a row with the same timetable keeps where it is (merged())
        same = sa.and_(
            t.c.cron.is_not_distinct_from(ex.cron),
            t.c.every.is_not_distinct_from(ex.every),
            t.c.timezone == ex.timezone,
        )
        kept = {
            c: sa.case((same, t.c[c]), else_=ex[c])
            for c in ("next_fire", "paused", "last_run_id", "created_at")
        }
        changed = {c: ex[c] for c in ("workflow", "cron", "every", "timezone", "input")}
        changed.update({c: ex[c] for c in ("overlap", "catchup_window", "updated_at")})
        stmt = stmt.on_conflict_do_update(
            index_elements=[t.c.namespace, t.c.schedule_id], set_={**kept, **changed}
        )
        where = self._where(record.id)

        def put(conn: sa.Connection) -> ScheduleRecord:
            conn.execute(stmt)
            return _record(conn.execute(sa.select(t).where(where)).one())

        stored: ScheduleRecord = await self._write(put)
        return stored

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        rows = await self._read(sa.select(table).where(self._where(schedule_id)))
        return rows[0] if rows else None

    async def list_schedules(self) -> list[ScheduleRecord]:
        t = table
        return await self._read(
            sa.select(t).where(t.c.namespace == self._ns()).order_by(t.c.schedule_id)
        )

    async def delete_schedule(self, schedule_id: str) -> bool:
        stmt = sa.delete(table).where(self._where(schedule_id))
        deleted: bool = await self._write(lambda conn: conn.execute(stmt).rowcount > 0)
        return deleted

    async def set_schedule_paused(
        self, schedule_id: str, paused: bool, now: float, next_fire: float | None = None
    ) -> ScheduleRecord | None:
        values: dict[str, Any] = {"paused": paused, "updated_at": now}
        if next_fire is not None:
            values["next_fire"] = next_fire
        where = self._where(schedule_id)
        stmt = sa.update(table).where(where).values(**values)

        def write(conn: sa.Connection) -> ScheduleRecord | None:
            if conn.execute(stmt).rowcount == 0:
                return None
            return _record(conn.execute(sa.select(table).where(where)).one())

        row: ScheduleRecord | None = await self._write(write)
        return row

    async def advance_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        new_next: float,
        now: float,
        last_run_id: str | None = None,
    ) -> bool:
        values: dict[str, Any] = {"next_fire": new_next, "updated_at": now}
        if last_run_id is not None:
            values["last_run_id"] = last_run_id
        stmt = (
            sa.update(table)
            .where(self._where(schedule_id), table.c.next_fire == expected_next)
            .values(**values)
        )
        moved: bool = await self._write(lambda conn: conn.execute(stmt).rowcount == 1)
        return moved

    def _poll_sql(self, cmp: str, workflows: Sequence[str] | None) -> tuple[str, str]:
        """``FROM ... WHERE`` of the worker's two schedule reads and their columns, in the
        dialect's raw SQL: read once a poll interval by every worker, so they take the read
        lane like the run reads (no SQLAlchemy compile or pooled transaction each time)."""
        sql = self._sql
        hint = ""
        if workflows is not None and self._db.dialect == "sqlite":
            # (without statistics SQLite takes ix_flowkit_schedules_due for its order, and
            # walks every due schedule of the other workflows to find this worker's)
            hint = " INDEXED BY ix_flowkit_schedules_workflow"
        where = (
            f"flowkit_schedules{hint} WHERE namespace = {sql.p('sns')}"
            f" AND paused = {sql.FALSE} AND next_fire {cmp} {sql.p('now')}"
        )
        if workflows is not None:
            where += f" AND {sql.in_list('workflow', 'wfs')}"
        cols = ", ".join(f"{c}{sql.TEXT}" if c == "input" else c for c in _COLS)
        return where, cols

    def _poll_params(self, now: float, workflows: Sequence[str] | None) -> dict[str, Any]:
        params: dict[str, Any] = {"sns": self._ns(), "now": now}
        if workflows is not None:
            params["wfs"] = self._sql.in_list_param(sorted(set(workflows)))
        return params

    def due_query(
        self, now: float, limit: int, workflows: Sequence[str] | None
    ) -> tuple[str, dict[str, Any]]:
        """The statement of ``due_schedules`` and its parameters."""
        where, cols = self._poll_sql("<=", workflows)
        order = f" ORDER BY next_fire, schedule_id LIMIT {self._sql.p('limit')}"
        return f"SELECT {cols} FROM {where}{order}", {
            **self._poll_params(now, workflows),
            "limit": max(limit, 0),
        }

    async def due_schedules(
        self, now: float, limit: int, workflows: Sequence[str] | None = None
    ) -> list[ScheduleRecord]:
        q, params = self.due_query(now, limit, workflows)

        def op(c: Conn) -> list[ScheduleRecord]:
            return [_from_tuple(r) for r in c.all(q, params)]

        return await self._gc.read(op)

    async def next_schedule_after(
        self, now: float, workflows: Sequence[str] | None = None
    ) -> float | None:
        where, _ = self._poll_sql(">", workflows)
        q = f"SELECT MIN(next_fire) FROM {where}"
        params = self._poll_params(now, workflows)

        def op(c: Conn) -> float | None:
            row = c.one(q, params)
            return None if row is None or row[0] is None else float(row[0])

        return await self._gc.read(op)


__all__ = ["Schedules"]
