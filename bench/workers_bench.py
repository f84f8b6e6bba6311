"""Several workers on one database (issue #24, item 5): 1, 2 and 4 ``flowkit worker``
processes (``bench/workers_app.py``, the CLI's defaults: concurrency 100, poll 1 s) on one
PostgreSQL database (default durability, ``store_bench.postgres_server``), a fresh database
for each count.

* **Throughput.** A starter (this process, ``Engine(worker=False)``, 16 concurrent callers)
  creates ``runs`` 3-step runs while the workers serve; aggregate workflows/s = runs / (the
  last ``updated_at`` of a completed run - the first ``created_at``), both from the runs table.
* **Spread.** Each run's result is the pid of the process that ran its last step: runs per
  worker, and the largest deviation from an even share (target within +-20 %).
* **Hand-over across processes.** Then ``keys`` x ``per_key`` runs of ``store_bench.Handover``
  (singleton, a first step and a 5 ms step): a holder's ``singleton_released`` to the next
  run's first ``step_completed``, p50/p95 (event ``at``s: one kernel clock for all).

``python bench/workers_bench.py`` (PostgreSQL; ``--sqlite`` for a SQLite file) or ``--smoke``
(SQLite, 1 and 2 workers, 60 runs). Part of ``bench/run.py``."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import sqlalchemy as sa
import store_bench
from store_bench import HANDOVER_WF
from workers_app import SPREAD_WF, WORKFLOWS

from flowkit import Engine
from flowkit.stores.sql import SqlStore
from flowkit.stores.sql._schema import runs as runs_table

BENCH = Path(__file__).resolve().parent


async def spawn(url: str, name: str, log: Path) -> asyncio.subprocess.Process:
    """``flowkit worker workers_app:WORKFLOWS`` as a process of its own."""
    env = {**os.environ, "PYTHONPATH": f"{store_bench.ROOT}{os.pathsep}{BENCH}"}
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "flowkit.cli",
            "worker",
            "workers_app:WORKFLOWS",
            "--db",
            url,
            "--instance-id",
            name,
            env=env,
            cwd=BENCH,
            stdout=out,
            stderr=out,
        )


async def _until(cond: Any, what: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _p(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(len(s) * q) - 1)]


async def one_count(url: str, workers: int, runs: int, keys: int, per_key: int, tmp: Path) -> Any:
    logs = [tmp / f"w{workers}-{i}.log" for i in range(workers)]
    procs = [await spawn(url, f"w{i}", logs[i]) for i in range(workers)]
    eng = sa.create_engine(url)
    try:
        await _until(
            lambda: all("serving" in p.read_text() for p in logs), "the workers to start", 60
        )
        store = SqlStore(url)
        client = Engine(store, WORKFLOWS, worker=False)
        ids = iter(range(runs))

        async def caller() -> None:
            for i in ids:
                await client.start(SPREAD_WF, i, f"three-{i:06d}")

        await asyncio.gather(*(caller() for _ in range(16)))

        def count(wf: str) -> int:
            with eng.connect() as conn:
                q = "SELECT count(*) FROM flowkit_runs WHERE workflow = :w AND status = 'completed'"
                return int(conn.execute(sa.text(q), {"w": wf}).scalar_one())

        await _until(lambda: count(SPREAD_WF) == runs, "the runs", 120 + runs / 10)
        with eng.connect() as conn:
            first, last = conn.execute(
                sa.text(
                    "SELECT min(created_at), max(updated_at) FROM flowkit_runs WHERE workflow = :w"
                ),
                {"w": SPREAD_WF},
            ).one()
        by_pid: dict[int, int] = {p.pid: 0 for p in procs}
        with eng.connect() as conn:
            q = sa.select(runs_table.c.output).where(runs_table.c.workflow == SPREAD_WF)
            for (pid,) in conn.execute(q):
                by_pid[int(pid)] = by_pid.get(int(pid), 0) + 1
        share = runs / workers
        spread = max(abs(n - share) / share for n in by_pid.values())
        # hand-overs
        order: dict[int, list[str]] = {k: [] for k in range(keys)}
        for i in range(per_key):
            for k in range(keys):
                rid = f"ho-k{k}-{i:04d}"
                await client.start(HANDOVER_WF, {"k": k}, rid)
                order[k].append(rid)
        await _until(lambda: count(HANDOVER_WF) == keys * per_key, "the hand-overs", 60 + per_key)
        gaps: list[float] = []
        for rids in order.values():
            hist = {rid: list(await client.history(rid)) for rid in rids}

            def at(rid: str, kind: str, h: dict[str, list[Any]] = hist) -> float:
                return float(next(e.at for e in h[rid] if e.type == kind))

            seq = sorted(rids, key=lambda r: at(r, "singleton_admitted"))
            for prev, nxt in itertools.pairwise(seq):
                gaps.append(at(nxt, "step_completed") - at(prev, "singleton_released"))
        store.close()
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
        for p in procs:
            await p.wait()
        eng.dispose()
    return {
        "workers": workers,
        "runs": runs,
        "workflows_per_s": runs / (last - first),
        "runs_per_worker": sorted(by_pid.values()),
        "max_deviation": spread,
        "handover_ms": {
            "n": len(gaps),
            "p50": statistics.median(gaps) * 1e3,
            "p95": _p(gaps, 0.95) * 1e3,
        },
    }


async def main(smoke: bool, pg_url: str | None, tmp: Path) -> dict[str, Any]:
    counts, runs, keys, per_key = ((1, 2), 60, 2, 6) if smoke else ((1, 2, 4), 2000, 8, 25)
    use_pg = pg_url is not None and not smoke
    kind = "postgres" if use_pg else "sqlite"
    print(
        f"several workers on one {kind} database ({runs} 3-step runs started by 16 callers,"
        f" then {keys} singleton keys x {per_key} runs):"
    )
    out: dict[str, Any] = {"database": kind}
    for n in counts:
        url = store_bench.postgres_url(pg_url) if use_pg and pg_url else store_bench.sqlite_url(tmp)
        SqlStore(url).close()
        r = await one_count(url, n, runs, keys, per_key, tmp)
        out[str(n)] = r
        h = r["handover_ms"]
        print(
            f"  {n} worker{'s' * (n > 1)}: {r['workflows_per_s']:7.1f} workflows/s;"
            f" runs per worker {r['runs_per_worker']} (max {r['max_deviation']:.0%} off even);"
            f" hand-over p50 {h['p50']:.1f} ms, p95 {h['p95']:.1f} ms"
        )
    return out


def _cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="SQLite, 1 and 2 workers, 60 runs")
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file, not PostgreSQL")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="flowkit-workers-") as tmp:
        if args.smoke or args.sqlite:
            asyncio.run(main(args.smoke, None, Path(tmp)))
            return 0
        with store_bench.postgres_server() as pg:
            asyncio.run(main(False, pg, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
