"""Normal operation leaves no ``ERROR:`` in the PostgreSQL server's log: every write that may
meet a row that exists already (an idempotent start, racing starts of one id from two
processes, a schedule tick that two workers fire, a published event id seen before, a worker
making itself known again) says ``ON CONFLICT`` or reads under a lock first, instead of
letting the server refuse a duplicate key and catching the error. (An operator watching the
server log for errors sees only real ones.) The workload runs on two stores (two connection
pools, as two worker processes) against the session's throwaway server (tests/pg.py), whose
log this test reads from where it stood before."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pg import fresh_database

from flowkit import Engine, Schedule, Singleton, WorkflowCtx, workflow
from flowkit.stores import SqlStore

pytestmark = pytest.mark.postgres


def _inc(n: int) -> int:
    return n + 1


@workflow(name="log-child")
class _Child:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return await ctx.step(_inc, n)


@workflow(name="log-parent")
class _Parent:
    """A child, an event, a search attribute, then continue-as-new twice."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        got = await ctx.child(_Child, n)
        ctx.set_event("got", got)
        await ctx.upsert_search(stage="child done")
        if n < 2:
            ctx.continue_as_new(n + 1)
        return got


@workflow(name="log-lane", singleton=Singleton(key=lambda n: "k"))
class _Lane:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return await ctx.step(_inc, n)


@workflow(name="log-waiter")
class _Waiter:
    async def run(self, ctx: WorkflowCtx, order: str) -> str:
        paid = await ctx.wait_for_event("log.paid", match={"order": order}, timeout=60)
        go = await ctx.wait_for_signal("go", timeout=60)
        return f"{paid['order']}{go}"


@workflow(name="log-receipt", on_event="log.paid")
class _Receipt:
    async def run(self, ctx: WorkflowCtx, paid: dict[str, Any]) -> str:
        return str(paid["order"])


@workflow(name="log-tick")
class _Tick:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return n


WORKFLOWS = [_Parent, _Child, _Lane, _Waiter, _Receipt, _Tick]


def _log_of(server_url: str) -> Path:
    host = sa.engine.make_url(server_url).query["host"]
    assert isinstance(host, str)
    return Path(host) / "server.log"


async def test_normal_operation_logs_no_error(pg_server: str) -> None:
    log = _log_of(pg_server)
    url = fresh_database(pg_server, "flowkit_log")
    start = log.stat().st_size
    stores = [SqlStore(url), SqlStore(url)]
    schedules = {"tick": Schedule("log-tick", every=1, input=1)}
    engines = [
        Engine(s, WORKFLOWS, instance_id=f"w{i}", poll_interval=0.05, schedules=schedules)
        for i, s in enumerate(stores)
    ]
    try:
        for e in engines:
            await e.start_worker()
        a, b = engines
        # idempotent starts, then racing starts of the same ids from both stores
        for i in range(3):
            for e in (a, a, b):
                await e.start("log-parent", 0, f"p{i}")
        await asyncio.gather(
            *(e.start("log-lane", i, f"lane{i}") for i in range(4) for e in (a, b, a, b))
        )
        await asyncio.gather(
            *(e.start("log-tick", i, f"t{i}") for i in range(4) for e in (a, b, a, b))
        )
        # published events: an id seen before, the same id from both stores at once
        await a.start("log-waiter", "o1", "waiter")
        await a.publish_event("log.paid", {"order": "o1"}, event_id="e1")
        await asyncio.gather(
            *(e.publish_event("log.paid", {"order": "o1"}, event_id="e1") for e in (a, b))
        )
        await a.signal("waiter", "go", "!")
        for i in range(3):
            assert await a.result(f"p{i}", timeout=60) == 3
        for i in range(4):
            assert await b.result(f"lane{i}", timeout=60) == i + 1
        assert await a.result("waiter", timeout=60) == "o1!"
        assert await b.result("evt:e1:log-receipt", timeout=60) == "o1"
        # schedule ticks fired by both workers (each tick starts one run)
        loop = asyncio.get_running_loop()
        end = loop.time() + 60
        while len([r for r in await a.list_runs(workflow="log-tick") if "sched:" in r.id]) < 2:
            assert loop.time() < end, "no schedule tick fired"
            await asyncio.sleep(0.05)
        await a.schedules.create("tick", Schedule("log-tick", every=1, input=2))  # (again)
        await a.prune(0)
    finally:
        for e in engines:
            await e.stop()  # (each records itself gone: a worker record written again)
        for s in stores:
            s.close()
    with log.open("rb") as f:
        f.seek(start)
        written = f.read().decode(errors="replace")
    errors = [line for line in written.splitlines() if "ERROR:" in line]
    assert errors == [], written[-5000:]
