"""``await engine.serve()`` in code (DESIGN §12) on every store: cancelled, it drains as
``flowkit worker`` does on SIGTERM: the step running then may end within the grace and is
recorded, no new step starts, and the lease is given back for another engine to take at once.
The processes and signals themselves: tests/test_worker_drain.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores.base import Store

TTL = 300.0  # never reached: the runs below go on because a lease was given back


def job(gate: asyncio.Event, began: asyncio.Event) -> Any:
    async def step(n: int) -> int:
        began.set()
        await gate.wait()
        return n

    @workflow(name="serve_job")
    class Job:
        async def run(self, ctx: WorkflowCtx, x: int) -> int:
            a = await ctx.step(step, 1)
            b = await ctx.step(step, 2)
            return x + a + b

    return Job


async def _served(store: Store, grace: float) -> tuple[Any, str, asyncio.Event, list[str]]:
    """A run of ``serve_job`` mid-step on a served engine whose ``serve`` is then cancelled;
    the gate opens during the drain if it has a grace, else after it. Returns the workflow,
    run id, gate and the event types."""
    gate, began = asyncio.Event(), asyncio.Event()
    wf = job(gate, began)
    engine = Engine(store, [wf], instance_id="one", lease_ttl=TTL, poll_interval=0.05)
    serving = asyncio.ensure_future(engine.serve(grace))
    run = await engine.start(wf, 10)
    await asyncio.wait_for(began.wait(), 30)
    worker = engine._worker
    assert worker is not None
    serving.cancel()
    while not worker.draining:  # noqa: ASYNC110 - (the gate opens during the drain)
        await asyncio.sleep(0)
    if grace:
        gate.set()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(serving, 30)
    gate.set()
    after = await store.get_run(run.id)
    assert after is not None and after.status.active and after.lease_owner is None
    return wf, run.id, gate, [e.type for e in await store.load_events(run.id)]


async def _finish(store: Store, wf: Any, run_id: str) -> Any:
    async with Engine(store, [wf], instance_id="two", lease_ttl=TTL, poll_interval=0.05) as e:
        return await e.result(run_id, timeout=30)


async def test_serve_drains_at_the_next_durable_point(store: Store) -> None:
    wf, run_id, _gate, types = await _served(store, grace=30)
    assert types.count("step_completed") == 1  # the running step ended; the next never began
    assert await _finish(store, wf, run_id) == 13


async def test_serve_gives_the_lease_back_after_the_grace(store: Store) -> None:
    wf, run_id, _gate, types = await _served(store, grace=0)
    assert "step_completed" not in types  # abandoned mid-step: the next engine runs it again
    assert await _finish(store, wf, run_id) == 13


async def test_serve_needs_a_worker(store: Store) -> None:
    with pytest.raises(RuntimeError, match="worker"):
        await Engine(store, worker=False).serve()
    with pytest.raises(ValueError, match="grace"):
        await Engine(store).serve(-1)
