"""Waiting for another process's SQLite write lock: SqlStore's way against SQLite's own.

Another process writes to the same SQLite file (WAL, ``synchronous=FULL``) without pause:
transactions that hold the write lock for 0.2-4 ms, 0.1-2 ms apart (a seeded random
stream). This process takes the write lock over and over (``BEGIN IMMEDIATE``, one
``INSERT``, ``COMMIT``, then 0.1-2 ms of other work) and times each ``BEGIN IMMEDIATE``:

* **flowkit**: the store's own connection: no busy timeout, its ``WaitingCursor`` tries
  again after 50 µs, doubling up to 1 ms between tries;
* **sqlite**: a connection with SQLite's busy timeout (30 s), whose handler sleeps 1, 2, 5,
  10, 15, 20, 25, 25, 25, 50, 50, 100 ms between tries: while it sleeps, the other process
  can take the lock again and again.

Both take turns in slices on one file, so drift of the machine spreads over both. The figure
is the ratio of their waits (sqlite ÷ flowkit), mean and p95. Run
``python bench/lock_bench.py [--smoke]`` (also part of ``bench/run.py``)."""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flowkit.stores.sql._sqlite import SQLITE_BUSY_TIMEOUT_MS, WaitingCursor

COMPETITOR = """
import os, random, sqlite3, sys, time
path, stop = sys.argv[1], sys.argv[2]
c = sqlite3.connect(path, isolation_level=None, timeout=30)
rnd = random.Random(1)
print("ready", flush=True)
n = 0
while not os.path.exists(stop):
    c.execute("BEGIN IMMEDIATE")
    c.execute("INSERT INTO other (x) VALUES (1)")
    time.sleep(rnd.uniform(0.0002, 0.004))
    c.execute("COMMIT")
    n += 1
    time.sleep(rnd.uniform(0.0001, 0.002))
print(n, flush=True)
"""


def _connect(path: Path, flowkit_way: bool) -> tuple[sqlite3.Connection, sqlite3.Cursor]:
    conn = sqlite3.connect(path, isolation_level=None)
    if flowkit_way:
        conn.execute("PRAGMA busy_timeout = 0")
        return conn, conn.cursor(WaitingCursor)
    conn.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    return conn, conn.cursor()


def _slice(cur: sqlite3.Cursor, n: int, rnd: random.Random) -> list[float]:
    waits = []
    for _ in range(n):
        t0 = time.perf_counter()
        cur.execute("BEGIN IMMEDIATE")
        waits.append(time.perf_counter() - t0)
        cur.execute("INSERT INTO mine (x) VALUES (2)")
        cur.execute("COMMIT")
        time.sleep(rnd.uniform(0.0001, 0.002))
    return waits


def _summary(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    q = lambda f: s[min(len(s) - 1, int(len(s) * f))] * 1e3  # noqa: E731
    return {
        "n": len(s),
        "mean_ms": statistics.mean(s) * 1e3,
        "p50_ms": q(0.50),
        "p95_ms": q(0.95),
        "p99_ms": q(0.99),
        "max_ms": s[-1] * 1e3,
    }


async def main(smoke: bool, tmp: Path | None = None) -> dict[str, Any]:
    """Measure (the waits block: nothing else runs meanwhile) and print the figures."""
    return measure(smoke, tmp)


def measure(smoke: bool, tmp: Path | None = None) -> dict[str, Any]:
    slices, per_slice = (2, 30) if smoke else (4, 150)
    with tempfile.TemporaryDirectory(prefix="lock-bench-") as d:
        base = tmp or Path(d)
        path, stop = base / "lock-bench.db", base / "lock-bench.stop"
        stop.unlink(missing_ok=True)
        with sqlite3.connect(path, isolation_level=None) as c:
            c.execute("PRAGMA journal_mode = WAL")
            c.execute("CREATE TABLE IF NOT EXISTS other (x INTEGER)")
            c.execute("CREATE TABLE IF NOT EXISTS mine (x INTEGER)")
        proc = subprocess.Popen(
            [sys.executable, "-c", COMPETITOR, str(path), str(stop)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        conns = {way: _connect(path, way == "flowkit") for way in ("flowkit", "sqlite")}
        waits: dict[str, list[float]] = {way: [] for way in conns}
        rnd = random.Random(2)
        try:
            for i in range(slices):
                order = ["flowkit", "sqlite"] if i % 2 == 0 else ["sqlite", "flowkit"]
                for way in order:
                    waits[way] += _slice(conns[way][1], per_slice, rnd)
        finally:
            stop.touch()
            other = int(proc.stdout.readline().strip() or 0)
            proc.wait(timeout=60)
            for conn, _ in conns.values():
                conn.close()
    out: dict[str, Any] = {way: _summary(w) for way, w in waits.items()}
    out["other_process_transactions"] = other
    fk, sq = out["flowkit"], out["sqlite"]
    out["sqlite_over_flowkit"] = {
        "mean": sq["mean_ms"] / fk["mean_ms"],
        "p95": sq["p95_ms"] / fk["p95_ms"],
    }
    print(
        "waiting for another process's SQLite write lock (it holds it 0.2-4 ms at a time,"
        f" 0.1-2 ms apart; {slices} alternating slices of {per_slice} writes each):"
    )
    for way, label in (("flowkit", "SqlStore's wait"), ("sqlite", "SQLite's busy handler")):
        x = out[way]
        print(
            f"  {label:<22}: mean {x['mean_ms']:6.2f} ms  p50 {x['p50_ms']:6.2f}"
            f"  p95 {x['p95_ms']:7.2f}  p99 {x['p99_ms']:7.2f}  max {x['max_ms']:7.1f} ms"
        )
    r = out["sqlite_over_flowkit"]
    print(f"  SQLite's own wait / SqlStore's: mean {r['mean']:.1f}x, p95 {r['p95']:.1f}x")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true")
    asyncio.run(main(parser.parse_args().smoke))
