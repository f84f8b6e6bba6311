"""Durable schedules (docs/schedules.md): ``Schedule`` (cron with a time zone, or a fixed interval),
``Schedules`` (``engine.schedules``: create, pause, resume, delete, trigger, list), and the
worker's part (``Schedules.fire_due``, called from its poll loop) that starts each due tick's
run exactly once.

Exactly once, however many workers fire and however they crash: a tick ``T`` starts the run
``sched:<id>:<T>`` (an idempotent id: a second start returns the first run), and only then
moves the schedule's ``next_fire`` past ``T`` by compare-and-set in the store. A worker that
dies between the two leaves ``next_fire`` at ``T``; the next one starts the same id again
(nothing new) and advances. Docs: docs/schedules.md."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from .._core.limits import MAX_RUN_ID_LENGTH, check_identifier, duration
from .._core.run import Run
from ..errors import (
    InvalidInputError,
    ScheduleNotFoundError,
    UnsupportedStoreError,
    WorkflowNotFoundError,
)
from ..stores.schedules import KeepsSchedules, ScheduleRecord, keeps_schedules
from .timetable import Timetable, tick_time

if TYPE_CHECKING:
    from .core import ClientCore
    from .engine import Engine

log = logging.getLogger("flowkit")

ON_TIME = 60.0
"""Seconds a schedule's latest due tick may be late and still start, whatever its
``catchup_window``: a worker wakes a little after each tick (its poll, a busy loop, a slow
database), and that must not skip the tick. Older ticks start only within the window."""
DUE_BATCH = 100
"""The most due schedules a worker fires per poll (the rest: at its next poll)."""
CHAIN_HOPS = 1000
"""The most runs of a continue-as-new chain ``overlap="skip"`` follows per tick (``_going``)."""
RECORD_ATTEMPTS = 10
"""How often a worker that lost a tick's compare-and-set re-reads the schedule to record the
run it started (``Schedules._record``); each failed attempt means another worker moved it."""
MAX_SCHEDULE_ID_LENGTH = MAX_RUN_ID_LENGTH - len("sched::manual:2000-01-01T00:00:00.000000Z")
"""A schedule id leaves room in its runs' ids for the tick (or ``manual:`` and an instant)."""


@dataclass(frozen=True)
class Schedule:
    """What to start and when: ``cron`` (a cron expression in ``timezone``, at most
    ``MAX_CRON_LENGTH`` characters) or ``every`` (whole seconds or a ``timedelta``, at most
    ``MAX_DURATION``; ticks at multiples of it since the epoch), one of the two. Each tick
    starts ``workflow`` with ``input`` as run ``f"sched:{id}:{tick:%Y-%m-%dT%H:%M:%SZ}"``.
    ``overlap="skip"`` skips a tick while the schedule's previous run is active;
    ``catchup_window`` (seconds or a ``timedelta``): after downtime, missed ticks that recent
    are started. Checked here (``ValueError``; the same rule for every store); the workflow
    and the input at ``create``. A ``timedelta`` is kept as seconds."""

    workflow: Any
    cron: str | None = None
    every: float | timedelta | None = None
    timezone: str = "UTC"
    input: Any = None
    overlap: Literal["skip", "allow"] = "skip"
    catchup_window: float | timedelta = 0

    def __post_init__(self) -> None:
        if self.every is not None:
            object.__setattr__(self, "every", duration("every", self.every, positive=True))
        self.timetable()  # (ValueError when it cannot tick)
        if self.overlap not in ("skip", "allow"):
            raise ValueError(f"overlap must be 'skip' or 'allow', got {self.overlap!r}")
        window = duration("catchup_window", self.catchup_window)
        object.__setattr__(self, "catchup_window", window)

    def every_seconds(self) -> float | None:
        """``every`` in seconds (a ``timedelta`` given is kept as them)."""
        return None if self.every is None else duration("every", self.every)

    def timetable(self) -> Timetable:
        return Timetable(self.cron, self.every_seconds(), self.timezone)


def _timetable(rec: ScheduleRecord) -> Timetable:
    return Timetable(rec.cron, rec.every, rec.timezone)


class Schedules:
    """``engine.schedules``: the durable schedules of the engine's store (its namespace).
    Every call raises ``UnsupportedStoreError`` on a store without ``keeps_schedules``."""

    def __init__(self, engine: Engine, core: ClientCore) -> None:
        self._engine = engine
        self._core = core
        # the worker's view (``fire_due``): the earliest next tick it read, when it read it,
        # and whether a change made here since makes it stale
        self._next_at: float | None = None
        self._read_at: float | None = None
        self._stale = True

    def _store(self) -> Any:
        store = self._engine.store
        if not keeps_schedules(store):
            raise UnsupportedStoreError(f"{store!r} does not keep schedules (keeps_schedules)")
        return store

    def _changed(self) -> None:
        self._stale = True
        self._engine.poke()  # (its worker reads the schedules again now)

    async def _get(self, schedule_id: str) -> ScheduleRecord:
        rec: ScheduleRecord | None = None
        if isinstance(schedule_id, str):
            rec = await self._store().get_schedule(schedule_id)
        if rec is None:
            raise ScheduleNotFoundError(schedule_id)
        return rec

    async def create(self, schedule_id: str, schedule: Schedule) -> ScheduleRecord:
        """Create the schedule ``schedule_id``, or update it: one with the same timetable
        (cron, every, timezone) keeps its next tick, pause and last run (a new workflow,
        input, overlap or catchup_window apply from its next tick); a changed timetable
        starts anew, at its first tick strictly after now. Checks the workflow
        (``WorkflowNotFoundError``) and the input (``InvalidInputError``) before writing."""
        if not isinstance(schedule, Schedule):
            raise TypeError(f"create() takes a Schedule, got {schedule!r}")
        check_identifier("schedule id", schedule_id, MAX_SCHEDULE_ID_LENGTH)
        eng = self._engine
        defn = self._core.resolve(schedule.workflow)
        _, input_json = self._core.validated(defn, schedule.input)
        store = self._store()
        now = eng.clock.now()
        rec = ScheduleRecord(
            id=schedule_id,
            workflow=defn.name,
            next_fire=schedule.timetable().after(now),
            cron=schedule.cron,
            every=schedule.every_seconds(),
            timezone=schedule.timezone,
            input=input_json,
            overlap=schedule.overlap,
            catchup_window=duration("catchup_window", schedule.catchup_window),
            created_at=now,
            updated_at=now,
        )
        stored: ScheduleRecord = await store.put_schedule(rec)
        self._changed()
        return stored

    async def pause(self, schedule_id: str) -> ScheduleRecord:
        """Stop starting its ticks (``trigger`` still starts a run)."""
        await self._get(schedule_id)
        rec = await self._store().set_schedule_paused(schedule_id, True, self._engine.clock.now())
        if rec is None:
            raise ScheduleNotFoundError(schedule_id)
        self._changed()
        return rec  # type: ignore[no-any-return]

    async def resume(self, schedule_id: str) -> ScheduleRecord:
        """Start its ticks again: the next is the first one after ``now - catchup_window``
        (ticks missed while paused start only within the catch-up window)."""
        rec = await self._get(schedule_id)
        now = self._engine.clock.now()
        nxt = max(rec.next_fire, _timetable(rec).after(now - rec.catchup_window))
        got = await self._store().set_schedule_paused(schedule_id, False, now, nxt)
        if got is None:
            raise ScheduleNotFoundError(schedule_id)
        self._changed()
        return got  # type: ignore[no-any-return]

    async def delete(self, schedule_id: str) -> None:
        """Delete the schedule (its runs stay)."""
        if not isinstance(schedule_id, str) or not await self._store().delete_schedule(schedule_id):
            raise ScheduleNotFoundError(schedule_id)
        self._changed()

    async def trigger(self, schedule_id: str) -> Run:
        """Start the schedule's run now, as run ``sched:<id>:manual:<now, to the
        microsecond>``, whether or not it is paused; its timetable does not move."""
        rec = await self._get(schedule_id)
        now = self._engine.clock.now()
        stamp = f"{datetime.fromtimestamp(now, UTC):%Y-%m-%dT%H:%M:%S.%fZ}"
        return await self._engine.start(rec.workflow, rec.input, f"sched:{rec.id}:manual:{stamp}")

    async def list(self) -> list[ScheduleRecord]:
        """Every schedule, by id."""
        return list(await self._store().list_schedules())

    # -- the worker's part ---------------------------------------------------------------
    async def declare(self) -> None:
        """Create or update the schedules of ``Engine(schedules=...)`` (its worker starts)."""
        for schedule_id, schedule in (self._engine.config.schedules or {}).items():
            await self.create(schedule_id, schedule)

    async def fire_due(self, now: float) -> float | None:
        """Start the due ticks of the schedules whose workflow is registered here; the
        earliest next tick (the poll loop sleeps until then at most). Reads the store at
        most once per poll interval unless a tick is due or a call here changed something."""
        eng = self._engine
        if not keeps_schedules(eng.store):
            return None
        read_at, every, nxt = self._read_at, eng.config.poll_interval, self._next_at
        cached = not self._stale and read_at is not None and every is not None
        if cached and now < read_at + every and (nxt is None or now < nxt):  # type: ignore[operator]
            return nxt
        self._stale, self._read_at = False, now
        try:
            store: KeepsSchedules = eng.store  # type: ignore[assignment]
            # only this worker's workflows, in the store's query: the due schedules of others
            # (whose workers may be down) must not fill the batch in place of its own
            names = sorted(eng.registry.names())
            for rec in await store.due_schedules(now, DUE_BATCH, names):
                await self._fire(rec, now)
            self._next_at = await store.next_schedule_after(now, names)
        except Exception:
            log.warning("firing schedules failed; trying again at the next poll", exc_info=True)
            self._stale = True
            return None
        return self._next_at

    async def _fire(self, rec: ScheduleRecord, now: float) -> None:
        """Start ``rec``'s due ticks in order (module doc), and advance it past ``now``."""
        store: KeepsSchedules = self._engine.store  # type: ignore[assignment]
        tt = _timetable(rec)
        expected = t = rec.next_fire
        last = rec.last_run_id
        cut = now - max(rec.catchup_window, ON_TIME)
        if t < cut:  # too old to start, each of them: jump (no write per skipped tick)
            t = max(t, tt.after(cut - 1))
        while t <= now:
            nxt = tt.after(t)
            started: str | None = None
            on_time = t >= now - rec.catchup_window or (nxt > now and t >= now - ON_TIME)
            going = None
            if on_time and rec.overlap == "skip":
                going = await self._going(last)
            if on_time and going is None:
                started = await self._start(rec, t)
            # (a skipped tick records the chain's current run, so the next tick looks there)
            moved = started or (going if going != last else None)
            if not await store.advance_schedule(rec.id, expected, nxt, now, moved):
                # another worker took this tick (or the schedule changed); the run started
                # here is still this schedule's newest, unless a later tick's run is
                if started is not None:
                    await self._record(rec, started, now)
                return
            expected = t = nxt
            last = moved or last
        if t != expected:
            await store.advance_schedule(rec.id, expected, t, now)

    async def _record(self, rec: ScheduleRecord, run_id: str, now: float) -> None:
        """Record ``run_id`` (tick ``T``'s run, started here) as ``rec``'s last run after
        this worker lost the compare-and-set of ``T``: a worker that skipped ``T`` (it saw the
        previous run still active a moment earlier) advanced the row without a run, and
        ``overlap="skip"`` would otherwise look at the previous, finished, run at the next
        tick and start a second run beside ``T``'s. Written by the same compare-and-set
        (``next_fire`` unchanged), re-read and retried while other workers move the row;
        not when the row already names a later tick's run (the ids of one schedule's ticks
        sort by their UTC stamps), or the schedule was deleted or given a new timetable."""
        store: KeepsSchedules = self._engine.store  # type: ignore[assignment]
        for _ in range(RECORD_ATTEMPTS):
            row = await store.get_schedule(rec.id)
            if row is None or not row.same_timetable(rec):
                return
            if row.last_run_id is not None and row.last_run_id >= run_id:
                return
            if await store.advance_schedule(rec.id, row.next_fire, row.next_fire, now, run_id):
                return
        log.warning("schedule %s: could not record %s as its last run", rec.id, run_id)

    async def _going(self, run_id: str | None) -> str | None:
        """The run of ``run_id``'s chain that is still active: ``run_id`` itself, or the
        successor it continued as new to (``Run.continued_as``, followed), for
        ``overlap="skip"`` a run that continued as new is still going; ``None`` once the
        chain ended. A chain longer than ``CHAIN_HOPS`` counts as going, at the run reached
        (recorded as the last run, the next tick goes on from there)."""
        store = self._engine.store
        for _ in range(CHAIN_HOPS):
            run = None if run_id is None else await store.get_run(run_id)
            if run is None:
                return None
            if run.status.active:
                return run.id
            if run.continued_as is None:
                return None
            run_id = run.continued_as
        return run_id

    async def _start(self, rec: ScheduleRecord, t: float) -> str | None:
        """Start tick ``t``'s run (idempotent by its id); ``None`` when it cannot be started
        at all here (logged; the tick is skipped rather than retried forever)."""
        run_id = f"sched:{rec.id}:{tick_time(t)}"
        try:
            run = await self._engine.start(rec.workflow, rec.input, run_id)
        except (WorkflowNotFoundError, InvalidInputError, UnsupportedStoreError):
            log.exception("schedule %s: could not start %s; tick skipped", rec.id, run_id)
            return None
        return run.id


__all__ = [
    "CHAIN_HOPS",
    "DUE_BATCH",
    "MAX_SCHEDULE_ID_LENGTH",
    "ON_TIME",
    "RECORD_ATTEMPTS",
    "Schedule",
    "Schedules",
]
