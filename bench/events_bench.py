"""Published-event fan-out: how long until 1,000 waiting runs all have one event.

One engine with the Engine's defaults (``SystemClock``) on one store starts ``N`` runs that
each ``await ctx.wait_for_event("go")`` (no ``match``: every one matches) and waits until all
are parked (``suspended``). Then one ``engine.publish_event("go", ...)`` delivers the event to
every waiter in one store transaction (their inbox marks, each run made due), and the engine's
worker resumes them. Figures: the publish call alone (ms), and the time from just before the
publish until the last run completed (ms, by polling ``list_runs`` for completed runs), on
memory, SQLite and a throwaway PostgreSQL (durable unless ``FLOWKIT_BENCH_PG_FSYNC=off``).

``python bench/events_bench.py [--smoke] [--runs N]``; smoke: 50 runs, SQLite and memory."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import store_bench  # (first: it puts the repository root first on sys.path)

from flowkit import Engine, RunStatus, WorkflowCtx, workflow
from flowkit.stores import MemoryStore
from flowkit.stores.sql import SqlStore


@workflow(name="events-bench-waiter")
class Waiter:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        got = await ctx.wait_for_event("go")
        return int(got["k"]) + n


async def _count(engine: Engine, status: RunStatus) -> int:
    return len(await engine.list_runs(workflow="events-bench-waiter", status=status))


async def fan_out(store: Any, runs: int) -> dict[str, float]:
    """Start ``runs`` waiters, publish once, and time the delivery until all completed."""
    async with Engine(store, [Waiter()], max_concurrency=max(100, runs)) as engine:
        for i in range(runs):
            await engine.start("events-bench-waiter", i, f"w{i}")
        deadline = time.monotonic() + 600
        while await _count(engine, RunStatus.SUSPENDED) < runs:
            if time.monotonic() > deadline:
                raise RuntimeError("the waiters did not all park")
            await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        done = await engine.publish_event("go", {"k": 1}, event_id="go-1")
        t_pub = time.perf_counter()
        assert len(done.delivered) == runs, len(done.delivered)
        while await _count(engine, RunStatus.COMPLETED) < runs:
            if time.monotonic() > deadline:
                raise RuntimeError("the waiters did not all complete")
            await asyncio.sleep(0.005)
        t_all = time.perf_counter()
    return {
        "runs": runs,
        "publish_ms": round((t_pub - t0) * 1000, 1),
        "all_completed_ms": round((t_all - t0) * 1000, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--runs", type=int, default=None)
    args = ap.parse_args()
    runs = args.runs or (50 if args.smoke else 1000)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        out["memory"] = asyncio.run(fan_out(MemoryStore(), runs))
        print("memory", out["memory"], flush=True)
        out["sqlite"] = asyncio.run(fan_out(SqlStore(store_bench.sqlite_url(Path(tmp))), runs))
        print("sqlite", out["sqlite"], flush=True)
        if not args.smoke:
            with store_bench.postgres_server() as server:
                if server is not None:
                    store = SqlStore(store_bench.postgres_url(server))
                    out["postgresql"] = asyncio.run(fan_out(store, runs))
                    store.close()
                    print("postgresql", out["postgresql"], flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
