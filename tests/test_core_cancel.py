"""Cancellation: during a sleep, a signal wait and a running step; cleanup steps in
``except CancelledError``; settled runs ignore cancel."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

import flowkit
from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit_testing import TestEnv


@workflow(name="cancellable")
class Cancellable:
    """``input`` picks where the body waits: "sleep", "signal" or "step"."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.gate = asyncio.Event()
        self.step_saw_cancel = False
        self.body_saw_cancel = 0
        self.cleanup_task_cancelling: list[int] = []

    def setup(self) -> str:
        self.calls["setup"] += 1
        return "ready"

    async def blocking(self) -> str:
        self.calls["blocking"] += 1
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.step_saw_cancel = True
            raise
        return "unblocked"

    async def cleanup(self, where: str) -> str:
        self.calls[f"cleanup:{where}"] += 1
        # an async step runs in the task of the body that awaits it: the cancelled step's request
        # must be taken back, or the task would stay "cancelling" (asyncio.timeout breaks)
        task = asyncio.current_task()
        assert task is not None
        self.cleanup_task_cancelling.append(task.cancelling())
        return "cleaned"

    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        await ctx.step(self.setup)
        try:
            if input == "sleep":
                await ctx.sleep(3600)
            elif input == "signal":
                await ctx.wait_for_signal("go")
            else:
                await ctx.step(self.blocking)
        except asyncio.CancelledError:
            self.body_saw_cancel += 1
            await ctx.step(self.cleanup, input)
            raise
        return "finished"


async def _assert_cancelled(env: TestEnv, wf: Cancellable, run_id: str, where: str) -> None:
    run = await env.get_run(run_id)
    assert run.status is RunStatus.CANCELLED
    with pytest.raises(flowkit.RunCancelledError):
        await env.engines[0].result(run_id, timeout=5)
    assert wf.body_saw_cancel >= 1
    assert wf.calls["setup"] == 1
    assert wf.calls[f"cleanup:{where}"] == 1
    h = await env.history(run_id)
    assert h.types[-1] == "run_cancelled"
    assert h.types.count("cancel_requested") == 1
    assert h.types.count("run_cancelled") == 1
    # the cleanup step ran after the request and is recorded as a completed step
    req = h.types.index("cancel_requested")
    cleanup = [e for e in h if e.type == "step_completed" and "cleanup" in e.name]
    assert len(cleanup) == 1 and cleanup[0].seq > req + 1
    assert [e.seq for e in h] == list(range(1, len(h) + 1))


async def test_cancel_during_sleep() -> None:
    wf = Cancellable()
    async with TestEnv([wf]) as env:
        await env.start("cancellable", "sleep", "r1")
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        run = await env.cancel("r1")
        assert run.status in (RunStatus.CANCELLING, RunStatus.CANCELLED)
        await env.settle()
        await _assert_cancelled(env, wf, "r1", "sleep")
        # the timer never fires later
        await env.advance(7200)
        h = await env.history("r1")
        assert "timer_fired" not in h.types
        assert h.types[-1] == "run_cancelled"


async def test_cancel_during_signal_wait() -> None:
    wf = Cancellable()
    async with TestEnv([wf]) as env:
        await env.start("cancellable", "signal", "r1")
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        await env.cancel("r1")
        await _assert_cancelled(env, wf, "r1", "signal")
        with pytest.raises(flowkit.RunStateError):
            await env.signal("r1", "go", 1)
        assert "signal_received" not in (await env.history("r1")).types


async def test_cancel_during_running_step() -> None:
    wf = Cancellable()
    async with TestEnv([wf]) as env:
        await env.start("cancellable", "step", "r1")
        await env.settle()  # returns although the step is blocked on an outside event
        run = await env.get_run("r1")
        assert run.status is RunStatus.RUNNING
        assert wf.calls["blocking"] == 1 and not wf.step_saw_cancel
        await env.cancel("r1")
        assert wf.step_saw_cancel
        await _assert_cancelled(env, wf, "r1", "step")
        assert wf.calls["blocking"] == 1
        assert wf.cleanup_task_cancelling == [0]
        h = await env.history("r1")
        failed = [e for e in h if e.type == "step_failed"]
        assert len(failed) == 1 and failed[0].cancelled
        await flowkit.replay_async(h, Cancellable)


@workflow(name="cancel-gather")
class CancelGather:
    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.cleaned = 0

    async def blocked(self) -> str:
        await self.gate.wait()
        return "stepped"

    def cleanup(self) -> str:
        self.cleaned += 1
        return "cleaned"

    async def run(self, ctx: WorkflowCtx, input: None) -> list[object]:
        try:
            return await ctx.gather(
                ctx.step(self.blocked), ctx.sleep(100), ctx.wait_for_signal("x")
            )
        except asyncio.CancelledError:
            await ctx.step(self.cleanup)
            raise


async def test_cancel_during_gather_cancels_every_branch() -> None:
    wf = CancelGather()
    async with TestEnv([wf]) as env:
        await env.start("cancel-gather", None, "r1")
        assert (await env.get_run("r1")).status is RunStatus.RUNNING
        await env.cancel("r1")
        await env.run_until_idle()
        assert (await env.get_run("r1")).status is RunStatus.CANCELLED
        assert wf.cleaned == 1
        h = await env.history("r1")
        assert h.types[-1] == "run_cancelled"
        assert "timer_fired" not in h.types and "signal_received" not in h.types
        await flowkit.replay_async(h, CancelGather)


async def test_cancel_a_pending_run_on_a_non_worker_engine() -> None:
    wf = Cancellable()
    async with TestEnv([wf]) as env:
        client = flowkit.Engine(env.store, [wf], clock=env.clock, worker=False)
        await client.start("cancellable", "sleep", "r1")
        assert (await client.get_run("r1")).status is RunStatus.PENDING
        run = await client.cancel("r1")
        assert run.status is RunStatus.CANCELLED
        h = await client.history("r1")
        assert h.types == ["run_started", "cancel_requested", "run_cancelled"]
        await env.advance(10)
        assert wf.calls["setup"] == 0
        with pytest.raises(flowkit.RunCancelledError):
            await client.result("r1", timeout=5)


async def test_cancel_of_settled_run_is_a_noop() -> None:
    wf = Cancellable()
    async with TestEnv([wf]) as env:
        await env.start("cancellable", "signal", "done")
        await env.signal("done", "go")
        assert await env.result("done") == "finished"
        before = await env.history("done")
        run = await env.cancel("done")
        assert run.status is RunStatus.COMPLETED
        assert await env.history("done") == before
        assert await env.result("done") == "finished"

        await env.start("cancellable", "sleep", "c")
        await env.cancel("c")
        before = await env.history("c")
        again = await env.cancel("c")
        assert again.status is RunStatus.CANCELLED
        assert await env.history("c") == before
        assert wf.calls["cleanup:sleep"] == 1


async def test_repeated_cancel_while_cancelling_records_one_request() -> None:
    wf = Cancellable()
    async with TestEnv([wf]) as env:
        await env.start("cancellable", "step", "r1")
        await env.engines[0].cancel("r1")
        await env.engines[0].cancel("r1")
        await env.settle()
        await _assert_cancelled(env, wf, "r1", "step")


async def test_cancel_from_another_instance_reaches_the_running_step() -> None:
    wf = Cancellable()
    async with TestEnv([wf], instances=2, hung_step_after=0) as env:  # (a hung step)
        await env.engines[1].start("cancellable", "step", "r1")
        await env.settle()
        assert (await env.get_run("r1")).lease_owner == "instance-1"
        await env.cancel("r1")  # requested through instance 0
        assert (await env.get_run("r1")).status is RunStatus.CANCELLING
        await env.advance(30)  # the owner hears of it by its next lease renewal at the latest
        assert wf.step_saw_cancel
        await _assert_cancelled(env, wf, "r1", "step")
