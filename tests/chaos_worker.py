"""A worker process for the PostgreSQL chaos and failover tests (tests/test_pg_chaos.py,
tests/test_pg_failover.py).

``python tests/chaos_worker.py URL MARKS INSTANCE STOP_FILE [--lease-ttl S] [--max-concurrency N]
[--extra-dsn DSN]`` runs one Engine on ``SqlStore(URL)`` until ``STOP_FILE`` exists, then
stops it and exits 0. Two workflows: ``chaos-plain`` and ``chaos-single`` (a singleton on
``k<key>``), each running ``steps`` steps in sequence; each step execution appends
``B <instance> <pid> <run id> <label> <unix time>`` to ``MARKS`` when it starts and the same
with ``E`` when its body returns (one ``write`` on an ``O_APPEND`` descriptor: a line survives
a kill -9 of the process), so the test knows every execution, across processes, with its
interval. A sleeper coroutine measures the event loop's lag; its maximum is printed at exit.

``--extra-dsn`` adds what the issue's SIGSEGV harness had: an extra psycopg
``AsyncConnection`` in the worker's loop running ``SELECT 1`` every 20 ms and reconnecting
when it breaks."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from flowkit import Engine, Singleton, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore

PLAIN = "chaos-plain"
SINGLE = "chaos-single"


class Marks:
    """The execution log of this process (one line per step start and per step end)."""

    def __init__(self, path: Path, instance: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.instance = instance

    def write(self, kind: str, run_id: str, label: str) -> None:
        line = f"{kind} {self.instance} {os.getpid()} {run_id} {label} {time.time():.6f}\n"
        os.write(self.fd, line.encode())


class _Steps:
    def __init__(self, marks: Marks) -> None:
        self.marks = marks

    async def work(self, run_id: str, label: str, hold: float) -> str:
        self.marks.write("B", run_id, label)
        await asyncio.sleep(hold)
        self.marks.write("E", run_id, label)
        return label

    async def run(self, ctx: WorkflowCtx, input: dict[str, Any]) -> list[str]:
        out = []
        for i in range(int(input["steps"])):
            out.append(await ctx.step(self.work, ctx.run_id, f"s{i}", float(input["hold"])))
        return out


@workflow(name=PLAIN)
class Plain(_Steps):
    """Steps one after the other, any number of runs at once."""


@workflow(name=SINGLE, singleton=Singleton(key=lambda inp: f"k{inp['key']}"))
class Single(_Steps):
    """The same, one run per key at a time."""


async def _lag_monitor(box: list[float]) -> None:
    """Keep the largest lateness of a 10 ms sleep (the event loop's worst stall)."""
    loop = asyncio.get_running_loop()
    while True:
        t = loop.time()
        await asyncio.sleep(0.01)
        box[0] = max(box[0], loop.time() - t - 0.01)


async def _extra_connection(dsn: str, stats: list[int]) -> None:
    """The issue's harness: an extra async psycopg connection, busy, reconnecting."""
    import psycopg

    while True:
        try:
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                while True:
                    await (await conn.execute("SELECT 1")).fetchone()
                    stats[0] += 1
                    await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            raise
        except Exception:
            stats[1] += 1
            await asyncio.sleep(0.05)


async def main(a: argparse.Namespace) -> int:
    marks = Marks(a.marks, a.instance)
    store = SqlStore(a.url)
    engine = Engine(
        store,
        [Plain(marks), Single(marks)],
        instance_id=a.instance,
        lease_ttl=a.lease_ttl,
        poll_interval=0.2,
        max_concurrency=a.max_concurrency,
    )
    lag = [0.0]
    extra = [0, 0]
    helpers = [asyncio.ensure_future(_lag_monitor(lag))]
    if a.extra_dsn:
        helpers.append(asyncio.ensure_future(_extra_connection(a.extra_dsn, extra)))
    try:
        async with engine:
            print(f"{a.instance} ready pid={os.getpid()}", flush=True)
            # the stop file comes from another process: nothing to await but its appearance
            while not a.stop_file.exists():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        return 0
    finally:
        for h in helpers:
            h.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await h
        print(f"{a.instance} max-loop-lag={lag[0]:.3f} extra={extra}", flush=True)
        store.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("marks", type=Path)
    p.add_argument("instance")
    p.add_argument("stop_file", type=Path)
    p.add_argument("--lease-ttl", type=float, default=10.0)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument("--extra-dsn", default="")
    sys.exit(asyncio.run(main(p.parse_args())))
