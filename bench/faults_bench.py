"""Issue #19's table, measured again: three worker processes on one durable PostgreSQL server,
runs of five steps (a third of them singleton runs over five keys), and the link made to
misbehave. Rows:

* ``stall``: every connection through a TCP proxy goes silent for ``--stall`` seconds: how
  late the workers' event loops ran meanwhile (a coroutine that sleeps 1 ms and records how
  late it wakes), how long ``asyncio.wait_for(store.get_run(...), 5)`` took, and how many
  steps executed on two workers at the same time afterwards (the same run and step, overlapping
  in time, on two processes).
* ``blackhole``: a server that accepts connections and never answers: how long the first store
  call takes to fail, and with what.
* ``restart``: ``pg_ctl restart -m fast`` under load: the time from the server accepting
  connections again to the next step completing, the longest stretch without any step
  completing, and the exception types a client saw meanwhile.
* ``nul``: a step whose result contains ``"\\x00"``: where its run is after ``--nul-wait``
  seconds and how often the step executed.

``python bench/faults_bench.py`` runs them all (about two minutes); ``--only stall`` one.
The loop-lag and throughput rows of the table (one engine, 32 runs, 2 ms each way) are
``bench/latency_bench.py``'s. Figures go to ``bench/results/faults_latest.json``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.pg: the throwaway PostgreSQL

import _results  # noqa: E402

from flowkit import Engine, RunStatus, Singleton, WorkflowCtx, workflow  # noqa: E402
from flowkit.stores.sql import SqlStore  # noqa: E402
from flowkit_testing._netproxy import NetProxy  # noqa: E402

STEPS = 5
KEYS = 5
OUT: Path | None = None  # the worker's execution log


async def step(run_id: str, i: int) -> int:
    """Sleep 10 ms and log the execution (pid, start, end) for the parent's overlap count."""
    t0 = time.time()
    await asyncio.sleep(0.01)
    if OUT is not None:
        with OUT.open("a") as f:
            f.write(json.dumps([run_id, i, os.getpid(), t0, time.time()]) + "\n")
    return i


async def nul_step() -> str:
    if OUT is not None:
        with OUT.open("a") as f:
            f.write(json.dumps(["nul", 0, os.getpid(), time.time(), time.time()]) + "\n")
    return "a\x00b"


@workflow(name="faults-work")
class Work:
    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> int:
        return sum([await ctx.step(step, ctx.run_id, i) for i in range(STEPS)])


@workflow(name="faults-single", singleton=Singleton(key=lambda inp: f"k{inp['key']}"))
class Single:
    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> int:
        return sum([await ctx.step(step, ctx.run_id, i) for i in range(STEPS)])


@workflow(name="faults-nul")
class Nul:
    async def run(self, ctx: WorkflowCtx, input: None) -> str:
        result: str = await ctx.step(nul_step)
        return result


WORKFLOWS = [Work, Single, Nul]


# -- the worker process --------------------------------------------------------------------


async def worker_main(url: str, name: str, out: Path) -> int:
    """Run an engine until ``stop`` on stdin; print ``stats <json>`` (loop lag figures)."""
    global OUT
    OUT = out
    store = SqlStore(url)
    lags: list[tuple[float, float]] = []

    async def sleeper() -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append((time.time(), loop.time() - t - 0.001))

    engine = Engine(store, WORKFLOWS, instance_id=name)
    loop = asyncio.get_running_loop()
    async with engine:
        task = asyncio.ensure_future(sleeper())
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        task.cancel()
    with contextlib.suppress(Exception):
        store.close()
    print("stats " + json.dumps({"lags": lags[-200000:]}), flush=True)
    return 0


class Workers:
    def __init__(self, url: str, n: int, tmp: Path) -> None:
        self.logs = [tmp / f"exec-{i}.jsonl" for i in range(n)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--worker", url, f"w{i}", str(self.logs[i])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for i in range(n)
        ]
        for p in self.procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a worker did not start: {line!r}")

    def stop(self) -> list[list[tuple[float, float]]]:
        out = []
        for p in self.procs:
            assert p.stdin is not None and p.stdout is not None
            with contextlib.suppress(BrokenPipeError):
                p.stdin.write("stop\n")
                p.stdin.flush()
        for p in self.procs:
            assert p.stdout is not None
            lags: list[tuple[float, float]] = []
            for line in p.stdout:
                if line.startswith("stats "):
                    lags = [tuple(x) for x in json.loads(line[6:])["lags"]]  # type: ignore[misc]
            p.wait(60)
            out.append(lags)
        return out

    def executions(self) -> list[tuple[str, int, int, float, float]]:
        rows = []
        for log in self.logs:
            if log.exists():
                rows += [tuple(json.loads(line)) for line in log.read_text().splitlines()]
        return rows  # type: ignore[return-value]


def overlaps(rows: list[tuple[str, int, int, float, float]]) -> int:
    """Executions of the same run's step on two processes at the same time."""
    by: dict[tuple[str, int], list[tuple[int, float, float]]] = {}
    for run, i, pid, t0, t1 in rows:
        by.setdefault((run, i), []).append((pid, t0, t1))
    n = 0
    for xs in by.values():
        xs.sort(key=lambda x: x[1])
        for a, b in itertools.pairwise(xs):
            if a[0] != b[0] and b[1] < a[2]:
                n += 1
    return n


async def start_load(url: str, runs: int, tag: str) -> list[str]:
    client = Engine(SqlStore(url), WORKFLOWS, worker=False)
    ids = []
    for k in range(runs):
        rid = f"{tag}-{k}"
        if k % 3 == 0:
            await client.start("faults-single", {"key": k % KEYS}, rid)
        else:
            await client.start("faults-work", {"key": k}, rid)
        ids.append(rid)
    return ids


async def settled(url: str, ids: list[str], timeout: float) -> tuple[int, float]:
    """How many of ``ids`` settled within ``timeout``, and when the last one did."""
    store = SqlStore(url)
    t0 = time.time()
    try:
        while True:
            done = 0
            for rid in ids:
                with contextlib.suppress(Exception):
                    run = await store.get_run(rid)
                    done += run is not None and run.status.terminal
            if done == len(ids) or time.time() - t0 > timeout:
                return done, time.time() - t0
            await asyncio.sleep(0.2)
    finally:
        store.close()


def lag_during(lags: list[list[tuple[float, float]]], t0: float, t1: float) -> float:
    """The largest loop lag (ms) any worker saw between ``t0`` and ``t1``, counting a wake-up
    that came after ``t1`` for a sleep begun inside the window."""
    worst = 0.0
    for xs in lags:
        for at, lag in xs:
            if t0 <= at - lag <= t1 or t0 <= at <= t1:
                worst = max(worst, lag)
    return worst * 1000


# -- scenarios -----------------------------------------------------------------------------


async def scenario_stall(pg: Any, tmp: Path, runs: int, stall: float) -> dict[str, Any]:
    with NetProxy(pg.socket) as proxy:
        url = proxy.url_for(pg.fresh())
        ids = await start_load(url, runs, "stall")
        workers = Workers(url, 3, tmp / "stall")
        probe = SqlStore(url)
        await probe.get_run(ids[0])
        await asyncio.sleep(1.0)  # the load under way
        proxy.stall()
        t_stall = time.time()
        # (resumed by a timer of its own: a probe that blocks this loop must not hold it)
        resume = threading.Timer(stall, proxy.resume)
        resume.start()
        t = time.time()
        try:
            await asyncio.wait_for(probe.get_run(ids[0]), 5)
            probe_out = "returned"
        except Exception as exc:
            probe_out = type(exc).__name__
        probe_s = time.time() - t
        await asyncio.to_thread(resume.join)
        t_resume = time.time()
        done, took = await settled(url, ids, 180)
        lags = workers.stop()
        with contextlib.suppress(Exception):
            probe.close()
        rows = workers.executions()
    return {
        "stall_s": stall,
        "loop_lag_max_during_stall_ms": round(lag_during(lags, t_stall, t_resume), 1),
        "wait_for_get_run_5s": {"outcome": probe_out, "seconds": round(probe_s, 2)},
        "steps_on_two_workers_at_once": overlaps(rows),
        "settled": f"{done}/{len(ids)}",
        "settle_after_resume_s": round(took, 1),
    }


async def scenario_blackhole(pg: Any, cap: float) -> dict[str, Any]:
    with NetProxy(pg.socket) as proxy:
        url = proxy.url_for(pg.fresh())
        proxy.blackhole = True
        store = SqlStore(url)
        t = time.time()
        try:
            await asyncio.wait_for(store.get_run("x"), cap)
            out = "returned"
        except TimeoutError:
            out = f"no error after {cap:.0f} s"
        except Exception as exc:
            out = f"{type(exc).__module__}.{type(exc).__name__}"
        took = time.time() - t
        with contextlib.suppress(Exception):
            store.close()
    return {"outcome": out, "seconds": round(took, 2)}


async def scenario_restart(pg: Any, tmp: Path, runs: int) -> dict[str, Any]:
    url = pg.fresh()
    ids = await start_load(url, runs, "restart")
    workers = Workers(url, 3, tmp / "restart")
    await asyncio.sleep(1.0)
    client = Engine(SqlStore(url), WORKFLOWS, worker=False)
    errors: dict[str, int] = {}
    stop = asyncio.Event()

    async def poke() -> None:  # a client starting runs through the restart
        k = 0
        while not stop.is_set():
            try:
                await client.start("faults-work", {"key": k}, f"restart-extra-{k}")
                k += 1
            except Exception as exc:
                name = f"{type(exc).__module__}.{type(exc).__name__}"
                errors[name] = errors.get(name, 0) + 1
            await asyncio.sleep(0.05)

    task = asyncio.ensure_future(poke())
    t_down = time.time()
    await asyncio.to_thread(pg.restart)
    t_up = time.time()
    await asyncio.sleep(3)
    stop.set()
    await task
    done, took = await settled(url, ids, 180)
    workers.stop()
    rows = workers.executions()
    ends = sorted(r[4] for r in rows)
    after = [e for e in ends if e > t_up]
    gaps = [b - a for a, b in itertools.pairwise(ends) if b > t_down]
    return {
        "down_s": round(t_up - t_down, 2),
        "first_step_after_up_s": round(after[0] - t_up, 2) if after else None,
        "longest_gap_without_a_step_s": round(max(gaps), 2) if gaps else None,
        "client_errors": errors,
        "settled": f"{done}/{len(ids)}",
        "settle_s": round(took, 1),
        "steps_on_two_workers_at_once": overlaps(rows),
    }


async def scenario_nul(pg: Any, tmp: Path, wait: float) -> dict[str, Any]:
    url = pg.fresh()
    client = Engine(SqlStore(url), WORKFLOWS, worker=False)
    await client.start("faults-nul", None, "nul-1")
    workers = Workers(url, 1, tmp / "nul")
    store = SqlStore(url)
    t0 = time.time()
    run = None
    while time.time() - t0 < wait:
        run = await store.get_run("nul-1")
        if run is not None and run.status.terminal:
            break
        await asyncio.sleep(0.2)
    workers.stop()
    execs = sum(1 for r in workers.executions() if r[0] == "nul")
    status = run.status.value if run is not None else None
    err = (run.error or {}).get("type") if run is not None and run.error else None
    store.close()
    return {
        "status_after_s": round(time.time() - t0, 1),
        "status": status,
        "error": err,
        "step_executions": execs,
        "settled": run is not None and run.status is not RunStatus.RUNNING,
    }


# -- the server ----------------------------------------------------------------------------


RESTART = ("restart", "-m", "fast", "-w")


class Pg:
    """A durable throwaway server (``tests/pg.py``) that can be restarted."""

    def __init__(self, url: str) -> None:
        import sqlalchemy as sa

        from tests import pg

        self.url = url
        self.root = Path(str(sa.engine.make_url(url).query["host"]))
        self.socket = str(self.root / ".s.PGSQL.5432")
        self.log = self.root / "server.log"
        self._pg = pg

    def fresh(self) -> str:
        return str(self._pg.fresh_database(self.url, "flowkit_faults"))

    def restart(self) -> None:
        _initdb, pg_ctl = self._pg.find_binaries()
        prefix, _uid, _gid = self._pg._runner()
        subprocess.run(
            # (-l: the server must not inherit our pipes, or this waits for its exit)
            [*prefix, pg_ctl, "-D", str(self.root / "data"), "-l", str(self.log), *RESTART],
            cwd=self.root,
            check=True,
            capture_output=True,
            timeout=120,
        )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    from tests.pg import start_postgres

    out: dict[str, Any] = {}
    only = set(args.only or ["stall", "blackhole", "restart", "nul"])
    with start_postgres(durable=True) as url, tempfile.TemporaryDirectory() as tmp:
        pg = Pg(url)
        for name in ("stall", "blackhole", "restart", "nul"):
            if name not in only:
                continue
            (Path(tmp) / name).mkdir()
            t = time.time()
            if name == "stall":
                out[name] = await scenario_stall(pg, Path(tmp), args.runs, args.stall)
            elif name == "blackhole":
                out[name] = await scenario_blackhole(pg, args.blackhole_cap)
            elif name == "restart":
                out[name] = await scenario_restart(pg, Path(tmp), args.runs)
            else:
                out[name] = await scenario_nul(pg, Path(tmp), args.nul_wait)
            out[name]["bench_seconds"] = round(time.time() - t, 1)
            print(f"{name}: {json.dumps(out[name])}", flush=True)
    return out


def cli() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return asyncio.run(worker_main(sys.argv[2], sys.argv[3], Path(sys.argv[4])))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", action="append", choices=["stall", "blackhole", "restart", "nul"])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--stall", type=float, default=20.0)
    p.add_argument("--blackhole-cap", type=float, default=60.0)
    p.add_argument("--nul-wait", type=float, default=40.0)
    args = p.parse_args()
    results = _results.start()
    results["faults"] = asyncio.run(main(args))
    _results.finish(results, "faults_latest.json")
    return 0


if __name__ == "__main__":
    sys.exit(cli())
