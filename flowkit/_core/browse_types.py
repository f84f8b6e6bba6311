"""The dashboard's lane shapes (``flowkit._client.browse``), apart so that a store answering its
reads (``flowkit.stores._capabilities.BrowsesRuns``) can build them without importing the
client layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .run import Run, RunStatus

if TYPE_CHECKING:  # (a layer above this one: for the annotations only)
    from ..events import Event


@dataclass(frozen=True)
class LaneSummary:
    """One singleton lane (a workflow's key) with active runs: how many hold a slot, how many
    wait, and since when the oldest waiter waits (its ``created_at``; ``None``: no waiter)."""

    workflow: str
    key: str
    holders: int
    waiting: int
    oldest_waiting_since: float | None


@dataclass(frozen=True)
class Lane:
    """A lane in full: its holders, then its waiters in FIFO ``(created_at, id)`` order (a
    waiter's position is its index + 1), all without payloads. ``waiting`` counts every
    waiter even when ``waiters`` is cut at a limit."""

    workflow: str
    key: str
    holders: list[Run]
    waiters: list[Run]
    waiting: int


def capped(counts: dict[RunStatus, int], limit: int) -> dict[RunStatus, int]:
    """``counts`` as ``count_runs(limit=...)`` answers them: a count above ``limit`` is
    ``limit + 1`` (read: more than ``limit``)."""
    top = max(limit, 0) + 1
    return {s: min(n, top) for s, n in counts.items()}


@dataclass(frozen=True)
class EventPage:
    """A page of a run's history (``flowkit._client.browse.page_events``): ``events`` in ``seq``
    order, and of the run's events of the types asked for (all types: every event) how many
    there are and the first and last ``seq`` (``None``: none), so a page knows whether events
    come before or after it."""

    events: list[Event]
    count: int
    first_seq: int | None
    last_seq: int | None


__all__ = ["EventPage", "Lane", "LaneSummary", "capped"]
