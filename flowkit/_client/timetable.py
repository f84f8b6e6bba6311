"""When a durable schedule ticks (``Timetable``): a cron expression in an IANA time zone,
read by ``cronsim`` (a maintained library: no hand-written cron parser here), or a fixed
interval aligned to the epoch. Ticks are epoch instants (floats, whole seconds)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .._core.limits import MAX_CRON_LENGTH, duration
from ..errors import InvalidInputError


def check_zone(timezone: object) -> ZoneInfo:
    """The zone named ``timezone``; ``ValueError`` when there is no such zone."""
    if not isinstance(timezone, str) or not timezone:
        raise ValueError(f"timezone must be an IANA zone name, got {timezone!r}")
    try:
        return ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"unknown time zone {timezone!r}") from None


class Timetable:
    """The ticks of ``cron`` (in ``timezone``) or of ``every`` seconds since the epoch.

    Cron follows cronsim, as cron does across daylight saving changes: a time the
    spring-forward gap skips fires at the first instant after the gap (02:30 → 03:00), and a
    time the fall-back repeats fires once, at its first occurrence (a "every hour" expression
    fires in both repeated hours: the hour field matches both)."""

    def __init__(self, cron: str | None, every: float | None, timezone: str = "UTC") -> None:
        if (cron is None) == (every is None):
            raise ValueError("a schedule takes exactly one of cron= and every=")
        self.zone = check_zone(timezone)
        self.cron = cron
        self.every: int | None = None
        if cron is not None:
            if not isinstance(cron, str):
                raise ValueError(f"cron must be a string, got {cron!r}")
            if len(cron) > MAX_CRON_LENGTH:  # (one rule for every store: PostgreSQL's column)
                raise InvalidInputError(
                    None,
                    f"a cron expression is at most {MAX_CRON_LENGTH} characters, "
                    f"got {len(cron)} ({cron[:40]!r}...)",
                )
            try:
                CronSim(cron, datetime(2000, 1, 1, tzinfo=self.zone))
            except CronSimError as exc:
                raise ValueError(f"bad cron expression {cron!r}: {exc}") from None
        else:
            if isinstance(every, bool) or not isinstance(every, int | float):
                raise ValueError(f"every must be a number of seconds, got {every!r}")
            if not math.isfinite(every) or every < 1 or every != int(every):
                # (a tick's run id names its second: two ticks in one second would be one run)
                raise ValueError(f"every must be a whole number of seconds >= 1, got {every!r}")
            self.every = int(duration("every", every))  # (at most MAX_DURATION)

    def after(self, t: float) -> float:
        """The first tick strictly after the instant ``t``."""
        if self.every is not None:
            return float((math.floor(t) // self.every + 1) * self.every)
        assert self.cron is not None
        start = datetime.fromtimestamp(math.floor(t), self.zone)
        return next(CronSim(self.cron, start)).timestamp()


def tick_time(t: float) -> str:
    """A tick's instant as its run id writes it: ``%Y-%m-%dT%H:%M:%SZ`` in UTC."""
    return f"{datetime.fromtimestamp(t, UTC):%Y-%m-%dT%H:%M:%SZ}"


__all__ = ["Timetable", "check_zone", "tick_time"]
