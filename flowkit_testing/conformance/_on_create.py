"""Checks of admission at creation (``create_run`` with an ``Admission``, stores with
``admits_on_create``) and of the ``singleton_admitted`` record a store writes with the marker
(``records_admission``)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from flowkit import ADMITTED_TAG, Run
from flowkit.errors import RunNotFoundError, SingletonQueueFullError
from flowkit.events import RunCancelled, RunCompleted, SingletonAdmitted, SingletonGated
from flowkit.stores.base import Admission, AdmitsOnCreate, Notify, QueueCap, Store, Update

from ._registry import check
from ._singleton import ON_CREATE, TAG
from ._support import (
    T0,
    WF,
    S,
    StoreFactory,
    admitted_ids,
    expect,
    expect_eq,
    expect_raises,
    expect_unchanged,
    make_store,
    mk,
    numbered,
    put,
    started,
    state,
    tag_of,
)

# -- admission at creation -------------------------------------------------------------------


def admission(
    retry: float, *, limit: int = 1, key: str = "k", wf: str = WF, at: float = T0
) -> Admission:
    """The ``Admission`` an engine passes: its gated record is ``singleton_gated``."""
    gated = SingletonGated(key=key, retry_at=retry, at=at)
    return Admission(wf, tag_of(key), limit, retry, (gated,))


async def create(
    s: Store, run: Run, adm: Admission, cap: QueueCap | None = None, **kw: Any
) -> tuple[Run, bool]:
    """``create_run`` of ``run`` (with its ``run_started``) deciding ``adm``."""
    events = kw.pop("events", started(run))
    return await cast(AdmitsOnCreate, s).create_run(run, events, queue_cap=cap, admission=adm)


def claimed(run_id: str, *, t: float = T0, owner: str = "w1", **kw: Any) -> Run:
    """A singleton run of key ``k`` as a worker with capacity creates it: running, leased."""
    kw.setdefault("key", "k")
    return mk(run_id, t=t, status=S.RUNNING, lease_owner=owner, lease_expires=t + 30, **kw)


async def expect_admitted_at_creation(
    s: Store, run: Run, adm: Admission, what: str, cap: QueueCap | None = None
) -> Run:
    """Create ``run`` deciding ``adm``: it must come back admitted, as passed otherwise."""
    stored, created = await create(s, run, adm, cap)
    expect(created, f"{what}: create_run of a new id returned created=False")
    want = dataclasses.replace(run, tags=(*run.tags, ADMITTED_TAG))
    expect_eq(stored, want, f"{what}: the run created admitted (marker added, nothing else)")
    expect_eq(await s.get_run(run.id), stored, f"{what}: get_run after an admitted create")
    expect_eq(
        await s.load_events(run.id), numbered(started(run)), f"{what}: history of an admitted run"
    )
    return stored


async def expect_gated_at_creation(
    s: Store, run: Run, adm: Admission, what: str, cap: QueueCap | None = None
) -> Run:
    """Create ``run`` deciding ``adm``: it must come back parked, with the gated events."""
    stored, created = await create(s, run, adm, cap)
    expect(created, f"{what}: create_run of a new id returned created=False")
    want = dataclasses.replace(
        run,
        status=S.SUSPENDED,
        wake_at=adm.retry_wake_at,
        lease_owner=None,
        lease_expires=None,
        updated_at=stored.updated_at,
    )
    expect_eq(stored, want, f"{what}: the run created gated (suspended, retry wake time, no lease)")
    expect_eq(await s.get_run(run.id), stored, f"{what}: get_run after a gated create")
    expect_eq(
        await s.load_events(run.id),
        numbered([*started(run), *adm.gated]),
        f"{what}: history of a gated run (its events, then the gated ones)",
    )
    return stored


@check(requires=ON_CREATE)
async def check_create_admits_on_a_free_key(factory: StoreFactory) -> None:
    """``create_run`` with an ``Admission`` on a key with a free slot stores the run admitted
    (marker added) and otherwise as passed: still leased to its creator, not claimable by
    anyone else, without the gated events. Other keys and other workflows never compete, and
    ``limit`` slots are handed out."""
    s = await make_store(factory)
    await expect_admitted_at_creation(s, claimed("h2", key="k2"), admission(T0 + 1, key="k2"), "h2")
    await expect_admitted_at_creation(
        s, claimed("hw", wf="wf2"), admission(T0 + 1, wf="wf2"), "a holder of another workflow"
    )
    h = await expect_admitted_at_creation(
        s, claimed("h", tags=("user",)), admission(T0 + 1.2), "the first run of key k"
    )
    expect_eq(h.tags, (TAG, "user", ADMITTED_TAG), "tags of a run admitted at creation")
    expect_eq(
        await s.claim("h", "other", T0 + 1, T0 + 60), None, "claim of a run leased at creation"
    )
    expect_eq(
        [r.id for r in await s.list_runs(tag=ADMITTED_TAG)],
        ["h", "h2", "hw"],
        "list_runs(tag=ADMITTED_TAG) after admissions at creation",
    )
    await put(s, mk("late", key="k", t=T0 + 1))
    expect(
        not await s.try_admit_singleton("late", TAG, WF, 1, T0 + 2),
        "a waiter was admitted to the slot a run took at its creation",
    )
    # limit 2: two admitted at creation, and a pending run (no claimer yet) stays pending
    two = admission(T0 + 2, limit=2, key="two")
    await expect_admitted_at_creation(s, claimed("t1", key="two", t=T0 + 1), two, "t1 (limit 2)")
    p = await expect_admitted_at_creation(s, mk("t2", key="two", t=T0 + 2), two, "t2 (limit 2)")
    expect_eq((p.status, p.wake_at), (S.PENDING, None), "a pending run admitted at creation")
    expect_eq(sorted(await admitted_ids(s, "two")), ["t1", "t2"], "holders of a key with limit 2")
    await expect_gated_at_creation(s, claimed("t3", key="two", t=T0 + 3), two, "t3 (limit 2)")


@check(requires=ON_CREATE)
async def check_create_gates_behind_holders(factory: StoreFactory) -> None:
    """``create_run`` with an ``Admission`` on a held key stores the run gated: ``suspended``
    with ``wake_at=retry_wake_at``, no lease, no marker, and the history ``events`` followed by
    ``Admission.gated`` (seq 1..n). It is not claimable before its wake time and is due then;
    a cancelling holder keeps the slot; the slot still goes to it once the holder settles."""
    s = await make_store(factory)
    await expect_admitted_at_creation(s, claimed("h"), admission(T0 + 1), "the holder")
    w = await expect_gated_at_creation(
        s, claimed("w", t=T0 + 1, tags=("user",)), admission(T0 + 2.25, at=T0 + 1), "w behind h"
    )
    expect(not w.admitted, "a gated run must not carry the admission marker")
    expect_eq(await s.due_runs(T0 + 2, 10), [], "due_runs before the gated run's wake time")
    expect_eq(await s.next_due_at(), T0 + 2.25, "next_due_at with a run gated at creation")
    expect_eq(await s.claim("w", "x", T0 + 2, T0 + 60), None, "claim before the retry time")
    expect_eq(await s.due_runs(T0 + 2.25, 10), ["w"], "due_runs at the gated run's wake time")
    expect(
        not await s.try_admit_singleton("w", TAG, WF, 1, T0 + 3.5),
        "the gated run was admitted while the holder holds the only slot",
    )
    # a cancelling holder keeps its slot; once it settles the gated waiter takes it
    await s.commit("h", "w1", T0 + 4, Update(status=S.CANCELLING))
    await expect_gated_at_creation(
        s, claimed("x", t=T0 + 4), admission(T0 + 5, at=T0 + 4), "x behind a cancelling holder"
    )
    await s.commit("h", "w1", T0 + 6, Update(events=[RunCancelled(at=T0 + 6)], status=S.CANCELLED))
    expect(await s.try_admit_singleton("w", TAG, WF, 1, T0 + 7), "the oldest waiter denied")
    expect(
        not await s.try_admit_singleton("x", TAG, WF, 1, T0 + 7),
        "a younger waiter took the slot after w",
    )


@check(requires=ON_CREATE)
async def check_create_admission_is_fifo_behind_waiters(factory: StoreFactory) -> None:
    """A new run is gated behind an older unadmitted waiter of its key (``pending`` or
    parked) even when a slot is free: waiters go by ``(created_at, id)``, the new run among
    them, so one with the same ``created_at`` and a smaller id goes first. Cancelling and
    settled runs do not queue ahead."""
    s = await make_store(factory)
    await put(s, mk("z", key="k", t=T0))  # an older waiter, never admitted
    await expect_gated_at_creation(
        s, claimed("a", t=T0 + 1), admission(T0 + 2, at=T0 + 1), "a behind the older waiter z"
    )
    expect_eq(await admitted_ids(s, "k"), [], "holders of k (the slot is still free)")
    expect(await s.try_admit_singleton("z", TAG, WF, 1, T0 + 2), "the oldest waiter z denied")
    # a parked waiter (gated at creation) queues ahead of later runs too
    await expect_admitted_at_creation(s, claimed("h", key="p"), admission(T0 + 1, key="p"), "h")
    await expect_gated_at_creation(
        s, claimed("p1", key="p", t=T0 + 1), admission(T0 + 2, key="p", at=T0 + 1), "p1"
    )
    await s.commit("h", "w1", T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED))
    await expect_gated_at_creation(
        s, claimed("p2", key="p", t=T0 + 4), admission(T0 + 5, key="p", at=T0 + 4), "p2 behind p1"
    )
    # same created_at: the smaller id is the older waiter
    await put(s, mk("m", key="i", t=T0))
    await expect_admitted_at_creation(
        s, claimed("b", key="i"), admission(T0 + 1, key="i"), "b (same instant as m, 'b' < 'm')"
    )
    # cancelling and settled runs of the key do not queue ahead
    await put(s, mk("c", key="x", t=T0 - 2, status=S.CANCELLING))
    await put(s, mk("d", key="x", t=T0 - 1, status=S.COMPLETED))
    await expect_admitted_at_creation(
        s,
        claimed("n", key="x"),
        admission(T0 + 1, key="x"),
        "n after a cancelling and a settled run",
    )


@check(requires=ON_CREATE)
async def check_create_admission_of_an_existing_id_writes_nothing(factory: StoreFactory) -> None:
    """``create_run`` with an ``Admission`` of an existing id returns ``(existing, False)``
    and writes nothing: no admission (even with a slot free), no parking, no gated events."""
    s = await make_store(factory)
    h = await expect_admitted_at_creation(s, claimed("h"), admission(T0 + 1), "the holder")
    w = await expect_gated_at_creation(
        s, claimed("w", t=T0 + 1), admission(T0 + 2, at=T0 + 1), "w behind h"
    )
    p = await put(s, mk("p", key="free", t=T0))  # created without admission: a pending waiter
    for run, adm in (
        (h, admission(T0 + 9, at=T0 + 5)),
        (w, admission(T0 + 9, limit=3, at=T0 + 5)),  # a slot would be free now
        (p, admission(T0 + 9, key="free", at=T0 + 5)),  # the key is free
    ):
        before = await state(s, run.id)
        again = dataclasses.replace(
            claimed(run.id, t=T0 + 5, key=run.singleton_key), input={"other": True}
        )
        got, created = await create(s, again, adm)
        expect(not created, f"create_run of the existing {run.id!r} returned created=True")
        expect_eq(got, run, f"create_run of the existing {run.id!r} must return it as stored")
        await expect_unchanged(s, run.id, before, f"create_run with an Admission of {run.id!r}")
    expect_eq(await admitted_ids(s, "free"), [], "holders of a key whose run was re-created")


@check(requires=ON_CREATE)
async def check_create_admission_respects_the_queue_cap(factory: StoreFactory) -> None:
    """With a ``QueueCap`` too, the cap is checked first: at capacity ``create_run`` raises
    ``SingletonQueueFullError`` and writes nothing (no gated run, no events); below it the
    admission is decided as without a cap, and a settled run frees its place."""
    s = await make_store(factory)
    cap = QueueCap(WF, TAG, "k", limit=1, max_queue_depth=1)
    await expect_admitted_at_creation(s, claimed("h"), admission(T0 + 1), "h (capped)", cap)
    await expect_gated_at_creation(
        s, claimed("w", t=T0 + 1), admission(T0 + 2, at=T0 + 1), "w (capped)", cap
    )
    before = {rid: await state(s, rid) for rid in ("h", "w")}
    x = claimed("x", t=T0 + 2)
    err = await expect_raises(
        SingletonQueueFullError,
        create(s, x, admission(T0 + 3, at=T0 + 2), cap),
        "create_run with an Admission at the queue cap",
    )
    expect_eq(
        (getattr(err, "workflow", None), getattr(err, "key", None)),
        (WF, "k"),
        "SingletonQueueFullError fields (workflow, key)",
    )
    expect_eq(await s.get_run("x"), None, "a run rejected by the queue cap must not exist")
    await expect_raises(
        RunNotFoundError, s.load_events("x"), "load_events of a run rejected by the queue cap"
    )
    for rid, was in before.items():
        await expect_unchanged(s, rid, was, "a create_run rejected by the queue cap")
    got, created = await create(s, claimed("w", t=T0 + 9), admission(T0 + 10), cap)
    expect(not created and got == before["w"][0], "an existing id at the queue cap")
    await s.commit("h", "w1", T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED))
    # a place is free again; the slot is too, but the older waiter w is ahead of x
    await expect_gated_at_creation(
        s, claimed("x", t=T0 + 4), admission(T0 + 5, at=T0 + 4), "x behind the waiter w", cap
    )


@check(requires=["try_admit_singleton", "admits_on_create", "records_admission"])
async def check_admission_is_recorded_with_the_marker(factory: StoreFactory) -> None:
    """A store with ``records_admission`` appends ``singleton_admitted`` in the transaction
    that sets the marker, at the admission's instant: ``try_admit_singleton(...,
    admitted_at=T)`` when it admits (not on a denial, nor when the run already held the
    slot), ``create_run`` with ``Admission.admitted`` when it admits at creation (not when
    it gates), and a release that hands the slot over (at the release's ``now``, in the
    ``HandOff``'s events). ``admitted_at`` may be a clock, read inside the transaction."""
    s: Any = await make_store(factory)

    async def admitted_events(run_id: str) -> list[tuple[str, float]]:
        return [
            (e.key, e.at) for e in await s.load_events(run_id) if isinstance(e, SingletonAdmitted)
        ]

    await put(s, mk("h", key="k", t=T0))
    await put(s, mk("w", key="k", t=T0 + 1))
    expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1, admitted_at=T0 + 0.5), "h")
    expect_eq(await admitted_events("h"), [("k", T0 + 0.5)], "h's admission record")
    expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1, admitted_at=T0 + 0.7), "again")
    expect_eq(await admitted_events("h"), [("k", T0 + 0.5)], "re-admitting a holder records")
    denied = await s.try_admit_singleton("w", TAG, WF, 1, T0 + 2, admitted_at=T0 + 0.8)
    expect(not denied, "'w' admitted behind the holder")
    expect_eq(await admitted_events("w"), [], "a denial records an admission")

    n = Notify(WF, TAG, 1, claim_owner="me", lease_expires=T0 + 100)
    res = await s.commit(
        "h", None, T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=n)
    )
    if res.handed:
        expect_eq(await admitted_events("w"), [("k", T0 + 3)], "the hand-off's record")
        expect_eq(list(res.handed[0].events), await s.load_events("w"), "the hand-off's events")
    else:  # woken: it admits itself
        expect(await s.try_admit_singleton("w", TAG, WF, 1, T0 + 5, admitted_at=T0 + 4), "w")
        expect_eq(await admitted_events("w"), [("k", T0 + 4)], "w's admission record")

    rec = SingletonAdmitted(key="c", at=T0 + 6)
    adm = dataclasses.replace(admission(T0 + 7, key="c", at=T0 + 6), admitted=(rec,))
    await create(s, claimed("c1", key="c", t=T0 + 6), adm)
    expect_eq(await admitted_events("c1"), [("c", T0 + 6)], "an admission at creation")
    await create(s, claimed("c2", key="c", t=T0 + 6.5), adm)
    expect_eq(await admitted_events("c2"), [], "a run gated at creation records an admission")

    # a clock instead of an instant: read inside the transaction (AdmittedAt)
    await put(s, mk("d", key="d", t=T0))
    d = await s.try_admit_singleton("d", tag_of("d"), WF, 1, T0 + 1, admitted_at=lambda: T0 + 9)
    expect(d, "'d' denied on a free key")
    expect_eq(await admitted_events("d"), [("d", T0 + 9)], "an admission dated by a clock")
