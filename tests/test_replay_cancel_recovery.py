"""A cancellation requested while the run's worker is dead, or while the body is between two
awaits, is delivered: the recovered body sees ``CancelledError`` at its first await the history
does not answer (``ActivationState.request_cancel``, delivered by ``flowkit/_replay/steps.py`` and
``waits.py``; docs/writing-workflows.md, "Cancellation").

Cancellation is *requested* (the run is ``cancelling``, ``cancel_requested`` is in the history)
and then *delivered* to each branch of the body once. A recovered activation replays what the
history records unchanged (a cancelled ``step_failed`` raises ``CancelledError`` again, cleanup
steps return their results) and delivers a cancellation not delivered yet at the first new
step (recorded there as a cancelled attempt that never started) or durable wait."""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from typing import Any

import pytest
from singleton_kit import history, holders, inp, make_lane

import flowkit
from flowkit import Engine, RetryPolicy, RunStatus, WorkflowCtx, workflow
from flowkit.events import StepFailed
from flowkit_testing import TestEnv


@workflow(name="hold")
class Hold:
    """``input`` picks where the body is when its worker dies (or the run suspends):
    ``first`` (in its first step), ``step`` (in a step after a first one), ``sleep``,
    ``signal``, ``backoff`` (between attempts of a retried step) or ``gather`` (one branch in
    a step, one sleeping). A cancellation runs the ``cleanup`` step and propagates."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.gates: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)

    def mark(self, what: str) -> str:
        self.calls[what] += 1
        return what

    async def block(self, what: str) -> str:
        self.calls[what] += 1
        await self.gates[what].wait()
        return what

    def flaky(self) -> str:
        self.calls["flaky"] += 1
        if self.calls["flaky"] == 1:
            raise ConnectionError("first attempt fails")
        return "ok"

    async def run(self, ctx: WorkflowCtx, where: str) -> str:
        try:
            if where != "first":
                await ctx.step(self.mark, "setup")
            if where in ("first", "step"):
                await ctx.step(self.block, "work")
            elif where == "sleep":
                await ctx.sleep(60)
            elif where == "signal":
                await ctx.wait_for_signal("go")
            elif where == "backoff":
                policy = RetryPolicy(max_attempts=3, initial_interval=10)
                await ctx.step(self.flaky, retry=policy)
            elif where == "gather":
                await ctx.gather(ctx.step(self.block, "work"), ctx.sleep(10))
            await ctx.step(self.mark, "after")
        except asyncio.CancelledError:
            await ctx.step(self.mark, "cleanup")
            raise
        return "done"


async def _assert_cancelled_with_cleanup(env: TestEnv, wf: Hold, run_id: str) -> flowkit.History:
    run = await env.store.get_run(run_id)
    assert run is not None and run.status is RunStatus.CANCELLED, run
    assert wf.calls["cleanup"] == 1
    assert wf.calls["after"] == 0
    h = flowkit.History(run_id, await env.store.load_events(run_id))
    assert h.types[-1] == "run_cancelled"
    assert h.types.count("cancel_requested") == 1
    # the cleanup step is recorded after the request
    requested = next(e.seq for e in h if e.type == "cancel_requested")
    cleanup = [e for e in h if e.type == "step_completed" and e.result == "cleanup"]
    assert len(cleanup) == 1 and cleanup[0].seq > requested
    await flowkit.replay_async(h, Hold)  # the history replays as it was recorded
    return h


@pytest.mark.parametrize("where", ["first", "step", "gather"])
async def test_cancel_while_the_worker_is_dead_reaches_the_recovered_step(
    store: Any, where: str
) -> None:
    wf = Hold()
    async with TestEnv([wf], instances=2, store=store) as env:
        await env.engines[0].start("hold", where, "r")
        await env.settle()
        assert wf.calls["work"] == 1
        await env.crash(0)  # the step is lost with its worker; the lease runs on
        run = await env.engines[1].cancel("r")
        assert run.status is RunStatus.CANCELLING
        await env.advance(300)  # the lease expires: instance 1 recovers the run

        h = await _assert_cancelled_with_cleanup(env, wf, "r")
        assert wf.calls["work"] == 1  # delivered in place of the step: it did not run again
        failed = [e for e in h if isinstance(e, StepFailed)]
        assert len(failed) == 1 and failed[0].cancelled
        assert failed[0].name == "Hold.block"
        assert failed[0].error.message == "cancelled before it started"
        assert failed[0].seq > next(e.seq for e in h if e.type == "cancel_requested")
        # a due timer of the cancelled run does not fire
        assert "timer_fired" not in h.types
        wf.gates["work"].set()
        await env.advance(60)
        assert (await env.store.get_run("r")).status is RunStatus.CANCELLED  # type: ignore[union-attr]
        assert flowkit.History("r", await env.store.load_events("r")) == h


async def test_cancel_while_the_worker_died_right_after_claiming_the_run() -> None:
    wf = Hold()
    async with TestEnv([wf]) as env:
        client = Engine(env.store, [wf], clock=env.clock, worker=False)
        await client.start("hold", "step", "r")
        env.crash_at(0, "after_claim")
        await env.advance(0)  # instance 0 claims the run and dies before its body starts
        assert env.crashed == [0]
        assert (await env.store.get_run("r")).status is RunStatus.RUNNING  # type: ignore[union-attr]
        await client.cancel("r")
        await env.restart(0)
        await env.advance(300)

        h = await _assert_cancelled_with_cleanup(env, wf, "r")
        # delivered at the first step the body reached: no step ran but the cleanup
        assert wf.calls == Counter({"cleanup": 1})
        failed = [e for e in h if isinstance(e, StepFailed)]
        assert len(failed) == 1 and failed[0].cancelled and failed[0].name == "Hold.mark"


@pytest.mark.parametrize(
    ("where", "due"),
    [("sleep", True), ("sleep", False), ("signal", True), ("backoff", True), ("backoff", False)],
)
async def test_cancel_of_a_suspended_run_while_no_worker_lives(where: str, due: bool) -> None:
    """Recovered ``cancelling`` while parked: the durable wait raises ``CancelledError``, even
    when its timer is due by then (it does not fire), a signal is waiting in the inbox (it is
    not taken) or a step's backoff is over (no new attempt runs)."""
    wf = Hold()
    async with TestEnv([wf]) as env:
        client = Engine(env.store, [wf], clock=env.clock, worker=False)
        await env.start("hold", where, "r")
        assert (await env.get_run("r")).status is RunStatus.SUSPENDED
        await env.crash(0)
        if where == "signal":
            await client.signal("r", "go", "payload")
        assert (await client.cancel("r")).status is RunStatus.CANCELLING
        await env.advance(300 if due else 1)
        await env.restart(0)
        await env.settle()

        h = await _assert_cancelled_with_cleanup(env, wf, "r")
        assert "timer_fired" not in h.types
        assert "signal_received" not in h.types
        assert wf.calls["flaky"] == (1 if where == "backoff" else 0)


async def test_cleanup_delivered_before_the_crash_replays_and_the_rest_runs() -> None:
    """The cancellation was delivered in the previous activation (the step was cancelled, the
    first cleanup step ran, the worker died in the second): the recovered body gets the
    ``CancelledError`` again from the history, the first cleanup step from the history, and
    runs the second and third."""

    @workflow(name="cleanups")
    class Cleanups(Hold):
        async def run(self, ctx: WorkflowCtx, where: str) -> str:
            try:
                await ctx.step(self.block, "work")
            except asyncio.CancelledError:
                await ctx.step(self.mark, "cleanup-1")
                await ctx.step(self.block, "cleanup-2")
                await ctx.step(self.mark, "cleanup-3")
                raise
            return "done"

    wf = Cleanups()
    async with TestEnv([wf], instances=2, hung_step_after=0) as env:  # (a hung step)
        await env.engines[0].start("cleanups", "", "r")
        await env.settle()
        await env.engines[0].cancel("r")  # the owner cancels the running step at once
        await env.settle()
        assert wf.calls == Counter({"work": 1, "cleanup-1": 1, "cleanup-2": 1})
        await env.crash(0)
        await env.advance(300)
        assert wf.calls["cleanup-2"] == 2  # recovered: runs again (it was not recorded)
        wf.gates["cleanup-2"].set()
        await env.settle()

        run = await env.get_run("r")
        assert run.status is RunStatus.CANCELLED
        assert wf.calls == Counter({"work": 1, "cleanup-1": 1, "cleanup-2": 2, "cleanup-3": 1})
        h = await env.history("r")
        failed = [e for e in h if isinstance(e, StepFailed)]
        assert len(failed) == 1 and failed[0].cancelled
        assert failed[0].error.message == "cancelled"  # the running attempt was cancelled
        await flowkit.replay_async(h, Cleanups)


async def test_a_recovered_body_may_catch_the_cancellation_and_complete() -> None:
    @workflow(name="stubborn")
    class Stubborn(Hold):
        async def run(self, ctx: WorkflowCtx, where: str) -> str:
            try:
                await ctx.step(self.block, "work")
            except asyncio.CancelledError:
                return await ctx.step(self.mark, "stopped early")
            return "done"

    wf = Stubborn()
    async with TestEnv([wf], instances=2) as env:
        await env.engines[0].start("stubborn", "", "r")
        await env.settle()
        await env.crash(0)
        await env.engines[1].cancel("r")
        await env.advance(300)
        run = await env.get_run("r")
        assert run.status is RunStatus.COMPLETED
        assert run.output == "stopped early"
        await flowkit.replay_async(await env.history("r"), Stubborn)


async def test_cancel_while_the_owner_is_between_awaits_is_delivered_at_the_next_step(
    store: Any,
) -> None:
    """Another instance requests the cancellation; the owner learns of it from its next write
    (the one that records the finished step before the next starts), when no step runs and no
    wait is parked: the next step gets it, instead of running."""
    wf = Hold()
    async with TestEnv([wf], instances=2, store=store) as env:
        await env.engines[0].start("hold", "step", "r")
        await env.settle()
        assert (await env.get_run("r")).lease_owner == "instance-0"
        await env.engines[1].cancel("r")  # the owner does not know yet
        await env.settle()
        assert wf.calls["work"] == 1 and (await env.get_run("r")).status is RunStatus.CANCELLING
        wf.gates["work"].set()  # the step completes; the body goes on to the "after" step
        await env.settle()

        h = await _assert_cancelled_with_cleanup(env, wf, "r")
        assert [e.result for e in h if e.type == "step_completed"] == ["setup", "work", "cleanup"]
        failed = [e for e in h if isinstance(e, StepFailed)]
        assert len(failed) == 1 and failed[0].cancelled
        assert failed[0].error.message == "cancelled before it started"
        assert failed[0].pos == "3"


async def test_cancel_of_a_singleton_holder_whose_worker_is_dead_frees_the_key(
    store: Any,
) -> None:
    """A singleton holder cancelled while its worker is dead settles ``cancelled`` once
    recovered, and the waiter gets the key."""
    lane = make_lane()
    async with TestEnv([lane], instances=2, lease_ttl=30, store=store) as env:
        await env.engines[0].start("lane", inp("A", "event"), "h")
        await env.engines[1].start("lane", inp("A"), "w")
        await env.settle()
        assert await holders(env) == ["h"]
        await env.crash(0)
        await env.engines[1].cancel("h")
        await env.settle()
        await env.advance(300)

        h = await env.store.get_run("h")
        assert h is not None and h.status is RunStatus.CANCELLED
        w = await env.store.get_run("w")
        assert w is not None and w.status is RunStatus.COMPLETED
        assert lane.finished == ["w"]
        types = (await history(env, "h")).types
        assert types[-3:] == ["step_failed", "singleton_released", "run_cancelled"]
        assert "run_completed" not in types
        lane.gates["h"].set()
        await env.settle()
        assert (await env.store.get_run("h")).status is RunStatus.CANCELLED  # type: ignore[union-attr]
        assert lane.finished == ["w"]
        await flowkit.replay_async(await history(env, "h"), type(lane))
