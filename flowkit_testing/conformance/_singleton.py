"""Checks of singleton admission (docs/singleton.md): ``try_admit_singleton`` and
notify-on-release (admission at creation: ``_on_create.py``)."""

from __future__ import annotations

import dataclasses

from flowkit import ADMITTED_TAG, Run
from flowkit.errors import RunNotFoundError
from flowkit.events import RunCompleted
from flowkit.singleton import HEAD_RECHECK
from flowkit.stores.base import Notify, Store, Update

from ._registry import check
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
    get,
    make_store,
    mk,
    put,
    state,
    tag_of,
)

TAG = tag_of("k")
ON_CREATE = ["try_admit_singleton", "admits_on_create"]


async def settle(
    s: Store, run_id: str, now: float, status: S = S.COMPLETED, notify: Notify | None = None
) -> tuple[str, ...]:
    """Settle an unleased run the way an engine does; return the woken waiters."""
    res = await s.commit(
        run_id, None, now, Update(events=[RunCompleted(at=now)], status=status, notify=notify)
    )
    expect(not res.run.admitted, f"a {status} run must lose its admission marker")
    return res.woken


def parked(before: Run, got: Run, wake_at: float | None) -> Run:
    """``before`` parked by a denial (``updated_at`` may move)."""
    return dataclasses.replace(
        before, status=S.SUSPENDED, wake_at=wake_at, updated_at=got.updated_at
    )


@check(requires=["try_admit_singleton"])
async def check_admission_fifo_keeps_holders(factory: StoreFactory) -> None:
    """Free slots go to waiters by ``(created_at, id)``; an existing holder keeps its slot
    (a later start with the same timestamp and a smaller id cannot displace it) and is
    re-admitted as it is; other keys and other workflows never compete."""
    s = await make_store(factory)
    await put(s, mk("b", key="k", t=T0))
    await put(s, mk("a", key="k", t=T0))
    await put(s, mk("z", key="k", t=T0 - 1))
    await put(s, mk("other-key", key="k2", t=T0 - 5))
    await put(s, mk("other-wf", key="k", wf="wf2", t=T0 - 5))
    expect(
        not await s.try_admit_singleton("a", TAG, WF, 1, T0 + 1.25),
        "'a' was admitted although the older 'z' waits for the only slot",
    )
    expect(
        not await s.try_admit_singleton("b", TAG, WF, 1, None),
        "'b' was admitted although the older 'z' and 'a' wait for the only slot",
    )
    expect(await s.try_admit_singleton("z", TAG, WF, 1, T0 + 1), "the oldest waiter 'z' denied")
    z = await get(s, "z")
    expect_eq(z.tags, (TAG, ADMITTED_TAG), "tags of the admitted run")
    expect_eq((z.status, z.wake_at), (S.PENDING, None), "an admitted run is not parked")
    expect(await s.try_admit_singleton("z", TAG, WF, 1, T0 + 1), "re-admission of the holder")
    expect_eq(await s.get_run("z"), z, "re-admitting a holder must change nothing")
    await put(s, mk("0", key="k", t=T0 - 1))
    expect(
        not await s.try_admit_singleton("0", TAG, WF, 1, T0 + 2),
        "a later start with the same created_at and a smaller id displaced the holder",
    )
    expect_eq(await admitted_ids(s, "k"), ["z"], "holders of key k")
    expect(
        await s.try_admit_singleton("other-key", tag_of("k2"), WF, 1, T0 + 1),
        "a run of another key was denied",
    )
    expect(
        await s.try_admit_singleton("other-wf", TAG, "wf2", 1, T0 + 1),
        "a run of another workflow sharing the tag was denied",
    )
    # limit 2 frees one more slot: for the oldest waiter ("0"), not for "a"
    expect(
        not await s.try_admit_singleton("a", TAG, WF, 2, T0 + 2),
        "'a' took the second slot although the older '0' waits",
    )
    expect(await s.try_admit_singleton("0", TAG, WF, 2, T0 + 2), "'0' denied the second slot")
    expect_eq(sorted(await admitted_ids(s, "k")), ["0", "z"], "holders of key k with limit 2")
    await expect_raises(
        RunNotFoundError,
        s.try_admit_singleton("nope", TAG, WF, 1, T0),
        "try_admit_singleton of an unknown run",
    )


@check(requires=["try_admit_singleton"])
async def check_admission_respects_limit(factory: StoreFactory) -> None:
    """With ``limit`` n, exactly the n oldest waiters are admitted whatever order they ask
    in; a released slot goes to the next oldest."""
    s = await make_store(factory)
    times = {"w0": 5, "w1": 1, "w2": 3, "w3": 1, "w4": 2, "w5": 4}
    for rid, dt in times.items():
        await put(s, mk(rid, key="k", t=T0 + dt))
    asked = ["w0", "w5", "w2", "w4", "w3", "w1"]  # youngest first
    got = [await s.try_admit_singleton(rid, TAG, WF, 3, T0 + 10) for rid in asked]
    expect_eq(
        dict(zip(asked, got, strict=True)),
        {"w0": False, "w5": False, "w2": False, "w4": True, "w3": True, "w1": True},
        "admissions with limit 3 (oldest by (created_at, id): w1, w3, w4)",
    )
    expect_eq(sorted(await admitted_ids(s, "k")), ["w1", "w3", "w4"], "holders with limit 3")
    await settle(s, "w3", T0 + 11)
    expect(
        not await s.try_admit_singleton("w0", TAG, WF, 3, T0 + 12),
        "'w0' took the released slot although the older 'w2' waits",
    )
    expect(await s.try_admit_singleton("w2", TAG, WF, 3, T0 + 12), "'w2' denied a free slot")
    expect(not await s.try_admit_singleton("w5", TAG, WF, 3, T0 + 12), "a 4th holder admitted")
    expect_eq(sorted(await admitted_ids(s, "k")), ["w1", "w2", "w4"], "holders after a release")


@check(requires=["try_admit_singleton"])
async def check_admission_skips_cancelling_and_terminal(factory: StoreFactory) -> None:
    """A ``cancelling`` or settled run is never admitted nor parked, and does not queue
    ahead of waiters; an admitted run that is cancelling keeps its slot until it settles."""
    s = await make_store(factory)
    c = await put(s, mk("c", key="k", status=S.CANCELLING, t=T0 - 2))
    d = await put(s, mk("d", key="k", status=S.COMPLETED, t=T0 - 1))
    await put(s, mk("w", key="k", t=T0))
    expect(not await s.try_admit_singleton("c", TAG, WF, 1, T0 + 1), "a cancelling run admitted")
    expect_eq(await s.get_run("c"), c, "a denied cancelling run must be left untouched")
    expect(not await s.try_admit_singleton("d", TAG, WF, 1, T0 + 1), "a completed run admitted")
    expect_eq(await s.get_run("d"), d, "a denied settled run must be left untouched")
    expect(
        await s.try_admit_singleton("w", TAG, WF, 1, T0 + 1),
        "a waiter was denied behind a cancelling and a settled run",
    )
    # a holder that is cancelling keeps its slot until cancellation settles
    k2 = tag_of("k2")
    await put(s, mk("h", key="k2", t=T0))
    await put(s, mk("x", key="k2", t=T0 + 1))
    expect(await s.try_admit_singleton("h", k2, WF, 1, T0 + 1), "the only waiter 'h' denied")
    await s.commit("h", None, T0 + 2, Update(status=S.CANCELLING))
    expect(
        not await s.try_admit_singleton("x", k2, WF, 1, T0 + 3),
        "a waiter took the slot of a cancelling holder",
    )
    h = await get(s, "h")
    expect(h.admitted and h.status is S.CANCELLING, f"cancelling holder lost its marker: {h!r}")
    expect(await s.try_admit_singleton("h", k2, WF, 1, T0 + 3), "re-admission of a holder")
    expect_eq(await s.get_run("h"), h, "re-admitting a cancelling holder must change nothing")
    await settle(s, "h", T0 + 4, S.CANCELLED)
    expect(
        await s.try_admit_singleton("x", k2, WF, 1, T0 + 5),
        "the slot of a settled cancelled holder was not freed",
    )


@check(requires=["try_admit_singleton"])
async def check_denial_parks_waiter(factory: StoreFactory) -> None:
    """A denied waiter becomes ``suspended`` with ``wake_at=retry_wake_at`` (nothing else
    changes, the lease included); without ``retry_wake_at`` nothing changes; a holder is
    never parked."""
    s = await make_store(factory)
    await put(s, mk("h", key="k", t=T0 - 1))
    expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1), "the only waiter 'h' denied")
    h = await get(s, "h")
    a = await put(s, mk("a", key="k", t=T0, tags=("user",)))
    b = await put(s, mk("b", key="k", t=T0 + 1))
    leased = await put(
        s,
        mk("l", key="k", t=T0 + 2, status=S.RUNNING, lease_owner="w1", lease_expires=T0 + 30),
    )
    expect(not await s.try_admit_singleton("a", TAG, WF, 1, T0 + 1.25), "'a' admitted twice")
    got = await get(s, "a")
    expect_eq(got, parked(a, got, T0 + 1.25), "a denied waiter parked with retry_wake_at")
    expect(not await s.try_admit_singleton("b", TAG, WF, 1, None), "'b' admitted twice")
    expect_eq(await s.get_run("b"), b, "a denial without retry_wake_at must change nothing")
    expect(not await s.try_admit_singleton("l", TAG, WF, 1, T0 + 2), "'l' admitted twice")
    got = await get(s, "l")
    expect_eq(got, parked(leased, got, T0 + 2), "a denied leased waiter parked (lease kept)")
    expect(not await s.try_admit_singleton("a", TAG, WF, 1, T0 + 3), "'a' admitted twice")
    got = await get(s, "a")
    expect_eq(got.wake_at, T0 + 3, "a new denial moves the retry wake time")
    expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 9), "holder re-admission")
    expect_eq(await s.get_run("h"), h, "a holder must never be parked")
    # due at T0+3: the pending holder and the untouched pending 'b', then 'a' (its retry time);
    # 'l' is parked but still leased
    expect_eq(await s.due_runs(T0 + 3, 10), ["h", "b", "a"], "due_runs after the denials")


@check(requires=["try_admit_singleton"])
async def check_admission_marker_persisted(factory: StoreFactory) -> None:
    """``True`` means the marker is already stored; a holder keeps it while running,
    suspended, blocked or after its lease expired."""
    s = await make_store(factory)
    await put(s, mk("a", key="k"))
    await put(s, mk("b", key="k", t=T0 + 1))
    expect(await s.try_admit_singleton("a", TAG, WF, 1, T0 + 1), "the oldest waiter denied")
    a = await get(s, "a")
    expect(a.admitted, f"try_admit_singleton returned True but the stored run has no marker: {a}")
    expect_eq(
        [r.id for r in await s.list_runs(tag=ADMITTED_TAG)], ["a"], "list_runs(tag=ADMITTED_TAG)"
    )
    steps = [
        Update(status=S.SUSPENDED, wake_at=T0 + 5, release_lease=True),
        Update(status=S.BLOCKED, wake_at=T0 + 15, release_lease=True),
        Update(status=S.RUNNING),
    ]
    now = T0 + 5
    for update in steps:
        claimed = await s.claim("a", "w1", now, now + 1)
        expect(claimed is not None and claimed.admitted, f"holder after claim: {claimed!r}")
        res = await s.commit("a", "w1", now, update)
        expect(res.run.admitted, f"holder after a {update.status} commit lost its marker")
        expect(
            not await s.try_admit_singleton("b", TAG, WF, 1, now + 1),
            f"a waiter took the slot of a {res.run.status} holder",
        )
        now += 10
    expect(
        not await s.try_admit_singleton("b", TAG, WF, 1, now + 100),
        "a waiter took the slot of a holder whose lease expired",
    )
    expect((await get(s, "a")).admitted, "the holder lost its marker")


@check(requires=["try_admit_singleton"])
async def check_notify_wakes_oldest_waiters(factory: StoreFactory) -> None:
    """A commit with ``Notify`` stamps ``wake_at=now`` on the oldest gated waiters that the
    free slots can take (one with ``limit=None``), skipping cancelling runs and other keys,
    and reports them in ``CommitResult.woken``."""
    s = await make_store(factory)
    await put(s, mk("h1", key="k", t=T0))
    await put(s, mk("h2", key="k", t=T0 + 0.5))
    await put(s, mk("cx", key="k", t=T0 + 1, status=S.CANCELLING))
    for rid, dt in (("w1", 8), ("w2", 7), ("w3", 6), ("w4", 9)):
        await put(s, mk(rid, key="k", t=T0 + dt))
    await put(s, mk("hk2", key="k2", t=T0))
    await put(s, mk("ok2", key="k2", t=T0 + 1))
    for rid in ("h1", "h2"):
        expect(await s.try_admit_singleton(rid, TAG, WF, 2, T0 + 1), f"{rid!r} denied")
    expect(await s.try_admit_singleton("hk2", tag_of("k2"), WF, 1, T0 + 1), "'hk2' denied")
    for rid in ("w1", "w2", "w3", "w4"):
        expect(not await s.try_admit_singleton(rid, TAG, WF, 2, T0 + 50), f"{rid!r} admitted")
    expect(not await s.try_admit_singleton("ok2", tag_of("k2"), WF, 1, T0 + 50), "ok2 admitted")
    ok2 = await get(s, "ok2")

    async def wakes() -> dict[str, float | None]:
        return {r: (await get(s, r)).wake_at for r in ("w1", "w2", "w3", "w4")}

    woken = await settle(s, "h1", T0 + 3, notify=Notify(WF, TAG, 2))
    expect_eq(woken, ("w3",), "woken by h1's release (one free slot; oldest waiter w3)")
    expect_eq(
        await wakes(),
        # (the heads, w3 and w2, re-check: w2's timer is brought forward to HEAD_RECHECK)
        {"w1": T0 + 50, "w2": T0 + 3 + HEAD_RECHECK, "w3": T0 + 3, "w4": T0 + 50},
        "waiters' wake times after h1's release",
    )
    expect(await s.try_admit_singleton("w3", TAG, WF, 2, T0 + 4), "woken 'w3' denied")
    woken = await settle(s, "h2", T0 + 4, notify=Notify(WF, TAG, 2))
    expect_eq(woken, ("w2",), "woken by h2's release (one free slot besides w3)")
    woken = await settle(s, "w3", T0 + 5, notify=Notify(WF, TAG, None))
    expect_eq(woken, ("w2",), "woken by a release with limit=None (the oldest waiter only)")
    woken = await settle(s, "cx", T0 + 6, S.CANCELLED, notify=Notify(WF, TAG, 2))
    expect_eq(woken, ("w2", "w1"), "woken with two free slots")
    expect_eq(
        await wakes(),
        {"w1": T0 + 6, "w2": T0 + 6, "w3": None, "w4": T0 + 50},
        "waiters' wake times after the releases",
    )
    expect_eq(await s.due_runs(T0 + 6, 10), ["hk2", "w2", "w1"], "due_runs after the releases")
    expect_eq(await s.get_run("ok2"), ok2, "a waiter of another key must not be woken")
    none = await s.commit("ok2", None, T0 + 7, Update(notify=Notify(WF, tag_of("k9"), 1)))
    expect_eq(none.woken, (), "a Notify of a key without waiters")


@check(requires=["try_admit_singleton"])
async def check_notify_hands_the_slot_over(factory: StoreFactory) -> None:
    """With ``Notify.claim_owner`` a release may hand its slot to the oldest waiter: admitted
    (marker), ``running``, leased to ``claim_owner`` until ``lease_expires``, ``wake_at``
    cleared, returned in ``CommitResult.handed`` with its history, and no longer claimable by
    anyone else. A store that does not hand over must wake it as ``Notify`` without an owner
    does. A waiter leased by another claimer is never handed over; the waiter after a handed one
    becomes the head and gets a re-check timer (``HEAD_RECHECK`` on), nothing else."""
    s = await make_store(factory)
    await put(s, mk("h", key="k", t=T0))
    await put(s, mk("w1", key="k", t=T0 + 1))
    await put(s, mk("w2", key="k", t=T0 + 2))
    expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1), "'h' denied")
    for rid in ("w1", "w2"):
        expect(not await s.try_admit_singleton(rid, TAG, WF, 1, T0 + 50), f"{rid!r} admitted")
    w2 = await get(s, "w2")
    n = Notify(WF, TAG, 1, claim_owner="me", lease_expires=T0 + 100)
    res = await s.commit(
        "h", None, T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=n)
    )
    if res.handed:
        expect_eq([h.run.id for h in res.handed], ["w1"], "handed over by h's release")
        (hand,) = res.handed
        got = await get(s, "w1")
        expect_eq(hand.run, got, "CommitResult.handed snapshot must equal get_run")
        expect_eq(
            (got.status, got.lease_owner, got.lease_expires, got.wake_at, got.admitted),
            (S.RUNNING, "me", T0 + 100, None, True),
            "the handed-over waiter's state",
        )
        expect_eq(list(hand.events), await s.load_events("w1"), "handed-over history")
        expect("w1" not in res.woken, "a handed-over waiter is not also reported woken")
        expect(await s.claim("w1", "other", T0 + 4, T0 + 60) is None, "handed run re-claimed")
    else:
        expect_eq(res.woken, ("w1",), "woken by h's release (no hand-off)")
        expect_eq((await get(s, "w1")).wake_at, T0 + 3, "the woken waiter is due now")
    # the next head (w2, once w1 was handed the slot) gets a re-check timer, nothing else
    head = dataclasses.replace(w2, wake_at=T0 + 3 + HEAD_RECHECK)
    expect_eq(await s.get_run("w2"), head if res.handed else w2, "the waiter after w1")

    s = await make_store(factory)
    await put(s, mk("h", key="k", t=T0))
    await put(s, mk("w1", key="k", t=T0 + 1))
    expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1), "'h' denied")
    expect(await s.claim("w1", "x", T0 + 2, T0 + 60) is not None, "'w1' not claimable")
    w1 = await get(s, "w1")
    res = await s.commit(
        "h", None, T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=n)
    )
    expect_eq(res.handed, (), "a waiter leased by another claimer was handed over")
    expect_eq(await s.get_run("w1"), w1, "a waiter leased by another claimer must not change")


TIED_IDS = ("é1", "b1", "Z1", "a1", "B1", "\uff5a1", "\U0001d5181")
"""Run ids started at one instant, in start order. Their code-point order is ``B1 Z1 a1 b1
é1``, then U+FF5A and U+1D518 (each followed by ``1``), which neither a locale's collation
(``a1 b1 B1 é1 Z1``) nor UTF-16 order (U+1D518, a surrogate pair, before U+FF5A) gives."""


@check(requires=["try_admit_singleton"])
async def check_admission_ties_by_code_point(factory: StoreFactory) -> None:
    """Waiters started at the same instant take a key's slot in the code-point order of their
    ids (as Python compares ``str``), whatever the collation of the store's database: each
    release (woken, or handed over with ``claim_owner``) goes to the next of them, and only
    that one is admitted."""
    s = await make_store(factory)
    await put(s, mk("h", key="k", t=T0 - 1))
    expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1), "the only waiter 'h' denied")
    for rid in TIED_IDS:
        await put(s, mk(rid, key="k", t=T0))
    want = sorted(TIED_IDS)  # (Python compares str by code point)
    for rid in reversed(want):  # the youngest asks first: every one is denied behind 'h'
        expect(not await s.try_admit_singleton(rid, TAG, WF, 1, T0 + 50), f"{rid!r} admitted")
    got: list[str] = []
    holder, owner, now = "h", None, T0 + 2.0
    for i in range(len(want)):
        # releases alternate between waking the next waiter and handing it the slot
        hand = i % 2 == 0
        n = Notify(WF, TAG, 1, claim_owner="me" if hand else None, lease_expires=now + 100)
        done = Update(events=[RunCompleted(at=now)], status=S.COMPLETED, notify=n)
        res = await s.commit(holder, owner, now, done)
        if res.handed:
            holder, owner = res.handed[0].run.id, "me"
        else:
            expect_eq(len(res.woken), 1, f"release {i + 1} woke one waiter")
            holder, owner = res.woken[0], None
            rest = [r for r in want if r not in got and r != holder]
            if rest:  # the youngest: not its turn
                expect(
                    not await s.try_admit_singleton(rest[-1], TAG, WF, 1, now + 50),
                    f"{rest[-1]!r} admitted before {holder!r}",
                )
            expect(
                await s.try_admit_singleton(holder, TAG, WF, 1, now + 50),
                f"the woken {holder!r} was denied",
            )
        got.append(holder)
        now += 1.0
    expect_eq(got, want, "the order in which the tied waiters took the slot")


@check(requires=["try_admit_singleton"])
async def check_admission_rejects_a_limit_below_one(factory: StoreFactory) -> None:
    """``try_admit_singleton`` with a ``limit`` below 1 (a key without a slot) raises
    ``ValueError`` and writes nothing: the run is neither admitted nor parked."""
    s = await make_store(factory)
    await put(s, mk("w", key="k"))
    before = await state(s, "w")
    for limit in (0, -1):
        await expect_raises(
            ValueError,
            s.try_admit_singleton("w", TAG, WF, limit, T0 + 1),
            f"try_admit_singleton with limit={limit}",
        )
        await expect_unchanged(s, "w", before, f"try_admit_singleton with limit={limit}")
    expect(await s.try_admit_singleton("w", TAG, WF, 1, T0 + 1), "'w' denied a free slot")
