"""The app of tests/test_worker_drain.py, served by ``flowkit worker drain_app:WORKFLOWS``: a
run of two steps, each of which waits for a file the test creates (``go-a``, ``go-b``) and
leaves a marker naming the process that ran it (``started-a-<pid>``)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from flowkit import WorkflowCtx, workflow


async def gated(folder: str, name: str) -> str:
    """Mark that this process runs step ``name``, then wait for ``go-<name>``."""
    here = Path(folder)
    (here / f"started-{name}-{os.getpid()}").touch()
    while not (here / f"go-{name}").exists():  # noqa: ASYNC110 - another process writes it
        await asyncio.sleep(0.02)
    return f"{name}@{os.getpid()}"


@workflow(name="drain_job")
class DrainJob:
    async def run(self, ctx: WorkflowCtx, folder: str) -> str:
        a = await ctx.step(gated, folder, "a")
        b = await ctx.step(gated, folder, "b")
        return f"{a} {b}"


WORKFLOWS = [DrainJob]


def workflows() -> list[type[DrainJob]]:
    """The same list from a callable (``flowkit worker drain_app:workflows``)."""
    return [DrainJob]
