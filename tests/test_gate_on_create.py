"""Admission at creation (``_gate.Gate.admission``): a start decides its gate in
``create_run``'s own transaction, the worker's gate check stays the fallback, and the
``after_admission`` crash point fires at both (docs/singleton.md, "Admission at creation")."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from singleton_kit import (
    JITTER,
    RETRY,
    assert_gated,
    events_of,
    get,
    holders,
    inp,
    make_lane,
    types,
)

from flowkit import (
    Engine,
    History,
    Run,
    RunStatus,
)
from flowkit.events import RunStarted
from flowkit.stores import Admission, MemoryStore, SqlStore
from flowkit_testing import FaultPlan, InstanceCrashed, TestEnv

try:
    from pg import fresh_database
except ImportError:  # tests/ imported as a package
    from tests.pg import fresh_database

# -- admission at creation: a start decides its gate in create_run's own transaction ----------


class _Counting:
    """Records the run-level store calls as ``(op, run id)``; a ``create_run`` that carries an
    ``Admission`` is recorded as ``"create_run+admission"``."""

    calls: list[tuple[str, str]]

    async def create_run(self, run: Run, events: Any, **kw: Any) -> Any:
        op = "create_run+admission" if kw.get("admission") is not None else "create_run"
        self.calls.append((op, run.id))
        return await super().create_run(run, events, **kw)  # type: ignore[misc]

    async def try_admit_singleton(self, run_id: str, *args: Any, **kw: Any) -> Any:
        self.calls.append(("try_admit_singleton", run_id))
        return await super().try_admit_singleton(run_id, *args, **kw)  # type: ignore[misc]

    async def commit(self, run_id: str, *args: Any, **kw: Any) -> Any:
        self.calls.append(("commit", run_id))
        return await super().commit(run_id, *args, **kw)  # type: ignore[misc]

    async def claim(self, run_id: str, *args: Any, **kw: Any) -> Any:
        self.calls.append(("claim", run_id))
        return await super().claim(run_id, *args, **kw)  # type: ignore[misc]

    def of(self, run_id: str, since: int = 0) -> list[str]:
        return [op for op, rid in self.calls[since:] if rid == run_id]


class CountingMemoryStore(_Counting, MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.calls = []


class CountingSqlStore(_Counting, SqlStore):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.calls = []


class CountingNoCreateAdmission(CountingMemoryStore):
    """A store without admission at creation: the worker's gate check admits every run."""

    admits_on_create = False


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def counting_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if request.param == "memory":
        yield CountingMemoryStore()
        return
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'gate.db'}"
    else:
        url = fresh_database(request.getfixturevalue("pg_server"))
    store = CountingSqlStore(url)
    yield store
    store.close()


def _write_tx(store: Any) -> int:
    return int(store._db.stats["write_tx"]) if isinstance(store, SqlStore) else 0


async def test_a_start_behind_a_holder_is_one_create_run_and_the_release_hands_it_over(
    counting_store: Any,
) -> None:
    store = counting_store
    lane = make_lane()
    async with TestEnv([lane], store=store) as env:
        # the InstanceStore in front of the store passes the capability through
        assert env.engines[0].store.admits_on_create is True
        await env.start("lane", inp("A", "signal"), "h")
        assert store.of("h")[0] == "create_run+admission"
        assert "try_admit_singleton" not in store.of("h")  # admitted by its create_run
        assert await holders(env) == ["h"]

        mark, tx = len(store.calls), _write_tx(store)
        await env.start("lane", inp("A"), "w")
        # one store write for the queued start: no gate check, no parking commit, no claim
        assert store.calls[mark:] == [("create_run+admission", "w")]
        if isinstance(store, SqlStore):
            assert _write_tx(store) - tx == 1
        assert not env.engines[0].executing("w")  # no activation either
        w = await get(env, "w")
        assert (w.status, w.lease_owner, w.lease_expires, w.admitted) == (
            RunStatus.SUSPENDED,
            None,
            None,
            False,
        )
        assert w.wake_at is not None and abs(w.wake_at - (w.created_at + RETRY)) <= JITTER
        await assert_gated(env, "w")
        (gated,) = await events_of(env, "w", "singleton_gated")
        assert (gated.key, gated.retry_at, gated.at) == ("A", w.wake_at, w.created_at)
        assert lane.body["w"] == 0

        await env.signal("h", "go")  # h settles: its release hands the slot to w at once
        assert (await get(env, "h")).status is RunStatus.COMPLETED
        assert (await get(env, "w")).status is RunStatus.COMPLETED
        assert lane.entered == ["h", "w"]
        assert "try_admit_singleton" not in store.of("w", mark)
        assert "claim" not in store.of("w", mark)
        assert await types(env, "w") == [
            "run_started",
            "singleton_gated",
            "singleton_admitted",
            "step_completed",
            "step_completed",
            "singleton_released",
            "run_completed",
        ]


async def _lane_histories(store: Any) -> dict[str, Any]:
    """One lane, three runs of one key (a holder, two queued starts), run to the end."""
    lane = make_lane()
    async with TestEnv([lane], store=store, seed=11) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.advance(0.5)
        await env.start("lane", inp("A"), "w1")
        await env.start("lane", inp("A", "signal"), "w2")
        await env.advance(3)  # past their re-check times: both still denied
        await env.signal("h", "go")
        await env.signal("w2", "go")
        assert lane.entered == ["h", "w1", "w2"]
        return {rid: (await env.history(rid)).to_json() for rid in ("h", "w1", "w2")}


async def test_histories_are_the_same_with_and_without_admission_at_creation() -> None:
    with_it, without = CountingMemoryStore(), CountingNoCreateAdmission()
    got = await _lane_histories(with_it)
    assert got == await _lane_histories(without)  # canonical JSON: byte for byte
    assert History.from_json(got["w1"]).types[:3] == [
        "run_started",
        "singleton_gated",
        "singleton_admitted",
    ]
    # ... although the stores saw different calls: the worker's gate check and its parking
    # commit without the capability, a single create_run with it
    assert without.of("w1")[:3] == ["create_run", "try_admit_singleton", "commit"]
    assert with_it.of("w1")[0] == "create_run+admission"
    assert "commit" not in with_it.of("w1")[:2]


@pytest.mark.parametrize("mode", ["client", "no-capacity", "no-capability"])
async def test_the_worker_admits_as_before_without_capacity_or_capability(mode: str) -> None:
    store = CountingNoCreateAdmission() if mode == "no-capability" else CountingMemoryStore()
    lane = make_lane()
    async with TestEnv([lane], store=store, hung_step_after=0) as env:  # (a hung step)
        await env.start("lane", inp("A", "event"), "h")  # holds, its activation stays busy
        eng = env.engines[0]
        if mode == "no-capacity":
            eng.max_concurrency = 1  # filled by h's activation
            assert not eng._core.worker.has_capacity()
        starter = Engine(store, [lane], clock=env.clock, worker=False) if mode == "client" else eng
        mark = len(store.calls)
        await starter.start("lane", inp("A"), "w")
        await env.advance(0)
        claimed_at_creation = mode == "no-capability"
        expected = ["create_run"] + ([] if claimed_at_creation else ["claim"])
        assert store.of("w", mark) == [*expected, "try_admit_singleton", "commit"]
        await assert_gated(env, "w")
        lane.gates["h"].set()
        await env.settle()
        assert (await get(env, "w")).status is RunStatus.COMPLETED
        assert (await types(env, "w"))[:3] == [
            "run_started",
            "singleton_gated",
            "singleton_admitted",
        ]


async def test_a_run_gated_at_creation_re_checks_at_its_wake_time_without_notify() -> None:
    """With notify-on-release off only its own re-check admits a gated run: the start lowered
    the poller's deadline to the run's wake time (without a store read), although nothing
    else would wake the poller (``poll_interval=None``)."""
    lane = make_lane()
    env = TestEnv()  # for its clock and settle() only
    clock, store = env.clock, CountingMemoryStore()
    eng = Engine(store, [lane], clock=clock, poll_interval=None, notify_on_release=False)
    async with eng:
        await env.settle()
        await eng.start("lane", inp("A", "signal"), "h")
        await env.settle()
        w = await eng.start("lane", inp("A"), "w")
        await env.settle()
        assert w.status is RunStatus.SUSPENDED and w.wake_at is not None
        await eng.signal("h", "go")
        await env.settle()
        assert (await store.get_run("h")).status is RunStatus.COMPLETED
        assert (await store.get_run("w")).status is RunStatus.SUSPENDED  # nobody woke it
        assert clock.next_deadline() == w.wake_at  # the poller sleeps until its re-check

        clock.jump(w.wake_at)
        await env.settle()
        assert (await store.get_run("w")).status is RunStatus.COMPLETED
        # (its re-check is decided in the claim itself: ``ClaimsGated``)
        assert store.of("w")[:3] == ["create_run+admission", "claim", "commit"]


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_creates_racing_on_separate_connections_never_admit_more_than_the_limit(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Threads, each with its own store object (its own connection), create runs of one key
    at the same moment: the key's serialization (SQLite's write lock, PostgreSQL's advisory
    lock) admits exactly ``limit`` of them per round; the others are stored gated."""
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'race.db'}"
    else:
        url = fresh_database(request.getfixturevalue("pg_server"))
    n, rounds, limits = 4, 12, (1, 2)
    stores = [SqlStore(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    got: dict[tuple[int, int], Run] = {}
    errors: list[BaseException] = []

    def racer(i: int) -> None:
        async def go() -> None:
            for r in range(rounds):
                key, limit = f"k{r}", limits[r % 2]
                run = Run(
                    id=f"r{r}-{i}",
                    workflow="lane",
                    workflow_version="1",
                    status=RunStatus.RUNNING,
                    input=None,
                    tags=(f"singleton:{key}",),
                    created_at=1_767_225_600.0 + r,
                    updated_at=1_767_225_600.0 + r,
                    singleton_key=key,
                    lease_owner=f"w{i}",
                    lease_expires=1_767_225_630.0 + r,
                )
                started = RunStarted(
                    at=run.created_at, workflow="lane", version="1", input=None, tags=[]
                )
                adm = Admission("lane", f"singleton:{key}", limit, run.created_at + 1)
                await stores[i].get_run("warm-up")  # connected before the race starts
                barrier.wait(timeout=30)
                got[(r, i)], _ = await stores[i].create_run(run, [started], admission=adm)

        try:
            asyncio.run(go())
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    try:
        threads = [threading.Thread(target=racer, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        assert len(got) == n * rounds
        for r in range(rounds):
            runs = [got[(r, i)] for i in range(n)]
            assert sum(run.admitted for run in runs) == limits[r % 2], (r, runs)
            for run in runs:
                if not run.admitted:
                    assert run.status is RunStatus.SUSPENDED and run.lease_owner is None
    finally:
        for s in stores:
            s.close()


# -- the "after_admission" crash point covers both places admission happens -------------------


async def test_after_admission_crash_point_fires_after_an_admission_at_creation() -> None:
    lane = make_lane()
    async with TestEnv([lane], instances=2, lease_ttl=30) as env:
        env.crash_at(0, "after_admission")
        with pytest.raises(InstanceCrashed):
            await env.start("lane", inp("A"), "r")  # the start's own instance dies
        assert env.fired == [(0, "create_run", "after", "crash", "r")]
        r = await get(env, "r")
        assert r.admitted and r.lease_owner == "instance-0"
        # its admission is recorded with the marker, at the instant it took the slot
        assert await types(env, "r") == ["run_started", "singleton_admitted"]
        assert (await events_of(env, "r", "singleton_admitted"))[0].at == env.clock.now()
        assert lane.body["r"] == 0

        await env.advance(31)  # past the lease: instance 1 recovers the admitted run
        assert (await get(env, "r")).status is RunStatus.COMPLETED
        t = await types(env, "r")
        assert t[:2] == ["run_started", "singleton_admitted"]
        assert t.count("singleton_admitted") == 1
        assert lane.body["r"] == 1


async def test_after_admission_crash_point_still_fires_after_the_workers_gate_check() -> None:
    lane = make_lane()
    async with TestEnv([lane], lease_ttl=30) as env:
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        env.crash_at(0, "after_admission")
        await client.start("lane", inp("A"), "r")  # pending: the worker's gate admits it
        await env.advance(0)
        assert env.fired == [(0, "try_admit_singleton", "after", "crash", "r")]
        assert env.crashed == [0]
        assert (await get(env, "r")).admitted
        assert await types(env, "r") == ["run_started", "singleton_admitted"]

        await env.restart(0)
        await env.advance(31)
        assert (await get(env, "r")).status is RunStatus.COMPLETED
        assert (await types(env, "r")).count("singleton_admitted") == 1
        assert lane.body["r"] == 1


async def test_after_admission_crash_point_skips_a_run_gated_at_creation() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        env.crash_at(0, "after_admission")
        await env.start("lane", inp("A"), "w")  # created gated: not an admission
        assert env.fired == [] and env.crashed == []
        await assert_gated(env, "w")
        with pytest.raises(InstanceCrashed):
            await env.start("lane", inp("B"), "b")  # a free key: admitted at creation
        assert env.fired == [(0, "create_run", "after", "crash", "b")]


async def test_a_seeded_crash_plan_reaches_after_admission_at_creation() -> None:
    lane = make_lane()
    plan = FaultPlan(crash_rate=1.0, crash_points=("after_admission",))
    async with TestEnv([lane], instances=2, faults=plan) as env:
        with pytest.raises(InstanceCrashed):
            await env.start("lane", inp("A"), "r")
        assert env.fired == [(0, "create_run", "after", "crash", "r")]
        assert (await get(env, "r")).admitted
