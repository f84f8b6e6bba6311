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


@workflow(name="schedule-bench-timer")
class Timer:
    """The baseline: a durable timer until a whole second, the nearest thing to a tick."""

    async def run(self, ctx: Any, fire_at: float) -> None:
        await ctx.sleep_until(fire_at)


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


async def timers(store: Any, seconds: float, workers: int) -> dict[str, Any]:
    """The baseline of ``measure``: one run per whole second sleeping until it, on the same
    number of engines; the lateness of each ``timer_fired`` after its instant."""
    engines = [Engine(store, [Timer]) for _ in range(workers)]
    for e in engines:
        await e.start_worker()
    start = math.ceil(engines[0].clock.now()) + 1
    n = max(1, int(seconds))
    for i in range(n):
        await engines[0].start(Timer, float(start + i), f"timer-{i}")
    for i in range(n):
        await engines[0].result(f"timer-{i}", timeout=seconds + 60)
    late = []
    for i in range(n):
        fired = [
            e for e in (await engines[0].history(f"timer-{i}")).events if e.type == "timer_fired"
        ]
        late.append((fired[0].at - (start + i)) * 1000)
    for e in engines:
        await e.stop()
    return {"runs": n, "p50_ms": round(_pct(late, 0.5), 2), "p99_ms": round(_pct(late, 0.99), 2)}


async def run_all(smoke: bool, tmp: Path, workers: int = 2) -> dict[str, Any]:
    """For ``bench/run.py``: tick lateness against a plain timer's, on memory and SQLite."""
    seconds = 3.0 if smoke else 20.0
    out: dict[str, Any] = {}
    for name, make in (
        ("memory", lambda _n: MemoryStore()),
        ("sqlite", lambda n: SqlStore(f"sqlite:///{tmp / f'sched-{n}.db'}")),
    ):
        store = make("ticks")
        try:
            got = await measure(store, seconds, workers)
        finally:
            getattr(store, "close", lambda: None)()
        store = make("timers")
        try:
            base = await timers(store, seconds, workers)
        finally:
            getattr(store, "close", lambda: None)()
        got["baseline_timer_p50_ms"] = base["p50_ms"]
        got["ratio_p50_vs_timer"] = round(got["p50_ms"] / max(base["p50_ms"], 0.01), 2)
        out[name] = got
        print(
            f"schedules {name}: every=1 on {workers} engines, {got['runs']} runs for"
            f" {got['distinct']} ticks, lateness p50 {got['p50_ms']} ms p99 {got['p99_ms']} ms"
            f" ({got['ratio_p50_vs_timer']}x a timer's p50: {base['p50_ms']} ms)",
            flush=True,
        )
    return out


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
