"""Store behaviour, checked the same way on MemoryStore, SqlStore on a SQLite file and SqlStore
on a throwaway PostgreSQL (tests/pg.py): creation, claims and leases, signals, timers,
singleton admission, namespaces, exact timestamps and payloads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from store_kit import (
    T0,
    TAG,
    Backend,
    S,
    fired,
    first_events,
    mk,
    put,
)

from flowkit import ADMITTED_TAG, History
from flowkit.errors import (
    LeaseLostError,
    RunIdTakenError,
    RunNotFoundError,
    SingletonQueueFullError,
)
from flowkit.events import RunCompleted
from flowkit.stores.base import ConflictError, Notify, QueueCap, Store, Update
from flowkit.stores.sql import (
    SqlStore,
)

ROOT = Path(__file__).resolve().parent.parent


# -- create_run ----------------------------------------------------------------------------


async def test_create_run_is_idempotent(backend: Backend) -> None:
    s = backend.store
    run = await put(s, mk("r1"))
    assert run == await s.get_run("r1")
    again, created = await s.create_run(replace(mk("r1"), input={"other": True}), [])
    assert not created and again == run
    assert [e.seq for e in await s.load_events("r1")] == [1]
    # another store object on the same data agrees
    again2, created2 = await backend.another().create_run(mk("r1"), first_events(mk("r1")))
    assert not created2 and again2 == run


async def test_queue_cap_rejection_writes_nothing(backend: Backend) -> None:
    s = backend.store
    cap = QueueCap("wf", TAG, "k", limit=1, max_queue_depth=1)
    await put(s, mk("a", key="k"), queue_cap=cap)
    await put(s, mk("b", key="k", t=T0 + 1), queue_cap=cap)
    await put(s, mk("other", key="k2"), queue_cap=replace(cap, tag="singleton:k2", key="k2"))
    with pytest.raises(SingletonQueueFullError) as ei:
        await s.create_run(mk("c", key="k", t=T0 + 2), first_events(mk("c")), queue_cap=cap)
    assert (ei.value.workflow, ei.value.key, ei.value.max_queue_depth) == ("wf", "k", 1)
    assert await s.get_run("c") is None
    with pytest.raises(RunNotFoundError):
        await s.load_events("c")
    assert [r.id for r in await s.list_runs(tag=TAG)] == ["a", "b"]
    # an idempotent re-start of an existing id returns it even at capacity
    existing, created = await s.create_run(mk("a", key="k"), [], queue_cap=cap)
    assert not created and existing.id == "a"
    # a settled run frees its place in the queue
    await s.commit("a", None, T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED))
    await put(s, mk("c", key="k", t=T0 + 2), queue_cap=cap)


# -- claims and leases ---------------------------------------------------------------------


async def test_claim_is_exclusive(backend: Backend) -> None:
    s, s2 = backend.store, backend.another()
    await put(s, mk("r"))
    won = await s.claim("r", "w1", T0, T0 + 30)
    lost = await s2.claim("r", "w2", T0, T0 + 30)
    assert lost is None
    assert won is not None and won.status is S.RUNNING and won.lease_owner == "w1"
    assert won.lease_expires == T0 + 30 and won.updated_at == T0 and won.wake_at is None
    assert await s.get_run("r") == won
    assert await s.claim("unknown", "w1", T0, T0 + 30) is None


async def test_lease_renew_and_expiry(backend: Backend) -> None:
    s = backend.store
    await put(s, mk("r"))
    assert await s.claim("r", "w1", T0, T0 + 10)
    renewed = await s.renew_lease("r", "w1", T0 + 20)
    assert renewed is not None and renewed.lease_expires == T0 + 20
    assert await s.renew_lease("r", "w2", T0 + 30) is None
    assert await s.claim("r", "w2", T0 + 19, T0 + 49) is None  # still leased
    taken = await s.claim("r", "w2", T0 + 20, T0 + 50)  # expired at T0+20
    assert taken is not None and taken.lease_owner == "w2"
    assert await s.renew_lease("r", "w1", T0 + 60) is None
    with pytest.raises(LeaseLostError):
        await s.commit("r", "w1", T0 + 21, Update(events=[fired(T0 + 21)]))


async def test_commit_with_wrong_owner_raises_lease_lost(backend: Backend) -> None:
    s = backend.store
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    with pytest.raises(LeaseLostError):
        await s.commit("r", "w2", T0 + 1, Update(events=[fired(T0 + 1)], status=S.SUSPENDED))
    run = await s.get_run("r")
    assert run is not None and run.status is S.RUNNING
    assert len(await s.load_events("r")) == 1
    # owner=None: a live lease is a conflict unless ignore_lease
    with pytest.raises(ConflictError):
        await s.commit("r", None, T0 + 1, Update(status=S.CANCELLING))
    res = await s.commit("r", None, T0 + 1, Update(status=S.CANCELLING, ignore_lease=True))
    assert res.run.status is S.CANCELLING and res.run.lease_owner == "w1"
    with pytest.raises(RunNotFoundError):
        await s.commit("nope", None, T0, Update())


async def test_expect_status_conflict_writes_nothing(backend: Backend) -> None:
    s = backend.store
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    with pytest.raises(ConflictError):
        await s.commit(
            "r",
            "w1",
            T0 + 1,
            Update(events=[fired(T0 + 1)], status=S.FAILED, expect_status=frozenset({S.PENDING})),
        )
    run = await s.get_run("r")
    assert run is not None and run.status is S.RUNNING and run.updated_at == T0
    assert len(await s.load_events("r")) == 1
    ok = await s.commit(
        "r", "w1", T0 + 1, Update(status=S.SUSPENDED, expect_status=frozenset({S.RUNNING}))
    )
    assert ok.run.status is S.SUSPENDED


async def test_events_get_gap_free_seqs_across_commits(backend: Backend) -> None:
    s, s2 = backend.store, backend.another()
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    a = await s.commit("r", "w1", T0 + 1, Update(events=[fired(T0 + 1, "1"), fired(T0 + 1, "2")]))
    b = await s2.commit("r", "w1", T0 + 2, Update())
    c = await s2.commit("r", "w1", T0 + 3, Update(events=[fired(T0 + 3, str(i)) for i in range(3)]))
    assert (a.seqs, b.seqs, c.seqs) == ((2, 3), (), (4, 5, 6))
    evs = await s.load_events("r")
    assert [e.seq for e in evs] == [1, 2, 3, 4, 5, 6]
    assert [e.at for e in evs] == [T0, T0 + 1, T0 + 1, T0 + 3, T0 + 3, T0 + 3]
    hist = History("r", evs)
    assert History.from_json(hist.to_json()) == hist


async def test_duplicate_seq_is_rejected_by_the_database(sql_backend: Backend) -> None:
    from flowkit.stores.sql._schema import events

    await put(sql_backend.store, mk("r"))
    assert sql_backend.url is not None
    engine = sa.create_engine(sql_backend.url, poolclass=sa.pool.NullPool)
    try:
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(
                sa.insert(events).values(
                    run_id="r", seq=1, type="timer_fired", at=T0, body={"type": "timer_fired"}
                )
            )
    finally:
        engine.dispose()
    assert [e.type for e in await sql_backend.store.load_events("r")] == ["run_started"]


# -- signals -------------------------------------------------------------------------------


async def test_signals_wake_waiters_and_are_consumed_in_order(backend: Backend) -> None:
    s = backend.store
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    await s.commit(
        "r",
        "w1",
        T0 + 1,
        Update(status=S.SUSPENDED, waiting_signals=("go",), wake_at=None, release_lease=True),
    )
    run = await s.deliver_signal("r", "other", 1, T0 + 2)
    assert run.wake_at is None and run.status is S.SUSPENDED
    assert await s.due_runs(T0 + 2, 10) == []
    run = await s.deliver_signal("r", "go", {"x": [1, 2.5, "é"]}, T0 + 3)
    assert run.wake_at == T0 + 3 and run.updated_at == T0 + 3
    assert await s.due_runs(T0 + 3, 10) == ["r"]
    await s.deliver_signal("r", "go", None, T0 + 4)
    first = await s.peek_signal("r", "go")
    assert first is not None and first.name == "go" and first.payload == {"x": [1, 2.5, "é"]}
    assert await s.peek_signal("r", "missing") is None
    await s.claim("r", "w1", T0 + 5, T0 + 35)
    await s.commit("r", "w1", T0 + 5, Update(consume_signal=first.id))
    second = await s.peek_signal("r", "go")
    assert second is not None and second.id != first.id and second.payload is None
    with pytest.raises(ConflictError):
        await s.commit("r", "w1", T0 + 6, Update(consume_signal=first.id, events=[fired(T0)]))
    assert len(await s.load_events("r")) == 1
    with pytest.raises(RunNotFoundError):
        await s.deliver_signal("nope", "go", None, T0)


async def test_buffered_signal_makes_a_timed_wait_due_at_once(backend: Backend) -> None:
    s = backend.store
    await put(s, mk("r"))
    await s.deliver_signal("r", "go", 7, T0 + 1)
    await s.claim("r", "w1", T0 + 2, T0 + 30)
    res = await s.commit(
        "r",
        "w1",
        T0 + 2,
        Update(status=S.SUSPENDED, waiting_signals=("go",), wake_at=T0 + 100, release_lease=True),
    )
    assert res.run.wake_at == T0 + 2 and res.run.waiting_signals == ("go",)


# -- timers --------------------------------------------------------------------------------


async def test_due_runs_and_next_due_at(backend: Backend) -> None:
    s = backend.store
    await put(s, mk("p", t=T0 + 1))
    await put(s, mk("s5", status=S.SUSPENDED, wake_at=T0 + 5))
    await put(s, mk("s2", status=S.SUSPENDED, wake_at=T0 + 2))
    await put(s, mk("b3", status=S.BLOCKED, wake_at=T0 + 3, wf="other"))
    await put(s, mk("held", status=S.RUNNING, lease_owner="w1", lease_expires=T0 + 10))
    await put(s, mk("done", status=S.COMPLETED))
    await put(s, mk("forever", status=S.SUSPENDED, waiting_signals=("go",)))
    assert await s.due_runs(T0 + 4, 10) == ["p", "s2", "b3"]
    assert await s.due_runs(T0 + 4, 2) == ["p", "s2"]
    assert await s.due_runs(T0 + 4, 10, ["wf"]) == ["p", "s2"]
    assert await s.due_runs(T0 + 4, 10, []) == []
    assert await s.due_runs(T0 + 11, 10) == ["p", "s2", "b3", "s5", "held"]
    assert await s.next_due_at() == T0 + 1
    for rid in ("p", "s2", "b3"):
        run = await s.claim(rid, "w2", T0 + 4, T0 + 34)
        assert run is not None
        done = Update(events=[RunCompleted(at=T0 + 4)], status=S.COMPLETED)
        await s.commit(rid, "w2", T0 + 4, done)
    assert await s.next_due_at() == T0 + 5
    assert await s.next_due_at(("w1",)) == T0 + 5
    s5 = await s.claim("s5", "w2", T0 + 5, T0 + 35)
    assert s5 is not None and s5.status is S.RUNNING and s5.wake_at is None
    assert await s.next_due_at() == T0 + 10
    assert await s.next_due_at(("w2",)) == T0 + 10
    assert await s.next_due_at(("w1", "w2")) is None


# -- singleton admission -------------------------------------------------------------------


async def test_admission_is_fifo_by_created_at_then_id_and_keeps_holders(
    backend: Backend,
) -> None:
    s = backend.store
    await put(s, mk("b", key="k", t=T0))
    await put(s, mk("a", key="k", t=T0))
    await put(s, mk("z", key="k", t=T0 - 1))
    await put(s, mk("other-key", key="k2", t=T0 - 5))
    assert not await s.try_admit_singleton("a", TAG, "wf", 1, T0 + 1.25)
    a = await s.get_run("a")
    assert a is not None and a.status is S.SUSPENDED and a.wake_at == T0 + 1.25
    assert not a.admitted
    assert not await s.try_admit_singleton("b", TAG, "wf", 1, None)  # no retry time: untouched
    b = await s.get_run("b")
    assert b is not None and b.status is S.PENDING and b.wake_at is None
    assert await s.try_admit_singleton("z", TAG, "wf", 1, T0 + 1)
    z = await s.get_run("z")
    assert z is not None and z.admitted and z.tags == (TAG, ADMITTED_TAG)
    assert z.status is S.PENDING and z.wake_at is None
    assert await s.try_admit_singleton("z", TAG, "wf", 1, T0 + 1)  # a holder is re-admitted
    assert (await s.get_run("z")) == z
    # a later start with the same timestamp and a smaller id cannot displace the holder
    await put(s, mk("0", key="k", t=T0 - 1))
    assert not await s.try_admit_singleton("0", TAG, "wf", 1, T0 + 2)
    assert [r.id for r in await s.list_runs(tag=ADMITTED_TAG)] == ["z"]
    # other keys never compete
    assert await s.try_admit_singleton("other-key", "singleton:k2", "wf", 1, T0 + 1)
    # limit 2 frees one more slot, for the oldest waiter ("0"), not for "a"
    assert not await s.try_admit_singleton("a", TAG, "wf", 2, T0 + 2)
    assert await s.try_admit_singleton("0", TAG, "wf", 2, T0 + 2)
    assert {r.id for r in await s.list_runs(tag=ADMITTED_TAG)} == {"z", "0", "other-key"}
    with pytest.raises(RunNotFoundError):
        await s.try_admit_singleton("nope", TAG, "wf", 1, T0)


async def test_cancelling_and_terminal_runs_are_never_admitted(backend: Backend) -> None:
    s = backend.store
    await put(s, mk("c", key="k", status=S.CANCELLING))
    await put(s, mk("d", key="k", status=S.COMPLETED, t=T0 - 1))
    assert not await s.try_admit_singleton("c", TAG, "wf", 1, T0 + 1)
    assert not await s.try_admit_singleton("d", TAG, "wf", 1, T0 + 1)
    c = await s.get_run("c")
    assert c is not None and c.status is S.CANCELLING and c.wake_at is None


async def test_terminal_commit_releases_and_notifies_the_oldest_waiter(backend: Backend) -> None:
    s = backend.store
    for i, rid in enumerate(["h", "w3", "w1", "w2"]):
        await put(s, mk(rid, key="k", t=T0 + (0 if rid == "h" else 10 - i)))
    assert await s.try_admit_singleton("h", TAG, "wf", 1, T0 + 1)
    for rid in ("w1", "w2", "w3"):
        assert not await s.try_admit_singleton(rid, TAG, "wf", 1, T0 + 50)
    await s.claim("h", "x", T0 + 2, T0 + 32)
    res = await s.commit(
        "h",
        "x",
        T0 + 3,
        Update(
            events=[RunCompleted(at=T0 + 3)],
            status=S.COMPLETED,
            output=42,
            notify=Notify("wf", TAG, 1),
        ),
    )
    # created_at: w3 = T0+9, w1 = T0+8, w2 = T0+7 -> w2 is the oldest waiter
    assert res.woken == ("w2",)
    assert res.run.status is S.COMPLETED and not res.run.admitted and res.run.lease_owner is None
    assert res.run.output == 42
    runs = {r.id: r for r in await s.list_runs()}
    assert runs["w2"].wake_at == T0 + 3
    assert runs["w1"].wake_at == runs["w3"].wake_at == T0 + 50
    assert await s.due_runs(T0 + 3, 10) == ["w2"]
    assert await s.try_admit_singleton("w2", TAG, "wf", 1, T0 + 4)
    assert not await s.try_admit_singleton("w1", TAG, "wf", 1, T0 + 4)


async def test_namespace_scoping(backend: Backend) -> None:
    base, a, b = backend.store, backend.scoped("A"), backend.scoped("B")
    ra = await put(a, mk("ra"))
    assert ra.namespace == "A"
    await put(b, mk("rb", t=T0 + 1))
    await put(base, mk("rn", t=T0 + 2))
    assert [r.id for r in await a.list_runs()] == ["ra"]
    assert [r.id for r in await base.list_runs()] == ["ra", "rb", "rn"]
    assert await a.get_run("rb") is None and await a.get_run("rn") is None
    assert await a.claim("rb", "w", T0, T0 + 1) is None
    assert await a.due_runs(T0 + 5, 10) == ["ra"]
    with pytest.raises(RunNotFoundError):
        await a.load_events("rb")
    with pytest.raises(RunNotFoundError):
        await a.deliver_signal("rb", "go", None, T0)
    with pytest.raises(RunIdTakenError):  # ids are unique per store, not per namespace
        await b.create_run(mk("ra"), [])
    existing, created = await base.create_run(mk("ra"), [])
    assert not created and existing.namespace == "A"
    assert (await a.create_run(mk("ra"), []))[0] == existing
    # singleton keys: a scoped store sees only its namespace, an unscoped one shares keys
    await put(a, mk("sa", key="k", t=T0))
    await put(b, mk("sb", key="k", t=T0 + 1))
    assert await b.try_admit_singleton("sb", TAG, "wf", 1, T0 + 1)
    assert await a.try_admit_singleton("sa", TAG, "wf", 1, T0 + 1)
    await put(base, mk("sn", key="k", t=T0 - 1))
    assert not await base.try_admit_singleton("sn", TAG, "wf", 2, T0 + 1)


async def test_microsecond_timestamps_round_trip_exactly(backend: Backend) -> None:
    s = backend.store
    stamps = [
        1767225600.123457,
        1767225600.000001,
        1767225600.999999,
        round(0.1 + 0.2, 6),
        0.1 + 0.2,
        4102444800.654321,
    ]
    for i, t in enumerate(stamps):
        await put(s, mk(f"r{i}", t=t))
        run = await s.get_run(f"r{i}")
        assert run is not None and run.created_at == t and run.updated_at == t
        assert repr(run.created_at) == repr(t)
        (ev,) = await s.load_events(f"r{i}")
        assert ev.at == t
        claimed = await s.claim(f"r{i}", "w", t + 0.000001, t + 30.000001)
        assert claimed is not None and claimed.lease_expires == t + 30.000001
    assert [r.created_at for r in await s.list_runs()] == sorted(stamps)


async def test_payloads_round_trip(backend: Backend) -> None:
    s = backend.store
    payload = {
        "text": 'naïve ☃ "quoted" \\ \n',
        "ints": [0, -1, 2**53 + 1, 2**62],
        "floats": [0.5, 10.0, 1e-7, 1e20, 1767225600.123457],
        "nested": {"b": [True, False, None], "a": {"x": []}},
        "empty": {},
    }
    run = await put(s, replace(mk("r"), input=payload))
    assert (await s.get_run("r")) == run
    await s.deliver_signal("r", "sig", payload, T0)
    sig = await s.peek_signal("r", "sig")
    assert sig is not None and sig.payload == payload
    await s.claim("r", "w", T0, T0 + 30)
    res = await s.commit(
        "r",
        "w",
        T0 + 1,
        Update(
            events=[RunCompleted(output=payload, at=T0 + 1)],
            status=S.COMPLETED,
            output=payload,
            error={"type": "X", "message": "é"},
        ),
    )
    got = await s.get_run("r")
    assert got == res.run and got is not None and got.output == payload
    evs = await s.load_events("r")
    assert evs[-1] == RunCompleted(seq=2, output=payload, at=T0 + 1)
    for f in payload["floats"]:
        assert isinstance(f, float)
    assert all(isinstance(f, float) for f in got.output["floats"])


def test_sql_store_implements_the_store_protocol(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'p.db'}")
    assert isinstance(store, Store)
    assert isinstance(store.scoped("ns"), Store)
    store.close()
