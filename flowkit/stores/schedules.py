"""The optional store capability ``keeps_schedules`` (docs/schedules.md, durable schedules): the
rows of ``engine.schedules``, each with the instant of its next tick, advanced by
compare-and-set so that however many workers fire a schedule each tick is taken once.

``MemoryStore`` and ``SqlStore`` have it; ``CodecStore`` forwards it (encoding the input)
when the store it wraps has it. ``flowkit_testing.conformance`` checks it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ScheduleRecord:
    """A durable schedule as its store keeps it (and ``engine.schedules.list()`` shows it).

    The timetable is ``cron`` in ``timezone`` or ``every`` seconds (one of the two);
    ``workflow`` is a workflow name, ``input`` its stored (JSON) input. ``next_fire`` is the
    epoch instant of the next tick to start (still the same while ``paused``);
    ``last_run_id`` the run the last tick started (``overlap="skip"`` looks at it)."""

    id: str
    workflow: str
    next_fire: float
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    input: Any = None
    overlap: str = "skip"
    catchup_window: float = 0.0
    paused: bool = False
    last_run_id: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0

    def same_timetable(self, other: ScheduleRecord) -> bool:
        """Whether ``other`` ticks at the same instants (same cron, interval and zone)."""
        return (self.cron, self.every, self.timezone) == (other.cron, other.every, other.timezone)


class KeepsSchedules(Protocol):
    """The optional capability ``keeps_schedules``: the schedules of this store's namespace,
    by id. Every method acts on one row atomically."""

    keeps_schedules: bool

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        """Insert ``record``, or replace the row of its id. A row with the same timetable
        (``ScheduleRecord.same_timetable``) keeps its ``next_fire``, ``paused``,
        ``last_run_id`` and ``created_at``; all else comes from ``record``. Returns the row."""
        ...

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None: ...

    async def list_schedules(self) -> list[ScheduleRecord]:
        """Every schedule of the namespace, by id."""
        ...

    async def delete_schedule(self, schedule_id: str) -> bool:
        """Delete the row; whether there was one."""
        ...

    async def set_schedule_paused(
        self, schedule_id: str, paused: bool, now: float, next_fire: float | None = None
    ) -> ScheduleRecord | None:
        """Set ``paused`` (and ``next_fire`` when given); the row, ``None`` when none."""
        ...

    async def advance_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        new_next: float,
        now: float,
        last_run_id: str | None = None,
    ) -> bool:
        """Compare-and-set: move ``next_fire`` from ``expected_next`` to ``new_next`` (and
        ``last_run_id`` when given); ``False``, writing nothing, when the row is gone or its
        ``next_fire`` is no longer ``expected_next`` (another worker advanced it)."""
        ...

    async def due_schedules(
        self, now: float, limit: int, workflows: Sequence[str] | None = None
    ) -> list[ScheduleRecord]:
        """Up to ``limit`` schedules not paused whose ``next_fire <= now``, earliest first;
        with ``workflows``, only those of these workflow names (in the query, by index: a
        worker must not be handed, batch after batch, the due schedules of workflows it does
        not run, which nobody advances while their workers are down, in place of its own)."""
        ...

    async def next_schedule_after(
        self, now: float, workflows: Sequence[str] | None = None
    ) -> float | None:
        """The earliest ``next_fire`` after ``now`` of the schedules not paused (with
        ``workflows``, of those of these workflow names)."""
        ...


def keeps_schedules(store: Any) -> bool:
    """Whether ``store`` keeps durable schedules (``KeepsSchedules``)."""
    return bool(getattr(store, "keeps_schedules", False))


def merged(old: ScheduleRecord | None, new: ScheduleRecord) -> ScheduleRecord:
    """What ``put_schedule`` stores over ``old`` (the rule every store applies)."""
    if old is None or not old.same_timetable(new):
        return new
    return ScheduleRecord(
        **{
            **new.__dict__,
            "next_fire": old.next_fire,
            "paused": old.paused,
            "last_run_id": old.last_run_id,
            "created_at": old.created_at,
        }
    )


__all__ = ["KeepsSchedules", "ScheduleRecord", "keeps_schedules", "merged"]
