"""flowkit behind PgBouncer in transaction mode (docs/deploying.md, "Behind PgBouncer"): with
``?flowkit_pooler=transaction`` in the URL a store prepares no statements, sends no session
settings and listens for no wake-ups, so two engines whose connections share ONE server
connection run steps, signals and a singleton lane through a real PgBouncer; a mode it does
not know is refused before anything connects."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pg import PostgresUnavailable, fresh_database
from pgbouncer_kit import pgbouncer
from sqlalchemy.engine import make_url

from flowkit import Engine, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.stores import SqlStore
from flowkit.stores.sql import UnsupportedDatabaseError
from flowkit.stores.sql._pgconnect import configure_url, take_pooler

pytestmark = pytest.mark.postgres

POOLED = "flowkit_pooler=transaction"


@pytest.fixture
def bouncer(pg_server: str) -> Iterator[str]:
    """A fresh database behind a PgBouncer with one server connection (so every client's
    statements share it)."""
    try:
        with pgbouncer(fresh_database(pg_server), pool_size=1) as url:
            yield url
    except PostgresUnavailable as exc:
        if os.environ.get("FLOWKIT_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PgBouncer required with PostgreSQL but unavailable: {exc}")
        pytest.skip(str(exc))


def add(a: int, b: int) -> int:
    return a + b


@workflow(name="pooled-sum")
class PooledSum:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        total = 0
        for i in range(n):
            total = await ctx.step(add, total, i)
        bonus = await ctx.wait_for_signal("bonus", timeout=60)
        return total + int(bonus)


ORDER: list[str] = []


def note(tag: str) -> None:
    ORDER.append(tag)


@workflow(name="pooled-lane", singleton=Singleton(key=lambda inp: "one", limit=1))
class PooledLane:
    async def run(self, ctx: WorkflowCtx, tag: str) -> str:
        await ctx.step(note, f"{tag}:in")
        await ctx.sleep(0.05)
        await ctx.step(note, f"{tag}:out")
        return tag


async def test_two_engines_share_one_server_connection_through_pgbouncer(bouncer: str) -> None:
    url = f"{bouncer}&{POOLED}"
    ORDER.clear()
    a, b = SqlStore(url), SqlStore(url)
    assert not a.wakeups and not b.wakeups  # (LISTEN needs a session of its own)
    try:
        wfs = [PooledSum, PooledLane]
        async with (
            Engine(a, wfs, instance_id="a", poll_interval=0.05) as ea,
            Engine(b, wfs, instance_id="b", poll_interval=0.05) as eb,
        ):
            sums = [await (ea if i % 2 else eb).start(PooledSum, 20) for i in range(6)]
            lane = [await ea.start(PooledLane, t, run_id=f"lane-{t}") for t in "xyz"]
            for i, run in enumerate(sums):
                await (eb if i % 2 else ea).signal(run.id, "bonus", i)
            results = [await ea.result(r.id, timeout=60) for r in sums]
            assert results == [sum(range(20)) + i for i in range(6)]
            assert [await eb.result(r.id, timeout=60) for r in lane] == ["x", "y", "z"]
            for r in [*sums, *lane]:
                assert (await eb.get_run(r.id)).status == RunStatus.COMPLETED
        # the lane held one run at a time, in FIFO order, across both engines
        assert ORDER == ["x:in", "x:out", "y:in", "y:out", "z:in", "z:out"]
    finally:
        a.close()
        b.close()


def test_an_unknown_pooler_mode_is_refused_before_connecting() -> None:
    url = "postgresql+psycopg://u@/db?host=/nonexistent-flowkit&flowkit_pooler=statement"
    with pytest.raises(UnsupportedDatabaseError, match="flowkit_pooler must be one of"):
        SqlStore(url)


def test_behind_a_pooler_no_session_settings_are_sent_but_waits_stay_bounded() -> None:
    u, io = configure_url(make_url("postgresql+psycopg://u@h/db"), session_settings=False)
    assert "options" not in u.query  # (PgBouncer refuses the options startup parameter)
    assert io == 35.0  # (the role's 30 s statement timeout, as docs/deploying.md sets it, + 5)
    u, io = configure_url(
        make_url("postgresql+psycopg://u@h/db?statement_timeout=2s"), session_settings=False
    )
    assert "statement_timeout=2s" in str(u.query["options"]) and io == 7.0
    u, pooled = take_pooler(make_url(f"postgresql+psycopg://u@h/db?{POOLED}&x=1"))
    assert pooled and "flowkit_pooler" not in u.query and u.query["x"] == "1"
    assert take_pooler(make_url("postgresql+psycopg://u@h/db?flowkit_pooler=session"))[1] is False
