"""The hand-off (``_gate.hand_off``, ``_gate.commit_handing_off``): a release admits and
leases the next waiter in its own commit, and the releasing instance runs it at once, within
its room; a stopping instance gives a handed run's lease back (docs/singleton.md)."""

from __future__ import annotations

import asyncio
import dataclasses

from singleton_kit import assert_gated, get, inp, make_lane, types

from flowkit import (
    Engine,
    RunStatus,
)
from flowkit.events import RunCompleted
from flowkit.stores import MemoryStore
from flowkit.stores.base import Notify, Update
from flowkit_testing import TestEnv

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
