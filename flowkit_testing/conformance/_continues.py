"""Checks of continue-as-new (``commit`` with ``Update.successor``, stores with
``continues_as_new``): the run settles and its successor is created in one transaction, or
nothing is written."""

from __future__ import annotations

import dataclasses

from flowkit import ADMITTED_TAG, Run
from flowkit.errors import ConflictError
from flowkit.events import (
    RunCompleted,
    RunContinued,
    RunStarted,
    SingletonAdmitted,
    SingletonReleased,
)
from flowkit.stores.base import EVENT_MARK_PREFIX, Successor, Update

from ._registry import check
from ._support import (
    T0,
    S,
    StoreFactory,
    admitted_ids,
    expect,
    expect_eq,
    expect_raises,
    expect_unchanged,
    get,
    make_store,
    mk,
    put,
    state,
)


def successor(prev: Run, sid: str, *, t: float, owner: str | None = None) -> Successor:
    """The successor an engine passes: ``prev``'s workflow, version and tags, a new input,
    leased to ``owner`` (running) or pending, with its ``run_started`` (and, admitted,
    ``singleton_admitted``)."""
    admitted = ADMITTED_TAG in prev.tags
    run = dataclasses.replace(
        prev,
        id=sid,
        status=S.RUNNING if owner else S.PENDING,
        input={"n": 2, "name": sid},
        created_at=t,
        updated_at=t,
        lease_owner=owner,
        lease_expires=t + 30 if owner else None,
        wake_at=None,
        continued_as=None,
    )
    clean = [tg for tg in prev.tags if tg != ADMITTED_TAG]
    events: list[RunStarted | SingletonAdmitted] = [
        RunStarted(
            seq=1,
            at=t,
            workflow=run.workflow,
            version=run.workflow_version,
            input=run.input,
            tags=clean,
        )
    ]
    if admitted and prev.singleton_key is not None:
        events.append(SingletonAdmitted(seq=2, key=prev.singleton_key, at=t))
    return Successor(run, tuple(events))


def continuation(prev: Run, succ: Successor, t: float) -> Update:
    """The commit that settles ``prev`` by continuing as ``succ``."""
    released = [SingletonReleased(key=prev.singleton_key, at=t)] if prev.admitted else []
    return Update(
        events=[
            *released,
            RunContinued(next_run_id=succ.run.id, input=succ.run.input, at=t),
            RunCompleted(output=None, at=t),
        ],
        status=S.COMPLETED,
        output=None,
        expect_status=frozenset({S.RUNNING}),
        successor=succ,
    )


@check(requires=("continues_as_new",))
async def check_continue_as_new_creates_the_successor(make: StoreFactory) -> None:
    """A continuation settles the run ``completed`` with ``continued_as`` naming its
    successor, which exists with its own history from seq 1; a successor leased to the
    committer comes back in ``handed``, one without a lease does not."""
    s = await make_store(make)
    for owner in ("w1", None):
        rid = f"c-{owner}"
        prev = await put(s, mk(rid, status=S.RUNNING, lease_owner="w1", lease_expires=T0 + 30))
        succ = successor(prev, f"{rid}~1", t=T0 + 1, owner=owner)
        res = await s.commit(rid, "w1", T0 + 1, continuation(prev, succ, T0 + 1))
        expect_eq(res.run.status, S.COMPLETED, "the continued run's status")
        expect_eq(res.run.continued_as, f"{rid}~1", "the continued run's continued_as")
        stored = await get(s, rid)
        expect_eq(stored.continued_as, f"{rid}~1", "continued_as as stored")
        types = [e.type for e in await s.load_events(rid)]
        expect_eq(types[-2:], ["run_continued", "run_completed"], "the run's last events")
        nxt, events = await state(s, f"{rid}~1")
        expect(nxt is not None, "the successor was not created")
        assert nxt is not None
        expect_eq(nxt.status, succ.run.status, "the successor's status")
        expect_eq(nxt.input, succ.run.input, "the successor's input")
        expect_eq(nxt.lease_owner, owner, "the successor's lease owner")
        expect_eq([e.seq for e in events], [1], "the successor's history seqs")
        expect_eq(events[0].type, "run_started", "the successor's first event")
        handed = [h.run.id for h in res.handed]
        expect_eq(handed, [f"{rid}~1"] if owner else [], "the successor handed to its owner")


@check(requires=("continues_as_new",))
async def check_continue_as_new_is_all_or_nothing(make: StoreFactory) -> None:
    """A continuation whose successor id exists, or whose run is no longer as expected (a
    cancel landed: ``cancelling``), raises ``ConflictError`` and writes nothing: neither the
    run's settlement nor the successor."""
    s = await make_store(make)
    prev = await put(s, mk("a", status=S.RUNNING, lease_owner="w1", lease_expires=T0 + 30))
    taken = await put(s, mk("a~1", t=T0 - 5))
    before, taken_before = await state(s, "a"), await state(s, "a~1")
    succ = successor(prev, "a~1", t=T0 + 1, owner="w1")
    await expect_raises(
        ConflictError,
        s.commit("a", "w1", T0 + 1, continuation(prev, succ, T0 + 1)),
        "a continuation to an existing id",
    )
    await expect_unchanged(s, "a", before, "a continuation to an existing id")
    await expect_unchanged(s, "a~1", taken_before, "a continuation to an existing id")
    expect_eq((await get(s, "a~1")).input, taken.input, "the existing run's input")
    # a cancel landed first: the expected status fails, no successor
    cancelling = await put(s, mk("b", status=S.CANCELLING, lease_owner="w1", lease_expires=T0 + 30))
    before = await state(s, "b")
    succ = successor(cancelling, "b~1", t=T0 + 1, owner="w1")
    await expect_raises(
        ConflictError,
        s.commit("b", "w1", T0 + 1, continuation(cancelling, succ, T0 + 1)),
        "a continuation of a cancelling run",
    )
    await expect_unchanged(s, "b", before, "a continuation of a cancelling run")
    expect(await s.get_run("b~1") is None, "a refused continuation created its successor")


@check(requires=("continues_as_new", "try_admit_singleton"))
async def check_continue_as_new_passes_the_slot(make: StoreFactory) -> None:
    """A singleton holder continuing as new passes its slot on in the same transaction: the
    successor is stored admitted, the waiter that queued meanwhile stays parked (not woken:
    the update carries no notify) and the key keeps exactly one holder."""
    s = await make_store(make)
    holder = await put(
        s, mk("h", key="k", status=S.RUNNING, lease_owner="w1", lease_expires=T0 + 30)
    )
    expect(await s.try_admit_singleton("h", "singleton:k", holder.workflow, 1), "admission")
    holder = await get(s, "h")
    waiter = await put(s, mk("w", key="k", t=T0 + 0.5))
    expect(
        not await s.try_admit_singleton("w", "singleton:k", waiter.workflow, 1, T0 + 500),
        "a waiter admitted behind a holder",
    )
    parked = await get(s, "w")
    succ = successor(holder, "h~1", t=T0 + 1, owner="w1")
    expect(ADMITTED_TAG in succ.run.tags, "(the successor carries the marker)")
    res = await s.commit("h", "w1", T0 + 1, continuation(holder, succ, T0 + 1))
    expect_eq(res.woken, (), "waiters woken by a slot passed on")
    expect_eq(await admitted_ids(s, "k", holder.workflow), ["h~1"], "the key's holders")
    expect_eq((await get(s, "w")).wake_at, parked.wake_at, "the waiter's wake_at")
    types = [e.type for e in await s.load_events("h~1")]
    expect_eq(types, ["run_started", "singleton_admitted"], "the successor's history")


@check(requires=("continues_as_new",))
async def check_continue_as_new_keeps_the_inbox(make: StoreFactory) -> None:
    """The continuation moves the signals and updates its run had not taken to the
    successor, in order (``STAYING_PREFIXES``: the mark of an event delivered to one of the
    run's own waits and a child's wake-up stay); ``deliver_signal`` of a signal or update to
    a run that continued as new delivers to the last run of its chain and returns that run
    (docs/composing-workflows.md)."""
    s = await make_store(make)
    prev = await put(s, mk("i", status=S.RUNNING, lease_owner="w1", lease_expires=T0 + 30))
    for n, name in enumerate(("a", "b", "a", "flowkit:update:change")):
        await s.deliver_signal("i", name, {"n": n}, T0)
    await s.deliver_signal("i", EVENT_MARK_PREFIX + "3", None, T0)
    await s.deliver_signal("i", "flowkit:child:i.child.1", None, T0)
    succ = successor(prev, "i~1", t=T0 + 1, owner="w1")
    await s.commit("i", "w1", T0 + 1, continuation(prev, succ, T0 + 1))
    for name in ("a", "b", "flowkit:update:change"):
        expect(await s.peek_signal("i", name) is None, f"signal {name!r} left behind")
    mark = await s.peek_signal("i", EVENT_MARK_PREFIX + "3")
    expect(mark is not None, "an event's mark moved with the inbox")
    for child in ("i.child.1", "i.child.2"):  # (a child's wake-up stays with its parent)
        if child == "i.child.2":
            got = await s.deliver_signal("i", f"flowkit:child:{child}", None, T0 + 1)
            expect_eq(got.id, "i", "the run a child's wake-up went to")
        woke = await s.peek_signal("i", f"flowkit:child:{child}")
        expect(woke is not None, "a child's wake-up moved to the parent's successor")
        gone = await s.peek_signal("i~1", f"flowkit:child:{child}")
        expect(gone is None, "a child's wake-up moved to the parent's successor")
    expect(
        await s.peek_signal("i~1", EVENT_MARK_PREFIX + "3") is None,
        "an event's mark moved with the inbox",
    )
    first = await s.peek_signal("i~1", "a")
    expect(first is not None and first.payload == {"n": 0}, "the successor's first 'a'")
    assert first is not None
    await s.commit("i~1", "w1", T0 + 2, Update(consume_signal=first.id))
    second = await s.peek_signal("i~1", "a")
    expect(second is not None and second.payload == {"n": 2}, "the successor's second 'a'")
    upd = await s.peek_signal("i~1", "flowkit:update:change")
    expect(upd is not None and upd.payload == {"n": 3}, "the successor's update")
    got = await s.deliver_signal("i", "late", {"n": 4}, T0 + 3)
    expect_eq(got.id, "i~1", "the run a signal to a continued run went to")
    late = await s.peek_signal("i~1", "late")
    expect(late is not None and late.payload == {"n": 4}, "a signal to a continued run")
    expect(await s.peek_signal("i", "late") is None, "a signal left with a continued run")
