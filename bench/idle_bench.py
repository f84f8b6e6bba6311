"""An idle engine (docs/performance.md, "An idle engine"): what a worker engine with nothing
due costs, and that it does not grow with the runs parked in its database.

For SQLite and PostgreSQL: an ``Engine`` with a registered workflow (the worker's defaults:
poll interval, lease renewal, the worker record, wake-up watching) on an empty database, then
on one holding ``--parked`` runs asleep for a day, each measured over a window of ``--window``
seconds once started: the process's CPU time (``time.process_time()``) as % of one core, store
statements per second (``SqlStore._db.stats``), and the wake-up watcher's checks per second
(SQLite: ``PRAGMA data_version`` reads). Then the poller's two reads (``due_runs``,
``next_due_after``) timed on the parked database (p50 of 20 calls).

``--smoke``: 1,000 parked runs, a 1 s window, SQLite only. The same file measures the code it
imports, so ``PYTHONPATH=<a checkout of the base branch>`` measures the old engine."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.append(str(Path(__file__).parent.parent))  # (tests.pg; flowkit from PYTHONPATH)

import sqlalchemy as sa

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores import SqlStore
from flowkit.stores.sql._schema import runs


@workflow(name="idle")
class Idle:
    async def run(self, ctx: WorkflowCtx, inp: dict[str, Any]) -> str:
        await ctx.sleep(86_400)
        return "done"


def park(store: SqlStore, n: int) -> None:
    """``n`` runs of ``idle`` asleep for a day (bulk ``INSERT``), then ``ANALYZE``."""
    now = time.time()
    rows = [
        {
            "id": f"parked-{i:07d}",
            "workflow": "idle",
            "workflow_version": "1",
            "status": "suspended",
            "input": {},
            "output": None,
            "error": None,
            "tags": [],
            "singleton_key": None,
            "admitted": False,
            "created_at": now - 60,
            "updated_at": now - 60,
            "wake_at": now + 86_400 + i * 0.001,
            "namespace": None,
            "attempt": 1,
            "waiting_signals": [],
            "last_seq": 0,
            "recoveries": 0,
            "search": None,
        }
        for i in range(n)
    ]
    db = store._db
    db.ensure_schema()
    with db.tx() as conn:
        for i in range(0, n, 10_000):
            conn.execute(runs.insert(), rows[i : i + 10_000])
    with db.engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(sa.text("ANALYZE"))


def _checks(store: SqlStore) -> int:
    hub = getattr(store._db, "_hubs", None)
    if not hub:
        return 0
    return sum(int(h.stats.get("checks", 0)) for h in hub.values())


async def engine_at_rest(url: str, parked: int, window: float, settle: float) -> dict[str, Any]:
    store = SqlStore(url)
    if parked:
        park(store, parked)
    async with Engine(store, [Idle()]):
        await asyncio.sleep(settle)
        before, checks = store._db.stats.copy(), _checks(store)
        cpu, t = time.process_time(), time.perf_counter()
        await asyncio.sleep(window)
        wall = time.perf_counter() - t
        used = time.process_time() - cpu
        delta = store._db.stats.copy()
        delta.subtract(before)
        out = {
            "parked": parked,
            "cpu_pct": round(100 * used / wall, 3),
            "statements_per_s": round(delta["statements"] / wall, 2),
            "watcher_checks_per_s": round((_checks(store) - checks) / wall, 2),
        }
    if parked:
        polls, nexts = [], []
        for _ in range(20):
            now = time.time()
            t0 = time.perf_counter()
            await store.due_runs(now, 100)
            polls.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            await store.next_due_after(now, ("idle-bench",))
            nexts.append(time.perf_counter() - t0)
        out["due_runs_ms_p50"] = round(statistics.median(polls) * 1000, 3)
        out["next_due_after_ms_p50"] = round(statistics.median(nexts) * 1000, 3)
    store.close()
    return out


def _backends(tmp: Path, pg_url: str | None) -> dict[str, Any]:
    from store_bench import backends

    return backends(tmp, pg_url)


async def main(
    smoke: bool, pg_url: str | None, tmp: Path, parked: int | None = None, window: float = 10.0
) -> dict[str, Any]:
    n = parked if parked is not None else (1_000 if smoke else 100_000)
    window = 1.0 if smoke else window
    settle = 0.5 if smoke else 2.0
    results: dict[str, Any] = {"window_s": window}
    for name, new_url in _backends(tmp, None if smoke else pg_url).items():
        r = {
            "empty": await engine_at_rest(new_url(), 0, window, settle),
            "parked": await engine_at_rest(new_url(), n, window, settle),
        }
        results[name] = r
        print(f"idle {name}: {r}")
    return results


def _cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--parked", type=int, default=None)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    from store_bench import postgres_server

    with tempfile.TemporaryDirectory(prefix="flowkit-idle-") as tmp:
        if args.smoke or args.no_postgres:
            asyncio.run(main(args.smoke, None, Path(tmp), args.parked, args.window))
            return
        with postgres_server() as pg_url:
            asyncio.run(main(False, pg_url, Path(tmp), args.parked, args.window))


if __name__ == "__main__":
    _cli()
