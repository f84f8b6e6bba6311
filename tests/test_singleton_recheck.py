"""A gated waiter's re-check decided in its claim (``stores.base.ClaimsGated``): a denied
re-check reads no history and writes only the waiter's next ``wake_at``; an admitted one is
claimed with its admission and runs its body; across processes a hand-over costs two commits
(the release, the other process's claim that admits the woken waiter)."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

from singleton_kit import get, inp, make_lane
from store_kit import T0, TAG, Backend, S, delta, gated, mk, put, release, stats

from flowkit import ADMITTED_TAG, Engine, Run, RunStatus
from flowkit._worker.gate import GATE_JITTER, GATE_RETRY
from flowkit.stores import MemoryStore
from flowkit.stores.base import GateCheck, claims_gated
from flowkit_testing import TestEnv


async def until(env: TestEnv, store: Any, run_id: str, status: RunStatus) -> None:
    """Settle ``env`` until ``run_id`` has ``status`` (a SQL store answers from its I/O
    threads: polled, with a deadline)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while (await store.get_run(run_id)).status is not status:
        assert loop.time() < deadline, f"{run_id} never became {status}"
        await env.settle()
        await asyncio.sleep(0.005)


WRITES = ("commit", "append_events", "try_admit_singleton", "load_events", "create_run")


def _counting(calls: Counter[tuple[str, str]], op: str, real: Any) -> Any:
    async def counting(run_id: Any, *a: Any, **kw: Any) -> Any:
        calls[(op, getattr(run_id, "id", run_id))] += 1  # (create_run: a Run)
        return await real(run_id, *a, **kw)

    return counting


def count_calls(store: Any, ops: tuple[str, ...]) -> Counter[tuple[str, str]]:
    """Count ``store``'s calls of ``ops`` by ``(op, run id)`` (instance attributes: every
    caller of the store object goes through them)."""
    calls: Counter[tuple[str, str]] = Counter()
    for op in ops:
        real = getattr(store, op)

        async def counting(
            run_id: Any, *a: Any, _op: str = op, _real: Any = real, **kw: Any
        ) -> Any:
            calls[(_op, getattr(run_id, "id", run_id))] += 1
            return await _real(run_id, *a, **kw)

        setattr(store, op, counting)
    return calls


async def test_a_denied_recheck_reads_no_history_and_writes_only_its_next_wake(
    store: Any,
) -> None:
    """A head waiter behind a holder re-checks about once a second; each re-check is one
    ``claim`` that returns the run parked again: no history read, no commit, no
    ``try_admit_singleton``, no event; only ``wake_at`` moves on."""
    assert claims_gated(store)
    lane = make_lane()
    async with TestEnv([lane], store=store, gate_polls=True) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A"), "w")
        before = await env.store.load_events("w")
        w0 = await get(env, "w")
        assert w0.status is RunStatus.SUSPENDED and w0.wake_at is not None
        calls = count_calls(env.store, WRITES)
        parked: list[float | None] = []
        real_claim = env.store.claim

        async def claim(run_id: str, *a: Any, **kw: Any) -> Any:
            got = await real_claim(run_id, *a, **kw)
            if run_id == "w":
                assert kw.get("gate") is not None  # (the worker asks the store to decide)
                assert got is None or got.lease_owner is None  # denied: never leased
                if got is not None:
                    parked.append(got.wake_at)
            return got

        env.store.claim = claim
        await env.advance(6)
        assert len(parked) >= 4  # about once a second
        assert all(calls[(op, "w")] == 0 for op in WRITES), calls
        w = await get(env, "w")
        assert (w.status, w.lease_owner, w.admitted) == (RunStatus.SUSPENDED, None, False)
        assert w.wake_at == parked[-1] and w.wake_at is not None and w.wake_at > w0.wake_at
        assert w.wake_at <= env.clock.now() + GATE_RETRY + GATE_JITTER
        assert await env.store.load_events("w") == before  # no event written
        await env.signal("h", "go")
        await env.settle()
        assert (await get(env, "w")).status is RunStatus.COMPLETED


async def test_an_admitted_recheck_runs_the_body_with_one_admission_record(store: Any) -> None:
    """Without notify-on-release only the waiter's own re-check admits it: the claim that
    admits it leases it here, no ``try_admit_singleton`` is called, the body runs, and its
    history has ``singleton_admitted`` once, right after ``singleton_gated``."""
    lane = make_lane()
    env = TestEnv()  # (its clock and settle() only)
    clock = env.clock
    eng = Engine(store, [lane], clock=clock, poll_interval=None, notify_on_release=False)
    async with eng:
        await env.settle()
        await eng.start("lane", inp("A", "signal"), "h")
        await env.settle()
        await until(env, store, "h", RunStatus.SUSPENDED)  # (in its signal wait)
        w = await eng.start("lane", inp("A"), "w")
        await env.settle()
        assert w.status is RunStatus.SUSPENDED and w.wake_at is not None
        await eng.signal("h", "go")
        await until(env, store, "h", RunStatus.COMPLETED)
        assert (await store.get_run("w")).status is RunStatus.SUSPENDED  # nobody woke it
        calls = count_calls(store, ("try_admit_singleton",))
        clock.jump(w.wake_at)
        await until(env, store, "w", RunStatus.COMPLETED)
        assert calls[("try_admit_singleton", "w")] == 0
        t = [e.type for e in await store.load_events("w")]
        assert t[:3] == ["run_started", "singleton_gated", "singleton_admitted"]
        assert t.count("singleton_admitted") == 1 and t.count("singleton_gated") == 1
        assert lane.body["w"] == 1


async def test_a_cross_process_hand_over_costs_two_commits(sql_backend: Backend) -> None:
    """A release that only wakes the head (the releasing process does not take it), then
    another process's claim: admitted in that claim, one write transaction (the release
    before it is the other): two commits for the hand-over, where a claim and
    ``try_admit_singleton`` were two of their own before (three in all)."""
    s = sql_backend.store
    await gated(s)
    await s.commit("h", "x", T0 + 3, release(owner=None))  # (wakes w1: due now)
    other = sql_backend.another()
    check = GateCheck({("wf", "1"): 1}, lambda d: T0 + 5, lambda: T0 + 3)
    before = stats(other)
    got = await other.claim("w1", "y", T0 + 3, T0 + 33, gate=check)
    assert got is not None and (got.lease_owner, got.admitted) == ("y", True)
    assert got.status is S.RUNNING
    tx, single = delta(other, before, "write_tx"), delta(other, before, "single")
    if sql_backend.name == "sqlite":
        assert (tx, single) == (1, 0)  # one transaction: read, decide, write
    else:  # one statement that found the gated waiter (it wrote nothing: no commit record),
        assert (tx, single) == (2, 1)  # then the admission's transaction
    evs = await other.load_events("w1")
    assert [e.type for e in evs].count("singleton_admitted") == 1
    assert TAG in got.tags


def _random_run(rng: random.Random, i: int) -> Run:
    times = [T0 + d for d in (0, 1, 2, 3, 5, 8)]
    key = rng.choice(["k1", "k2", "k2", None])
    lease = rng.random() < 0.2
    admitted = key is not None and rng.random() < 0.3
    return mk(
        f"r{i:03d}",
        t=rng.choice(times),
        key=key,
        tags=(ADMITTED_TAG,) if admitted else (),
        status=rng.choice([*list(RunStatus), S.SUSPENDED, S.SUSPENDED, S.SUSPENDED]),
        wake_at=rng.choice([None, *times]),
        deadline_at=rng.choice([None, None, *times]),
        lease_owner="w1" if lease else None,
        lease_expires=rng.choice(times) if lease else None,
    )


async def test_sql_gated_claims_match_memory_store(sql_backend: Backend) -> None:
    """``claim(gate=)`` on random runs (gated waiters, holders, other runs; deadlines,
    leases, wake times) decides, returns and writes on SQLite and PostgreSQL exactly what
    ``MemoryStore`` (the reference) does."""
    rng = random.Random(4321)
    mem, sql = MemoryStore(), sql_backend.store
    for i in range(120):
        run = _random_run(rng, i)
        await put(mem, run)
        await put(sql, run)
    now = T0 + 3

    def gate(limit: int) -> GateCheck:
        return GateCheck(
            {("wf", "1"): limit},
            lambda d: T0 + 4.5 if d is None else min(T0 + 4.5, d),
            lambda: now,
            every_waiter_rechecks=limit == 2,
        )

    runs = await mem.list_runs()
    rng.shuffle(runs)
    decided = 0
    for run in runs:
        g = gate(rng.choice([1, 2]))
        got_mem = await mem.claim(run.id, "w9", now, now + 30, gate=g)
        got_sql = await sql.claim(run.id, "w9", now, now + 30, gate=g)
        assert got_sql == got_mem, run
        decided += got_mem is not None and (got_mem.lease_owner is None or got_mem.admitted)
    assert decided >= 10  # (the gate decided some: the comparison covers it)
    assert await sql.list_runs() == await mem.list_runs()
    for run in runs:
        assert await sql.load_events(run.id) == await mem.load_events(run.id), run.id
