"""``flowkit schedules``: the durable schedules of a store (``engine.schedules``) as a table,
with each one's timetable, whether it is paused, its next tick and its last run."""

from __future__ import annotations

import argparse
from typing import Any

from ..stores.schedules import ScheduleRecord, keeps_schedules
from ._out import Out, _fmt_time


def spec(rec: ScheduleRecord) -> str:
    """The timetable as the user wrote it: ``cron '0 * * * *' Europe/Berlin`` or
    ``every 3600 s``."""
    if rec.cron is not None:
        return f"cron '{rec.cron}' {rec.timezone}"
    return f"every {rec.every:g} s"


async def schedules(args: argparse.Namespace, out: Out, store: Any) -> int:
    """The ``schedules`` command: one row per schedule, by id."""
    if not keeps_schedules(store):
        out.line(f"{args.db}: this store keeps no schedules")
        return 0
    recs: list[ScheduleRecord] = await store.list_schedules()
    rows = [
        (
            r.id,
            r.workflow,
            spec(r),
            r.overlap,
            ("paused", "yellow") if r.paused else "",
            "—" if r.paused else _fmt_time(r.next_fire),
            r.last_run_id or "",
        )
        for r in recs
    ]
    out.table(
        ("id", "workflow", "schedule", "overlap", "paused", "next fire (UTC)", "last run"),
        rows,
        title=f"schedules in {args.db}",
        caption=None if recs else "no schedules",
    )
    return 0


__all__ = ["schedules", "spec"]
