"""A worker restarted under its old instance id takes that id's leases back at once (the
activations that held them died with the old process); a worker under another id still waits
for them to expire. Virtual time, so "at once" means "before the clock moves"."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowkit import Engine, RunStatus, WorkflowCtx, workflow
from flowkit.stores import CodecStore, MemoryStore, SqlStore
from flowkit.stores.codec import AESGCMCodec
from flowkit_testing import VirtualClock


@workflow(name="held")
class Held:
    def __init__(self) -> None:
        self.entered: list[str] = []
        self.gate = asyncio.Event()

    async def hold(self, who: str) -> str:
        self.entered.append(who)
        await self.gate.wait()
        return who

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        return str(await ctx.step(self.hold, ctx.run_id))


async def _quiet() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


@pytest.fixture(params=["memory", "sqlite", "codec"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    sql = SqlStore(f"sqlite:///{tmp_path / 'f.db'}")
    if request.param == "codec":
        yield CodecStore(sql, AESGCMCodec({"k1": bytes(32)}))
    else:
        yield sql
    sql.close()


@pytest.mark.parametrize("same_id", [True, False])
async def test_restart_under_the_same_instance_id_resumes_at_once(
    store: Any, same_id: bool
) -> None:
    clock = VirtualClock()
    wf = Held()
    first = Engine(store, [wf], clock=clock, instance_id="w-1", poll_interval=None)
    await first.start_worker()
    await first.start("held", None, "r1")
    await _quiet()
    assert wf.entered == ["r1"]
    assert first.executing("r1")
    await first.crash()  # a dead process: no lease given back
    assert not first.executing("r1")
    run = await store.get_run("r1")
    assert run is not None and run.lease_owner == "w-1" and run.status is RunStatus.RUNNING

    again = Engine(
        store, [wf], clock=clock, instance_id="w-1" if same_id else "w-2", poll_interval=None
    )
    async with again:
        wf.gate.set()
        for _ in range(20):
            await _quiet()
            if len(wf.entered) == 2 or not same_id:
                break
        if same_id:
            assert await again.result("r1", timeout=5) == "r1"
            assert wf.entered == ["r1", "r1"]
            assert clock.now() == run.updated_at  # virtual time never moved
        else:
            assert wf.entered == ["r1"]  # another id waits for the lease to expire
            assert (await store.get_run("r1")).lease_owner == "w-1"  # type: ignore[union-attr]
