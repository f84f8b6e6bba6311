"""Durable schedules (DESIGN §11): ``Schedule`` (cron with a time zone, or a fixed interval),
``Schedules`` (``engine.schedules``: create, pause, resume, delete, trigger, list), and the
worker's loop that starts each due tick's run exactly once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ._engine import Engine


@dataclass(frozen=True)
class Schedule:
    """What to start and when: ``cron`` (a cron expression in ``timezone``) or ``every``
    (seconds; ticks at multiples of it since the epoch), one of the two. Each tick starts
    ``workflow`` with ``input`` as run ``f"sched:{id}:{tick:%Y-%m-%dT%H:%M:%SZ}"``.
    ``overlap="skip"`` skips a tick while the schedule's previous run is active;
    ``catchup_window`` (seconds): after downtime, missed ticks that recent are started."""

    workflow: Any
    cron: str | None = None
    every: float | None = None
    timezone: str = "UTC"
    input: Any = None
    overlap: Literal["skip", "allow"] = "skip"
    catchup_window: float = 0


class Schedules:
    """``engine.schedules``: the durable schedules of the engine's store (namespace)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    async def create(self, schedule_id: str, schedule: Schedule) -> None:
        raise NotImplementedError("engine.schedules.create (issue #22)")

    async def pause(self, schedule_id: str) -> None:
        raise NotImplementedError("engine.schedules.pause (issue #22)")

    async def resume(self, schedule_id: str) -> None:
        raise NotImplementedError("engine.schedules.resume (issue #22)")

    async def delete(self, schedule_id: str) -> None:
        raise NotImplementedError("engine.schedules.delete (issue #22)")

    async def trigger(self, schedule_id: str) -> Any:
        raise NotImplementedError("engine.schedules.trigger (issue #22)")

    async def list(self) -> list[Any]:
        raise NotImplementedError("engine.schedules.list (issue #22)")


__all__ = ["Schedule", "Schedules"]
