"""The engine side of the gate (``flowkit._worker.gate``): its pieces one by one (re-check time, the
gate records of an episode, the direct cancel, the hand-off request, admission at creation
only where the store has it), and a run cancelled while its own admission check is in flight,
which settles ``cancelled`` without a ``singleton_gated`` record (a cancelled run is not
gated), whether the key was free or not."""

from __future__ import annotations

import random
from typing import Any

import pytest
from singleton_kit import JITTER, RETRY, get, inp, make_lane, types

from flowkit import ADMITTED_TAG, Engine, Run, RunStatus
from flowkit._model.definition import definition_of
from flowkit._worker import gate as gate
from flowkit.events import (
    RunRetried,
    RunStarted,
    SingletonAdmitted,
    SingletonGated,
    SingletonReleased,
)
from flowkit.stores import MemoryStore
from flowkit.stores.base import Notify, Update
from flowkit_testing import TestEnv, VirtualClock

T0 = 1_767_225_600.0


def _run(
    status: RunStatus = RunStatus.SUSPENDED, *, key: str | None = "A", admitted: bool = False
) -> Run:
    tags = () if key is None else (f"singleton:{key}",) + ((ADMITTED_TAG,) if admitted else ())
    return Run(
        id="r",
        workflow="lane",
        workflow_version="1",
        status=status,
        input=None,
        tags=tags,
        created_at=T0,
        updated_at=T0,
        singleton_key=key,
    )


def test_a_denied_waiter_re_checks_a_jittered_second_later_from_the_injected_rng() -> None:
    got = [gate.retry_wake_at(T0, random.Random(7)) for _ in range(2)]
    assert got[0] == got[1]  # the RNG decides, nothing else
    draws = [gate.retry_wake_at(T0, rng) for rng in [random.Random(7)] for _ in range(200)]
    assert all(T0 + RETRY - JITTER <= t <= T0 + RETRY + JITTER for t in draws)
    assert len(set(draws)) > 100 and all(round(t, 6) == t for t in draws)


def test_each_gating_episode_records_gated_once_and_each_admission_once() -> None:
    started = RunStarted(at=T0, workflow="lane", version="1", input=None, tags=[])
    gated = SingletonGated(key="A", retry_at=T0 + 1, at=T0)
    admitted = SingletonAdmitted(key="A", at=T0)
    released = SingletonReleased(key="A", at=T0)
    retried = RunRetried(attempt=2, at=T0)
    assert gate.needs_gated_event([started])
    assert not gate.needs_gated_event([started, gated])
    assert gate.needs_gated_event([started, gated, admitted, released, retried])
    assert gate.needs_admitted_event([started, gated])
    assert not gate.needs_admitted_event([started, gated, admitted])  # a recovered holder
    assert gate.needs_admitted_event([started, admitted, released, retried])


def test_cancelling_at_once_releases_a_held_slot_and_notifies_the_key() -> None:
    holder = gate.cancel_at_once(_run(RunStatus.BLOCKED, admitted=True), 2, T0)
    assert [e.type for e in holder.events] == [
        "cancel_requested",
        "singleton_released",
        "run_cancelled",
    ]
    assert holder.status is RunStatus.CANCELLED
    assert holder.expect_status == frozenset({RunStatus.BLOCKED})
    assert holder.notify == Notify("lane", "singleton:A", 2)

    waiter = gate.cancel_at_once(_run(), None, T0)  # (limit unknown to a client)
    assert [e.type for e in waiter.events] == ["cancel_requested", "run_cancelled"]
    assert waiter.notify == Notify("lane", "singleton:A", None)
    assert gate.waiting(_run()) and not gate.waiting(_run(admitted=True))

    plain = gate.cancel_at_once(_run(RunStatus.PENDING, key=None), None, T0)
    assert [e.type for e in plain.events] == ["cancel_requested", "run_cancelled"]
    assert plain.notify is None and not gate.waiting(_run(key=None))


def test_a_hand_off_asks_the_store_to_lease_the_next_waiters_here() -> None:
    update = Update(status=RunStatus.COMPLETED, notify=Notify("lane", "singleton:A", 1))
    asked = gate.hand_off(update, "me", T0 + 30, 3)
    assert asked.notify == Notify(
        "lane", "singleton:A", 1, claim_owner="me", lease_expires=T0 + 30, max_hand_offs=3
    )
    assert asked.status is RunStatus.COMPLETED and update.notify.claim_owner is None  # type: ignore[union-attr]


def test_admission_at_creation_only_where_the_store_decides_it() -> None:
    lane = make_lane(max_queue_depth=4)
    defn = definition_of(lane)
    assert defn is not None
    clock = VirtualClock(T0)

    class NoCreateAdmission(MemoryStore):
        admits_on_create = False

    assert gate.Gate(NoCreateAdmission(), clock, random.Random(1)).admission(defn, "A", T0) is None
    adm = gate.Gate(MemoryStore(), clock, random.Random(1)).admission(defn, "A", T0)
    assert adm is not None
    assert (adm.workflow, adm.tag, adm.limit) == ("lane", "singleton:A", 1)
    assert adm.retry_wake_at == gate.retry_wake_at(T0, random.Random(1))
    assert [e.type for e in (*adm.gated, *adm.admitted)] == [
        "singleton_gated",
        "singleton_admitted",
    ]
    cap = gate.queue_cap(defn, "A")
    assert cap is not None and (cap.tag, cap.capacity) == ("singleton:A", 5)
    assert gate.queue_cap(definition_of(make_lane()), "A") is None  # type: ignore[arg-type]


class CancelDuringAdmission(MemoryStore):
    """A MemoryStore that, once, lets a client cancel ``target`` just before the admission
    check of ``target`` runs: the interleaving of a cancel racing the worker's gate."""

    def __init__(self) -> None:
        super().__init__()
        self.client: Engine | None = None
        self.target = ""

    async def try_admit_singleton(self, run_id: str, *args: Any, **kwargs: Any) -> bool:
        client, self.client = self.client, None
        if client is not None and run_id == self.target:
            await client.cancel(run_id)
        return await super().try_admit_singleton(run_id, *args, **kwargs)


@pytest.mark.parametrize("key_free", [True, False])
async def test_cancel_during_the_admission_check_settles_cancelled_not_gated(
    key_free: bool,
) -> None:
    lane = make_lane()
    store = CancelDuringAdmission()
    async with TestEnv([lane], store=store) as env:
        if not key_free:
            await env.start("lane", inp("A", "signal"), "holder")
        client = Engine(store, [lane], worker=False, clock=env.clock)
        await client.start("lane", inp("A"), "w")  # pending: a worker's gate check admits it
        store.client, store.target = client, "w"
        await env.advance(1)
        await env.settle()
        assert store.client is None  # the interleaving happened
        run = await get(env, "w")
        assert run.status is RunStatus.CANCELLED
        assert await types(env, "w") == ["run_started", "cancel_requested", "run_cancelled"]
        assert lane.body["w"] == 0
        if not key_free:
            assert (await get(env, "holder")).admitted
