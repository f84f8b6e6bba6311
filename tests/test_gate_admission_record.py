"""``singleton_admitted`` is written in the transaction that sets the admission marker, at the
instant the run took its slot, on every path that admits (admission at creation, the worker's
gate check, a release handing the slot over) and on every store: a worker dying right after
the admission cannot leave a holder whose history shows the admission at its recovery time."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from singleton_kit import events_of, get, inp, make_lane, types

from flowkit import Engine, RunStatus
from flowkit.stores import MemoryStore
from flowkit.stores.base import Update
from flowkit_testing import InstanceCrashed, Rule, TestEnv


async def _admitted_at(env: TestEnv, run_id: str) -> float:
    evs = await events_of(env, run_id, "singleton_admitted")
    assert len(evs) == 1, await types(env, run_id)
    return evs[0].at


async def test_admission_at_creation_is_recorded_with_the_insert(store: Any) -> None:
    lane = make_lane()
    async with TestEnv([lane], instances=2, lease_ttl=30, store=store) as env:
        env.crash_at(0, "after_admission")
        t0 = env.clock.now()
        with pytest.raises(InstanceCrashed):
            await env.start("lane", inp("A"), "r")
        assert await types(env, "r") == ["run_started", "singleton_admitted"]
        await env.advance(31)  # instance 1 recovers it after the lease
        assert (await get(env, "r")).status is RunStatus.COMPLETED
        assert await _admitted_at(env, "r") == t0  # not the recovery time


async def test_admission_by_the_gate_check_is_recorded_with_the_marker(store: Any) -> None:
    lane = make_lane()
    async with TestEnv([lane], lease_ttl=30, store=store) as env:
        client = Engine(env.store, [lane], clock=env.clock, worker=False)
        env.crash_at(0, "after_admission")
        await client.start("lane", inp("A"), "r")  # pending: the worker's gate admits it
        t0 = env.clock.now()
        await env.advance(0)
        assert env.crashed == [0]
        assert await types(env, "r") == ["run_started", "singleton_admitted"]
        await env.restart(0)
        await env.advance(31)
        assert (await get(env, "r")).status is RunStatus.COMPLETED
        assert await _admitted_at(env, "r") == t0


def _releases(run_id: str) -> Any:
    def match(args: Any, kwargs: Any) -> bool:
        update = kwargs.get("update", args[3] if len(args) > 3 else None)
        return args[0] == run_id and isinstance(update, Update) and update.notify is not None

    return match


@pytest.mark.parametrize("limit", [1, 2])
async def test_a_handed_over_slot_is_recorded_in_the_release(store: Any, limit: int) -> None:
    """limit=1 takes the one-statement release (PostgreSQL) or the lean one (SQLite); 2 the
    general path. The releasing instance dies right after its release committed: the waiter
    it was handed to has its admission recorded already, at the release time."""
    lane = make_lane(limit=limit)
    async with TestEnv(
        [lane], instances=2, lease_ttl=30, store=store, hung_step_after=0
    ) as env:  # (a hung step)
        holders = [f"h{i}" for i in range(limit)]
        for h in holders:
            await env.start("lane", inp("A", "event"), h)
        await env.start("lane", inp("A"), "w")  # gated behind them
        await env.settle()
        assert "singleton_admitted" not in await types(env, "w")
        env.inject(Rule("commit", "crash", "after", instance=0, match=_releases("h0")))
        released_at = env.clock.now()
        lane.gates["h0"].set()
        await env.settle()
        assert env.crashed == [0]
        assert (await get(env, "h0")).status is RunStatus.COMPLETED
        w = await get(env, "w")
        assert w.admitted and w.lease_owner == "instance-0"  # handed to the dead instance
        assert (await types(env, "w"))[-1] == "singleton_admitted"
        await env.advance(31)
        assert (await get(env, "w")).status is RunStatus.COMPLETED
        assert await _admitted_at(env, "w") == released_at
        t = await types(env, "w")
        assert t.index("singleton_gated") < t.index("singleton_admitted")


class WaitsForTheKey(MemoryStore):
    """A MemoryStore whose admission check of ``target`` first waits for ``lock`` (as a
    SQL store's check waits for the key's lock while another transaction holds it)."""

    def __init__(self) -> None:
        super().__init__()
        self.target = ""
        self.waiting = asyncio.Event()
        self.lock = asyncio.Event()

    async def try_admit_singleton(self, run_id: str, *args: Any, **kwargs: Any) -> bool:
        if run_id == self.target:
            self.waiting.set()
            await self.lock.wait()
        return await super().try_admit_singleton(run_id, *args, **kwargs)


async def test_an_admission_is_not_dated_before_the_release_it_waited_for() -> None:
    """The gate check reads the clock inside the admission's transaction: a check that waited
    for the key while the holder released is dated after that release, so the history's
    [admitted, released] intervals of one key never overlap."""
    lane = make_lane()
    store = WaitsForTheKey()
    async with TestEnv([lane], store=store, hung_step_after=0) as env:  # (a hung step)
        await env.start("lane", inp("A", "event"), "h")
        store.target = "w"
        client = Engine(store, [lane], clock=env.clock, worker=False)
        await client.start("lane", inp("A"), "w")  # pending: the worker's gate checks it
        await env.advance(1)
        assert store.waiting.is_set()  # w's check waits for the key
        await env.advance(5)
        lane.gates["h"].set()  # meanwhile the holder finishes and releases
        await env.settle()
        (released,) = await events_of(env, "h", "singleton_released")
        store.lock.set()  # the check goes on: the key is free now
        await env.settle()
        assert (await get(env, "w")).status is RunStatus.COMPLETED
        assert await _admitted_at(env, "w") >= released.at
