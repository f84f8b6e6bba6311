"""Replay speed: memoized step events replayed per second, for histories of 10 to 10,000 steps.

The baseline is the same body run fresh on a ``MemoryStore`` in the same process (recording
every step), so the ratio says how much cheaper replaying a history is than producing it.
Run: ``python bench/replay_bench.py [--smoke]`` (also part of ``bench/run.py``)."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from flowkit import History, WorkflowCtx, replay_async, workflow
from flowkit_testing import TestEnv


def work(i: int) -> int:
    return i + 1


@workflow(name="replay-bench")
class Steps:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        total = 0
        for i in range(input):
            total += await ctx.step(work, i)
        return total


async def record(n: int) -> tuple[History, float]:
    """A completed history of ``n`` steps, and the seconds it took to produce."""
    async with TestEnv([Steps()], max_yields=0) as env:
        t0 = time.perf_counter()
        await env.start("replay-bench", n, f"r{n}")
        await env.run_until_idle()
        took = time.perf_counter() - t0
        return await env.history(f"r{n}"), took


async def main(smoke: bool) -> dict[str, Any]:
    sizes = [10, 100] if smoke else [10, 100, 1_000, 10_000]
    out: dict[str, Any] = {}
    print("replay of memoized steps (flowkit.replay_async over a recorded history):")
    for n in sizes:
        hist, fresh = await record(n)
        # the median of several replays: one replay of a long history is a single sample,
        # which a garbage collection of the whole process (in ``bench/run.py``, after all the
        # other benchmarks) can double
        times = []
        for _ in range(max(5, 2_000 // n)):
            t0 = time.perf_counter()
            await replay_async(hist, Steps)
            times.append(time.perf_counter() - t0)
        took = statistics.median(times)
        rate = n / took
        print(
            f"  {n:>6} steps: {rate:>10,.0f} events/s replayed   "
            f"replay is {fresh / took:5.1f}x faster than recording it on MemoryStore"
        )
        out[str(n)] = {"events_per_s": rate, "replay_s": took, "record_s": fresh}
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    asyncio.run(main(parser.parse_args().smoke))
