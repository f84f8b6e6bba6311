"""Checks of claims and leases: exclusive claims, the claim rule, renewal, giving leases back,
sticky cancellation, terminal bookkeeping."""

from __future__ import annotations

import dataclasses
from typing import Any

from flowkit import ADMITTED_TAG
from flowkit.events import (
    RunCompleted,
)
from flowkit.stores.base import Update
from flowkit.stores.rules import lost_activation

from ._registry import check
from ._support import (
    T0,
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
        "dead": mk("dead", status=S.DEAD),
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
                # (taking over a dead worker's lease counts: check_claim_counts_lost_activations)
                recoveries=run.recoveries + lost_activation(run),
            ),
            f"run {rid!r} after claim",
        )


@check()
async def check_renew_lease(factory: StoreFactory) -> None:
    """``renew_lease`` extends the holder's lease and returns the run, never shortening it (a
    late renewal lands after a newer one); anyone else (or a settled run) gets ``None`` and
    changes nothing."""
    s = await make_store(factory)
    await put(s, mk("r"))
    await s.claim("r", "w1", T0, T0 + 10)
    renewed = await s.renew_lease("r", "w1", T0 + 20)
    if renewed is None:
        fail("renew_lease by the lease holder returned None")
    expect_eq(renewed.lease_expires, T0 + 20, "lease_expires after renew_lease")
    expect_eq(await s.get_run("r"), renewed, "get_run after renew_lease")
    late = await s.renew_lease("r", "w1", T0 + 15)  # an older renewal that lands late
    expect_eq(
        late.lease_expires if late is not None else None,
        T0 + 20,
        "lease_expires after a late renew_lease with an earlier expiry (never shortened)",
    )
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
    for i, status in enumerate((S.COMPLETED, S.FAILED, S.CANCELLED, S.DEAD)):
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
