"""Checks of the optional capabilities of versioned fleets: claims and due runs by
``(workflow, version)`` (``claims_by_version``), a release that hands a slot over only to a
waiter of a version the releasing worker has (``Notify.claim_versions``), what workers
make known of themselves (``records_workers``) and the schemas they record
(``records_schemas``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from flowkit import Run
from flowkit.events import RunCompleted
from flowkit.stores.base import Notify, Update, WorkerSeen

from ._registry import check
from ._support import (
    T0,
    WF,
    S,
    StoreFactory,
    expect,
    expect_eq,
    get,
    make_store,
    mk,
    put,
    tag_of,
)

TAG = tag_of("k")


def _v(run: Run, version: str) -> Run:
    return dataclasses.replace(run, workflow_version=version)


@check(requires=("claims_by_version",))
async def check_claim_by_version(factory: StoreFactory) -> None:
    """``claim(..., versions=...)`` takes only a run whose ``(workflow, workflow_version)``
    is listed and writes nothing otherwise; ``versions=None`` claims any run."""
    s: Any = await make_store(factory)
    await put(s, _v(mk("r2"), "2"))
    await put(s, _v(mk("r10"), "10"))
    before = await get(s, "r2")
    for versions in ([(WF, "1")], [("other", "2")], [(WF, "10")], []):
        got = await s.claim("r2", "w1", T0, T0 + 30, versions=versions)
        expect_eq(got, None, f"claim of a version-2 run with versions={versions!r}")
    expect_eq(await get(s, "r2"), before, "a refused claim must write nothing")
    won = await s.claim("r2", "w1", T0, T0 + 30, versions=[(WF, "1"), (WF, "2")])
    expect(won is not None and won.lease_owner == "w1", "claim with the run's version refused")
    won = await s.claim("r10", "w1", T0, T0 + 30, versions=None)
    expect(won is not None, "claim with versions=None refused")


@check(requires=("claims_by_version",))
async def check_due_runs_by_version(factory: StoreFactory) -> None:
    """``due_runs(..., versions=...)`` lists only the due runs of the listed ``(workflow,
    version)`` pairs, most overdue first; ``workflows`` given as well narrows them further."""
    s: Any = await make_store(factory)
    await put(s, _v(mk("a1", t=T0), "1"))
    await put(s, _v(mk("a2", t=T0 + 1), "2"))
    await put(s, _v(mk("a3", t=T0 + 2), "1"))
    await put(s, _v(mk("b1", t=T0 + 3, wf="other"), "1"))
    now = T0 + 10
    expect_eq(await s.due_runs(now, 10, versions=[(WF, "1")]), ["a1", "a3"], "v1 due runs")
    expect_eq(await s.due_runs(now, 10, versions=[(WF, "2")]), ["a2"], "v2 due runs")
    both = await s.due_runs(now, 10, versions=[(WF, "1"), ("other", "1")])
    expect_eq(both, ["a1", "a3", "b1"], "due runs of two pairs")
    only = await s.due_runs(now, 10, [WF], versions=[(WF, "2"), ("other", "1")])
    expect_eq(only, ["a2"], "due runs of the pairs of the listed workflows")
    expect_eq(await s.due_runs(now, 10, versions=[]), [], "due runs of no pair")
    expect_eq(await s.due_runs(now, 1, versions=[(WF, "1")]), ["a1"], "the limit")
    expect_eq(len(await s.due_runs(now, 10, versions=None)), 4, "versions=None: every run")


@check(requires=("claims_by_version", "try_admit_singleton"))
async def check_hand_over_only_to_a_version_of_the_releaser(factory: StoreFactory) -> None:
    """A release with ``Notify.claim_versions`` hands the slot only to a waiter of one of
    those versions of the workflow; the oldest waiter of another version is woken instead
    (due now, not leased), by the general release and by the releasing lease holder's."""
    for owner in (None, "me"):
        s: Any = await make_store(factory)
        await put(s, mk("h", key="k", t=T0))
        await put(s, _v(mk("w1", key="k", t=T0 + 1), "2"))
        expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1), "'h' denied")
        expect(not await s.try_admit_singleton("w1", TAG, WF, 1, T0 + 50), "'w1' admitted")
        if owner is not None:
            expect(await s.claim("h", owner, T0 + 2, T0 + 60) is not None, "'h' not claimed")
        n = Notify(
            WF, TAG, 1, claim_owner="me", lease_expires=T0 + 100, claim_versions=frozenset({"1"})
        )
        done = Update(events=[RunCompleted(at=T0 + 3)], status=S.COMPLETED, notify=n)
        res = await s.commit("h", owner, T0 + 3, done)
        expect_eq(res.handed, (), f"a version-2 waiter handed to a version-1 worker ({owner})")
        expect_eq(res.woken, ("w1",), f"the version-2 waiter woken ({owner})")
        got = await get(s, "w1")
        expect_eq(
            (got.lease_owner, got.wake_at, got.admitted),
            (None, T0 + 3, False),
            f"the woken version-2 waiter ({owner})",
        )
        # the same release by a worker with version 2 hands it over (when the store does)
        s = await make_store(factory)
        await put(s, mk("h", key="k", t=T0))
        await put(s, _v(mk("w1", key="k", t=T0 + 1), "2"))
        expect(await s.try_admit_singleton("h", TAG, WF, 1, T0 + 1), "'h' denied")
        expect(not await s.try_admit_singleton("w1", TAG, WF, 1, T0 + 50), "'w1' admitted")
        if owner is not None:
            expect(await s.claim("h", owner, T0 + 2, T0 + 60) is not None, "'h' not claimed")
        n = dataclasses.replace(n, claim_versions=frozenset({"1", "2"}))
        done = dataclasses.replace(done, notify=n)
        res = await s.commit("h", owner, T0 + 3, done)
        handed = [h.run.id for h in res.handed]
        expect(handed == ["w1"] or res.woken == ("w1",), f"w1 neither handed nor woken ({owner})")


@check(requires=("records_workers",))
async def check_record_worker(factory: StoreFactory) -> None:
    """``record_worker`` inserts or replaces an instance's entry (its ``(workflow, version)``
    pairs, when seen); ``workers`` lists the entries by instance id."""
    s: Any = await make_store(factory)
    expect_eq(await s.workers(), [], "workers of a fresh store")
    await s.record_worker("b", [(WF, "2"), (WF, "1")], T0)
    await s.record_worker("a", [(WF, "1")], T0 + 1)
    await s.record_worker("b", [(WF, "1"), (WF, "2"), ("other", "3")], T0 + 2)
    expect_eq(
        await s.workers(),
        [
            WorkerSeen("a", ((WF, "1"),), T0 + 1),
            WorkerSeen("b", (("other", "3"), (WF, "1"), (WF, "2")), T0 + 2),
        ],
        "workers after three records",
    )


@check(requires=("records_schemas",))
async def check_workflow_schemas(factory: StoreFactory) -> None:
    """``put_workflow_schemas`` inserts or replaces the JSON document of each ``(workflow,
    version)``; ``workflow_schema`` reads it back as written (``None`` for one never put),
    taking the namespace of the run it is wanted for too."""
    s: Any = await make_store(factory)
    expect(await s.workflow_schema(WF, "1") is None, "a schema in a fresh store")
    first = {"format": 1, "input": {"type": "integer"}, "signals": {"go": None}}
    await s.put_workflow_schemas({(WF, "1"): first, (WF, "2"): {"n": [1, 2.5, "é"]}})
    expect_eq(await s.workflow_schema(WF, "1"), first, "the schema of version 1")
    expect_eq(await s.workflow_schema(WF, "2"), {"n": [1, 2.5, "é"]}, "the schema of version 2")
    await s.put_workflow_schemas({(WF, "1"): {"format": 1, "replaced": True}})
    expect_eq(await s.workflow_schema(WF, "1"), {"format": 1, "replaced": True}, "replaced")
    expect(await s.workflow_schema("other", "1") is None, "a schema of another workflow")
    # (the namespace of the run it is wanted for; the store's own without one)
    expect_eq(await s.workflow_schema(WF, "2", None), {"n": [1, 2.5, "é"]}, "namespace None")
