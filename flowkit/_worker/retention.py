"""Retention (docs/search-and-retention.md): ``Engine.prune`` deletes terminal runs settled long
enough ago, with everything that belongs to them, in short batches (``Store.prune_runs``, one
transaction per ``BATCH`` runs: no long lock); ``Engine(retention=...)`` has the worker do it
periodically, on the engine's clock."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

from .._core.clock import Clock
from .._core.limits import duration
from .._core.run import RunStatus
from ..errors import InvalidInputError, UnsupportedStoreError
from ..stores.base import Store, prunes_runs
from .config import WorkerConfig

log = logging.getLogger("flowkit")

BATCH = 500
"""Runs deleted per transaction."""
MAX_PERIOD = 3600.0
"""The longest pause between two prunes of ``Engine(retention=...)`` (seconds)."""


def check_age(what: str, seconds: Any) -> float:
    """A retention age in seconds (or a ``timedelta``): ``_limits.duration``'s rule."""
    return duration(what, seconds)


async def prune_store(
    store: Any,
    settled_before: float,
    workflow: str | None = None,
    status: RunStatus | None = None,
) -> int:
    """Delete every terminal run settled before ``settled_before``, batch after batch; how
    many. ``UnsupportedStoreError`` for a store without ``prune_runs``."""
    if not prunes_runs(store):
        raise UnsupportedStoreError(f"{type(store).__name__} has no prune_runs (retention)")
    total = 0
    while True:
        n: int = await store.prune_runs(
            settled_before, workflow=workflow, status=status, limit=BATCH
        )
        total += n
        if n == 0:  # (a short batch is no proof: PostgreSQL skips runs a commit holds)
            return total
        await asyncio.sleep(0)  # (other work of the loop between two batches)


class Owner(Protocol):
    """What ``prune`` reads of the ``Engine`` it prunes for."""

    @property
    def store(self) -> Store: ...

    @property
    def clock(self) -> Clock: ...


async def prune(
    engine: Owner,
    older_than: float | timedelta,
    workflow: str | None,
    status: RunStatus | None,
) -> int:
    """``Engine.prune``: terminal runs whose settlement (``updated_at``) is more than
    ``older_than`` seconds before the engine clock's now."""
    age = check_age("older_than", older_than)
    if status is not None and not status.terminal:
        raise InvalidInputError(None, f"prune takes a terminal status, got {status.value!r}")
    return await prune_store(engine.store, engine.clock.now() - age, workflow, status)


def period(retention: float) -> float:
    """How often a worker prunes under ``Engine(retention=...)``."""
    return min(max(retention, 1.0), MAX_PERIOD)


async def retention_loop(config: WorkerConfig, running: Callable[[], bool]) -> None:
    """The worker's periodic prune (``Engine(retention=...)``): at once, then every
    ``period(retention)`` seconds of the engine clock. A failure is logged, never fatal."""
    retention = config.retention
    if retention is None or not prunes_runs(config.store):
        return
    clock = config.clock
    while running():
        try:
            n = await prune_store(config.store, clock.now() - retention)
            if n:
                log.info("retention: pruned %d runs settled over %.0f s ago", n, retention)
        except Exception:
            log.warning("retention: pruning failed; trying again later", exc_info=True)
        await clock.sleep_until(clock.now() + period(retention))


__all__ = ["BATCH", "check_age", "period", "prune", "prune_store", "retention_loop"]
