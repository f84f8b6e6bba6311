"""A reader in another process is woken by the store's wake-ups (``SqlStore.watch``) when the
value it waits for is recorded: ``engine.get_event``'s first value and ``engine.update``'s
reply, on a SQLite file (its counter) and on PostgreSQL (``LISTEN``/``NOTIFY``). Two store
objects on one database stand for the two processes, each engine with a bus of its own; the
readers' fallback poll is pushed out of reach, so only a wake-up can answer them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore

try:
    from store_kit import KINDS, database_url
except ImportError:  # tests/ imported as a package
    from tests.store_kit import KINDS, database_url

BOUND = 60.0  # seconds: only so that a lost wake-up fails the test instead of hanging it


class Change(BaseModel):
    amount: int


# (it declares its messages, so its signal too: a name left out would be refused)
@workflow(name="progress", updates={"change": Change}, signals={"go": None})
class Progress:
    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        await ctx.wait_for_signal("go")
        ctx.set_event("stage", "one")
        await ctx.set_event("stage", "two")
        upd = await ctx.wait_for_update("change")
        await upd.reply(upd.arg.amount + 1)
        return upd.arg.amount


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return database_url(request.param, request, tmp_path)


@pytest.fixture
def stores(url: str) -> Iterator[Callable[..., SqlStore]]:
    opened: list[SqlStore] = []

    def new(**kw: Any) -> SqlStore:
        s = SqlStore(url, **kw)
        opened.append(s)
        return s

    yield new
    for s in opened:
        s.close()


async def test_readers_in_another_process_are_woken_by_the_store(
    stores: Callable[..., SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("flowkit._client.history_wait.POLL_MIN", 3600.0)
    worker = Engine(stores(), [Progress()], poll_interval=60)
    client = Engine(stores(), [Progress()], worker=False)
    assert worker.bus is not client.bus
    async with worker:
        await client.start("progress", None, "p1")
        reader = asyncio.ensure_future(client.get_event("p1", "stage"))
        # (the reader's watcher and the worker's listen: a wake-up sent before one of them
        # listens is lost, and the worker's own poll is a minute away)
        for engine in (client, worker):
            hub = None
            while hub is None or not hub.ready.is_set():
                await asyncio.sleep(0.01)
                hub = engine.store._db.hub()  # type: ignore[attr-defined]
        assert not reader.done()
        await client.signal("p1", "go")
        assert await asyncio.wait_for(reader, BOUND) == "two"
        reply = await asyncio.wait_for(client.update("p1", "change", {"amount": 41}), BOUND)
        assert reply == 42
        assert await asyncio.wait_for(client.result("p1"), BOUND) == 41
