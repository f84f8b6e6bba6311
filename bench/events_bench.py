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


@workflow(name="events-bench-signalled")
class Signalled:
    """The baseline: the same waiters, each woken by a signal of its own."""

    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        got = await ctx.wait_for_signal("go")
        return int(got["k"]) + n


async def _count(engine: Engine, status: RunStatus, workflow: str = "events-bench-waiter") -> int:
    return len(await engine.list_runs(workflow=workflow, status=status))


async def signal_each(store: Any, runs: int) -> dict[str, float]:
    """The baseline of ``fan_out``: ``runs`` waiters each signalled in turn, until all
    completed."""
    wf = "events-bench-signalled"
    async with Engine(store, [Signalled()], max_concurrency=max(100, runs)) as engine:
        for i in range(runs):
            await engine.start(wf, i, f"s{i}")
        deadline = time.monotonic() + 600
        while await _count(engine, RunStatus.SUSPENDED, wf) < runs:
            if time.monotonic() > deadline:
                raise RuntimeError("the waiters did not all park")
            await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        for i in range(runs):
            await engine.signal(f"s{i}", "go", {"k": 1})
        while await _count(engine, RunStatus.COMPLETED, wf) < runs:
            if time.monotonic() > deadline:
                raise RuntimeError("the waiters did not all complete")
            await asyncio.sleep(0.005)
        t_all = time.perf_counter()
    return {"runs": runs, "all_completed_ms": round((t_all - t0) * 1000, 1)}


async def compare(make_store: Any, runs: int) -> dict[str, Any]:
    """``fan_out`` and its baseline ``signal_each`` on fresh stores, with their ratio."""
    store = make_store("events")
    try:
        out: dict[str, Any] = await fan_out(store, runs)
    finally:
        getattr(store, "close", lambda: None)()
    store = make_store("signals")
    try:
        base = await signal_each(store, runs)
    finally:
        getattr(store, "close", lambda: None)()
    out["baseline_signal_each_ms"] = base["all_completed_ms"]
    out["ratio_vs_signals"] = round(
        out["all_completed_ms"] / max(base["all_completed_ms"], 1e-6), 2
    )
    return out


async def run_all(smoke: bool, pg_url: str | None, tmp: Path) -> dict[str, Any]:
    """For ``bench/run.py``: one event to N parked runs against N signals, on each store."""
    runs = 50 if smoke else 1000
    out: dict[str, Any] = {}
    out["memory"] = await compare(lambda _n: MemoryStore(), runs)
    out["sqlite"] = await compare(lambda n: SqlStore(f"sqlite:///{tmp / f'ev-{n}.db'}"), runs)
    if pg_url is not None:
        from tests.pg import fresh_database

        out["postgresql"] = await compare(
            lambda n: SqlStore(fresh_database(pg_url, prefix=f"flowkit_ev_{n}")), runs
        )
    for name, got in out.items():
        print(
            f"events {name}: one event to {runs} parked runs, all completed in"
            f" {got['all_completed_ms']} ms ({got['ratio_vs_signals']}x one signal each:"
            f" {got['baseline_signal_each_ms']} ms)",
            flush=True,
        )
    return out


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
