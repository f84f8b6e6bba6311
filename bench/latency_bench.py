"""Network latency between the engine and PostgreSQL (issue #19, item 1).

One engine on a durable throwaway PostgreSQL (``tests/pg.py``), 32 runs of 5 trivial steps in
flight, measured on the direct link (the server's unix socket) and through a loopback TCP
proxy (``flowkit_testing._netproxy.NetProxy``, in a process of its own so it does not compete
for this process's GIL) that adds 2 ms each way. A sleeper coroutine sleeps 1 ms at a time
and records how late it wakes: the event loop's lag. Printed: runs/s and the lag's
p50/p99/max per link, and the ratios the issue sets targets for (throughput with latency ÷
direct ≥ 0.8x; lag p99 with latency - direct ≤ 2 ms).

A second part compares ways of issuing 32 concurrent single-row writes over the same 2 ms
link (why ``SqlStore`` runs its statements on an I/O thread rather than through psycopg's
async connection): one ``psycopg.AsyncConnection`` shared by the 32 coroutines; the same with
each round's 32 statements in one pipeline; a synchronous connection on a thread, each
round's 32 statements in one pipeline (what the store's write lane does).

``python bench/latency_bench.py [--smoke]``; run it with ``PYTHONPATH`` pointing at another
checkout to measure that code (the before/after table of docs/performance.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import _results
import sqlalchemy as sa
import store_bench  # (first: it puts the repository root first on sys.path)

from flowkit import Engine, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore

STEPS = 5
IN_FLIGHT = 32
DELAY = 0.002  # seconds added each way


async def _inc(x: int) -> int:
    return x + 1


@workflow(name="bench-latency-five")
class FiveSteps:
    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> int:
        x = input["x"]
        for _ in range(STEPS):
            x = await ctx.step(_inc, x)
        return x


class Sleeper:
    """Sleeps 1 ms at a time until stopped; ``lags`` how late each wake-up was (seconds)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.stop = False

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop:
            t = loop.time()
            await asyncio.sleep(0.001)
            self.lags.append(loop.time() - t - 0.001)

    def figures(self) -> dict[str, float]:
        xs = sorted(self.lags) or [0.0]

        def q(p: float) -> float:
            return xs[min(len(xs) - 1, int(p * len(xs)))] * 1000

        return {"lag_p50_ms": q(0.5), "lag_p99_ms": q(0.99), "lag_max_ms": xs[-1] * 1000}


@contextmanager
def proxy_process(socket_path: str, delay: float) -> Iterator[int]:
    """A ``NetProxy`` in a child process: its port."""
    code = (
        "import sys\n"
        "from flowkit_testing._netproxy import NetProxy\n"
        "p = NetProxy(sys.argv[1], delay=float(sys.argv[2])).start()\n"
        "print(p.port, flush=True)\n"
        "sys.stdin.read()\n"
    )
    root = str(Path(__file__).parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, socket_path, str(delay)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def _socket_of(server_url: str) -> str:
    host = sa.engine.make_url(server_url).query["host"]
    assert isinstance(host, str)
    return str(Path(host) / ".s.PGSQL.5432")


def _via(url: str, port: int) -> str:
    u = sa.engine.make_url(url)
    query = {k: v for k, v in u.query.items() if k not in ("host", "port")}
    return u.set(host="127.0.0.1", port=port, query=query).render_as_string(hide_password=False)


async def runs_per_s(url: str, n: int) -> dict[str, Any]:
    """``n`` runs of ``FiveSteps``, ``IN_FLIGHT`` at a time, on one engine; with the lag."""
    store = SqlStore(url)
    engine = Engine(store, [FiveSteps()])
    ids = iter(range(n))

    async def client(prefix: str) -> None:
        for i in ids:
            run = await engine.start(FiveSteps, {"x": i}, f"{prefix}-{i:06d}")
            assert await engine.result(run.id, timeout=300) == i + STEPS

    try:
        async with engine:
            warm = iter(range(IN_FLIGHT))
            ids, rest = warm, ids
            await asyncio.gather(*(client("warm") for _ in range(IN_FLIGHT)))
            ids = rest
            sleeper = Sleeper()
            ticking = asyncio.ensure_future(sleeper.run())
            t0 = time.perf_counter()
            await asyncio.gather(*(client("run") for _ in range(IN_FLIGHT)))
            dt = time.perf_counter() - t0
            sleeper.stop = True
            await ticking
    finally:
        store.close()
    return {"runs": n, "seconds": dt, "runs_per_s": n / dt, **sleeper.figures()}


# -- psycopg's async connection against a connection on a thread ------------------------------

_SETUP = "CREATE TABLE IF NOT EXISTS bench_rt (id bigserial PRIMARY KEY, v int)"
_INSERT = "INSERT INTO bench_rt (v) VALUES (%s) RETURNING id"


def _dsn(port: int, url: str) -> str:
    db = sa.engine.make_url(url).database
    return f"host=127.0.0.1 port={port} user=postgres dbname={db}"


async def _async_each(dsn: str, rounds: int) -> float:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    try:

        async def one(i: int) -> None:
            cur = await conn.execute(_INSERT, (i,))
            await cur.fetchone()

        t0 = time.perf_counter()
        for _ in range(rounds):
            await asyncio.gather(*(one(i) for i in range(IN_FLIGHT)))
        return time.perf_counter() - t0
    finally:
        await conn.close()


async def _async_pipeline(dsn: str, rounds: int) -> float:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(dsn)
    try:
        t0 = time.perf_counter()
        for _ in range(rounds):
            async with conn.transaction(), conn.pipeline():
                curs = [conn.cursor() for _ in range(IN_FLIGHT)]
                for i, cur in enumerate(curs):
                    await cur.execute(_INSERT, (i,))
            for cur in curs:
                await cur.fetchone()
        return time.perf_counter() - t0
    finally:
        await conn.close()


async def _thread_pipeline(dsn: str, rounds: int) -> float:
    import concurrent.futures

    import psycopg

    conn = psycopg.connect(dsn)
    pool = concurrent.futures.ThreadPoolExecutor(1)

    def batch() -> None:
        with conn.transaction(), conn.pipeline():
            curs = [conn.cursor() for _ in range(IN_FLIGHT)]
            for i, cur in enumerate(curs):
                cur.execute(_INSERT, (i,))
        for cur in curs:
            cur.fetchone()

    try:
        t0 = time.perf_counter()
        for _ in range(rounds):
            await asyncio.wrap_future(pool.submit(batch))
        return time.perf_counter() - t0
    finally:
        pool.shutdown()
        conn.close()


async def round_trips(url: str, port: int, rounds: int) -> dict[str, Any]:
    """Writes/s and loop lag of each way, over the proxied link."""
    import psycopg

    with psycopg.connect(_dsn(port, url), autocommit=True) as c:
        c.execute(_SETUP)
    out: dict[str, Any] = {}
    ways = {
        "async_connection": _async_each,
        "async_pipeline": _async_pipeline,
        "thread_pipeline": _thread_pipeline,
    }
    for name, fn in ways.items():
        sleeper = Sleeper()
        ticking = asyncio.ensure_future(sleeper.run())
        dt = await fn(_dsn(port, url), rounds)
        sleeper.stop = True
        await ticking
        out[name] = {"writes_per_s": rounds * IN_FLIGHT / dt, **sleeper.figures()}
    return out


async def main(smoke: bool, pg_url: str | None) -> dict[str, Any]:
    if pg_url is None:
        print("latency: skipped (no PostgreSQL)")
        return {}
    n = IN_FLIGHT * (2 if smoke else 12)
    print(f"\nlatency: one engine, {IN_FLIGHT} runs of {STEPS} steps in flight, {n} runs")
    out: dict[str, Any] = {}
    url = store_bench.postgres_url(pg_url)
    slices = 1 if smoke else 3
    links = ("direct", "proxy_0ms", "delay_2ms")
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in links}
    # the links alternate, slice after slice, so that a noisy neighbour hits all of them;
    # ``proxy_0ms`` is the same proxy without delay: what the extra hop itself costs
    with (
        proxy_process(_socket_of(pg_url), 0.0) as port0,
        proxy_process(_socket_of(pg_url), DELAY) as port,
    ):
        for _ in range(slices):
            # (each measurement on a fresh database: run ids repeat)
            got["direct"].append(await runs_per_s(store_bench.postgres_url(pg_url), n))
            got["proxy_0ms"].append(
                await runs_per_s(_via(store_bench.postgres_url(pg_url), port0), n)
            )
            got["delay_2ms"].append(
                await runs_per_s(_via(store_bench.postgres_url(pg_url), port), n)
            )
        rt = await round_trips(url, port, 5 if smoke else 40)
    for name in links:
        rs = sorted(got[name], key=lambda r: r["runs_per_s"])
        out[name] = {**rs[len(rs) // 2], "slices": [round(r["runs_per_s"], 1) for r in got[name]]}
        r = out[name]
        print(
            f"  {name:10} {r['runs_per_s']:7.1f} runs/s (median of {r['slices']})"
            f"   loop lag p50 {r['lag_p50_ms']:.2f} ms, p99 {r['lag_p99_ms']:.2f} ms,"
            f" max {r['lag_max_ms']:.1f} ms"
        )
    d, z, s = out["direct"], out["proxy_0ms"], out["delay_2ms"]
    out["throughput_ratio"] = s["runs_per_s"] / d["runs_per_s"]
    out["throughput_ratio_vs_proxy_0ms"] = s["runs_per_s"] / z["runs_per_s"]
    out["lag_p99_added_ms"] = s["lag_p99_ms"] - d["lag_p99_ms"]
    print(
        f"  2 ms each way ÷ direct: {out['throughput_ratio']:.2f}x throughput (target ≥ 0.8x)"
        f" [÷ the proxy without delay: {out['throughput_ratio_vs_proxy_0ms']:.2f}x],"
        f" loop lag p99 {out['lag_p99_added_ms']:+.2f} ms (target ≤ +2 ms)"
    )
    out["round_trips"] = rt
    print(f"  {IN_FLIGHT} concurrent single-row writes over the 2 ms link:")
    for name, r in rt.items():
        print(
            f"    {name:17} {r['writes_per_s']:8.0f} writes/s   loop lag p99"
            f" {r['lag_p99_ms']:.2f} ms, max {r['lag_max_ms']:.1f} ms"
        )
    return out


def _cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes")
    args = parser.parse_args()
    results = _results.start()
    with store_bench.postgres_server() as pg_url:
        results["latency"] = asyncio.run(main(args.smoke, pg_url))
    _results.finish(results, "latency_smoke.json" if args.smoke else "latency_latest.json")
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
