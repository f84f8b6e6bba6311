"""The next version of ``DailyReport``: it audits the day before fetching the figures, a step
inserted before calls that runs in flight already made (docs/debugging.md)."""

from __future__ import annotations

from flowkit import WorkflowCtx, workflow

from .workflows import Reports


@workflow(name="daily-report")
class DailyReport:
    def __init__(self, reports: Reports | None = None) -> None:
        self.reports = reports or Reports()

    async def run(self, ctx: WorkflowCtx, day: str) -> str:
        await ctx.step(self.reports.audit, day)
        figures = await ctx.step(self.reports.fetch, day)
        await ctx.sleep(3600)
        return figures
