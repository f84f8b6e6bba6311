"""SqlStore benchmarks: the raw commit limit, durable step throughput, and singleton handover.

On a SQLite file (WAL, ``BEGIN IMMEDIATE``) in a temporary directory and on a throwaway
PostgreSQL over a unix socket (``tests/pg.py``; skipped with a note when its binaries are
missing). Figures are ratios against a baseline measured in the same run, never absolute claims:

1. raw limit: single-row ``INSERT`` + ``COMMIT`` per second, measured two ways in every slice:
   through SqlStore's own write path (its DBAPI connection, ``BEGIN IMMEDIATE`` on SQLite) and
   on a fresh bare driver connection; the baseline of each slice is the faster of the two;
2. durable steps: workflows of 3 trivial steps through a real ``Engine`` (``SystemClock``),
   one after another and 32 at a time; and long workflows of 40 trivial steps the same two
   ways, where run creation and completion are amortized and each step costs about one
   transaction of its own (the one-step-per-transaction workload). Steps/s as a ratio to (1),
   taken in slices that alternate with (1) so both see the same machine; store calls per
   workflow and their cost (a counting proxy in front of the store), SQL transactions and
   statements per workflow (a short pass with SQLAlchemy event counters);
3. handover on SQLite: release -> next same-key run's first step, notify-on-release vs the
   waiters' ~1 s timer (``Engine(..., notify_on_release=False)``);
4. context, not a target: a denied admission re-check behind N waiters of the *same* key.

Admission under backlog on every store lives in ``singleton_bench`` (``admission_stores`` below
supplies the SQL stores). Run: ``python bench/run.py`` (``--smoke``: tiny, CI-sized), or this
file alone; ``--profile sqlite|postgres [--concurrency N]`` prints a cProfile of the workload."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import cProfile
import inspect
import itertools
import math
import os
import pstats
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # for tests.pg (the throwaway PostgreSQL)

from flowkit import Engine, Run, Singleton, SystemClock, WorkflowCtx, workflow  # noqa: E402
from flowkit.stores import MemoryStore  # noqa: E402
from flowkit.stores.sql import SqlStore  # noqa: E402
from flowkit.stores.sql import _rows as sql_rows  # noqa: E402
from flowkit.stores.sql._connection import ROWCOUNT  # noqa: E402
from flowkit.stores.sql._group_commit import Op  # noqa: E402
from flowkit.stores.sql._schema import runs as runs_table  # noqa: E402

POLL = 0.05  # the engines' poll_interval: small, but dispatch (not polling) drives the work
CONCURRENCY = 32
STEPS = 3
LONG_STEPS = 40
HANDOVER_WF = "bench-handover"
WRITE_CALLS = (
    "create_run",
    "claim",
    "commit",
    "append_events",
    "try_admit_singleton",
    "renew_lease",
    "deliver_signal",
)
"""Store calls that write (the rest read), for the per-workflow counts of both benches."""

# -- backends ----------------------------------------------------------------------------


# The benchmarks' PostgreSQL keeps its default durability (``fsync``, ``synchronous_commit``
# and ``full_page_writes`` on): a commit waits for its WAL flush, the "durable write" the raw
# baseline stands for. ``FLOWKIT_BENCH_PG_FSYNC=off`` runs the tests' non-durable server
# instead, where a commit costs round trips and CPU only.
PG_DURABLE = os.environ.get("FLOWKIT_BENCH_PG_FSYNC", "on").lower() not in ("off", "0", "no")


@contextlib.contextmanager
def postgres_server() -> Iterator[str | None]:
    """A throwaway PostgreSQL (``tests/pg.py``): its server URL, or ``None`` with a note."""
    try:
        from tests.pg import PostgresUnavailable, start_postgres
    except ImportError as exc:
        print(f"note: PostgreSQL skipped (cannot import tests.pg: {exc})")
        yield None
        return
    server = start_postgres(durable=PG_DURABLE)
    try:
        url = server.__enter__()
    except (PostgresUnavailable, RuntimeError) as exc:
        print(f"note: PostgreSQL skipped ({exc})")
        yield None
        return
    try:
        yield url
    finally:
        server.__exit__(None, None, None)


_db_counter = itertools.count()


def sqlite_url(tmp: Path) -> str:
    """A fresh SQLite file in ``tmp``."""
    return f"sqlite:///{tmp}/bench-{next(_db_counter)}.db"


def postgres_url(server_url: str) -> str:
    """A fresh database on the throwaway server."""
    from tests.pg import fresh_database

    return fresh_database(server_url, prefix="flowkit_bench")


def backends(tmp: Path, pg_url: str | None) -> dict[str, Callable[[], str]]:
    """Name -> factory of a fresh, empty database URL."""
    out: dict[str, Callable[[], str]] = {"sqlite": lambda: sqlite_url(tmp)}
    if pg_url is not None:
        out["postgres"] = lambda: postgres_url(pg_url)
    return out


async def bulk_load(store: SqlStore, runs: list[Run]) -> None:
    """Insert runs in one transaction with exactly the row format of ``create_run``."""
    with store._db.tx() as conn:
        conn.execute(sa.insert(runs_table), [sql_rows.run_values(r) for r in runs])


async def _create_each(store: Any, runs: list[Run]) -> None:
    for run in runs:
        await store.create_run(run, [])


def admission_stores(tmp: Path, pg_url: str | None) -> list[Any]:
    """The stores ``singleton_bench`` measures admission on: memory, SQLite, PostgreSQL."""
    from singleton_bench import AdmissionStore

    out = [AdmissionStore("memory", MemoryStore, claims_scale=10)]
    for name, new_url in backends(tmp, pg_url).items():
        out.append(AdmissionStore(name, lambda f=new_url: SqlStore(f()), bulk_load))
    return out


# -- 1. raw commit limit -----------------------------------------------------------------

_raw_meta = sa.MetaData()
_raw = sa.Table(
    "flowkit_bench_raw",
    _raw_meta,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
    sa.Column("body", sa.Text(), nullable=False),
)
# about the size of a step_completed event body
_BODY = '{"type":"step_completed","seq":3,"at":1767225600.123456,"pos":"1","name":"step_a",' + (
    '"attempt":1,"result":1}'
)


def _raw_insert(dialect: str) -> str:
    mark = "?" if dialect == "sqlite" else "%s"
    return f"INSERT INTO flowkit_bench_raw (body) VALUES ({mark})"


def raw_commit_rate(store: SqlStore, n: int) -> float:
    """Single-row INSERT + COMMIT per second through SqlStore's own write path: its DBAPI
    connection and transaction handling (``BEGIN IMMEDIATE`` on SQLite, one statement in
    autocommit on PostgreSQL), one write call per transaction, exactly as a store call that
    writes one row."""
    db = store._db
    db.ensure_schema()
    _raw_meta.create_all(db.engine)
    op = Op(
        lambda _c, changed: changed,
        (_raw_insert(db.dialect), (_BODY,), ROWCOUNT),
        single=lambda changed: bool(changed),
    )
    t0 = time.perf_counter()
    for _ in range(n):
        store._gc.run_write(op)
    return n / (time.perf_counter() - t0)


def driver_commit_rate(store: SqlStore, n: int) -> float:
    """The same loop on a fresh bare DBAPI connection (no flowkit, no SQLAlchemy): the
    physical limit of one durable write with the store's driver and durability settings.
    On PostgreSQL the ``INSERT`` runs in autocommit: its own transaction, one round trip (the
    fewest any single-row write can take)."""
    db = store._db
    _raw_meta.create_all(db.engine)
    pooled = db.engine.raw_connection()  # connect-time setup applied (WAL, busy timeout)
    try:
        dbapi: Any = pooled.driver_connection
        sql = _raw_insert(db.dialect)
        t0 = time.perf_counter()
        if db.dialect == "sqlite":
            cur = dbapi.cursor()
            for _ in range(n):
                cur.execute("BEGIN IMMEDIATE")
                cur.execute(sql, (_BODY,))
                cur.execute("COMMIT")
        else:
            dbapi.autocommit = True
            try:
                for _ in range(n):
                    dbapi.execute(sql, (_BODY,))
            finally:
                dbapi.autocommit = False
        return n / (time.perf_counter() - t0)
    finally:
        pooled.close()


def server_info(store: SqlStore) -> str:
    with store._db.tx(write=False) as conn:
        if store._db.dialect == "sqlite":
            sync = conn.exec_driver_sql("PRAGMA synchronous").scalar()
            mode = conn.exec_driver_sql("PRAGMA journal_mode").scalar()
            return f"SQLite {sqlite3.sqlite_version}, journal_mode={mode}, synchronous={sync}"
        ver = conn.exec_driver_sql("SHOW server_version").scalar()
        fsync = conn.exec_driver_sql("SHOW fsync").scalar()
        sc = conn.exec_driver_sql("SHOW synchronous_commit").scalar()
        fpw = conn.exec_driver_sql("SHOW full_page_writes").scalar()
        return (
            f"PostgreSQL {ver}, fsync={fsync}, synchronous_commit={sc},"
            f" full_page_writes={fpw} (tests/pg.py)"
        )


# -- 2. durable step throughput ----------------------------------------------------------


async def step_a(x: int) -> int:
    return x + 1


async def step_b(x: int) -> int:
    return x * 2


async def step_c(x: int) -> int:
    return x - 1


@workflow(name="bench-three-steps")
class ThreeSteps:
    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> int:
        x = await ctx.step(step_a, input["x"])
        x = await ctx.step(step_b, x)
        return await ctx.step(step_c, x)


@workflow(name="bench-long-steps")
class LongSteps:
    """``LONG_STEPS`` trivial steps: each step's record is written before the next step runs,
    so a step costs one transaction; the run's create and completion are spread over all."""

    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> int:
        x = input["x"]
        for _ in range(LONG_STEPS):
            x = await ctx.step(step_a, x)
        return x


@dataclass(frozen=True)
class Workload:
    """A workflow to drive, its steps per run, and what run ``i`` returns."""

    workflow: type
    steps: int
    expected: Callable[[int], int]


THREE = Workload(ThreeSteps, STEPS, lambda i: (i + 1) * 2 - 1)
LONG = Workload(LongSteps, LONG_STEPS, lambda i: i + LONG_STEPS)


class CountingStore:
    """A thin proxy that forwards everything to ``inner`` and counts the async calls (and
    the wall time spent inside them: SqlStore blocks the event loop for each call)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        calls, seconds = self.calls, self.seconds

        async def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            t0 = time.perf_counter()
            try:
                return await attr(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - t0

        setattr(self, name, counted)  # later lookups skip __getattr__
        return counted


async def run_workflows(
    engine: Engine, n: int, concurrency: int, prefix: str, wl: Workload = THREE
) -> float:
    """``n`` workflows (start -> result), ``concurrency`` in flight; the seconds taken."""
    ids = iter(range(n))

    async def client() -> None:
        for i in ids:
            run = await engine.start(wl.workflow, {"x": i}, f"{prefix}-{i:06d}")
            assert await engine.result(run.id, timeout=120) == wl.expected(i)

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - t0


MODES: dict[str, tuple[Workload, int]] = {
    "sequential": (THREE, 1),
    f"concurrent{CONCURRENCY}": (THREE, CONCURRENCY),
    f"long{LONG_STEPS}_sequential": (LONG, 1),
    f"long{LONG_STEPS}_concurrent{CONCURRENCY}": (LONG, CONCURRENCY),
}


class _Tally:
    """Workflows, seconds and the proxy's per-call counts/time of one mode, over slices."""

    def __init__(self, wl: Workload) -> None:
        self.wl = wl
        self.n = 0
        self.wall = 0.0
        self.calls: collections.Counter[str] = collections.Counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.slice_rates: list[float] = []

    async def measure(
        self, engine: Engine, proxy: CountingStore, n: int, conc: int, p: str
    ) -> None:
        calls, seconds = proxy.calls.copy(), proxy.seconds.copy()
        dt = await run_workflows(engine, n, conc, p, self.wl)
        self.n += n
        self.wall += dt
        self.calls.update(proxy.calls - calls)
        self.seconds.update(proxy.seconds - seconds)
        self.slice_rates.append(n * self.wl.steps / dt)

    def report(self, raw: float, raw_slices: list[float]) -> dict[str, Any]:
        steps = self.n * self.wl.steps
        out: dict[str, Any] = {
            "steps_per_workflow": self.wl.steps,
            "workflows_per_s": self.n / self.wall,
            "steps_per_s": steps / self.wall,
            "steps_ratio_to_raw": steps / self.wall / raw,
            "store_calls": {k: v / self.n for k, v in sorted(self.calls.items())},
            "seconds_per_call": {k: self.seconds[k] / v for k, v in sorted(self.calls.items())},
            "store_share_of_wall": sum(self.seconds.values()) / self.wall,
        }
        out["store_write_calls"] = (
            sum(v for k, v in self.calls.items() if k in WRITE_CALLS) / self.n
        )
        out["store_read_calls"] = (
            sum(v for k, v in self.calls.items() if k not in WRITE_CALLS) / self.n
        )
        if raw_slices:  # paired per slice: both measured within seconds of each other
            ratios = sorted(a / b for a, b in zip(self.slice_rates, raw_slices, strict=True))
            out["slice_ratio_min_median_max"] = [ratios[0], statistics.median(ratios), ratios[-1]]
        return out


async def sql_counts(
    engine: Engine, store: SqlStore, n: int, conc: int, p: str, wl: Workload
) -> dict[str, float]:
    """Transactions, statements and group-commit batches per workflow (the store's own
    counters, ``store._db.stats``, over a separate short pass)."""
    before = store._db.stats.copy()
    await run_workflows(engine, n, conc, p, wl)
    delta = store._db.stats - before
    out = {k: delta[k] / n for k in ("write_tx", "read_tx", "statements", "batches")}
    out["ops_per_write_tx"] = delta["ops"] / delta["write_tx"] if delta["write_tx"] else 0.0
    return out


async def bench_backend(new_url: Callable[[], str] | None, smoke: bool) -> dict[str, Any]:
    """(1) and (2) on one backend (``new_url=None``: MemoryStore, the engine-only ceiling).

    One engine runs for the whole backend; the figures are taken in ``slices`` rounds of raw
    commits followed by every mode (3-step and 40-step workflows, sequential and concurrent),
    so each ratio compares figures measured seconds apart (disk and CPU contention on a shared
    machine come and go)."""
    slices = 2 if smoke else 12
    n_raw = 100 if smoke else 250
    # by mode (the order of MODES): workflows per slice, and in the SQL-counting pass
    per_mode = (
        [(10, 10), (CONCURRENCY, 10), (1, 1), (2, 2)]
        if smoke
        else [(40, 64), (4 * CONCURRENCY, 64), (8, 4), (CONCURRENCY, CONCURRENCY)]
    )
    sizes = dict(zip(MODES, per_mode, strict=True))
    store: Any = MemoryStore() if new_url is None else SqlStore(new_url())
    sql = isinstance(store, SqlStore)
    proxy = CountingStore(store)  # ~1 us per call: noise next to a transaction
    engine = Engine(proxy, [ThreeSteps(), LongSteps()], clock=SystemClock(), poll_interval=POLL)
    raw_t = driver_t = 0.0
    raw_slices: list[float] = []
    tallies = {mode: _Tally(wl) for mode, (wl, _conc) in MODES.items()}
    out: dict[str, Any] = {}
    async with engine:
        await run_workflows(engine, 10, 1, "warm")  # schema, statement caches, pool
        if sql:
            raw_commit_rate(store, 20)
            driver_commit_rate(store, 20)
        for s in range(slices):
            if sql:
                # the baseline is the faster of the two loops, slice by slice: the limit of
                # one durable single-row write, however it is issued
                # (alternating which goes first: the first one right after a workload slice
                # absorbs the database's background work, e.g. PostgreSQL's autovacuum)
                if s % 2:
                    bare = driver_commit_rate(store, n_raw)
                    store_path = raw_commit_rate(store, n_raw)
                else:
                    store_path = raw_commit_rate(store, n_raw)
                    bare = driver_commit_rate(store, n_raw)
                raw_t += n_raw / store_path
                driver_t += n_raw / bare
                raw_slices.append(max(store_path, bare))
            for mode, (_wl, conc) in MODES.items():
                n = sizes[mode][0]
                await tallies[mode].measure(engine, proxy, n, conc, f"{mode}-{s}")
        raw = slices / sum(1 / r for r in raw_slices) if sql else math.nan
        if sql:
            out["server"] = server_info(store)
            out["raw_commits_per_s"] = raw  # the baseline
            out["raw_commits_per_s_slices"] = raw_slices
            out["store_path_commits_per_s"] = slices * n_raw / raw_t
            out["driver_commits_per_s"] = slices * n_raw / driver_t
        for mode, (wl, conc) in MODES.items():
            out[mode] = tallies[mode].report(raw, raw_slices)
            if sql:
                n = sizes[mode][1]
                out[mode].update(await sql_counts(engine, store, n, conc, f"cnt-{mode}", wl))
    if sql:
        store.close()
    return out


# -- 3. handover latency (SQLite) ---------------------------------------------------------


async def first_step() -> None:
    return None


@workflow(name=HANDOVER_WF, singleton=Singleton(key=lambda inp: f"k{inp['k']}"))
class Handover:
    async def run(self, ctx: WorkflowCtx, input: dict[str, int]) -> None:
        await ctx.step(first_step)
        await ctx.step(asyncio.sleep, 0.005, name="work")


async def handover_latencies(
    engine: Engine, keys: int, per_key: int, prefix: str, timeout: float
) -> list[float]:
    """Start ``per_key`` ``Handover`` runs on each of ``keys`` keys (ids ``<prefix>k<k>-r<i>``),
    wait for them all, and read each hand-over from their histories: seconds from a holder's
    ``singleton_released`` to the next same-key run's first ``step_completed``."""
    lat: list[float] = []
    by_key: dict[int, list[str]] = {k: [] for k in range(keys)}
    for i in range(per_key):
        for k in range(keys):
            rid = f"{prefix}k{k}-r{i:04d}"
            await engine.start(HANDOVER_WF, {"k": k}, rid)
            by_key[k].append(rid)
    for rids in by_key.values():
        for rid in rids:
            await engine.result(rid, timeout=timeout)
    for rids in by_key.values():
        hist = {rid: list(await engine.history(rid)) for rid in rids}

        def at(rid: str, kind: str, h: dict[str, list[Any]] = hist) -> float:
            return float(next(e.at for e in h[rid] if e.type == kind))

        order = sorted(rids, key=lambda r: at(r, "singleton_admitted"))
        for prev, nxt in itertools.pairwise(order):
            lat.append(at(nxt, "step_completed") - at(prev, "singleton_released"))
    return lat


async def handover(url: str, notify: bool, keys: int, per_key: int) -> list[float]:
    """Seconds from a holder's ``singleton_released`` to the next same-key run's first
    ``step_completed`` (both event ``at`` values: the engine's SystemClock)."""
    store = SqlStore(url)
    engine = Engine(
        store, [Handover()], clock=SystemClock(), notify_on_release=notify, poll_interval=POLL
    )
    async with engine:
        lat = await handover_latencies(engine, keys, per_key, "", 30 + 3 * per_key)
    store.close()
    return lat


def log_writes(store: SqlStore) -> list[tuple[float, float]]:
    """Log every write transaction of ``store`` (a group commit, or a lone statement in
    autocommit) as ``(start, end)`` on the system clock (the clock of the events' ``at``), on
    the I/O thread that runs it: the list it appends to."""
    log: list[tuple[float, float]] = []
    gc, db = store._gc, store._db
    batch, lone = gc.run_batch, db.returning_now

    def run_batch(ops: Any) -> Any:
        t0 = time.time()
        try:
            return batch(ops)
        finally:
            log.append((t0, time.time()))

    def returning_now(sql: str, params: Any) -> Any:
        t0 = time.time()
        try:
            return lone(sql, params)
        finally:
            log.append((t0, time.time()))

    gc.run_batch = run_batch  # type: ignore[method-assign]
    db.returning_now = returning_now  # type: ignore[method-assign]
    return log


async def handover_floor(url: str, per_key: int) -> dict[str, float]:
    """One key, ``per_key`` runs of ``Handover`` in one process: each hand-over's latency
    (release -> next run's first ``step_completed``), the write transactions that ended in
    that window (the release's own commit, which admits and leases the next run, and the next
    run's first step record), and the seconds those commits took on the I/O thread: the
    physical floor of the figure."""
    store = SqlStore(url)
    writes = log_writes(store)
    engine = Engine(store, [Handover()], clock=SystemClock(), poll_interval=POLL)
    gaps: list[float] = []
    counts: list[int] = []
    floors: list[float] = []
    async with engine:
        rids = [f"f-r{i:03d}" for i in range(per_key)]
        for rid in rids:
            await engine.start(HANDOVER_WF, {"k": 0}, rid)
        for rid in rids:
            await engine.result(rid, timeout=30 + 3 * per_key)
        hist = {rid: list(await engine.history(rid)) for rid in rids}
    store.close()

    def at(rid: str, kind: str) -> float:
        return float(next(e.at for e in hist[rid] if e.type == kind))

    order = sorted(rids, key=lambda r: at(r, "singleton_admitted"))
    for prev, nxt in itertools.pairwise(order):
        lo, hi = at(prev, "singleton_released"), at(nxt, "step_completed")
        # (the release's ``at`` is taken before its commit starts; the step's ``at`` before
        # its record's: that record ends after ``hi``, within the next millisecond or so)
        inside = [(a, b) for a, b in writes if b > lo and a >= lo - 1e-6 and a <= hi]
        gaps.append(hi - lo)
        counts.append(len(inside))
        floors.append(sum(b - a for a, b in inside))
    return {
        "n": len(gaps),
        "mean_ms": statistics.mean(gaps) * 1e3,
        "p95_ms": _p95(gaps) * 1e3,
        "commits_mean": statistics.mean(counts),
        "commit_ms_mean": statistics.mean(floors) * 1e3,
        "commit_ms_p95": _p95(floors) * 1e3,
    }


def _p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, math.ceil(len(xs) * 0.95) - 1)]


# -- 4. context: admission on a key with a deep queue ----------------------------------------


async def same_key_admission(
    make: Callable[[], Any], load: Callable[[Any, list[Run]], Any], depths: list[int], calls: int
) -> dict[int, float]:
    """Mean seconds of a *denied* ``try_admit_singleton`` by a run queued behind ``depth``
    waiters of its own key (what every gated waiter pays on each ~1 s re-check). Not a target:
    it shows what the backlog-on-other-keys figure of ``singleton_bench`` does not."""
    from singleton_bench import WF, _run

    out: dict[int, float] = {}
    t = 1_700_000_000.0
    for depth in depths:
        store = make()
        runs = [_run("holder", "hot", t, admitted=True)]
        runs += [_run(f"w{i:06d}", "hot", t + 1 + i * 1e-6) for i in range(depth)]
        runs.append(_run("late", "hot", t + 100))
        await load(store, runs)
        t0 = time.perf_counter()
        for i in range(calls):
            assert not await store.try_admit_singleton("late", "singleton:hot", WF, 1, t + 200 + i)
        out[depth] = (time.perf_counter() - t0) / calls
        close = getattr(store, "close", None)
        if close is not None:
            close()
    return out


# -- report ------------------------------------------------------------------------------


def _print_backend(name: str, r: dict[str, Any], mem: dict[str, Any] | None) -> None:
    sql = "raw_commits_per_s" in r
    if sql:
        raw = r["raw_commits_per_s"]
        print(f"  {name}: {r['server']}")
        print(
            f"    raw limit (1-row INSERT+COMMIT, the faster of two loops per slice):"
            f" {raw:8.0f} commits/s = 1.00x baseline;"
            f"  through the store's write path: {r['store_path_commits_per_s']:8.0f}/s,"
            f" bare driver on a fresh connection: {r['driver_commits_per_s']:8.0f}/s"
        )
    else:
        print(f"  {name}: no database (engine CPU only; the ceiling of any store)")
    for mode, (wl, conc) in MODES.items():
        m = r[mode]
        label = f"{wl.steps:2d} steps, " + ("sequential" if conc == 1 else f"{conc} in flight")
        line = (
            f"    {label:<22}: {m['workflows_per_s']:7.1f} workflows/s"
            f" {m['steps_per_s']:8.1f} steps/s"
        )
        if sql:
            lo, _mid, hi = m["slice_ratio_min_median_max"]
            line += (
                f"   steps/s / raw commits/s: {m['steps_ratio_to_raw']:5.2f}x"
                f" (slices {lo:.2f}-{hi:.2f})"
            )
        if mem is not None:
            line += f"   vs memory: {m['steps_per_s'] / mem[mode]['steps_per_s']:5.2f}x"
        print(line)
        calls = " ".join(f"{k}={v:.2f}" for k, v in m["store_calls"].items())
        print(f"      per workflow: {calls}")
        if sql:
            print(
                f"      per workflow: {m['write_tx']:.2f} write tx, {m['read_tx']:.2f}"
                f" read tx, {m['statements']:.1f} SQL statements"
                f" ({m['write_tx'] / wl.steps:.2f} write tx per step;"
                f" {m['ops_per_write_tx']:.1f} store calls per write tx)"
            )
        if sql and conc == 1:  # with runs in flight, calls overlap: their times do not add up
            cost = " ".join(
                f"{k}={v * raw:.1f}x"
                for k, v in m["seconds_per_call"].items()
                if m["store_calls"][k] >= 0.5
            )
            print(
                f"      time per call in raw commits: {cost};"
                f" store calls take {m['store_share_of_wall']:.0%} of the wall time"
            )


async def main(smoke: bool, pg_url: str | None, tmp: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    print(
        f"durable step throughput (workflows of {STEPS} trivial steps, and of {LONG_STEPS}:"
        " one transaction per step; SystemClock):"
    )
    mem = await bench_backend(None, smoke)
    _print_backend("memory", mem, None)
    results["memory"] = mem
    for name, new_url in backends(tmp, pg_url).items():
        r = await bench_backend(new_url, smoke)
        _print_backend(name, r, mem)
        results[name] = r
    if pg_url is None:
        results["postgres"] = {"skipped": "PostgreSQL binaries unavailable"}
    keys = 2 if smoke else 3
    notify = await handover(sqlite_url(tmp), True, keys, 3 if smoke else 10)
    timer = await handover(sqlite_url(tmp), False, keys, 2 if smoke else 4)
    print(f"handover latency on SQLite ({keys} keys), release -> next same-key first step:")
    print(
        f"  notify-on-release: mean {statistics.mean(notify) * 1e3:7.2f} ms"
        f"  p95 {_p95(notify) * 1e3:7.2f} ms  (n={len(notify)})"
    )
    print(
        f"  timer fallback   : mean {statistics.mean(timer) * 1e3:7.2f} ms"
        f"  p95 {_p95(timer) * 1e3:7.2f} ms  (n={len(timer)})"
    )
    print(f"  timer / notify mean ratio: {statistics.mean(timer) / statistics.mean(notify):.0f}x")
    print("hand-over in one process, one key: its commits (the physical floor) next to it:")
    results["handover_floor"] = {}
    for name, new_url in backends(tmp, pg_url).items():
        f = await handover_floor(new_url(), 6 if smoke else 40)
        results["handover_floor"][name] = f
        print(
            f"  {name:<9} release -> next first step: mean {f['mean_ms']:5.2f} ms"
            f" p95 {f['p95_ms']:5.2f} ms (n={f['n']}); commits inside: {f['commits_mean']:.2f}"
            f" on average, taking {f['commit_ms_mean']:5.2f} ms mean, p95"
            f" {f['commit_ms_p95']:5.2f} ms"
        )
    depths = [0, 100] if smoke else [0, 100, 1_000, 10_000]
    print("context: a denied re-check by a waiter queued behind N waiters of its own key:")
    results["same_key_denied_admission_us"] = {}
    for st in admission_stores(tmp, pg_url):
        same = await same_key_admission(
            st.make, st.load or _create_each, depths, 5 if smoke else 20
        )
        results["same_key_denied_admission_us"][st.name] = {
            str(k): v * 1e6 for k, v in same.items()
        }
        line = "  ".join(f"{k}: {v / same[0]:6.1f}x" for k, v in same.items())
        print(f"  {st.name:<9} ({same[0] * 1e6:7.1f} us with none ahead) {line}")
    results["handover_sqlite"] = {
        "keys": keys,
        "notify_ms": [x * 1e3 for x in notify],
        "timer_ms": [x * 1e3 for x in timer],
    }
    return results


# -- profile -----------------------------------------------------------------------------

_LAYERS = (
    ("database driver + I/O (sqlite3/psycopg C calls, socket waits)", ("sqlite3", "psycopg")),
    ("SQLAlchemy (statement building, compile cache, result rows)", ("/sqlalchemy/",)),
    ("flowkit SqlStore (stores/sql)", ("/flowkit/stores/sql/",)),
    ("flowkit engine (replay, worker, history models)", ("/flowkit/",)),
    ("pydantic / orjson", ("pydantic", "orjson")),
)


def _layer(func: tuple[str, int, str]) -> str:
    where = f"{func[0]}:{func[2]}"
    for label, needles in _LAYERS:
        if any(s in where for s in needles):
            return label
    return "asyncio, stdlib, other"


async def profile(backend: str, n: int, concurrency: int, long: bool = False) -> None:
    """cProfile of ``n`` workflows (of 40 steps with ``long``): the share of time by layer,
    then the top functions."""
    wl = LONG if long else THREE
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flowkit-bench-")))
        pg = stack.enter_context(postgres_server()) if backend == "postgres" else None
        factory = backends(tmp, pg).get(backend)
        if factory is None:
            print(f"no {backend} backend available")
            return
        store = SqlStore(factory())
        engine = Engine(store, [ThreeSteps(), LongSteps()], clock=SystemClock(), poll_interval=POLL)
        async with engine:
            await run_workflows(engine, 20, 1, "warm", wl)
            prof = cProfile.Profile()
            prof.enable()
            seconds = await run_workflows(engine, n, concurrency, "prof", wl)
            prof.disable()
        store.close()
    st = pstats.Stats(prof)
    by_layer: collections.Counter[str] = collections.Counter()
    for func, (_cc, _nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        by_layer[_layer(func)] += tt
    total = sum(by_layer.values())
    print(f"{backend}: {n} workflows, {concurrency} at a time, in {seconds:.2f} s under cProfile")
    for label, tt in by_layer.most_common():
        print(f"  {tt / total:6.1%}  {label}")
    st.sort_stats("tottime").print_stats(20)
    st.sort_stats("cumulative").print_stats(r"flowkit", 25)


_ACTIVATION = ("create_run", "claim", "load_history", "append_events", "commit")
"""The store calls on a run's own path (the worker's polls and the client's wait for the
result overlap the steps: not counted)."""


async def breakdown(backend: str, n: int = 24, rounds: int = 5) -> dict[str, float]:
    """Where the microseconds of one step of a 40-step workflow (one at a time) go, each part
    measured on its own in the same process, alternating with the workload ``rounds`` times:

    * ``step``: wall time per step of the workload (``LongSteps``, one at a time);
    * ``store_calls``: the time per step inside store calls, as the loop awaits them
      (``CountingStore``), and ``append``: one ``append_events`` (a step's record) of it;
    * ``lane_statement``: the record's statement on the I/O thread (``returning_now``:
      execute, fetch, the commit; timed on that thread);
    * ``hop``: an empty job handed to a write lane and back (``GroupCommit.direct``): the
      thread hand-off and the loop's wake-up, nothing else;
    * ``params``: what ``append_events`` does on the loop before the hand-off (limits check,
      the event's JSON body and parameters), timed in a loop;
    * ``raw``: a bare single-row ``INSERT`` + ``COMMIT`` (``driver_commit_rate``): the floor;
    * ``engine``: ``step`` - ``store_calls``: the engine's own work (replay bookkeeping, the
      step call, the event, the task switches)."""
    from flowkit._model.history import step_completed
    from flowkit.stores import limits as _limits

    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flowkit-bench-")))
        pg = stack.enter_context(postgres_server()) if backend == "postgres" else None
        factory = backends(tmp, pg).get(backend)
        if factory is None:
            print(f"no {backend} backend available")
            return {}
        store = SqlStore(factory())
        gc = store._gc
        # each lone write (a step's record) timed at four points: handed to the lane, started
        # and ended there, resumed on the loop (perf_counter is one clock for both threads)
        hops: list[tuple[float, float, float, float]] = []
        direct = gc.direct

        async def timed_direct(fn: Callable[[], Any]) -> Any:
            mark: list[float] = [0.0, 0.0]

            def on_lane() -> Any:
                mark[0] = time.perf_counter()
                try:
                    return fn()
                finally:
                    mark[1] = time.perf_counter()

            t0 = time.perf_counter()
            try:
                return await direct(on_lane)
            finally:
                hops.append((t0, mark[0], mark[1], time.perf_counter()))

        gc.direct = timed_direct  # type: ignore[method-assign]
        proxy = CountingStore(store)
        engine = Engine(proxy, [LongSteps()], clock=SystemClock(), poll_interval=POLL)
        # the same workload on a store without I/O threads (``group_commit=False``: every
        # call runs on the loop's thread): what the two hand-offs cost, measured
        inline = SqlStore(factory(), group_commit=False)
        inline_engine = Engine(inline, [LongSteps()], clock=SystemClock(), poll_interval=POLL)
        parts: dict[str, list[float]] = collections.defaultdict(list)
        ev = step_completed("1", "step_a", 1, 12345, "0123456789ab", 1767225600.123456)
        async with engine, inline_engine:
            await run_workflows(engine, 4, 1, "warm", LONG)
            await run_workflows(inline_engine, 4, 1, "warm", LONG)
            raw_commit_rate(store, 20)
            driver_commit_rate(store, 20)
            for r in range(rounds):
                calls, secs = proxy.calls.copy(), proxy.seconds.copy()
                hops.clear()
                dt = await run_workflows(engine, n, 1, f"bd{r}", LONG)
                steps = n * LONG_STEPS
                d_calls, d_secs = proxy.calls - calls, proxy.seconds - secs
                parts["step"].append(dt / steps)
                # (what the client awaits for a result overlaps the steps: not counted)
                parts["store_calls"].append(
                    sum(v for k, v in d_secs.items() if k in _ACTIVATION) / steps
                )
                if r == rounds - 1:
                    per = {k: (d_calls[k] / n, d_secs[k] / d_calls[k] * 1e6) for k in d_calls}
                    print("  store calls per workflow (count, mean us):", per)
                parts["append"].append(d_secs["append_events"] / d_calls["append_events"])
                parts["hand_in"].append(statistics.mean(b - a for a, b, _c, _d in hops))
                parts["lane_statement"].append(statistics.mean(c - b for _a, b, c, _d in hops))
                parts["hand_back"].append(statistics.mean(d - c for _a, _b, c, d in hops))
                parts["lone"].append(len(hops) / d_calls["append_events"])
                k = 400
                t0 = time.perf_counter()
                for _ in range(k):
                    await direct(lambda: None)
                parts["hop"].append((time.perf_counter() - t0) / k)
                t0 = time.perf_counter()
                for _ in range(k):
                    _limits.check_events([ev], store.max_payload_bytes)
                    params: dict[str, Any] = {"id": "r", "owner": "o"}
                    sql_rows.event_params(params, 0, [ev])
                parts["params"].append((time.perf_counter() - t0) / k)
                parts["raw"].append(1 / driver_commit_rate(store, 250))
                dt = await run_workflows(inline_engine, n, 1, f"in{r}", LONG)
                parts["inline_step"].append(dt / steps)
        store.close()
        inline.close()
    lone = statistics.median(parts.pop("lone"))
    out = {k: statistics.median(v) * 1e6 for k, v in parts.items()}
    out["lone_share"] = lone
    out["engine"] = out["step"] - out["store_calls"]
    out["append_rest"] = (
        out["append"] - out["hand_in"] - out["lane_statement"] - out["hand_back"] - out["params"]
    )
    print(
        f"{backend}: one step of a {LONG_STEPS}-step workflow, one at a time (median of {rounds}"
        f" rounds of {n} workflows), in us:"
    )
    print(
        f"  step (wall)                           {out['step']:7.1f}"
        f"   = {out['raw'] / out['step']:.2f}x the raw commit rate"
    )
    print(f"  engine (step - store calls)           {out['engine']:7.1f}")
    print(f"  store calls per step (loop's view)    {out['store_calls']:7.1f}")
    print(f"    one append_events (a step's record) {out['append']:7.1f}")
    print(f"      params + limits check (on loop)   {out['params']:7.1f}")
    print(f"      hand-off to the I/O thread        {out['hand_in']:7.1f}")
    print(f"      statement + commit on the lane    {out['lane_statement']:7.1f}")
    print(f"      hand-back, the loop resumes       {out['hand_back']:7.1f}")
    print(f"      rest (proxy, futures, the call)   {out['append_rest']:7.1f}")
    print(f"    (records that went alone: {lone:.0%}; an empty job's round trip: {out['hop']:.1f})")
    print(f"  raw single-row INSERT+COMMIT (floor)  {out['raw']:7.1f}")
    print(
        f"  (no I/O thread: every call on the loop, group_commit=False: a step"
        f" {out['inline_step']:.1f} = {out['raw'] / out['inline_step']:.2f}x the raw rate)"
    )
    return out


def _cli() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for CI")
    parser.add_argument("--profile", choices=("sqlite", "postgres"), help="cProfile only")
    parser.add_argument("--concurrency", type=int, default=1, help="with --profile")
    parser.add_argument("--long", action="store_true", help="with --profile: 40-step workflows")
    parser.add_argument(
        "--breakdown",
        choices=("sqlite", "postgres"),
        help="where the microseconds of a 40-step workflow's step go",
    )
    args = parser.parse_args()
    if args.breakdown:
        asyncio.run(breakdown(args.breakdown))
        return 0
    if args.profile:
        n = 30 if args.long else 300
        asyncio.run(profile(args.profile, n, args.concurrency, args.long))
        return 0
    with (
        tempfile.TemporaryDirectory(prefix="flowkit-bench-") as tmp,
        postgres_server() as pg,
    ):
        asyncio.run(main(args.smoke, pg, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(_cli())
