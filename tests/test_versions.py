"""Versions (docs/writing-workflows.md): several versions of one workflow name on one engine,
natural order, pinned starts, and workers that claim only the versions they have, on MemoryStore, a
SQLite file and PostgreSQL (two engines in one process; the mixed fleet of processes is
tests/test_versions_fleet.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from cli_kit import flowkit
from hypothesis import given
from hypothesis import strategies as st
from store_kit import T0, Backend, mk, put
from version_kit import NAME, GreetV1, GreetV2, GreetV10, LaneV1, LaneV2, wait_for

from flowkit import Engine, ResultTimeoutError, RunStatus, SystemClock, WorkflowNotFoundError
from flowkit._model.definition import definition_of
from flowkit._model.registry import Registry, natural_key
from flowkit._worker.worker import WORKER_REFRESH
from flowkit.stores import AESGCMCodec, CodecStore, MemoryStore, SqlStore
from flowkit.stores.base import claims_by_version
from flowkit_testing import TestEnv

# -- natural order ---------------------------------------------------------------------------

ORDERED = [
    ("1", "2"),
    ("2", "10"),
    ("9", "10"),
    ("1.9", "1.10"),
    ("1.2", "1.10.1"),
    ("1", "1.0"),
    ("v2", "v10"),
    ("1.0", "1.a"),  # a number before text at the same place
    ("1.0-beta", "1.0-rc"),
    ("01", "1"),  # the same number: the spelling decides, never equal
    ("2024-01-31", "2024-02-01"),
]


@pytest.mark.parametrize(("older", "newer"), ORDERED)
def test_natural_order(older: str, newer: str) -> None:
    assert natural_key(older) < natural_key(newer)


@given(st.lists(st.integers(0, 10**6), min_size=1, max_size=4), st.sampled_from([".", "-", "v"]))
def test_digit_runs_compare_as_numbers(parts: list[int], sep: str) -> None:
    """Versions made of the same text and different numbers order like the number tuples."""
    a = sep.join(map(str, parts))
    bumped = [*parts[:-1], parts[-1] + 1]
    b = sep.join(map(str, bumped))
    assert natural_key(a) < natural_key(b)


@given(st.text(max_size=12), st.text(max_size=12))
def test_natural_order_is_total_and_tells_versions_apart(a: str, b: str) -> None:
    assert (natural_key(a) == natural_key(b)) == (a == b)


def test_the_registry_keeps_every_version_and_knows_the_newest() -> None:
    reg = Registry()
    for wf in (GreetV2(), GreetV10(), GreetV1()):
        defn = definition_of(wf)
        assert defn is not None
        reg.add(defn, wf)
    assert reg.newest(NAME) == "10" and reg.versions(NAME) == ["1", "2", "10"]
    assert reg.pairs() == ((NAME, "1"), (NAME, "10"), (NAME, "2"))
    entry = reg.get(NAME)
    assert entry is not None and isinstance(entry[1], GreetV10)
    assert reg.get(NAME, "3") is None and reg.get("nope") is None
    assert NAME in reg and list(reg) == [NAME] and len(reg) == 3
    defn = definition_of(GreetV2)
    assert defn is not None
    with pytest.raises(ValueError, match="duplicate workflow 'greet' version '2'"):
        reg.add(defn, GreetV2())


# -- starting a version ----------------------------------------------------------------------


async def test_start_takes_the_newest_unless_pinned(backend: Backend) -> None:
    store = backend.store
    async with Engine(store, [GreetV1, GreetV2(), GreetV10], poll_interval=0.05) as engine:
        with pytest.raises(ValueError, match="duplicate workflow 'greet' version '1'"):
            engine.register(GreetV1)
        newest = await engine.start(NAME, 1, "newest")
        pinned = await engine.start(NAME, 2, "pinned", version="2")
        own = await engine.start(GreetV1, 3, "own")
        assert [r.workflow_version for r in (newest, pinned, own)] == ["10", "2", "1"]
        # each result through its own version's output type (v1: an int, the others: a str)
        assert await engine.result("newest", timeout=30) == "v10:1"
        assert await engine.result("pinned", timeout=30) == "v2:2:here"
        assert await engine.result("own", timeout=30) == 4
        history = await engine.history("pinned")
        assert history.events[0].version == "2"  # type: ignore[attr-defined]
        before = await store.list_runs()
        for call in (
            lambda: engine.start(NAME, 1, "x", version="3"),
            lambda: engine.start(GreetV1(), 1, "x", version="2"),
            lambda: engine.start("nope", 1, "x", version="1"),
        ):
            with pytest.raises(WorkflowNotFoundError) as err:
                await call()
            assert err.value.version is not None
        assert "unknown workflow 'greet' version '3'" in str(
            await _raised(engine.start(NAME, 1, "x", version="3"))
        )
        assert await store.list_runs() == before  # nothing written


async def _raised(coro: Any) -> BaseException:
    try:
        await coro
    except BaseException as exc:
        return exc
    raise AssertionError("no error")


# -- workers claim only their versions --------------------------------------------------------


async def test_a_worker_claims_only_the_versions_it_has(backend: Backend) -> None:
    """A v1-only engine runs the v1 runs and never claims a v2 run (it stays ``pending``,
    unleased, with only its start in its history: the claim query itself filters), says why
    when ``result`` times out, and an engine with v2 then runs it."""
    store = backend.store
    client = Engine(store, [GreetV1, GreetV2], worker=False)
    old = Engine(store, [GreetV1], instance_id="old", poll_interval=0.05)
    async with old:
        v2 = [await client.start(NAME, i, f"v2-{i}") for i in range(3)]
        v1 = [await client.start(NAME, i, f"v1-{i}", version="1") for i in range(3)]
        assert {r.workflow_version for r in v2} == {"2"}
        for r in v1:
            assert await client.result(r.id, timeout=30) == int(r.input) + 1
        due = await store.due_runs(T0 + 10**9, 10, versions=[(NAME, "1")])
        assert due == []  # (v1: all done)
        due = await store.due_runs(T0 + 10**9, 10, versions=[(NAME, "2")])
        assert sorted(due) == ["v2-0", "v2-1", "v2-2"]
        for r in v2:
            got = await client.get_run(r.id)
            assert (got.status, got.lease_owner) == (RunStatus.PENDING, None)
            assert (await client.history(r.id)).types == ["run_started"]
        with pytest.raises(ResultTimeoutError) as err:
            await client.result("v2-0", timeout=0.2)
        assert "no worker with workflow 'greet' version '2' has been seen" in str(err.value)
        seen = {w.instance_id: w.versions for w in await store.workers()}
        assert seen["old"] == ((NAME, "1"),)
        async with Engine(store, [GreetV1, GreetV2], instance_id="new", poll_interval=0.05):
            for r in v2:
                assert await client.result(r.id, timeout=30) == f"v2:{r.input}:here"
            seen = {w.instance_id: w.versions for w in await store.workers()}
            assert seen["new"] == ((NAME, "1"), (NAME, "2"))


async def test_a_singleton_slot_is_handed_only_to_a_waiter_of_a_version_the_releaser_has(
    backend: Backend,
) -> None:
    """A v1-only worker releasing a key does not take its v2 waiter (neither handed over nor
    claimed: it stays ``pending``, unadmitted and unleased); a worker with v2 then runs it."""
    store = backend.store
    client = Engine(store, [LaneV1, LaneV2], worker=False)
    async with Engine(store, [LaneV1], instance_id="old", poll_interval=0.05) as old:
        await client.start("lane-v", "k", "holder", version="1")
        await wait_for(old, "holder", lambda r: r.admitted and "go" in r.waiting_signals)
        waiter = await client.start("lane-v", "k", "waiter")  # newest: version 2
        assert waiter.workflow_version == "2"
        await client.signal("holder", "go", "done")
        assert await client.result("holder", timeout=30) == "done"
        await client.start("lane-v", "k2", "other", version="1")  # (a later poll of old's)
        await client.signal("other", "go", "x")
        assert await client.result("other", timeout=30) == "x"
        waiter = await client.get_run("waiter")
        assert (waiter.status, waiter.admitted, waiter.lease_owner) == (
            RunStatus.PENDING,
            False,
            None,
        )
        assert (await client.history("waiter")).types == ["run_started"]
        async with Engine(store, [LaneV1, LaneV2], instance_id="new", poll_interval=0.05):
            assert await client.result("waiter", timeout=30) == "v2:here"


async def test_a_worker_that_stops_cleanly_serves_nothing_at_once(backend: Backend) -> None:
    """A worker that stops cleanly (``engine.stop``, a drain) leaves an entry with no version:
    a run of a version no other live worker has is said to wait at once (not once the
    entry is 5 minutes old); one that crashes stays seen (it may be back)."""
    from flowkit._worker.worker import no_live_worker

    store = backend.store
    client = Engine(store, [GreetV1, GreetV2], worker=False)
    for stop in ("stop", "crash"):
        engine = Engine(store, [GreetV1], instance_id="w", poll_interval=0.05)
        engine2 = Engine(store, [GreetV1, GreetV2], instance_id="w2", poll_interval=0.05)
        await engine.start_worker()
        await engine2.start_worker()
        await _until_known(store, {"w": ((NAME, "1"),), "w2": ((NAME, "1"), (NAME, "2"))})
        await (engine2.stop() if stop == "stop" else engine2.crash())
        run = await client.start(NAME, 1, f"after-{stop}")  # (v2: only "w2" had it)
        seen = {w.instance_id: w.versions for w in await store.workers()}
        missing = await no_live_worker(store, [run], client.config.clock.now())
        if stop == "stop":
            assert seen["w2"] == () and missing == {run.id}
            with pytest.raises(ResultTimeoutError) as err:
                await client.result(run.id, timeout=0.1)
            assert "no worker with workflow 'greet' version '2' has been seen" in str(err.value)
        else:
            assert seen["w2"] == ((NAME, "1"), (NAME, "2")) and missing == set()
        await engine.stop()
        assert {w.instance_id: w.versions for w in await store.workers()}["w"] == ()
        assert (await client.get_run(run.id)).status is RunStatus.PENDING


class _SlowRecords(MemoryStore):
    """A store whose worker entries take a few turns of the loop to land, and land even when
    their caller is cancelled (as ``SqlStore``'s, written on an I/O thread): it notes how many
    were still in flight when a worker wrote its entry with no version."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = 0
        self.landed: list[tuple[str, Any]] = []
        self.pending_at_gone: list[int] = []
        self.started = asyncio.Event()
        self._writes: set[asyncio.Task[None]] = set()

    async def record_worker(self, instance_id: str, versions: Any, now: float) -> None:
        if not versions:
            self.pending_at_gone.append(self.in_flight)
            await super().record_worker(instance_id, versions, now)
            self.landed.append((instance_id, ()))
            return
        self.in_flight += 1
        self.started.set()
        write = asyncio.ensure_future(self._write(instance_id, versions, now))
        self._writes.add(write)
        await asyncio.shield(write)  # (a cancelled caller: the write goes on)

    async def _write(self, instance_id: str, versions: Any, now: float) -> None:
        for _ in range(20):  # (the write's own time on the wire)
            await asyncio.sleep(0)
        await super().record_worker(instance_id, versions, now)
        self.landed.append((instance_id, tuple(versions)))
        self.in_flight -= 1

    async def settle(self) -> None:
        await asyncio.gather(*self._writes)


async def test_a_worker_stopping_while_its_entry_is_written_ends_with_no_version() -> None:
    """A worker stopped while its entry (the one written at its start, or a refresh) is still
    being written waits for that write before it writes its entry with no version: the last
    write says it runs nothing (the other way round, it would count as live with its versions
    for ``WORKER_SEEN_WINDOW``)."""
    store = _SlowRecords()
    engine = Engine(store, [GreetV1], instance_id="w")
    await engine.start_worker()
    await store.started.wait()  # (its start's entry is on its way)
    await engine.stop()
    await store.settle()
    assert store.pending_at_gone == [0]
    assert store.landed[-1] == ("w", ())
    assert [w.versions for w in await store.workers()] == [()]


async def _until_known(store: Any, want: dict[str, Any]) -> None:
    """Wait (bounded) until the workers' entries read ``want`` (each worker makes itself
    known from a task of its own, at its start)."""
    for _ in range(3000):
        if {w.instance_id: w.versions for w in await store.workers()} == want:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never known: {want}")


# -- the index ---------------------------------------------------------------------------------


async def test_the_due_runs_of_some_versions_are_read_by_index(sql_backend: Backend) -> None:
    """A worker with some versions only finds its due runs through ``ix_flowkit_runs_version``
    (not a scan of the other versions' runs): the plan of its ``due_runs`` read on both
    databases (SQLite is told to; PostgreSQL picks it once the table has statistics)."""
    s = sql_backend.store
    for i in range(300):
        await put(s, dataclasses.replace(mk(f"old{i:03d}", t=T0 + i), workflow_version="1"))
    for i in range(3):
        await put(s, dataclasses.replace(mk(f"new{i}", t=T0 + i), workflow_version="2"))
    sql = s._sql
    params = sql.params(now=T0 + 1000, limit=10)
    sql.versions_params(params, "vers", [("wf", "2")])
    with s._db.tx() as conn:
        if sql_backend.name == "postgres":
            conn.exec_driver_sql("ANALYZE flowkit_runs")
            plan = conn.exec_driver_sql("EXPLAIN " + sql.due_runs_vers, params).scalars().all()
        else:
            q = "EXPLAIN QUERY PLAN " + sql.due_runs_vers
            plan = [r[-1] for r in conn.exec_driver_sql(q, params)]
    assert any("ix_flowkit_runs_version" in line for line in plan), plan
    assert sorted(await s.due_runs(T0 + 1000, 10, versions=[("wf", "2")])) == [
        "new0",
        "new1",
        "new2",
    ]


# -- the CLI -------------------------------------------------------------------------------------


async def test_runs_and_show_say_when_no_worker_has_a_runs_version(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'flowkit.db'}"
    store = SqlStore(url)
    try:
        client = Engine(store, [GreetV1, GreetV2], worker=False, clock=SystemClock())
        async with Engine(store, [GreetV1], instance_id="old", poll_interval=0.05):
            await client.start(NAME, 1, "one", version="1")
            assert await client.result("one", timeout=30) == 2
            await client.start(NAME, 1, "two")
            await client.start(NAME, 2, "two-b")
            out = flowkit(tmp_path, "--db", url, "runs")
            assert out.returncode == 0, out.stderr
            lines = {ln.split()[0]: ln for ln in out.stdout.splitlines() if ln.strip()}
            assert "no worker with greet v2 seen" in lines["two"]
            assert "no worker with greet v2 seen" in lines["two-b"]
            assert "no worker" not in lines["one"]
            shown = flowkit(tmp_path, "--db", url, "show", "two")
            assert shown.returncode == 0, shown.stderr
            assert "no worker with workflow 'greet' version '2' has been seen" in shown.stdout
            assert "no worker" not in flowkit(tmp_path, "--db", url, "show", "one").stdout
            async with Engine(store, [GreetV1, GreetV2], instance_id="new", poll_interval=0.05):
                assert await client.result("two", timeout=30) == "v2:1:here"
                await client.start(NAME, 3, "three")
                await wait_for(client, "three", lambda r: r.status.terminal)
                out = flowkit(tmp_path, "--db", url, "runs")
                assert "no worker" not in out.stdout
    finally:
        store.close()


# -- workers make themselves known -------------------------------------------------------------


class _BrokenRecords(MemoryStore):
    """A store whose ``record_worker`` always fails."""

    async def record_worker(self, instance_id: str, versions: Any, now: float) -> None:
        raise RuntimeError("no table")


class _OldClaims(MemoryStore):
    """A custom store written before versions: ``claim`` with the older signature."""

    async def claim(  # type: ignore[override]
        self, run_id: str, owner: str, now: float, lease_expires: float
    ) -> Any:
        return await super().claim(run_id, owner, now, lease_expires)


async def test_a_worker_makes_itself_known_at_start_and_every_minute() -> None:
    async with TestEnv([GreetV1(), GreetV2()]) as env:
        t0 = env.clock.now()
        [seen] = await env.store.workers()
        assert (seen.instance_id, seen.versions, seen.last_seen) == (
            "instance-0",
            ((NAME, "1"), (NAME, "2")),
            t0,
        )
        await env.advance(WORKER_REFRESH + 15)  # (at a lease renewal past the minute)
        [seen] = await env.store.workers()
        assert t0 + WORKER_REFRESH <= seen.last_seen <= t0 + WORKER_REFRESH + 15


async def test_a_failed_record_is_logged_not_fatal(caplog: pytest.LogCaptureFixture) -> None:
    async with TestEnv([GreetV1()], store=_BrokenRecords()) as env:
        await env.start(NAME, 1, "r")
        assert await env.result("r") == 2
    assert any("could not make worker" in r.getMessage() for r in caplog.records)


async def test_a_store_without_the_capabilities_still_runs_each_version_where_it_is() -> None:
    """An older custom store: the worker lists due runs by name, claims, and gives a run of a
    version it lacks back (the run waits for a worker with it); a ``CodecStore`` over it does
    not claim the capabilities, and refuses their calls."""
    store = _OldClaims()
    assert not claims_by_version(store)
    wrapped = CodecStore(store, AESGCMCodec([("k1", bytes(range(32)))]))
    assert not wrapped.claims_by_version and wrapped.records_workers
    with pytest.raises(TypeError, match="claims_by_version"):
        await wrapped.due_runs(T0, 10, versions=[(NAME, "1")])
    async with TestEnv([GreetV1()], store=store) as env:
        client = Engine(env.store, [GreetV1, GreetV2], worker=False, clock=env.clock)
        await client.start(NAME, 5, "v2")
        await client.start(NAME, 5, "v1", version="1")
        await env.settle()
        assert await env.result("v1") == 6
        run = await env.get_run("v2")
        assert (run.status, run.lease_owner, run.workflow_version) == (RunStatus.RUNNING, None, "2")
        assert (await env.history("v2")).types == ["run_started"]


async def test_a_run_is_served_by_the_workers_of_its_namespace(backend: Backend) -> None:
    """``flowkit runs`` reads every namespace through an unscoped store: a run counts as
    served by a worker of its own namespace (or an unscoped one), not by one of another."""
    from flowkit._worker.worker import no_live_worker

    store = backend.store
    tenant_a, tenant_b = store.scoped("tenant-a"), store.scoped("tenant-b")
    await put(tenant_a, dataclasses.replace(mk("a1"), workflow=NAME, namespace="tenant-a"))
    await put(tenant_b, dataclasses.replace(mk("b1"), workflow=NAME, namespace="tenant-b"))
    await tenant_a.record_worker("worker-a", [(NAME, "1")], T0)
    runs = await store.list_runs()
    assert {w.namespace for w in await store.workers()} == {"tenant-a"}
    assert [w.instance_id for w in await tenant_b.workers()] == []
    assert await no_live_worker(store, runs, T0 + 1) == {"b1"}
    await store.record_worker("everywhere", [(NAME, "1")], T0)  # an unscoped worker
    assert await no_live_worker(store, runs, T0 + 1) == set()
