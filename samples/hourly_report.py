"""hourly_report: a durable schedule that starts a report run every hour.

``engine.schedules.create("hourly-report", Schedule(HourlyReport, cron="0 * * * *", ...))``
stores the schedule with its next tick; each worker fires the due ticks, and each tick ``T``
starts exactly one run, ``sched:hourly-report:<T>``, however many workers there are.

It runs in ``flowkit_testing.TestEnv`` with three engine instances on a virtual clock: a whole
day of ticks takes a fraction of a second of real time. At the end it checks its own claims:
24 runs, one per hour and no duplicate, each with the schedule's input, and the next tick is
tomorrow's first hour.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pydantic import BaseModel

from flowkit import Schedule, WorkflowCtx, workflow
from flowkit_testing import TestEnv


class Report(BaseModel):
    region: str


@workflow(name="hourly-report")
class HourlyReport:
    async def count(self, region: str, hour: int) -> int:
        return (hour * 37) % 97  # stands for a query over the last hour's orders

    async def run(self, ctx: WorkflowCtx, input: Report) -> str:
        hour = ctx.now().hour  # (the run's own start: its tick)
        orders = await ctx.step(self.count, input.region, hour)
        return f"{input.region} {hour:02d}h: {orders} orders"


async def main() -> None:
    day = datetime(2026, 1, 1, tzinfo=UTC)
    async with TestEnv([HourlyReport], instances=3, start=day) as env:
        engine = env.engines[0]
        schedule = Schedule(HourlyReport, cron="0 * * * *", input=Report(region="eu"))
        await engine.schedules.create("hourly-report", schedule)
        await env.advance(24 * 3600)
        runs = sorted(
            (r for r in await engine.list_runs() if r.id.startswith("sched:")), key=lambda r: r.id
        )
        for run in runs[:3]:
            print(run.id, "->", await engine.result(run.id))
        print("...")
        print(runs[-1].id, "->", await engine.result(runs[-1].id))
        [state] = await engine.schedules.list()
        print("next fire:", datetime.fromtimestamp(state.next_fire, UTC).isoformat())
        assert len(runs) == len({r.id for r in runs}) == 24
        assert runs[0].id == "sched:hourly-report:2026-01-01T01:00:00Z"
        assert runs[-1].id == "sched:hourly-report:2026-01-02T00:00:00Z"
        # (listed runs carry no payloads: get_run has the input)
        assert all([(await engine.get_run(r.id)).input == {"region": "eu"} for r in runs])
        assert state.next_fire == datetime(2026, 1, 2, 1, tzinfo=UTC).timestamp()
    print("ok: one run per hour, none twice, on three instances")


if __name__ == "__main__":
    asyncio.run(main())
