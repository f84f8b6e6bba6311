"""Checks of published events (``publish_event`` / ``take_event``, stores with
``publishes_events``): fan-out to every matching waiter, buffering for the first later one,
``event_id`` dedupe, the timeout's exclusive take, and a publish racing a registration."""

from __future__ import annotations

import asyncio
from typing import Any

from flowkit.errors import InvalidInputError, RunNotFoundError
from flowkit.stores.base import Update, event_mark

from ._registry import check
from ._support import (
    T0,
    PairFactory,
    S,
    StoreFactory,
    expect,
    expect_eq,
    expect_raises,
    get,
    make_pair,
    make_store,
    mk,
    put,
)

EV = "order.paid"
A = {"order": "digest-a"}
B = {"order": "digest-b"}


async def _waiting(s: Any, rid: str, match: dict[str, str], *, park: bool = True) -> None:
    """``rid`` registers a wait at pos ``1`` (none came) and, with ``park``, suspends on its
    mark as a worker would."""
    got = await s.take_event(rid, "1", EV, match, T0 + 1)
    expect(got is None, f"take_event of {rid!r} with nothing published returned {got!r}")
    if park:
        await s.claim(rid, "w", T0 + 1, T0 + 30)
        suspend = Update(
            status=S.SUSPENDED,
            waiting_signals=(event_mark("1"),),
            wake_at=None,
            release_lease=True,
        )
        await s.commit(rid, "w", T0 + 1, suspend)


@check(requires=("publishes_events",))
async def check_publish_delivers_to_every_matching_waiter(factory: StoreFactory) -> None:
    """``publish_event`` delivers to every registered waiter whose ``match`` matches (in
    waiting order), makes a run suspended on the mark due now, and buffers nothing; the
    waiter's ``take_event`` answers the event and its inbox mark, which a commit consumes."""
    s: Any = await make_store(factory)
    for i, (rid, match) in enumerate((("r1", A), ("r2", A), ("r3", B))):
        await put(s, mk(rid, t=T0 + i / 10))
        await _waiting(s, rid, match, park=rid != "r2")
    done = await s.publish_event(EV, {"order": "a", "n": 1}, "e1", {**A, "n": "x"}, T0 + 5)
    expect_eq((done.delivered, done.buffered, done.duplicate), (("r1", "r2"), False, False), "")
    r1 = await get(s, "r1")
    expect_eq(r1.wake_at, T0 + 5, "wake_at of the suspended waiter it delivered to")
    expect_eq((await get(s, "r3")).wake_at, None, "wake_at of the waiter it did not match")
    got = await s.take_event("r1", "1", EV, A, T0 + 6)
    expect(got is not None, "take_event of a waiter it delivered to returned None")
    expect_eq((got.event_id, got.payload), ("e1", {"order": "a", "n": 1}), "the event taken")
    again = await s.take_event("r1", "1", EV, A, T0 + 7)
    expect_eq(again, got, "take_event again before the record consumes the mark")
    sig = await s.peek_signal("r1", event_mark("1"))
    expect(sig is not None and sig.id == got.mark, f"the inbox mark of the delivery: {sig!r}")
    await s.claim("r1", "w", T0 + 7, T0 + 30)
    await s.commit("r1", "w", T0 + 8, Update(consume_signal=got.mark))
    expect_eq(await s.peek_signal("r1", event_mark("1")), None, "the mark once consumed")
    expect_eq(await s.take_event("r3", "1", EV, B, T0 + 9), None, "r3's take: nothing came")


@check(requires=("publishes_events",))
async def check_publish_buffers_once_for_the_first_later_waiter(factory: StoreFactory) -> None:
    """An event no waiter matches is buffered; the first later matching ``take_event``
    takes it out of the buffer (a waiter that does not match leaves it), and no other waiter
    gets it again."""
    s: Any = await make_store(factory)
    for i, rid in enumerate(("r1", "r2", "r3")):
        await put(s, mk(rid, t=T0 + i))
    done = await s.publish_event(EV, {"order": "a"}, "e1", A, T0 + 1)
    expect_eq((done.delivered, done.buffered), ((), True), "a publish nobody waits for")
    expect_eq(await s.take_event("r1", "1", EV, B, T0 + 2), None, "a waiter it does not match")
    got = await s.take_event("r2", "1", EV, A, T0 + 3)
    expect(got is not None and got.event_id == "e1", f"the first matching waiter got {got!r}")
    expect_eq(await s.take_event("r3", "1", EV, A, T0 + 4), None, "a second matching waiter")
    expect_eq(await s.take_event("r2", "1", EV, A, T0 + 5), got, "the taker asking again")


@check(requires=("publishes_events",))
async def check_publish_dedupes_event_ids(factory: StoreFactory) -> None:
    """A second publish of an ``event_id`` is a ``duplicate``: it delivers and buffers
    nothing. Bad names and ids raise ``InvalidInputError`` and write nothing (the id is not
    taken)."""
    s: Any = await make_store(factory)
    await put(s, mk("r1"))
    first = await s.publish_event(EV, 1, "e1", {}, T0)
    again = await s.publish_event(EV, 2, "e1", {}, T0 + 1)
    expect_eq((first.buffered, again.duplicate), (True, True), "the two publishes")
    expect_eq((again.delivered, again.buffered), ((), False), "what the duplicate did")
    got = await s.take_event("r1", "1", EV, {}, T0 + 2)
    expect(got is not None and got.payload == 1, f"the one event buffered: {got!r}")
    expect_eq(await s.take_event("r1", "2", EV, {}, T0 + 3), None, "a second take")
    await expect_raises(InvalidInputError, s.publish_event("", 1, "e2", {}, T0), "empty name")
    await expect_raises(InvalidInputError, s.publish_event(EV, 1, "", {}, T0), "empty id")
    await expect_raises(InvalidInputError, s.publish_event("a\x00", 1, "e3", {}, T0), "NUL")
    expect_eq((await s.publish_event(EV, 3, "e2", {}, T0)).duplicate, False, "e2 after refusal")
    await expect_raises(
        RunNotFoundError, s.take_event("nope", "1", EV, {}, T0), "take_event of an unknown run"
    )


@check(requires=("publishes_events",))
async def check_take_without_wait_drops_the_registration(factory: StoreFactory) -> None:
    """``take_event(wait=False)`` (a timeout) with nothing delivered removes the waiter: a
    later publish buffers instead of delivering to it. Waiters of settled and cancelling runs
    receive nothing either."""
    s: Any = await make_store(factory)
    for i, rid in enumerate(("r1", "r2", "r3")):
        await put(s, mk(rid, t=T0 + i))
        await _waiting(s, rid, A, park=False)
    expect_eq(await s.take_event("r1", "1", EV, A, T0 + 2, wait=False), None, "the timeout")
    await s.claim("r2", "w", T0 + 2, T0 + 30)
    await s.commit("r2", "w", T0 + 2, Update(status=S.COMPLETED, output=None))
    await s.claim("r3", "w", T0 + 2, T0 + 30)
    await s.commit("r3", "w", T0 + 2, Update(status=S.CANCELLING))
    done = await s.publish_event(EV, "x", "e1", A, T0 + 3)
    expect_eq((done.delivered, done.buffered), ((), True), "a publish to gone waiters")


@check(requires=("publishes_events",))
async def check_dropped_wait_gives_back_its_event(factory: StoreFactory) -> None:
    """``drop_event_wait`` (the run's cancellation left the wait): a registered wait is gone
    (a later publish buffers); an event delivered to a wait and not received is offered again,
    to a waiter registered since, else to the buffer; a received one (its mark consumed) is
    not; and a second drop does nothing."""
    s: Any = await make_store(factory)
    for i, rid in enumerate(("r1", "r2", "r3", "r4")):
        await put(s, mk(rid, t=T0 + i))
    await _waiting(s, "r1", A, park=False)
    expect_eq(await s.drop_event_wait("r1", "1", EV, T0 + 5), (), "a drop of a bare wait")
    done = await s.publish_event(EV, "x", "e1", A, T0 + 6)
    expect_eq((done.delivered, done.buffered), ((), True), "a publish after the drop")
    got = await s.take_event("r2", "1", EV, A, T0 + 7)  # (r2 takes e1 from the buffer)
    expect(got is not None and got.event_id == "e1", f"r2's take: {got!r}")
    await _waiting(s, "r3", A, park=False)  # (registered after: nothing for it yet)
    again = await s.drop_event_wait("r2", "1", EV, T0 + 8)
    expect_eq(again, ("r3",), "the event r2 dropped, offered to r3")
    r3 = await s.take_event("r3", "1", EV, A, T0 + 9)
    expect(r3 is not None and r3.event_id == "e1" and r3.payload == "x", f"r3's take: {r3!r}")
    expect_eq(await s.drop_event_wait("r2", "1", EV, T0 + 9), (), "a second drop")
    # r3 receives it (its commit consumes the mark): a drop then gives nothing back
    await s.claim("r3", "w", T0 + 10, T0 + 30)
    await s.commit("r3", "w", T0 + 10, Update(consume_signal=r3.mark if r3 else None))
    expect_eq(await s.drop_event_wait("r3", "1", EV, T0 + 11), (), "a drop after the receipt")
    expect_eq(await s.take_event("r4", "1", EV, A, T0 + 12), None, "the buffer after all that")
    # nobody waits: a dropped delivery goes back to the buffer
    await s.publish_event(EV, "y", "e2", B, T0 + 13)
    got = await s.take_event("r4", "2", EV, B, T0 + 14)
    expect(got is not None and got.event_id == "e2", f"r4's take: {got!r}")
    expect_eq(await s.drop_event_wait("r4", "2", EV, T0 + 15), (), "nobody to offer it to")
    back = await s.take_event("r1", "2", EV, B, T0 + 16)
    expect(back is not None and back.event_id == "e2", f"the buffered event again: {back!r}")


@check(kind="pair", requires=("publishes_events",))
async def check_competing_publish_and_take(factory: PairFactory) -> None:
    """Publishes racing the registrations of their waiters (two store objects): each event
    reaches its waiter exactly once, delivered or taken from the buffer, never lost."""
    pair: Any = await make_pair(factory)
    s1, s2 = pair
    n = 12
    for i in range(n):
        await put(s1, mk(f"r{i}", t=T0 + i))

    async def publish(i: int) -> Any:
        return await s2.publish_event(EV, i, f"e{i}", {"order": f"d{i}"}, T0 + 20)

    async def take(i: int) -> Any:
        return await s1.take_event(f"r{i}", "1", EV, {"order": f"d{i}"}, T0 + 20)

    calls = []
    for i in range(n):
        pair = [publish(i), take(i)]
        calls += pair if i % 2 else pair[::-1]
    await asyncio.gather(*calls)
    for i in range(n):
        final = await s1.take_event(f"r{i}", "1", EV, {"order": f"d{i}"}, T0 + 30)
        expect(final is not None and final.payload == i, f"r{i}'s event after the race: {final}")
    await put(s1, mk("rx", t=T0 + n))
    left = await s2.take_event("rx", "1", EV, {}, T0 + 40)
    expect_eq(left, None, "an event left in the buffer after it reached its waiter")
