"""Release: notify-on-release after completion, failure and cancel; worker-less clients;
cancellation of waiters and holders; retry claims a slot again (DESIGN §4.3, §4.5, §4.6)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter

import pytest
from singleton_kit import LaneIn, assert_gated, events_of, get, holders, inp, make_lane, types

from flowkit import (
    ADMITTED_TAG,
    Engine,
    Run,
    RunStatus,
    Singleton,
    WorkflowCtx,
    WorkflowFailedError,
    workflow,
)
from flowkit._history import RunCompleted
from flowkit.stores import MemoryStore
from flowkit.stores.base import Notify, Update
from flowkit_testing import TestEnv

# -- 6. notify-on-release ----------------------------------------------------------------


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled"])
async def test_release_admits_the_oldest_waiter_at_the_same_instant(outcome: str) -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:  # gate_polls=False: only a notify can wake the waiters
        await env.start("lane", inp("A", "signal"), "h")
        await env.advance(0.5)
        await env.start("lane", inp("A", "signal"), "w1")
        await env.start("lane", inp("A", "signal"), "w2")
        now = env.clock.now()
        if outcome == "failed":
            lane.fail.add("h")
        if outcome == "cancelled":
            await env.engines[0].cancel("h")
        else:
            await env.engines[0].signal("h", "go")
        await env.settle()  # no virtual time passes
        assert env.clock.now() == now
        assert (await get(env, "h")).status == outcome
        assert await holders(env) == ["w1"]
        (adm,) = await events_of(env, "w1", "singleton_admitted")
        assert adm.at == now
        await assert_gated(env, "w2")
        # the waiter did not need its ~1 s retry timer
        assert lane.entered == ["h", "w1"]


async def test_two_freed_slots_wake_two_waiters() -> None:
    lane = make_lane(limit=2)
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h1")
        await env.start("lane", inp("A", "signal"), "h2")
        for rid in ("w1", "w2", "w3"):
            await env.start("lane", inp("A", "signal"), rid)
        assert await holders(env) == ["h1", "h2"]
        now = env.clock.now()
        await env.engines[0].signal("h1", "go")
        await env.engines[0].signal("h2", "go")
        await env.settle()
        assert env.clock.now() == now
        assert await holders(env) == ["w1", "w2"]
        await assert_gated(env, "w3")


async def test_one_release_with_two_free_slots_stamps_two_waiters_due_now() -> None:
    store = MemoryStore()
    t0 = 1000.0

    def run(rid: str, status: RunStatus, tags: tuple[str, ...], **kw: float) -> Run:
        return Run(
            id=rid,
            workflow="lane",
            workflow_version="1",
            status=status,
            input=None,
            tags=tags,
            created_at=t0,
            singleton_key="A",
            **kw,
        )

    tag = "singleton:A"
    await store.create_run(run("h", RunStatus.RUNNING, (tag, ADMITTED_TAG)), [])
    for rid in ("w1", "w2", "w3"):
        await store.create_run(run(rid, RunStatus.SUSPENDED, (tag,), wake_at=t0 + 1), [])
    now = t0 + 0.25
    res = await store.commit(
        "h",
        None,
        now,
        Update(
            events=[RunCompleted(at=now)],
            status=RunStatus.COMPLETED,
            notify=Notify("lane", tag, 2),
        ),
    )
    assert res.woken == ("w1", "w2")
    assert ADMITTED_TAG not in res.run.tags
    for rid in ("w1", "w2"):
        assert (await store.get_run(rid)).wake_at == now
    assert (await store.get_run("w3")).wake_at == t0 + 1
    assert set(await store.due_runs(now, 10)) == {"w1", "w2"}


class SpyStore(MemoryStore):
    """Records, after every commit that carries a notify, the woken waiters' wake times and
    the waiters the release handed its slot to (admitted and leased in the same commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.notified: list[tuple[float, dict[str, float | None], list[str]]] = []

    async def commit(self, run_id, owner, now, update):  # type: ignore[no-untyped-def]
        res = await super().commit(run_id, owner, now, update)
        if update.notify is not None:
            stamps = {w: (await self.get_run(w)).wake_at for w in res.woken}
            self.notified.append((now, stamps, [h.run.id for h in res.handed]))
        return res


async def test_worker_less_client_cancelling_a_holder_leaves_the_waiter_due_now() -> None:
    lane = make_lane()
    store = SpyStore()
    async with TestEnv([lane], store=store) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A", "signal"), "w")
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        now = env.clock.now()
        cancelled = await client.cancel("h")
        assert cancelled.status is RunStatus.CANCELLING
        assert ADMITTED_TAG in (await get(env, "h")).tags  # holds until it settles
        await assert_gated(env, "w")

        await env.advance(0)  # a worker polls (no time passes)
        assert (await get(env, "h")).status is RunStatus.CANCELLED
        # the settling commit handed the slot to the waiter, atomically with the release
        (at, stamps, handed) = store.notified[-1]
        assert at == now
        assert (stamps, handed) == ({}, ["w"])
        assert await holders(env) == ["w"]
        (adm,) = await events_of(env, "w", "singleton_admitted")
        assert adm.at == now


async def test_run_until_idle_picks_up_a_client_cancel() -> None:
    """Regression: run_until_idle() used not to poke the workers, so a holder cancelled by a
    worker-less client stayed ``cancelling`` and its waiter never moved."""
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A", "signal"), "w")
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        now = env.clock.now()
        await client.cancel("h")
        await env.run_until_idle()
        assert (await get(env, "h")).status is RunStatus.CANCELLED
        assert await holders(env) == ["w"]
        assert env.clock.now() == now


@workflow(name="fickle2", singleton=Singleton(key=lambda i: i.key, limit=2))
class Fickle2:
    """limit=2; flipping ``variant`` makes replay of a holder diverge (it gets blocked)."""

    def __init__(self) -> None:
        self.variant = "a"

    def a(self) -> str:
        return "a"

    def b(self) -> str:
        return "b"

    async def run(self, ctx: WorkflowCtx, input: LaneIn) -> str:
        await ctx.step(self.a if self.variant == "a" else self.b)
        return await ctx.wait_for_signal("go")


async def test_admin_client_without_the_workflow_still_notifies_on_release() -> None:
    wf = Fickle2()
    async with TestEnv([wf]) as env:
        await env.start("fickle2", inp("A"), "h1")
        await env.start("fickle2", inp("A"), "h2")
        await env.start("fickle2", inp("A"), "w")
        wf.variant = "b"
        await env.signal("h1", "go")  # h1's replay diverges: blocked, still holding
        wf.variant = "a"
        assert (await get(env, "h1")).status is RunStatus.BLOCKED
        assert await holders(env, "fickle2") == ["h1", "h2"]

        admin = Engine(env.store, clock=env.clock, worker=False)  # registers no workflow
        now = env.clock.now()
        await admin.cancel("h1")  # a blocked run settles directly, releasing its slot
        assert (await get(env, "h1")).status is RunStatus.CANCELLED
        w = await get(env, "w")
        assert w.wake_at is not None and w.wake_at <= now  # stamped due now by the release
        await env.advance(0)
        assert await holders(env, "fickle2") == ["h2", "w"]


# -- 7. cancellation ----------------------------------------------------------------------


async def test_cancelled_gated_waiter_settles_without_running_its_body() -> None:
    lane = make_lane()
    async with TestEnv([lane], gate_polls=True) as env:
        await env.start("lane", inp("A", "signal"), "h")
        await env.start("lane", inp("A"), "w")
        await env.advance(3)
        run = await env.cancel("w")
        assert run.status is RunStatus.CANCELLED
        assert await types(env, "w") == [
            "run_started",
            "singleton_gated",
            "cancel_requested",
            "run_cancelled",
        ]
        await env.advance(3)
        assert lane.body["w"] == 0
        assert await holders(env) == ["h"]
        with pytest.raises(Exception, match="cancelled"):
            await env.engines[0].result("w", timeout=1)
        await env.signal("h", "go")
        assert lane.entered == ["h"]  # the cancelled waiter is never admitted later


@workflow(name="tidy", singleton=Singleton(key=lambda i: i.key))
class Tidy:
    """Waits for "go"; on cancellation runs a cleanup step that waits for ``cleanup_gate``."""

    def __init__(self) -> None:
        self.cleanup_gate = asyncio.Event()
        self.body: Counter[str] = Counter()
        self.cleaned: list[str] = []

    async def cleanup(self, run_id: str) -> str:
        await self.cleanup_gate.wait()
        self.cleaned.append(run_id)
        return "clean"

    async def run(self, ctx: WorkflowCtx, input: LaneIn) -> str:
        self.body[ctx.run_id] += 1
        try:
            return await ctx.wait_for_signal("go")
        except asyncio.CancelledError:
            await ctx.step(self.cleanup, ctx.run_id)
            raise


async def test_cancelling_holder_keeps_its_slot_until_cancellation_settles() -> None:
    wf = Tidy()
    async with TestEnv([wf], gate_polls=True) as env:
        await env.start("tidy", inp("A"), "h")
        await env.start("tidy", inp("A"), "w")
        await env.cancel("h")
        h = await get(env, "h")
        assert h.status is RunStatus.CANCELLING
        assert ADMITTED_TAG in h.tags
        await env.advance(5)  # cleanup is stuck; the waiter re-checks and is denied
        assert (await get(env, "h")).status is RunStatus.CANCELLING
        assert await holders(env, "tidy") == ["h"]
        await assert_gated(env, "w")
        assert wf.body["w"] == 0

        now = env.clock.now()
        wf.cleanup_gate.set()
        await env.settle()
        assert wf.cleaned == ["h"]
        assert (await get(env, "h")).status is RunStatus.CANCELLED
        assert (await types(env, "h"))[-2:] == ["singleton_released", "run_cancelled"]
        assert await holders(env, "tidy") == ["w"]
        (adm,) = await events_of(env, "w", "singleton_admitted")
        assert adm.at == now


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled"])
async def test_cancel_of_a_settled_run_is_a_noop(outcome: str) -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        await env.start("lane", inp("A", "signal"), "h")
        if outcome == "failed":
            lane.fail.add("h")
        if outcome == "cancelled":
            await env.cancel("h")
        else:
            await env.signal("h", "go")
        before = await get(env, "h")
        events_before = await types(env, "h")
        await env.start("lane", inp("A", "signal"), "next")
        run = await env.cancel("h")
        assert run.status == outcome
        assert await get(env, "h") == before
        assert await types(env, "h") == events_before
        assert await holders(env) == ["next"]


# -- retry claims a slot again ------------------------------------------------------------


async def test_retried_run_waits_for_a_slot_and_keeps_its_queue_position() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        lane.fail.add("f")
        await env.start("lane", inp("A"), "f")
        assert (await get(env, "f")).status is RunStatus.FAILED
        assert ADMITTED_TAG not in (await get(env, "f")).tags
        await env.advance(1)
        await env.start("lane", inp("A", "signal"), "h")
        await env.advance(1)
        await env.start("lane", inp("A"), "w")  # created after "f"
        await assert_gated(env, "w")

        lane.fail.discard("f")
        await env.retry("f")
        f = await get(env, "f")
        assert f.status is RunStatus.SUSPENDED  # the slot is held by "h": it must wait
        assert ADMITTED_TAG not in f.tags
        assert (await types(env, "f"))[-2:] == ["run_retried", "singleton_gated"]
        assert await holders(env) == ["h"]

        await env.signal("h", "go")  # "f" (older) goes before "w"
        assert lane.finished == ["h", "f", "w"]
        assert (await get(env, "f")).status is RunStatus.COMPLETED
        t = await types(env, "f")
        assert t.count("singleton_admitted") == 2
        assert t.count("singleton_released") == 2
        assert t[-2:] == ["singleton_released", "run_completed"]


async def test_retried_run_reclaims_a_free_slot() -> None:
    lane = make_lane()
    async with TestEnv([lane]) as env:
        lane.fail.add("f")
        await env.start("lane", inp("A"), "f")
        with pytest.raises(WorkflowFailedError):
            await env.engines[0].result("f", timeout=1)
        lane.fail.discard("f")
        await env.retry("f")
        assert (await get(env, "f")).status is RunStatus.COMPLETED
        t = await types(env, "f")
        assert t[t.index("run_retried") + 1] == "singleton_admitted"
        assert lane.entered == ["f"]  # the completed first step replayed, not re-run


# -- hand-off: the release admits and leases the next waiter in the same commit ------------


class CallLog(MemoryStore):
    """A MemoryStore that logs the calls a hand-over could cost."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    async def commit(self, run_id, owner, now, update):  # type: ignore[no-untyped-def]
        res = await super().commit(run_id, owner, now, update)
        self.calls.append(("commit", run_id))
        self.calls.extend(("handed", h.run.id) for h in res.handed)
        return res

    async def claim(self, run_id, owner, now, lease_expires):  # type: ignore[no-untyped-def]
        self.calls.append(("claim", run_id))
        return await super().claim(run_id, owner, now, lease_expires)

    async def try_admit_singleton(self, run_id, *args):  # type: ignore[no-untyped-def]
        self.calls.append(("try_admit", run_id))
        return await super().try_admit_singleton(run_id, *args)

    async def load_events(self, run_id):  # type: ignore[no-untyped-def]
        self.calls.append(("load_events", run_id))
        return await super().load_events(run_id)


async def test_release_hands_the_slot_over_without_another_transaction() -> None:
    lane = make_lane()
    store = CallLog()
    async with TestEnv([lane], store=store) as env:
        await env.start("lane", inp("A", "event"), "h")
        await env.start("lane", inp("A", "none"), "w")
        await assert_gated(env, "w")
        store.calls.clear()
        lane.gates["h"].set()
        await env.settle()
        assert (await get(env, "w")).status is RunStatus.COMPLETED
        # h's release commit handed w over; w then ran straight into its own commits
        handed_at = store.calls.index(("handed", "w"))
        assert store.calls[handed_at - 1] == ("commit", "h")
        after = store.calls[handed_at + 1 :]
        assert after and all(c == ("commit", "w") for c in after), after
        t = await types(env, "w")
        # the admission record rides with w's first write, ahead of its first step
        assert t.index("singleton_admitted") < t.index("step_completed")
        assert t.count("singleton_admitted") == 1
        assert lane.entered == ["h", "w"]


async def test_the_releasing_instance_takes_over_a_waiter_gated_elsewhere() -> None:
    lane = make_lane()
    async with TestEnv([lane], instances=2) as env:
        await env.engines[0].start("lane", inp("A", "event"), "h")
        await env.engines[1].start("lane", inp("A", "event"), "w")
        await env.settle()
        await assert_gated(env, "w")
        lane.gates["h"].set()
        await env.settle()
        w = await get(env, "w")
        assert (w.status, w.admitted) == (RunStatus.RUNNING, True)
        assert w.lease_owner == env.engines[0].instance_id  # no cross-instance wake-up needed
        assert lane.entered == ["h", "w"]
        lane.gates["w"].set()
        await env.settle()
        assert (await get(env, "w")).status is RunStatus.COMPLETED


async def test_a_full_instance_wakes_the_waiter_instead_of_taking_it() -> None:
    lane = make_lane()
    store = CallLog()
    async with TestEnv([lane], instances=2, store=store) as env:
        full = env.engines[0]
        await full.start("lane", inp("A", "event"), "h")
        await full.start("lane", inp("B", "event"), "x")
        await env.engines[1].start("lane", inp("A", "event"), "w")
        await env.settle()
        full.max_concurrency = 1  # x keeps it full after h leaves: no room for the waiter
        lane.gates["h"].set()
        await env.settle()
        assert ("handed", "w") not in store.calls
        assert ("claim", "w") in store.calls  # woken due now, then claimed like any due run
        assert (await get(env, "w")).admitted
        assert lane.entered == ["h", "x", "w"]


async def test_a_release_hands_over_no_more_waiters_than_the_engine_has_room_for() -> None:
    store = MemoryStore()
    lane = make_lane(limit=2)
    async with TestEnv([lane], store=store) as env:
        for rid in ("h1", "h2", "w1", "w2"):
            await env.start("lane", inp("A", "signal"), rid)
        await assert_gated(env, "w1")
        now = env.clock.now()
        for rid in ("h1", "h2"):  # two slots free at once (e.g. a client cancelled both)
            await store.commit(
                rid, None, now, Update(events=[RunCompleted(at=now)], status=RunStatus.COMPLETED)
            )
        n = Notify("lane", "singleton:A", 2, claim_owner="me", lease_expires=now + 30)
        res = await store.commit(
            "w2", None, now, Update(notify=dataclasses.replace(n, max_hand_offs=1))
        )
        assert ([h.run.id for h in res.handed], res.woken) == (["w1"], ("w2",))


class HeldRelease(MemoryStore):
    """A MemoryStore whose hand-over commits wait for ``go``: a release in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.held = asyncio.Event()

    async def commit(self, run_id, owner, now, update):  # type: ignore[no-untyped-def]
        if update.notify is not None and update.notify.claim_owner is not None:
            self.held.set()
            await self.go.wait()
        return await super().commit(run_id, owner, now, update)


async def test_stopping_during_a_release_gives_the_handed_runs_lease_back() -> None:
    """An instance stopping while its release's commit is in flight lets the commit finish
    (the slot is handed over in it), does not execute the run it was handed, and gives that
    run's lease back, so another instance can claim it at once instead of after the lease
    expires."""
    lane = make_lane()
    store = HeldRelease()
    engine = Engine(store, [lane])
    await engine.start_worker()
    try:
        await engine.start("lane", inp("A", "event"), "h")
        await engine.start("lane", inp("A", "none"), "w")
        parked = await store.get_run("w")  # (gated at its creation: admits_on_create)
        assert parked is not None and (parked.status, parked.lease_owner) == (
            RunStatus.SUSPENDED,
            None,
        )
        lane.gates["h"].set()
        await store.held.wait()  # h's release is in its commit
        stopping = asyncio.ensure_future(engine.stop())
        await asyncio.sleep(0)  # (stop has begun: the instance no longer runs new work)
        store.go.set()
        await stopping
    finally:
        await engine.stop()
    h, w = await store.get_run("h"), await store.get_run("w")
    assert h is not None and h.status is RunStatus.COMPLETED
    assert w is not None and w.admitted and w.status is RunStatus.RUNNING
    assert w.lease_owner is None  # given back by stop
    assert lane.entered == ["h"]  # w was handed over but never executed here
