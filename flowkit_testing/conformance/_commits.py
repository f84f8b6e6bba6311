"""Checks of ``commit``: gap-free histories, the update applied, lease fencing, preconditions."""

from __future__ import annotations

import dataclasses

from flowkit import History
from flowkit.errors import (
    LeaseLostError,
    RunNotFoundError,
)
from flowkit.events import (
    SignalReceived,
    TimerFired,
)
from flowkit.stores.base import ConflictError, Update

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
    fired,
    make_store,
    mk,
    put,
    state,
)

# -- commit ----------------------------------------------------------------------------------


@check()
async def check_event_seqs_gap_free(factory: StoreFactory) -> None:
    """Events appended by successive commits get gap-free ``seq`` 2, 3, ... whatever ``seq``
    the caller passed; ``CommitResult.seqs`` reports them and the history round-trips."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    a = await s.commit("r", "w1", T0 + 1, Update(events=[fired(T0 + 1, "1"), fired(T0 + 1, "2")]))
    b = await s.commit("r", "w1", T0 + 2, Update())
    c = await s.commit(
        "r",
        "w1",
        T0 + 3,
        Update(events=[TimerFired(seq=99, pos=str(i), at=T0 + 3) for i in range(3)]),
    )
    expect_eq((a.seqs, b.seqs, c.seqs), ((2, 3), (), (4, 5, 6)), "CommitResult.seqs")
    evs = await s.load_events("r")
    expect_eq([e.seq for e in evs], [1, 2, 3, 4, 5, 6], "seqs in load_events")
    expect_eq([e.at for e in evs], [T0, T0 + 1, T0 + 1, T0 + 3, T0 + 3, T0 + 3], "event times")
    expect_eq(
        [getattr(e, "pos", None) for e in evs],
        [None, "1", "2", "0", "1", "2"],
        "events must be stored in commit order",
    )
    hist = History("r", evs)
    expect_eq(History.from_json(hist.to_json()), hist, "History JSON round trip of the events")


@check()
async def check_commit_applies_update(factory: StoreFactory) -> None:
    """``commit`` sets the fields given in ``Update`` (and ``updated_at=now``) and keeps the
    ones left unset; the returned run is what ``get_run`` then reads."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    res = await s.commit(
        "r",
        "w1",
        T0 + 1,
        Update(
            status=S.SUSPENDED,
            output={"partial": [1, 2]},
            error={"type": "X", "message": "m"},
            wake_at=T0 + 9,
            waiting_signals=("a", "b"),
            attempt=2,
            release_lease=True,
        ),
    )
    run = res.run
    expect_eq(await s.get_run("r"), run, "get_run after commit must equal CommitResult.run")
    expect_eq(
        (run.status, run.output, run.error, run.wake_at, run.waiting_signals, run.attempt),
        (S.SUSPENDED, {"partial": [1, 2]}, {"type": "X", "message": "m"}, T0 + 9, ("a", "b"), 2),
        "(status, output, error, wake_at, waiting_signals, attempt) after commit",
    )
    expect_eq((run.lease_owner, run.lease_expires), (None, None), "lease after release_lease")
    expect_eq(run.updated_at, T0 + 1, "updated_at after commit")
    same = await s.commit("r", None, T0 + 2, Update())
    expect_eq(
        same.run,
        dataclasses.replace(run, updated_at=T0 + 2),
        "an empty Update must change nothing but updated_at",
    )
    cleared = await s.commit("r", None, T0 + 3, Update(wake_at=None, output=None))
    expect_eq((cleared.run.wake_at, cleared.run.output), (None, None), "explicit None values")
    expect_eq(cleared.run.status, S.SUSPENDED, "status left unset must be kept")


@check()
async def check_commit_lease_fencing(factory: StoreFactory) -> None:
    """A commit by an ``owner`` that does not hold the lease raises ``LeaseLostError`` and
    writes nothing; ``owner=None`` against a live lease raises ``ConflictError`` unless
    ``ignore_lease``; an unknown run raises ``RunNotFoundError``."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    before = await state(s, "r")
    await expect_raises(
        LeaseLostError,
        s.commit("r", "w2", T0 + 1, Update(events=[fired(T0 + 1)], status=S.SUSPENDED)),
        "commit by an instance that never held the lease",
    )
    await expect_unchanged(s, "r", before, "a commit that lost its lease")
    await expect_raises(
        ConflictError,
        s.commit("r", None, T0 + 1, Update(events=[fired(T0 + 1)], status=S.CANCELLING)),
        "commit with owner=None while a live lease exists",
    )
    await expect_unchanged(s, "r", before, "a commit refused for a live lease")
    res = await s.commit("r", None, T0 + 1, Update(status=S.CANCELLING, ignore_lease=True))
    expect_eq(
        (res.run.status, res.run.lease_owner),
        (S.CANCELLING, "w1"),
        "(status, lease_owner) after an ignore_lease commit",
    )
    # the lease expires and another instance takes the run: the old owner is fenced off
    taken = await s.claim("r", "w2", T0 + 30, T0 + 60)
    expect(taken is not None, "a run whose lease expired must be claimable")
    before = await state(s, "r")
    await expect_raises(
        LeaseLostError,
        s.commit("r", "w1", T0 + 31, Update(events=[fired(T0 + 31)], status=S.COMPLETED)),
        "commit by the previous owner after another instance claimed the run",
    )
    await expect_unchanged(s, "r", before, "a commit by a fenced-off owner")
    await s.commit("r", "w2", T0 + 32, Update(release_lease=True))
    before = await state(s, "r")
    await expect_raises(
        LeaseLostError,
        s.commit("r", "w2", T0 + 33, Update(events=[fired(T0 + 33)])),
        "commit by an owner after it released the lease",
    )
    await expect_unchanged(s, "r", before, "a commit after the lease was released")
    await expect_raises(
        RunNotFoundError, s.commit("nope", None, T0, Update()), "commit of an unknown run"
    )


@check()
async def check_expect_status_conflict_writes_nothing(factory: StoreFactory) -> None:
    """``Update.expect_status`` not matching raises ``ConflictError`` and writes nothing."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    await s.deliver_signal("r", "go", 1, T0)
    sig = await s.peek_signal("r", "go")
    if sig is None:
        fail("peek_signal returned None after deliver_signal")
    before = await state(s, "r")
    await expect_raises(
        ConflictError,
        s.commit(
            "r",
            "w1",
            T0 + 1,
            Update(
                events=[fired(T0 + 1)],
                status=S.FAILED,
                consume_signal=sig.id,
                expect_status=frozenset({S.PENDING, S.SUSPENDED}),
            ),
        ),
        "commit with expect_status={pending, suspended} on a running run",
    )
    await expect_unchanged(s, "r", before, "a commit whose expect_status failed")
    expect_eq(
        await s.peek_signal("r", "go"),
        sig,
        "a commit whose expect_status failed must not consume its signal",
    )
    ok = await s.commit(
        "r", "w1", T0 + 1, Update(status=S.SUSPENDED, expect_status=frozenset({S.RUNNING}))
    )
    expect_eq(ok.run.status, S.SUSPENDED, "status after a commit whose expect_status held")


@check()
async def check_consumed_signal_conflict_writes_nothing(factory: StoreFactory) -> None:
    """Consuming a signal that is no longer in the run's inbox (already consumed, or another
    run's) raises ``ConflictError`` and writes nothing."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await put(s, mk("other", t=T0 + 1))
    await s.deliver_signal("r", "go", "first", T0)
    await s.deliver_signal("other", "go", "theirs", T0)
    mine = await s.peek_signal("r", "go")
    theirs = await s.peek_signal("other", "go")
    if mine is None or theirs is None:
        fail("peek_signal returned None after deliver_signal")
    await s.claim("r", "w1", T0, T0 + 30)
    res = await s.commit(
        "r",
        "w1",
        T0 + 1,
        Update(
            consume_signal=mine.id,
            events=[SignalReceived(pos="0", name="go", payload="first", at=T0 + 1)],
        ),
    )
    expect_eq(res.seqs, (2,), "seqs of the commit that consumed the signal")
    expect_eq(await s.peek_signal("r", "go"), None, "peek_signal after the signal was consumed")
    before = await state(s, "r")
    await expect_raises(
        ConflictError,
        s.commit(
            "r",
            "w1",
            T0 + 2,
            Update(
                consume_signal=mine.id,
                status=S.SUSPENDED,
                events=[SignalReceived(pos="1", name="go", payload="first", at=T0 + 2)],
            ),
        ),
        "commit consuming an already consumed signal",
    )
    await expect_unchanged(s, "r", before, "a commit consuming an already consumed signal")
    await expect_raises(
        ConflictError,
        s.commit("r", "w1", T0 + 2, Update(consume_signal=theirs.id, events=[fired(T0 + 2)])),
        "commit consuming another run's signal",
    )
    await expect_unchanged(s, "r", before, "a commit consuming another run's signal")
    expect_eq(
        await s.peek_signal("other", "go"),
        theirs,
        "another run's signal must survive a refused consume",
    )
