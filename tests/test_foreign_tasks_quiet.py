"""A body that runs ctx calls through asyncio (``asyncio.gather``, a task of their own,
``asyncio.wait_for``) is refused with one clear ``NonDeterminismError`` (the run is blocked,
docs/writing-workflows.md, "Await only ctx calls"), and asyncio logs nothing beside it: the
tasks and gathers the body left are cancelled and their outcomes read. It used to log
"_GatheringFuture exception was never retrieved" / "Task exception was never retrieved"
(``RuntimeError: cannot reuse already awaited coroutine``), which pointed at the wrong
thing."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from flowkit import RunStatus, WorkflowCtx, workflow
from flowkit_testing import TestEnv


def one() -> int:
    return 1


async def two() -> int:
    return 2


async def boom() -> int:
    raise ValueError("boom")


async def orphan_then_sleep(ctx: WorkflowCtx) -> Any:
    task = asyncio.ensure_future(ctx.step(one))  # (never awaited)
    await ctx.sleep(1)
    return task


async def orphan_then_return(ctx: WorkflowCtx) -> Any:
    return [asyncio.ensure_future(ctx.step(one))]  # (never awaited)


BODIES: dict[str, Callable[[WorkflowCtx], Awaitable[Any]]] = {
    "gather-of-steps": lambda ctx: asyncio.gather(ctx.step(one), ctx.step(two)),
    "gather-of-a-sleep-and-a-step": lambda ctx: asyncio.gather(ctx.sleep(5), ctx.step(one)),
    "gather-of-plain-coroutines": lambda ctx: asyncio.gather(boom(), two()),
    "awaited-task": lambda ctx: asyncio.ensure_future(ctx.step(one)),
    "wait_for": lambda ctx: asyncio.wait_for(ctx.step(two), 5),
    "orphan-then-sleep": orphan_then_sleep,
    "orphan-then-return": orphan_then_return,
}


@workflow(name="asyncio-body")
class AsyncioBody:
    async def run(self, ctx: WorkflowCtx, input: str) -> Any:
        return await BODIES[input](ctx)


@pytest.mark.parametrize("body", list(BODIES))
async def test_a_body_using_asyncio_is_refused_without_stray_asyncio_errors(
    body: str, caplog: pytest.LogCaptureFixture
) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        with caplog.at_level(logging.WARNING):
            async with TestEnv([AsyncioBody()]) as env:
                await env.start("asyncio-body", body, "r1")
                await env.run_until_idle()
                run = await env.get_run("r1")
                assert run.status is RunStatus.BLOCKED
                assert run.error is not None and run.error["type"] == "NonDeterminismError"
            gc.collect()  # ("never retrieved" is reported when a future is collected)
            await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [c.get("message") for c in reported] == []
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    if body.startswith("gather-of"):
        assert "asyncio.gather(...) (use ctx.gather)" in run.error["message"]
