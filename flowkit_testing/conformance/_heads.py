"""Checks of the waiting rule of deep queues (docs/singleton.md, "Deep queues"): only the
heads of a key's queue (its ``limit`` oldest waiters) hold a re-check timer once every
waiter has re-checked (``try_admit_singleton(..., recheck=True)``; a first denial re-checks
wherever it stands, docs/singleton.md, "Deep queues"), and the waiter that becomes a head gets one
in the transaction that made it one, on every way the head changes: a holder's release (hand-off or
wake-up), a waiter ahead cancelled, the head admitted by its own check. Stores without
``rechecks_heads`` pass them as not applicable."""

from __future__ import annotations

import dataclasses
from typing import cast

from flowkit.events import RunCompleted
from flowkit.singleton import HEAD_RECHECK
from flowkit.stores.base import Notify, RecordsAdmission, Store, Update, rechecks_heads

from ._registry import check
from ._support import T0, WF, S, StoreFactory, expect, expect_eq, get, make_store, mk, put, tag_of

TAG = tag_of("k")


async def _queue(s: Store, limit: int, waiters: int, deadline: float | None = None) -> None:
    """``limit`` holders ``h``, ``h2``.. (admitted) and ``waiters`` denied waiters ``w1``..
    (oldest first; the last with ``deadline_at=deadline``), each denied a first time (a
    timer at ``T0 + 1.5``) and then re-checked (``recheck=True``)."""
    for i in range(1, limit + 1):
        rid = "h" if i == 1 else f"h{i}"
        await put(s, mk(rid, key="k", t=T0 - 1 + i / 10))
        expect(await s.try_admit_singleton(rid, TAG, WF, limit, T0 + 1), f"{rid!r} denied")
    for i in range(1, waiters + 1):
        run = mk(f"w{i}", key="k", t=T0 + i)
        if i == waiters:
            run = dataclasses.replace(run, deadline_at=deadline)
        await put(s, run)
    for i in range(1, waiters + 1):
        expect(not await s.try_admit_singleton(f"w{i}", TAG, WF, limit, T0 + 1.5), f"w{i} in")
    expect_eq(await _wakes(s, waiters), [T0 + 1.5] * waiters, "wake times after first denials")
    for i in range(1, waiters + 1):
        expect(not await _recheck(s, f"w{i}", limit, T0 + 2), f"w{i} admitted")


async def _recheck(s: Store, run_id: str, limit: int, at: float) -> bool:
    """A re-check of ``run_id`` (a waiter denied before) retrying at ``at``."""
    admit = cast(RecordsAdmission, s).try_admit_singleton
    return await admit(run_id, TAG, WF, limit, at, recheck=True)


async def _wakes(s: Store, n: int) -> list[float | None]:
    return [(await get(s, f"w{i}")).wake_at for i in range(1, n + 1)]


@check(requires=["try_admit_singleton"])
async def check_only_heads_hold_a_timer(factory: StoreFactory) -> None:
    """Denied waiters of a key with limit 1: the oldest re-checks at ``retry_wake_at``, the
    others hold no timer (``wake_at`` ``None``) and are never due; with limit 2 the two
    oldest re-check. A waiter behind them with a deadline wakes at its deadline (its
    ``execution_timeout``), not before."""
    s = await make_store(factory)
    if not rechecks_heads(s):
        return
    await _queue(s, 1, 4, deadline=T0 + 500)
    expect_eq(await _wakes(s, 4), [T0 + 2, None, None, T0 + 500], "wake times behind one slot")
    expect_eq(await s.due_runs(T0 + 100, 10), ["h", "w1"], "due: the holder, the head")
    s = await make_store(factory)
    if not rechecks_heads(s):
        return
    await _queue(s, 2, 4)
    expect_eq(await _wakes(s, 4), [T0 + 2, T0 + 2, None, None], "wake times behind two slots")


@check(requires=["try_admit_singleton"])
async def check_the_next_head_gets_a_timer(factory: StoreFactory) -> None:
    """The waiter that becomes the head gets ``wake_at`` no later than ``HEAD_RECHECK`` after
    the transaction that made it one: a release that hands the slot over (or wakes the head),
    a cancelled waiter ahead of it (no slot freed), and an admission of the head by its own
    check. The waiters behind it stay without a timer."""
    # a release: the head is handed the slot (or woken); the next one becomes the head
    s = await make_store(factory)
    if not rechecks_heads(s):
        return
    await _queue(s, 1, 3)
    n = Notify(WF, TAG, 1, claim_owner="me", lease_expires=T0 + 100)
    done = Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=n)
    res = await s.commit("h", None, T0 + 3, done)
    wakes = await _wakes(s, 3)
    if res.handed:
        expect_eq(wakes[1:], [T0 + 3 + HEAD_RECHECK, None], "after a hand-off: w2 is the head")
    else:
        expect_eq(wakes, [T0 + 3, None, None], "after a wake-up: w1 is still the head")
    # a waiter ahead cancelled while the holder keeps the slot
    s = await make_store(factory)
    if not rechecks_heads(s):
        return
    await _queue(s, 1, 3)
    cancel = Update(events=[RunCompleted(at=T0 + 3)], status=S.CANCELLED, notify=Notify(WF, TAG, 1))
    res = await s.commit("w1", None, T0 + 3, cancel)
    expect_eq(res.woken, (), "a cancelled waiter frees no slot")
    expect_eq(await _wakes(s, 3), [None, T0 + 3 + HEAD_RECHECK, None], "w2 is the head")
    # the head admitted by its own check: the holder settled without a notification
    s = await make_store(factory)
    if not rechecks_heads(s):
        return
    await _queue(s, 1, 3)
    await s.commit("h", None, T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED))
    expect(await s.try_admit_singleton("w1", TAG, WF, 1, T0 + 4), "the head w1 denied")
    expect_eq((await _wakes(s, 3))[1:], [T0 + 4, None], "w2 is the head after w1's admission")
