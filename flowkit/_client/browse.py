"""What an operator browses (the dashboard, ``flowkit ui``; docs/ui.md): runs newest first with
counts per status, every singleton lane with its holders and queue, one lane in FIFO order, a
page of a run's history, and a doorbell that rings after writes. Each read is pushed down to
the store when it has the ``BrowsesRuns`` (``PagesEvents``) capability
(``flowkit.stores._capabilities``); otherwise it falls back to ``Store.list_runs``
(``load_events``): correct, but it reads every run (the whole history): fine for a small store
only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .._core.browse_types import EventPage, Lane, LaneSummary, capped
from .._core.run import Run, RunStatus
from ..errors import UnsupportedStoreError
from ..stores._capabilities import pages_events, takes
from ..stores.base import Store, Term, browses_runs, changes_stamped, lists_by_search
from ..stores.memory._browse import cut_page

__all__ = [
    "COUNT_LIMIT",
    "EventPage",
    "Lane",
    "LaneSummary",
    "browses_runs",
    "count_runs",
    "lane",
    "lanes",
    "page_events",
    "page_runs",
    "watch_changes",
]


COUNT_LIMIT = 10_000
"""How many runs per status the dashboard and ``flowkit runs`` count, at most (more shows as
``10000+``): their counts cost the same however many runs the store holds."""


async def page_runs(
    store: Store,
    *,
    workflow: str | None = None,
    status: RunStatus | None = None,
    tag: str | None = None,
    search: Sequence[Term] = (),
    before: tuple[float, str] | None = None,
    limit: int = 50,
) -> list[Run]:
    """Up to ``limit`` runs, newest ``(created_at, id)`` first, strictly before ``before``
    (keyset paging: pass the last row's ``(created_at, id)``), without payloads."""
    if browses_runs(store):
        found: list[Run] = await store.browse_runs(  # type: ignore[attr-defined]
            workflow=workflow, status=status, tag=tag, search=search, before=before, limit=limit
        )
        return found
    runs = await _all(store, workflow=workflow, status=status, tag=tag, search=search)
    runs.sort(key=lambda r: (r.created_at, r.id), reverse=True)
    if before is not None:
        runs = [r for r in runs if (r.created_at, r.id) < before]
    return runs[:limit]


async def count_runs(
    store: Store,
    *,
    workflow: str | None = None,
    tag: str | None = None,
    search: Sequence[Term] = (),
    limit: int | None = None,
) -> dict[RunStatus, int]:
    """How many runs have each status (every status present, zeros included). With
    ``limit``, a status with more than ``limit`` runs counts ``limit + 1`` (read: more than
    ``limit``), and a store that browses does work bounded by it (not a count of every run)."""
    if browses_runs(store):
        fn: Any = store.count_runs  # type: ignore[attr-defined]
        more = {} if limit is None or not takes(fn, "limit") else {"limit": limit}
        counted: dict[RunStatus, int] = await fn(workflow=workflow, tag=tag, search=search, **more)
        counts = {s: counted.get(s, 0) for s in RunStatus}
    else:
        counts = dict.fromkeys(RunStatus, 0)
        for r in await _all(store, workflow=workflow, status=None, tag=tag, search=search):
            counts[r.status] += 1
    return counts if limit is None else capped(counts, limit)


async def lanes(store: Store, *, limit: int = 500) -> list[LaneSummary]:
    """Every lane with active runs (up to ``limit``), the longest queue first, then by
    workflow and key."""
    if browses_runs(store):
        found: list[LaneSummary] = await store.lanes(limit=limit)  # type: ignore[attr-defined]
        return found
    by_key: dict[tuple[str, str], list[Run]] = {}
    for r in await _all(store, workflow=None, status=None, tag=None, search=()):
        if r.singleton_key is not None and r.status.active:
            by_key.setdefault((r.workflow, r.singleton_key), []).append(r)
    out = []
    for (wf, key), runs in by_key.items():
        waiting = [r for r in runs if not r.admitted]
        out.append(
            LaneSummary(
                wf,
                key,
                holders=len(runs) - len(waiting),
                waiting=len(waiting),
                oldest_waiting_since=min((r.created_at for r in waiting), default=None),
            )
        )
    out.sort(key=lambda s: (-s.waiting, s.workflow, s.key))
    return out[:limit]


async def lane(store: Store, workflow: str, key: str, *, limit: int = 200) -> Lane:
    """The active runs of ``workflow``'s lane ``key``: holders, then up to ``limit`` waiters
    in FIFO order."""
    if browses_runs(store):
        found: Lane = await store.lane(workflow, key, limit=limit)  # type: ignore[attr-defined]
        return found
    runs = await _all(store, workflow=workflow, status=None, tag="singleton:" + key, search=())
    active = [r for r in runs if r.status.active]
    holders = [r for r in active if r.admitted]
    waiters = [r for r in active if not r.admitted]
    return Lane(workflow, key, holders, waiters[:limit], len(waiters))


async def page_events(
    store: Store,
    run_id: str,
    *,
    after: int | None = None,
    before: int | None = None,
    limit: int = 100,
    types: Sequence[str] = (),
) -> EventPage:
    """A page of ``run_id``'s history (``PagesEvents.events_page``): with ``after``, the oldest
    ``limit`` events past that ``seq``; else the newest ``limit`` before ``before`` (or the
    newest of all). A store without ``events_page`` has the whole history loaded and cut."""
    if pages_events(store):
        found: EventPage = await store.events_page(  # type: ignore[attr-defined]
            run_id, after=after, before=before, limit=limit, types=types
        )
        return found
    return cut_page(await store.load_events(run_id), after, before, limit, types)


async def watch_changes(
    store: Store, callback: Callable[[], None], *, interval: float = 1.0
) -> Callable[[], Awaitable[None]]:
    """Call ``callback()`` (on this event loop) soon after writes to the store's runs: at once
    on the store's wake-ups (``Watchable``), and after any other write within about
    ``interval`` seconds, by comparing a cheap change stamp (``store.change_stamp()`` when the
    store has it). One watcher per dashboard, whatever the number of browsers. Returns an
    async function that stops it."""
    stop_watch: Callable[[], None] | None = None
    watch = getattr(store, "watch", None)
    if callable(watch):
        stop_watch = watch(callback)

    async def stamp() -> Any:
        if changes_stamped(store):
            return await store.change_stamp()  # type: ignore[attr-defined]
        runs = await store.list_runs()
        return (len(runs), max((r.updated_at for r in runs), default=0.0))

    async def loop() -> None:
        last: Any = _FAILED
        while True:
            try:
                now = await stamp()
            except Exception:  # (a blip of the database: the next interval tries again)
                log.debug("reading the store's change stamp failed", exc_info=True)
                now = _FAILED
            if now is not _FAILED and last is not _FAILED and now != last:
                callback()
            if now is not _FAILED:
                last = now
            await asyncio.sleep(interval)

    task = asyncio.get_running_loop().create_task(loop())

    async def stop() -> None:
        if stop_watch is not None:
            stop_watch()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    return stop


_FAILED = object()
"""A change stamp that could not be read."""
log = logging.getLogger("flowkit")


async def _all(
    store: Store,
    *,
    workflow: str | None,
    status: RunStatus | None,
    tag: str | None,
    search: Sequence[Term],
) -> list[Run]:
    if search:
        if not lists_by_search(store):
            raise UnsupportedStoreError(f"{type(store).__name__}.list_runs takes no search")
        return await store.list_runs(workflow=workflow, status=status, tag=tag, search=search)
    return await store.list_runs(workflow=workflow, status=status, tag=tag)
