"""Checks of two store objects over the same data (two processes' views) competing for the
same run or the same singleton slot, concurrently through ``asyncio.gather``."""

from __future__ import annotations

import asyncio

from flowkit.errors import LeaseLostError
from flowkit.events import RunCompleted, TimerFired
from flowkit.stores.base import Notify, Store, Update

from ._on_create import admission, claimed, create
from ._registry import check
from ._support import (
    T0,
    WF,
    PairFactory,
    S,
    admitted_ids,
    expect,
    expect_eq,
    expect_raises,
    expect_unchanged,
    fail,
    get,
    make_pair,
    mk,
    numbered,
    put,
    started,
    state,
    tag_of,
)


def _orders(s1: Store, s2: Store, i: int) -> tuple[Store, Store]:
    return (s1, s2) if i % 2 == 0 else (s2, s1)


@check(kind="pair")
async def check_competing_create_run(factory: PairFactory) -> None:
    """Two instances creating the same run id at once: exactly one creates it; both get the
    stored run, and its history holds only the winner's events."""
    s1, s2 = await make_pair(factory)
    for i in range(6):
        rid = f"r{i}"
        a, b = _orders(s1, s2, i)
        ra, rb = mk(rid, t=T0 + i), mk(rid, t=T0 + i + 0.5)
        (got_a, created_a), (got_b, created_b) = await asyncio.gather(
            a.create_run(ra, started(ra)), b.create_run(rb, started(rb))
        )
        expect_eq(
            sorted([created_a, created_b]), [False, True], f"created flags of competing {rid!r}"
        )
        winner = ra if created_a else rb
        expect_eq((got_a, got_b), (winner, winner), f"runs returned by competing {rid!r}")
        for s in (s1, s2):
            expect_eq(await s.get_run(rid), winner, f"{rid!r} as each instance reads it")
            expect_eq(await s.load_events(rid), numbered(started(winner)), f"history of {rid!r}")


@check(kind="pair")
async def check_competing_claims(factory: PairFactory) -> None:
    """Two instances claiming the same run at once: exactly one wins, and both read the
    winner's lease; when the lease expires and the other instance takes the run, the first
    one's commit is fenced off (``LeaseLostError``)."""
    s1, s2 = await make_pair(factory)
    for i in range(8):
        await put(s1, mk(f"r{i}", t=T0 + i))
    for i in range(8):
        rid = f"r{i}"
        a, b = _orders(s1, s2, i)
        got = await asyncio.gather(
            a.claim(rid, "owner-a", T0 + 10, T0 + 40), b.claim(rid, "owner-b", T0 + 10, T0 + 40)
        )
        winners = [g for g in got if g is not None]
        expect_eq(len(winners), 1, f"winners of two competing claims of {rid!r} ({got!r})")
        for s in (s1, s2):
            expect_eq(await s.get_run(rid), winners[0], f"{rid!r} after the competing claims")
    # the lease expires: the instances compete again, the loser of round one may win now
    got = await asyncio.gather(
        s1.claim("r0", "owner-c", T0 + 40, T0 + 70), s2.claim("r0", "owner-d", T0 + 40, T0 + 70)
    )
    winners = [g for g in got if g is not None]
    expect_eq(len(winners), 1, f"winners of competing claims of an expired lease ({got!r})")
    old = (await get(s1, "r1")).lease_owner
    if old is None:
        fail("a claimed run has no lease_owner")
    taken = await s2.claim("r1", "owner-e", T0 + 40, T0 + 70)
    expect(taken is not None, "a run whose lease expired must be claimable by another instance")
    before = await state(s1, "r1")
    await expect_raises(
        LeaseLostError,
        s1.commit("r1", old, T0 + 41, Update(events=[TimerFired(pos="0", at=T0 + 41)])),
        "commit by the previous owner through another store object",
    )
    await expect_unchanged(s2, "r1", before, "a fenced-off commit")


@check(kind="pair")
async def check_competing_commits(factory: PairFactory) -> None:
    """Commits from two instances at once append gap-free, distinct seqs; each commit's
    events stay together."""
    s1, s2 = await make_pair(factory)
    await put(s1, mk("r"))

    async def commit(s: Store, n: int) -> tuple[int, ...]:
        evs = [TimerFired(pos=f"{n}.{j}", at=T0 + n) for j in range(2)]
        return (await s.commit("r", None, T0 + n, Update(events=evs))).seqs

    results = await asyncio.gather(*(commit(_orders(s1, s2, n)[0], n) for n in range(10)))
    flat = sorted(q for seqs in results for q in seqs)
    expect_eq(flat, list(range(2, 22)), "seqs appended by 10 competing commits of 2 events")
    for seqs in results:
        expect_eq(len(seqs), 2, "seqs of one commit")
        expect_eq(seqs[1], seqs[0] + 1, f"events of one commit must be adjacent, got {seqs}")
    evs = await s2.load_events("r")
    expect_eq([e.seq for e in evs], list(range(1, 22)), "seqs in load_events")
    by_seq = {e.seq: getattr(e, "pos", None) for e in evs}
    for n, seqs in enumerate(results):
        expect_eq(
            [by_seq[q] for q in seqs], [f"{n}.0", f"{n}.1"], f"events of commit #{n} at {seqs}"
        )


@check(kind="pair", requires=["try_admit_singleton"])
async def check_competing_admissions(factory: PairFactory) -> None:
    """Two instances admitting different waiters of one key at once never exceed the limit,
    and the slots still go to the oldest waiters; a waiter inserted ahead during the race,
    or a release racing an admission, never yields a double admission or a lost wake-up."""
    s1, s2 = await make_pair(factory)
    # A: one slot, two waiters asking at once through different instances
    for i in range(4):
        key = f"a{i}"
        old, young = f"{key}-old", f"{key}-young"
        await put(s1, mk(old, key=key, t=T0))
        await put(s1, mk(young, key=key, t=T0 + 1))
        a, b = _orders(s1, s2, i)
        tag = tag_of(key)
        ga, gb = (
            a.try_admit_singleton(young, tag, WF, 1, T0 + 1),
            b.try_admit_singleton(old, tag, WF, 1, T0 + 1),
        )
        pair = await (asyncio.gather(ga, gb) if i < 2 else asyncio.gather(gb, ga))
        expect_eq(sorted(pair), [False, True], f"admissions of two waiters for one slot of {key}")
        for s in (s1, s2):
            expect_eq(await admitted_ids(s, key), [old], f"holders of {key} after the race")
    # B: two slots, six waiters, everyone asks at once
    ids = [f"b-{i}" for i in range(6)]
    for i, rid in enumerate(ids):
        await put(s1, mk(rid, key="b", t=T0 + (5 - i) // 2))
    got = await asyncio.gather(
        *(
            _orders(s1, s2, i)[0].try_admit_singleton(rid, tag_of("b"), WF, 2, T0 + 9)
            for i, rid in enumerate(ids)
        )
    )
    oldest = ["b-4", "b-5"]  # created at T0, the others later
    expect_eq(
        sorted(r for r, ok in zip(ids, got, strict=True) if ok),
        sorted(oldest),
        "the waiters admitted to two slots by six competing admissions",
    )
    for s in (s1, s2):
        expect_eq(sorted(await admitted_ids(s, "b")), sorted(oldest), "holders of key b")
    # C: a run that sorts first is created while another waiter is being admitted
    for i in range(4):
        key = f"c{i}"
        tag = tag_of(key)
        a, b = _orders(s1, s2, i)
        await put(a, mk(f"{key}-x", key=key, t=T0 + 1))

        async def insert_and_admit(s: Store, key: str = key, tag: str = tag) -> bool:
            await put(s, mk(f"{key}-0", key=key, t=T0 + 1))  # same created_at, smaller id
            return await s.try_admit_singleton(f"{key}-0", tag, WF, 1, T0 + 2)

        raced = await asyncio.gather(
            a.try_admit_singleton(f"{key}-x", tag, WF, 1, T0 + 2), insert_and_admit(b)
        )
        expect_eq(sorted(raced), [False, True], f"admissions racing an insert on {key}")
        for s in (s1, s2):
            expect_eq(len(await admitted_ids(s, key)), 1, f"holders of {key} after the race")
    # D: a release races an admission: the waiter is admitted, or woken to retry at once
    for i in range(4):
        key = f"d{i}"
        tag = tag_of(key)
        a, b = _orders(s1, s2, i)
        await put(s1, mk(f"{key}-h", key=key, t=T0))
        await put(s1, mk(f"{key}-w", key=key, t=T0 + 1))
        expect(await s1.try_admit_singleton(f"{key}-h", tag, WF, 1, T0 + 1), "holder denied")
        release = Update(
            events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=Notify(WF, tag, 1)
        )
        commit = a.commit(f"{key}-h", None, T0 + 3, release)
        admit = b.try_admit_singleton(f"{key}-w", tag, WF, 1, T0 + 50)
        await (asyncio.gather(commit, admit) if i < 2 else asyncio.gather(admit, commit))
        w = await get(s2, f"{key}-w")
        expect(
            w.admitted or (w.wake_at is not None and w.wake_at <= T0 + 3),
            f"after a release racing its admission, {key}-w is neither admitted nor due "
            f"(wake_at={w.wake_at!r}): a lost wake-up",
        )
        expect(len(await admitted_ids(s1, key)) <= 1, f"double admission on {key}")


@check(kind="pair", requires=["try_admit_singleton", "admits_on_create"])
async def check_competing_create_admissions(factory: PairFactory) -> None:
    """Two instances creating runs of one key at once with an ``Admission`` never admit more
    runs than slots, and every run they do not admit is parked; a create racing an older
    waiter's ``try_admit_singleton`` gates the new run; a create racing a release is admitted
    or due at once (never a lost wake-up)."""
    s1, s2 = await make_pair(factory)
    # A: one slot, two new runs created at once through different instances
    for i in range(4):
        key = f"a{i}"
        a, b = _orders(s1, s2, i)
        ra, rb = claimed(f"{key}-1", key=key, t=T0), claimed(f"{key}-2", key=key, t=T0 + 1)
        pair = await asyncio.gather(
            create(a, ra, admission(T0 + 1, key=key)), create(b, rb, admission(T0 + 2, key=key))
        )
        expect_eq(
            sorted(run.admitted for run, _ in pair),
            [False, True],
            f"runs admitted by two competing creates for one slot of {key}",
        )
        for s in (s1, s2):
            expect_eq(len(await admitted_ids(s, key)), 1, f"holders of {key} after the race")
    # B: two slots, six new runs at once
    two = admission(T0 + 9, limit=2, key="b")
    got = await asyncio.gather(
        *(
            create(_orders(s1, s2, i)[0], claimed(f"b-{i}", key="b", t=T0 + i), two)
            for i in range(6)
        )
    )
    expect_eq(sum(run.admitted for run, _ in got), 2, "runs admitted by six competing creates")
    for run, _ in got:
        if not run.admitted:
            expect_eq((run.status, run.lease_owner), (S.SUSPENDED, None), f"{run.id} not admitted")
    for s in (s1, s2):
        expect_eq(len(await admitted_ids(s, "b")), 2, "holders of key b (limit 2)")
    # C: a new run is created while an older waiter is being admitted: the waiter wins
    for i in range(4):
        key = f"c{i}"
        a, b = _orders(s1, s2, i)
        await put(s1, mk(f"{key}-old", key=key, t=T0))
        admit = a.try_admit_singleton(f"{key}-old", tag_of(key), WF, 1, T0 + 2)
        new = create(b, claimed(f"{key}-new", key=key, t=T0 + 1), admission(T0 + 2, key=key))
        if i < 2:
            ok, (created, _) = await asyncio.gather(admit, new)
        else:
            (created, _), ok = await asyncio.gather(new, admit)
        expect(ok, f"the older waiter of {key} lost its slot to a run created meanwhile")
        expect(not created.admitted, f"{key}-new was admitted ahead of the older waiter")
        for s in (s1, s2):
            expect_eq(await admitted_ids(s, key), [f"{key}-old"], f"holders of {key}")
    # D: a release races a create: the new run is admitted, or woken to retry at once
    for i in range(4):
        key = f"d{i}"
        a, b = _orders(s1, s2, i)
        await create(s1, claimed(f"{key}-h", key=key), admission(T0 + 1, key=key))
        tag = tag_of(key)
        release = Update(
            events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=Notify(WF, tag, 1)
        )
        commit = a.commit(f"{key}-h", "w1", T0 + 3, release)
        new = create(b, claimed(f"{key}-w", key=key, t=T0 + 1), admission(T0 + 50, key=key))
        await (asyncio.gather(commit, new) if i < 2 else asyncio.gather(new, commit))
        w = await get(s2, f"{key}-w")
        expect(
            w.admitted or (w.wake_at is not None and w.wake_at <= T0 + 3),
            f"after a release racing its creation, {key}-w is neither admitted nor due "
            f"(wake_at={w.wake_at!r}): a lost wake-up",
        )
