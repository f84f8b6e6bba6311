"""Search attributes (DESIGN §11): checking the values a run is started or upserted with,
and ``Engine.list_runs``'s filters and paging, pushed down to the store."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._run import Run, RunStatus

if TYPE_CHECKING:
    from ._engine import Engine


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
    """``Engine.list_runs``."""
    if search is not None or after is not None:
        raise NotImplementedError("list_runs(search=..., after=...) (issue #22)")
    store = engine.store
    if parent_id is None:
        return await store.list_runs(workflow=workflow, status=status, tag=tag, limit=limit)
    return await store.list_runs(
        workflow=workflow, status=status, tag=tag, limit=limit, parent_id=parent_id
    )


__all__ = ["list_runs"]
