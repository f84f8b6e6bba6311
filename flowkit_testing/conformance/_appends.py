"""Checks of ``append_events`` (stores with ``appends_events``: ``base.AppendsEvents``), the
commit of a running step narrowed to appending its events."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from flowkit.errors import RunNotFoundError
from flowkit.events import (
    ErrorInfo,
    Event,
    RunCompleted,
    StepCompleted,
    StepFailed,
    TimerFired,
)
from flowkit.stores.base import Store, Update

from ._registry import check
from ._support import (
    T0,
    ConformanceError,
    S,
    StoreFactory,
    expect,
    expect_eq,
    expect_raises,
    expect_unchanged,
    fail,
    get,
    make_store,
    mk,
    numbered,
    put,
    started,
    state,
)

APPENDS = ["appends_events"]

PAYLOAD: dict[str, Any] = {
    "text": 'naïve ☃ "quoted" \\ \n',
    "ints": [0, -1, 2**53 + 1, 2**62],
    "floats": [0.5, 10.0, 1e-7, 1e20, 1767225600.123457],
    "nested": {"b": [True, False, None], "a": {"x": []}},
    "empty": {},
}
"""A step result that must come back exactly (floats staying floats)."""


def done(pos: str, at: float, result: Any = None, *, seq: int = 0) -> StepCompleted:
    return StepCompleted(seq=seq, pos=pos, name="f", result=result, at=at)


def failed(pos: str, at: float) -> StepFailed:
    error = ErrorInfo(type="ValueError", message="boom é", step="f", attempts=1)
    return StepFailed(pos=pos, name="f", error=error, retry_at=at + 5, at=at)


async def append(
    store: Store, run_id: str, owner: str, now: float, events: Sequence[Event], what: str
) -> tuple[int, ...] | None:
    """``store.append_events(...)``: it must return a tuple of seqs or ``None``, not raise."""
    fn = getattr(store, "append_events", None)
    if fn is None:
        fail("a store with appends_events must have an append_events method")
    try:
        seqs = await fn(run_id, owner, now, list(events))
    except Exception as exc:
        raise ConformanceError(
            f"{what}: append_events must return the seqs or None, but it raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if seqs is not None and not (isinstance(seqs, tuple) and all(isinstance(q, int) for q in seqs)):
        fail(f"{what}: append_events must return a tuple of ints or None, got {seqs!r}")
    return seqs


async def refused(
    store: Store, run_id: str, owner: str, now: float, events: Sequence[Event], what: str
) -> None:
    """``append_events`` must return ``None`` and write nothing (run and history)."""
    before = await state(store, run_id)
    got = await append(store, run_id, owner, now, events, what)
    expect_eq(got, None, f"{what}: append_events result")
    await expect_unchanged(store, run_id, before, what)


async def running(store: Store, run_id: str, owner: str, now: float, until: float) -> None:
    run = await store.claim(run_id, owner, now, until)
    expect(
        run is not None and run.status is S.RUNNING and run.lease_owner == owner,
        f"claim of the pending run {run_id!r} by {owner!r}: got {run!r}",
    )


@check(requires=APPENDS)
async def check_append_events_continues_the_numbering(factory: StoreFactory) -> None:
    """``append_events`` by the lease holder of a ``running`` run appends its events at the
    next seqs, gap-free after ``create_run``'s events and earlier commits (several events
    get consecutive seqs), and returns them; ``load_events`` reads the events back with
    those seqs, payloads unchanged; a later ``commit`` continues right after them. Each run
    has its own numbering."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await put(s, mk("r2", t=T0 + 1))
    _, created = await s.create_run(mk("bare", t=T0 + 2), [])
    expect(created, "create_run of a run without events")
    for rid in ("r", "r2", "bare"):
        await running(s, rid, "w1", T0, T0 + 30)
    log = [*started(mk("r"))]  # what "r"'s history must read

    first = await s.commit("r", "w1", T0 + 1, Update(events=[TimerFired(pos="0", at=T0 + 1)]))
    expect_eq(first.seqs, (2,), "CommitResult.seqs of the commit before the appends")
    log += [TimerFired(pos="0", at=T0 + 1)]

    one = [done("1", T0 + 2, PAYLOAD, seq=99)]
    got = await append(s, "r", "w1", T0 + 2, one, "an append after a commit")
    expect_eq(got, (3,), "seqs of an append after create_run's event and a commit")
    log += one
    got = await append(s, "r2", "w1", T0 + 2, [done("0", T0 + 2, "r2")], "an append to r2")
    expect_eq(got, (2,), "seqs of an append to another run (each run numbers its own)")

    several: list[Event] = [
        failed("2", T0 + 3),
        done("2", T0 + 3, [1, None], seq=1),
        done("3", T0 + 3),
    ]
    got = await append(s, "r", "w1", T0 + 3, several, "an append of three events")
    expect_eq(got, (4, 5, 6), "seqs of an append of three events")
    log += several

    after = [TimerFired(pos="4", at=T0 + 4), TimerFired(pos="5", at=T0 + 4)]
    res = await s.commit("r", "w1", T0 + 4, Update(events=after))
    expect_eq(res.seqs, (7, 8), "seqs of a commit after the appends (it must continue after them)")
    log += after

    many = [done(str(6 + i), T0 + 5, {"i": i}) for i in range(20)]
    got = await append(s, "r", "w1", T0 + 5, many, "an append of twenty events")
    expect_eq(got, tuple(range(9, 29)), "seqs of an append of twenty events")
    log += many
    got = await append(s, "r", "w1", T0 + 6, [done("26", T0 + 6, "last")], "a last append")
    expect_eq(got, (29,), "seqs of an append after an append of twenty events")
    log += [done("26", T0 + 6, "last")]

    evs = await s.load_events("r")
    expect_eq([e.seq for e in evs], list(range(1, 30)), "seqs in load_events after the appends")
    expect_eq(evs, numbered(log), "the history after the appends (events and their payloads)")
    floats = evs[2].result["floats"] if isinstance(evs[2], StepCompleted) else None
    expect(
        isinstance(floats, list) and all(isinstance(f, float) for f in floats),
        f"floats of an appended step result must come back as floats: {floats!r}",
    )

    got = await append(s, "bare", "w1", T0 + 2, [done("0", T0 + 2)], "an append to a bare run")
    expect_eq(got, (1,), "seqs of the first append to a run created without events")
    res = await s.commit("r2", "w1", T0 + 7, Update(events=[RunCompleted(at=T0 + 7)]))
    expect_eq(res.seqs, (3,), "seqs of a commit to r2 after its append")
    expect_eq([e.seq for e in await s.load_events("r2")], [1, 2, 3], "seqs of r2's history")


@check(requires=APPENDS)
async def check_append_events_changes_only_the_history(factory: StoreFactory) -> None:
    """An accepted ``append_events`` changes nothing of the run but ``updated_at``, which
    does not go backwards, reaches the newest event's ``at`` and does not pass ``now``
    (status, lease, tags, ``wake_at``, waiting signals, attempt, input, output and error
    stay); it neither renews the lease nor consumes signals."""
    s = await make_store(factory)
    await put(s, mk("r", tags=("user-tag",)))
    await s.deliver_signal("r", "go", {"n": 1}, T0)
    await running(s, "r", "w1", T0, T0 + 30)
    res = await s.commit(
        "r",
        "w1",
        T0 + 1,
        Update(
            output={"partial": [1, 2]},
            error={"type": "X", "message": "m"},
            wake_at=T0 + 99,
            waiting_signals=("later",),
            attempt=2,
        ),
    )
    before = res.run
    expect_eq(
        (before.status, before.lease_owner, before.lease_expires),
        (S.RUNNING, "w1", T0 + 30),
        "(status, lease_owner, lease_expires) after a commit that left them unset",
    )
    sig = await s.peek_signal("r", "go")
    expect(sig is not None, "peek_signal after deliver_signal returned None")
    for now, at in ((T0 + 5, T0 + 5), (T0 + 9, T0 + 7)):
        got = await append(s, "r", "w1", now, [done(str(now), at, "x")], "an append")
        expect(got is not None, f"an append at {now} by the lease holder was refused")
        after = await get(s, "r")
        expect_eq(
            dataclasses.replace(after, updated_at=before.updated_at),
            before,
            "append_events must change nothing of the run but updated_at",
        )
        expect(
            max(before.updated_at, at) <= after.updated_at <= now,
            f"updated_at after an append at now={now!r} of an event at {at!r} "
            f"(updated_at was {before.updated_at!r}): expected it to move forward to at least "
            f"the event's at and at most now, got {after.updated_at!r}",
        )
        before = after
    # a clock behind the run's updated_at (another worker's clock skew): never backwards
    for evs in ([done("late", T0 + 2, "x")], [done("l1", T0 + 2, "x"), done("l2", T0 + 2, "y")]):
        got = await append(s, "r", "w1", T0 + 2, evs, "an append with a lagging clock")
        expect(got is not None, "an append with a lagging clock by the lease holder was refused")
        after = await get(s, "r")
        expect_eq(
            after.updated_at,
            before.updated_at,
            "updated_at after an append whose now and at are behind it (must not go back)",
        )
    expect_eq(
        [r.id for r in await s.list_runs(tag="user-tag", status=S.RUNNING)],
        ["r"],
        "list_runs(tag=, status=running) after the appends",
    )
    expect_eq(await s.peek_signal("r", "go"), sig, "an append must not consume a signal")


@check(requires=APPENDS)
async def check_append_events_fenced_by_owner_not_expiry(factory: StoreFactory) -> None:
    """Like ``commit``, ``append_events`` checks the lease's owner, not its expiry: the
    holder of an expired lease still appends (the lease stays as it was); once another
    instance claimed the run the old owner is refused and writes nothing, the new one
    appends after everything written before."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await running(s, "r", "w1", T0, T0 + 10)
    got = await append(s, "r", "w1", T0 + 20, [done("0", T0 + 20)], "an append past the expiry")
    expect_eq(got, (2,), "seqs of an append by the holder of an expired lease")
    run = await get(s, "r")
    expect_eq(
        (run.status, run.lease_owner, run.lease_expires),
        (S.RUNNING, "w1", T0 + 10),
        "(status, lease_owner, lease_expires) after an append past the lease's expiry",
    )
    await running(s, "r", "w2", T0 + 21, T0 + 51)
    await refused(s, "r", "w1", T0 + 22, [done("1", T0 + 22)], "an append by a fenced-off owner")
    got = await append(s, "r", "w2", T0 + 23, [done("1", T0 + 23)], "an append by the new owner")
    expect_eq(got, (3,), "seqs of an append by the instance that took the run over")
    res = await s.commit(
        "r", "w2", T0 + 24, Update(events=[RunCompleted(at=T0 + 24)], status=S.COMPLETED)
    )
    expect_eq(res.seqs, (4,), "seqs of the completing commit after the appends")


@check(requires=APPENDS)
async def check_refused_append_events_writes_nothing(factory: StoreFactory) -> None:
    """``append_events`` returns ``None`` and writes nothing (run and history unchanged) when
    the caller does not hold the lease (another owner, no lease at all), the run is not
    ``running`` (``cancelling``, ``pending``, ``suspended``, ``blocked``, settled), the run is
    unknown, or there are no events."""
    s = await make_store(factory)
    ev = [done("0", T0 + 1, "x")]
    await put(s, mk("r"))
    await running(s, "r", "w1", T0, T0 + 30)
    await refused(s, "r", "w2", T0 + 1, ev, "an append by an instance not holding the lease")
    await refused(s, "r", "w1", T0 + 1, [], "an append of no events")

    # no lease at all: never claimed, or released by the holder
    await put(s, mk("unleased", status=S.RUNNING))
    await refused(s, "unleased", "w1", T0 + 1, ev, "an append to a running run without a lease")
    await s.commit("r", "w1", T0 + 2, Update(release_lease=True))
    run = await get(s, "r")
    expect_eq(
        (run.status, run.lease_owner), (S.RUNNING, None), "(status, lease_owner) after a release"
    )
    await refused(s, "r", "w1", T0 + 3, ev, "an append by an owner after it released the lease")

    # cancelling: requested while the holder runs (its lease stays)
    await put(s, mk("c", t=T0 + 1))
    await running(s, "c", "w1", T0 + 1, T0 + 30)
    res = await s.commit("c", None, T0 + 2, Update(status=S.CANCELLING, ignore_lease=True))
    expect_eq(
        (res.run.status, res.run.lease_owner),
        (S.CANCELLING, "w1"),
        "(status, lease_owner) after requesting cancellation of a leased run",
    )
    await refused(s, "c", "w1", T0 + 3, ev, "an append by the lease holder of a cancelling run")

    # other statuses, with the caller's lease on the row all the same
    for status in (
        S.PENDING,
        S.SUSPENDED,
        S.BLOCKED,
        S.CANCELLING,
        *(st for st in S if st.terminal),
    ):
        rid = f"leased-{status.value}"
        await put(s, mk(rid, status=status, lease_owner="w1", lease_expires=T0 + 30))
        await refused(s, rid, "w1", T0 + 1, ev, f"an append to a {status.value} run")

    # settled by a commit
    await put(s, mk("d", t=T0 + 2))
    await running(s, "d", "w1", T0 + 2, T0 + 30)
    await s.commit("d", "w1", T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED))
    await refused(s, "d", "w1", T0 + 4, ev, "an append to a completed run")

    # an unknown run: nothing is created
    got = await append(s, "nope", "w1", T0 + 1, ev, "an append to an unknown run")
    expect_eq(got, None, "append_events to an unknown run")
    expect_eq(await s.get_run("nope"), None, "get_run after an append to an unknown run")
    await expect_raises(
        RunNotFoundError, s.load_events("nope"), "load_events after an append to an unknown run"
    )


@check(requires=[*APPENDS, "scoped"])
async def check_append_events_respects_namespaces(factory: StoreFactory) -> None:
    """A scoped store's ``append_events`` reaches only the runs of its namespace: another
    namespace's run (or an unscoped one) gets ``None`` and nothing written; the unscoped
    store appends to any run."""
    base: Any = await make_store(factory)
    a, b = base.scoped("A"), base.scoped("B")
    run = mk("ra")
    _, created = await a.create_run(run, started(run))
    expect(created, "a scoped create_run of a new id")
    await running(a, "ra", "w1", T0, T0 + 30)
    await put(base, mk("rn", t=T0 + 1))
    await running(base, "rn", "w1", T0, T0 + 30)
    ev = [done("0", T0 + 1, "x")]
    for rid, what in (("ra", "another namespace's run"), ("rn", "an unscoped run")):
        before = await state(base, rid)
        got = await append(b, rid, "w1", T0 + 1, ev, f"a scoped append to {what}")
        expect_eq(got, None, f"append_events from namespace B to {what}")
        await expect_unchanged(base, rid, before, f"an append from namespace B to {what}")
    got = await append(a, "ra", "w1", T0 + 1, ev, "an append in the run's namespace")
    expect_eq(got, (2,), "seqs of an append in the run's namespace")
    got = await append(base, "ra", "w1", T0 + 2, ev, "an unscoped append")
    expect_eq(got, (3,), "seqs of an unscoped append to a namespaced run")
    expect_eq([e.seq for e in await a.load_events("ra")], [1, 2, 3], "seqs of 'ra'")
