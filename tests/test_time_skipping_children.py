"""Time skipping does not jump to a parent's fallback look at its child (docs/testing.md):
a parent awaiting a child (``ctx.child``, ``handle.result()``) that is parked on a signal,
an event or an update looks at the child again every ``CHILD_POLL`` seconds, in case the
child's settlement never woke it; that look is a safety net, not a time at which anything is
due, so ``TestEnv.run_until_idle`` idles at once, and the child's settlement wakes the parent.
A durable timer of the parent is still jumped to, and a child that settled without waking its
parent (the wake-up lost) is still found by the look.

Each behaviour runs on MemoryStore, a SQLite file and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit.events import TimerFired
from flowkit_testing import TestEnv
from flowkit_testing._faults import Rule

try:
    from store_kit import PG, Backend, make_backend
except ImportError:  # tests/ imported as a package
    from tests.store_kit import PG, Backend, make_backend

MODES = ("signal", "event", "update")


@pytest.fixture(params=["memory", "sqlite", PG])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = make_backend(request.param, request, tmp_path)
    yield b
    b.close()


@workflow(name="parked-kid", signals={"go": int}, updates={"change": int})
class Kid:
    """Parks on a signal, an event or an update (``input``), then returns what it got."""

    async def run(self, ctx: WorkflowCtx, input: str) -> int:
        if input == "signal":
            return int(await ctx.wait_for_signal("go"))
        if input == "event":
            return int((await ctx.wait_for_event("news"))["n"])
        upd = await ctx.wait_for_update("change")
        await upd.reply(upd.arg + 1)
        return int(upd.arg)


@workflow(name="awaiting-parent")
class Parent:
    """Awaits the child ``kid`` with ``ctx.child`` or, given ``"handle"``, ``handle.result()``."""

    async def run(self, ctx: WorkflowCtx, input: list[str]) -> int:
        how, mode = input
        if how == "handle":
            handle = await ctx.start_child(Kid, mode, run_id="kid")
            return int(await handle.result()) * 10
        return int(await ctx.child(Kid, mode, run_id="kid")) * 10


@workflow(name="sleepy-parent")
class SleepyParent:
    """Awaits the child and, meanwhile, a ten-minute durable timer."""

    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        got, _ = await ctx.gather(ctx.child(Kid, "signal", run_id="kid"), ctx.sleep(600))
        return int(got)


def count_jumps(env: TestEnv) -> list[float]:
    """The instants ``env``'s time skipping jumps to, from now on."""
    jumps: list[float] = []
    jump = env._jump

    async def counted(to: float) -> None:
        jumps.append(to)
        await jump(to)

    env._jump = counted  # type: ignore[method-assign]
    return jumps


async def release(env: TestEnv, mode: str) -> Any:
    """Let the parked child go (it returns 7); an update's reply."""
    if mode == "signal":
        await env.signal("kid", "go", 7)
    elif mode == "event":
        await env.publish_event("news", {"n": 7})
    else:
        reply = await env._client().update("kid", "change", 7, timeout=5)
        await env.settle()
        return reply
    return None


@pytest.mark.parametrize("how", ["child", "handle"])
@pytest.mark.parametrize("mode", MODES)
async def test_run_until_idle_idles_while_the_child_is_parked(
    mode: str, how: str, backend: Backend
) -> None:
    async with TestEnv([Parent(), Kid()], store=backend.store) as env:
        jumps = count_jumps(env)
        start = env.clock.now()
        await env.start("awaiting-parent", [how, mode], "p")
        await env.run_until_idle(max_jumps=10)
        assert jumps == []  # (before the fix: a jump every CHILD_POLL seconds, for ever)
        assert env.clock.now() == start
        assert (await env.get_run("p")).status is RunStatus.SUSPENDED
        assert (await env.get_run("kid")).status is RunStatus.SUSPENDED
        reply = await release(env, mode)
        assert reply == (8 if mode == "update" else None)
        # the child's settlement woke the parent: no jump needed for either to finish
        assert (await env.get_run("kid")).status is RunStatus.COMPLETED
        assert (await env.get_run("p")).status is RunStatus.COMPLETED
        assert await env.result("p") == 70
        assert jumps == []


async def test_a_durable_timer_of_the_parent_is_still_jumped_to(backend: Backend) -> None:
    async with TestEnv([SleepyParent(), Kid()], store=backend.store) as env:
        jumps = count_jumps(env)
        start = env.clock.now()
        await env.start("sleepy-parent", None, "p")
        await env.run_until_idle(max_jumps=10)
        # one jump, to the timer (the looks at 60 s, 120 s, ... are not due times)
        assert jumps == [start + 600]
        history = await env.history("p")
        assert any(isinstance(e, TimerFired) for e in history.events)
        assert (await env.get_run("p")).status is RunStatus.SUSPENDED
        await env.signal("kid", "go", 5)
        assert (await env.get_run("p")).status is RunStatus.COMPLETED
        assert await env.result("p") == 5
        assert len(jumps) == 1


async def test_a_lost_wake_up_is_found_by_the_fallback_look(backend: Backend) -> None:
    # every delivery of the child's wake-up to its parent fails: only the look finds it
    lost = Rule(
        "deliver_signal",
        times=None,
        match=lambda args, kwargs: str(args[1]).startswith("flowkit:child:"),
    )
    async with TestEnv([Parent(), Kid()], store=backend.store) as env:
        env.inject(lost)
        await env.start("awaiting-parent", ["child", "signal"], "p")
        await env.run_until_idle(max_jumps=10)
        jumps = count_jumps(env)
        await env.signal("kid", "go", 3)
        assert (await env.get_run("kid")).status is RunStatus.COMPLETED
        assert (await env.get_run("p")).status is RunStatus.SUSPENDED  # not woken
        assert lost.fired > 0
        await env.run_until_idle(max_jumps=10)
        assert (await env.get_run("p")).status is RunStatus.COMPLETED
        assert await env.result("p") == 30
        assert jumps  # it took the look, a jump away


async def test_advance_passes_the_looks_without_stopping_at_each(backend: Backend) -> None:
    async with TestEnv([Parent(), Kid()], store=backend.store) as env:
        await env.start("awaiting-parent", ["child", "signal"], "p")
        jumps = count_jumps(env)
        start = env.clock.now()
        await env.advance(3600)  # sixty looks' worth
        assert jumps == [start + 3600]  # (the looks it passed are taken at its end)
        assert (await env.get_run("p")).status is RunStatus.SUSPENDED
        await env.signal("kid", "go", 2)
        assert (await env.get_run("p")).status is RunStatus.COMPLETED
