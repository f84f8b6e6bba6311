"""Checks of dead letters and retries (docs/deadlines-and-dead-letters.md): a claim that takes over
a dead worker's lease counts the lost activation in ``Run.recoveries`` (so does ``release_leases``;
a graceful give-back does not), ``dead`` is terminal like the other settled statuses, and a
retry's commit sets the run's new input, deadline and recovery count."""

from __future__ import annotations

from typing import Any

from flowkit import ADMITTED_TAG
from flowkit.events import RunDead, RunRetried
from flowkit.stores.base import Notify, Update

from ._registry import check
from ._support import (
    T0,
    WF,
    S,
    StoreFactory,
    expect,
    expect_eq,
    fail,
    get,
    make_store,
    mk,
    put,
    tag_of,
)


@check()
async def check_claim_counts_lost_activations(factory: StoreFactory) -> None:
    """A claim of a ``running`` or ``cancelling`` run whose lease expired (its worker died)
    adds 1 to ``recoveries`` in the claim itself; a claim of a run nobody held (pending,
    suspended, a lease given back) leaves it as it is; a refused claim writes nothing."""
    s = await make_store(factory)
    now = T0 + 40
    cases = {
        # run id: (the run, its recoveries once claimed)
        "running-expired": (
            mk("running-expired", status=S.RUNNING, lease_owner="w0", lease_expires=T0 + 30),
            1,
        ),
        "cancelling-expired": (
            mk("cancelling-expired", status=S.CANCELLING, lease_owner="w0", lease_expires=T0),
            1,
        ),
        "counted-before": (
            mk(
                "counted-before",
                status=S.RUNNING,
                lease_owner="w0",
                lease_expires=T0 + 30,
                recoveries=4,
            ),
            5,
        ),
        "pending": (mk("pending"), 0),
        "running-given-back": (mk("running-given-back", status=S.RUNNING, recoveries=2), 2),
        "suspended-due": (mk("suspended-due", status=S.SUSPENDED, wake_at=T0 + 1), 0),
    }
    for run, _ in cases.values():
        await put(s, run)
    for rid, (_, want) in cases.items():
        won = await s.claim(rid, "w1", now, now + 30)
        if won is None:
            fail(f"claim of {rid} (claimable) returned None")
        expect_eq(won.recoveries, want, f"recoveries of {rid} once claimed")
        expect_eq((await get(s, rid)).recoveries, want, f"recoveries of {rid} as stored")
    # a live lease: the claim is refused and counts nothing
    await put(s, mk("live", status=S.RUNNING, lease_owner="w0", lease_expires=now + 10))
    expect_eq(await s.claim("live", "w1", now, now + 30), None, "claim of a live lease")
    expect_eq((await get(s, "live")).recoveries, 0, "recoveries after a refused claim")


@check(requires=["release_leases"])
async def check_release_leases_counts_lost_activations(factory: StoreFactory) -> None:
    """``release_leases`` of a restarted worker counts each ``running``/``cancelling`` run it
    takes back as a lost activation; a graceful give-back (a commit with ``release_lease``)
    does not, and neither does the claim that follows either."""
    s: Any = await make_store(factory)
    for rid in ("lost", "given"):
        await put(s, mk(rid))
        await s.claim(rid, "w1", T0, T0 + 30)
    await s.commit("given", "w1", T0 + 1, Update(release_lease=True))
    released = await s.release_leases("w1", T0 + 2)
    expect_eq(sorted(released), ["lost"], "release_leases returns the runs it freed")
    expect_eq((await get(s, "lost")).recoveries, 1, "recoveries after release_leases")
    expect_eq((await get(s, "given")).recoveries, 0, "recoveries after a graceful give-back")
    for rid, want in (("lost", 1), ("given", 0)):
        won = await s.claim(rid, "w2", T0 + 3, T0 + 33)
        expect(won is not None, f"{rid} is claimable")
        expect_eq((await get(s, rid)).recoveries, want, f"recoveries of {rid} after its claim")


@check()
async def check_dead_is_terminal(factory: StoreFactory) -> None:
    """``dead`` is terminal: its commit removes the admission marker, clears the lease and the
    wake time, wakes the key's oldest waiter (notify-on-release) and leaves the run never
    due, claimable or renewable again; ``list_runs(status=dead)`` finds it."""
    s = await make_store(factory)
    await put(s, mk("h", key="k", tags=(ADMITTED_TAG,), status=S.RUNNING))
    await put(s, mk("w", t=T0 + 1, key="k", status=S.SUSPENDED, wake_at=T0 + 500))
    await s.claim("h", "w1", T0 + 2, T0 + 32)
    res = await s.commit(
        "h",
        "w1",
        T0 + 3,
        Update(
            events=[RunDead(recoveries=3, at=T0 + 3)],
            status=S.DEAD,
            error={"type": "RunDead", "message": "lost 3 times"},
            notify=Notify(WF, tag_of("k"), 1),
        ),
    )
    run = res.run
    expect_eq(
        (run.status, run.lease_owner, run.lease_expires, run.wake_at, run.admitted),
        (S.DEAD, None, None, None, False),
        "(status, lease_owner, lease_expires, wake_at, admitted) of a dead run",
    )
    expect_eq(res.woken, ("w",), "the waiter a dead holder's release wakes")
    expect_eq((await get(s, "w")).wake_at, T0 + 3, "the woken waiter is due now")
    expect_eq(await s.claim("h", "w2", T0 + 100, T0 + 130), None, "claim of a dead run")
    expect_eq(await s.renew_lease("h", "w1", T0 + 100), None, "renew_lease of a dead run")
    expect_eq([r.id for r in await s.list_runs(status=S.DEAD)], ["h"], "list_runs(status=dead)")
    expect("h" not in await s.due_runs(T0 + 1000, 10), "a dead run is never due")
    expect_eq((await s.load_events("h"))[-1].type, "run_dead", "the dead run's last event")


@check()
async def check_retry_sets_input_deadline_and_recoveries(factory: StoreFactory) -> None:
    """A retry's commit (``Update.input``, ``deadline_at``, ``recoveries``) re-opens a
    ``dead`` run: ``pending`` with its new input, deadline and a reset recovery count, its
    ``run_retried`` record (with the new input) appended; ``expect_status`` guards it."""
    s = await make_store(factory)
    await put(s, mk("r", status=S.DEAD, recoveries=4, deadline_at=T0 + 10))
    retry = Update(
        events=[RunRetried(attempt=2, new_input=True, input={"n": 2}, at=T0 + 50)],
        status=S.PENDING,
        error=None,
        attempt=2,
        input={"n": 2, "name": "again"},
        deadline_at=T0 + 110,
        recoveries=0,
        expect_status=frozenset({S.FAILED, S.DEAD}),
    )
    res = await s.commit("r", None, T0 + 50, retry)
    want = (S.PENDING, {"n": 2, "name": "again"}, T0 + 110, 0, 2)
    for what, run in (("commit result", res.run), ("stored", await get(s, "r"))):
        expect_eq(
            (run.status, run.input, run.deadline_at, run.recoveries, run.attempt),
            want,
            f"(status, input, deadline_at, recoveries, attempt) of the retried run ({what})",
        )
    last = (await s.load_events("r"))[-1]
    expect(
        isinstance(last, RunRetried) and last.new_input and last.input == {"n": 2},
        f"the run_retried record with its new input, got {last!r}",
    )


__all__ = [
    "check_claim_counts_lost_activations",
    "check_dead_is_terminal",
    "check_release_leases_counts_lost_activations",
    "check_retry_sets_input_deadline_and_recoveries",
]
