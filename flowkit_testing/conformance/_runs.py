"""Checks of creating and listing runs: ``create_run``, its queue cap, ``list_runs``."""

from __future__ import annotations

import dataclasses

from flowkit import ADMITTED_TAG
from flowkit.errors import (
    RunNotFoundError,
    SingletonQueueFullError,
)
from flowkit.events import (
    RunCompleted,
    StepCompleted,
    TimerStarted,
)
from flowkit.stores.base import QueueCap, Update

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
    numbered,
    put,
    started,
    state,
    tag_of,
)

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
async def check_list_runs_by_parent(factory: StoreFactory) -> None:
    """``create_run`` keeps ``Run.parent_id``, and ``list_runs(parent_id=...)`` returns the
    children of that run only (oldest first, with the other filters), for ``ctx.child``
    (docs/composing-workflows.md: cancelling a parent cancels its children, ``flowkit show``
    lists them)."""
    s = await make_store(factory)
    runs = [
        mk("p", t=T0),
        dataclasses.replace(mk("p.child.2", t=T0 + 2, status=S.COMPLETED), parent_id="p"),
        dataclasses.replace(mk("p.child.1", t=T0 + 1), parent_id="p"),
        dataclasses.replace(mk("q.child.1", t=T0 + 1), parent_id="q"),
        dataclasses.replace(mk("p.child.1.child.1", t=T0 + 3), parent_id="p.child.1"),
    ]
    for r in runs:
        await put(s, r)
    got = await s.get_run("p.child.1")
    expect(got is not None and got.parent_id == "p", "create_run must keep parent_id")
    top = await s.get_run("p")
    expect(top is not None and top.parent_id is None, "a run without a parent has parent_id None")
    expect_eq(
        [r.id for r in await s.list_runs(parent_id="p")],
        ["p.child.1", "p.child.2"],
        "list_runs(parent_id='p')",
    )
    expect_eq(
        [r.id for r in await s.list_runs(parent_id="p", status=S.PENDING)],
        ["p.child.1"],
        "list_runs(parent_id=, status=)",
    )
    expect_eq(await s.list_runs(parent_id="nobody"), [], "list_runs(parent_id='nobody')")


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
