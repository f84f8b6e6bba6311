"""Sync steps in threads (issue #20, item 4): runs whose one step is a blocking ``time.sleep``
run side by side in the engine's step threads instead of one after another on the event loop.

32 runs (one engine, ``MemoryStore``: the store is not what is measured), each with one
synchronous step that sleeps 50 ms, started at once; measured from the first start to the
last result, for several ``Engine(step_threads=N)``. The baseline, measured in the same run:
the same 32 sleeps one after another (what a sync step on the event loop costs: 32 * 50 ms).
Printed per N: the seconds, the speed-up over the baseline, and the ideal ``32 * 50 ms / N``
(N ≤ 32) with how close to it the engine gets. Nothing is asserted: other work on the
machine skews every figure.

``python bench/sync_steps_bench.py [--smoke]`` (also part of ``bench/run.py``); smoke: 8 runs
of 20 ms, N = 1 and 8."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _results
import store_bench  # noqa: F401  (first: it puts the repository root first on sys.path)

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores import MemoryStore

RUNS = 32
NAP = 0.05  # seconds each step blocks its thread
THREADS = (1, 4, 8, 16, 32)


@workflow(name="sync-sleeper")
class SyncSleeper:
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)  # a blocking call: requests.get, a driver without asyncio...
        return seconds

    async def run(self, ctx: WorkflowCtx, seconds: float) -> float:
        return await ctx.step(self.nap, seconds)


async def measure(step_threads: int, runs: int, nap: float) -> float:
    """Seconds from the first start of ``runs`` runs to the last one's result."""
    async with Engine(MemoryStore(), [SyncSleeper()], step_threads=step_threads) as engine:
        warm = await engine.start("sync-sleeper", 0.0)  # (adapters built, a thread started)
        await engine.result(warm.id, timeout=60)
        t0 = time.perf_counter()
        started = [await engine.start("sync-sleeper", nap) for _ in range(runs)]
        for run in started:
            await engine.result(run.id, timeout=600)
        return time.perf_counter() - t0


def serial(runs: int, nap: float) -> float:
    """The baseline: the same sleeps one after another."""
    t0 = time.perf_counter()
    for _ in range(runs):
        time.sleep(nap)
    return time.perf_counter() - t0


async def main(smoke: bool) -> dict[str, Any]:
    runs, nap, threads = (8, 0.02, (1, 8)) if smoke else (RUNS, NAP, THREADS)
    base = serial(runs, nap)
    print(f"sync steps in threads: {runs} runs, one sync step each sleeping {nap * 1000:.0f} ms")
    print(f"  serial baseline (the sleeps one after another): {base * 1000:7.0f} ms")
    out: dict[str, Any] = {"runs": runs, "nap_s": nap, "serial_s": base, "by_threads": {}}
    for n in threads:
        took = await measure(n, runs, nap)
        ideal = nap * -(-runs // n)  # (ceil: the waves of n steps)
        print(
            f"  step_threads={n:>2}: {took * 1000:7.0f} ms   {base / took:5.1f}x the baseline"
            f"   ideal {ideal * 1000:5.0f} ms (reached at {ideal / took:4.0%})"
        )
        out["by_threads"][str(n)] = {
            "seconds": took,
            "speedup": base / took,
            "ideal_s": ideal,
            "of_ideal": ideal / took,
        }
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    results = _results.start()
    results["sync_steps"] = asyncio.run(main(args.smoke))
    _results.finish(results, "sync_steps_smoke.json" if args.smoke else "sync_steps_latest.json")
