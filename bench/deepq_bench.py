"""Deep queues at rest: what 10,000 parked singleton waiters cost an engine that has nothing
else to do (docs/performance.md, "Deep queues").

For SQLite and PostgreSQL: an idle engine (no runs) and an engine with ``--waiters`` waiters
parked behind one holder per key (``--keys`` keys, and one key), each measured over a window
of ``--window`` seconds once the queue is at rest (every waiter had its first re-check; the
seconds that took: ``first_rechecks_s``): store statements per second
(``SqlStore._db.stats``) and the process's CPU time (``time.process_time()``) as % of a core.
Then the latency of an admission (``engine.start`` of a run on the key) and of a hand-over
(the holder signalled -> the next waiter's first step) on the deep key next to an empty key.

``--smoke``: 200 waiters, a 1 s window, SQLite only. The same file measures the code it
imports, so ``PYTHONPATH=<a checkout of the base branch>`` measures the old waiting rule."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
sys.path.append(str(Path(__file__).parent.parent))  # (tests.pg; flowkit from PYTHONPATH)

from pydantic import BaseModel

from flowkit import Engine, Singleton, WorkflowCtx, workflow
from flowkit.stores import SqlStore

STEP_AT: dict[str, float] = {}  # run id -> perf_counter of its first step (in process)


class Inp(BaseModel):
    key: str


async def mark(run_id: str) -> str:
    STEP_AT.setdefault(run_id, time.perf_counter())
    return run_id


@workflow(name="deepq", singleton=Singleton(key=lambda i: i.key))
class Deep:
    async def run(self, ctx: WorkflowCtx, inp: Inp) -> str:
        await ctx.step(mark, ctx.run_id)
        await ctx.wait_for_signal("go")
        return inp.key


async def _fill(client: Engine, keys: list[str], waiters: int, prefix: str) -> None:
    """One holder per key, then ``waiters`` waiters spread over the keys in start order."""
    for k in keys:
        await client.start("deepq", {"key": k}, f"{prefix}{k}-h")
    ids = [(keys[i % len(keys)], f"{prefix}{keys[i % len(keys)]}-w{i:06d}") for i in range(waiters)]
    for i in range(0, len(ids), 50):
        await asyncio.gather(
            *(client.start("deepq", {"key": k}, rid) for k, rid in ids[i : i + 200])
        )


async def _window(store: SqlStore, seconds: float) -> dict[str, float]:
    before, cpu, t = store._db.stats.copy(), time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    wall = time.perf_counter() - t
    delta = store._db.stats.copy()
    delta.subtract(before)
    return {
        "statements_per_s": round(delta["statements"] / wall, 1),
        "write_tx_per_s": round(delta["write_tx"] / wall, 1),
        "cpu_pct": round(100 * (time.process_time() - cpu) / wall, 2),
    }


async def _rest(store: SqlStore, keys: int, timeout: float = 300.0) -> float:
    """Wait until the queue is at rest: every waiter had its first re-check (a first denial
    keeps its ~1 s timer, docs/singleton.md), so that only the heads (one per key) re-check within
    the next 2 s. The seconds it took: the one-time cost of the arrivals."""
    t = time.perf_counter()
    while len(await store.due_runs(time.time() + 2.0, keys + 50)) > keys:
        if time.perf_counter() - t > timeout:
            break
        await asyncio.sleep(0.5)
    return round(time.perf_counter() - t, 1)


async def at_rest(
    url: str, keys: int, waiters: int, window: float, settle: float
) -> dict[str, Any]:
    """An engine with ``waiters`` waiters behind ``keys`` holders, measured at rest."""
    store = SqlStore(url)
    names = [f"k{i}" for i in range(keys)]
    # (a worker's starts are parked at creation: Admission; a client's wait pending)
    async with Engine(store, [Deep()]) as eng:
        await _fill(eng, names, waiters, "r")
        rest = await _rest(store, keys)  # (every waiter's first re-check)
        await asyncio.sleep(settle)
        out = await _window(store, window)
    return {**out, "first_rechecks_s": rest}


async def idle(url: str, window: float, settle: float) -> dict[str, Any]:
    store = SqlStore(url)
    async with Engine(store, [Deep()]):
        await asyncio.sleep(settle)
        out = await _window(store, window)
    return out


async def _until(cond: Any, timeout: float = 600.0) -> None:
    end = time.perf_counter() + timeout
    while not cond():
        if time.perf_counter() > end:
            raise TimeoutError(f"the bench's run did not start: {cond.__defaults__}")
        await asyncio.sleep(0.0005)


async def latency(url: str, waiters: int, rounds: int) -> dict[str, Any]:
    """Per key (``empty``: ``rounds`` runs queued; ``deep``: ``waiters``): ``engine.start`` of
    one more run (an admission decision: gated at creation behind the key's holder), and
    ``rounds`` hand-overs (the holder signalled -> the next waiter's first step)."""
    STEP_AT.clear()  # (the run ids repeat on each database)
    store = SqlStore(url)
    out: dict[str, Any] = {}
    async with Engine(store, [Deep()]) as eng:
        await _fill(eng, ["deep"], waiters, "l")
        await _fill(eng, ["empty"], rounds + 1, "l")
        await _rest(store, 2)
        for key in ("empty", "deep"):
            starts = []
            for i in range(rounds):
                t = time.perf_counter()
                await eng.start("deepq", {"key": key}, f"{key}-new{i}")
                starts.append(time.perf_counter() - t)
            order = [f"l{key}-h", *(f"l{key}-w{i:06d}" for i in range(rounds + 1))]
            hands = []
            for a, b in itertools.pairwise(order):
                await _until(lambda r=a: r in STEP_AT)
                t = time.perf_counter()
                await eng.signal(a, "go")
                await _until(lambda r=b: r in STEP_AT)
                hands.append(STEP_AT[b] - t)
            out[key] = {
                "queued": waiters if key == "deep" else rounds + 1,
                "start_ms_p50": round(statistics.median(starts) * 1000, 3),
                "handover_ms_p50": round(statistics.median(hands) * 1000, 3),
                "handover_ms_max": round(max(hands) * 1000, 3),
            }
    return out


def _backends(tmp: Path, pg_url: str | None) -> dict[str, Any]:
    from store_bench import backends

    return backends(tmp, pg_url)


async def main(
    smoke: bool, pg_url: str | None, tmp: Path, waiters: int | None = None, window: float = 10.0
) -> dict[str, Any]:
    n = waiters if waiters is not None else (200 if smoke else 10_000)
    window = 1.0 if smoke else window
    settle = 1.0 if smoke else 5.0
    rounds = 5 if smoke else 20
    results: dict[str, Any] = {"waiters": n, "window_s": window}
    for name, new_url in _backends(tmp, None if smoke else pg_url).items():
        r: dict[str, Any] = {"idle": await idle(new_url(), window, settle)}
        for keys in (10, 1):
            r[f"{keys}_keys"] = await at_rest(new_url(), keys, n, window, settle)
        r["latency"] = await latency(new_url(), n, rounds)
        results[name] = r
        print(f"deepq {name}: {r}")
    return results


def _cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--waiters", type=int, default=None)
    parser.add_argument("--window", type=float, default=10.0)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    from store_bench import postgres_server

    with tempfile.TemporaryDirectory(prefix="flowkit-deepq-") as tmp:
        if args.smoke or args.no_postgres:
            asyncio.run(main(args.smoke, None, Path(tmp), args.waiters, args.window))
            return
        with postgres_server() as pg_url:
            asyncio.run(main(False, pg_url, Path(tmp), args.waiters, args.window))


if __name__ == "__main__":
    _cli()
