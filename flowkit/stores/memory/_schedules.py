"""``MemoryStore``'s durable schedules (``MemorySchedules``, mixed into it): the reference
implementation of ``flowkit.stores.schedules.KeepsSchedules``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..schedules import ScheduleRecord, merged


class MemorySchedules:
    """Mixed into ``MemoryStore``: rows in ``_schedules`` by ``(namespace, id)``. A store
    without a namespace keeps its schedules under ``None`` (each view its own)."""

    namespace: str | None
    _schedules: dict[tuple[str | None, str], ScheduleRecord]

    keeps_schedules = True
    """It keeps durable schedules (``flowkit.stores.schedules.KeepsSchedules``)."""

    def _mine(self) -> list[ScheduleRecord]:
        return sorted(
            (r for (ns, _), r in self._schedules.items() if ns == self.namespace),
            key=lambda r: r.id,
        )

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        key = (self.namespace, record.id)
        row = merged(self._schedules.get(key), record)
        self._schedules[key] = row
        return row

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        return self._schedules.get((self.namespace, schedule_id))

    async def list_schedules(self) -> list[ScheduleRecord]:
        return self._mine()

    async def delete_schedule(self, schedule_id: str) -> bool:
        return self._schedules.pop((self.namespace, schedule_id), None) is not None

    async def set_schedule_paused(
        self, schedule_id: str, paused: bool, now: float, next_fire: float | None = None
    ) -> ScheduleRecord | None:
        key = (self.namespace, schedule_id)
        row = self._schedules.get(key)
        if row is None:
            return None
        nxt = row.next_fire if next_fire is None else next_fire
        row = dataclasses.replace(row, paused=paused, next_fire=nxt, updated_at=now)
        self._schedules[key] = row
        return row

    async def advance_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        new_next: float,
        now: float,
        last_run_id: str | None = None,
    ) -> bool:
        key = (self.namespace, schedule_id)
        row = self._schedules.get(key)
        if row is None or row.next_fire != expected_next:
            return False
        last = row.last_run_id if last_run_id is None else last_run_id
        self._schedules[key] = dataclasses.replace(
            row, next_fire=new_next, last_run_id=last, updated_at=now
        )
        return True

    def _live(self, workflows: Sequence[str] | None) -> list[ScheduleRecord]:
        """The schedules not paused (of ``workflows`` when given)."""
        names = None if workflows is None else set(workflows)
        return [r for r in self._mine() if not r.paused and (names is None or r.workflow in names)]

    async def due_schedules(
        self, now: float, limit: int, workflows: Sequence[str] | None = None
    ) -> list[ScheduleRecord]:
        due = [r for r in self._live(workflows) if r.next_fire <= now]
        return sorted(due, key=lambda r: (r.next_fire, r.id))[: max(limit, 0)]

    async def next_schedule_after(
        self, now: float, workflows: Sequence[str] | None = None
    ) -> float | None:
        return min((r.next_fire for r in self._live(workflows) if r.next_fire > now), default=None)


__all__ = ["MemorySchedules"]
