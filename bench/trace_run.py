"""The path of one run through the code: which flowkit modules it visits and how many calls
cross from one module to another, from ``engine.start`` to its result, on a SQLite file.

A measure of the architecture rather than of speed (docs/architecture.md walks the same run):
``.venv/bin/python bench/trace_run.py``. Both the event loop's thread and the store's I/O
threads are traced; a first run warms the store up first, so imports and schema creation do
not count."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
from types import FrameType
from typing import Any

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores import SqlStore


async def pull(x: int) -> int:
    return x + 1


@workflow(name="traced")
class Traced:
    """Two steps around a durable sleep: a claim, a suspension and a resumption."""

    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        x = await ctx.step(pull, input)
        await ctx.sleep(0)
        return await ctx.step(pull, x)


def _module(frame: FrameType | None) -> str | None:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name if isinstance(name, str) and name.startswith("flowkit") else None


async def trace() -> tuple[set[str], int]:
    """The modules one run visits and the cross-module calls it makes."""
    visited: set[str] = set()
    crossings = 0

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal crossings
        if event != "call" or (mod := _module(frame)) is None:
            return
        visited.add(mod)
        caller = _module(frame.f_back)
        if caller is not None and caller != mod:
            crossings += 1

    tmp = tempfile.mkdtemp(prefix="flowkit-trace-")
    async with Engine(SqlStore(f"sqlite:///{tmp}/trace.db"), [Traced()]) as engine:
        await engine.start("traced", 0, "warm")
        await engine.result("warm")
        sys.setprofile(profile)
        threading.setprofile(profile)
        try:
            await engine.start("traced", 1, "traced-1")
            await engine.result("traced-1")
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
    return visited, crossings


def main() -> int:
    visited, crossings = asyncio.run(trace())
    layers = sorted({m.split(".")[1] if m.count(".") else m for m in visited})
    print(f"{len(visited)} modules visited, {crossings} cross-module calls")
    print(f"packages: {', '.join(layers)}")
    for m in sorted(visited):
        print(f"  {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
