"""Retention (docs/search-and-retention.md): ``engine.prune`` deletes terminal runs settled more
than ``older_than`` seconds before the engine clock's now, with their events, signals and search
rows, in batches; never an active run nor the child of an active parent.
``Engine(retention=...)`` prunes periodically on the engine clock (``TestEnv``'s virtual
one). On MemoryStore, a SQLite file and PostgreSQL (the ``store`` fixture)."""

from __future__ import annotations

from typing import Any

import pytest

from flowkit import InvalidInputError, RunStatus, WorkflowCtx, workflow
from flowkit._worker import retention as retention
from flowkit.stores import SqlStore
from flowkit_testing import TestEnv

DAY = 86400.0


@workflow(name="job")
class Job:
    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> str:
        if input.get("fail"):
            raise ValueError("boom")
        if input.get("wait"):
            await ctx.wait_for_signal("go")
        return "ok"


@workflow(name="boss")
class Boss:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        await ctx.child("job", {}, run_id="kid-of-active")
        await ctx.wait_for_signal("go")
        return "done"


async def test_prune_deletes_old_terminal_runs_with_what_belongs_to_them(store: Any) -> None:
    async with TestEnv([Job(), Boss()], store=store) as env:
        eng = env.engines[0]
        await env.start("job", {}, "old-ok", search={"k": 1})
        await env.start("job", {"fail": True}, "old-failed", search={"k": 2})
        await env.start("job", {"wait": True}, "old-active", search={"k": 3})
        # (an inbox row of a settled run: a signal that came too late, as the store keeps it)
        await store.deliver_signal("old-ok", "late", {"x": 1}, env.clock.now())
        await env.start("boss", None, "boss")  # active, with a completed child
        assert (await env.get_run("kid-of-active")).status is RunStatus.COMPLETED
        await env.advance(2 * DAY)
        await env.start("job", {}, "new-ok", search={"k": 1})
        if isinstance(store, SqlStore):
            assert _rows(store, "flowkit_signals", "old-ok") == 1
            assert _rows(store, "flowkit_search", "old-ok") == 1
        assert await eng.prune(DAY, status="completed") == 1  # (old-ok only)
        assert await eng.prune(DAY) == 1  # old-failed
        assert await eng.prune(DAY) == 0
        left = {r.id for r in await eng.list_runs()}
        assert left == {"old-active", "boss", "kid-of-active", "new-ok"}
        assert await store.get_run("old-ok") is None
        assert [r.id for r in await eng.list_runs(search={"k": ("in", [1, 2])})] == ["new-ok"]
        if isinstance(store, SqlStore):
            assert _rows(store, "flowkit_events", "old-ok") == 0
            assert _rows(store, "flowkit_signals", "old-ok") == 0
            assert _rows(store, "flowkit_search", "old-ok") == 0
            assert _rows(store, "flowkit_search", "old-failed") == 0
            assert _rows(store, "flowkit_search", "new-ok") == 1
        # once its parent settles, the child goes too
        await env.signal("boss", "go")
        await env.advance(2 * DAY)
        assert await eng.prune(DAY, workflow="boss") == 1
        assert await eng.prune(DAY) == 2  # kid-of-active, new-ok
        assert {r.id for r in await eng.list_runs()} == {"old-active"}


def _rows(store: SqlStore, table: str, run_id: str) -> int:
    import sqlalchemy as sa

    with store._db.tx(write=False) as conn:
        q = sa.text(f"SELECT count(*) FROM {table} WHERE run_id = :r")
        return int(conn.execute(q, {"r": run_id}).scalar_one())


async def test_prune_goes_in_batches(store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "BATCH", 3)
    calls: list[int] = []
    prune_runs = store.prune_runs

    async def counted(*args: Any, **kwargs: Any) -> int:
        n: int = await prune_runs(*args, **kwargs)
        calls.append(n)
        return n

    async with TestEnv([Job()], store=store) as env:
        for i in range(7):
            await env.start("job", {}, f"r{i}")
        await env.advance(10)
        monkeypatch.setattr(store, "prune_runs", counted)
        assert await env.engines[0].prune(5) == 7
        assert calls == [3, 3, 1, 0]  # (batches until one deletes nothing)


async def test_bad_prune_arguments_are_refused() -> None:
    async with TestEnv([Job()]) as env:
        eng = env.engines[0]
        for bad in (-1, float("nan"), "30d", True):
            with pytest.raises(InvalidInputError):
                await eng.prune(bad)
        with pytest.raises(InvalidInputError):
            await eng.prune(10, status="running")


async def test_the_worker_prunes_periodically_on_the_engine_clock(store: Any) -> None:
    async with TestEnv([Job()], store=store, retention=DAY) as env:
        await env.start("job", {}, "a")
        await env.start("job", {"wait": True}, "active")
        await env.advance(DAY / 2)
        await env.start("job", {}, "b")
        await env.advance(DAY / 2 + 3600 + 1)  # a: settled a day ago, by the hourly prune
        assert {r.id for r in await env.engines[0].list_runs()} == {"active", "b"}
        await env.advance(DAY)
        assert {r.id for r in await env.engines[0].list_runs()} == {"active"}


def test_period() -> None:
    assert retention.period(30) == 30
    assert retention.period(30 * DAY) == 3600
