"""Schedule tick lateness on the real clock: how long after its tick a durable schedule's run
is created (``run.created_at - tick``; the run id names the tick).

One schedule ``every=1`` (``overlap="allow"``) on an engine with the defaults
(``SystemClock``, ``poll_interval=1.0``), on MemoryStore and on a SQLite file, each for
``--seconds`` real seconds (default 30; ``--smoke``: 3), with ``--workers`` engines on the
store (default 2, in one process: each fires every tick, one start wins). The worker sleeps
until the next tick (its poll deadline), fires it, and advances the schedule by
compare-and-set. Figures: p50/p99/max lateness in ms and the tick count, which must equal the
number of runs (one per tick). Run ``python bench/schedule_bench.py [--smoke]``."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from flowkit import Engine, Schedule, workflow
from flowkit.stores import MemoryStore
from flowkit.stores.sql import SqlStore


@workflow(name="schedule-bench-tick")
class Tick:
    async def run(self, ctx: Any, input: Any) -> None:
        return None


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(p * len(xs)) - 1))]


async def measure(store: Any, seconds: float, workers: int) -> dict[str, Any]:
    sched = {"tick": Schedule(Tick, every=1, overlap="allow")}
    engines = [Engine(store, [Tick], schedules=sched) for _ in range(workers)]
    for e in engines:
        await e.start_worker()
    await asyncio.sleep(seconds)
    for e in engines:
        await e.stop()
    runs = [r for r in await store.list_runs() if r.id.startswith("sched:tick:")]
    late = []
    for r in runs:
        stamp = r.id.removeprefix("sched:tick:")
        tick = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
        late.append((r.created_at - tick) * 1000)
    ticks = sorted(r.id for r in runs)
    return {
        "runs": len(runs),
        "distinct": len(set(ticks)),
        "p50_ms": round(_pct(late, 0.5), 2),
        "p99_ms": round(_pct(late, 0.99), 2),
        "max_ms": round(max(late), 2),
    }


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--seconds", type=float, default=None)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    seconds = args.seconds or (3.0 if args.smoke else 30.0)
    out: dict[str, Any] = {}
    out["memory"] = await measure(MemoryStore(), seconds, args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        store = SqlStore(f"sqlite:///{Path(tmp) / 'bench.db'}")
        try:
            out["sqlite"] = await measure(store, seconds, args.workers)
        finally:
            store.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
