"""Workflows of the example application: ``DailyReport`` (docs/debugging.md, docs/cli.md) as
it was deployed when ``report-1`` started, and ``MyWorkflow``, the stand-in for "a workflow of
yours" (docs/stores.md)."""

from __future__ import annotations

from flowkit import WorkflowCtx, workflow


class Reports:
    async def fetch(self, day: str) -> str:
        return f"figures for {day}"

    async def audit(self, day: str) -> None:
        pass


@workflow(name="daily-report")
class DailyReport:
    def __init__(self, reports: Reports | None = None) -> None:
        self.reports = reports or Reports()

    async def run(self, ctx: WorkflowCtx, day: str) -> str:
        figures = await ctx.step(self.reports.fetch, day)
        await ctx.sleep(3600)
        return figures


async def double(n: int) -> int:
    return 2 * n


@workflow(name="my-workflow")
class MyWorkflow:
    async def run(self, ctx: WorkflowCtx, n: int) -> int:
        await ctx.sleep(60)
        return await ctx.step(double, n)
