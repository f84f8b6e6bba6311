"""A singleton release hands its slot over: to the oldest waiter, only waking it when it
cannot be handed, to as many waiters as slots are free, skipping a waiter another process took
or holds; an unreadable history; the key lock shared with a group commit; the reads limited to
the first waiters; the hand-offs of a batch in one round trip."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from store_kit import (
    T0,
    TAG,
    Backend,
    S,
    delta,
    fired,
    first_events,
    fresh_database,
    gated,
    gated_and_another,
    general_releases,
    mk,
    put,
    release,
    stats,
)

from flowkit import ADMITTED_TAG, Run, RunStatus
from flowkit.events import RunCompleted, RunStarted
from flowkit.singleton import HEAD_RECHECK
from flowkit.stores import MemoryStore
from flowkit.stores.base import Admission, Notify, Update
from flowkit.stores.sql import (
    SqlStore,
    _runs,
)
from flowkit.stores.sql._commit import Commits
from flowkit.stores.sql._group_commit import GroupCommit, Op
from flowkit.stores.sql._postgres import PgConn
from flowkit.stores.sql._sqlite import SqliteStatements

ROOT = Path(__file__).resolve().parent.parent


# -- singleton hand-off on release ---------------------------------------------------------


async def test_release_hands_the_slot_to_the_oldest_waiter(backend: Backend) -> None:
    s = backend.store
    await gated(s)
    res = await s.commit("h", "x", T0 + 3, release())
    assert res.run.status is S.COMPLETED and not res.run.admitted
    assert res.woken == ()
    (hand,) = res.handed
    w1 = hand.run
    assert w1.id == "w1" and w1.admitted and w1.tags == (TAG, ADMITTED_TAG)
    assert w1.status is S.RUNNING and w1.wake_at is None and w1.updated_at == T0 + 3
    assert (w1.lease_owner, w1.lease_expires) == ("x", T0 + 40)
    assert list(hand.events) == await s.load_events("w1")
    # its admission is recorded in the releasing transaction, at the release's time
    assert [e.type for e in hand.events] == ["run_started", "singleton_admitted"]
    assert (hand.events[-1].seq, hand.events[-1].at) == (2, T0 + 3)
    assert await s.get_run("w1") == w1  # persisted in the releasing transaction
    w2 = await s.get_run("w2")
    assert w2 is not None and not w2.admitted and w2.status is S.SUSPENDED
    # w2 is the head now: the release gave it its re-check timer (it had none behind w1)
    assert w2.wake_at == T0 + 3 + HEAD_RECHECK
    assert await s.claim("w1", "y", T0 + 4, T0 + 34) is None  # leased to the releaser
    assert [r.id for r in await s.list_runs(tag=ADMITTED_TAG)] == ["w1"]


async def test_release_without_claim_owner_only_wakes(backend: Backend) -> None:
    s = backend.store
    await gated(s)
    res = await s.commit("h", "x", T0 + 3, release(owner=None))
    assert res.handed == () and res.woken == ("w1",)
    w1 = await s.get_run("w1")
    assert w1 is not None and not w1.admitted and w1.wake_at == T0 + 3


async def test_a_waiter_leased_by_someone_else_is_not_handed_over(backend: Backend) -> None:
    s = backend.store
    await gated(s)
    taken = await s.claim("w1", "y", T0 + 50, T0 + 80)  # another instance re-checks it
    assert taken is not None
    res = await s.commit("h", "x", T0 + 51, release())
    assert res.handed == () and res.woken == ("w1",)
    w1 = await s.get_run("w1")
    assert w1 == taken  # left to admit itself: not admitted, still leased to "y"


async def test_two_free_slots_hand_two_waiters(backend: Backend) -> None:
    s = backend.store
    await gated(s)
    res = await s.commit("h", "x", T0 + 3, release(limit=2))
    assert [h.run.id for h in res.handed] == ["w1", "w2"]
    assert all(h.run.admitted and h.run.lease_owner == "x" for h in res.handed)


async def test_a_waiter_lost_to_a_race_is_woken_not_handed(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the releasing transaction's read of the key's runs and its hand-off, another
    process's poller claims the waiter (possible on PostgreSQL, which does not lock the
    waiter rows): the conditional hand-off misses, the waiter is only woken. (The general
    path; PostgreSQL's one-statement release: the test below.)"""
    s = sql_backend.store
    await gated(s)
    real = Commits.hand_off
    general_releases(monkeypatch)

    def racing(self: Commits, c: Any, waiter: Run, admitted: Run, now: float, *a: Any) -> Any:
        c.write(
            "UPDATE flowkit_runs SET status = 'running', lease_owner = 'other', "
            "lease_expires = 9999999999.0, wake_at = NULL WHERE id = 'w1'",
            {},
        )
        return real(self, c, waiter, admitted, now, *a)

    monkeypatch.setattr(Commits, "hand_off", racing)
    res = await s.commit("h", "x", T0 + 3, release())
    monkeypatch.undo()
    assert res.handed == () and res.woken == ("w1",)
    w1 = await s.get_run("w1")
    assert w1 is not None and not w1.admitted and w1.lease_owner == "other"
    assert [r.id for r in await s.list_runs(tag=ADMITTED_TAG)] == []


@pytest.mark.postgres
async def test_a_one_statement_release_skips_a_waiter_another_transaction_holds(
    request: pytest.FixtureRequest,
) -> None:
    """PostgreSQL's one-statement release (``release_fast``) plans on its snapshot; when
    another transaction holds the waiter's row (a poller's claim in flight) it does not wait
    for it: the hand-off misses, the release commits, and the waiter is only woken (after the
    commit: a hint, skipped too while the row is held). The claim then commits as usual."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        await gated(s)
        with engine.connect() as conn:
            tx = conn.begin()
            conn.execute(
                sa.text(
                    "UPDATE flowkit_runs SET status = 'running', lease_owner = 'other',"
                    " lease_expires = 9999999999.0, wake_at = NULL WHERE id = 'w1'"
                )
            )
            res = await s.commit("h", "x", T0 + 3, release())
            tx.commit()
        assert res.run.status is S.COMPLETED and not res.run.admitted
        assert res.handed == () and res.woken == ("w1",)
        w1 = await s.get_run("w1")
        assert w1 is not None and not w1.admitted and w1.lease_owner == "other"
        assert [r.id for r in await s.list_runs(tag=ADMITTED_TAG)] == []
        assert [e.type for e in await s.load_events("h")][-1] == "run_completed"
    finally:
        engine.dispose()
        s.close()


@pytest.mark.parametrize("owner", [None, "me"])
async def test_a_waiter_whose_history_cannot_be_read_is_woken_not_handed(
    sql_backend: Backend, owner: str | None
) -> None:
    """The hand-off reads the waiter's history inside the holder's release (in the round trip
    of its conditional update); an event this code cannot parse (a newer flowkit's, a damaged
    row) must not fail the release: the hand-off is undone and the waiter only woken. (With
    the holder's lease owner, PostgreSQL releases in one statement (``release_fast``), and
    SQLite the lean way (``release_lite``), which reads the history before it hands.)"""
    store = sql_backend.store
    h = Run(
        id="h", workflow="lane", workflow_version="1", status=RunStatus.PENDING, input=None,
        tags=("singleton:k",), created_at=T0, updated_at=T0, singleton_key="k",
    )  # fmt: skip
    w = replace(h, id="w", created_at=T0 + 1, updated_at=T0 + 1)
    await store.create_run(h, [RunStarted(workflow="lane", version="1", input=None, at=T0)])
    await store.create_run(w, [RunStarted(workflow="lane", version="1", input=None, at=T0 + 1)])
    assert await store.try_admit_singleton("h", "singleton:k", "lane", 1, T0 + 5)
    assert not await store.try_admit_singleton("w", "singleton:k", "lane", 1, T0 + 50)
    parked = await store.get_run("w")
    with store._db.tx() as conn:
        conn.exec_driver_sql(
            'UPDATE flowkit_events SET body = \'{"type": "from_the_future"}\''
            " WHERE run_id = 'w' AND seq = 1"
        )
    if owner is not None:
        assert await store.claim("h", owner, T0 + 1, T0 + 30)
    n = Notify("lane", "singleton:k", 1, claim_owner="me", lease_expires=T0 + 100)
    update = Update(events=[RunCompleted(at=T0 + 2)], status=RunStatus.COMPLETED, notify=n)
    res = await store.commit("h", owner, T0 + 2, update)
    assert (res.run.status, res.handed, res.woken) == (RunStatus.COMPLETED, (), ("w",))
    got = await store.get_run("w")
    assert parked is not None and got is not None
    # exactly the parked waiter, woken: not admitted, not leased, due now
    assert got == replace(parked, wake_at=T0 + 2)


@pytest.mark.postgres
async def test_a_release_shares_a_group_commit_and_its_key_lock_comes_first(
    request: pytest.FixtureRequest,
) -> None:
    """PostgreSQL: a release takes its key's advisory lock, declared in ``Op.locks``, before
    any row lock of its transaction, so it can share a group commit with other calls (one
    transaction, one COMMIT) instead of running alone; a lock a call did not declare is
    refused, as it would come after the batch's row locks."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url, group_commit=True)
    try:
        await gated_and_another(s)
        before = stats(s)
        stepped, released, claimed = await asyncio.gather(
            s.commit("other", "x", T0 + 3, Update(events=[fired(T0 + 3)])),
            s.commit("h", "x", T0 + 3, release()),
            s.claim("w2", "y", T0 + 60, T0 + 90),
        )
        after = stats(s)
        assert after["write_tx"] - before["write_tx"] == 1  # all three in one transaction
        assert after["batched_ops"] - before["batched_ops"] == 3
        assert stepped.seqs == (2,)
        assert [h.run.id for h in released.handed] == ["w1"]
        assert claimed is not None and claimed.lease_owner == "y"
        assert (await s.get_run("w1")) == released.handed[0].run

        def undeclared(c: Any, _: Any) -> None:
            c.lock("not declared")

        with pytest.raises(AssertionError, match="not declared"):
            await s._gc.write(Op(undeclared, None, "x"))
    finally:
        s.close()


async def _deep_key_counting_reads(s: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Key ``k`` held by ``h`` with six waiters ``w1``..``w6`` behind it; from here on, the
    number of rows each ``_runs.split`` (a key's admission or release read) is given."""
    await put(s, mk("h", key="k", t=T0))
    for i in range(1, 7):
        await put(s, mk(f"w{i}", key="k", t=T0 + i))
    assert await s.try_admit_singleton("h", TAG, "wf", 1, T0 + 1)
    read: list[int] = []
    real = _runs.split

    def counting(found: Any, tag: str) -> Any:
        read.append(len(found))
        return real(found, tag)

    monkeypatch.setattr(_runs, "split", counting)
    return read


async def test_admission_and_release_read_only_the_holders_and_the_first_waiters(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admission check or a release reads the key's holders and only as many of its oldest
    waiters as slots can be free (a key with a deep queue costs what a short one does); a
    waiter behind them still decides about itself: denied and parked with its new re-check."""
    s = sql_backend.store
    read = await _deep_key_counting_reads(s, monkeypatch)
    assert not await s.try_admit_singleton("w6", TAG, "wf", 1, T0 + 50)
    # its own row, the holder and the limit + 1 oldest waiters (not w3..w5): the head, and
    # the waiter behind it, which becomes the head when the head is admitted and gets its
    # re-check timer in that transaction (no extra statement: one more index entry)
    assert read == [4]
    w6 = await s.get_run("w6")
    # (a first denial: parked with its re-check timer wherever it stands, docs/singleton.md)
    assert w6 is not None and (w6.status, w6.wake_at) == (S.SUSPENDED, T0 + 50)
    assert await s.claim("h", "x", T0 + 2, T0 + 32)
    if sql_backend.name != "postgres":  # (SQLite's lean release reads one waiter: LIMIT 1)
        monkeypatch.setattr(SqliteStatements, "release_lite", lambda *a: None)
    res = await s.commit("h", "x", T0 + 3, release())
    assert [h.run.id for h in res.handed] == ["w1"]
    if sql_backend.name == "postgres":  # one statement, which reads two waiters (LIMIT 2)
        assert read == [4]  # (the admission's read above: the release reads no rows here)
    else:
        assert read[1] == 3  # the holder's row, itself as a holder, the oldest waiter


@pytest.mark.postgres
async def test_a_release_does_not_wait_for_the_calls_of_its_batch_that_need_more_round_trips(
    request: pytest.FixtureRequest,
) -> None:
    """PostgreSQL: a one-statement release issued with calls that need more round trips (a
    start with its admission) commits in a transaction of its own and its caller resumes
    first; the other calls commit right after, in a flush of their own, and are applied as
    usual."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url, group_commit=True)
    try:
        await gated(s)
        done: list[str] = []

        async def tagged(name: str, call: Any) -> Any:
            got = await call
            done.append(name)
            return got

        new = mk("n", key="other", t=T0 + 5)
        admission = Admission("wf", "singleton:other", 1, T0 + 50, ())
        before = stats(s)
        released, (created, fresh) = await asyncio.gather(
            tagged("release", s.commit("h", "x", T0 + 3, release())),
            tagged("start", s.create_run(new, first_events(new), admission=admission)),
        )
        assert done == ["release", "start"]
        assert delta(s, before, "single_batches") == 1  # the release, alone
        assert delta(s, before, "write_tx") == 2
        assert [h.run.id for h in released.handed] == ["w1"]
        assert fresh and created.admitted
        assert (await s.get_run("n")) == created
    finally:
        s.close()


@pytest.mark.postgres
@pytest.mark.parametrize("one_statement", [True, False])
async def test_the_hand_offs_of_a_group_commit_share_one_round_trip(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, one_statement: bool
) -> None:
    """PostgreSQL: the releases of one group commit share round trips: each one-statement
    release (``PgStatements.release_fast``) with the batch's ``BEGIN``, locks and ``COMMIT`` in one;
    on the general path, the hand-offs (the conditional update, the waiter's history, the
    wake-up of a miss) go together with the ``COMMIT`` after the batch's first statements.
    Each release still gets its own hand-off, and a miss (a waiter another process took
    meanwhile) is woken."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url, group_commit=True)
    other = SqlStore(url)
    keys = ["a", "b", "c", "d"]
    try:
        for i, k in enumerate(keys):
            await put(s, mk(f"h{k}", key=k, t=T0 + i))
            await put(s, mk(f"w{k}", key=k, t=T0 + 10 + i))
            assert await s.try_admit_singleton(f"h{k}", f"singleton:{k}", "wf", 1, T0 + 1)
            assert not await s.try_admit_singleton(f"w{k}", f"singleton:{k}", "wf", 1, T0 + 50)
            assert await s.claim(f"h{k}", "x", T0 + 20, T0 + 60)
        trips: list[str] = []
        real_pipeline, real_firsts = PgConn._pipeline, PgConn.pipeline_firsts
        real_commit = PgConn.commit

        def pipeline(self: Any, stmts: Any, *, commit: bool = False) -> Any:
            if not commit:  # (a COMMIT with queued statements: counted below)
                trips.append("pipeline")
            return real_pipeline(self, stmts, commit=commit)

        def commit(self: Any) -> None:
            trips.append("COMMIT")
            real_commit(self)

        def firsts(self: Any, stmts: Any, *, commit: bool = False) -> Any:
            trips.append("firsts")
            return real_firsts(self, stmts, commit=commit)

        monkeypatch.setattr(PgConn, "_pipeline", pipeline)
        monkeypatch.setattr(PgConn, "pipeline_firsts", firsts)
        monkeypatch.setattr(PgConn, "commit", commit)
        if not one_statement:
            general_releases(monkeypatch)
        # another process's poller takes wd (parked, due at T0+50) before the release
        assert await other.claim("wd", "y", T0 + 51, T0 + 90) is not None

        def release(k: str) -> Update:
            n = Notify("wf", f"singleton:{k}", 1, claim_owner="x", lease_expires=T0 + 99)
            return Update(events=[RunCompleted(at=T0 + 52)], status=S.COMPLETED, notify=n)

        got = await asyncio.gather(*(s.commit(f"h{k}", "x", T0 + 52, release(k)) for k in keys))
        if one_statement:
            # 1 round trip for 4 releases: BEGIN, their key locks, each release in one
            # statement (``PgStatements.release_fast``) and the COMMIT
            assert trips == ["firsts"]
        else:
            # the general path, 2: their first statements, then their writes and hand-offs
            # with the COMMIT
            assert trips == ["firsts", "COMMIT"]
        for k, res in zip(keys[:3], got[:3], strict=True):
            assert res.woken == () and [h.run.id for h in res.handed] == [f"w{k}"]
            (hand,) = res.handed
            assert hand.run.admitted and hand.run.lease_owner == "x"
            assert list(hand.events) == await s.load_events(f"w{k}")
            assert await s.get_run(f"w{k}") == hand.run
        assert got[3].handed == () and got[3].woken == ("wd",)
        wd = await s.get_run("wd")
        assert wd is not None and wd.lease_owner == "y" and not wd.admitted
    finally:
        s.close()
        other.close()


async def test_a_commit_that_hands_its_own_run_a_slot_writes_its_changes_first(
    sql_backend: Backend,
) -> None:
    """A notify commit of the oldest waiter itself (limit 2, both slots free) hands a slot to
    itself and one to the other waiter; its own changes (its event) are written before its
    own hand-off, as MemoryStore applies them, and the hand-off returns its history with it."""
    results = []
    for store in (sql_backend.store, MemoryStore()):
        for rid in ("w1", "w2"):  # two parked waiters (as a denial leaves them)
            t = T0 + (1 if rid == "w1" else 2)
            await put(store, mk(rid, key="k", t=t, status=S.SUSPENDED, wake_at=T0 + 50))
        n = Notify("wf", TAG, 2, claim_owner="me", lease_expires=T0 + 40)
        res = await store.commit("w1", None, T0 + 3, Update(events=[fired(T0 + 3)], notify=n))
        handed = {h.run.id: (h.run, [e.type for e in h.events]) for h in res.handed}
        rows = [await store.get_run(r) for r in ("w1", "w2")]
        results.append((handed, rows, [e.type for e in await store.load_events("w1")]))
    sql, memory = results
    assert sql == memory
    # (its own hand-off records its admission after its own event)
    assert sql[0]["w1"][1] == ["run_started", "timer_fired", "singleton_admitted"]


@pytest.mark.postgres
async def test_a_one_statement_release_that_fails_after_writing_rolls_its_batch_back(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: when a batch takes the general way, a one-statement release whose result
    cannot be made after its statement wrote (here an injected error) counts as a call that
    wrote: the batch rolls back and reruns call by call, so nothing is left committed that its
    caller was told failed."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url, group_commit=True)
    try:
        await gated_and_another(s)
        monkeypatch.setattr(GroupCommit, "_single_batch", lambda self, c, ops: None)
        real = Commits.fast_released
        calls: list[int] = []

        def failing_once(self: Commits, *a: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("injected")
            return real(self, *a)

        monkeypatch.setattr(Commits, "fast_released", failing_once)
        counts = stats(s)
        released, stepped = await asyncio.gather(
            s.commit("h", "x", T0 + 3, release()),
            s.commit("other", "x", T0 + 3, Update(events=[fired(T0 + 3)])),
        )
        assert delta(s, counts, "batch_retries") == 1
        assert [h.run.id for h in released.handed] == ["w1"]
        assert stepped.seqs == (2,)
        assert [e.type for e in await s.load_events("h")].count("run_completed") == 1
    finally:
        s.close()


async def test_an_admission_at_creation_reads_the_holders_and_the_first_waiters_only(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``create_run`` with an ``Admission`` behind a deep queue reads the key's holders and its
    ``limit`` oldest waiters, not the whole queue (``engine.start`` on a key with 10,000
    waiters costs what it costs on a short one), and decides exactly as before: gated, with
    its re-check timer (a first denial); FIFO holds for a run created older than the queue."""
    s = sql_backend.store
    read = await _deep_key_counting_reads(s, monkeypatch)
    adm = Admission("wf", TAG, 1, T0 + 60, ())
    new = replace(mk("new", key="k", t=T0 + 50), status=S.PENDING)
    stored, created = await s.create_run(new, [], admission=adm)
    assert created and read == [2]  # the holder and the oldest waiter (not w2..w6)
    assert (stored.status, stored.wake_at, stored.admitted) == (S.SUSPENDED, T0 + 60, False)
    # the holder settles unnotified: a run created older than every waiter is admitted first
    await s.commit("h", None, T0 + 51, Update(events=[], status=S.COMPLETED))
    old = replace(mk("old", key="k", t=T0 - 5), status=S.PENDING)
    stored, _ = await s.create_run(old, [], admission=Admission("wf", TAG, 1, T0 + 61, ()))
    assert stored.admitted and read[-1] == 1  # (no holder: the oldest waiter, w1)
