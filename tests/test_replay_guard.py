"""Awaits a replay cannot reproduce are caught (``flowkit/_replay/guard.py``; docs/
writing-workflows.md, "Await only ctx calls").

A workflow body may only await ctx calls. A bare ``asyncio.sleep``, an ``asyncio.Event``, an
``asyncio.gather`` or a task, a cancellation flowkit did not request (``asyncio.timeout``
around a ctx call) and a ctx call that is never awaited all fail the activation with a
``NonDeterminismError`` that says what to use instead: the run goes ``blocked``, its history
stays as it was, and a fixed deployment picks it up from there."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections import Counter
from typing import Any

import pytest

import flowkit
from flowkit import NonDeterminismError, RunStatus, StepFailedError, WorkflowCtx, workflow
from flowkit_testing import TestEnv

HERE = __file__.rsplit("/", 1)[-1]


class Services:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.gate = asyncio.Event()

    def mark(self, what: str) -> str:
        self.calls[what] += 1
        return what

    async def slow(self) -> str:
        self.calls["slow"] += 1
        await self.gate.wait()  # nobody sets it
        return "slow result"

    async def bounded(self) -> str:
        """The fix for a timeout around a step: the timeout inside the step function."""
        self.calls["bounded"] += 1
        try:
            async with asyncio.timeout(0):
                await self.gate.wait()
        except TimeoutError:
            return "gave up inside the step"
        return "slow result"


@workflow(name="trap")
class Trap:
    """``input`` names the trap the body falls into after its first step."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    async def run(self, ctx: WorkflowCtx, trap: str) -> str:
        svc = self.svc
        await ctx.step(svc.mark, "before")
        if trap == "timeout-around-step":
            try:
                async with asyncio.timeout(0):
                    return await ctx.step(svc.slow)
            except TimeoutError:
                return "timed out"
        if trap == "timeout-around-gather":
            try:
                async with asyncio.timeout(0):
                    await ctx.gather(ctx.step(svc.slow), ctx.step(svc.mark, "sibling"))
            except TimeoutError:
                return "timed out"
        if trap == "wait-for-around-step":
            try:
                return await asyncio.wait_for(ctx.step(svc.slow), 5)
            except TimeoutError:
                return "timed out"
        if trap == "asyncio-sleep":
            await asyncio.sleep(5)
        if trap == "asyncio-sleep-0":
            await asyncio.sleep(0)
        if trap == "event":
            await asyncio.Event().wait()
        if trap == "asyncio-gather":
            await asyncio.gather(ctx.step(svc.mark, "a"), ctx.step(svc.mark, "b"))
        if trap == "create-task":
            await asyncio.create_task(ctx.step(svc.mark, "a"))
        if trap == "in-gather-child":

            async def child() -> str:
                await ctx.step(svc.mark, "child")
                await asyncio.sleep(1)
                return "child"

            await ctx.gather(child(), ctx.step(svc.mark, "sibling"))
        if trap == "forgotten-await":
            ctx.step(svc.mark, "forgotten")  # type: ignore[unused-coroutine]
        if trap == "forgotten-await-then-a-call":
            ctx.step(svc.mark, "forgotten")  # type: ignore[unused-coroutine]
            await ctx.step(svc.mark, "after")
        if trap == "forgotten-sleep":
            ctx.sleep(10)  # type: ignore[unused-coroutine]
            await ctx.step(svc.mark, "after")
        if trap == "awaited-out-of-order":
            first = ctx.step(svc.mark, "first")
            await ctx.step(svc.mark, "second")
            await first
        return "done"


async def _blocked(env: TestEnv, trap: str) -> tuple[str, flowkit.History]:
    """Start a run falling into ``trap``: it must end up ``blocked``, with only steps that
    completed recorded; the error message."""
    await env.start("trap", trap, trap)
    await env.settle()
    run = await env.get_run(trap)
    assert run.status is RunStatus.BLOCKED, run
    assert run.error is not None and run.error["type"] == "NonDeterminismError"
    h = await env.history(trap)
    assert h.types[:2] == ["run_started", "step_completed"]
    assert set(h.types[1:]) == {"step_completed"}
    return str(run.error["message"]), h


@pytest.mark.parametrize(
    ("trap", "what"),
    [
        ("asyncio-sleep", "asyncio.tasks.sleep()"),
        ("asyncio-sleep-0", "asyncio.tasks.sleep()"),
        ("event", "asyncio.locks.Event.wait()"),
        ("asyncio-gather", "asyncio.gather(...) (use ctx.gather)"),
        ("create-task", "task "),
        ("in-gather-child", "asyncio.tasks.sleep()"),
    ],
)
async def test_an_await_that_is_not_a_ctx_call_blocks_the_run(trap: str, what: str) -> None:
    svc = Services()
    async with TestEnv([Trap(svc)]) as env:
        message, h = await _blocked(env, trap)
        assert what in message
        assert "not a ctx call" in message
        assert "ctx.sleep()" in message and "ctx.gather()" in message
        assert f"{HERE}:" in message  # the line of the workflow that awaits it
        # the other ctx calls made alongside never ran
        assert svc.calls["a"] == svc.calls["b"] == 0
        await env.advance(120)  # re-checked: the same code blocks again, still nothing written
        assert (await env.get_run(trap)).status is RunStatus.BLOCKED
        assert await env.history(trap) == h


@pytest.mark.parametrize(
    ("trap", "in_write"),
    [
        ("timeout-around-step", False),
        ("timeout-around-step", True),
        ("timeout-around-gather", False),
    ],
)
async def test_a_timeout_around_ctx_calls_blocks_the_run_instead_of_branching(
    trap: str, in_write: bool
) -> None:
    """The cancelled step records nothing: taking the "timed out" branch would be undone by
    the next replay (which runs the step again). The run is blocked instead. The timeout
    fires in the step function, or (the store yields before each call) in the write that
    records the first step before the next starts: that record is kept all the same."""
    svc = Services()
    async with TestEnv([Trap(svc)], max_yields=2 if in_write else 0, seed=1) as env:
        message, h = await _blocked(env, trap)
        assert "cancelled by code outside flowkit" in message
        assert "asyncio.timeout" in message and "ctx.step(fn, ..., timeout=seconds)" in message
        assert svc.calls["slow"] == (0 if in_write else 1)
        assert "step_failed" not in h.types


async def test_wait_for_around_a_step_blocks_the_run_and_names_the_step_timeout() -> None:
    """``asyncio.wait_for`` around a step (an await of its own, the step in a task of its
    own) is refused, and the message points to the recorded alternative, ``ctx.step(...,
    timeout=...)``; the step never ran."""
    svc = Services()
    async with TestEnv([Trap(svc)]) as env:
        message, h = await _blocked(env, "wait-for-around-step")
        assert "asyncio.tasks.wait_for()" in message and "not a ctx call" in message
        assert "ctx.step(fn, ..., timeout=seconds)" in message
        assert "step_failed" not in h.types
        assert svc.calls["slow"] == 0


async def test_a_bare_await_names_the_step_timeout_as_the_way_to_bound_io() -> None:
    svc = Services()
    async with TestEnv([Trap(svc)]) as env:
        message, _ = await _blocked(env, "asyncio-sleep")
        assert "ctx.step(fn, ..., timeout=seconds)" in message


async def test_the_blocked_run_continues_on_fixed_code() -> None:
    """Blocked by a timeout around a step; the deploy that moves the timeout into the step
    function replays the history (unchanged) and completes the run."""
    svc = Services()

    @workflow(name="trap")
    class Fixed(Trap):
        async def run(self, ctx: WorkflowCtx, trap: str) -> str:
            await ctx.step(self.svc.mark, "before")
            return await ctx.step(self.svc.bounded)

    async with TestEnv([Trap(svc)]) as env:
        _, before = await _blocked(env, "timeout-around-step")
        env.workflows = [Fixed(svc)]
        await env.restart(0)
        await env.advance(60)  # the blocked re-check replays it on the new code
        assert await env.result("timeout-around-step") == "gave up inside the step"
        h = await env.history("timeout-around-step")
        assert h.events[: len(before)] == before.events
        assert svc.calls["before"] == 1
        await flowkit.replay_async(h, Fixed(svc))
        with pytest.raises(NonDeterminismError, match=r"Services\.slow"):
            await flowkit.replay_async(h, Trap(svc))


async def test_replay_flags_a_bare_sleep_that_replaced_ctx_sleep() -> None:
    svc = Services()

    @workflow(name="napper")
    class Durable:
        async def run(self, ctx: WorkflowCtx, _: None) -> str:
            await ctx.sleep(5)
            return await ctx.step(svc.mark, "woke")

    @workflow(name="napper")
    class Bare:
        async def run(self, ctx: WorkflowCtx, _: None) -> str:
            await asyncio.sleep(5)
            return await ctx.step(svc.mark, "woke")

    async with TestEnv([Durable()]) as env:
        await env.start("napper", None, "n")
        assert await env.result("n") == "woke"
        h = await env.history("n")
    with pytest.raises(NonDeterminismError) as err:
        await flowkit.replay_async(h, Bare)
    assert err.value.position == "1"
    assert "timer_started" in str(err.value.recorded)
    assert "asyncio.tasks.sleep()" in str(err.value.call)


@pytest.mark.parametrize(
    ("trap", "call", "position"),
    [
        ("forgotten-await", "step('Services.mark')", "2"),
        ("forgotten-await-then-a-call", "step('Services.mark')", "2"),
        ("forgotten-sleep", "sleep", "2"),
        ("awaited-out-of-order", "step('Services.mark')", "2"),
    ],
)
async def test_a_ctx_call_never_awaited_blocks_the_run(trap: str, call: str, position: str) -> None:
    svc = Services()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with TestEnv([Trap(svc)]) as env:
            message, _ = await _blocked(env, trap)
        gc.collect()
    assert f"at position {position}:" in message
    assert f"{call}, never awaited" in message
    assert "missing `await`" in message
    assert svc.calls["forgotten"] == svc.calls["after"] == svc.calls["second"] == 0
    # flowkit's error replaces Python's warning: the call was closed, not left to the GC
    assert not [w for w in caught if "never awaited" in str(w.message)]


@workflow(name="fine")
class Fine:
    """What a body may do: await ctx calls directly, through its own helper coroutines, in
    ``ctx.gather`` (ctx calls and coroutines), several made first and awaited in order; step
    functions await whatever they like (a timeout inside one is its own failure)."""

    def __init__(self, svc: Services) -> None:
        self.svc = svc

    async def nap(self, n: int) -> int:
        await asyncio.sleep(0)
        async with asyncio.timeout(60):
            await asyncio.sleep(0)
        return n

    async def helper(self, ctx: WorkflowCtx, n: int) -> int:
        await ctx.sleep(1)
        return await ctx.step(self.nap, n)

    async def run(self, ctx: WorkflowCtx, _: None) -> list[Any]:
        out: list[Any] = [await self.helper(ctx, 1)]
        out += await ctx.gather(ctx.step(self.nap, 2), self.helper(ctx, 3), ctx.sleep(2))
        made = [ctx.step(self.nap, i) for i in (4, 5)]
        for call in made:
            out.append(await call)
        try:
            await ctx.step(self.svc.bounded)  # returns normally: its own timeout
            await ctx.step(self.timeout_escapes)
        except StepFailedError as err:
            out.append(err.error_type)
        return out

    async def timeout_escapes(self) -> None:
        async with asyncio.timeout(0):
            await self.svc.gate.wait()


async def test_what_a_body_may_await_still_runs_and_replays() -> None:
    svc = Services()
    async with TestEnv([Fine(svc)]) as env:
        await env.start("fine", None, "f")
        assert await env.result("f") == [1, 2, 3, None, 4, 5, "TimeoutError"]
        h = await env.history("f")
        assert "run_completed" in h.types
        await flowkit.replay_async(h, Fine(svc))


@workflow(name="self-cancelling")
class SelfCancelling:
    async def cancels_itself(self) -> str:
        raise asyncio.CancelledError()  # nobody cancelled it

    async def run(self, ctx: WorkflowCtx, _: None) -> str:
        try:
            return await ctx.step(self.cancels_itself)
        except StepFailedError as err:
            return f"failed: {err.error_type}"


async def test_a_step_raising_cancelled_error_itself_is_a_recorded_failure() -> None:
    """No cancellation was requested and the task was not cancelled: the step's own
    ``CancelledError`` is its failure, recorded like any other (so replay raises it again)."""
    async with TestEnv([SelfCancelling()]) as env:
        await env.start("self-cancelling", None, "s")
        assert await env.result("s") == "failed: CancelledError"
        h = await env.history("s")
        failed = [e for e in h if e.type == "step_failed"]
        assert len(failed) == 1 and not failed[0].cancelled  # type: ignore[attr-defined]
        await flowkit.replay_async(h, SelfCancelling)
