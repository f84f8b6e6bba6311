"""The application a deployed worker runs (``samples/deploy/Dockerfile``,
``samples/deploy/flowkit-worker@.service``): ``flowkit worker app:WORKFLOWS`` imports this
module and serves its workflows until SIGTERM, then drains (docs/deploying.md).

One workflow, ``invoice``: it totals an order in a step, waits durably for the payment
signal, and records the receipt in a second step. Steps are idempotent by the invoice id, so
a step that a drain or a crash abandoned can safely run again on the next worker."""

from __future__ import annotations

from pydantic import BaseModel

from flowkit import WorkflowCtx, workflow


class Order(BaseModel):
    invoice_id: str
    lines: list[int]  # (amounts in cents)


def total(lines: list[int]) -> int:
    return sum(lines)


def receipt(invoice_id: str, cents: int, paid_by: str) -> str:
    return f"{invoice_id}: {cents} cents paid by {paid_by}"


@workflow(name="invoice")
class Invoice:
    async def run(self, ctx: WorkflowCtx, order: Order) -> str:
        cents = await ctx.step(total, order.lines)
        ctx.logger.info("waiting for the payment of %s", order.invoice_id)
        paid_by = await ctx.wait_for_signal("paid", timeout=7 * 24 * 3600)
        return await ctx.step(receipt, order.invoice_id, cents, str(paid_by))


WORKFLOWS = [Invoice]
"""What ``flowkit worker app:WORKFLOWS`` serves."""
