"""Checks of what wakes a run: signals (delivery, FIFO peek) and due times (``due_runs``,
``next_due_at``, ``next_due_after``)."""

from __future__ import annotations

from typing import Any

from flowkit.errors import (
    RunNotFoundError,
)
from flowkit.events import (
    RunCompleted,
)
from flowkit.stores.base import Update

from ._registry import check
from ._support import (
    T0,
    S,
    StoreFactory,
    expect,
    expect_eq,
    expect_raises,
    expect_unchanged,
    fail,
    make_store,
    mk,
    put,
    state,
)

# -- signals ---------------------------------------------------------------------------------


@check()
async def check_deliver_signal_wakes_waiter(factory: StoreFactory) -> None:
    """``deliver_signal`` makes a run suspended waiting for that name due now; other names
    only buffer; a signal buffered before the wait makes the wait due at once; an unknown run
    raises ``RunNotFoundError``."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    await s.commit(
        "r",
        "w1",
        T0 + 1,
        Update(status=S.SUSPENDED, waiting_signals=("go",), wake_at=None, release_lease=True),
    )
    run = await s.deliver_signal("r", "other", 1, T0 + 2)
    expect_eq(
        (run.status, run.wake_at), (S.SUSPENDED, None), "a signal nobody waits for must not wake"
    )
    expect_eq(await s.due_runs(T0 + 2, 10), [], "due_runs after a signal nobody waits for")
    run = await s.deliver_signal("r", "go", {"x": [1, 2.5, "é"]}, T0 + 3)
    expect_eq(
        (run.wake_at, run.updated_at),
        (T0 + 3, T0 + 3),
        "(wake_at, updated_at) returned by deliver_signal to a waiting run",
    )
    expect_eq(await s.get_run("r"), run, "get_run after deliver_signal woke the run")
    expect_eq(await s.due_runs(T0 + 3, 10), ["r"], "due_runs after the awaited signal")
    # a signal that arrived before the wait: the suspend is due at once
    await put(s, mk("early", t=T0 + 1))
    await s.deliver_signal("early", "go", 7, T0 + 1)
    await s.claim("early", "w1", T0 + 2, T0 + 30)
    res = await s.commit(
        "early",
        "w1",
        T0 + 2,
        Update(status=S.SUSPENDED, waiting_signals=("go",), wake_at=T0 + 100, release_lease=True),
    )
    expect_eq(
        (res.run.wake_at, res.run.waiting_signals),
        (T0 + 2, ("go",)),
        "(wake_at, waiting_signals) of a wait whose signal is already buffered",
    )
    await expect_raises(
        RunNotFoundError,
        s.deliver_signal("nope", "go", None, T0),
        "deliver_signal to an unknown run",
    )


@check()
async def check_signal_peek_fifo(factory: StoreFactory) -> None:
    """``peek_signal`` returns the oldest unconsumed signal of a name, per run; consuming it
    exposes the next one in delivery order; payloads round-trip."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await put(s, mk("r2", t=T0 + 1))
    for i, (name, payload) in enumerate(
        [("a", {"n": 1}), ("b", "b1"), ("a", [2, None]), ("a", None), ("b", 2.5)]
    ):
        await s.deliver_signal("r", name, payload, T0 + i)
    expect_eq(await s.peek_signal("r2", "a"), None, "another run's inbox")
    expect_eq(await s.peek_signal("r", "missing"), None, "peek_signal of a name never sent")
    await s.claim("r", "w1", T0 + 10, T0 + 40)
    seen: list[tuple[str, object]] = []
    ids: set[int] = set()
    for name, n in (("a", 3), ("b", 2)):
        for _ in range(n):
            sig = await s.peek_signal("r", name)
            if sig is None:
                fail(f"peek_signal('r', {name!r}) returned None with signals left")
            expect_eq(sig.name, name, "InboxSignal.name")
            expect(sig.id not in ids, f"signal ids must be unique, {sig.id} repeats")
            ids.add(sig.id)
            seen.append((name, sig.payload))
            await s.commit("r", "w1", T0 + 11, Update(consume_signal=sig.id))
        expect_eq(await s.peek_signal("r", name), None, f"peek_signal({name!r}) when all consumed")
    expect_eq(
        seen,
        [("a", {"n": 1}), ("a", [2, None]), ("a", None), ("b", "b1"), ("b", 2.5)],
        "signals in peek order",
    )


# -- timers ----------------------------------------------------------------------------------


@check()
async def check_due_runs_and_next_due_at(factory: StoreFactory) -> None:
    """``due_runs`` lists claimable runs most overdue first (then ``(created_at, id)``),
    honours ``limit`` and ``workflows``; ``next_due_at`` is the earliest instant some active
    run becomes claimable, skipping leases of the excluded owners."""
    s = await make_store(factory)
    await put(s, mk("p", t=T0 + 1))
    await put(s, mk("s5", status=S.SUSPENDED, wake_at=T0 + 5))
    await put(s, mk("s2", status=S.SUSPENDED, wake_at=T0 + 2))
    await put(s, mk("b3", status=S.BLOCKED, wake_at=T0 + 3, wf="other"))
    await put(s, mk("held", status=S.RUNNING, lease_owner="w1", lease_expires=T0 + 10))
    await put(s, mk("done", status=S.COMPLETED))
    await put(s, mk("forever", status=S.SUSPENDED, waiting_signals=("go",)))
    expect_eq(await s.due_runs(T0 + 4, 10), ["p", "s2", "b3"], "due_runs(T0+4)")
    expect_eq(await s.due_runs(T0 + 4, 2), ["p", "s2"], "due_runs(T0+4, limit=2)")
    expect_eq(await s.due_runs(T0 + 4, 10, ["wf"]), ["p", "s2"], "due_runs(workflows=['wf'])")
    expect_eq(await s.due_runs(T0 + 4, 10, []), [], "due_runs(workflows=[])")
    expect_eq(
        await s.due_runs(T0 + 11, 10), ["p", "s2", "b3", "s5", "held"], "due_runs(T0+11) order"
    )
    expect_eq(await s.next_due_at(), T0 + 1, "next_due_at()")
    for rid in ("p", "s2", "b3"):
        run = await s.claim(rid, "w2", T0 + 4, T0 + 34)
        expect(run is not None, f"claim of the due run {rid!r}")
        done = Update(events=[RunCompleted(at=T0 + 4)], status=S.COMPLETED)
        await s.commit(rid, "w2", T0 + 4, done)
    expect_eq(await s.next_due_at(), T0 + 5, "next_due_at() after settling the due runs")
    expect_eq(await s.next_due_at(("w1",)), T0 + 5, "next_due_at(exclude w1)")
    s5 = await s.claim("s5", "w2", T0 + 5, T0 + 35)
    expect(s5 is not None, "claim of s5 at its wake time")
    expect_eq(await s.next_due_at(), T0 + 10, "next_due_at() = the earliest lease expiry")
    expect_eq(await s.next_due_at(("w2",)), T0 + 10, "next_due_at(exclude w2)")
    expect_eq(await s.next_due_at(("w1", "w2")), None, "next_due_at(exclude w1, w2)")


@check(requires=["next_due_after"])
async def check_next_due_after(factory: StoreFactory) -> None:
    """``next_due_after(now)`` is the earliest instant *later than* ``now`` at which some
    active run becomes claimable (wake time, creation, lease expiry), skipping leases of the
    excluded owners: runs due at ``now`` or before, claimed or not, are left out (a poller's
    deadline must not be an instant that has passed). It writes nothing."""
    s: Any = await make_store(factory)
    await put(s, mk("p", t=T0 + 1))
    await put(s, mk("s5", status=S.SUSPENDED, wake_at=T0 + 5))
    await put(s, mk("s2", status=S.SUSPENDED, wake_at=T0 + 2))
    await put(s, mk("b3", status=S.BLOCKED, wake_at=T0 + 3, wf="other"))
    await put(s, mk("held", status=S.RUNNING, lease_owner="w1", lease_expires=T0 + 10))
    await put(s, mk("done", status=S.COMPLETED))
    await put(s, mk("forever", status=S.SUSPENDED, waiting_signals=("go",)))
    before = {rid: await state(s, rid) for rid in ("p", "s5", "s2", "b3", "held")}
    expect_eq(await s.next_due_after(T0), T0 + 1, "next_due_after(T0)")
    expect_eq(await s.next_due_after(T0 + 1), T0 + 2, "next_due_after(T0+1): due at now is out")
    expect_eq(await s.next_due_after(T0 + 2.5), T0 + 3, "next_due_after(T0+2.5)")
    # p, s2 and b3 are overdue and unclaimed: the next instant is still s5's wake time
    expect_eq(await s.next_due_after(T0 + 4), T0 + 5, "next_due_after(T0+4), three overdue")
    expect_eq(await s.next_due_after(T0 + 4, ("w1",)), T0 + 5, "next_due_after(exclude w1)")
    expect_eq(await s.next_due_after(T0 + 5), T0 + 10, "next_due_after(T0+5): a lease expiry")
    expect_eq(await s.next_due_after(T0 + 5, ("w1",)), None, "next_due_after(T0+5, w1)")
    expect_eq(await s.next_due_after(T0 + 5, ("w2",)), T0 + 10, "next_due_after(T0+5, w2)")
    expect_eq(await s.next_due_after(T0 + 10), None, "next_due_after(T0+10)")
    for rid, was in before.items():
        await expect_unchanged(s, rid, was, "next_due_after")
    # claiming s5 at its wake time: its lease expiry is its next instant
    expect(await s.claim("s5", "w2", T0 + 5, T0 + 8) is not None, "claim of s5 at T0+5")
    expect_eq(await s.next_due_after(T0 + 5), T0 + 8, "next_due_after(T0+5), s5 leased")
    expect_eq(await s.next_due_after(T0 + 5, ("w2",)), T0 + 10, "next_due_after(exclude w2)")
