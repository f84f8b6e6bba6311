"""Timer lateness: how late durable timers and step retry backoffs fire, with and without
singleton waiters parked behind a holder.

One engine with the Engine's defaults (``SystemClock``, ``poll_interval=1.0``) on one store.
Unrelated runs either sleep (``ctx.sleep(x)``) or fail a step once and retry it after a backoff
of ``x`` (``RetryPolicy(initial_interval=x)``), ``x`` drawn from a seeded stream between
0.1 s and a few seconds; they are all started first, so several timers are pending at once.
Lateness is the instant the run resumed (a step stamps ``time.time()``) minus the instant
its history says it was due (``timer_started.fire_at``, ``step_failed.retry_at``).

Two scenarios on fresh stores, one after the other:

* **no waiters**: only the timer runs;
* **parked waiters**: first a singleton holder that waits for a signal (it never comes), and
  waiters of its key behind it, parked ``suspended`` with their ~1 s gate re-check
  (``singleton_gated``); they re-check, are denied and park again all along.

The baseline, measured in the same run and on the same event loop: plain ``asyncio.sleep``
tasks due at the same instants as the runs' timers (what the machine and the loop give any
timer). Figures: p50/p99/max of each, in ms; with a correct poller the runs' lateness is the
baseline plus one claim and one activation (milliseconds), with or without waiters, far
below the 1 s poll interval. Run ``python bench/timer_bench.py [--smoke]`` (also part of
``bench/run.py``): SQLite, memory and a throwaway PostgreSQL; smoke: SQLite only."""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import store_bench  # (first: it puts the repository root first on sys.path)

from flowkit import Engine, RetryPolicy, Singleton, WorkflowCtx, workflow
from flowkit.stores import MemoryStore
from flowkit.stores.sql import SqlStore

HOLDER = "timer-bench-holder"
SLEEPER = "timer-bench-sleeper"
RETRIER = "timer-bench-retrier"

# run id -> the instants a probe step ran (wall clock): the first is the resumed run
STAMPS: dict[str, list[float]] = {}


def _stamp(run_id: str) -> None:
    STAMPS.setdefault(run_id, []).append(time.time())


def _fail_once(run_id: str) -> None:
    _stamp(run_id)
    if len(STAMPS[run_id]) == 1:
        raise RuntimeError("first attempt fails: the retry is a durable timer")


@workflow(name=HOLDER, singleton=Singleton(key=lambda key: key))
class Holder:
    """Holds its key's slot until signalled (the holder); behind it, a parked waiter."""

    async def run(self, ctx: WorkflowCtx, input: str) -> None:
        await ctx.wait_for_signal("go")


@workflow(name=SLEEPER)
class Sleeper:
    async def run(self, ctx: WorkflowCtx, input: float) -> None:
        await ctx.sleep(input)
        await ctx.step(_stamp, ctx.run_id)


@workflow(name=RETRIER)
class Retrier:
    async def run(self, ctx: WorkflowCtx, input: float) -> None:
        policy = RetryPolicy(max_attempts=2, initial_interval=input)
        await ctx.step(_fail_once, ctx.run_id, retry=policy)


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(len(s) * p) - 1)]


def summary(lateness: list[float]) -> dict[str, Any]:
    """p50/p99/max in ms, and how many fired more than 100 ms late."""
    return {
        "n": len(lateness),
        "p50_ms": _pct(lateness, 0.50) * 1e3,
        "p99_ms": _pct(lateness, 0.99) * 1e3,
        "max_ms": max(lateness) * 1e3,
        "over_100ms": sum(x > 0.1 for x in lateness),
    }


async def _raw_timer(due: float, out: list[float]) -> None:
    """The baseline: a plain asyncio timer due at ``due`` on the same loop."""
    await asyncio.sleep(max(0.0, due - time.time()))
    out.append(time.time() - due)


async def scenario(store: Any, waiters: int, timers: int, span: float, seed: int) -> dict[str, Any]:
    """Start ``waiters`` parked waiters (behind one holder) and ``timers`` timer runs on one
    engine, wait for every timer run, return the runs' and the baseline's lateness."""
    STAMPS.clear()
    rng = random.Random(seed)
    engine = Engine(store, [Holder(), Sleeper(), Retrier()])
    raw: list[float] = []
    probes: list[asyncio.Task[None]] = []
    async with engine:
        if waiters:
            await engine.start(HOLDER, "k", "holder")
            for i in range(waiters):
                await engine.start(HOLDER, "k", f"waiter{i}")
            # (admission at creation parks them at once; their re-checks run all along)
        ids: list[tuple[str, str]] = []
        for i in range(timers):
            x = round(rng.uniform(0.1, span), 3)
            kind = SLEEPER if i % 2 == 0 else RETRIER
            rid = f"t{i}"
            due = time.time() + x
            await engine.start(kind, x, rid)
            ids.append((kind, rid))
            probes.append(asyncio.ensure_future(_raw_timer(due, raw)))
        lateness: list[float] = []
        for kind, rid in ids:
            await engine.result(rid, timeout=span + 30)
            hist = await engine.history(rid)
            if kind == SLEEPER:
                due = next(e.fire_at for e in hist if e.type == "timer_started")
                fired = STAMPS[rid][0]
            else:
                due = next(e.retry_at for e in hist if e.type == "step_failed")
                fired = STAMPS[rid][1]
            lateness.append(fired - due)
        for i in range(waiters):  # still parked: they re-checked the gate all along
            run = await engine.get_run(f"waiter{i}")
            assert not run.admitted, "a waiter got the slot: the holder never releases it"
        await asyncio.gather(*probes)
    return {"runs": summary(lateness), "raw": summary(raw), "lateness_s": lateness}


StoreFactory = Callable[[], Any]


def store_kinds(smoke: bool, tmp: Path, pg_url: str | None) -> dict[str, StoreFactory]:
    """Name -> factory of a fresh store: SQLite (always), memory and PostgreSQL (full)."""
    out: dict[str, StoreFactory] = {"sqlite": lambda: SqlStore(store_bench.sqlite_url(tmp))}
    if smoke:
        return out
    out["memory"] = MemoryStore
    if pg_url is not None:
        out["postgres"] = lambda: SqlStore(store_bench.postgres_url(pg_url))
    return out


def _line(label: str, s: dict[str, Any]) -> str:
    return (
        f"    {label:<22} p50 {s['p50_ms']:7.1f} ms  p99 {s['p99_ms']:7.1f} ms"
        f"  max {s['max_ms']:7.1f} ms  >100 ms late: {s['over_100ms']:>3}/{s['n']}"
    )


async def main(smoke: bool, pg_url: str | None, tmp: Path) -> dict[str, Any]:
    timers, span, waiters = (12, 1.5, 1) if smoke else (60, 5.0, 3)
    print(
        f"timer lateness (one engine, SystemClock, poll_interval 1 s; {timers} timer runs due"
        f" within {span} s: sleeps and retry backoffs; fired - due):"
    )
    results: dict[str, Any] = {}
    for name, make in store_kinds(smoke, tmp, pg_url).items():
        print(f"  {name}:")
        per: dict[str, Any] = {}
        for label, n in (("no_waiters", 0), ("parked_waiters", waiters)):
            store = make()
            try:
                r = await scenario(store, n, timers, span, seed=17)
            finally:
                close = getattr(store, "close", None)
                if close is not None:
                    close()
            per[label] = r
            what = "no waiters" if n == 0 else f"{n} parked waiter{'s' * (n > 1)}"
            print(_line(f"runs, {what}", r["runs"]))
            print(_line("  asyncio baseline", r["raw"]))
        ratio = per["parked_waiters"]["runs"]["p99_ms"] / per["no_waiters"]["runs"]["p99_ms"]
        print(f"    p99 with waiters / without: {ratio:.2f}x")
        per["p99_ratio_waiters_to_none"] = ratio
        results[name] = per
    return results


@contextmanager
def _databases(smoke: bool) -> Iterator[tuple[Path, str | None]]:
    with tempfile.TemporaryDirectory(prefix="flowkit-timer-bench-") as tmp:
        if smoke:
            yield Path(tmp), None
            return
        with store_bench.postgres_server() as pg_url:
            yield Path(tmp), pg_url


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="SQLite only, a dozen timers")
    args = parser.parse_args()
    with _databases(args.smoke) as (tmp_dir, pg):
        asyncio.run(main(args.smoke, pg, tmp_dir))
