"""Child workflows (issue #21): a child's start-to-result latency and a parent's wake-up after
its child settles, on SQLite and (when its binaries are there) PostgreSQL, one engine with the
real clock.

* ``plain``: the baseline, measured in the same run: ``engine.start`` of a one-step workflow
  to its ``engine.result``, one run at a time.
* ``child``: the same, for a parent whose body is ``await ctx.child(OneStep, i)``: the child's
  start, its run, the parent's wake-up and its settlement (printed as a ratio to ``plain``).
* ``wake``: for a parent awaiting a child that sleeps 50 ms (so the parent is surely
  suspended), the time from the child's settling commit (the store's ``commit`` returning)
  to the parent's next activation (its ``claim`` returning): the notify path. Without it the
  parent would look again only after ``CHILD_POLL`` (60 s).

Mean and p95 (ms) of each. ``python bench/child_bench.py [--smoke]``."""

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

import _results
import store_bench  # (first: it puts the repository root first on sys.path)

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore


async def _inc(x: int) -> int:
    return x + 1


@workflow(name="bench-child-leaf")
class OneStep:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        return await ctx.step(_inc, input)


@workflow(name="bench-child-slow-leaf")
class SlowLeaf:
    async def run(self, ctx: WorkflowCtx, input: int) -> int:
        await ctx.sleep(0.05)
        return await ctx.step(_inc, input)


@workflow(name="bench-child-parent")
class Parent:
    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> int:
        leaf = SlowLeaf if input["slow"] else OneStep
        return int(await ctx.child(leaf, input["x"])) + 1


def _stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "mean_ms": statistics.fmean(xs) * 1000,
        "p95_ms": xs[min(len(xs) - 1, int(0.95 * len(xs)))] * 1000,
        "n": len(xs),
    }


async def bench_backend(url: str, n: int) -> dict[str, Any]:
    store = SqlStore(url)
    settled: dict[str, float] = {}  # child id -> when its settling commit returned
    woke: dict[str, list[float]] = {}  # parent id -> when its claims returned
    commit, claim = store.commit, store.claim

    async def timed_commit(run_id: str, owner: Any, now: float, update: Any) -> Any:
        res = await commit(run_id, owner, now, update)
        if res.run.status.terminal and res.run.parent_id is not None:
            settled[run_id] = time.perf_counter()
        return res

    async def timed_claim(run_id: str, *args: Any, **kwargs: Any) -> Any:
        run = await claim(run_id, *args, **kwargs)
        if run is not None:
            woke.setdefault(run_id, []).append(time.perf_counter())
        return run

    store.commit = timed_commit  # type: ignore[method-assign]
    store.claim = timed_claim  # type: ignore[method-assign]
    engine = Engine(store, [OneStep(), SlowLeaf(), Parent()], poll_interval=1.0)
    plain: list[float] = []
    child: list[float] = []
    wake: list[float] = []
    try:
        async with engine:
            for i in range(-3, n):  # (3 to warm up)
                t = time.perf_counter()
                await engine.start(OneStep, i, f"plain-{i}")
                assert await engine.result(f"plain-{i}", timeout=60) == i + 1
                dt_plain = time.perf_counter() - t
                t = time.perf_counter()
                await engine.start(Parent, {"x": i, "slow": False}, f"fast-{i}")
                assert await engine.result(f"fast-{i}", timeout=60) == i + 2
                dt_child = time.perf_counter() - t
                await engine.start(Parent, {"x": i, "slow": True}, f"slow-{i}")
                assert await engine.result(f"slow-{i}", timeout=60) == i + 2
                if i < 0:
                    continue
                plain.append(dt_plain)
                child.append(dt_child)
                done = settled[f"slow-{i}.child.1"]
                later = [w for w in woke.get(f"slow-{i}", []) if w >= done]
                assert later, "the parent was not claimed after its child settled"
                wake.append(later[0] - done)
    finally:
        store.close()
    return {"plain": _stats(plain), "child": _stats(child), "wake": _stats(wake)}


def _print(name: str, r: dict[str, Any]) -> None:
    p, c, w = r["plain"], r["child"], r["wake"]
    print(
        f"  {name:8s} plain start→result {p['mean_ms']:7.2f} ms (p95 {p['p95_ms']:7.2f})"
        f" | child start→result {c['mean_ms']:7.2f} ms (p95 {c['p95_ms']:7.2f},"
        f" {c['mean_ms'] / p['mean_ms']:.2f}x plain)"
        f" | parent wake-up {w['mean_ms']:6.2f} ms (p95 {w['p95_ms']:6.2f},"
        f" {w['mean_ms'] / p['mean_ms']:.2f}x plain)"
    )


async def main(smoke: bool, pg_url: str | None, tmp: Path) -> dict[str, Any]:
    n = 5 if smoke else 100
    print(f"child workflows ({n} runs of each, one at a time; SystemClock):")
    results: dict[str, Any] = {}
    for name, new_url in store_bench.backends(tmp, pg_url).items():
        r = await bench_backend(new_url(), n)
        _print(name, r)
        results[name] = r
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="a few runs")
    args = parser.parse_args()
    doc = _results.start()
    with (
        tempfile.TemporaryDirectory(prefix="flowkit-bench-") as tmp,
        store_bench.postgres_server() as pg,
    ):
        doc["child"] = asyncio.run(main(args.smoke, pg, Path(tmp)))
    _results.finish(doc, "child-smoke.json" if args.smoke else "child.json")
