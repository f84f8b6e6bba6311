"""Checks of the dashboard's reads (``BrowsesRuns``: ``browse_runs``, ``count_runs``,
``lanes``, ``lane``) against ``list_runs`` and the singleton gate, of ``PagesEvents``
(``events_page``) against ``load_events``, and of ``ChangeStamp``
(a write through a second store object on the same data changes the stamp)."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from flowkit._core.search_terms import SearchValue
from flowkit.errors import RunNotFoundError
from flowkit.events import RunCompleted, StepCompleted
from flowkit.stores._capabilities import takes
from flowkit.stores.base import Update, parse_filter
from flowkit.stores.memory._browse import cut_page

from ._registry import check
from ._support import (
    T0,
    ConformanceError,
    PairFactory,
    S,
    StoreFactory,
    expect,
    expect_eq,
    make_pair,
    make_store,
    mk,
    put,
    tag_of,
)


async def _seed(s: Any) -> None:
    """Ten runs, several sharing a ``created_at`` (ties go by id, code points: ``B`` < ``a``)."""
    specs: list[tuple[str, float, str, S, tuple[str, ...], dict[str, SearchValue]]] = [
        ("a", T0, "wf", S.COMPLETED, ("x",), {"n": 1}),
        ("B", T0, "wf", S.FAILED, (), {"n": 2}),
        ("c", T0, "wf2", S.COMPLETED, ("x",), {}),
        ("d", T0 + 1, "wf", S.PENDING, (), {"n": 3}),
        ("e", T0 + 1, "wf2", S.SUSPENDED, ("x",), {"n": 1}),
        ("f", T0 + 2, "wf", S.COMPLETED, (), {}),
        ("g", T0 + 2, "wf", S.COMPLETED, ("x",), {"n": 5}),
        ("h", T0 + 2, "wf2", S.CANCELLING, (), {}),
        ("i", T0 + 3, "wf", S.DEAD, ("x",), {}),
        ("j", T0 + 3, "wf", S.RUNNING, (), {"n": 2}),
    ]
    for rid, t, wf, status, tags, search in specs:
        await put(
            s, dataclasses.replace(mk(rid, t=t, wf=wf, status=status, tags=tags), search=search)
        )


_FILTERS: list[dict[str, Any]] = [
    {},
    {"workflow": "wf"},
    {"status": S.COMPLETED},
    {"workflow": "wf", "status": S.COMPLETED},
    {"tag": "x"},
    {"search": parse_filter({"n": (">=", 2)})},
    {"workflow": "wf2", "tag": "x"},
]


@check(requires=["browse_runs"])
async def check_browse_runs_newest_first(factory: StoreFactory) -> None:
    """``browse_runs`` lists what ``list_runs`` lists with the same filters, newest
    ``(created_at, id)`` first (ties by the id's code points), without payloads; keyset
    pages (``before`` the last row's ``(created_at, id)``) of any size join up to the whole
    list, across runs sharing a ``created_at``."""
    s = cast(Any, await make_store(factory))
    await _seed(s)
    for spec in _FILTERS:
        listed = await s.list_runs(**spec)
        want = [r.id for r in sorted(listed, key=lambda r: (r.created_at, r.id), reverse=True)]
        args = {"workflow": None, "status": None, "tag": None, "search": ()} | spec
        got = await s.browse_runs(**args, before=None, limit=100)
        expect_eq([r.id for r in got], want, f"browse_runs({spec})")
        expect(
            all(r.input is None and r.output is None and r.error is None for r in got),
            "browse_runs rows carry no payloads (input, output, error are None)",
        )
        expect_eq(
            got,
            sorted(listed, key=lambda r: (r.created_at, r.id), reverse=True),
            f"browse_runs({spec}) rows equal list_runs' rows",
        )
        for size in (1, 2, 3):
            paged: list[str] = []
            before = None
            while True:
                page = await s.browse_runs(**args, before=before, limit=size)
                expect(len(page) <= size, f"browse_runs(limit={size}) returned {len(page)}")
                paged += [r.id for r in page]
                if len(page) < size:
                    break
                before = (page[-1].created_at, page[-1].id)
            expect_eq(paged, want, f"browse_runs({spec}) in pages of {size}")
    expect_eq(
        [
            r.id
            for r in await s.browse_runs(
                workflow=None, status=None, tag=None, search=(), before=(T0 + 2, "g"), limit=3
            )
        ],
        ["f", "e", "d"],
        "browse_runs(before=(T0 + 2, 'g'), limit=3)",
    )
    if getattr(s, "scoped", None) is not None:
        other = s.scoped("browse-other")
        await put(other, mk("zz", t=T0 + 9, namespace="browse-other"))
        got = await other.browse_runs(
            workflow=None, status=None, tag=None, search=(), before=None, limit=50
        )
        expect_eq([r.id for r in got], ["zz"], "a scoped store browses its namespace only")
        mine = await s.scoped("browse-empty").browse_runs(
            workflow=None, status=None, tag=None, search=(), before=None, limit=50
        )
        expect_eq(mine, [], "an empty namespace browses nothing")


@check(requires=["browse_runs"])
async def check_count_runs_matches_list_runs(factory: StoreFactory) -> None:
    """``count_runs`` counts per status what ``list_runs`` lists with the same workflow,
    tag and search filters (a status none has: absent or zero); with ``limit`` (when it
    takes one), a count above it is ``limit + 1``."""
    s = cast(Any, await make_store(factory))
    await _seed(s)
    for spec in _FILTERS:
        if "status" in spec:
            continue
        want = dict.fromkeys(S, 0)
        for r in await s.list_runs(**spec):
            want[r.status] += 1
        args = {"workflow": None, "tag": None, "search": ()} | spec
        counted = await s.count_runs(**args)
        expect_eq({st: counted.get(st, 0) for st in S}, want, f"count_runs({spec})")
        if takes(s.count_runs, "limit"):  # (optional: bounded counts, more is limit + 1)
            for limit in (0, 1):
                got = await s.count_runs(**args, limit=limit)
                capped = {st: min(n, limit + 1) for st, n in want.items()}
                expect_eq({st: got.get(st, 0) for st in S}, capped, f"count_runs(limit={limit})")
    if getattr(s, "scoped", None) is not None:
        scoped = s.scoped("count-other")
        await put(scoped, mk("zz", t=T0 + 9, namespace="count-other"))
        counted = await scoped.count_runs(workflow=None, tag=None, search=())
        expect_eq(sum(counted.values()), 1, "a scoped store counts its namespace only")


async def _settle(s: Any, run_id: str, now: float) -> None:
    await s.commit(run_id, None, now, Update(events=[RunCompleted(at=now)], status=S.COMPLETED))


@check(requires=["browse_runs", "try_admit_singleton"])
async def check_lanes_follow_the_gate(factory: StoreFactory) -> None:
    """``lanes`` sums every lane with active runs (holders, waiters, the oldest waiter's
    ``created_at``; the longest queue first, then workflow and key); ``lane`` lists its
    holders, then its waiters in the order the singleton gate admits them (FIFO by
    ``(created_at, id)``, ties by the id's code points): as each holder settles, the head of
    the listed queue, and no other waiter, is admitted."""
    s = cast(Any, await make_store(factory))
    tag = tag_of("k")
    for rid, t in (("q3", T0 + 2), ("q1", T0 + 1), ("Q1", T0 + 1), ("q0", T0), ("q2", T0 + 1)):
        await put(s, mk(rid, key="k", t=t))
    await put(s, mk("solo", key="k2", t=T0 + 5))
    await put(s, mk("other", key="k", wf="wf2", t=T0 + 6))
    await put(s, mk("done", key="k", t=T0 - 1, status=S.COMPLETED))
    await put(s, mk("plain", t=T0 - 1))
    expect(await s.try_admit_singleton("solo", tag_of("k2"), "wf", 1, T0 + 10), "solo admitted")
    summary = await s.lanes(limit=10)
    expect_eq(
        [(x.workflow, x.key, x.holders, x.waiting, x.oldest_waiting_since) for x in summary],
        [("wf", "k", 0, 5, T0), ("wf2", "k", 0, 1, T0 + 6), ("wf", "k2", 1, 0, None)],
        "lanes()",
    )
    expect_eq(len(await s.lanes(limit=1)), 1, "lanes(limit=1)")
    now = T0 + 10
    admitted: list[str] = []
    while True:
        got = await s.lane("wf", "k", limit=100)
        expect_eq([r.id for r in got.holders], admitted[-1:], "lane holders")
        expect_eq(got.waiting, len(got.waiters), "lane waiting count")
        expect(
            all(r.input is None and r.output is None for r in got.holders + got.waiters),
            "lane rows carry no payloads",
        )
        if not got.waiters:
            break
        if admitted:
            await _settle(s, admitted[-1], now)
        for later in got.waiters[1:]:
            expect(
                not await s.try_admit_singleton(later.id, tag, "wf", 1, now),
                f"the gate admitted {later.id!r} ahead of the lane's head {got.waiters[0].id!r}",
            )
        head = got.waiters[0].id
        expect(await s.try_admit_singleton(head, tag, "wf", 1, now), f"lane head {head!r} denied")
        admitted.append(head)
        now += 1
    expect_eq(admitted, ["q0", "Q1", "q1", "q2", "q3"], "the order lane() listed the waiters in")
    cut = await s.lane("wf", "k", limit=0)
    expect_eq((cut.waiters, cut.waiting), ([], 0), "lane(limit=0) of a drained lane")


@check(requires=["events_page"])
async def check_events_page_cuts_the_history(factory: StoreFactory) -> None:
    """``events_page`` answers what cutting the whole history (``load_events``) answers: the
    newest page, ``before`` and ``after`` pages, a page longer than what is left, a type
    filter, with the count and the first and last ``seq``; ``RunNotFoundError`` for an
    unknown run."""
    s = cast(Any, await make_store(factory))
    await put(s, mk("p", t=T0))
    steps = [StepCompleted(pos=str(i), name="s", result=i, at=T0 + i) for i in range(1, 12)]
    await s.commit("p", None, T0 + 12, Update(events=steps, ignore_lease=True))
    history = await s.load_events("p")
    expect_eq(len(history), 12, "the history's length")
    cases: list[dict[str, Any]] = [
        {"limit": 5},
        {"limit": 50},
        {"before": 4, "limit": 2},
        {"before": 4, "limit": 10},
        {"after": 0, "limit": 3},
        {"after": 10, "limit": 5},
        {"after": 12, "limit": 5},
        {"limit": 0},
        {"types": ["run_started"], "limit": 5},
        {"types": ["step_completed"], "after": 3, "limit": 2},
        {"types": ["compensation_failed"], "limit": 1},
    ]
    for kw in cases:
        page = await s.events_page("p", **kw)
        want = cut_page(
            history, kw.get("after"), kw.get("before"), kw["limit"], kw.get("types", ())
        )
        expect_eq(
            [(e.seq, e.type) for e in page.events],
            [(e.seq, e.type) for e in want.events],
            f"events_page({kw}) events",
        )
        expect_eq(
            (page.count, page.first_seq, page.last_seq),
            (want.count, want.first_seq, want.last_seq),
            f"events_page({kw}) count and bounds",
        )
    try:
        await s.events_page("nope")
    except RunNotFoundError:
        pass
    else:
        raise ConformanceError("events_page of an unknown run did not raise RunNotFoundError")


@check(kind="pair", requires=["change_stamp"])
async def check_change_stamp_sees_other_writers(factory: PairFactory) -> None:
    """``change_stamp`` changes after each write by a second store object on the same data
    (a run created, a step recorded, a status changed), and after this object's own."""
    a, b = await make_pair(factory)
    sa_, sb = cast(Any, a), cast(Any, b)
    stamp = await sa_.change_stamp()

    async def changed(what: str) -> None:
        nonlocal stamp
        now = await sa_.change_stamp()
        expect(now != stamp, f"change_stamp did not change after {what}")
        stamp = now

    await put(b, mk("r1", t=T0))
    await changed("another store object created a run")
    step = StepCompleted(pos="0", name="s", result=1, at=T0 + 1)
    await b.commit("r1", None, T0 + 1, Update(events=[step], ignore_lease=True))
    await changed("another store object recorded a step")
    await _settle(b, "r1", T0 + 2)
    await changed("another store object settled a run")
    await put(a, mk("r2", t=T0 + 3))
    await changed("this store object created a run")
    if callable(getattr(b, "prune_runs", None)):
        expect_eq(await sb.prune_runs(T0 + 100), 1, "prune_runs count")
        await changed("another store object deleted a run")
