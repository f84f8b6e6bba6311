"""Wake-ups across processes (``SqlStore.watch``), on a SQLite file and on PostgreSQL.

* which writes emit a wake-up (one per transaction, group commits included) and which do not
  (a step's commit, a claim, a lease renewal: no wake-up and no extra statement);
* a watcher sees the wake-ups of another store object, filtered by namespace on PostgreSQL;
* a worker with ``poll_interval=60`` runs a run that a ``worker=False`` client started on
  another store object, or in another process, at once;
* the ``LISTEN`` connection survives a killed backend and wake-ups arrive again after it;
* a singleton release in a process at capacity (the slot can only be woken, not handed over)
  lets another process run the waiter before the waiter's own re-check timer is due;
* ``TestEnv`` never exposes ``watch``; ``CodecStore`` forwards it; workers unsubscribe.

Waits are bounded by timeouts; nothing sleeps in place of synchronization."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import random
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from store_kit import KINDS, T0, TAG, S, database_url, first_events, fresh_database, mk, put

from flowkit import Engine, History, Run
from flowkit.events import RunCompleted, SingletonGated, TimerFired
from flowkit.stores import MemoryStore
from flowkit.stores.base import Admission, Notify, Update
from flowkit.stores.codec import CodecStore
from flowkit.stores.sql import SqlStore, _wakeup
from flowkit_testing import TestEnv

ROOT = Path(__file__).resolve().parent.parent
FAST = 5.0  # seconds: "at once" next to a 60 s poll interval, with room for a slow machine


@pytest.fixture(params=KINDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return database_url(request.param, request, tmp_path)


@pytest.fixture
def stores(url: str) -> Iterator[Callable[..., SqlStore]]:
    """Store objects on the one database (each one another process' view), closed after."""
    opened: list[SqlStore] = []

    def new(**kw: Any) -> SqlStore:
        s = SqlStore(url, **kw)
        opened.append(s)
        return s

    yield new
    for s in opened:
        s.close()


async def listening(store: SqlStore) -> _wakeup.Hub:
    """The store's watcher on this loop, once it listens."""
    hub = store._db.hub()
    assert hub is not None, "nobody watches this store"
    await asyncio.wait_for(hub.ready.wait(), timeout=10)
    return hub


async def until(condition: Callable[[], Any], timeout: float = 10.0) -> None:
    """Check ``condition`` every few ms until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        await asyncio.sleep(0.005)


class Counter:
    """A watch callback: counts calls and lets a test wait for the next one."""

    def __init__(self) -> None:
        self.n = 0
        self.event = asyncio.Event()

    def __call__(self) -> None:
        self.n += 1
        self.event.set()

    async def next(self, timeout: float = FAST) -> None:
        await asyncio.wait_for(self.event.wait(), timeout)
        self.event.clear()


# -- the store side: which writes emit -------------------------------------------------------


async def test_which_writes_emit_a_wake_up(stores: Callable[..., SqlStore]) -> None:
    s = stores()
    pg = s._db.dialect == "postgresql"
    stats = s._db.stats

    async def emitted(call: Any) -> int:
        before = stats["wakeups"]
        await call
        return int(stats["wakeups"] - before)

    # a client's start: pending, nobody holds it
    assert await emitted(put(s, mk("a"))) == 1
    # a worker's own start, claimed in the creating transaction: nothing
    leased = mk("b", status=S.RUNNING, lease_owner="x", lease_expires=T0 + 30)
    assert await emitted(put(s, leased)) == 0

    # claim, step commits and lease renewals: no wake-up and not one extra statement
    before = stats.copy()
    assert await s.claim("a", "x", T0, T0 + 30) is not None
    for i in range(3):
        at = T0 + 1 + i
        await s.commit("a", "x", at, Update(events=[TimerFired(pos=str(i), at=at)]))
    assert await s.renew_lease("a", "x", T0 + 60) is not None
    assert stats["wakeups"] == before["wakeups"]
    per_step = 1 if pg else 2  # PostgreSQL inserts the events in the UPDATE's statement
    assert stats["statements"] - before["statements"] == 1 + 3 * per_step + 1

    # parked for a future timer or a signal: not due, nothing
    park = Update(status=S.SUSPENDED, wake_at=T0 + 100, waiting_signals=("go",), release_lease=True)
    assert await emitted(s.commit("a", "x", T0 + 5, park)) == 0
    # a signal it waits for makes it due now: one
    assert await emitted(s.deliver_signal("a", "go", 1, T0 + 6)) == 1
    # a signal to a run its worker holds: nothing
    assert await emitted(s.deliver_signal("b", "go", 1, T0 + 6)) == 0
    # a released lease (a graceful stop, a worker without the workflow): one
    assert await emitted(s.commit("b", "x", T0 + 7, Update(release_lease=True))) == 1

    # a group commit of eight starts: one transaction, one wake-up
    runs = [mk(f"g{i}", t=T0 + i) for i in range(8)]
    before = stats.copy()
    await asyncio.gather(*(put(s, r) for r in runs))
    assert stats["write_tx"] - before["write_tx"] == 1
    assert stats["wakeups"] - before["wakeups"] == 1


async def test_a_create_that_admits_emits_by_what_it_stored(
    stores: Callable[..., SqlStore],
) -> None:
    """Admission at creation applies the creation rule to the run as stored: one claimed by its
    creator (admitted) or parked until its re-check (gated) wakes nobody; an admitted run
    nobody holds (pending) is claimable now and wakes the workers."""
    s = stores()
    stats = s._db.stats

    async def emitted(run: Run, retry: float) -> tuple[Run, int]:
        before = stats["wakeups"]
        key = run.singleton_key
        assert key is not None
        gated = (SingletonGated(key=key, retry_at=retry, at=run.created_at),)
        adm = Admission("wf", f"singleton:{key}", 1, retry, gated)
        stored, created = await s.create_run(run, first_events(run), admission=adm)
        assert created
        return stored, int(stats["wakeups"] - before)

    leased = dict(status=S.RUNNING, lease_owner="x", lease_expires=T0 + 30)
    h, n = await emitted(mk("h", key="k", **leased), T0 + 1)
    assert h.admitted and n == 0
    w, n = await emitted(mk("w", key="k", t=T0 + 1, **leased), T0 + 2)
    assert (w.admitted, w.status, w.lease_owner) == (False, S.SUSPENDED, None) and n == 0
    p, n = await emitted(mk("p", key="other"), T0 + 1)
    assert (p.admitted, p.status) == (True, S.PENDING) and n == 1


@pytest.mark.parametrize("owner", ["x", None], ids=["hands-over", "only-wakes"])
async def test_a_release_emits_only_when_it_wakes_instead_of_handing_over(
    stores: Callable[..., SqlStore], owner: str | None
) -> None:
    s = stores()
    # holder h admitted and leased to x; waiter w gated until T0+50
    await put(s, mk("h", key="k", t=T0))
    await put(s, mk("w", key="k", t=T0 + 1))
    assert await s.try_admit_singleton("h", TAG, "wf", 1, T0 + 1)
    assert not await s.try_admit_singleton("w", TAG, "wf", 1, T0 + 50)
    assert await s.claim("h", "x", T0 + 2, T0 + 32)
    before = s._db.stats["wakeups"]
    release = Update(
        events=[RunCompleted(at=T0 + 3)],
        status=S.COMPLETED,
        notify=Notify("wf", TAG, 1, claim_owner=owner, lease_expires=T0 + 40),
    )
    res = await s.commit("h", "x", T0 + 3, release)
    if owner is None:  # the releaser has no room: the waiter is only stamped awake
        assert res.woken == ("w",) and res.handed == ()
        assert s._db.stats["wakeups"] == before + 1
    else:  # handed over: admitted and leased to the releaser, nothing to wake anyone for
        assert res.woken == () and [h.run.id for h in res.handed] == ["w"]
        assert s._db.stats["wakeups"] == before


async def test_the_sqlite_counter_row_is_created_on_first_use(tmp_path: Path) -> None:
    s = SqlStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:
        assert await s.get_run("nothing") is None  # the schema, without the counter
        key = _wakeup.SQLITE_COUNTER_KEY

        def counter() -> Any:
            with s._db.tx(write=False) as conn:
                q = sa.text("SELECT value FROM flowkit_meta WHERE key = :k")
                return conn.execute(q, {"k": key}).scalar_one_or_none()

        assert counter() is None
        await put(s, mk("a"))
        assert counter() == "1"
        await put(s, mk("b"))
        assert counter() == "2"
    finally:
        s.close()


# -- the watch side --------------------------------------------------------------------------


async def test_a_watcher_sees_the_wake_ups_of_other_store_objects(
    stores: Callable[..., SqlStore],
) -> None:
    a, b = stores(), stores()
    seen = Counter()
    unwatch = a.watch(seen)
    try:
        await listening(a)
        await seen.next()  # the catch-up call after (re)connecting
        await put(b, mk("r1"))
        await seen.next()
        await put(a, mk("r2"))  # its own store object's too
        await seen.next()
    finally:
        unwatch()
    assert a._db.hub() is None  # the last watcher gone: stopped


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify: Linux only")
async def test_an_idle_sqlite_watcher_waits_for_a_file_event(tmp_path: Path) -> None:
    """At rest the SQLite watcher checks ``data_version`` about once a second (its safety
    net), not every ``SQLITE_CHECK_INTERVAL``: it waits for ``inotify`` to say that a file of
    the database's directory was written. A commit by another process (a plain ``sqlite3``
    connection emitting the wake-up) still fires the callback."""
    path = tmp_path / "db.sqlite"
    a = SqlStore(f"sqlite:///{path}")
    seen = Counter()
    unwatch = a.watch(seen)
    try:
        hub = await listening(a)
        await seen.next()  # the catch-up call after connecting
        assert isinstance(hub, _wakeup.SqliteHub) and hub._fd is not None
        checks = hub.stats["checks"]
        await asyncio.sleep(0.5)  # (measuring idleness: 50 checks if it polled every 10 ms)
        # (a file event of the connection's first moments, and its looks again)
        assert hub.stats["checks"] - checks <= 3 + len(_wakeup.SQLITE_SETTLE)
        code = (
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
            f" c.execute({_wakeup.SQLITE_EMIT!r}); c.close()"
        )
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, str(path))
        assert await proc.wait() == 0
        await seen.next()
    finally:
        unwatch()
        a.close()


class StaleFirstLook:
    """The watcher's connection, whose first ``data_version`` read after ``stale`` is set
    answers the value the watcher knows: the commit that wrote the ``-wal`` file is not
    visible yet (its shared-memory index, which makes no file event, comes next)."""

    def __init__(self, conn: sqlite3.Connection, hub: _wakeup.SqliteHub) -> None:
        self.conn = conn
        self.hub = hub
        self.stale = False
        self.served = 0

    def execute(self, q: str, *a: Any) -> Any:
        if q == "PRAGMA data_version" and self.stale:
            self.stale = False
            self.served += 1
            return self.conn.execute("SELECT ?", (self.hub._version,))
        return self.conn.execute(q, *a)

    def close(self) -> None:
        self.conn.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify: Linux only")
async def test_a_file_event_before_its_commit_is_visible_is_looked_at_again(
    tmp_path: Path,
) -> None:
    """``inotify`` tells that a commit wrote the ``-wal`` file, which may be before that
    commit is visible to a reader: the watcher's check right after the event then finds
    nothing. It looks again shortly after (``SQLITE_SETTLE``) instead of waiting for its ~1 s
    safety net: another connection's wake-up is seen by a look again, not by the idle check
    (the race driven here: the check after the event reads the old ``data_version``)."""
    path = tmp_path / "db.sqlite"
    a, b = SqlStore(f"sqlite:///{path}"), SqlStore(f"sqlite:///{path}")
    seen = Counter()
    unwatch = a.watch(seen)
    try:
        hub = await listening(a)
        await seen.next()  # the catch-up call after connecting
        assert isinstance(hub, _wakeup.SqliteHub) and hub._conn is not None
        await put(b, mk("r0"))  # (the schema's and the first run's writes, seen)
        await seen.next()
        # at rest: waiting for a file event (no look again left)
        await until(lambda: hub._armed and not getattr(hub, "_looks", ()))
        conn = hub._conn = StaleFirstLook(hub._conn, hub)  # type: ignore[assignment]
        on_event = hub._event

        def event() -> None:  # the next file event comes before its commit is visible
            conn.stale = conn.served == 0
            on_event()

        hub._event = event  # type: ignore[method-assign]
        assert hub._fd is not None
        asyncio.get_running_loop().add_reader(hub._fd, event)  # (it waits with the old one)
        causes = ("event", "look", "idle", "poll")
        fired = {c: hub.stats.get(f"fired_{c}", 0) for c in causes}
        checks = hub.stats["checks"]
        # another process's wake-up (its commit's file events all queued before the loop
        # looks: one event, one check)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute(_wakeup.SQLITE_EMIT)
        other.close()
        await seen.next()
        assert conn.served == 1  # (the race happened: the first check found nothing)
        # found by the look again, not by the idle check (the ~1 s safety net)
        got = {c: hub.stats.get(f"fired_{c}", 0) - fired[c] for c in causes}
        assert (got, hub.stats["checks"] - checks) == (
            {"event": 0, "look": 1, "idle": 0, "poll": 0},
            2,
        )
    finally:
        unwatch()
        a.close()
        b.close()


@pytest.mark.postgres
async def test_scoped_watchers_see_only_their_namespace(request: pytest.FixtureRequest) -> None:
    url = fresh_database(request.getfixturevalue("pg_server"))
    watcher, writer = SqlStore(url), SqlStore(url)
    eu, every = Counter(), Counter()
    stops = [watcher.scoped("eu").watch(eu), watcher.watch(every)]
    try:
        await listening(watcher)
        await eu.next()
        await every.next()
        await put(writer, mk("plain"))  # no namespace
        await put(writer.scoped("us"), mk("us-1"))
        await put(writer.scoped("eu"), mk("eu-1"))
        await eu.next()  # notifications arrive in commit order: the first two came before
        await until(lambda: every.n == 4)
        assert eu.n == 2
    finally:
        for stop in stops:
            stop()
        watcher.close()
        writer.close()


async def test_a_failing_callback_does_not_stop_the_others(
    stores: Callable[..., SqlStore], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = stores(), stores()

    def broken() -> None:
        raise RuntimeError("a buggy watcher")

    seen = Counter()
    stops = [a.watch(broken), a.watch(seen)]
    try:
        await listening(a)
        await seen.next()
        with caplog.at_level(logging.ERROR, logger="flowkit"):
            await put(b, mk("r1"))
            await seen.next()
        assert "wake-up callback failed" in caplog.text
    finally:
        for stop in stops:
            stop()


async def test_watching_can_be_turned_off(stores: Callable[..., SqlStore]) -> None:
    a = stores(wakeups=False)
    assert not a.wakeups and not a.scoped("eu").wakeups
    unwatch = a.watch(Counter())
    assert a._db.hub() is None
    unwatch()
    before = a._db.stats["wakeups"]
    await put(a, mk("r1"))  # it still emits, for the other processes' watchers
    assert a._db.stats["wakeups"] == before + 1


@pytest.mark.postgres
async def test_an_unreachable_database_is_logged_and_retried(
    request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL: a watcher of a database that does not exist fails to connect; it logs,
    backs off and retries, and never raises into the caller."""
    server = request.getfixturevalue("pg_server")
    gone = sa.engine.make_url(server).set(database="flowkit_no_such_db")
    s = SqlStore(gone.render_as_string(hide_password=False))
    try:
        with caplog.at_level(logging.WARNING, logger="flowkit"):
            unwatch = s.watch(Counter())
            hub = s._db.hub()
            assert hub is not None
            await until(lambda: hub.stats["failures"] >= 2)
            unwatch()
        assert "flowkit wake-ups" in caplog.text and "retrying" in caplog.text
        assert not hub.ready.is_set()
    finally:
        s.close()


@pytest.mark.postgres
async def test_the_listen_connection_survives_a_killed_backend(
    request: pytest.FixtureRequest,
) -> None:
    url = fresh_database(request.getfixturevalue("pg_server"))
    a, b = SqlStore(url), SqlStore(url)
    admin = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    seen = Counter()
    unwatch = a.watch(seen)
    try:
        hub = await listening(a)
        await seen.next()
        for round_ in range(2):  # twice: the replacement is replaced too
            pid = hub.backend_pid
            with admin.connect() as conn:
                killed = conn.exec_driver_sql(f"SELECT pg_terminate_backend({pid})").scalar()
            assert killed
            await until(lambda pid=pid: hub.backend_pid != pid and hub.ready.is_set())
            await seen.next()  # the catch-up call after reconnecting
            await put(b, mk(f"after-kill-{round_}"))
            await seen.next()
        assert hub.stats["connects"] == 3 and hub.stats["failures"] == 2
    finally:
        unwatch()
        a.close()
        b.close()
        admin.dispose()


# -- the worker side -------------------------------------------------------------------------

PROC_SCRIPT = """
import asyncio, os, sys

from flowkit import Engine, Singleton, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore

RELEASE = asyncio.Event()
STOP = asyncio.Event()


def pid() -> int:
    return os.getpid()


async def hold() -> int:
    print("holding", flush=True)
    await RELEASE.wait()
    return os.getpid()


async def fill() -> int:
    await STOP.wait()
    return os.getpid()


@workflow(name="echo")
class Echo:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return await ctx.step(pid)


@workflow(name="lane", singleton=Singleton(key=lambda holds: "k"))
class Lane:
    async def run(self, ctx: WorkflowCtx, holds: bool) -> int:
        return await ctx.step(hold if holds else pid)


@workflow(name="filler")
class Filler:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        return await ctx.step(fill)


async def client(url: str, run_id: str) -> None:
    store = SqlStore(url)
    try:
        await Engine(store, [Echo()], worker=False).start("echo", 1, run_id)
    finally:
        store.close()


async def releaser(url: str) -> None:
    # One slot: the holder takes it, a filler queues behind it. When the holder settles,
    # this engine is over capacity, so its release only wakes the waiter (no hand-off), and
    # the waiter queues behind the filler here: another process has to take it.
    store = SqlStore(url)
    engine = Engine(store, [Lane(), Filler()], instance_id="releaser", max_concurrency=1,
                    poll_interval=60)
    loop = asyncio.get_running_loop()
    async with engine:
        await engine.start("lane", True, "holder")
        await engine.start("filler", 0, "filler")
        print("ready", flush=True)
        await loop.run_in_executor(None, sys.stdin.readline)
        RELEASE.set()
        await loop.run_in_executor(None, sys.stdin.readline)
        STOP.set()
    store.close()


if __name__ == "__main__":
    role, url = sys.argv[1], sys.argv[2]
    asyncio.run(client(url, sys.argv[3]) if role == "client" else releaser(url))
"""


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Any]:
    """The subprocess script, also imported here (the same workflow definitions)."""
    path = tmp_path / "wake_proc.py"
    path.write_text(PROC_SCRIPT)
    spec = importlib.util.spec_from_file_location("flowkit_wake_proc", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    mod.PATH = path
    yield mod
    sys.modules.pop(spec.name, None)


async def _warm_up(client: Engine, worker: Engine, store: SqlStore) -> None:
    """The worker's watcher listens and its start-up polls are behind it: from here on, only a
    wake-up (or its 60 s poll) can make it look again."""
    await listening(store)
    await client.start("echo", 0, "warm-up")
    assert await asyncio.wait_for(worker.result("warm-up"), FAST) == os.getpid()


async def test_a_worker_runs_a_run_another_store_object_started_at_once(
    stores: Callable[..., SqlStore], procs: Any
) -> None:
    worker_store, client_store = stores(), stores()
    worker = Engine(worker_store, [procs.Echo()], poll_interval=60)
    client = Engine(client_store, [procs.Echo()], worker=False)
    async with worker:
        await _warm_up(client, worker, worker_store)
        for i in range(3):
            t0 = time.monotonic()
            await client.start("echo", i, f"r{i}")
            assert await asyncio.wait_for(worker.result(f"r{i}"), FAST) == os.getpid()
            assert time.monotonic() - t0 < FAST
    assert worker_store._db.hub() is None  # the worker unsubscribed when it stopped


async def test_a_worker_runs_a_run_another_process_started_at_once(
    url: str, stores: Callable[..., SqlStore], procs: Any
) -> None:
    worker_store = stores()
    worker = Engine(worker_store, [procs.Echo()], poll_interval=60)
    async with worker:
        await _warm_up(Engine(stores(), [procs.Echo()], worker=False), worker, worker_store)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(procs.PATH),
            "client",
            url,
            "from-a-process",
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, out.decode()
        assert await asyncio.wait_for(worker.result("from-a-process"), FAST) == os.getpid()
        run = await worker.get_run("from-a-process")
        done = (await worker.history(run.id))[-1]
        assert done.type == "run_completed"
        assert done.at - run.created_at < FAST  # started in the process, run here at once


class _LateRechecks(random.Random):
    """Gate jitter always at its maximum: a denied waiter re-checks 1.25 s later."""

    def uniform(self, a: float, b: float) -> float:
        return b


async def test_a_release_at_capacity_in_one_process_wakes_a_waiter_another_process_runs(
    url: str, stores: Callable[..., SqlStore], procs: Any
) -> None:
    store = stores()
    engine = Engine(
        store, [procs.Lane()], instance_id="taker", poll_interval=60, rng=_LateRechecks()
    )
    releaser = await asyncio.create_subprocess_exec(
        sys.executable,
        str(procs.PATH),
        "releaser",
        url,
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert releaser.stdin is not None and releaser.stdout is not None
    try:
        seen: list[bytes] = []
        while not {b"holding", b"ready"} <= set(seen):  # the holder runs, the filler queues
            line = await asyncio.wait_for(releaser.stdout.readline(), timeout=60)
            assert line, b"".join(seen).decode()
            seen.append(line.strip())
        async with engine:
            await listening(store)
            await engine.start("lane", False, "waiter")  # claimed here and gated

            async def gated() -> bool:
                return "singleton_gated" in (await engine.history("waiter")).types

            deadline = time.monotonic() + 10
            while not await gated():
                assert time.monotonic() < deadline, "the waiter was never gated"
                await asyncio.sleep(0.005)
            releaser.stdin.write(b"release\n")
            await releaser.stdin.drain()
            assert await asyncio.wait_for(engine.result("waiter"), FAST) == os.getpid()
        releaser.stdin.write(b"stop\n")
        await releaser.stdin.drain()
        await asyncio.wait_for(releaser.wait(), timeout=30)
        assert releaser.returncode == 0, (await releaser.stdout.read()).decode()

        holder = await store.get_run("holder")
        assert holder is not None and holder.status is S.COMPLETED
        assert holder.output == releaser.pid  # released in the other process
        released = next(
            e for e in await store.load_events("holder") if e.type == "singleton_released"
        )
        h = History("waiter", await store.load_events("waiter"))
        gate = next(e for e in h if isinstance(e, SingletonGated))
        admitted = next(e for e in h if e.type == "singleton_admitted")
        # admitted after the release, but before its own re-check was due (and this
        # engine's poll is a minute away): only the wake-up can have done it
        assert released.at <= admitted.at < gate.retry_at
    finally:
        if releaser.returncode is None:
            releaser.kill()
            await releaser.wait()


# -- who exposes watch -----------------------------------------------------------------------


async def test_testenv_never_watches(tmp_path: Path, procs: Any) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'env.db'}")
    try:
        async with TestEnv([procs.Echo()], store=store, instances=2) as env:
            for eng in env.engines:
                assert getattr(eng.store, "watch", None) is None
                assert not hasattr(eng.store, "watch")
            await env.start("echo", 1, "r")
            assert await env.result("r") == os.getpid()
            assert store._db._hubs == {}
    finally:
        store.close()


async def test_codec_store_forwards_watch_only_when_inner_has_it(
    stores: Callable[..., SqlStore],
) -> None:
    class Plain:
        def encode(self, value: Any) -> Any:
            return value

        def decode(self, value: Any) -> Any:
            return value

    assert getattr(CodecStore(MemoryStore(), Plain()), "watch", None) is None
    a, b = stores(), stores()
    codec = CodecStore(a, Plain())
    seen = Counter()
    unwatch = codec.scoped("eu").watch(seen)
    try:
        await listening(a)
        await seen.next()
        await put(b.scoped("eu"), mk("r1"))
        await seen.next()
    finally:
        unwatch()
    assert a._db.hub() is None


async def test_close_stops_the_watchers(stores: Callable[..., SqlStore]) -> None:
    a = stores()
    unwatch = a.watch(Counter())
    await listening(a)
    a.close()
    assert a._db._hubs == {}
    unwatch()  # after close: nothing left to stop, no error
