"""Deep queues through the engine (docs/singleton.md, "Deep queues"): only the heads of a
key's queue (its ``limit`` oldest waiters) hold a re-check timer, and whatever moves the
queue gives the new head its timer in the same store operation. A retried run re-enters in
its place, a waiter behind the head times out at its deadline without ever re-checking, a
release racing a cancel of the head leaves no head without a timer (checked over the store's
rows after every store call of seeded two-engine runs), and each namespace has heads of its
own."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import Counter
from typing import Any

import pytest
from row_lock_kit import RowLock
from singleton_kit import SOON, events_of, get, inp, make_lane, unarmed_heads
from store_kit import T0, TAG, Backend, S, mk, put

from flowkit import ADMITTED_TAG, Engine, Run, RunStatus, Singleton, WorkflowCtx, workflow
from flowkit.events import RunCancelled
from flowkit.singleton import HEAD_RECHECK
from flowkit.stores.base import GateCheck, Notify, Update
from flowkit_testing import TestEnv
from flowkit_testing._faults import STORE_OPS

SEEDS = 12


class Watch:
    """What ``watch_heads`` saw: how many checks, and every violation (the store call after
    which it was seen, and the heads without a timer)."""

    def __init__(self) -> None:
        self.checks = 0
        self.violations: list[tuple[str, list[str]]] = []


def watch_heads(env: TestEnv, limit: int, tag: str | None = None) -> Watch:
    """Check ``unarmed_heads`` over all the store's runs (those with ``tag`` if given) after
    every store call any engine makes (recorded, not raised: the engine would take an error
    for a store failure)."""
    store = env.store

    async def read() -> list[Run]:
        return await store.list_runs(tag=tag)

    seen = Watch()

    def wrap(op: str) -> None:
        real = getattr(store, op)

        @functools.wraps(real)
        async def checked(*args: Any, **kwargs: Any) -> Any:
            got = await real(*args, **kwargs)
            bad = unarmed_heads(await read(), limit, env.clock.now())
            if bad:
                seen.violations.append((f"{op}{args[:1]}", bad))
            seen.checks += 1
            return got

        setattr(store, op, checked)

    for op in STORE_OPS:
        if op not in ("get_run", "list_runs", "load_events", "due_runs") and callable(
            getattr(store, op, None)
        ):
            wrap(op)
    return seen


async def wake(env: TestEnv, run_id: str) -> float | None:
    return (await get(env, run_id)).wake_at


# -- a retried run re-enters the queue in its place ----------------------------------------------


async def test_a_retried_run_re_enters_a_deep_queue_in_its_place(store: Any) -> None:
    """``engine.retry`` keeps the run's ``(created_at, id)``: a retried run older than every
    waiter becomes the head (a timer; the displaced head loses its timer at its next
    re-check), one behind the head re-checks once (a first denial of its new episode) and
    then parks without a timer, and the slot goes in FIFO order."""
    lane = make_lane()
    lane.fail.update({"a", "b"})
    async with TestEnv([lane], store=store) as env:
        checks = watch_heads(env, 1)
        await env.start("lane", inp("A"), "a")  # admitted, fails: settled, slot free
        await env.start("lane", inp("A"), "b")
        assert [(await get(env, r)).status for r in "ab"] == [RunStatus.FAILED] * 2
        await env.start("lane", inp("A", "signal"), "h")  # holds the slot
        for w in ("w1", "w2"):
            await env.start("lane", inp("A"), w)
        # first denials re-check wherever they stand (docs/singleton.md, "Deep queues") ...
        assert None not in [await wake(env, "w1"), await wake(env, "w2")]
        await env.advance(1.5)  # ... and a re-check behind the head parks without a timer
        assert (await wake(env, "w1")) is not None and (await wake(env, "w2")) is None
        lane.fail.clear()
        await env.advance(5)
        await env.retry("a")  # older than w1: the new head
        await env.retry("b")  # behind "a": a timer until its first re-check
        now = env.clock.now()
        a_wake = await wake(env, "a")
        assert a_wake is not None and now < a_wake <= now + SOON
        assert (await wake(env, "b")) is not None
        assert (await get(env, "b")).status is RunStatus.SUSPENDED
        # the displaced head w1 keeps its timer until its next re-check parks it without one
        w1_wake = await wake(env, "w1")
        assert w1_wake is not None
        await env.advance(2)
        assert [await wake(env, r) for r in ("b", "w1", "w2")] == [None] * 3
        assert (await get(env, "a")).status is RunStatus.SUSPENDED
        await env.signal("h", "go")
        await env.run_until_idle()
        assert lane.finished == ["h", "a", "b", "w1", "w2"]
        assert (checks.violations, checks.checks > 20) == ([], True)
    # each retried run gated again once, in its new episode
    async with TestEnv([lane], store=store) as env:
        assert len(await events_of(env, "b", "singleton_gated")) == 1


# -- a waiter behind the head times out without a timer ------------------------------------------

TIMEOUT = 100.0


def timed_lane() -> Any:
    """A singleton workflow (limit 1) whose runs are cancelled ``TIMEOUT`` seconds after
    they start; ``hold`` as in ``make_lane``: ``signal`` waits for "go"."""

    @workflow(name="timed", singleton=Singleton(key=lambda i: i["key"]), execution_timeout=TIMEOUT)
    class Timed:
        def __init__(self) -> None:
            self.body: Counter[str] = Counter()
            self.fail: set[str] = set()

        def leave(self, run_id: str) -> str:
            if run_id in self.fail:
                raise RuntimeError(f"boom in {run_id}")
            return run_id

        async def run(self, ctx: WorkflowCtx, input: dict[str, str]) -> Any:
            self.body[ctx.run_id] += 1
            if input.get("hold") == "signal":
                await ctx.wait_for_signal("go")
            return await ctx.step(self.leave, ctx.run_id)

    return Timed()


async def test_a_waiter_behind_the_head_times_out_at_its_deadline_without_a_timer(
    store: Any,
) -> None:
    """A waiter behind the head is parked with ``wake_at`` at its deadline and nothing
    earlier: it is never claimed before it, and at its deadline its ``execution_timeout``
    cancels it (its body never ran) without disturbing the head, which keeps its timer and
    gets the slot. (The runs ahead of it are retried ones: a retry's deadline is fresh.)"""
    timed = timed_lane()
    timed.fail.update({"a", "c"})
    async with TestEnv([timed], store=store) as env:
        checks = watch_heads(env, 1)
        t0 = env.clock.now()
        await env.start("timed", {"key": "K"}, "a")  # fails: settled
        await env.start("timed", {"key": "K"}, "c")
        await env.start("timed", {"key": "K", "hold": "signal"}, "h")  # deadline t0 + 100
        await env.advance(1)
        await env.start("timed", {"key": "K"}, "w")  # the head; deadline t0 + 101
        timed.fail.clear()
        await env.advance(49)
        await env.retry("a", input={"key": "K", "hold": "signal"})  # deadline t0 + 150
        await env.retry("c")
        await env.advance(10)  # w re-checks once more: now behind a and c, it parks
        w = await get(env, "w")
        assert w.deadline_at == t0 + 1 + TIMEOUT
        assert (w.status, w.wake_at) == (RunStatus.SUSPENDED, w.deadline_at)
        assert (await get(env, "c")).wake_at == t0 + 50 + TIMEOUT  # behind a: its deadline
        claims = Counter[str]()
        real_claim = env.store.claim

        @functools.wraps(real_claim)
        async def counting(run_id: str, *a: Any, **kw: Any) -> Any:
            claims[run_id] += 1
            return await real_claim(run_id, *a, **kw)

        env.store.claim = counting
        await env.advance(TIMEOUT - 60)  # h times out (t0 + 100): a gets the slot, c the timer
        assert (await get(env, "h")).status is RunStatus.CANCELLED
        assert [r.id for r in await env.store.list_runs(tag=ADMITTED_TAG)] == ["a"]
        assert claims["w"] == 0  # parked behind the head: never claimed
        now = env.clock.now()
        c_wake = await wake(env, "c")
        assert c_wake is not None and c_wake <= now + SOON
        await env.advance(1.5)  # w's deadline passes
        w = await get(env, "w")
        assert w.status is RunStatus.CANCELLED and timed.body["w"] == 0
        (req,) = await events_of(env, "w", "cancel_requested")
        assert (req.reason, req.at) == ("execution_timeout", w.deadline_at)
        assert claims["w"] == 1  # once, at its deadline
        # the head is undisturbed: c keeps its timer and gets the slot after a
        c = await get(env, "c")
        assert c.status is RunStatus.SUSPENDED and c.wake_at is not None
        await env.signal("a", "go")
        await env.run_until_idle()
        assert [(await get(env, r)).status for r in ("a", "c")] == [RunStatus.COMPLETED] * 2
        assert (checks.violations, checks.checks > 20) == ([], True)


# -- a release racing a cancel of the head waiter ------------------------------------------------


@pytest.mark.parametrize("limit", [1, 2])
async def test_a_release_racing_a_cancel_of_the_head_leaves_no_head_without_a_timer(
    store: Any, limit: int
) -> None:
    """Two engines, seeded interleavings: one releases the key's slot (its holder settles)
    while the other cancels the head waiter. Whichever lands first, after every store call
    every head of the queue holds a timer (or is being checked), and the other waiters get
    the slots in FIFO order. Both orders come up."""
    outcomes: Counter[bool] = Counter()  # (whether w1 got the slot before its cancel)
    for seed in range(SEEDS):
        lane = make_lane(limit=limit)
        key = f"K{seed}"
        ids = {n: f"s{seed}.{n}" for n in ("h0", "h1", "w1", "w2", "w3", "w4", "w5")}
        async with TestEnv([lane], instances=2, seed=seed, store=store) as env:
            # (after each store call, the queue of this seed's key: the runs of the seeds
            # before are settled, and their queues checked at the end of their seed)
            checks = watch_heads(env, limit, f"singleton:{key}")
            for i in range(limit):
                await env.start("lane", inp(key, "signal"), ids[f"h{i}"])
            for n in ("w1", "w2", "w3", "w4", "w5"):
                await env.start("lane", inp(key), ids[n])
            e0, e1 = env.engines

            async def cancel_later(eng: Engine, turns: int, rid: str) -> None:
                for _ in range(turns):  # (the seed picks how far the release got)
                    await asyncio.sleep(0)
                await eng.cancel(rid)

            await asyncio.gather(e0.signal(ids["h0"], "go"), cancel_later(e1, seed * 4, ids["w1"]))
            await env.run_until_idle()
            if limit == 2:
                await env.signal(ids["h1"], "go")
                await env.run_until_idle()
            statuses = {n: (await get(env, rid)).status for n, rid in ids.items() if n[1] != "1"}
            statuses["w1"] = (await get(env, ids["w1"])).status
            assert all(statuses[n] is RunStatus.COMPLETED for n in ("w2", "w3", "w4", "w5"))
            assert statuses["w1"] in (RunStatus.CANCELLED, RunStatus.COMPLETED)
            outcomes[bool(await events_of(env, ids["w1"], "singleton_admitted"))] += 1
            order = [f for f in lane.finished if f.startswith(f"s{seed}.w")]
            if limit == 1:  # (one slot: strictly in FIFO order)
                assert order == sorted(order)
            assert not unarmed_heads(await env.store.list_runs(), limit, env.clock.now())
            assert (checks.violations, checks.checks > 20) == ([], True)
    # the cancel landed before the hand-over in some seeds, after it in others
    assert outcomes[True] > 0 and outcomes[False] > 0, outcomes


# -- heads per namespace --------------------------------------------------------------------------


async def test_each_namespace_has_heads_of_its_own(backend: Backend) -> None:
    """Two scoped views of one store, the same workflow and key in both (B's runs older):
    each namespace's queue has its own head with a timer; a release, a cancelled head and an
    admission in one namespace arm that namespace's next head only."""
    views = {"A": backend.scoped("A"), "B": backend.scoped("B")}
    for ns, dt in (("B", 0), ("A", 10)):
        s, p = views[ns], ns.lower()
        await put(s, mk(f"{p}h", key="k", t=T0 + dt))
        for i in (1, 2, 3):
            await put(s, mk(f"{p}w{i}", key="k", t=T0 + dt + i))
        assert await s.try_admit_singleton(f"{p}h", TAG, "wf", 1, T0 + 20)
        for i in (1, 2, 3):  # first denials, then re-checks (behind the head: no timer)
            assert not await s.try_admit_singleton(f"{p}w{i}", TAG, "wf", 1, T0 + 20.5)
        for i in (1, 2, 3):
            assert not await s.try_admit_singleton(f"{p}w{i}", TAG, "wf", 1, T0 + 21, recheck=True)

    async def wakes(ns: str) -> list[float | None]:
        s, p = views[ns], ns.lower()
        return [(await s.get_run(f"{p}w{i}")).wake_at for i in (1, 2, 3)]

    assert await wakes("A") == [T0 + 21, None, None]  # (B's older waiters do not count)
    assert await wakes("B") == [T0 + 21, None, None]
    # a release in A hands the slot to aw1 and arms aw2, nothing in B
    a = views["A"]
    assert await a.claim("ah", "x", T0 + 22, T0 + 52)
    notify = Notify("wf", TAG, 1, claim_owner="x", lease_expires=T0 + 60)
    done = Update(events=[RunCancelled(at=T0 + 23)], status=S.CANCELLED, notify=notify)
    res = await a.commit("ah", "x", T0 + 23, done)
    assert [h.run.id for h in res.handed] == ["aw1"]
    assert (await wakes("A"))[1:] == [T0 + 23 + HEAD_RECHECK, None]
    assert await wakes("B") == [T0 + 21, None, None]
    # B's head cancelled (B's holder keeps its slot): bw2 armed, nothing in A
    b = views["B"]
    cancel = Update(events=[RunCancelled(at=T0 + 24)], status=S.CANCELLED, notify=Notify(
        "wf", TAG, 1))  # fmt: skip
    await b.commit("bw1", None, T0 + 24, cancel)
    assert await wakes("B") == [None, T0 + 24 + HEAD_RECHECK, None]
    assert (await wakes("A"))[1:] == [T0 + 23 + HEAD_RECHECK, None]
    # B's holder settles without a notification; bw2 admitted by its own check arms bw3 only
    await b.commit(
        "bh", None, T0 + 25, Update(events=[RunCancelled(at=T0 + 25)], status=S.CANCELLED)
    )
    assert await b.try_admit_singleton("bw2", TAG, "wf", 1, T0 + 26)
    assert (await wakes("B"))[2] == T0 + 26
    assert (await wakes("A"))[2] is None
    # each view sees only its own heads due
    assert await a.due_runs(T0 + 30, 10) == ["aw2"]
    assert "bw3" in await b.due_runs(T0 + 30, 10)
    assert all(not r.startswith("a") for r in await b.due_runs(T0 + 30, 10))


# -- a release while the next head's row is busy ---------------------------------------------------


@pytest.mark.parametrize("limit", [1, 2])
async def test_a_head_whose_row_is_busy_during_the_release_still_gets_its_timer(
    backend: Backend, limit: int
) -> None:
    """The release that makes a waiter a head arms it even when another transaction holds
    its row at that instant (on PostgreSQL a second connection holds it ``FOR UPDATE``, as a
    signal delivered to it would): the release waits for it rather than skipping it. The
    next releases come from an engine without notify-on-release, which wakes nobody: the new
    head still gets the slot by its own re-check, and every waiter after it too."""
    lane = make_lane(limit=limit)
    holders = [f"h{i}" for i in range(limit)]
    waiters = [f"w{i}" for i in range(1, limit + 3)]
    nxt = f"w{limit + 1}"  # (the waiter h0's release makes a head)
    waited: list[bool] = []
    async with TestEnv([lane], store=backend.store, gate_polls=True) as env:
        for h in holders:
            await env.start("lane", inp("K", "signal"), h)
        await env.start("lane", inp("K", "signal"), "w1")  # (it holds the slot it is handed)
        for w in waiters[1:]:
            await env.start("lane", inp("K"), w)
        await env.advance(1.5)  # re-checks: the waiters behind the heads park without a timer
        assert [await wake(env, w) is None for w in waiters] == [False] * limit + [True] * 2
        real = env.store.commit

        @functools.wraps(real)
        async def commit(run_id: str, *a: Any, **kw: Any) -> Any:
            update = a[2] if len(a) > 2 else kw["update"]
            if run_id != "h0" or update.notify is None or backend.name != "postgres":
                return await real(run_id, *a, **kw)
            assert backend.url is not None
            with RowLock(backend.url, nxt) as held:  # (another transaction on its row)
                got = await real(run_id, *a, **kw)
            waited.append(held.waited)
            return got

        env.store.commit = commit
        await env.signal("h0", "go")  # its release hands its slot to w1: nxt is a head
        env.store.commit = real
        assert (await get(env, "w1")).admitted
        assert not unarmed_heads(await env.store.list_runs(), limit, env.clock.now())
        nxt_wake = await wake(env, nxt)
        assert nxt_wake is not None and nxt_wake <= env.clock.now() + HEAD_RECHECK
        # from here on the holders settle without notifying anyone
        env.engines[0].notify_on_release = False
        for h in ["w1", *holders[1:]]:
            await env.signal(h, "go")
        await env.run_until_idle()
        assert [(await get(env, w)).status for w in waiters] == [RunStatus.COMPLETED] * len(waiters)
        if limit == 1:  # (one slot: in FIFO order)
            assert lane.finished == [*holders, *waiters]
    # (on PostgreSQL the release waited for the row another transaction held)
    assert waited == ([True] if backend.name == "postgres" else [])


@pytest.mark.parametrize("via", ["admission", "gated claim"])
async def test_an_admission_arms_the_next_head_whose_row_is_busy(
    backend: Backend, via: str
) -> None:
    """The head admitted by its own re-check (the holder settled without a notification)
    arms the next waiter, the new head, even while another transaction holds that waiter's
    row (PostgreSQL: a second connection holds it ``FOR UPDATE``): the admission waits for
    it once it committed, by ``try_admit_singleton`` and by a worker's gated claim alike."""
    s = backend.store
    await put(s, mk("h", key="k", t=T0))
    for i in (1, 2, 3):
        await put(s, mk(f"w{i}", key="k", t=T0 + i))
    assert await s.try_admit_singleton("h", TAG, "wf", 1, T0 + 5)
    for i in (1, 2, 3):  # first denials, then re-checks (behind the head: no timer)
        assert not await s.try_admit_singleton(f"w{i}", TAG, "wf", 1, T0 + 6)
    for i in (1, 2, 3):
        assert not await s.try_admit_singleton(f"w{i}", TAG, "wf", 1, T0 + 7, recheck=True)
    assert [(await s.get_run(f"w{i}")).wake_at for i in (1, 2, 3)] == [T0 + 7, None, None]
    # the holder settles on an engine without notify-on-release: no Notify
    await s.commit("h", None, T0 + 8, Update(events=[RunCancelled(at=T0 + 8)], status=S.CANCELLED))
    lock = RowLock(backend.url, "w2") if backend.name == "postgres" and backend.url else None
    with lock or contextlib.nullcontext():
        if via == "admission":
            assert await s.try_admit_singleton("w1", TAG, "wf", 1, T0 + 10, recheck=True)
        else:
            gate = GateCheck({("wf", "1"): 1}, lambda _d: T0 + 10, lambda: T0 + 9)
            got = await s.claim("w1", "x", T0 + 9, T0 + 39, gate=gate)
            assert got is not None and ADMITTED_TAG in got.tags
    assert [(await s.get_run(f"w{i}")).wake_at for i in (2, 3)] == [T0 + 10, None]
    # (on PostgreSQL the admission waited for the row the other transaction held)
    assert lock is None or lock.waited
