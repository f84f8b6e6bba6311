"""Store behaviour, checked the same way on MemoryStore, SqlStore on a SQLite file and SqlStore
on a throwaway PostgreSQL (tests/pg.py), plus SQL-only checks (database-level seq uniqueness,
schema version, URLs), a randomized differential test of the claim rules against MemoryStore,
an end-to-end TestEnv run on SQLite, and multi-process singleton races."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from pydantic import BaseModel

from flowkit import ADMITTED_TAG, Engine, History, Run, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit._history import Event, RunCompleted, RunStarted, TimerFired
from flowkit.errors import (
    FlowkitError,
    LeaseLostError,
    RunIdTakenError,
    RunNotFoundError,
    SingletonQueueFullError,
)
from flowkit.stores import MemoryStore
from flowkit.stores.base import Admission, ConflictError, Notify, QueueCap, Store, Update
from flowkit.stores.sql import (
    SCHEMA_VERSION,
    SchemaVersionError,
    SqlStore,
    StoreUnavailableError,
    UnsupportedDatabaseError,
)
from flowkit_testing import TestEnv, VirtualClock
from flowkit_testing.conformance import CHECKS

try:
    from pg import fresh_database
except ImportError:  # tests/ imported as a package
    from tests.pg import fresh_database

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
S = RunStatus
TAG = "singleton:k"
PG = pytest.param("postgres", marks=pytest.mark.postgres)

# -- backends ------------------------------------------------------------------------------


@dataclass
class Backend:
    name: str
    store: Any
    url: str | None = None
    _opened: list[SqlStore] = field(default_factory=list)

    def another(self) -> Any:
        """A second, independent store object on the same data (another process' view)."""
        if self.url is None:
            return self.store
        s = SqlStore(self.url)
        self._opened.append(s)
        return s

    def scoped(self, namespace: str) -> Any:
        return self.store.scoped(namespace)

    def close(self) -> None:
        for s in [self.store, *self._opened]:
            if isinstance(s, SqlStore):
                s.close()


def _database_url(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'flowkit.db'}"
    return fresh_database(request.getfixturevalue("pg_server"))


def _backend(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if kind == "memory":
        return Backend("memory", MemoryStore())
    url = _database_url(kind, request, tmp_path)
    return Backend(kind, SqlStore(url), url)


@pytest.fixture(params=["memory", "sqlite", PG])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = _backend(request.param, request, tmp_path)
    yield b
    b.close()


@pytest.fixture(params=["sqlite", PG])
def sql_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    b = _backend(request.param, request, tmp_path)
    yield b
    b.close()


# -- helpers -------------------------------------------------------------------------------


def mk(
    run_id: str,
    *,
    t: float = T0,
    wf: str = "wf",
    key: str | None = None,
    status: RunStatus = S.PENDING,
    tags: tuple[str, ...] = (),
    **kw: Any,
) -> Run:
    all_tags = ((f"singleton:{key}",) if key else ()) + tags
    return Run(
        id=run_id,
        workflow=wf,
        workflow_version="1",
        status=status,
        input={"n": 1, "name": run_id},
        tags=all_tags,
        created_at=t,
        updated_at=kw.pop("updated_at", t),
        singleton_key=key,
        **kw,
    )


def first_events(run: Run) -> list[Event]:
    return [
        RunStarted(
            seq=1,
            at=run.created_at,
            workflow=run.workflow,
            version="1",
            input=run.input,
            tags=list(run.tags),
        )
    ]


async def put(store: Any, run: Run, **kw: Any) -> Run:
    stored, created = await store.create_run(run, first_events(run), **kw)
    assert created
    return stored


def fired(at: float, pos: str = "0") -> TimerFired:
    return TimerFired(pos=pos, at=at)


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


# -- SQL only ------------------------------------------------------------------------------


async def test_newer_schema_version_is_refused(sql_backend: Backend) -> None:
    from flowkit.stores.sql._schema import meta

    await put(sql_backend.store, mk("r"))
    assert sql_backend.url is not None
    engine = sa.create_engine(sql_backend.url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.update(meta).values(value=str(SCHEMA_VERSION + 98)))
    finally:
        engine.dispose()
    fresh = SqlStore(sql_backend.url)
    try:
        with pytest.raises(SchemaVersionError) as ei:
            await fresh.get_run("r")
    finally:
        fresh.close()
    assert isinstance(ei.value, FlowkitError)
    assert (ei.value.found, ei.value.supported) == (SCHEMA_VERSION + 98, SCHEMA_VERSION)
    assert f"version {SCHEMA_VERSION + 98}" in str(ei.value)
    assert f"version {SCHEMA_VERSION}" in str(ei.value)


async def test_schema_is_created_once_and_reopened(sql_backend: Backend) -> None:
    await put(sql_backend.store, mk("r"))
    other = sql_backend.another()
    assert (await other.get_run("r")) == (await sql_backend.store.get_run("r"))


@pytest.mark.parametrize(
    "url",
    [
        "mysql+pymysql://u:secret@host/db",
        "oracle://u@host/db",
        "sqlite+aiosqlite:///x.db",
        "postgresql+asyncpg://u@host/db",
        "not a url",
    ],
)
def test_unsupported_database_url_is_refused_at_construction(url: str) -> None:
    with pytest.raises(UnsupportedDatabaseError) as ei:
        SqlStore(url)
    assert isinstance(ei.value, ValueError) and isinstance(ei.value, FlowkitError)
    assert "secret" not in str(ei.value)


async def test_unreachable_database_raises_one_clear_error(tmp_path: Path) -> None:
    missing = SqlStore(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir' / 'x.db'}")
    with pytest.raises(StoreUnavailableError, match="cannot connect"):
        await missing.get_run("r")
    down = SqlStore("postgresql+psycopg://u:pw@127.0.0.1:1/db?connect_timeout=3")
    with pytest.raises(StoreUnavailableError, match=r"127\.0\.0\.1") as ei:
        await down.list_runs()
    assert "pw@" not in str(ei.value)
    missing.close()
    down.close()


# -- the SQL forms of the claim rules agree with MemoryStore's -----------------------------


def _random_run(rng: random.Random, i: int) -> Run:
    status = rng.choice(list(RunStatus))
    times = [T0 + d for d in (0, 1, 2, 3, 5, 8)]
    lease = rng.random() < 0.4
    return mk(
        f"r{i:03d}",
        t=rng.choice(times),
        updated_at=rng.choice(times),
        wf=rng.choice(["wf", "other"]),
        status=status,
        wake_at=rng.choice([None, *times]),
        lease_owner=rng.choice(["w1", "w2", ""]) if lease else None,
        lease_expires=rng.choice([None, *times]) if lease else None,
    )


async def test_sql_claim_rules_match_memory_store(sql_backend: Backend) -> None:
    rng = random.Random(1234)
    mem, sql = MemoryStore(), sql_backend.store
    for i in range(160):
        run = _random_run(rng, i)
        await put(mem, run)
        await put(sql, run)
    for now in (T0 - 1, T0, T0 + 2, T0 + 4, T0 + 9):
        for limit in (1000, 7):
            for wfs in (None, ["wf"]):
                assert await sql.due_runs(now, limit, wfs) == await mem.due_runs(now, limit, wfs)
    for excl in ((), ("w1",), ("w1", "w2"), ("",)):
        assert await sql.next_due_at(excl) == await mem.next_due_at(excl)
    now = T0 + 3
    for run in await mem.list_runs():
        got_mem = await mem.claim(run.id, "w9", now, now + 30)
        got_sql = await sql.claim(run.id, "w9", now, now + 30)
        assert got_sql == got_mem, run
    assert await sql.list_runs() == await mem.list_runs()


# -- end to end -------------------------------------------------------------------------------


class LaneInput(BaseModel):
    store_id: str
    n: int


@workflow(name="lane", singleton=Singleton(key=lambda i: f"store:{i.store_id}"))
class Lane:
    def work(self, n: int) -> int:
        return n * 10

    async def run(self, ctx: WorkflowCtx, input: LaneInput) -> int:
        a = await ctx.step(self.work, input.n)
        await ctx.sleep(60)
        got = await ctx.wait_for_signal("go")
        return int(a + got)


async def _lane_scenario(store: Any) -> dict[str, str]:
    async with TestEnv([Lane()], instances=2, seed=3, store=store) as env:
        for i in range(6):
            await env.start("lane", {"store_id": "AB"[i % 2], "n": i}, f"run-{i}")
        await env.run_until_idle()
        for _ in range(3):
            for i in range(6):
                run = await env.get_run(f"run-{i}")
                if run.admitted and not run.status.terminal:
                    await env.signal(f"run-{i}", "go", i)
            await env.run_until_idle()
        for i in range(6):
            assert await env.result(f"run-{i}") == i * 10 + i
        return {f"run-{i}": (await env.history(f"run-{i}")).to_json() for i in range(6)}


@pytest.mark.parametrize("kind", ["sqlite", PG])
async def test_end_to_end_singleton_lanes(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = SqlStore(_database_url(kind, request, tmp_path))
    try:
        on_sql = await _lane_scenario(store)
    finally:
        store.close()
    for key in "AB":
        ids = [f"run-{i}" for i in range(6) if "AB"[i % 2] == key]
        spans = []
        for rid in ids:
            h = History.from_json(on_sql[rid])
            assert h.types[-2:] == ["singleton_released", "run_completed"]
            adm = next(e.at for e in h if e.type == "singleton_admitted")
            rel = next(e.at for e in h if e.type == "singleton_released")
            spans.append((adm, rel, rid))
        spans.sort()
        assert [sp[2] for sp in spans] == ids
        assert all(nxt[0] >= cur[1] for cur, nxt in itertools.pairwise(spans))
    # same seed, same scenario: byte-identical histories on MemoryStore
    assert await _lane_scenario(MemoryStore()) == on_sql


# -- several processes on one database -----------------------------------------------------

RACE_SCRIPT = """
import asyncio, os, sys, time

from pydantic import BaseModel

from flowkit import Engine, Singleton, WorkflowCtx, workflow
from flowkit.stores.sql import SqlStore


class RaceInput(BaseModel):
    key: str
    n: int


@workflow(name="race", singleton=Singleton(key=lambda i: i.key))
class Race:
    async def work(self, n: int) -> int:
        await asyncio.sleep(0.002)
        return os.getpid()

    async def run(self, ctx: WorkflowCtx, input: RaceInput) -> list[int]:
        a = await ctx.step(self.work, input.n)
        await ctx.sleep(0.01)
        b = await ctx.step(self.work, input.n)
        return [a, b]


async def main(url: str, name: str, expected: int) -> None:
    store = SqlStore(url)
    # Two runs at a time: a worker that polls first cannot claim all 40 (group commit claims
    # a whole poll's worth in one transaction), so every worker gets keys and waiters to race.
    engine = Engine(store, [Race()], instance_id=name, poll_interval=0.05, max_concurrency=2)
    print("ready", flush=True)  # the test starts every worker at once: a real race
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    deadline = time.time() + 60
    async with engine:
        while time.time() < deadline:
            runs = await store.list_runs(workflow="race")
            if len(runs) >= expected and all(r.status.terminal for r in runs):
                break
            await asyncio.sleep(0.1)
    store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def _load_race_module(path: Path) -> Any:
    path.write_text(RACE_SCRIPT)
    spec = importlib.util.spec_from_file_location("flowkit_race_worker", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("kind", ["sqlite", PG])
async def test_worker_processes_race_for_singleton_slots(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    n_runs, keys, n_workers = 40, ["k0", "k1", "k2", "k3"], 3
    url = _database_url(kind, request, tmp_path)
    script = tmp_path / "race_worker.py"
    mod = _load_race_module(script)
    store = SqlStore(url)
    try:
        # runs created up front by a client-only engine; ties in created_at fall back to ids
        clock = VirtualClock(T0)
        client = Engine(store, [mod.Race()], clock=clock, worker=False, rng=random.Random(5))
        ids = [f"run-{i:02d}" for i in range(n_runs)]
        random.Random(9).shuffle(ids)
        for i, rid in enumerate(ids):
            if i % 3:
                clock.advance(0.000001)
            await client.start("race", {"key": keys[i % len(keys)], "n": i}, rid)
        t0 = time.monotonic()
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                str(script),
                url,
                f"worker-{w}",
                str(n_runs),
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            for w in range(n_workers)
        ]
        try:
            for p in procs:  # every worker imported and built its engine...
                assert p.stdout is not None
                line = await asyncio.wait_for(p.stdout.readline(), timeout=60)
                assert line.strip() == b"ready", line
            outputs = await asyncio.wait_for(  # ...then all of them start at once
                asyncio.gather(*(p.communicate(b"go\n") for p in procs)), timeout=90
            )
        finally:
            for p in procs:
                if p.returncode is None:
                    p.kill()
        elapsed = time.monotonic() - t0
        for p, (out, _) in zip(procs, outputs, strict=True):
            assert p.returncode == 0, out.decode()
        runs = await store.list_runs(workflow="race")
        assert len(runs) == n_runs
        assert all(r.status is RunStatus.COMPLETED for r in runs), [
            (r.id, r.status, r.error) for r in runs if r.status is not RunStatus.COMPLETED
        ]
        pids = {pid for r in runs for pid in r.output}
        assert len(pids) >= 2, "only one worker process did any work"
        for key in keys:
            mine = sorted(
                (r for r in runs if r.singleton_key == key), key=lambda r: (r.created_at, r.id)
            )
            spans = []
            for r in mine:
                h = History(r.id, await store.load_events(r.id))
                adm = [e.at for e in h if e.type == "singleton_admitted"]
                rel = [e.at for e in h if e.type == "singleton_released"]
                assert len(adm) == 1 and len(rel) == 1, h.types
                assert h.types[-1] == "run_completed"
                spans.append((adm[0], rel[0], r.id))
            by_admission = sorted(spans)
            # FIFO: admission order per key follows (created_at, id)
            assert [sp[2] for sp in by_admission] == [r.id for r in mine]
            # mutual exclusion: no two [admitted, released] intervals overlap
            for cur, nxt in itertools.pairwise(by_admission):
                assert nxt[0] >= cur[1], (key, cur, nxt)
        assert elapsed < 60, elapsed
    finally:
        store.close()
        sys.modules.pop("flowkit_race_worker", None)


# -- group commit ----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", PG])
def gc_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A SqlStore with group commit on."""
    url = _database_url(request.param, request, tmp_path)
    b = Backend(request.param, SqlStore(url, group_commit=True), url)
    yield b
    b.close()


def _stats(store: SqlStore) -> Any:
    return store._db.stats.copy()


def _delta(store: SqlStore, before: Any, key: str) -> int:
    return int(store._db.stats[key] - before[key])


async def test_group_commit_runs_concurrent_writes_in_one_transaction(gc_backend: Backend) -> None:
    s = gc_backend.store
    assert s.group_commit and s.scoped("ns").group_commit
    runs = [mk(f"r{i}", t=T0 + i) for i in range(8)]
    before = _stats(s)
    got = await asyncio.gather(*(s.create_run(r, first_events(r)) for r in runs))
    assert got == [(r, True) for r in runs]
    assert _delta(s, before, "write_tx") == 1 and _delta(s, before, "batched_ops") == 8
    before = _stats(s)
    claimed = await asyncio.gather(*(s.claim(r.id, "w", T0 + 10, T0 + 40) for r in runs))
    assert all(c is not None and c.lease_owner == "w" for c in claimed)
    assert _delta(s, before, "write_tx") == 1
    before = _stats(s)
    results = await asyncio.gather(
        *(
            s.commit(r.id, "w", T0 + 11, Update(events=[fired(T0 + 11, str(j)) for j in range(i)]))
            for i, r in enumerate(runs)
        )
    )
    assert _delta(s, before, "write_tx") == 1
    assert [res.seqs for res in results] == [tuple(range(2, 2 + i)) for i in range(8)]
    for i, r in enumerate(runs):
        assert [e.seq for e in await s.load_events(r.id)] == list(range(1, 2 + i))
    # the same writes one after another: each runs at once, in a transaction of its own
    before = _stats(s)
    for r in runs:
        await s.commit(r.id, "w", T0 + 12, Update(events=[fired(T0 + 12, "x")]))
    assert _delta(s, before, "write_tx") == 8 and _delta(s, before, "batches") == 0


async def test_a_failing_call_does_not_affect_its_batch(gc_backend: Backend) -> None:
    s = gc_backend.store
    for rid in ("ok1", "ok2", "lost", "conflict", "sig"):
        await put(s, mk(rid, key="k" if rid == "ok1" else None))
        await s.claim(rid, "w", T0, T0 + 30)
    cap = QueueCap("wf", "singleton:full", "full", limit=1, max_queue_depth=0)
    await put(s, mk("holder", key="full"), queue_cap=cap)
    before = {rid: (await s.get_run(rid), await s.load_events(rid)) for rid in ("lost", "sig")}
    stats = _stats(s)
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
    assert _delta(s, stats, "batches") == 1 and _delta(s, stats, "batch_retries") == 0
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
        assert _delta(s, stats, "deferred") == 3


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
    stats = _stats(s)
    got = await asyncio.gather(
        *(s.commit(rid, None, T0 + 1, Update(events=[fired(T0 + 1)])) for rid in "abc"),
        return_exceptions=True,
    )
    assert _delta(s, stats, "batch_retries") == 1
    assert isinstance(got[1], sa.exc.IntegrityError)
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
    from flowkit.stores.sql._sql import Sql

    if not one_statement:
        monkeypatch.setattr(Sql, "release_fast", lambda *a: None)
        monkeypatch.setattr(Sql, "release_lite", lambda *a: None)
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
    stats = _stats(s)

    def release(k: str) -> Update:
        n = Notify("wf", f"singleton:{k}", 1, claim_owner="x", lease_expires=T0 + 40)
        return Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=n)

    got = await asyncio.gather(
        *(s.commit(f"h{k}", "x", T0 + 3, release(k)) for k in "ab"), return_exceptions=True
    )
    assert _delta(s, stats, "batch_retries") == 1
    assert isinstance(got[1], sa.exc.IntegrityError)
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
    from flowkit.stores.sql._sql import Sql

    monkeypatch.setattr(Sql, "release_fast", lambda *a: None)
    monkeypatch.setattr(Sql, "release_lite", lambda *a: None)
    s = gc_backend.store
    await put(s, mk("ha", key="a", t=T0))
    await put(s, mk("wa", key="a", t=T0 + 1))
    assert await s.try_admit_singleton("ha", "singleton:a", "wf", 1, T0 + 1)
    assert not await s.try_admit_singleton("wa", "singleton:a", "wf", 1, T0 + 50)
    assert await s.claim("ha", "x", T0 + 2, T0 + 32)
    n = Notify("wf", "singleton:a", 1, claim_owner="x", lease_expires=T0 + 40)
    stats = _stats(s)
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
    assert _delta(s, stats, "batches") == 1 and _delta(s, stats, "batch_retries") == 0
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
    from flowkit.stores.sql import _engine

    s = gc_backend.store
    for rid in ("a", "b"):
        await put(s, mk(rid))
    dbapi = s._db.engine.dialect.loaded_dbapi
    real = _engine.Conn.commit
    calls = []

    def failing_commit(self: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise dbapi.OperationalError("disk I/O error (injected)")
        real(self)

    monkeypatch.setattr(_engine.Conn, "commit", failing_commit)
    # the general batch path (a batch of single statements goes out in one pipeline on
    # PostgreSQL: see the next test)
    monkeypatch.setattr(_engine.Database, "_single_batch", lambda self, c, ops: None)
    got = await asyncio.gather(
        s.commit("a", None, T0 + 1, Update(events=[fired(T0 + 1)])),
        s.claim("b", "w", T0 + 1, T0 + 31),
        return_exceptions=True,
    )
    assert [type(g) for g in got] == [sa.exc.OperationalError] * 2
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
        before = _stats(s)
        got = await asyncio.gather(
            s.claim("a", "w", T0 + 1, T0 + 31),
            s.claim("b", "w", T0 + 1, T0 + 31),
            s.claim("c", "w", T0 + 1, T0 + 31),
        )
        assert all(r is not None and r.lease_owner == "w" for r in got)
        after = _stats(s)
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


def test_a_sequential_write_runs_at_once_without_yielding(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'seq.db'}", group_commit=True)

    async def main() -> None:
        await put(store, mk("r"))
        loop = asyncio.get_running_loop()
        assert not getattr(loop, "_ready", [1])  # nothing else is ready to run
        coro = store.claim("r", "w", T0, T0 + 30)
        with pytest.raises(StopIteration) as done:  # completed within its first step
            coro.send(None)
        assert done.value.value is not None and done.value.value.lease_owner == "w"

    try:
        asyncio.run(main())
    finally:
        store.close()


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


# -- singleton hand-off on release ---------------------------------------------------------


async def _gated(s: Any, holder_owner: str = "x") -> None:
    """Holder ``h`` admitted and leased to ``holder_owner``; waiters ``w1`` (oldest), ``w2``
    gated (suspended until T0+50)."""
    await put(s, mk("h", key="k", t=T0))
    await put(s, mk("w2", key="k", t=T0 + 2))
    await put(s, mk("w1", key="k", t=T0 + 1))
    assert await s.try_admit_singleton("h", TAG, "wf", 1, T0 + 1)
    for rid in ("w1", "w2"):
        assert not await s.try_admit_singleton(rid, TAG, "wf", 1, T0 + 50)
    assert await s.claim("h", holder_owner, T0 + 2, T0 + 32)


async def _gated_and_another(s: Any) -> None:
    """``_gated``, and an unrelated run ``other`` leased to ``x``: a call to share the
    releasing batch with."""
    await _gated(s)
    await put(s, mk("other"))
    assert await s.claim("other", "x", T0 + 2, T0 + 32)


def _release(owner: str | None = "x", limit: int = 1) -> Update:
    return Update(
        events=[RunCompleted(at=T0 + 3)],
        status=S.COMPLETED,
        notify=Notify("wf", TAG, limit, claim_owner=owner, lease_expires=T0 + 40),
    )


async def test_release_hands_the_slot_to_the_oldest_waiter(backend: Backend) -> None:
    s = backend.store
    await _gated(s)
    res = await s.commit("h", "x", T0 + 3, _release())
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
    assert w2 is not None and not w2.admitted and w2.wake_at == T0 + 50  # untouched
    assert await s.claim("w1", "y", T0 + 4, T0 + 34) is None  # leased to the releaser
    assert [r.id for r in await s.list_runs(tag=ADMITTED_TAG)] == ["w1"]


async def test_release_without_claim_owner_only_wakes(backend: Backend) -> None:
    s = backend.store
    await _gated(s)
    res = await s.commit("h", "x", T0 + 3, _release(owner=None))
    assert res.handed == () and res.woken == ("w1",)
    w1 = await s.get_run("w1")
    assert w1 is not None and not w1.admitted and w1.wake_at == T0 + 3


async def test_a_waiter_leased_by_someone_else_is_not_handed_over(backend: Backend) -> None:
    s = backend.store
    await _gated(s)
    taken = await s.claim("w1", "y", T0 + 50, T0 + 80)  # another instance re-checks it
    assert taken is not None
    res = await s.commit("h", "x", T0 + 51, _release())
    assert res.handed == () and res.woken == ("w1",)
    w1 = await s.get_run("w1")
    assert w1 == taken  # left to admit itself: not admitted, still leased to "y"


async def test_two_free_slots_hand_two_waiters(backend: Backend) -> None:
    s = backend.store
    await _gated(s)
    res = await s.commit("h", "x", T0 + 3, _release(limit=2))
    assert [h.run.id for h in res.handed] == ["w1", "w2"]
    assert all(h.run.admitted and h.run.lease_owner == "x" for h in res.handed)


async def test_a_waiter_lost_to_a_race_is_woken_not_handed(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the releasing transaction's read of the key's runs and its hand-off, another
    process's poller claims the waiter (possible on PostgreSQL, which does not lock the
    waiter rows): the conditional hand-off misses, the waiter is only woken. (The general
    path; PostgreSQL's one-statement release: the test below.)"""
    from flowkit.stores.sql._sql import Sql

    s = sql_backend.store
    await _gated(s)
    real = SqlStore._hand_off
    monkeypatch.setattr(Sql, "release_fast", lambda *a: None)
    monkeypatch.setattr(Sql, "release_lite", lambda *a: None)

    def racing(self: SqlStore, c: Any, waiter: Run, admitted: Run, now: float, *a: Any) -> Any:
        c.write(
            "UPDATE flowkit_runs SET status = 'running', lease_owner = 'other', "
            "lease_expires = 9999999999.0, wake_at = NULL WHERE id = 'w1'",
            {},
        )
        return real(self, c, waiter, admitted, now, *a)

    monkeypatch.setattr(SqlStore, "_hand_off", racing)
    res = await s.commit("h", "x", T0 + 3, _release())
    monkeypatch.undo()
    assert res.handed == () and res.woken == ("w1",)
    w1 = await s.get_run("w1")
    assert w1 is not None and not w1.admitted and w1.lease_owner == "other"
    assert [r.id for r in await s.list_runs(tag=ADMITTED_TAG)] == []


@pytest.mark.postgres
async def test_a_one_statement_release_skips_a_waiter_another_transaction_holds(
    request: pytest.FixtureRequest,
) -> None:
    """PostgreSQL's one-statement release (``Sql.release_fast``) plans on its snapshot; when
    another transaction holds the waiter's row (a poller's claim in flight) it does not wait
    for it: the hand-off misses, the release commits, and the waiter is only woken (after the
    commit: a hint, skipped too while the row is held). The claim then commits as usual."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        await _gated(s)
        with engine.connect() as conn:
            tx = conn.begin()
            conn.execute(
                sa.text(
                    "UPDATE flowkit_runs SET status = 'running', lease_owner = 'other',"
                    " lease_expires = 9999999999.0, wake_at = NULL WHERE id = 'w1'"
                )
            )
            res = await s.commit("h", "x", T0 + 3, _release())
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


@pytest.mark.postgres
async def test_hand_off_on_postgres_across_processes(request: pytest.FixtureRequest) -> None:
    """Two store objects (two processes' connections): the releaser hands the slot over and
    the other sees the waiter admitted and leased, with nothing left to claim."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    a, b = SqlStore(url), SqlStore(url)
    try:
        await _gated(a)
        res = await a.commit("h", "x", T0 + 3, _release())
        assert [h.run.id for h in res.handed] == ["w1"]
        w1 = await b.get_run("w1")
        assert w1 is not None and w1.admitted and w1.lease_owner == "x"
        assert await b.due_runs(T0 + 4, 10) == []
    finally:
        a.close()
        b.close()


# -- PostgreSQL: a dropped connection ------------------------------------------------------


@pytest.mark.postgres
async def test_a_dropped_connection_is_replaced_and_the_call_retried(
    request: pytest.FixtureRequest,
) -> None:
    """The store's connection dies while idle (a server restart, an idle timeout): the next
    call fails on its first statement, before its transaction did anything, so the store
    reconnects and runs it again once; no pre-ping round trip is spent on every call."""
    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")

    def kill() -> None:
        conn = s._db._conn
        assert conn is not None
        with engine.connect() as admin:
            admin.exec_driver_sql(f"SELECT pg_terminate_backend({conn.dbapi.info.backend_pid})")
        time.sleep(0.05)

    try:
        await put(s, mk("r"))
        kill()
        assert (await s.get_run("r")) is not None  # a read
        kill()
        assert (await s.claim("r", "w", T0, T0 + 30)) is not None  # a write
        kill()
        res = await s.commit("r", "w", T0 + 1, Update(events=[fired(T0 + 1)]))
        assert res.seqs == (2,)
        # the claim and the commit went out as single statements in autocommit (one round
        # trip each): a session the server ended is retried there too
        assert s._db.stats["single"] >= 2
        assert [e.seq for e in await s.load_events("r")] == [1, 2]
        # a step's record, the store's most frequent write (``Database.returning_now``)
        await s.commit("r", "w", T0 + 2, Update(status=RunStatus.RUNNING))
        kill()
        single = s._db.stats["single"]
        assert await s.append_events("r", "w", T0 + 3, [fired(T0 + 3)]) == (3,)
        assert s._db.stats["single"] == single + 1
        assert [e.seq for e in await s.load_events("r")] == [1, 2, 3]
    finally:
        s.close()
        engine.dispose()


@pytest.mark.parametrize("owner", [None, "me"])
async def test_a_waiter_whose_history_cannot_be_read_is_woken_not_handed(
    sql_backend: Backend, owner: str | None
) -> None:
    """The hand-off reads the waiter's history inside the holder's release (in the round trip
    of its conditional update); an event this code cannot parse (a newer flowkit's, a damaged
    row) must not fail the release: the hand-off is undone and the waiter only woken. (With
    the holder's lease owner, PostgreSQL releases in one statement, ``Sql.release_fast``, and
    SQLite the lean way, ``Sql.release_lite``, which reads the history before it hands.)"""
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
    from flowkit.stores.sql import _engine

    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url, group_commit=True)
    try:
        await _gated_and_another(s)
        before = _stats(s)
        stepped, released, claimed = await asyncio.gather(
            s.commit("other", "x", T0 + 3, Update(events=[fired(T0 + 3)])),
            s.commit("h", "x", T0 + 3, _release()),
            s.claim("w2", "y", T0 + 60, T0 + 90),
        )
        after = _stats(s)
        assert after["write_tx"] - before["write_tx"] == 1  # all three in one transaction
        assert after["batched_ops"] - before["batched_ops"] == 3
        assert stepped.seqs == (2,)
        assert [h.run.id for h in released.handed] == ["w1"]
        assert claimed is not None and claimed.lease_owner == "y"
        assert (await s.get_run("w1")) == released.handed[0].run

        def undeclared(c: Any, _: Any) -> None:
            c.lock("not declared")

        with pytest.raises(AssertionError, match="not declared"):
            await s._db.write(_engine.Op(undeclared, None, "x"))
    finally:
        s.close()


async def test_admission_and_release_read_only_the_holders_and_the_first_waiters(
    sql_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admission check or a release reads the key's holders and only as many of its oldest
    waiters as slots can be free (a key with a deep queue costs what a short one does); a
    waiter behind them still decides about itself: denied and parked with its new re-check."""
    s = sql_backend.store
    await put(s, mk("h", key="k", t=T0))
    for i in range(1, 7):
        await put(s, mk(f"w{i}", key="k", t=T0 + i))
    assert await s.try_admit_singleton("h", TAG, "wf", 1, T0 + 1)
    read: list[int] = []
    real = SqlStore._split

    def counting(self: SqlStore, found: Any, tag: str) -> Any:
        read.append(len(found))
        return real(self, found, tag)

    monkeypatch.setattr(SqlStore, "_split", counting)
    assert not await s.try_admit_singleton("w6", TAG, "wf", 1, T0 + 50)
    assert read == [3]  # its own row, the holder, the oldest waiter (not w2..w6)
    w6 = await s.get_run("w6")
    assert w6 is not None and (w6.status, w6.wake_at) == (S.SUSPENDED, T0 + 50)
    assert await s.claim("h", "x", T0 + 2, T0 + 32)
    if sql_backend.name != "postgres":  # (SQLite's lean release reads one waiter: LIMIT 1)
        from flowkit.stores.sql._sql import Sql

        monkeypatch.setattr(Sql, "release_lite", lambda *a: None)
    res = await s.commit("h", "x", T0 + 3, _release())
    assert [h.run.id for h in res.handed] == ["w1"]
    if sql_backend.name == "postgres":  # one statement, which reads one waiter (LIMIT 1)
        assert read == [3]
    else:
        assert read[1] == 3  # the holder's row, itself as a holder, the oldest waiter


def _open_fresh(url: str, barrier: Any, out: Any) -> None:
    """A process opening the store at the same moment as others (see the test below)."""
    s = SqlStore(url)
    barrier.wait()
    try:
        asyncio.run(s.get_run("x"))
        out.put(None)
    except Exception as exc:
        out.put(repr(exc))
    finally:
        s.close()


def test_processes_opening_a_fresh_sqlite_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Several processes open the same fresh SQLite file at the same moment: switching it to
    WAL mode needs an exclusive lock, and SQLite refuses competing switches at once instead of
    waiting ("database is locked"); the store tries again until the file is in WAL mode, so
    every process gets its store (this failed about once in 60 opens before)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    failures: list[str] = []
    for trial in range(15):
        url = f"sqlite:///{tmp_path / f'fresh-{trial}.db'}"
        n = 8
        barrier, out = ctx.Barrier(n), ctx.Queue()
        procs = [ctx.Process(target=_open_fresh, args=(url, barrier, out)) for _ in range(n)]
        for p in procs:
            p.start()
        results = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=60)
        failures += [r for r in results if r is not None]
    assert failures == []


@pytest.mark.parametrize("index", ["ix_flowkit_runs_queue", "ix_flowkit_runs_waiting"])
async def test_an_index_added_later_is_created_on_an_existing_database(
    sql_backend: Backend, index: str
) -> None:
    """Additive schema changes need no new schema version: a database created before an
    index existed gets it on first use, and keeps version 1 (an older flowkit still opens
    it)."""
    s = sql_backend.store
    await put(s, mk("r"))
    with s._db.tx() as conn:
        conn.exec_driver_sql(f"DROP INDEX {index}")
    assert sql_backend.url is not None
    fresh = SqlStore(sql_backend.url)
    try:
        assert await fresh.get_run("r") is not None  # first use: the schema check
        with fresh._db.tx(write=False) as conn:
            names = {ix["name"] for ix in sa.inspect(conn).get_indexes("flowkit_runs")}
            version = conn.exec_driver_sql(
                "SELECT value FROM flowkit_meta WHERE key = 'schema_version'"
            ).scalar()
        assert index in names
        assert version == "1"
    finally:
        fresh.close()


def test_the_waiting_index_holds_exactly_the_waiters() -> None:
    """``ix_flowkit_runs_waiting``'s predicate is ``singleton.waiters``' rule: active, not
    cancelling (and not admitted)."""
    from flowkit._run import ACTIVE_STATUSES
    from flowkit.stores.sql._schema import WAITING_SQL

    waiting = sorted({s.value for s in ACTIVE_STATUSES} - {"cancelling"})
    expected = "status IN (" + ", ".join(f"'{s}'" for s in waiting) + ")"
    assert expected == WAITING_SQL


async def test_a_keys_settled_runs_are_not_read_to_find_its_first_waiter(
    sql_backend: Backend,
) -> None:
    """A long-lived key gathers settled runs; an admission check or a release reads its first
    waiters through ``ix_flowkit_runs_waiting``, which holds none of them: the plan of that
    read uses the index (SQLite is told to; PostgreSQL picks it once the table has
    statistics), and the release hands the slot to the right waiter."""
    s = sql_backend.store
    for i in range(300):
        await put(s, mk(f"old{i:03d}", key="k", t=T0 - 1000 + i, status=S.COMPLETED))
    await _gated(s)
    sql = s._sql
    q = f"{sql._waiters()} LIMIT 1"
    params = sql.sharing("wf", TAG)[1]
    with s._db.tx() as conn:
        if sql_backend.name == "postgres":
            conn.exec_driver_sql("ANALYZE flowkit_runs")
            plan = conn.exec_driver_sql("EXPLAIN " + q, params).scalars().all()
        else:
            plan = [r[-1] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + q, params)]
    assert any("ix_flowkit_runs_waiting" in line for line in plan), plan
    res = await s.commit("h", "x", T0 + 3, _release())
    assert [h.run.id for h in res.handed] == ["w1"]


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
    before = _stats(s)
    assert await s.append_events("r0", "w", T0 + 11, [fired(T0 + 11)]) == (2,)
    assert _delta(s, before, "statements") == 1 and _delta(s, before, "single") == 1
    # alone and missing (another lease owner): nothing written, the caller commits instead
    assert await s.append_events("r0", "other", T0 + 11, [fired(T0 + 11, "x")]) is None
    assert [e.seq for e in await s.load_events("r0")] == [1, 2]
    # several events: PostgreSQL keeps one statement; SQLite reserves the seqs first
    assert await s.append_events(
        "r0", "w", T0 + 12, [fired(T0 + 12, "a"), fired(T0 + 12, "b")]
    ) == (3, 4)
    before = _stats(s)
    got = await asyncio.gather(
        *(
            s.append_events(r.id, "w" if i != 3 else "other", T0 + 13, [fired(T0 + 13, "c")])
            for i, r in enumerate(runs)
        )
    )
    assert got == [(5,), (2,), (2,), None, (2,), (2,)]
    assert _delta(s, before, "write_tx") == 1 and _delta(s, before, "batched_ops") == 6
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


async def test_the_last_seq_trigger_is_created_on_an_existing_sqlite_database(
    tmp_path: Path,
) -> None:
    """The trigger that lets a step's record be one ``INSERT`` is an additive change: a
    database made before it existed gets it on first use (schema version unchanged), and
    what an older flowkit writes (events at seqs its own ``UPDATE`` reserved) is untouched."""
    from flowkit.stores.sql._schema import SQLITE_LAST_SEQ_TRIGGER

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = SqlStore(url)
    try:
        await put(old, mk("r"))
        with old._db.tx() as conn:
            conn.exec_driver_sql("DROP TRIGGER flowkit_events_last_seq")
        assert await old.claim("r", "w", T0 + 1, T0 + 60) is not None
        # an older flowkit's commit: last_seq and updated_at set by its UPDATE
        res = await old.commit("r", "w", T0 + 2, Update(events=[fired(T0 + 2)]))
        assert res.seqs == (2,)
    finally:
        old.close()
    fresh = SqlStore(url)
    try:
        assert await fresh.get_run("r") is not None  # first use: the schema check
        with fresh._db.tx(write=False) as conn:
            sql = conn.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'flowkit_events_last_seq'"
            ).scalar()
            version = conn.exec_driver_sql(
                "SELECT value FROM flowkit_meta WHERE key = 'schema_version'"
            ).scalar()
        assert sql is not None and "last_seq < NEW.seq" in sql
        assert "IF NOT EXISTS" in SQLITE_LAST_SEQ_TRIGGER and version == "1"
        assert await fresh.append_events("r", "w", T0 + 3, [fired(T0 + 3, "1")]) == (3,)
        res = await fresh.commit("r", "w", T0 + 4, Update(events=[fired(T0 + 4, "2")]))
        assert res.seqs == (4,) and res.run.updated_at == T0 + 4
        assert [e.seq for e in await fresh.load_events("r")] == [1, 2, 3, 4]
    finally:
        fresh.close()


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
        await _gated(s)
        done: list[str] = []

        async def tagged(name: str, call: Any) -> Any:
            got = await call
            done.append(name)
            return got

        new = mk("n", key="other", t=T0 + 5)
        admission = Admission("wf", "singleton:other", 1, T0 + 50, ())
        before = _stats(s)
        released, (created, fresh) = await asyncio.gather(
            tagged("release", s.commit("h", "x", T0 + 3, _release())),
            tagged("start", s.create_run(new, first_events(new), admission=admission)),
        )
        assert done == ["release", "start"]
        assert _delta(s, before, "single_batches") == 1  # the release, alone
        assert _delta(s, before, "write_tx") == 2
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
    release (``Sql.release_fast``) with the batch's ``BEGIN``, locks and ``COMMIT`` in one;
    on the general path, the hand-offs (the conditional update, the waiter's history, the
    wake-up of a miss) go together with the ``COMMIT`` after the batch's first statements.
    Each release still gets its own hand-off, and a miss (a waiter another process took
    meanwhile) is woken."""
    from flowkit.stores.sql import _engine

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
        real_pipeline, real_pipelined = _engine.Conn._pipeline, _engine.Database._pipelined

        real_commit = _engine.Conn.commit

        def pipeline(self: Any, stmts: Any, *, commit: bool = False) -> Any:
            if not commit:  # (a COMMIT with queued statements: counted below)
                trips.append("pipeline")
            return real_pipeline(self, stmts, commit=commit)

        def commit(self: Any) -> None:
            trips.append("COMMIT")
            real_commit(self)

        def pipelined(self: Any, c: Any, ops: Any, *, commit: bool = False) -> Any:
            trips.append("firsts")
            return real_pipelined(self, c, ops, commit=commit)

        monkeypatch.setattr(_engine.Conn, "_pipeline", pipeline)
        monkeypatch.setattr(_engine.Database, "_pipelined", pipelined)
        monkeypatch.setattr(_engine.Conn, "commit", commit)
        if not one_statement:
            from flowkit.stores.sql._sql import Sql

            monkeypatch.setattr(Sql, "release_fast", lambda *a: None)
            monkeypatch.setattr(Sql, "release_lite", lambda *a: None)
        # another process's poller takes wd (parked, due at T0+50) before the release
        assert await other.claim("wd", "y", T0 + 51, T0 + 90) is not None

        def release(k: str) -> Update:
            n = Notify("wf", f"singleton:{k}", 1, claim_owner="x", lease_expires=T0 + 99)
            return Update(events=[RunCompleted(at=T0 + 52)], status=S.COMPLETED, notify=n)

        got = await asyncio.gather(*(s.commit(f"h{k}", "x", T0 + 52, release(k)) for k in keys))
        if one_statement:
            # 1 round trip for 4 releases: BEGIN, their key locks, each release in one
            # statement (``Sql.release_fast``) and the COMMIT
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


async def test_calls_postponed_behind_releases_run_in_the_next_flush() -> None:
    """A flush holding a one-statement release postpones the calls that need more round trips
    to a flush of their own, once: a steady stream of releases (each handed run releases
    again) cannot keep them waiting."""
    from flowkit.stores.sql._engine import Database, Op

    db = Database("postgresql+psycopg://nobody@/flowkit?host=/nonexistent")
    batches: list[list[str]] = []

    def run_batch(ops: list[Any]) -> list[Any]:  # (no server: the batching alone)
        batches.append([op.key for op in ops])
        return [(None, op.key) for op in ops]

    db.run_batch = run_batch  # type: ignore[method-assign]

    def release(key: str) -> Any:
        return Op(lambda c, row: row, ("SELECT 1", {}, 4), key, single=bool, locks=("k",))

    async def releaser(i: int) -> None:
        for _ in range(50):
            await db.write(release(f"r{i}"))

    async def start() -> Any:
        await asyncio.sleep(0)  # (joins a flush that holds releases)
        return await db.write(Op(lambda c, row: None, None, "s", locks=("k2",)))

    *_, got = await asyncio.gather(*(releaser(i) for i in range(4)), start())
    assert got == "s"  # (the fake batch answers each call with its key)
    at = next(i for i, b in enumerate(batches) if "s" in b)
    assert batches[at] == ["s"]  # in a flush of its own ...
    assert any("r0" in b for b in batches[at + 1 :])  # ... while the releases went on
    assert any("s" not in b and "r0" in b for b in batches[:at])  # ... right after theirs
    db.dispose()


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
    from flowkit.stores.sql import _engine

    url = fresh_database(request.getfixturevalue("pg_server"))
    s = SqlStore(url, group_commit=True)
    try:
        await _gated_and_another(s)
        monkeypatch.setattr(_engine.Database, "_single_batch", lambda self, c, ops: None)
        real = SqlStore._fast_released
        calls: list[int] = []

        def failing_once(self: SqlStore, *a: Any) -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("injected")
            return real(self, *a)

        monkeypatch.setattr(SqlStore, "_fast_released", failing_once)
        stats = _stats(s)
        released, stepped = await asyncio.gather(
            s.commit("h", "x", T0 + 3, _release()),
            s.commit("other", "x", T0 + 3, Update(events=[fired(T0 + 3)])),
        )
        assert _delta(s, stats, "batch_retries") == 1
        assert [h.run.id for h in released.handed] == ["w1"]
        assert stepped.seqs == (2,)
        assert [e.type for e in await s.load_events("h")].count("run_completed") == 1
    finally:
        s.close()
