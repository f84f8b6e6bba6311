"""``Engine.result``: woken by the settlement (the bus) of a run executing on any engine that
shares the bus, by the end of an activation here that did not settle it, and otherwise by a
bounded fallback read of the store; ``timeout`` says which run, its status and the likely
cause."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import flowkit
from flowkit import Engine, RunStatus, WorkflowCtx, workflow
from flowkit.stores import MemoryStore


@workflow(name="greet")
class Greet:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        return await ctx.wait_for_signal("go") if input == "wait" else f"hi {input}"


class Reads(MemoryStore):
    """Counts ``get_run`` calls (``result``'s reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get_run(self, run_id: str) -> Any:
        self.reads += 1
        return await super().get_run(run_id)


async def until(cond: Callable[[], Awaitable[bool]]) -> None:
    for _ in range(1000):  # bounded polling of a condition, not a timed guess
        if await cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never became true")


def holding(release: asyncio.Event) -> Any:
    @workflow(name="hold")
    class Hold:
        async def wait(self) -> str:
            await release.wait()
            return "held"

        async def run(self, ctx: WorkflowCtx, _: int) -> str:
            return str(await ctx.step(self.wait))

    return Hold()


# -- the timeout error ----------------------------------------------------------------------


async def test_result_on_an_engine_never_entered_names_the_run_and_the_cause() -> None:
    engine = Engine(MemoryStore(), [Greet()])  # no ``async with``: no worker runs
    await engine.start("greet", "ada", "welcome-ada")
    with pytest.raises(flowkit.ResultTimeoutError) as info:
        await engine.result("welcome-ada", timeout=0.05)
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, flowkit.FlowkitError)
    assert (err.run_id, err.status, err.timeout) == ("welcome-ada", "pending", 0.05)
    text = str(err)
    assert "'welcome-ada'" in text and "'pending'" in text
    assert "worker is not running" in text and "async with engine" in text


async def test_result_timeout_of_a_waiting_run_says_what_it_waits_for() -> None:
    async with Engine(MemoryStore(), [Greet()]) as engine:
        await engine.start("greet", "wait", "w")
        with pytest.raises(flowkit.ResultTimeoutError, match="signal\\(s\\) go") as info:
            await engine.result("w", timeout=0.05)
        assert info.value.status == "suspended"
        await engine.signal("w", "go", "done")
        assert await engine.result("w", timeout=5) == "done"


async def test_result_of_an_unknown_run_is_not_a_timeout() -> None:
    async with Engine(MemoryStore(), [Greet()]) as engine:
        with pytest.raises(flowkit.RunNotFoundError):
            await engine.result("nope", timeout=0.05)


# -- what wakes it ----------------------------------------------------------------------------


async def test_a_settlement_here_wakes_result_without_reading_the_store_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While an activation of the run is here, ``result`` reads nothing: the settling commit
    hands it the snapshot (the fallback read is far off)."""
    monkeypatch.setattr("flowkit._client.engine.RESULT_POLL", 0.01)
    monkeypatch.setattr("flowkit._client.engine.RESULT_POLL_HERE", 3600.0)
    release = asyncio.Event()
    store = Reads()
    async with Engine(store, [holding(release)]) as engine:
        await engine.start("hold", 0, "h")
        waiting = asyncio.ensure_future(engine.result("h", timeout=10))
        await until(
            lambda: _true(engine._core.worker is not None and engine._core.worker.holds("h"))
        )
        await asyncio.sleep(0.1)  # ten fallback periods of a run elsewhere
        mark = store.reads
        await asyncio.sleep(0.1)
        assert store.reads == mark  # no read while it executes here
        release.set()
        assert await asyncio.wait_for(waiting, 2) == "held"
        assert store.reads == mark  # the settled snapshot came with the wake-up


async def test_a_run_that_leaves_this_worker_unsettled_is_read_again_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run that suspends here and is then finished by an engine with a bus of its own: the
    end of the activation here sends ``result`` back to the store, whose fallback reads see
    the settlement (without that, it would wait for the far-off read of a run held here)."""
    monkeypatch.setattr("flowkit._client.engine.RESULT_POLL", 0.01)
    monkeypatch.setattr("flowkit._client.engine.RESULT_POLL_HERE", 3600.0)
    store = MemoryStore()
    async with Engine(store, [Greet()], poll_interval=None) as here:
        await here.start("greet", "wait", "w")
        waiting = asyncio.ensure_future(here.result("w", timeout=10))
        await until(lambda: _status(store, "w", RunStatus.SUSPENDED))
        await here.stop()  # (so that the other engine runs it)
        async with Engine(store, [Greet()], poll_interval=None) as other:  # its own bus
            await other.signal("w", "go", "elsewhere")
            assert await asyncio.wait_for(waiting, 2) == "elsewhere"  # (long before 10 s)


async def test_result_sees_a_run_queued_here_but_completed_by_another_instance() -> None:
    """A run only queued here (the engine is full) and settled by an engine with a bus of its
    own (another process, say) is seen by the fallback reads."""
    release = asyncio.Event()

    @workflow(name="quick")
    class Quick:
        async def run(self, ctx: WorkflowCtx, _: int) -> str:
            return "done"

    async def x_queued() -> bool:
        return full.executing("x")

    store = MemoryStore()
    workflows = [holding(release), Quick()]
    full = flowkit.Engine(store, workflows, max_concurrency=1, poll_interval=0.01)
    client = Engine(store, workflows, worker=False)
    other: Engine | None = None
    async with full:
        try:
            await full.start("hold", 0, "b")
            await client.start("quick", 0, "x")
            await until(x_queued)
            other = Engine(store, workflows, poll_interval=0.01)  # its own bus
            await other.start_worker()
            await until(lambda: _status(store, "x", RunStatus.COMPLETED))
            assert full.executing("x")  # still queued here
            assert await full.result("x", timeout=2) == "done"
        finally:
            release.set()
            if other is not None:
                await other.stop()


async def _true(value: bool) -> bool:
    return value


async def _status(store: MemoryStore, run_id: str, status: RunStatus) -> bool:
    run = await store.get_run(run_id)
    return run is not None and run.status is status
