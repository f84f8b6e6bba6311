"""``CodecStore``'s forwarding of the dashboard's reads (``BrowsesRuns``) and of
``ChangeStamp`` to the store it wraps, when that store has them. Listed runs carry no
payloads, so nothing is decoded: they are passed on with their payload fields emptied (an
inner store that returned some would hand out ciphertext)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..._core.browse_types import EventPage, Lane, LaneSummary, capped
from ..._core.run import Run, RunStatus
from ..._core.search_terms import Term
from .._capabilities import browses_runs, changes_stamped, pages_events, takes


def _bare(run: Run) -> Run:
    return dataclasses.replace(run, input=None, output=None, error=None)


def forward_browse(outer: Any, inner: Any) -> None:
    """Give ``outer`` (a ``CodecStore``) the ``BrowsesRuns``, ``PagesEvents`` and
    ``ChangeStamp`` methods ``inner`` has, forwarding to it (a page's events decoded)."""
    if browses_runs(inner):

        async def browse_runs(
            *,
            workflow: str | None = None,
            status: RunStatus | None = None,
            tag: str | None = None,
            search: Sequence[Term] = (),
            before: tuple[float, str] | None = None,
            limit: int = 50,
        ) -> list[Run]:
            found: list[Run] = await inner.browse_runs(
                workflow=workflow, status=status, tag=tag, search=search, before=before, limit=limit
            )
            return [_bare(r) for r in found]

        async def count_runs(
            *,
            workflow: str | None = None,
            tag: str | None = None,
            search: Sequence[Term] = (),
            limit: int | None = None,
        ) -> dict[RunStatus, int]:
            more = {} if limit is None else {"limit": limit}
            if more and not takes(inner.count_runs, "limit"):
                more = {}  # (a store that counts every run: capped here)
            counts: dict[RunStatus, int] = await inner.count_runs(
                workflow=workflow, tag=tag, search=search, **more
            )
            return counts if limit is None else capped(counts, limit)

        async def lanes(*, limit: int = 500) -> list[LaneSummary]:
            found: list[LaneSummary] = await inner.lanes(limit=limit)
            return found

        async def lane(workflow: str, key: str, *, limit: int = 200) -> Lane:
            got: Lane = await inner.lane(workflow, key, limit=limit)
            return dataclasses.replace(
                got,
                holders=[_bare(r) for r in got.holders],
                waiters=[_bare(r) for r in got.waiters],
            )

        outer.browse_runs = browse_runs
        outer.count_runs = count_runs
        outer.lanes = lanes
        outer.lane = lane
    if pages_events(inner):

        async def events_page(
            run_id: str,
            *,
            after: int | None = None,
            before: int | None = None,
            limit: int = 100,
            types: Sequence[str] = (),
        ) -> EventPage:
            got: EventPage = await inner.events_page(
                run_id, after=after, before=before, limit=limit, types=types
            )
            # (a part of ``CodecStore``, in its package: the store's own decoding)
            decoded = [outer._event_out(e, run_id) for e in got.events]  # noqa: SLF001
            return dataclasses.replace(got, events=decoded)

        outer.events_page = events_page
    if changes_stamped(inner):

        async def change_stamp() -> object:
            return await inner.change_stamp()

        outer.change_stamp = change_stamp


__all__ = ["forward_browse"]
