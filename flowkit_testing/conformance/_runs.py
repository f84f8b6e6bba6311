"""Checks of runs, histories, commits, leases, claims, signals and timers."""

from __future__ import annotations

import dataclasses
from typing import Any

from flowkit import ADMITTED_TAG, History
from flowkit.errors import (
    LeaseLostError,
    RunIdTakenError,
    RunNotFoundError,
    SingletonQueueFullError,
)
from flowkit.events import (
    RunCompleted,
    SignalReceived,
    StepCompleted,
    TimerFired,
    TimerStarted,
)
from flowkit.stores.base import ConflictError, QueueCap, Update

from ._registry import check
from ._singleton import admission, claimed, create
from ._support import (
    T0,
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
    tag_of,
)


def fired(at: float, pos: str = "0") -> TimerFired:
    return TimerFired(pos=pos, at=at)


# -- create_run ------------------------------------------------------------------------------


@check()
async def check_create_run_idempotent(factory: StoreFactory) -> None:
    """``create_run`` of an existing id returns ``(existing, False)`` and writes nothing."""
    s = await make_store(factory)
    run = await put(s, mk("r1"))
    expect_eq(await s.get_run("r1"), run, "get_run after create_run")
    before = await state(s, "r1")
    other = dataclasses.replace(run, input={"other": True}, created_at=T0 + 5)
    again, created = await s.create_run(other, [*started(other), fired(T0 + 5)])
    expect(not created, "create_run of an existing id must return created=False")
    expect_eq(again, run, "create_run of an existing id must return the existing run")
    await expect_unchanged(s, "r1", before, "create_run of an existing id")
    expect_eq([r.id for r in await s.list_runs()], ["r1"], "list_runs after a repeated create")
    expect_eq(await s.get_run("missing"), None, "get_run of an unknown id")
    await expect_raises(RunNotFoundError, s.load_events("missing"), "load_events of an unknown id")


@check()
async def check_create_run_writes_its_events(factory: StoreFactory) -> None:
    """``create_run`` stores the run together with its events, numbered 1..n by the store."""
    s = await make_store(factory)
    run = mk("r")
    evs = [
        *started(run),
        TimerStarted(seq=7, pos="0", fire_at=T0 + 60, at=T0),
        StepCompleted(seq=7, pos="1", name="f", result={"x": 1}, at=T0),
    ]
    stored, created = await s.create_run(run, evs)
    expect(created, "create_run of a new id must return created=True")
    expect_eq(stored, run, "create_run result")
    got = await s.load_events("r")
    expect_eq([e.seq for e in got], [1, 2, 3], "seqs of the events written by create_run")
    expect_eq(
        got,
        numbered(evs),
        "events written by create_run",
    )
    bare = await s.create_run(mk("bare", t=T0 + 1), [])
    expect(bare[1], "create_run without events must still create the run")
    expect_eq(await s.load_events("bare"), [], "history of a run created without events")
    res = await s.commit("bare", None, T0 + 2, Update(events=[fired(T0 + 2)]))
    expect_eq(res.seqs, (1,), "first appended seq of a run created without events")


@check()
async def check_queue_cap_rejection_writes_nothing(factory: StoreFactory) -> None:
    """At ``limit + max_queue_depth`` active runs sharing the tag, ``create_run`` raises
    ``SingletonQueueFullError`` and writes nothing; other workflows, other keys and settled
    runs do not count."""
    s = await make_store(factory)
    tag = tag_of("k")
    cap = QueueCap("wf", tag, "k", limit=1, max_queue_depth=1)
    for run in (mk("a", key="k"), mk("b", key="k", t=T0 + 1)):
        _, created = await s.create_run(run, started(run), queue_cap=cap)
        expect(created, f"create_run({run.id!r}) below the queue cap must create the run")
    await put(s, mk("other-wf", key="k", wf="wf2", t=T0 + 1))
    await put(s, mk("other-key", key="k2", t=T0 + 1))
    await put(s, mk("settled", key="k", status=S.COMPLETED, t=T0 - 1))
    c = mk("c", key="k", t=T0 + 2)
    err = await expect_raises(
        SingletonQueueFullError,
        s.create_run(c, started(c), queue_cap=cap),
        "create_run at the queue cap",
    )
    if not isinstance(err, SingletonQueueFullError):  # for the type checker
        fail(f"expected SingletonQueueFullError, got {err!r}")
    expect_eq(
        (err.workflow, err.key, err.max_queue_depth),
        ("wf", "k", 1),
        "SingletonQueueFullError fields (workflow, key, max_queue_depth)",
    )
    expect_eq(await s.get_run("c"), None, "a run rejected by the queue cap must not exist")
    await expect_raises(
        RunNotFoundError, s.load_events("c"), "load_events of a run rejected by the queue cap"
    )
    expect_eq(
        [r.id for r in await s.list_runs(workflow="wf", tag=tag)],
        ["settled", "a", "b"],
        "runs of the key after a rejected create",
    )
    existing, created = await s.create_run(mk("a", key="k"), [], queue_cap=cap)
    expect(
        not created and existing.id == "a",
        "an idempotent create_run of an existing id must return it even at the queue cap",
    )
    await s.commit("a", None, T0 + 3, Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED))
    _, created = await s.create_run(c, started(c), queue_cap=cap)
    expect(created, "a settled run must free its place in the queue")


@check()
async def check_list_runs_order_and_filters(factory: StoreFactory) -> None:
    """``list_runs`` returns runs oldest ``(created_at, id)`` first; ``workflow``, ``status``,
    ``tag`` (exact membership) and ``limit`` filter."""
    s = await make_store(factory)
    runs = [
        mk("m", t=T0 + 2, tags=("a_b",)),
        mk("b", t=T0 + 1, wf="other", tags=("100%",)),
        mk("a", t=T0 + 1, status=S.SUSPENDED, tags=("axb",)),
        mk("z", t=T0, key="k"),
        mk("y", t=T0 + 0.000001, key="k2", status=S.COMPLETED),
    ]
    for r in runs:
        await put(s, r)
    expect_eq([r.id for r in await s.list_runs()], ["z", "y", "a", "b", "m"], "list_runs order")
    expect_eq(
        [r.id for r in await s.list_runs(workflow="wf")],
        ["z", "y", "a", "m"],
        "list_runs(workflow='wf')",
    )
    expect_eq([r.id for r in await s.list_runs(status=S.SUSPENDED)], ["a"], "list_runs(status=...)")
    expect_eq([r.id for r in await s.list_runs(tag="a_b")], ["m"], "list_runs(tag='a_b')")
    expect_eq([r.id for r in await s.list_runs(tag="100%")], ["b"], "list_runs(tag='100%')")
    expect_eq([r.id for r in await s.list_runs(tag="a")], [], "list_runs(tag='a') is exact")
    expect_eq(
        [r.id for r in await s.list_runs(tag=tag_of("k"))], ["z"], "list_runs(tag='singleton:k')"
    )
    expect_eq([r.id for r in await s.list_runs(limit=2)], ["z", "y"], "list_runs(limit=2)")
    expect_eq(
        [r.id for r in await s.list_runs(workflow="wf", status=S.PENDING, limit=5)],
        ["z", "m"],
        "list_runs(workflow=, status=, limit=)",
    )
    expect_eq(await s.list_runs(tag=ADMITTED_TAG), [], "list_runs(tag=ADMITTED_TAG)")


@check()
async def check_id_ties_by_code_point(factory: StoreFactory) -> None:
    """Runs created at the same instant are listed (``list_runs``) and due (``due_runs``) in
    the code-point order of their ids, as Python compares ``str``, whatever the collation of
    the store's database: ``B1 Z1 a1 b1 é1``, then U+FF5A and U+1D518 (each followed by
    ``1``); not a locale's ``a1 b1 B1 é1 Z1``, nor UTF-16 order (U+1D518 first)."""
    s = await make_store(factory)
    tied = ("é1", "b1", "Z1", "a1", "B1", "\uff5a1", "\U0001d5181")
    for rid in tied:
        await put(s, mk(rid, t=T0))
    await put(s, mk("0-later", t=T0 + 1))
    want = [*sorted(tied), "0-later"]
    expect_eq([r.id for r in await s.list_runs()], want, "list_runs order of tied runs")
    expect_eq([r.id for r in await s.list_runs(limit=3)], want[:3], "list_runs(limit=3)")
    expect_eq(await s.due_runs(T0 + 1, 20), want, "due_runs order of tied pending runs")
    expect_eq(await s.due_runs(T0 + 1, 3), want[:3], "due_runs(limit=3) of tied pending runs")


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


# -- claims and leases -----------------------------------------------------------------------


@check()
async def check_claim_exclusive(factory: StoreFactory) -> None:
    """``claim`` takes the lease once: the run becomes ``running`` with the lease, wake time
    cleared, ``updated_at=now``; a second claimer gets ``None``, so does an unknown run."""
    s = await make_store(factory)
    await put(s, mk("r", status=S.SUSPENDED, wake_at=T0 - 1))
    won = await s.claim("r", "w1", T0, T0 + 30)
    if won is None:
        fail("claim of a due run returned None")
    expect_eq(
        (won.status, won.lease_owner, won.lease_expires, won.wake_at, won.updated_at),
        (S.RUNNING, "w1", T0 + 30, None, T0),
        "(status, lease_owner, lease_expires, wake_at, updated_at) of a claimed run",
    )
    expect_eq(await s.get_run("r"), won, "get_run after claim")
    expect_eq(await s.claim("r", "w2", T0, T0 + 30), None, "a second claim of a leased run")
    expect_eq(await s.claim("r", "w1", T0 + 1, T0 + 31), None, "a re-claim by the holder")
    expect_eq(await s.get_run("r"), won, "a refused claim must write nothing")
    expect_eq(await s.claim("unknown", "w1", T0, T0 + 30), None, "claim of an unknown run")


@check()
async def check_claimable_rules(factory: StoreFactory) -> None:
    """Claimable: ``pending``; ``suspended``/``blocked`` with ``wake_at <= now``; ``running``
    or ``cancelling`` without a live lease (a lease expiring at ``now`` is not live). A
    claimed ``cancelling`` run stays ``cancelling``. Nothing else is claimable, and
    ``due_runs`` lists exactly the claimable runs."""
    s = await make_store(factory)
    now = T0 + 5
    runs = {
        # claimable
        "pending": mk("pending"),
        "running-unleased": mk("running-unleased", status=S.RUNNING),
        "running-expired": mk(
            "running-expired", status=S.RUNNING, lease_expires=now, lease_owner="w0"
        ),
        "suspended-due": mk("suspended-due", status=S.SUSPENDED, wake_at=now),
        "blocked-due": mk("blocked-due", status=S.BLOCKED, wake_at=T0 + 4),
        "cancelling": mk("cancelling", status=S.CANCELLING),
        "cancelling-due": mk("cancelling-due", status=S.CANCELLING, wake_at=T0 + 1),
        "cancelling-expired": mk(
            "cancelling-expired", status=S.CANCELLING, lease_expires=T0 + 1, lease_owner="w0"
        ),
        # not claimable
        "running-leased": mk(
            "running-leased", status=S.RUNNING, lease_expires=now + 1, lease_owner="w0"
        ),
        "suspended-later": mk("suspended-later", status=S.SUSPENDED, wake_at=now + 0.000001),
        "suspended-forever": mk("suspended-forever", status=S.SUSPENDED, waiting_signals=("go",)),
        "suspended-leased": mk(
            "suspended-leased",
            status=S.SUSPENDED,
            wake_at=T0,
            lease_expires=now + 3,
            lease_owner="w0",
        ),
        "blocked-later": mk("blocked-later", status=S.BLOCKED, wake_at=T0 + 9),
        "cancelling-leased": mk(
            "cancelling-leased", status=S.CANCELLING, lease_expires=T0 + 9, lease_owner="w0"
        ),
        "completed": mk("completed", status=S.COMPLETED),
        "failed": mk("failed", status=S.FAILED),
        "cancelled": mk("cancelled", status=S.CANCELLED),
    }
    claimable = {
        "pending",
        "running-unleased",
        "running-expired",
        "suspended-due",
        "blocked-due",
        "cancelling",
        "cancelling-due",
        "cancelling-expired",
    }
    for run in runs.values():
        await put(s, run)
    expect_eq(set(await s.due_runs(now, 100)), claimable, "due_runs(now) must list the claimable")
    for rid, run in runs.items():
        got = await s.claim(rid, "w9", now, now + 30)
        if rid not in claimable:
            expect_eq(got, None, f"claim of the non-claimable run {rid!r}")
            expect_eq(await s.get_run(rid), run, f"a refused claim of {rid!r} must write nothing")
            continue
        if got is None:
            fail(f"claim of the claimable run {rid!r} ({run.status}) returned None")
        status = S.CANCELLING if run.status is S.CANCELLING else S.RUNNING
        expect_eq(
            got,
            dataclasses.replace(
                run,
                status=status,
                wake_at=None,
                lease_owner="w9",
                lease_expires=now + 30,
                updated_at=now,
            ),
            f"run {rid!r} after claim",
        )


@check()
async def check_renew_lease(factory: StoreFactory) -> None:
    """``renew_lease`` extends the holder's lease and returns the run; anyone else (or a
    settled run) gets ``None`` and changes nothing."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 10)
    renewed = await s.renew_lease("r", "w1", T0 + 20)
    if renewed is None:
        fail("renew_lease by the lease holder returned None")
    expect_eq(renewed.lease_expires, T0 + 20, "lease_expires after renew_lease")
    expect_eq(await s.get_run("r"), renewed, "get_run after renew_lease")
    expect_eq(await s.renew_lease("r", "w2", T0 + 30), None, "renew_lease by a non-holder")
    expect_eq(await s.get_run("r"), renewed, "a refused renew_lease must write nothing")
    expect_eq(await s.claim("r", "w2", T0 + 19, T0 + 49), None, "claim before a renewed expiry")
    taken = await s.claim("r", "w2", T0 + 20, T0 + 50)
    expect(taken is not None and taken.lease_owner == "w2", "claim after the lease expired")
    expect_eq(await s.renew_lease("r", "w1", T0 + 60), None, "renew_lease by a fenced-off owner")
    await s.commit(
        "r", "w2", T0 + 21, Update(events=[RunCompleted(at=T0 + 21)], status=S.COMPLETED)
    )
    expect_eq(await s.renew_lease("r", "w2", T0 + 90), None, "renew_lease of a settled run")
    expect_eq(await s.renew_lease("nope", "w2", T0 + 90), None, "renew_lease of an unknown run")


@check(requires=["release_leases"])
async def check_release_leases(factory: StoreFactory) -> None:
    """``release_leases(owner, now)`` gives back every lease ``owner`` holds on an active run
    (a worker restarted under its old instance id) and returns those run ids: the runs are
    claimable at once; other owners' leases and settled runs are untouched."""
    s: Any = await make_store(factory)
    for rid in ("a", "b", "c", "done"):
        await put(s, mk(rid))
    await s.claim("a", "w1", T0, T0 + 30)
    await s.claim("b", "w1", T0, T0 + 30)
    await s.claim("c", "w2", T0, T0 + 30)
    await s.claim("done", "w1", T0, T0 + 30)
    await s.commit(
        "done", "w1", T0 + 1, Update(events=[RunCompleted(at=T0 + 1)], status=S.COMPLETED)
    )
    before_c = await get(s, "c")
    released = await s.release_leases("w1", T0 + 2)
    expect_eq(sorted(released), ["a", "b"], "release_leases('w1') returns the runs it freed")
    for rid in ("a", "b"):
        run = await get(s, rid)
        expect(run.lease_owner is None and run.lease_expires is None, f"{rid} is unleased")
        expect_eq(run.status, S.RUNNING, f"{rid} keeps its status")
        taken = await s.claim(rid, "w1", T0 + 2, T0 + 32)
        expect(taken is not None, f"{rid} is claimable at once after release_leases")
    expect_eq(await get(s, "c"), before_c, "another owner's lease is untouched")
    expect_eq((await get(s, "done")).status, S.COMPLETED, "a settled run is untouched")
    expect_eq(await s.release_leases("nobody", T0 + 3), [], "an owner without leases")


@check()
async def check_cancelling_is_sticky(factory: StoreFactory) -> None:
    """A non-terminal status never replaces ``cancelling``; a suspend while cancelling is due
    at once; a terminal status settles it."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 30)
    res = await s.commit("r", None, T0 + 1, Update(status=S.CANCELLING, ignore_lease=True))
    expect_eq(res.run.status, S.CANCELLING, "status after requesting cancellation")
    for st in (S.RUNNING, S.BLOCKED, S.PENDING):
        res = await s.commit("r", "w1", T0 + 2, Update(status=st))
        expect_eq(res.run.status, S.CANCELLING, f"a commit of status {st} on a cancelling run")
    res = await s.commit(
        "r",
        "w1",
        T0 + 3,
        Update(status=S.SUSPENDED, wake_at=T0 + 100, release_lease=True),
    )
    expect_eq(
        (res.run.status, res.run.wake_at),
        (S.CANCELLING, T0 + 3),
        "(status, wake_at) after suspending a cancelling run (it must be due at once)",
    )
    expect_eq(await s.get_run("r"), res.run, "get_run after suspending a cancelling run")
    expect_eq(await s.due_runs(T0 + 3, 10), ["r"], "due_runs with a cancelling run")
    again = await s.claim("r", "w2", T0 + 3, T0 + 33)
    expect(
        again is not None and again.status is S.CANCELLING,
        f"a claimed cancelling run must stay cancelling, got {again!r}",
    )
    res = await s.commit(
        "r", "w2", T0 + 4, Update(events=[RunCompleted(at=T0 + 4)], status=S.CANCELLED)
    )
    expect_eq(res.run.status, S.CANCELLED, "a terminal status settles a cancelling run")


@check()
async def check_terminal_commit_clears_bookkeeping(factory: StoreFactory) -> None:
    """A terminal commit removes the admission marker and clears the lease, ``wake_at`` and
    ``waiting_signals``: the run is never due, claimable or renewable again."""
    s = await make_store(factory)
    for i, status in enumerate((S.COMPLETED, S.FAILED, S.CANCELLED)):
        rid = f"r-{status}"
        await put(
            s,
            mk(
                rid,
                key=f"k{i}",
                tags=(ADMITTED_TAG, "user-tag"),
                status=S.RUNNING,
                wake_at=T0 + 40,
                waiting_signals=("go",),
                lease_owner="w1",
                lease_expires=T0 + 30,
            ),
        )
        res = await s.commit(
            rid, "w1", T0 + 1, Update(events=[RunCompleted(at=T0 + 1)], status=status)
        )
        run = res.run
        expect_eq(await s.get_run(rid), run, f"get_run after the {status} commit")
        expect_eq(run.tags, (tag_of(f"k{i}"), "user-tag"), f"tags after the {status} commit")
        expect_eq(
            (run.status, run.lease_owner, run.lease_expires, run.wake_at, run.waiting_signals),
            (status, None, None, None, ()),
            f"(status, lease_owner, lease_expires, wake_at, waiting_signals) after {status}",
        )
        expect_eq(await s.claim(rid, "w2", T0 + 100, T0 + 130), None, f"claim of a {status} run")
        expect_eq(await s.renew_lease(rid, "w1", T0 + 100), None, f"renew_lease of a {status} run")
    expect_eq(await s.due_runs(T0 + 1000, 10), [], "due_runs with only settled runs")
    expect_eq(await s.next_due_at(), None, "next_due_at with only settled runs")
    expect_eq(await s.list_runs(tag=ADMITTED_TAG), [], "runs carrying the admission marker")


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


# -- values ----------------------------------------------------------------------------------


@check()
async def check_microsecond_timestamps(factory: StoreFactory) -> None:
    """Every timestamp (run fields, lease, wake time, event ``at`` and payload times) comes
    back exactly, to the microsecond, as the same float."""
    s = await make_store(factory)
    stamps = [
        1767225600.123457,
        1767225600.000001,
        1767225600.999999,
        round(0.1 + 0.2, 6),
        0.1 + 0.2,
        4102444800.654321,
    ]
    for i, t in enumerate(stamps):
        await put(s, mk(f"r{i}", t=t))
        run = await get(s, f"r{i}")
        expect(
            repr(run.created_at) == repr(t) and repr(run.updated_at) == repr(t),
            f"created_at/updated_at {t!r} came back as {run.created_at!r}/{run.updated_at!r}",
        )
        (ev,) = await s.load_events(f"r{i}")
        expect_eq(ev.at, t, "run_started.at")
        claimed = await s.claim(f"r{i}", "w", t + 0.000001, t + 30.000001)
        expect(
            claimed is not None and claimed.lease_expires == t + 30.000001,
            f"lease_expires {t + 30.000001!r} came back as "
            f"{claimed.lease_expires if claimed else None!r}",
        )
        res = await s.commit(
            f"r{i}",
            "w",
            t + 0.000002,
            Update(
                events=[TimerStarted(pos="0", fire_at=t + 60.000003, at=t + 0.000002)],
                status=S.SUSPENDED,
                wake_at=t + 60.000003,
                release_lease=True,
            ),
        )
        got = await get(s, f"r{i}")
        expect_eq(got, res.run, "get_run after a commit with microsecond times")
        expect(
            got.wake_at == t + 60.000003 and got.updated_at == t + 0.000002,
            f"wake_at/updated_at {t + 60.000003!r}/{t + 0.000002!r} came back as "
            f"{got.wake_at!r}/{got.updated_at!r}",
        )
        last = (await s.load_events(f"r{i}"))[-1]
        expect_eq(
            (last.at, getattr(last, "fire_at", None)),
            (t + 0.000002, t + 60.000003),
            "timer_started (at, fire_at)",
        )
    expect_eq(
        [r.created_at for r in await s.list_runs()],
        sorted(stamps),
        "list_runs order by microsecond created_at",
    )


@check()
async def check_payloads_round_trip(factory: StoreFactory) -> None:
    """Inputs, outputs, errors, signal payloads and event payloads come back equal, floats
    staying floats."""
    s = await make_store(factory)
    payload = {
        "text": 'naïve ☃ "quoted" \\ \n',
        "ints": [0, -1, 2**53 + 1, 2**62],
        "floats": [0.5, 10.0, 1e-7, 1e20, 1767225600.123457],
        "nested": {"b": [True, False, None], "a": {"x": []}},
        "empty": {},
    }
    run = await put(s, dataclasses.replace(mk("r"), input=payload))
    expect_eq(await s.get_run("r"), run, "get_run of a run with a rich input")
    await s.deliver_signal("r", "sig", payload, T0)
    sig = await s.peek_signal("r", "sig")
    expect(sig is not None and sig.payload == payload, "signal payload round trip")
    await s.claim("r", "w", T0, T0 + 30)
    res = await s.commit(
        "r",
        "w",
        T0 + 1,
        Update(
            events=[RunCompleted(output=payload, at=T0 + 1)],
            status=S.COMPLETED,
            output=payload,
            error={"type": "X", "message": "é"},
        ),
    )
    got = await get(s, "r")
    expect_eq(got, res.run, "get_run after a commit with rich payloads")
    expect_eq(got.output, payload, "output round trip")
    expect_eq(
        (await s.load_events("r"))[-1],
        RunCompleted(seq=2, output=payload, at=T0 + 1),
        "event payload round trip",
    )
    floats = got.output["floats"]
    expect(
        all(isinstance(f, float) for f in floats),
        f"floats must come back as floats: {floats!r}",
    )


# -- namespaces ------------------------------------------------------------------------------


@check(requires=["scoped"])
async def check_namespace_scoping(factory: StoreFactory) -> None:
    """``store.scoped(ns)`` sees, claims and signals only the runs of ``ns`` and stamps its
    namespace on the runs it creates; run ids stay unique across namespaces
    (``RunIdTakenError``); the unscoped store sees everything. With singleton support, a
    scoped store's keys are its own while the unscoped store shares keys across namespaces."""
    base: Any = await make_store(factory)
    a, b = base.scoped("A"), base.scoped("B")
    ra = await a.create_run(mk("ra"), started(mk("ra")))
    expect(ra[1] and ra[0].namespace == "A", f"a scoped create_run must stamp 'A': {ra[0]!r}")
    await put(b, dataclasses.replace(mk("rb", t=T0 + 1), namespace="B"))
    await put(base, mk("rn", t=T0 + 2))
    expect_eq([r.id for r in await a.list_runs()], ["ra"], "list_runs of namespace A")
    expect_eq([r.id for r in await base.list_runs()], ["ra", "rb", "rn"], "unscoped list_runs")
    expect_eq(await a.get_run("rb"), None, "get_run of another namespace's run")
    expect_eq(await a.get_run("rn"), None, "get_run of an unscoped run from namespace A")
    expect_eq(await a.claim("rb", "w", T0, T0 + 1), None, "claim of another namespace's run")
    expect_eq(await a.due_runs(T0 + 5, 10), ["ra"], "due_runs of namespace A")
    await expect_raises(
        RunNotFoundError, a.load_events("rb"), "load_events of another namespace's run"
    )
    await expect_raises(
        RunNotFoundError,
        a.deliver_signal("rb", "go", None, T0),
        "deliver_signal to another namespace's run",
    )
    await expect_raises(
        RunIdTakenError, b.create_run(mk("ra"), []), "create_run of an id taken in namespace A"
    )
    existing, created = await base.create_run(mk("ra"), [])
    expect(
        not created and existing.namespace == "A",
        "an unscoped create_run of an existing id must return it",
    )
    expect_eq((await a.create_run(mk("ra"), []))[0], existing, "a scoped idempotent create_run")
    if getattr(base, "try_admit_singleton", None) is None:
        return
    tag = tag_of("k")
    await put(a, dataclasses.replace(mk("sa", key="k", t=T0), namespace="A"))
    await put(b, dataclasses.replace(mk("sb", key="k", t=T0 + 1), namespace="B"))
    expect(await b.try_admit_singleton("sb", tag, "wf", 1, T0 + 1), "'sb' denied in B")
    expect(
        await a.try_admit_singleton("sa", tag, "wf", 1, T0 + 1),
        "'sa' denied in A although the key's holder 'sb' is in namespace B",
    )
    await put(base, mk("sn", key="k", t=T0 - 1))
    expect(
        not await base.try_admit_singleton("sn", tag, "wf", 2, T0 + 1),
        "the unscoped store admitted a third run to two slots held across namespaces",
    )
    if not getattr(base, "admits_on_create", False):
        return
    # admission at creation: the same rules, decided by create_run
    qa, _ = await create(a, claimed("qa", key="q"), admission(T0 + 1, key="q"))
    expect(qa.admitted and qa.namespace == "A", f"'qa' created in A: {qa!r}")
    qb, _ = await create(b, claimed("qb", key="q", t=T0 + 1), admission(T0 + 2, key="q"))
    expect(qb.admitted, f"'qb' was gated in B although the key's holder 'qa' is in A: {qb!r}")
    qn, _ = await create(
        base, claimed("qn", key="q", t=T0 + 2), admission(T0 + 3, limit=2, key="q")
    )
    expect(
        not qn.admitted and qn.status is S.SUSPENDED,
        f"the unscoped store admitted a third run at creation to two slots held across "
        f"namespaces: {qn!r}",
    )
