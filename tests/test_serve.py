"""``await engine.serve()`` in code (docs/deploying.md) on every store: cancelled, it drains as
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
    worker = engine._core.worker
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


async def _until(check: Any, what: str) -> None:
    """Poll ``check()`` (async) until it holds, for at most 30 s (a condition, not a sleep)."""
    for _ in range(3000):
        if await check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_a_drain_keeps_the_step_a_sibling_branch_finished(store: Store) -> None:
    """In a ``ctx.gather``, branch B stops at its next step and waits for branch A's step; A's
    step ends and A parks on a signal wait (which writes nothing): A's record must be durable
    before the worker lets go, or the next worker runs A's step again."""
    calls = {"a1": 0}
    gate_a, gate_b, began_a, began_b = (asyncio.Event() for _ in range(4))

    async def a1() -> str:
        calls["a1"] += 1
        began_a.set()
        await gate_a.wait()
        return "a1"

    async def b1() -> str:
        began_b.set()
        await gate_b.wait()
        return "b1"

    async def b2() -> str:
        return "b2"

    @workflow(name="drain-gather")
    class Gathered:
        async def run(self, ctx: WorkflowCtx, x: int) -> list[Any]:
            async def a() -> Any:
                return [await ctx.step(a1), await ctx.wait_for_signal("go")]

            async def b() -> Any:
                return [await ctx.step(b1), await ctx.step(b2)]

            return await ctx.gather(a(), b())

    engine = Engine(store, [Gathered], instance_id="one", lease_ttl=300, poll_interval=0.05)
    serving = asyncio.ensure_future(engine.serve(1.0))
    run = await engine.start(Gathered, 1)
    await asyncio.wait_for(asyncio.gather(began_a.wait(), began_b.wait()), 30)
    worker = engine._core.worker
    assert worker is not None
    serving.cancel()

    async def draining() -> bool:
        return worker.draining

    await _until(draining, "the worker drains")
    gate_b.set()  # b1 ends; B reaches b2 and stops there, waiting for A's step

    async def recorded(name: str) -> Any:
        async def check() -> bool:
            events = await store.load_events(run.id)
            return any(e.type == "step_completed" and name in e.name for e in events)

        return check

    await _until(await recorded("b1"), "b1 is recorded")
    gate_a.set()  # a1 ends; A parks on its signal wait
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(serving, 30)
    assert await (await recorded("a1"))()  # durable before the worker let go
    async with Engine(store, [Gathered], instance_id="two", lease_ttl=300) as other:
        await other.signal(run.id, "go", 5)
        assert await other.result(run.id, timeout=30) == [["a1", 5], ["b1", "b2"]]
    assert calls["a1"] == 1  # never run again
