"""A million runs (issue #24, item 2): do the hot paths cost the same with 1,000,000 settled
runs and 100,000 sleeping runs in the database as on an empty one?

For each kind of database (a SQLite file; a throwaway PostgreSQL with default durability,
``store_bench.postgres_server``) the bench makes two databases, **empty** and **seeded**, and
measures both in the same run:

* **Seeding.** One real run of each kind is executed by an engine in a scratch SQLite file
  (a 3-step ``ThreeSteps`` run that completed; a ``Sleeper`` run suspended in
  ``ctx.sleep_until`` ten years ahead), and its rows (run and history) are copied ``n`` times
  straight into the tables (``_seed.copy_runs``), then ``ANALYZE``. The seeding rate is
  printed (rows of runs per second).
* **Hot paths** (the seeded figure divided by the empty one; target <= 1.5x): an engine on a
  proxy store that times every store call runs ``latency_runs`` 3-step workflows one at a
  time, then singleton runs (``store_bench.Handover``: a first step, a 5 ms step) over 4 keys.
  Figures, median and p95: ``engine.start`` as the caller sees it, the store's ``create_run``,
  ``claim``, ``commit`` (a step record; the last one also completes the run),
  ``try_admit_singleton``, and the hand-over: a holder's ``singleton_released`` to the next
  run's first ``step_completed`` (both from the history, the engine's clock).
* **Timers.** ``timers`` runs suspended in ``sleep_until(T)``, all with the same ``T`` (copies
  of a template with the due time patched in), and one worker engine (the Engine's defaults)
  started 2 s before ``T``. Lateness = the instant the step after the sleep ran
  (``time.time()``) - ``T``: p50/p99/max and the last one (target: p99 < 100 ms).
* **Memory.** A ``flowkit worker``-like process (``Engine(SqlStore(url), ...)``, serving for
  3 s: a few polls) reports its ``VmRSS`` and ``VmHWM`` (``/proc/self/status``) on the empty
  database (0 parked runs), on the seeded one (``sleeping`` parked) and after the settled runs
  are turned into parked ones too (one ``UPDATE``: ``settled + sleeping`` parked).
* **Bytes on disk per settled 3-step run**: the growth of the SQLite file (after a WAL
  checkpoint) or of ``pg_total_relation_size`` over the flowkit tables, divided by the
  settled runs seeded; next to DBOS's for the same 3-step workflow (``dbos_bench``'s
  ``d_three``, 500 runs) when ``dbos`` is importable.

Run ``python bench/million_bench.py`` (1,000,000 / 100,000 / 10,000 timers; ``--settled``,
``--sleeping``, ``--timers`` to change them) or ``--smoke`` (SQLite only, 2,000 / 200 / 200,
seconds). Part of ``bench/run.py``."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import sqlalchemy as sa
import store_bench  # (first: it puts the repository root first on sys.path)
from _seed import Template, analyze, copy_runs, read_template
from store_bench import CountingStore, Handover, ThreeSteps

from flowkit import Engine, SystemClock, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore

SLEEPER = "million-sleeper"
FAR = 10 * 365 * 86400.0  # a parked run's wake time: ten years ahead
STAMPS: dict[str, float] = {}


def stamp(run_id: str) -> None:
    """The first instant the step after the sleep ran (the timer's firing, as a user sees it)."""
    STAMPS.setdefault(run_id, time.time())


@workflow(name=SLEEPER)
class Sleeper:
    """Sleeps until ``input`` (an epoch instant), then one step."""

    async def run(self, ctx: WorkflowCtx, input: float) -> None:
        await ctx.sleep_until(input)
        await ctx.step(stamp, ctx.run_id)


WORKFLOWS = [ThreeSteps(), Handover(), Sleeper()]


@dataclass(frozen=True)
class Sizes:
    settled: int
    sleeping: int
    timers: int
    latency_runs: int
    singleton_per_key: int
    lead: float = 2.0  # the timer worker starts this long before the timers are due
    serve: float = 3.0  # seconds the RSS worker serves before it reports


SMOKE = Sizes(
    settled=2_000,
    sleeping=200,
    timers=200,
    latency_runs=30,
    singleton_per_key=8,
    lead=0.5,
    serve=1.0,
)
FULL = Sizes(
    settled=1_000_000, sleeping=100_000, timers=10_000, latency_runs=300, singleton_per_key=60
)
KEYS = 4


class TimingStore(CountingStore):
    """``CountingStore`` that keeps every call's duration (for medians and p95s)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.durations: dict[str, list[float]] = {}

    def __getattr__(self, name: str) -> Any:
        counted = super().__getattr__(name)
        if not asyncio.iscoroutinefunction(counted):
            return counted
        out = self.durations.setdefault(name, [])

        async def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await counted(*args, **kwargs)
            finally:
                out.append(time.perf_counter() - t0)

        setattr(self, name, timed)
        return timed


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[max(0, math.ceil(len(s) * p) - 1)]


def _ms(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50_ms": statistics.median(xs) * 1e3, "p95_ms": _pct(xs, 0.95) * 1e3}


# -- templates and seeding ---------------------------------------------------------------------


async def make_templates(tmp: Path) -> dict[str, Template]:
    """One completed 3-step run and one parked sleeper, executed for real in a scratch file."""
    url = store_bench.sqlite_url(tmp)
    store = SqlStore(url)
    engine = Engine(store, WORKFLOWS)
    async with engine:
        await engine.start(ThreeSteps, {"x": 1}, "tpl-three")
        await engine.result("tpl-three", timeout=30)
        await engine.start(SLEEPER, time.time() + FAR, "tpl-sleep")
        await _until(lambda: _status(engine, "tpl-sleep"), "suspended", 30)
    store.close()
    return {"three": read_template(url, "tpl-three"), "sleep": read_template(url, "tpl-sleep")}


async def _status(engine: Engine, rid: str) -> str:
    run = await engine.get_run(rid)
    return run.status if run is not None else "missing"


async def _until(get: Any, want: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while (got := await get()) != want:
        if time.monotonic() > end:
            raise TimeoutError(f"still {got!r}, waited for {want!r}")
        await asyncio.sleep(0.02)


def _due_at(when: float) -> Any:
    """A ``copy_runs`` patch: the copy sleeps until ``when`` (input, wake time, timer event)."""

    def patch(i: int, row: dict[str, Any], evs: list[dict[str, Any]]) -> None:
        row["input"] = when
        row["wake_at"] = when
        for e in evs:
            if e["type"] == "run_started" and isinstance(e["body"], dict):
                e["body"] = {**e["body"], "input": when}
            if e["type"] == "timer_started":
                e["body"] = {**e["body"], "fire_at": when}

    return patch


def seed(url: str, tpl: dict[str, Template], sizes: Sizes) -> dict[str, Any]:
    """The settled and sleeping runs; bytes per settled run; the seeding rate."""
    before = disk_bytes(url)
    s1 = copy_runs(url, tpl["three"], sizes.settled, "done-")
    after_settled = disk_bytes(url)
    s2 = copy_runs(url, tpl["sleep"], sizes.sleeping, "park-", _due_at(time.time() + FAR))
    t0 = time.perf_counter()
    analyze(url)
    s3 = time.perf_counter() - t0
    n = sizes.settled + sizes.sleeping
    return {
        "settled": sizes.settled,
        "sleeping": sizes.sleeping,
        "events_per_settled_run": len(tpl["three"][1]),
        "seconds": s1 + s2 + s3,
        "runs_per_s": n / (s1 + s2),
        "bytes_per_settled_run": (after_settled - before) / sizes.settled,
    }


def disk_bytes(url: str) -> int:
    """The database's size: the SQLite file after a WAL checkpoint, or the flowkit tables'
    ``pg_total_relation_size`` (indexes and TOAST included)."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1]
        eng = sa.create_engine(url)
        with eng.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
        eng.dispose()
        return os.path.getsize(path)
    return _pg_bytes(url, "flowkit_%")


def _pg_bytes(url: str, like: str, schema: str | None = None) -> int:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as conn:
            q = (
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE c.relkind = 'r' AND c.relname LIKE :like"
            )
            params: dict[str, Any] = {"like": like}
            if schema is not None:
                q += " AND n.nspname = :schema"
                params["schema"] = schema
            return int(conn.execute(sa.text(q), params).scalar_one())
    finally:
        eng.dispose()


# -- hot paths ------------------------------------------------------------------------------


async def hot_paths(url: str, sizes: Sizes) -> dict[str, Any]:
    """start/claim/step-record/admission/hand-over latencies on the database at ``url``."""
    store = TimingStore(SqlStore(url))
    engine = Engine(store, WORKFLOWS, clock=SystemClock())
    starts: list[float] = []
    async with engine:
        for i in range(sizes.latency_runs):
            t0 = time.perf_counter()
            await engine.start(ThreeSteps, {"x": i}, f"hot-{i:05d}")
            starts.append(time.perf_counter() - t0)
            await engine.result(f"hot-{i:05d}", timeout=60)
        handovers = await store_bench.handover_latencies(
            engine, KEYS, sizes.singleton_per_key, "ho-", 120
        )
    claims, admissions = await claim_and_admit(store._inner, sizes.latency_runs)
    polls, nexts = await poll_reads(store._inner, 50)
    store._inner.close()
    d = store.durations
    during = {
        name: {"calls": len(d.get(name, [])), "seconds": sum(d.get(name, []))}
        for name in ("due_runs", "next_due_after")
    }
    return {
        "poll_reads_during_hot_paths": during,
        "poll_due_runs": _ms(polls),
        "poll_next_due_after": _ms(nexts),
        "engine_start": _ms(starts),
        "create_run": _ms(d.get("create_run", [])),
        "claim": _ms(claims),
        "try_admit_singleton": _ms(admissions),
        "commit": _ms(d.get("commit", [])),
        "handover": _ms(handovers),
    }


async def claim_and_admit(store: SqlStore, n: int) -> tuple[list[float], list[float]]:
    """Seconds of ``n`` claims of a ``pending`` run and of ``n`` granted singleton admissions
    (each on a key of its own), called on the store directly: an engine that started a run
    holds it already and never claims it, and admits it in its create."""
    from singleton_bench import WF, _run

    client = Engine(store, WORKFLOWS, worker=False)
    for i in range(n):
        await client.start(ThreeSteps, {"x": i}, f"claim-{i:05d}")
    t = time.time()
    await store_bench.bulk_load(store, [_run(f"adm-{i:05d}", f"key{i}", t + i) for i in range(n)])
    claims: list[float] = []
    for i in range(n):
        now = time.time()
        t0 = time.perf_counter()
        run = await store.claim(f"claim-{i:05d}", "million-bench", now, now + 30)
        claims.append(time.perf_counter() - t0)
        assert run is not None
    admissions: list[float] = []
    for i in range(n):
        t0 = time.perf_counter()
        ok = await store.try_admit_singleton(f"adm-{i:05d}", f"singleton:key{i}", WF, 1, t + n)
        admissions.append(time.perf_counter() - t0)
        assert ok
    return claims, admissions


async def poll_reads(store: SqlStore, n: int) -> tuple[list[float], list[float]]:
    """Seconds of the worker's two poll reads (``due_runs`` with the Engine's batch of 100,
    ``next_due_after``), called ``n`` times each with nothing due: what every poll, and an
    idle worker once a second, pays."""
    polls: list[float] = []
    nexts: list[float] = []
    for _ in range(n):
        now = time.time()
        t0 = time.perf_counter()
        await store.due_runs(now, 100)
        polls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await store.next_due_after(now, ("million-bench",))
        nexts.append(time.perf_counter() - t0)
    return polls, nexts


# -- timers -------------------------------------------------------------------------------


async def timers(url: str, tpl: Template, n: int, lead: float = 2.0) -> dict[str, Any]:
    """``n`` runs due at the same instant; one worker engine, started ``lead`` seconds before
    it; lateness of each."""
    STAMPS.clear()
    due = time.time() + 2 * lead + n / 20_000  # time to insert them first
    copy_runs(url, tpl, n, "alarm-", _due_at(due))
    store = SqlStore(url)
    engine = Engine(store, WORKFLOWS)
    wait = due - lead - time.time()
    if wait > 0:
        await asyncio.sleep(wait)
    async with engine:
        end = due + 120 + n / 50
        while len(STAMPS) < n:  # (only the alarms stamp; a sync step's thread writes it)
            if time.time() > end:
                break
            await asyncio.sleep(0.05)
    store.close()
    late = [at - due for k, at in list(STAMPS.items()) if k.startswith("alarm-")]
    if not late:
        return {"n": n, "fired": 0}
    return {
        "n": n,
        "fired": len(late),
        "p50_ms": _pct(late, 0.5) * 1e3,
        "p99_ms": _pct(late, 0.99) * 1e3,
        "max_ms": max(late) * 1e3,
        "lead_s": lead,
    }


# -- memory -------------------------------------------------------------------------------


def worker_rss(url: str, seconds: float = 3.0) -> dict[str, int]:
    """A worker process serving ``url`` for ``seconds``: its VmRSS and VmHWM in kB."""
    env = {**os.environ, "PYTHONPATH": str(store_bench.ROOT)}
    out = subprocess.run(
        [sys.executable, __file__, "--rss-worker", url, "--rss-seconds", str(seconds)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    ).stdout
    fields = dict(line.split("=", 1) for line in out.split() if "=" in line)
    return {k: int(v) for k, v in fields.items()}


def _vm(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return -1


async def _rss_worker(url: str, seconds: float) -> None:
    store = SqlStore(url)
    async with Engine(store, WORKFLOWS):
        await asyncio.sleep(seconds)
        print(f"VmRSS_kB={_vm('VmRSS')} VmHWM_kB={_vm('VmHWM')}")
    store.close()


def park_settled(url: str) -> int:
    """Turn every settled seeded run into a parked one (suspended, due ten years ahead)."""
    eng = sa.create_engine(url)
    try:
        with eng.begin() as conn:
            res = conn.execute(
                sa.text(
                    "UPDATE flowkit_runs SET status = 'suspended', wake_at = :w"
                    " WHERE id LIKE 'done-%'"
                ),
                {"w": time.time() + FAR},
            )
            return int(res.rowcount)
    finally:
        eng.dispose()


# -- DBOS ----------------------------------------------------------------------------------


async def dbos_bytes(kind: str, tmp: Path, pg_url: str | None, n: int) -> dict[str, Any]:
    """Bytes on disk per settled 3-step DBOS workflow (its system database)."""
    import dbos_bench

    if not dbos_bench.dbos_available():
        return {"note": "dbos is not installed"}
    url = dbos_bench.sqlite_url(tmp) if kind == "sqlite" else None
    if kind == "postgres":
        assert pg_url is not None
        url = dbos_bench.postgres_url(pg_url)
    assert url is not None
    app = dbos_bench.DbosApp(url)
    try:
        await dbos_bench.run_dbos(app, 20, 1, "warm")
        before = _dbos_size(url)
        await dbos_bench.run_dbos(app, n, 8, "size")
        after = _dbos_size(url)
    finally:
        app.close()
    return {"runs": n, "bytes_per_settled_run": (after - before) / n}


def _dbos_size(url: str) -> int:
    if url.startswith("sqlite"):
        return disk_bytes(url)
    return _pg_bytes(url, "%", schema="dbos")


# -- main -----------------------------------------------------------------------------------


def _ratio(seeded: dict[str, Any], empty: dict[str, Any], field: str) -> float | None:
    a, b = seeded.get(field), empty.get(field)
    return a / b if a is not None and b else None


async def one_kind(
    kind: str, new_url: Any, tpl: dict[str, Template], sizes: Sizes, tmp: Path, pg: str | None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    empty, seeded = new_url(), new_url()
    SqlStore(empty).close()
    print(f"  {kind}: seeding {sizes.settled:,} settled + {sizes.sleeping:,} sleeping runs ...")
    s = seed(seeded, tpl, sizes)
    out["seed"] = s
    print(
        f"    seeded in {s['seconds']:.1f} s ({s['runs_per_s']:,.0f} runs/s, with"
        f" {s['events_per_settled_run']} events each); {s['bytes_per_settled_run']:,.0f}"
        " bytes on disk per settled 3-step run"
    )
    rss: dict[str, Any] = {
        "0": worker_rss(empty, sizes.serve),
        str(sizes.sleeping): worker_rss(seeded, sizes.serve),
    }
    paths = {"empty": await hot_paths(empty, sizes), "seeded": await hot_paths(seeded, sizes)}
    out["hot_paths"] = paths
    print(f"    {'':22} {'empty p50/p95 ms':>18} {'seeded p50/p95 ms':>18}  p50 / p95 ratio")
    for name in paths["empty"]:
        e, d = paths["empty"][name], paths["seeded"][name]
        if name == "poll_reads_during_hot_paths":
            print(
                "    the worker's own poll reads meanwhile (calls, seconds), empty / seeded: "
                + "; ".join(
                    f"{k} {e[k]['calls']}, {e[k]['seconds']:.2f} s / {d[k]['calls']},"
                    f" {d[k]['seconds']:.2f} s"
                    for k in e
                )
            )
            continue
        if not e.get("n") or not d.get("n"):
            continue
        r50, r95 = _ratio(d, e, "p50_ms"), _ratio(d, e, "p95_ms")
        print(
            f"    {name:22} {e['p50_ms']:8.2f} /{e['p95_ms']:7.2f}  {d['p50_ms']:8.2f} /"
            f"{d['p95_ms']:7.2f}   {r50:5.2f}x / {r95:5.2f}x"
        )
    tm = {
        "empty": await timers(empty, tpl["sleep"], sizes.timers, sizes.lead),
        "seeded": await timers(seeded, tpl["sleep"], sizes.timers, sizes.lead),
    }
    out["timers"] = tm
    for label, t in tm.items():
        print(
            f"    {sizes.timers:,} timers due at once, {label:6}: fired {t['fired']:,}, lateness"
            f" p50 {t.get('p50_ms', 0):7.1f} ms  p99 {t.get('p99_ms', 0):7.1f} ms"
            f"  max {t.get('max_ms', 0):7.1f} ms"
        )
    parked = park_settled(seeded)
    rss[str(parked + sizes.sleeping)] = worker_rss(seeded, sizes.serve)
    out["worker_rss_kB"] = rss
    print(
        f"    worker RSS after {sizes.serve:g} s of serving, by parked runs: "
        + ", ".join(f"{int(k):,}: {v['VmRSS_kB'] / 1024:.1f} MiB" for k, v in rss.items())
    )
    dbos = await dbos_bytes(kind, tmp, pg, 100 if sizes.settled < 10_000 else 500)
    out["dbos"] = dbos
    if "bytes_per_settled_run" in dbos:
        print(f"    DBOS: {dbos['bytes_per_settled_run']:,.0f} bytes per settled 3-step workflow")
    else:
        print(f"    DBOS: skipped ({dbos['note']})")
    return out


async def main(
    smoke: bool, pg_url: str | None, tmp: Path, sizes: Sizes | None = None
) -> dict[str, Any]:
    sizes = sizes or (SMOKE if smoke else FULL)
    print(
        f"a million runs ({sizes.settled:,} settled 3-step runs, {sizes.sleeping:,} sleeping;"
        " each figure on the seeded database next to an empty one):"
    )
    tpl = await make_templates(tmp)
    kinds: dict[str, Any] = {"sqlite": lambda: store_bench.sqlite_url(tmp)}
    if pg_url is not None and not smoke:
        kinds["postgres"] = lambda: store_bench.postgres_url(pg_url)
    results: dict[str, Any] = {"sizes": sizes.__dict__}
    for kind, new_url in kinds.items():
        results[kind] = await one_kind(kind, new_url, tpl, sizes, tmp, pg_url)
    return results


@contextmanager
def _databases(smoke: bool) -> Iterator[tuple[Path, str | None]]:
    with tempfile.TemporaryDirectory(prefix="flowkit-million-") as tmp:
        if smoke:
            yield Path(tmp), None
            return
        with store_bench.postgres_server() as pg_url:
            yield Path(tmp), pg_url


def _cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="SQLite only, small sizes")
    parser.add_argument("--settled", type=int, help="settled runs (1,000,000)")
    parser.add_argument("--sleeping", type=int, help="sleeping runs (100,000)")
    parser.add_argument("--timers", type=int, help="timers due at once (10,000)")
    parser.add_argument("--rss-worker", help=argparse.SUPPRESS)
    parser.add_argument("--rss-seconds", type=float, default=3.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_worker:
        asyncio.run(_rss_worker(args.rss_worker, args.rss_seconds))
        return 0
    base = SMOKE if args.smoke else FULL
    sizes = Sizes(
        settled=args.settled or base.settled,
        sleeping=args.sleeping or base.sleeping,
        timers=args.timers or base.timers,
        latency_runs=base.latency_runs,
        singleton_per_key=base.singleton_per_key,
        lead=base.lead,
        serve=base.serve,
    )
    with _databases(args.smoke) as (tmp, pg):
        asyncio.run(main(args.smoke, pg, tmp, sizes))
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
