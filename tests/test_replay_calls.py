"""The ctx calls of ``flowkit/_replay/calls.py`` beside the steps: ``ctx.gather`` (argument
order, the first failure by argument order, no task left behind) and the deterministic
``ctx.now``/``random``/``uuid4`` of a branch."""

from __future__ import annotations

import asyncio
import gc
import uuid
from collections import Counter
from datetime import datetime, timedelta

import pytest

import flowkit
from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit_testing import TestEnv

# -- gather -------------------------------------------------------------------------------


@workflow(name="gatherer")
class Gatherer:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.finish_order: list[str] = []

    async def work(self, tag: str, spins: int) -> str:
        self.calls[tag] += 1
        for _ in range(spins):  # finish in reverse argument order
            await asyncio.sleep(0)
        self.finish_order.append(tag)
        return tag * 2

    async def run(self, ctx: WorkflowCtx, input: None) -> list[str]:
        out = await ctx.gather(
            ctx.step(self.work, "a", 30), ctx.step(self.work, "b", 20), ctx.step(self.work, "c", 0)
        )
        await ctx.sleep(60)
        return [*out, await ctx.step(self.work, "d", 0)]


async def test_gather_returns_argument_order_and_replays_without_reexecution() -> None:
    wf = Gatherer()
    async with TestEnv([wf]) as env:
        await env.start("gatherer", None, "r1")
        assert (await env.get_run("r1")).status is RunStatus.SUSPENDED
        assert wf.finish_order == ["c", "b", "a"]
        assert await env.result("r1") == ["aa", "bb", "cc", "dd"]
        assert wf.calls == {"a": 1, "b": 1, "c": 1, "d": 1}
        await flowkit.replay_async(await env.history("r1"), Gatherer)


@workflow(name="gather-fail")
class GatherFail:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def ok(self) -> int:
        self.calls["ok"] += 1
        return 1

    def bad(self, msg: str) -> int:
        self.calls[msg] += 1
        raise ValueError(msg)

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        try:
            await ctx.gather(
                ctx.step(self.ok),
                ctx.step(self.bad, "first", name="bad1"),
                ctx.sleep(5),
                ctx.step(self.bad, "second", name="bad2"),
            )
        except flowkit.StepFailedError as exc:
            await ctx.sleep(1)  # replay must raise the same failure again
            return f"{exc.step}:{exc.message}"
        return "no failure"


async def test_gather_with_failing_child_raises_that_failure() -> None:
    wf = GatherFail()
    async with TestEnv([wf]) as env:
        await env.start("gather-fail", None, "r1")
        assert await env.result("r1") == "bad1:first"
        assert wf.calls == {"ok": 1, "first": 1, "second": 1}


@workflow(name="two-sleeps")
class TwoSleeps:
    async def run(self, ctx: WorkflowCtx, input: None) -> int:
        await ctx.gather(ctx.sleep(5), ctx.sleep(6))
        return 1


async def test_suspending_gather_leaves_no_unretrieved_task_exceptions() -> None:
    loop = asyncio.get_running_loop()
    seen: list[str] = []
    old = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(str(ctx.get("message"))))
    try:
        async with TestEnv([TwoSleeps()]) as env:
            await env.start("two-sleeps", None, "r1")
            assert await env.result("r1") == 1
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(old)
    assert [m for m in seen if "never retrieved" in m] == []


# -- deterministic time, randomness and ids -----------------------------------------------


@workflow(name="det")
class Det:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, float, str]] = []

    def record(self, label: str, now: str, rnd: float, uid: str) -> None:
        self.seen.append((label, now, rnd, uid))

    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        now, rnd, uid = ctx.now(), ctx.random(), ctx.uuid4()
        await ctx.step(self.record, "before", now.isoformat(), rnd, str(uid))
        await ctx.sleep(3600)
        await ctx.step(self.record, "after", now.isoformat(), rnd, str(uid))
        later = ctx.now()
        assert later - now >= timedelta(seconds=3600)
        return later.isoformat()


async def test_now_random_uuid4_are_stable_across_replay() -> None:
    wf = Det()
    async with TestEnv([wf]) as env:
        start = env.clock.now()
        await env.start("det", None, "r1")
        assert len(wf.seen) == 1
        out = await env.result("r1")
        assert [s[0] for s in wf.seen] == ["before", "after"]
        before, after = wf.seen
        assert before[1:] == after[1:]
        _, now_iso, rnd, uid = before
        assert 0.0 <= rnd < 1.0
        assert uuid.UUID(uid).version == 4
        assert datetime.fromisoformat(now_iso).timestamp() == pytest.approx(start)
        assert datetime.fromisoformat(out).timestamp() >= start + 3600
