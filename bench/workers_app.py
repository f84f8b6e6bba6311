"""The app of ``bench/workers_bench.py``, served by ``flowkit worker workers_app:WORKFLOWS``:
a 3-step run whose result names the process that ran its last step, and the handover
singleton of ``store_bench``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from store_bench import Handover

from flowkit import WorkflowCtx, workflow

SPREAD_WF = "workers-bench-three"


async def add(x: int) -> int:
    return x + 1


async def pid() -> int:
    return os.getpid()


@workflow(name=SPREAD_WF)
class Three:
    """Three steps; returns the pid of the process that ran the last one."""

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        x = await ctx.step(add, input)
        await ctx.step(add, x)
        return await ctx.step(pid)


WORKFLOWS = [Three, Handover]
