"""``MemoryStore``'s answers to the dashboard's reads (``BrowsesRuns``) and its change stamp
(``ChangeStamp``), apart from its write paths: the reference semantics, written plainly (a
scan of the runs, or of the active ones for the lanes)."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Sequence
from typing import Any

from ..._core.browse_types import EventPage, Lane, LaneSummary, capped
from ..._core.run import Run, RunStatus
from ..._core.search_terms import Term, matches
from ...events import Event


def _bare(run: Run) -> Run:
    return dataclasses.replace(run, input=None, output=None, error=None)


def _order(r: Run) -> tuple[float, str]:
    return (r.created_at, r.id)


class MemoryBrowse:
    """Mixed into ``MemoryStore`` (which supplies ``_visible_runs``, ``_active_runs``,
    ``_version``, ``_get`` and ``_d``)."""

    def _visible_runs(self) -> Iterable[Run]:
        raise NotImplementedError

    def _active_runs(self) -> Iterable[Run]:
        raise NotImplementedError

    def _version(self) -> int:
        raise NotImplementedError

    def _get(self, run_id: str) -> Run:
        raise NotImplementedError

    _d: Any  # (MemoryStore's data: ``events`` maps a run id to its history)

    def _history_of(self, run_id: str) -> Sequence[Event]:
        found: Sequence[Event] = self._d.events.get(run_id, ())
        return found

    def _filtered(
        self, workflow: str | None, tag: str | None, search: Sequence[Term]
    ) -> Iterable[Run]:
        return (
            r
            for r in self._visible_runs()
            if (workflow is None or r.workflow == workflow)
            and (tag is None or tag in r.tags)
            and (not search or matches(r.search, search))
        )

    async def browse_runs(
        self,
        *,
        workflow: str | None = None,
        status: RunStatus | None = None,
        tag: str | None = None,
        search: Sequence[Term] = (),
        before: tuple[float, str] | None = None,
        limit: int = 50,
    ) -> list[Run]:
        """``BrowsesRuns.browse_runs``."""
        found = (
            r
            for r in self._filtered(workflow, tag, search)
            if (status is None or r.status == status)
            and (before is None or (r.created_at, r.id) < before)
        )
        return [_bare(r) for r in heapq.nlargest(max(limit, 0), found, key=_order)]

    async def count_runs(
        self,
        *,
        workflow: str | None = None,
        tag: str | None = None,
        search: Sequence[Term] = (),
        limit: int | None = None,
    ) -> dict[RunStatus, int]:
        """``BrowsesRuns.count_runs``."""
        counts = dict.fromkeys(RunStatus, 0)
        for r in self._filtered(workflow, tag, search):
            counts[r.status] += 1
        return counts if limit is None else capped(counts, limit)

    async def lanes(self, *, limit: int = 500) -> list[LaneSummary]:
        """``BrowsesRuns.lanes``."""
        by_key: dict[tuple[str, str], list[Any]] = {}
        for r in self._active_runs():
            if r.singleton_key is None:
                continue
            acc = by_key.setdefault((r.workflow, r.singleton_key), [0, 0, None])
            if r.admitted:
                acc[0] += 1
            else:
                acc[1] += 1
                acc[2] = r.created_at if acc[2] is None else min(acc[2], r.created_at)
        out = [LaneSummary(wf, key, h, w, oldest) for (wf, key), (h, w, oldest) in by_key.items()]
        out.sort(key=lambda s: (-s.waiting, s.workflow, s.key))
        return out[: max(limit, 0)]

    async def lane(self, workflow: str, key: str, *, limit: int = 200) -> Lane:
        """``BrowsesRuns.lane``."""
        members = sorted(
            (r for r in self._active_runs() if r.workflow == workflow and r.singleton_key == key),
            key=_order,
        )
        holders = [_bare(r) for r in members if r.admitted]
        waiters = [r for r in members if not r.admitted]
        return Lane(
            workflow, key, holders, [_bare(r) for r in waiters[: max(limit, 0)]], len(waiters)
        )

    async def events_page(
        self,
        run_id: str,
        *,
        after: int | None = None,
        before: int | None = None,
        limit: int = 100,
        types: Sequence[str] = (),
    ) -> EventPage:
        """``PagesEvents.events_page``."""
        self._get(run_id)  # (RunNotFoundError)
        return cut_page(self._history_of(run_id), after, before, limit, types)

    async def change_stamp(self) -> object:
        """``ChangeStamp.change_stamp``: the data's write counter (shared by every scoped
        view of it)."""
        return self._version()


def cut_page(
    history: Sequence[Event],
    after: int | None,
    before: int | None,
    limit: int,
    types: Sequence[str] = (),
) -> EventPage:
    """``PagesEvents.events_page`` of a whole history (``history``, in ``seq`` order)."""
    kept = [e for e in history if not types or e.type in types]
    n = max(limit, 0)
    if after is not None:
        page = [e for e in kept if e.seq > after][:n]
    else:
        below = [e for e in kept if before is None or e.seq < before]
        page = below[max(len(below) - n, 0) :] if n else []
    return EventPage(page, len(kept), kept[0].seq if kept else None, kept[-1].seq if kept else None)


__all__ = ["MemoryBrowse", "cut_page"]
