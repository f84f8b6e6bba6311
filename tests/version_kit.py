"""Versions of one workflow for the version tests (tests/test_versions*.py) and the worker
process of the mixed-fleet test (tests/version_worker.py): ``greet`` at versions "1", "2"
and "10" (natural order: "10" is the newest), each answering in its own way (version 1: an
``int``, the others: a ``str`` naming the version and the worker that ran its step)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from flowkit import Engine, Run, Singleton, WorkflowCtx, workflow

NAME = "greet"


def worker_name() -> str:
    """Who runs a step: the worker process's name (``FLOWKIT_TEST_WORKER``) or ``"here"``."""
    return os.environ.get("FLOWKIT_TEST_WORKER", "here")


@workflow(name=NAME, version="1")
class GreetV1:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        return await ctx.step(lambda: input + 1, name="add")


@workflow(name=NAME, version="2")
class GreetV2:
    async def run(self, ctx: WorkflowCtx, input: int) -> str:
        who = await ctx.step(worker_name, name="who")
        return f"v2:{input}:{who}"


@workflow(name=NAME, version="10")
class GreetV10:
    async def run(self, ctx: WorkflowCtx, input: int) -> str:
        return f"v10:{input}"


@workflow(name="lane-v", version="1", singleton=Singleton(key=lambda inp: inp))
class LaneV1:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        return await ctx.wait_for_signal("go")


@workflow(name="lane-v", version="2", singleton=Singleton(key=lambda inp: inp))
class LaneV2:
    async def run(self, ctx: WorkflowCtx, input: str) -> str:
        return "v2:" + await ctx.step(worker_name, name="who")


async def wait_for(
    engine: Engine, run_id: str, ok: Callable[[Run], bool], seconds: float = 30
) -> Run:
    """Poll ``run_id`` until ``ok`` (a deadline, not a sleep standing in for an event)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while True:
        run = await engine.get_run(run_id)
        if ok(run):
            return run
        if loop.time() > end:
            raise AssertionError(f"{run_id} never got there: {run}")
        await asyncio.sleep(0.02)


def versions_of(spec: str) -> list[Any]:
    """The workflow classes of a comma-separated list of versions of ``greet``."""
    by = {"1": GreetV1, "2": GreetV2, "10": GreetV10}
    return [by[v] for v in spec.split(",")]
