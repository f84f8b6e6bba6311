"""Durable schedules fired by several workers (docs/schedules.md): a worker reads
only the due schedules of its own workflows (those of a worker group that is down must not
take its batch), by index on the SQL stores; and with ``overlap="skip"`` a run a worker
started for a tick stays the schedule's last run when another worker skipped that tick
concurrently. On MemoryStore, a SQLite file and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from store_kit import Backend

from flowkit import Engine, RunStatus, Schedule, workflow
from flowkit._client.schedules import DUE_BATCH
from flowkit._client.timetable import tick_time
from flowkit.stores.schedules import ScheduleRecord
from flowkit.stores.sql import SqlStore
from flowkit.stores.sql._schema import schedules as schedules_table
from flowkit_testing import TestEnv, VirtualClock

HOUR = 3600.0
START = datetime(2026, 1, 1, tzinfo=UTC)


@workflow(name="report")
class Report:
    async def run(self, ctx: Any, input: Any) -> Any:
        return input


@workflow(name="job")
class Job:
    async def run(self, ctx: Any, input: Any) -> Any:
        return await ctx.wait_for_signal("done")


def other(i: int, next_fire: float) -> ScheduleRecord:
    """A schedule of a workflow no worker here runs (its worker group is down)."""
    return ScheduleRecord(id=f"other-{i:04d}", workflow="other", next_fire=next_fire, every=HOUR)


async def test_due_schedules_of_other_workflows_do_not_starve_a_workers_own(store: Any) -> None:
    async with TestEnv([Report], store=store, start=START) as env:
        eng = env.engines[0]
        for i in range(DUE_BATCH):  # a full batch, all due before this worker's first tick
            await eng.store.put_schedule(other(i, START.timestamp()))
        await eng.schedules.create("mine", Schedule("report", every=HOUR))
        await env.advance(2 * HOUR)
        runs = sorted(r.id for r in await eng.list_runs() if r.id.startswith("sched:"))
        assert runs == ["sched:mine:2026-01-01T01:00:00Z", "sched:mine:2026-01-01T02:00:00Z"]
        assert {r.next_fire for r in await eng.schedules.list() if r.workflow == "other"} == {
            START.timestamp()
        }  # (still due: their workers will fire them)


async def test_a_workers_due_schedules_are_read_by_index(sql_backend: Backend) -> None:
    """The due schedules of some workflows are found through ``ix_flowkit_schedules_workflow``
    (not a walk past the other workflows' due schedules): the plan on both databases (SQLite
    is told to; PostgreSQL picks it once the table has statistics)."""
    s = sql_backend.store
    t0 = START.timestamp()
    await s.put_schedule(other(0, t0))  # (creates the tables)
    rows = [
        {
            "namespace": "",
            "schedule_id": f"other-{i:04d}",
            "workflow": "other",
            "every": HOUR,
            "timezone": "UTC",
            "overlap": "skip",
            "catchup_window": 0.0,
            "paused": False,
            "next_fire": t0 + i,
            "created_at": t0,
            "updated_at": t0,
        }
        for i in range(1, 3000)
    ]
    with s._db.tx() as conn:
        conn.execute(sa.insert(schedules_table), rows)
    for i in range(3):
        mine = dataclasses.replace(other(i, t0 + 10 * i), id=f"mine-{i}", workflow="report")
        await s.put_schedule(mine)
    if sql_backend.name == "postgres":
        with s._db.engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(
                sa.text("ANALYZE flowkit_schedules")
            )
    q, params = s.due_query(t0 + 5000, DUE_BATCH, ["report"])
    prefix = "EXPLAIN QUERY PLAN " if s._db.dialect == "sqlite" else "EXPLAIN "
    with s._db.engine.connect() as conn:
        rows = conn.exec_driver_sql(prefix + q, params).fetchall()
    got = "\n".join(str(r[-1]) if s._db.dialect == "sqlite" else str(r[0]) for r in rows)
    assert "ix_flowkit_schedules_workflow" in got, got
    due = await s.due_schedules(t0 + 5000, DUE_BATCH, ["report"])
    assert [r.id for r in due] == ["mine-0", "mine-1", "mine-2"]


async def test_the_index_is_added_to_a_database_made_without_it(sql_backend: Backend) -> None:
    """A database whose ``flowkit_schedules`` was created before the index gets it on first
    use (SQLite is told to read through it: a missing index would fail every read)."""
    s = sql_backend.store
    await s.put_schedule(other(0, START.timestamp()))
    with s._db.tx() as conn:
        conn.exec_driver_sql("DROP INDEX ix_flowkit_schedules_workflow")
    assert sql_backend.url is not None
    fresh = SqlStore(sql_backend.url)
    try:
        due = await fresh.due_schedules(START.timestamp(), DUE_BATCH, ["other"])
        assert [r.id for r in due] == ["other-0000"]
        with fresh._db.tx(write=False) as conn:
            names = {ix["name"] for ix in sa.inspect(conn).get_indexes("flowkit_schedules")}
        assert "ix_flowkit_schedules_workflow" in names
    finally:
        fresh.close()


class Held:
    """A worker's view of the store whose ``advance_schedule`` first waits for ``before``,
    then runs ``after`` (to order two workers' compare-and-sets), and whose ``get_run`` may
    report a run with another status (what that worker read at its moment)."""

    def __init__(self, inner: Any, before: Any, after: Any, seen: dict[str, RunStatus]) -> None:
        self._inner, self._before, self._after, self._seen = inner, before, after, seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def advance_schedule(self, *args: Any, **kwargs: Any) -> bool:
        await self._before()
        moved: bool = await self._inner.advance_schedule(*args, **kwargs)
        self._after()
        return moved

    async def get_run(self, run_id: str) -> Any:
        run = await self._inner.get_run(run_id)
        if run is not None and run_id in self._seen:
            run = dataclasses.replace(run, status=self._seen[run_id])
        return run


async def test_a_run_started_while_another_worker_skipped_the_tick_stays_the_last_run(
    backend: Backend,
) -> None:
    """Worker A sees the previous run still active and skips tick ``T`` (advancing the row
    without a run); worker B, a moment later, sees it finished, starts ``T``'s run, and loses
    the compare-and-set to A. ``T``'s run is still the schedule's last run, so at the next
    tick, while it runs, ``overlap="skip"`` skips (no second concurrent run)."""
    clock = VirtualClock(START)
    b_started, a_moved = asyncio.Event(), asyncio.Event()

    async def nothing() -> None:
        return None

    async def a_waits() -> None:
        await b_started.wait()  # A's compare-and-set lands after B started T's run

    async def b_waits() -> None:
        b_started.set()  # (B advances only after its start)
        await a_moved.wait()  # and its compare-and-set comes second

    a_view = Held(backend.store, a_waits, a_moved.set, {"prev": RunStatus.RUNNING})
    b_view = Held(backend.another(), b_waits, lambda: None, {"prev": RunStatus.COMPLETED})
    a = Engine(a_view, [Job], clock=clock, worker=False)
    b = Engine(b_view, [Job], clock=clock, worker=False)
    await b.start("job", None, "prev")  # (no worker: it stays pending, as B is told otherwise)
    rec = await b.schedules.create("s", Schedule("job", every=60))
    tick = rec.next_fire
    assert await backend.store.advance_schedule("s", tick, tick, clock.now(), "prev")
    clock.jump(tick + 1)
    await asyncio.gather(a.schedules.fire_due(clock.now()), b.schedules.fire_due(clock.now()))
    tick_run = f"sched:s:{tick_time(tick)}"
    [row] = await backend.store.list_schedules()
    assert await backend.store.get_run(tick_run) is not None
    assert (row.next_fire, row.last_run_id) == (tick + 60, tick_run)

    a_view._before = b_view._before = nothing  # (the next tick: no race)
    clock.jump(tick + 61)
    await b.schedules.fire_due(clock.now())  # T's run is still active: the tick is skipped
    runs = sorted(r.id for r in await backend.store.list_runs() if r.id.startswith("sched:"))
    assert runs == [tick_run]
    [row] = await backend.store.list_schedules()
    assert (row.next_fire, row.last_run_id) == (tick + 120, tick_run)
