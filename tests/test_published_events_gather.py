"""Event waits in ``ctx.gather`` (docs/events.md), on every store: two waits side by side, a wait
next to a step, live and on replay; and a wait the run's cancellation abandons, which must
drop its registration and give back an event delivered to it and not received."""

from __future__ import annotations

import asyncio
from typing import Any

from flowkit import WorkflowCtx, replay_async, workflow
from flowkit.events import EventReceived
from flowkit_testing import TestEnv
from flowkit_testing._faults import Rule


@workflow(name="both")
class Both:
    """Waits for two events at once."""

    async def run(self, ctx: WorkflowCtx, key: str) -> Any:
        a, b = await ctx.gather(
            ctx.wait_for_event("ea", match={"k": key}), ctx.wait_for_event("eb")
        )
        return [a, b]


def add(x: int) -> int:
    return x + 1


@workflow(name="beside")
class Beside:
    """A wait for an event next to a step."""

    async def run(self, ctx: WorkflowCtx, x: int) -> Any:
        got, y = await ctx.gather(ctx.wait_for_event("ea"), ctx.step(add, x))
        return [got, y]


@workflow(name="first")
class First:
    """Waits for ``ea`` (any payload); cancelled, it reports so."""

    async def run(self, ctx: WorkflowCtx, _: Any) -> Any:
        return await ctx.wait_for_event("ea")


async def test_gather_two_event_waits(backend: Any) -> None:
    async with TestEnv([Both()], store=backend.store, instances=2) as env:
        await env.start("both", "x", "g1")
        await env.run_until_idle()
        assert (await env.get_run("g1")).status.value == "suspended"
        await env.publish_event("eb", 2, event_id="b1")
        await env.publish_event("ea", {"k": "x"}, event_id="a1")
        assert await env.result("g1") == [{"k": "x"}, 2]
        history = await env.history("g1")
        got = [e for e in history if isinstance(e, EventReceived)]
        assert sorted(e.event_id for e in got) == ["a1", "b1"]
    await replay_async(history, Both())  # (raises on a divergence)


async def test_gather_an_event_wait_beside_a_step(backend: Any) -> None:
    async with TestEnv([Beside()], store=backend.store) as env:
        await env.publish_event("ea", "early", event_id="a1")  # (buffered)
        await env.start("beside", 1, "s1")
        assert await env.result("s1") == ["early", 2]
        await env.start("beside", 5, "s2")
        await env.run_until_idle()
        assert (await env.get_run("s2")).status.value == "suspended"  # (the step is done)
        await env.publish_event("ea", "late", event_id="a2")
        assert await env.result("s2") == ["late", 6]
        history = await env.history("s2")
    await replay_async(history, Beside())


async def test_a_cancelled_wait_gives_back_the_event_delivered_to_it(backend: Any) -> None:
    """``ea`` is delivered to the gather's first wait, and the run is cancelled before it
    receives it (its worker died at the take). The cancellation abandons both waits: their
    registrations go, and ``ea`` is offered again: to ``late``, which started waiting after
    the publish (so the publish could not reach it), instead of being lost on a dead wait."""
    async with TestEnv([Both(), First()], store=backend.store, instances=2, seed=4) as env:
        await env.start("both", "x", "doomed")
        await env.run_until_idle()
        env.inject(Rule("take_event", "crash", "before", match=lambda a, kw: a[0] == "doomed"))
        done = await env.publish_event("ea", {"k": "x"}, event_id="a1")
        assert done.delivered == ("doomed",)
        assert len(env.crashed) == 1  # (the worker that took it up died before its take)
        await env.start("first", None, "late")  # (no run_until_idle: that lease must hold)
        assert (await env.get_run("late")).status.value == "suspended"
        await env.cancel("doomed")
        await env.advance(120)  # (the dead worker's lease expires: the cancellation runs)
        for i in env.crashed:
            await env.restart(i)
        await env.run_until_idle()
        assert (await env.get_run("doomed")).status.value == "cancelled"
        assert "event_received" not in (await env.history("doomed")).types
        assert await env.result("late") == {"k": "x"}
        # the other wait ("eb") is no longer registered: its event is buffered, not lost
        done = await env.publish_event("eb", 1, event_id="b1")
        assert done.buffered and done.delivered == ()


async def test_a_cancelled_wait_buffers_the_event_delivered_to_it(backend: Any) -> None:
    """As above, with nobody waiting when the wait is abandoned: the event goes back to the
    buffer, for the next waiter."""
    async with TestEnv([Both(), First()], store=backend.store, seed=5) as env:
        await env.start("both", "x", "doomed")
        await env.run_until_idle()
        env.inject(Rule("take_event", "crash", "before", match=lambda a, kw: a[0] == "doomed"))
        await env.publish_event("ea", {"k": "x"}, event_id="a1")
        assert env.crashed == [0]
        await env.restart(0)
        await env.cancel("doomed")
        await env.advance(120)
        assert (await env.get_run("doomed")).status.value == "cancelled"
        await env.start("first", None, "next")
        assert await env.result("next") == {"k": "x"}


async def test_a_cancelled_wait_in_a_body_that_goes_on_keeps_no_registration(
    backend: Any,
) -> None:
    """The body catches the cancellation of its gathered waits and goes on (a step, then its
    result): events published meanwhile are buffered for a later waiter, not delivered to
    the waits it left."""
    gate: asyncio.Event | None = None

    async def cleanup() -> str:
        assert gate is not None
        await gate.wait()
        return "cleaned"

    @workflow(name="cleaner")
    class Cleaner:
        async def run(self, ctx: WorkflowCtx, _: Any) -> Any:
            try:
                await ctx.gather(ctx.wait_for_event("ea"), ctx.wait_for_event("eb"))
            except asyncio.CancelledError:
                return await ctx.step(cleanup)
            return "received"

    gate = asyncio.Event()
    async with TestEnv([Cleaner(), First()], store=backend.store) as env:
        await env.start("cleaner", None, "c1")
        await env.run_until_idle()
        await env.cancel("c1")  # (the cleanup step now runs, held by the gate)
        assert (await env.get_run("c1")).status.value in ("running", "cancelling")
        done = await env.publish_event("ea", 7, event_id="a1")
        assert done.buffered and done.delivered == ()
        gate.set()
        await env.run_until_idle()
        await env.start("first", None, "next")
        assert await env.result("next") == 7
