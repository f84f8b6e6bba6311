"""Checks of ``claims_gated`` (``flowkit.stores.base.ClaimsGated``): a gated waiter's re-check
decided in its claim. Denied, it writes the waiter's next ``wake_at`` only (no lease, no
event); admitted, the run is claimed with its marker and ``singleton_admitted``, and the next
head gets its timer; any other run is claimed as without ``gate``."""

from __future__ import annotations

from typing import cast

from flowkit import Run
from flowkit.events import RunCompleted
from flowkit.stores.base import ClaimsGated, GateCheck, Store, Update

from ._registry import check
from ._support import T0, WF, S, StoreFactory, expect, expect_eq, get, make_store, mk, put, tag_of

TAG = tag_of("k")


def _gate(retry: float, at: float, limits: dict[tuple[str, str], int] | None = None) -> GateCheck:
    return GateCheck({(WF, "1"): 1} if limits is None else limits, lambda d: retry, lambda: at)


async def _claim(s: Store, run_id: str, now: float, gate: GateCheck) -> Run | None:
    return await cast(ClaimsGated, s).claim(run_id, "me", now, now + 30, gate=gate)


async def _queue(s: Store, deadline: float | None = None) -> None:
    """Holder ``h`` (admitted), head ``w1`` (re-check at ``T0 + 2``; ``deadline_at``
    ``deadline``), ``w2`` behind it."""
    await put(s, mk("h", key="k", t=T0 - 1))
    expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1), "'h' denied")
    for i in (1, 2):
        await put(s, mk(f"w{i}", key="k", t=T0 + i, deadline_at=deadline if i == 1 else None))
        expect(not await s.try_admit_singleton(f"w{i}", TAG, WF, 1, T0 + 2), f"w{i} admitted")
    # (a first denial keeps its re-check wherever it stands; a later one behind the head
    # holds none: w2 as a re-check left it)
    await s.commit("w2", None, T0 + 2, Update(wake_at=None))


@check(requires=["try_admit_singleton", "claims_gated"])
async def check_gated_claim_denied_writes_only_the_next_recheck(factory: StoreFactory) -> None:
    """A due head whose key is full: ``claim(gate=)`` claims nothing, returns the run parked
    (not leased, ``suspended``, ``wake_at`` the gate's retry), and writes no event; the
    waiter behind it keeps no timer."""
    s = await make_store(factory)
    await _queue(s)
    before = await s.load_events("w1")
    got = await _claim(s, "w1", T0 + 3, _gate(T0 + 4.5, T0 + 3))
    expect(got is not None, "a denied re-check returns the parked run")
    assert got is not None
    expect_eq((got.status, got.lease_owner, got.wake_at), (S.SUSPENDED, None, T0 + 4.5), "parked")
    w1 = await get(s, "w1")
    expect_eq((w1.status, w1.lease_owner, w1.wake_at), (S.SUSPENDED, None, T0 + 4.5), "stored")
    expect(not w1.admitted, "a denied waiter is not admitted")
    expect_eq(await s.load_events("w1"), before, "a denied re-check writes no event")
    expect_eq((await get(s, "w2")).wake_at, None, "the waiter behind the head keeps no timer")
    expect_eq(await _claim(s, "w2", T0 + 3, _gate(T0 + 4, T0 + 3)), None, "w2")


@check(requires=["try_admit_singleton", "claims_gated"])
async def check_gated_claim_admits_and_claims(factory: StoreFactory) -> None:
    """A due head with a free slot: ``claim(gate=)`` leases it to the owner, ``running``, with
    the admission marker and one ``singleton_admitted`` at ``gate.admitted_at()``; the next
    waiter becomes the head and gets the gate's retry as its re-check. A run that is no gated
    waiter (pending, or a waiter whose deadline passed) is claimed as without ``gate``."""
    s = await make_store(factory)
    await _queue(s)
    done = Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED)
    await s.commit("h", None, T0 + 3, done)  # (no notification: the head re-checks)
    got = await _claim(s, "w1", T0 + 5, _gate(T0 + 6, T0 + 5))
    expect(got is not None and got.lease_owner == "me", "an admitted re-check claims the run")
    assert got is not None
    expect_eq((got.status, got.admitted, got.lease_expires), (S.RUNNING, True, T0 + 35), "run")
    evs = await s.load_events("w1")
    adm = [e for e in evs if e.type == "singleton_admitted"]
    expect_eq([(getattr(e, "key", None), e.at) for e in adm], [("k", T0 + 5)], "admitted once")
    expect_eq(evs[-1].type, "singleton_admitted", "the admission is the newest event")
    expect_eq((await get(s, "w2")).wake_at, T0 + 6, "the next head gets its re-check")
    # any other run: the plain claim
    await put(s, mk("p", t=T0 + 7))
    p = await _claim(s, "p", T0 + 8, _gate(T0 + 9, T0 + 8))
    expect(p is not None and p.lease_owner == "me" and not p.admitted, "a pending run")
    s = await make_store(factory)
    await _queue(s, deadline=T0 + 2.5)
    # (its deadline passes by its re-check: it is claimed, to be cancelled, not admitted)
    c = await _claim(s, "w1", T0 + 3, _gate(T0 + 4, T0 + 3))
    expect(c is not None and c.lease_owner == "me" and not c.admitted, "a waiter past deadline")
