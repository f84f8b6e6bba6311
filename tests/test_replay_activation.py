"""The activation (``flowkit/_replay/activation.py``): its body starts ahead of other ready
work, and a finished activation leaves no reference cycle behind."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

import pytest

from flowkit import RetryPolicy, RunStatus, WorkflowCtx, workflow
from flowkit_testing import TestEnv


async def test_a_step_and_a_handed_run_start_before_other_ready_work() -> None:
    """``start_next`` (a step's task, a run a release handed over) puts the new task's first
    step at the front of the event loop's ready queue: it continues the work that created it
    instead of waiting behind every other run's ready callbacks."""
    from flowkit._core.ready_queue import start_next

    order: list[str] = []

    async def mine() -> None:
        order.append("started next")

    loop = asyncio.get_running_loop()
    loop.call_soon(order.append, "ready before")
    loop.call_soon(order.append, "ready before, too")
    task = start_next(mine())
    await task
    assert order[0] == "started next"
    assert order[1:] == ["ready before", "ready before, too"]


# -- no reference cycles ---------------------------------------------------------------


async def test_a_finished_activation_is_freed_without_the_cyclic_gc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An activation, its body's task and the context that task runs in are freed by
    refcounting as soon as the run's activation is over (completed, suspended or failed):
    no reference cycle is left for the cyclic GC, whose pauses hold up every run of the
    process (a handover's latency among them)."""
    from flowkit._replay import Activation

    alive: list[weakref.ref[Activation]] = []
    real = Activation.__init__

    def tracked(self: Activation, *a: Any, **k: Any) -> None:
        real(self, *a, **k)
        alive.append(weakref.ref(self))

    monkeypatch.setattr(Activation, "__init__", tracked)

    def boom(x: int) -> int:
        raise ValueError(f"no {x}")

    @workflow(name="naps")
    class Naps:
        async def run(self, ctx: WorkflowCtx, input: int) -> int:
            x = await ctx.step(lambda: input + 1, name="inc")
            await ctx.sleep(5)
            if input % 2:
                await ctx.step(boom, x, retry=RetryPolicy(max_attempts=1))
            return x

    gc.collect()
    gc.disable()
    try:
        async with TestEnv([Naps()]) as env:
            for i in range(4):
                await env.start("naps", i, f"r{i}")
            await env.run_until_idle()
            for i in range(4):
                run = await env.get_run(f"r{i}")
                assert run is not None
                assert run.status is (RunStatus.FAILED if i % 2 else RunStatus.COMPLETED)
            assert len(alive) == 8  # (two activations a run: before and after its sleep)
            assert [r for r in alive if r() is not None] == []
    finally:
        gc.enable()
