"""Group commit: concurrent writes share one transaction, each call keeps its own atomicity
and errors (clean failures, failures after writing, a failed ``COMMIT``, a cancelled caller),
PostgreSQL's one-round-trip batches, a step's record alone and in a batch, and the
conformance kit with group commit on."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from store_kit import (
    T0,
    Backend,
    S,
    delta,
    fired,
    first_events,
    fresh_database,
    general_releases,
    mk,
    put,
    stats,
)

from flowkit.errors import (
    ConflictError,
    RunNotFoundError,
    StoreUnavailableError,
)
from flowkit.events import RunCompleted
from flowkit.stores.base import Notify, QueueCap, Update
from flowkit.stores.sql import (
    SqlStore,
)
from flowkit.stores.sql._database import Database
from flowkit.stores.sql._errors import root
from flowkit.stores.sql._group_commit import GroupCommit, Op
from flowkit_testing.conformance import CHECKS

ROOT = Path(__file__).resolve().parent.parent


# -- group commit ----------------------------------------------------------------------------


async def test_group_commit_runs_concurrent_writes_in_one_transaction(gc_backend: Backend) -> None:
    s = gc_backend.store
    assert s.group_commit and s.scoped("ns").group_commit
    runs = [mk(f"r{i}", t=T0 + i) for i in range(8)]
    before = stats(s)
    got = await asyncio.gather(*(s.create_run(r, first_events(r)) for r in runs))
    assert got == [(r, True) for r in runs]
    assert delta(s, before, "write_tx") == 1 and delta(s, before, "batched_ops") == 8
    before = stats(s)
    claimed = await asyncio.gather(*(s.claim(r.id, "w", T0 + 10, T0 + 40) for r in runs))
    assert all(c is not None and c.lease_owner == "w" for c in claimed)
    assert delta(s, before, "write_tx") == 1
    before = stats(s)
    results = await asyncio.gather(
        *(
            s.commit(r.id, "w", T0 + 11, Update(events=[fired(T0 + 11, str(j)) for j in range(i)]))
            for i, r in enumerate(runs)
        )
    )
    assert delta(s, before, "write_tx") == 1
    assert [res.seqs for res in results] == [tuple(range(2, 2 + i)) for i in range(8)]
    for i, r in enumerate(runs):
        assert [e.seq for e in await s.load_events(r.id)] == list(range(1, 2 + i))
    # the same writes one after another: each runs at once, in a transaction of its own
    before = stats(s)
    for r in runs:
        await s.commit(r.id, "w", T0 + 12, Update(events=[fired(T0 + 12, "x")]))
    assert delta(s, before, "write_tx") == 8 and delta(s, before, "batches") == 0


async def test_a_failing_call_does_not_affect_its_batch(gc_backend: Backend) -> None:
    s = gc_backend.store
    for rid in ("ok1", "ok2", "lost", "conflict", "sig"):
        await put(s, mk(rid, key="k" if rid == "ok1" else None))
        await s.claim(rid, "w", T0, T0 + 30)
    cap = QueueCap("wf", "singleton:full", "full", limit=1, max_queue_depth=0)
    await put(s, mk("holder", key="full"), queue_cap=cap)
    before = {rid: (await s.get_run(rid), await s.load_events(rid)) for rid in ("lost", "sig")}
    counts = stats(s)
    got = await asyncio.gather(
        s.commit("ok1", "w", T0 + 1, Update(events=[fired(T0 + 1)])),
        s.commit("lost", "someone-else", T0 + 1, Update(events=[fired(T0 + 1)])),
        s.commit(
            "conflict",
            "w",
            T0 + 1,
            Update(events=[fired(T0 + 1)], status=S.FAILED, expect_status=frozenset({S.PENDING})),
        ),
        s.commit("nope", "w", T0 + 1, Update(events=[fired(T0 + 1)])),
        s.commit("sig", "w", T0 + 1, Update(events=[fired(T0 + 1)], consume_signal=12345)),
        s.create_run(mk("over", key="full"), [], queue_cap=cap),
        s.deliver_signal("nope", "go", 1, T0 + 1),
        s.commit("ok2", "w", T0 + 1, Update(status=S.COMPLETED, events=[RunCompleted(at=T0 + 1)])),
        return_exceptions=True,
    )
    assert delta(s, counts, "batches") == 1 and delta(s, counts, "batch_retries") == 0
    assert [type(g).__name__ for g in got] == [
        "CommitResult",
        "LeaseLostError",
        "ConflictError",
        "RunNotFoundError",
        "ConflictError",
        "SingletonQueueFullError",
        "RunNotFoundError",
        "CommitResult",
    ]
    assert [e.seq for e in await s.load_events("ok1")] == [1, 2]
    done = await s.get_run("ok2")
    assert done is not None and done.status is S.COMPLETED
    for rid, (run, evs) in before.items():  # the failed calls wrote nothing
        assert await s.get_run(rid) == run and await s.load_events(rid) == evs
    conflict = await s.get_run("conflict")
    assert conflict is not None and conflict.status is S.RUNNING
    assert await s.get_run("over") is None and await s.get_run("nope") is None
    if gc_backend.name == "postgres":  # the misses re-ran (and failed) on their own
        assert delta(s, counts, "deferred") == 3


def _take_seq_2(url: str, run_id: str) -> None:
    """A foreign writer takes seq 2 of ``run_id``'s history (the run's next append then
    violates the primary key)."""
    from flowkit.stores.sql._schema import events

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.insert(events).values(
                    run_id=run_id, seq=2, type="timer_fired", at=T0, body={"type": "timer_fired"}
                )
            )
            # (on SQLite the flowkit_events_last_seq trigger moved last_seq past it: undo)
            conn.execute(
                sa.text("UPDATE flowkit_runs SET last_seq = 1 WHERE id = :id"), {"id": run_id}
            )
    finally:
        engine.dispose()


async def test_a_call_failing_after_it_wrote_reruns_the_batch_call_by_call(
    gc_backend: Backend,
) -> None:
    s = gc_backend.store
    for rid in ("a", "b", "c"):
        await put(s, mk(rid))
    assert gc_backend.url is not None
    _take_seq_2(gc_backend.url, "b")  # "b"'s append will violate the primary key
    counts = stats(s)
    got = await asyncio.gather(
        *(s.commit(rid, None, T0 + 1, Update(events=[fired(T0 + 1)])) for rid in "abc"),
        return_exceptions=True,
    )
    assert delta(s, counts, "batch_retries") == 1
    assert isinstance(got[1], ConflictError)  # (a unique key taken: typed, cause chained)
    assert isinstance(root(got[1].__cause__), s._db.dbapi_error)
    assert not isinstance(got[0], BaseException) and got[0].seqs == (2,)
    assert not isinstance(got[2], BaseException) and got[2].seqs == (2,)
    assert [e.type for e in await s.load_events("a")] == ["run_started", "timer_fired"]
    b = await s.get_run("b")
    assert b is not None and b.updated_at == T0  # rolled back: nothing of it was written


@pytest.mark.parametrize("one_statement", [True, False])
async def test_a_release_whose_queued_write_fails_reruns_the_batch_call_by_call(
    gc_backend: Backend, monkeypatch: pytest.MonkeyPatch, one_statement: bool
) -> None:
    """A release that fails in the database fails only itself. On the general path its
    writes and hand-off are queued and go out with the ``COMMIT`` of its group commit
    (PostgreSQL); a one-statement release fails in the batch's single round trip. Either
    way nothing of the batch took effect, and each call runs again on its own: the other
    release still hands its slot over; the failing one gets its error and wrote nothing (its
    waiter stays parked)."""
    if not one_statement:
        general_releases(monkeypatch)
    s = gc_backend.store
    for k in ("a", "b"):
        await put(s, mk(f"h{k}", key=k, t=T0))
        await put(s, mk(f"w{k}", key=k, t=T0 + 1))
        assert await s.try_admit_singleton(f"h{k}", f"singleton:{k}", "wf", 1, T0 + 1)
        assert not await s.try_admit_singleton(f"w{k}", f"singleton:{k}", "wf", 1, T0 + 50)
        assert await s.claim(f"h{k}", "x", T0 + 2, T0 + 32)
    assert gc_backend.url is not None
    _take_seq_2(gc_backend.url, "hb")  # "hb"'s release will violate the primary key
    before = await s.get_run("hb"), await s.get_run("wb")
    counts = stats(s)

    def release(k: str) -> Update:
        n = Notify("wf", f"singleton:{k}", 1, claim_owner="x", lease_expires=T0 + 40)
        return Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=n)

    got = await asyncio.gather(
        *(s.commit(f"h{k}", "x", T0 + 3, release(k)) for k in "ab"), return_exceptions=True
    )
    assert delta(s, counts, "batch_retries") == 1
    assert isinstance(got[1], ConflictError)  # (a unique key taken: typed, cause chained)
    assert isinstance(root(got[1].__cause__), s._db.dbapi_error)
    assert not isinstance(got[0], BaseException)
    assert [h.run.id for h in got[0].handed] == ["wa"]
    wa = await s.get_run("wa")
    assert wa is not None and wa.admitted and wa.lease_owner == "x"
    assert (await s.get_run("hb"), await s.get_run("wb")) == before


async def test_a_call_failing_clean_keeps_what_the_calls_before_it_queued(
    gc_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call of a group commit that fails before it wrote forgets only the statements it
    queued itself: a release earlier in the batch, whose writes and hand-off wait for the
    ``COMMIT`` (PostgreSQL's general path), still takes effect."""
    general_releases(monkeypatch)
    s = gc_backend.store
    await put(s, mk("ha", key="a", t=T0))
    await put(s, mk("wa", key="a", t=T0 + 1))
    assert await s.try_admit_singleton("ha", "singleton:a", "wf", 1, T0 + 1)
    assert not await s.try_admit_singleton("wa", "singleton:a", "wf", 1, T0 + 50)
    assert await s.claim("ha", "x", T0 + 2, T0 + 32)
    n = Notify("wf", "singleton:a", 1, claim_owner="x", lease_expires=T0 + 40)
    counts = stats(s)
    got = await asyncio.gather(
        s.commit(
            "ha",
            "x",
            T0 + 3,
            Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=n),
        ),
        s.commit("nope", "x", T0 + 3, Update(events=[fired(T0 + 3)])),
        return_exceptions=True,
    )
    assert delta(s, counts, "batches") == 1 and delta(s, counts, "batch_retries") == 0
    assert isinstance(got[1], RunNotFoundError)
    assert not isinstance(got[0], BaseException)
    assert [h.run.id for h in got[0].handed] == ["wa"]
    ha, wa = await s.get_run("ha"), await s.get_run("wa")
    assert ha is not None and ha.status is S.COMPLETED
    assert wa is not None and wa.admitted and wa.lease_owner == "x"
    assert [e.type for e in await s.load_events("ha")][-1] == "run_completed"


async def test_a_failed_commit_fails_every_call_of_the_batch(
    gc_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = gc_backend.store
    for rid in ("a", "b"):
        await put(s, mk(rid))
    dbapi = s._db.engine.dialect.loaded_dbapi
    conn = s._db.kind.conn  # (the dialect's connection class)
    real = conn.commit
    calls = []

    def failing_commit(self: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise dbapi.OperationalError("disk I/O error (injected)")
        real(self)

    monkeypatch.setattr(conn, "commit", failing_commit)
    # the general batch path (a batch of single statements goes out in one pipeline on
    # PostgreSQL: see the next test)
    monkeypatch.setattr(GroupCommit, "_single_batch", lambda self, c, ops: None)
    got = await asyncio.gather(
        s.commit("a", None, T0 + 1, Update(events=[fired(T0 + 1)])),
        s.claim("b", "w", T0 + 1, T0 + 31),
        return_exceptions=True,
    )
    # a failed COMMIT may have landed: not retried, typed, the driver's error chained
    assert [type(g) for g in got] == [StoreUnavailableError] * 2
    assert "injected" in str(got[0])
    assert [e.seq for e in await s.load_events("a")] == [1]
    b = await s.get_run("b")
    assert b is not None and b.lease_owner is None
    # the connection is still good
    assert (await s.claim("b", "w", T0 + 2, T0 + 32)) is not None


@pytest.mark.postgres
async def test_a_batch_of_single_statements_is_one_round_trip_and_a_failed_one_runs_again(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: concurrent single-statement calls (step records, claims) go out as BEGIN,
    their statements and COMMIT in one pipeline. When that transaction fails on the server
    (here a statement error injected into the pipeline: PostgreSQL then rolls it back),
    nothing of it was applied, and the calls run again the general way: each is applied
    exactly once."""
    import psycopg

    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url, group_commit=True)
    try:
        for rid in ("a", "b", "c"):
            await put(s, mk(rid))
        before = stats(s)
        got = await asyncio.gather(
            s.claim("a", "w", T0 + 1, T0 + 31),
            s.claim("b", "w", T0 + 1, T0 + 31),
            s.claim("c", "w", T0 + 1, T0 + 31),
        )
        assert all(r is not None and r.lease_owner == "w" for r in got)
        after = stats(s)
        assert after["single_batches"] - before["single_batches"] == 1
        assert after["write_tx"] - before["write_tx"] == 1

        real = psycopg.Cursor.execute
        broke: list[str] = []

        def failing(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
            # the first statement of the first pipelined batch fails on the server
            if self.connection._pipeline is not None and not broke and "flowkit_runs" in query:
                broke.append(query)
                return real(self, "SELECT 1/0", None)
            return real(self, query, params, **kw)

        monkeypatch.setattr(psycopg.Cursor, "execute", failing)
        res = await asyncio.gather(
            s.commit("a", "w", T0 + 2, Update(events=[fired(T0 + 2)])),
            s.commit("b", "w", T0 + 2, Update(events=[fired(T0 + 2)])),
        )
        monkeypatch.undo()
        assert broke, "the injected failure did not fire"
        assert [r.seqs for r in res] == [(2,), (2,)]
        for rid in ("a", "b"):
            assert [e.seq for e in await s.load_events(rid)] == [1, 2]  # once, not twice
    finally:
        s.close()


async def test_a_cancelled_caller_in_the_queue_writes_nothing(gc_backend: Backend) -> None:
    s = gc_backend.store
    await put(s, mk("a"))
    await put(s, mk("b"))
    t1 = asyncio.ensure_future(s.claim("a", "w", T0, T0 + 30))
    t2 = asyncio.ensure_future(s.claim("b", "w", T0, T0 + 30))
    await asyncio.sleep(0)  # both queued, the flush not run yet
    t1.cancel()
    assert (await t2) is not None
    with pytest.raises(asyncio.CancelledError):
        await t1
    a = await s.get_run("a")
    assert a is not None and a.lease_owner is None


def test_a_sequential_write_goes_to_the_write_lane_at_once(tmp_path: Path) -> None:
    """A write nothing could join is not held for a flush: it is on the write lane (the I/O
    thread) as soon as it is issued, and the loop is free while it runs. An in-memory
    database (one per connection) has no I/O thread: there it completes without yielding."""
    store = SqlStore(f"sqlite:///{tmp_path / 'seq.db'}", group_commit=True)
    memory = SqlStore("sqlite:///:memory:", group_commit=True)

    async def main() -> None:
        await put(store, mk("r"))
        loop = asyncio.get_running_loop()
        assert not getattr(loop, "_ready", [1])  # nothing else is ready to run
        coro = store.claim("r", "w", T0, T0 + 30)
        fut = coro.send(None)  # (it yields: the loop waits for the I/O thread)
        q = store._gc._queues[loop]
        assert q.busy and not q.pending and not q.scheduled  # sent, no flush scheduled
        await asyncio.wait([fut])
        with pytest.raises(StopIteration) as sent:
            coro.send(None)
        assert sent.value.value is not None and sent.value.value.lease_owner == "w"

        await put(memory, mk("r"))
        coro = memory.claim("r", "w", T0, T0 + 30)
        with pytest.raises(StopIteration) as done:  # completed within its first step
            coro.send(None)
        assert done.value.value is not None and done.value.value.lease_owner == "w"

    try:
        asyncio.run(main())
    finally:
        store.close()
        memory.close()


@pytest.mark.parametrize("check", list(CHECKS))
async def test_store_conforms_with_group_commit(
    gc_backend: Backend, check: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The conformance kit, with every store object group-committing."""
    opened: list[SqlStore] = []
    n = itertools.count()

    def fresh() -> SqlStore:
        if gc_backend.name == "sqlite":
            url = f"sqlite:///{tmp_path / f'conformance-{next(n)}.db'}"
        else:
            url = fresh_database(request.getfixturevalue("pg_server"), "flowkit_gc")
        st = SqlStore(url, group_commit=True)
        opened.append(st)
        return st

    async def pair() -> tuple[SqlStore, SqlStore]:
        a = fresh()
        b = SqlStore(a.url, group_commit=True)
        opened.append(b)
        return a, b

    try:
        await CHECKS[check].run(fresh, pair)
    finally:
        for st in opened:
            st.close()


# -- append_events: a running step's record ------------------------------------------------


async def test_append_events_is_one_statement_alone_and_shares_group_commits(
    gc_backend: Backend,
) -> None:
    """Alone, a step's record is one statement in autocommit (no BEGIN/COMMIT statements on
    SQLite, one round trip on PostgreSQL); concurrent ones share one transaction, each with
    its own seqs, and a miss (a run not ``running``) writes nothing in either case."""
    s = gc_backend.store
    runs = [mk(f"r{i}", t=T0 + i) for i in range(6)]
    for r in runs:
        await put(s, r)
        assert await s.claim(r.id, "w", T0 + 10, T0 + 40) is not None
    before = stats(s)
    assert await s.append_events("r0", "w", T0 + 11, [fired(T0 + 11)]) == (2,)
    assert delta(s, before, "statements") == 1 and delta(s, before, "single") == 1
    # alone and missing (another lease owner): nothing written, the caller commits instead
    assert await s.append_events("r0", "other", T0 + 11, [fired(T0 + 11, "x")]) is None
    assert [e.seq for e in await s.load_events("r0")] == [1, 2]
    # several events: PostgreSQL keeps one statement; SQLite reserves the seqs first
    assert await s.append_events(
        "r0", "w", T0 + 12, [fired(T0 + 12, "a"), fired(T0 + 12, "b")]
    ) == (3, 4)
    before = stats(s)
    got = await asyncio.gather(
        *(
            s.append_events(r.id, "w" if i != 3 else "other", T0 + 13, [fired(T0 + 13, "c")])
            for i, r in enumerate(runs)
        )
    )
    assert got == [(5,), (2,), (2,), None, (2,), (2,)]
    assert delta(s, before, "write_tx") == 1 and delta(s, before, "batched_ops") == 6
    assert [e.seq for e in await s.load_events("r0")] == [1, 2, 3, 4, 5]
    assert [getattr(e, "pos", None) for e in await s.load_events("r0")] == [
        None,
        "0",
        "a",
        "b",
        "c",
    ]
    assert [e.seq for e in await s.load_events("r3")] == [1]
    # the run row moved with them: a commit continues the numbering
    res = await s.commit("r1", "w", T0 + 14, Update(events=[fired(T0 + 14, "d")]))
    assert res.seqs == (3,) and res.run.updated_at == T0 + 14
    r1 = await s.get_run("r1")
    assert r1 is not None and r1.status is S.RUNNING and r1.lease_owner == "w"


async def test_calls_postponed_behind_releases_run_in_the_next_flush() -> None:
    """A flush holding a one-statement release postpones the calls that need more round trips
    to a flush of their own, right after it, once: a steady stream of releases (each handed
    run releases again) cannot keep them waiting."""
    db = Database("postgresql+psycopg://nobody@/flowkit?host=/nonexistent")
    # one write lane: each flush goes once the one before returned, so the flushes run in the
    # order they were formed and ``batches`` is the same on every run, however loaded the
    # machine (with several lanes, flushes formed one after the other run side by side)
    db.max_lanes["write"] = 1
    gc = GroupCommit(db)
    batches: list[list[str]] = []

    def run_batch(ops: list[Any]) -> list[Any]:  # (no server: the batching alone)
        batches.append([op.key for op in ops])
        return [(None, op.key) for op in ops]

    gc.run_batch = run_batch  # type: ignore[method-assign]

    def releasing(key: str) -> Any:
        return Op(lambda c, row: row, ("SELECT 1", {}, 4), key, single=bool, locks=("k",))

    async def releaser(i: int) -> None:
        for _ in range(50):
            await gc.write(releasing(f"r{i}"))

    async def start() -> Any:
        # issued in the same turn of the loop as the releasers' first writes: it joins their
        # flush, which postpones it
        return await gc.write(Op(lambda c, row: None, None, "s", locks=("k2",)))

    *_, got = await asyncio.gather(*(releaser(i) for i in range(4)), start())
    assert got == "s"  # (the fake batch answers each call with its key)
    releases = ["r0", "r1", "r2", "r3"]
    # the releases first, then the postponed start in a flush of its own, right after theirs
    # (ahead of the releases their callers issue next), then the stream of releases
    assert batches == [releases, ["s"]] + [releases] * 49
    db.dispose()
