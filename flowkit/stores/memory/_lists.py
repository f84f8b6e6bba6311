"""``MemoryStore``'s listing and retention, apart from its write paths: the reference
semantics of ``list_runs(search=..., after=..., limit=...)`` and ``prune_runs``
(``flowkit.stores.base``), written plainly (a scan: it is the store for tests and demos)."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable, Sequence

from ..._core.run import Run, RunStatus
from ..._core.search_terms import Term, matches


def listed(
    runs: Iterable[Run],
    *,
    workflow: str | None,
    status: RunStatus | None,
    tag: str | None,
    limit: int | None,
    parent_id: str | None,
    search: Sequence[Term],
    after: tuple[float, str] | None,
) -> list[Run]:
    """The runs ``list_runs`` returns, oldest ``(created_at, id)`` first, without payloads."""
    found = (
        r
        for r in runs
        if (workflow is None or r.workflow == workflow)
        and (status is None or r.status == status)
        and (tag is None or tag in r.tags)
        and (parent_id is None or r.parent_id == parent_id)
        and (after is None or (r.created_at, r.id) > after)
        and (not search or matches(r.search, search))
    )
    key = _order
    out = sorted(found, key=key) if limit is None else heapq.nsmallest(limit, found, key=key)
    return [dataclasses.replace(r, input=None, output=None, error=None) for r in out]


def _order(r: Run) -> tuple[float, str]:
    return (r.created_at, r.id)


def prunable(
    runs: Iterable[Run],
    get: Callable[[str], Run | None],
    *,
    settled_before: float,
    workflow: str | None,
    status: RunStatus | None,
    limit: int,
) -> list[str]:
    """The ids ``prune_runs`` deletes: terminal runs settled before ``settled_before`` (of
    ``workflow``/``status``), none whose parent is active, oldest settlement first."""
    found = (
        r
        for r in runs
        if r.status.terminal
        and r.updated_at < settled_before
        and (workflow is None or r.workflow == workflow)
        and (status is None or r.status == status)
        and not _parent_active(r, get)
    )
    return [r.id for r in heapq.nsmallest(limit, found, key=lambda r: (r.updated_at, r.id))]


def _parent_active(run: Run, get: Callable[[str], Run | None]) -> bool:
    if run.parent_id is None:
        return False
    parent = get(run.parent_id)
    return parent is not None and parent.status.active


__all__ = ["listed", "prunable"]
