"""Checks of search attributes and retention (docs/search-and-retention.md): ``Run.search`` kept by
``create_run`` and changed by ``commit`` (``Update.search``, or merged from the
``search_upserted`` events it appends), ``list_runs(search=..., after=..., limit=...)``
without payloads, and ``prune_runs``."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

from flowkit.events import RunCompleted, SearchUpserted, StepCompleted
from flowkit.stores.base import Update, parse_filter

from ._registry import check
from ._support import T0, S, StoreFactory, expect, expect_eq, make_store, mk, put


@check()
async def check_search_attributes_filter_and_page(factory: StoreFactory) -> None:
    """``create_run`` keeps ``Run.search``; a commit with ``search_upserted`` events merges
    them into it, one with ``Update.search`` replaces it; ``list_runs(search=terms)`` keeps
    the runs passing every term (no attribute: no match; ``True`` is not ``1``), pages with
    ``after=(created_at, id)`` and ``limit``, and lists runs without payloads."""
    s = await make_store(factory)
    await put(s, dataclasses.replace(mk("a", t=T0), search={"c": "x", "n": 1}))
    await put(s, dataclasses.replace(mk("b", t=T0 + 1), search={"c": "y", "n": 2, "f": True}))
    await put(s, dataclasses.replace(mk("c", t=T0 + 1), search={"n": 1.5, "f": 1}))
    await put(s, mk("d", t=T0 + 2))
    got = await s.get_run("a")
    expect(got is not None and got.search == {"c": "x", "n": 1}, "create_run keeps search")
    up = SearchUpserted(pos="1", attrs={"c": "z", "m": "new"}, at=T0 + 3)
    res = await s.commit("a", None, T0 + 3, Update(events=[up]))
    expect_eq(res.run.search, {"c": "z", "n": 1, "m": "new"}, "search after an upsert commit")
    res = await s.commit("d", None, T0 + 3, Update(search={"c": "x"}))
    expect_eq(res.run.search, {"c": "x"}, "search after a commit with Update.search")

    async def ids(**spec: object) -> list[str]:
        return [r.id for r in await s.list_runs(search=parse_filter(spec))]

    expect_eq(await ids(c="x"), ["d"], "search c == 'x'")
    expect_eq(await ids(c=("!=", "x")), ["a", "b"], "search c != 'x'")
    expect_eq(await ids(n=(">", 1)), ["b", "c"], "search n > 1")
    expect_eq(await ids(n=("<=", 1.5)), ["a", "c"], "search n <= 1.5")
    expect_eq(await ids(n=("in", [2, 1])), ["a", "b"], "search n in [2, 1]")
    expect_eq(await ids(f=True), ["b"], "search f == True (a bool is not 1)")
    expect_eq(await ids(f=1), ["c"], "search f == 1")
    expect_eq(await ids(c=("<", "z"), n=2), ["b"], "two terms")
    expect_eq(await ids(m=("in", [])), [], "an empty in")
    everything = await s.list_runs()
    expect(
        all(r.input is None and r.output is None and r.error is None for r in everything),
        "list_runs rows carry no payloads (input, output, error are None)",
    )
    expect_eq(everything[0].search, {"c": "z", "n": 1, "m": "new"}, "listed search")
    page = await s.list_runs(limit=2, after=(T0, "a"))
    expect_eq([r.id for r in page], ["b", "c"], "list_runs(after=(T0, 'a'), limit=2)")
    page = await s.list_runs(after=(T0 + 1, "c"))
    expect_eq([r.id for r in page], ["d"], "list_runs(after=(T0 + 1, 'c'))")


@check(requires=["prune_runs"])
async def check_prune_runs(factory: StoreFactory) -> None:
    """``prune_runs`` deletes at most ``limit`` terminal runs settled before the instant
    (of the workflow and status asked), oldest settlement first, with their histories;
    never an active run nor the child of an active parent."""
    s = cast(Any, await make_store(factory))  # (``PrunesRuns``: an optional method)
    done = [RunCompleted(output=1, at=T0 + 1)]
    for rid, t, status in (
        ("old1", T0 + 1, S.COMPLETED),
        ("old2", T0 + 2, S.FAILED),
        ("old3", T0 + 3, S.CANCELLED),
        ("new", T0 + 50, S.COMPLETED),
        ("live", T0 + 1, S.SUSPENDED),
    ):
        await put(s, mk(rid, t=t, status=status))
    await put(s, dataclasses.replace(mk("kid", t=T0 + 1, status=S.DEAD), parent_id="live"))
    await put(s, dataclasses.replace(mk("orphan", t=T0 + 1, status=S.DEAD), parent_id="gone"))
    await s.commit("old1", None, T0 + 1, Update(events=done, ignore_lease=True))
    expect_eq(await s.prune_runs(T0 + 10, status=S.FAILED), 1, "prune_runs(status=failed) count")
    expect(await s.get_run("old2") is None, "prune_runs deletes the failed run")
    expect_eq(await s.prune_runs(T0 + 10, workflow="other"), 0, "prune_runs of another workflow")
    expect_eq(await s.prune_runs(T0 + 10, limit=1), 1, "prune_runs(limit=1) count")
    expect_eq(await s.get_run("old1"), None, "the oldest settlement goes first")
    expect_eq(await s.prune_runs(T0 + 10), 2, "prune_runs count (old3, orphan)")
    left = sorted(r.id for r in await s.list_runs())
    expect_eq(left, ["kid", "live", "new"], "runs left: active, child of active, recent")
    stray = StepCompleted(pos="1", name="x", result=1, at=T0 + 60)
    await s.commit("live", None, T0 + 60, Update(events=[stray], status=S.COMPLETED))
    expect_eq(await s.prune_runs(T0 + 100), 3, "prune_runs once the parent settled")
    expect_eq(await s.list_runs(), [], "no run left")
