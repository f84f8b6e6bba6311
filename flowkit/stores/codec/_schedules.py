"""``CodecStore``'s durable schedules (``CodecSchedules``, mixed into it): forwarded to the
store it wraps when that one ``keeps_schedules``; a schedule's input is a payload, encoded
on the way in and decoded on the way out, bound to its schedule id."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..schedules import ScheduleRecord
from ._fields import Ctx


def _ctx(schedule_id: str) -> Ctx:
    return ("schedule", schedule_id, "input")


class CodecSchedules:
    """Mixed into ``CodecStore`` (which sets ``inner`` and ``keeps_schedules`` and has
    ``_enc``/``_dec``). Without the capability on ``inner`` each call raises ``TypeError``
    and sends nothing."""

    inner: Any
    keeps_schedules: bool = False

    def _enc(self, value: Any, ctx: Ctx) -> Any:  # (CodecFields')
        raise NotImplementedError

    def _dec(self, value: Any, ctx: Ctx) -> Any:  # (CodecFields')
        raise NotImplementedError

    def _sched(self) -> Any:
        if not self.keeps_schedules:
            raise TypeError(f"{self.inner!r} does not keep schedules (keeps_schedules)")
        return self.inner

    def _out(self, rec: ScheduleRecord | None) -> ScheduleRecord | None:
        if rec is None:
            return None
        return dataclasses.replace(rec, input=self._dec(rec.input, _ctx(rec.id)))

    def _outs(self, recs: list[ScheduleRecord]) -> list[ScheduleRecord]:
        return [dataclasses.replace(r, input=self._dec(r.input, _ctx(r.id))) for r in recs]

    async def put_schedule(self, record: ScheduleRecord) -> ScheduleRecord:
        inner = self._sched()
        enc = dataclasses.replace(record, input=self._enc(record.input, _ctx(record.id)))
        stored = self._out(await inner.put_schedule(enc))
        assert stored is not None
        return stored

    async def get_schedule(self, schedule_id: str) -> ScheduleRecord | None:
        return self._out(await self._sched().get_schedule(schedule_id))

    async def list_schedules(self) -> list[ScheduleRecord]:
        return self._outs(list(await self._sched().list_schedules()))

    async def delete_schedule(self, schedule_id: str) -> bool:
        return bool(await self._sched().delete_schedule(schedule_id))

    async def set_schedule_paused(
        self, schedule_id: str, paused: bool, now: float, next_fire: float | None = None
    ) -> ScheduleRecord | None:
        row = await self._sched().set_schedule_paused(schedule_id, paused, now, next_fire)
        return self._out(row)

    async def advance_schedule(
        self,
        schedule_id: str,
        expected_next: float,
        new_next: float,
        now: float,
        last_run_id: str | None = None,
    ) -> bool:
        inner = self._sched()
        return bool(
            await inner.advance_schedule(schedule_id, expected_next, new_next, now, last_run_id)
        )

    async def due_schedules(
        self, now: float, limit: int, workflows: Sequence[str] | None = None
    ) -> list[ScheduleRecord]:
        return self._outs(list(await self._sched().due_schedules(now, limit, workflows)))

    async def next_schedule_after(
        self, now: float, workflows: Sequence[str] | None = None
    ) -> float | None:
        got = await self._sched().next_schedule_after(now, workflows)
        return None if got is None else float(got)


__all__ = ["CodecSchedules"]
