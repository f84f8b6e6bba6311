"""Search attributes (docs/search-and-retention.md): checking the values a run is started with, and
``Engine.list_runs``'s filters and paging, pushed down to the store (the terms' meaning:
``flowkit._core.search_terms``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._core.run import Run, RunStatus
from .._core.search_terms import SearchValue, check_attrs, parse_filter
from ..errors import InvalidInputError, UnsupportedStoreError
from ..stores.base import lists_by_search

if TYPE_CHECKING:
    from .engine import Engine


def start_attrs(search: Mapping[str, Any] | None, workflow: str) -> dict[str, SearchValue]:
    """``engine.start(search=...)``: the run's first search attributes (``InvalidInputError``,
    nothing written, for a bad name or value)."""
    return {} if search is None else check_attrs(search, workflow)


async def list_runs(
    engine: Engine,
    workflow: str | None,
    status: RunStatus | None,
    tag: str | None,
    search: Mapping[str, Any] | None,
    limit: int | None,
    after: Run | None,
    parent_id: str | None,
) -> list[Run]:
    """``Engine.list_runs``: one store query (``Store.list_runs``); the runs carry no
    payloads (``engine.get_run`` has them)."""
    terms = parse_filter(search)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidInputError(None, f"limit must be an int >= 0, got {limit!r:.80}")
    if after is not None and not isinstance(after, Run):
        raise InvalidInputError(None, f"after must be the last Run of a page, got {after!r:.80}")
    store = engine.store
    more: dict[str, Any] = {}
    if parent_id is not None:
        more["parent_id"] = parent_id
    if terms or after is not None:
        if not lists_by_search(store):
            raise UnsupportedStoreError(
                f"{type(store).__name__}.list_runs takes no search or after: a custom store"
                " must add them (docs/stores.md, 'Writing a custom store')"
            )
        if terms:
            more["search"] = terms
        if after is not None:
            more["after"] = (after.created_at, after.id)
    found: list[Run] = await store.list_runs(
        workflow=workflow, status=status, tag=tag, limit=limit, **more
    )
    return found


__all__ = ["list_runs", "start_attrs"]
