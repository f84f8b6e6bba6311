"""Checks of the optional capability ``keeps_schedules`` (``flowkit.stores.schedules``):
the rows of durable schedules, the upsert that keeps a timetable, pause, and the
compare-and-set that lets exactly one of several racing workers take each tick."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from flowkit.stores.schedules import ScheduleRecord

from ._registry import check
from ._support import T0, WF, PairFactory, StoreFactory, expect, expect_eq, make_pair, make_store


def _rec(schedule_id: str, next_fire: float = T0 + 60, **kw: Any) -> ScheduleRecord:
    fields: dict[str, Any] = {"every": 60.0, "input": {"n": 1, "s": "é"}, "created_at": T0}
    fields.update(kw)
    return ScheduleRecord(id=schedule_id, workflow=WF, next_fire=next_fire, **fields)


@check(requires=("keeps_schedules",))
async def check_schedule_rows(factory: StoreFactory) -> None:
    """``put_schedule``/``get_schedule``/``list_schedules`` (by id)/``delete_schedule``
    round-trip every field; a put over a row with the same timetable keeps its
    ``next_fire``, ``paused``, ``last_run_id`` and ``created_at``, a changed timetable
    replaces them; ``set_schedule_paused`` sets the flag (and ``next_fire`` when given)."""
    s: Any = await make_store(factory)
    expect_eq(await s.list_schedules(), [], "schedules of a fresh store")
    b = _rec("b", cron="*/5 * * * *", every=None, timezone="Europe/Berlin", overlap="allow")
    a = _rec("a", catchup_window=30.5, input=None)
    expect_eq(await s.put_schedule(b), b, "put_schedule of a new row")
    await s.put_schedule(a)
    expect_eq(await s.get_schedule("a"), a, "get_schedule")
    expect_eq(await s.get_schedule("zz"), None, "get_schedule of an unknown id")
    expect_eq(await s.list_schedules(), [a, b], "list_schedules, by id")
    paused = await s.set_schedule_paused("a", True, T0 + 5)
    expect(paused is not None and paused.paused, "set_schedule_paused(True) did not pause")
    expect(await s.advance_schedule("a", a.next_fire, T0 + 120, T0 + 6, "r1"), "advance")
    again = _rec("a", input=[2], overlap="allow", created_at=T0 + 9, updated_at=T0 + 9)
    kept = await s.put_schedule(again)
    want = dataclasses.replace(again, next_fire=T0 + 120, paused=True, last_run_id="r1")
    expect_eq(kept, dataclasses.replace(want, created_at=T0), "put with the same timetable")
    new = _rec("a", next_fire=T0 + 3600, every=3600.0, updated_at=T0 + 10)
    expect_eq(await s.put_schedule(new), new, "put with a changed timetable")
    got = await s.set_schedule_paused("a", False, T0 + 11, T0 + 7200)
    expect(got is not None and not got.paused, "set_schedule_paused(False) did not resume")
    expect_eq(got.next_fire if got else None, T0 + 7200, "set_schedule_paused's next_fire")
    expect_eq(await s.set_schedule_paused("zz", True, T0), None, "pausing an unknown id")
    expect_eq(await s.delete_schedule("a"), True, "delete_schedule")
    expect_eq(await s.delete_schedule("a"), False, "delete_schedule of a deleted id")
    expect_eq([r.id for r in await s.list_schedules()], ["b"], "list after a delete")


@check(requires=("keeps_schedules",))
async def check_due_schedules(factory: StoreFactory) -> None:
    """``due_schedules(now, limit)`` lists the schedules not paused whose ``next_fire`` is at
    or before ``now``, earliest first; ``next_schedule_after(now)`` is the earliest later one;
    with ``workflows``, both only count the schedules of these workflows (the limit too: the
    earlier due schedules of other workflows do not take its places); ``advance_schedule`` is
    a compare-and-set on ``next_fire``."""
    s: Any = await make_store(factory)
    for sid, t in (("late", T0 + 30), ("early", T0 + 10), ("now", T0 + 50), ("later", T0 + 90)):
        await s.put_schedule(_rec(sid, next_fire=t))
    await s.put_schedule(_rec("off", next_fire=T0))
    await s.set_schedule_paused("off", True, T0)
    for i in range(3):  # due before all of WF's, and one later than them all
        await s.put_schedule(dataclasses.replace(_rec(f"x{i}", next_fire=T0 + i), workflow="x"))
    await s.put_schedule(dataclasses.replace(_rec("x-later", next_fire=T0 + 80), workflow="x"))
    due = await s.due_schedules(T0 + 50, 10, [WF])
    expect_eq([r.id for r in due], ["early", "late", "now"], "due_schedules of a workflow")
    mine = await s.due_schedules(T0 + 50, 2, [WF, "absent"])
    expect_eq([r.id for r in mine], ["early", "late"], "limit, past other workflows' schedules")
    expect_eq([r.id for r in await s.due_schedules(T0 + 50, 10, [])], [], "no workflows")
    every = await s.due_schedules(T0 + 50, 10)
    expect_eq([r.id for r in every], ["x0", "x1", "x2", "early", "late", "now"], "due_schedules")
    expect_eq([r.id for r in await s.due_schedules(T0 + 50, 2)], ["x0", "x1"], "limit")
    expect_eq(await s.next_schedule_after(T0 + 50), T0 + 80, "next_schedule_after")
    expect_eq(await s.next_schedule_after(T0 + 50, [WF]), T0 + 90, "next of a workflow")
    expect_eq(await s.next_schedule_after(T0 + 50, ["x"]), T0 + 80, "next of the other one")
    expect_eq(await s.next_schedule_after(T0 + 50, []), None, "next of no workflows")
    expect_eq(await s.next_schedule_after(T0 + 90), None, "next_schedule_after, none later")
    moved = await s.advance_schedule("early", T0 + 9, T0 + 70, T0 + 50)
    expect_eq(moved, False, "advance_schedule with a stale expected next_fire")
    expect_eq(await s.advance_schedule("gone", T0, T0 + 70, T0 + 50), False, "unknown id")
    expect(await s.advance_schedule("early", T0 + 10, T0 + 70, T0 + 50), "advance refused")
    got = await s.get_schedule("early")
    expect_eq((got.next_fire, got.last_run_id), (T0 + 70, None), "advance without a run")


@check(requires=("keeps_schedules", "scoped"))
async def check_schedules_respect_namespaces(factory: StoreFactory) -> None:
    """Each namespace (``scoped``) has its own schedules: one id in two namespaces is two
    rows, and no call of one namespace's view reads, advances or deletes another's."""
    s: Any = await make_store(factory)
    a, b = s.scoped("ns-a"), s.scoped("ns-b")
    await a.put_schedule(_rec("same", next_fire=T0))
    await b.put_schedule(_rec("same", next_fire=T0 + 5, input="b"))
    expect_eq(await s.list_schedules(), [], "an unscoped view sees no namespace's schedules")
    expect_eq([r.input for r in await b.list_schedules()], ["b"], "the other namespace's rows")
    expect_eq(await b.advance_schedule("same", T0, T0 + 60, T0), False, "cross-namespace CAS")
    expect_eq([r.id for r in await b.due_schedules(T0 + 1, 10)], [], "cross-namespace due")
    expect_eq(await b.next_schedule_after(T0), T0 + 5, "next_schedule_after of a namespace")
    expect(await b.delete_schedule("same"), "delete in its own namespace")
    got = await a.get_schedule("same")
    expect(got is not None and got.next_fire == T0, "a delete reached another namespace")


@check(kind="pair", requires=("keeps_schedules",))
async def check_competing_schedule_advances(factory: PairFactory) -> None:
    """Two instances advancing one schedule from the same ``next_fire`` at once: exactly one
    wins, and the row holds the winner's ``next_fire`` and ``last_run_id``."""
    s1, s2 = await make_pair(factory)
    s1a: Any = s1
    await s1a.put_schedule(_rec("race", next_fire=T0))
    for i in range(6):
        t = T0 + 60 * i
        a: Any = s1 if i % 2 else s2
        b: Any = s2 if i % 2 else s1
        won = await asyncio.gather(
            a.advance_schedule("race", t, t + 60, t, f"a{i}"),
            b.advance_schedule("race", t, t + 60, t, f"b{i}"),
        )
        expect_eq(sorted(won), [False, True], f"racing advances of tick {i}")
        row = await s1a.get_schedule("race")
        winner = f"a{i}" if won[0] else f"b{i}"
        expect_eq((row.next_fire, row.last_run_id), (t + 60, winner), "the winner's row")


__all__ = [
    "check_competing_schedule_advances",
    "check_due_schedules",
    "check_schedule_rows",
    "check_schedules_respect_namespaces",
]
